"""Rendering: a session's stores in, the figure, summary, hotspot table and plan lists out.

:func:`render` reads the cached analysis (:mod:`lmsviz.results`) and hands plain arrays to
the pure builders of :mod:`lmsviz.figures`. When only the plan or the selection changed it
returns a ``dash.Patch`` that replaces the small traces and leaves the ordering points in
the browser.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import dash
import numpy as np
from dash import html, no_update

import lmscore
from lmscore.errors import ConfigError, PlanError
from lmscore.evaluate import KEPT as KEPT_BUFFER
from lmscore.ir import split_tensor
from lmscore.memory import (
    DEFAULT_SAFETY,
    Simulation,
    fit_margin,
    host_memory_limit,
    persistent_over,
)
from lmscore.memory import fits as fits_device
from lmscore.plan import Plan, Recompute, empty_plan
from lmscore.units import format_bytes, parse_bytes

from . import figures
from .results import After, Base, after_of, base_of, counted, plan_digest, plan_of
from .state import (
    AppContext,
    LoadedGraph,
    default_settings,
    empty_view,
    sample_options,
    stage,
    timed,
)

SWAP_ON, SWAP_OFF, SWAP_NO = "☑ swapped", "☐ swap", "—"
RECOMPUTE_ON, RECOMPUTE_OFF = "☑ recomputed", "☐ recompute"
#: What the plan does with a tensor, as the hotspot table's ``decision`` column says it.
KEPT, SWAPPED, RECOMPUTED = "kept", "swapped", "recomputed"
#: Recomputes listed by name in the plan panel (the summary counts them all).
MAX_LISTED = 20


@dataclass(frozen=True)
class Rendered:
    """Everything :func:`render` produces for one session state."""

    figure: Any
    note: str
    summary: Any
    rows: list[dict[str, Any]]
    row_styles: list[dict[str, Any]]
    caption: str
    editor: Any
    groups: list[dict[str, Any]]
    rendered: dict[str, Any]
    message: str | None = None
    recomputes: Any = None


def render(app: AppContext, session: dict[str, Any], *, full: bool = True,
           data: bool = True) -> Rendered:
    """The figure, summary, hotspot table, swap editor and recompute list of a session.

    Parameters
    ----------
    app : AppContext
    session : dict
        ``graph``, ``settings``, ``plan`` and ``view`` store data.
    full : bool
        Build the whole figure; otherwise return a ``dash.Patch``.
    data : bool
        With a patch: replace the traces that depend on the plan and settings. When only
        the selection changed the patch touches the layout alone.
    """
    with timed("render" if full else "render patch"):
        return _render(app, session, full=full, data=data)


def _render(app: AppContext, session: dict[str, Any], *, full: bool, data: bool) -> Rendered:
    graph_ref, settings = session["graph"], session["settings"]
    plan_data, view = session["plan"] or {}, session["view"] or empty_view()
    loaded = app.resolve(graph_ref)
    batch = int(settings["batch"])
    with stage("base"):
        base = base_of(app, loaded, batch, settings.get("workspace", "accelerator"))
    message = None
    try:
        plan = plan_of(app, loaded, plan_data.get("json"))
    except PlanError as e:
        plan = empty_plan(loaded.graph)
        message = f"the stored plan does not fit this graph and was ignored: {e}"
    with stage("evaluate"):
        after = after_of(app, base, plan,
                         plan_digest(plan_data.get("json")) if not message else None)
    try:
        budget: int | None = parse_bytes(settings.get("budget") or "")
    except ConfigError:
        budget = None
    sim = base.sim
    with stage("hover"):
        hover_before = _hover(app, base, None)
        hover_after = _hover(app, base, after) if after else None
    curves = figures.Curves(
        before=sim.device_curve,
        after=after.device if after else None,
        host=after.host if after else None,
        peak_before=(sim.peak_level, sim.peak_bytes),
        peak_after=(after.peak_level, after.sim.peak_bytes) if after else None,
        budget=budget,
        hover_before=hover_before,
        hover_after=hover_after,
        fixed=sim.persistent_bytes + sim.input_bytes,
    )
    level = view.get("level")
    table_level = level if level is not None else (after.peak_level if after else sim.peak_level)
    hl = _highlight(loaded, base, view)
    swaps = _swap_draws(loaded, after.rewrite.plan if after else plan)
    with stage("figure"):
        if full:
            fig, note = figures.studio_figure(
                base.ops, base.positions, curves, swaps, hl, max_points=app.max_points,
                uirevision=f"{loaded.key}:{batch}",
            )
            figure: Any = fig
        else:
            figure = dash.Patch()
            if data:
                for k, tr in enumerate(figures.dynamic_traces(swaps, base.positions, curves)):
                    # the curve before the plan is drawn already: a patch is made only for
                    # the graph, batch and workspace drawn (needs_full_figure)
                    if figures.T_SWAP_EDGES + k != figures.T_BEFORE:
                        figure["data"][figures.T_SWAP_EDGES + k] = tr.to_plotly_json()
                for k, v in figures.memory_axis(curves).items():
                    figure["layout"]["yaxis2"][k] = v
            figure["layout"]["shapes"] = figures.selection_shapes(
                hl, base.positions, figures.memory_range(curves)[1])
            note = no_update
    ahead = int(settings.get("knobs", {}).get("ahead", 1))
    with stage("rows"):
        rows = hotspot_rows(base, plan, table_level, ahead=ahead, after=after,
                            keep=view.get("tensor"))
    styles = _row_styles(view.get("tensor"))
    where = ("selected level" if level is not None else
             "peak with the plan" if after else "peak")
    caption = (f"Tensors live at level {table_level} ({where}): {len(rows)}. "
               "Click a row to see its lifetime; click its swap or recompute cell to toggle it.")
    with stage("panels"):
        editor, groups = _editor(loaded, plan, view.get("tensor"))
        panel = summary(loaded, base, plan, plan_data, after, budget)
        listed = recompute_list(loaded, plan)
    return Rendered(
        figure=figure, note=note, summary=panel,
        rows=rows, row_styles=styles, caption=caption, editor=editor, groups=groups,
        rendered={"key": loaded.key, "batch": batch, "workspace": base.workspace,
                  "state": state_digest(session)},
        message=message, recomputes=listed,
    )


def skeleton() -> Rendered:
    """A page's views without data: what Dash's validation layout needs (the ids)."""
    return Rendered(figure={}, note="", summary="", rows=[], row_styles=[], caption="",
                    editor="", groups=[], rendered={})


def needs_full_figure(rendered: dict[str, Any] | None, session: dict[str, Any]) -> bool:
    """Whether the figure must be built whole rather than patched.

    It must when nothing is drawn yet or the session shows another graph, batch or
    workspace than the one drawn; else a patch of the plan's traces will do.
    """
    graph, settings = session.get("graph") or {}, session.get("settings") or {}
    return not rendered or any(rendered.get(k) != v for k, v in (
        ("key", graph.get("key")), ("batch", settings.get("batch")),
        ("workspace", settings.get("workspace", "accelerator"))))


def state_digest(session: dict[str, Any]) -> str:
    """A digest of what :func:`render` draws from: the graph, settings, plan and view.

    The control callback renders the state it makes and stores this digest beside it; the
    render callback that the stores' change then triggers finds it equal and does nothing
    (one round trip per edit instead of two).
    """
    parts = [session.get(k) for k in ("graph", "settings", "plan", "view")]
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _highlight(loaded: LoadedGraph, base: Base, view: dict[str, Any]) -> figures.Highlight:
    tensor = view.get("tensor")
    op = view.get("op")
    op_index = op if isinstance(op, int) and 0 <= op < len(loaded.graph.ops) else None
    if not tensor:
        return figures.Highlight(op=op_index, level=view.get("level"))
    name, port = split_tensor(tensor)
    producer = loaded.graph.index.get(name)
    if producer is None:
        return figures.Highlight(op=op_index, level=view.get("level"))
    consumers = loaded.graph.adjacency.consumers.get((producer, port), ())
    span = base.buffers.get(tensor)
    return figures.Highlight(
        producer=producer, consumers=tuple(consumers), op=op_index, level=view.get("level"),
        lifetime=span, tensor=tensor,
    )


def _swap_draws(loaded: LoadedGraph, plan: Plan) -> list[figures.SwapDraw]:
    index = loaded.graph.index
    out = []
    for s in plan.swaps:
        producer = index[split_tensor(s.tensor)[0]]
        groups = tuple(
            (tuple(index[c] for c in g.consumers), index[g.trigger] if g.trigger else None)
            for g in s.swap_ins
        )
        out.append(figures.SwapDraw(s.tensor, producer, groups))
    return out


def hotspot_rows(base: Base, plan: Plan, level: int, *, ahead: int = 1,
                 after: After | None = None, keep: str | None = None) -> list[dict[str, Any]]:
    """Rows of the hotspot table: the tensors on the device at ``level``, largest first.

    Without ``after`` the rows are the unplanned step's (:func:`lmscore.hotspots`). With
    it they are what the plan really leaves on the device there
    (:meth:`lmscore.evaluate.PlanEvaluation.on_device`): a swapped tensor only while a
    swap-in holds it back, recomputed tensors as their clones' outputs. Each row says what
    the plan does with its tensor (``decision``), what holds it (``held``), and whether a
    hand edit would swap it (``swappable``) or recompute it (``recomputable``,
    :meth:`Base.recompute_refused` with the ``ahead`` knob). ``keep``, a tensor the plan
    swaps or recomputes that is not on the device there (the one just toggled), gets a
    row of 0 MiB held "off the device here", so that the toggle stays in reach.
    """
    swapped = set(plan.swapped())
    recomputed = set(plan.recomputed())
    if after is None:
        listed = [(t, t.bytes, KEPT) for t in base.live(level)]
    else:
        listed = []
        for r in after.evaluation.on_device(level):
            t = base.row(r.of) if r.of else None
            if t is not None and (r.of not in (t.tensor, t.swap_tensor) or (
                    r.kind != KEPT_BUFFER and r.of != (t.swap_tensor or t.tensor))):
                # a view the plan swaps (a Reshape's output) whose buffer's row names
                # another of its tensors, or a swap-in (a clone) of the buffer's first
                # name whose row would name the view read farthest away: the row of the
                # tensor the plan decides on, which its toggle edits (else each click
                # edited a view while the row showed the buffer's swap-in)
                t = replace(t, tensor=r.of, swap_tensor=r.of)
            if t is None:  # a workspace of the rewritten step: no tensor to toggle
                t = lmscore.LiveTensor(tensor=r.tensor, bytes=r.bytes, producer_level=level,
                                       last_use_level=level, distance=0, category="—",
                                       swappable=False, reason=r.held or "kernel workspace")
            listed.append((t, r.bytes, r.kind))
        if keep and (keep in swapped or keep in recomputed) and not any(
                keep in (t.tensor, t.swap_tensor) for t, _, _ in listed):
            t = base.row(keep)
            if t is not None:
                if keep not in (t.tensor, t.swap_tensor):
                    t = replace(t, tensor=keep, swap_tensor=keep)
                listed.append((t, 0, OFF_DEVICE))
    rows = []
    seen: dict[str, int] = {}
    for t, nbytes, held in listed:
        # a row is a buffer; a toggle edits the tensor of it that is read farthest away
        tensor = t.swap_tensor or t.tensor
        # a tensor kept for a near reader beside its swap-in for a far one, or two swap-ins
        # of it: a row each (one was left out, 6 MiB short of the curve), ids kept unique
        n = seen[tensor] = seen.get(tensor, 0) + 1
        on = t.tensor in swapped or t.swap_tensor in swapped
        again = t.tensor in recomputed or t.swap_tensor in recomputed
        if again:  # the plan recomputes it: its toggle takes that back
            refused = ""
        elif split_tensor(tensor)[0] in base.loaded.graph.index:
            refused = _reason(base.recompute_refused(tensor, ahead), tensor)
        else:  # a kernel workspace or a loop's results: no tensor of the graph to name
            refused = t.reason
        rows.append({
            # the tensor edits act on, which the decision is of (its buffer's first name
            # read "kept" beside "recomputed": a row at odds with itself)
            "id": tensor if n == 1 else f"{tensor}{ROW_COPY}{n}", "tensor": tensor,
            "mib": round(nbytes / figures.MIB, 3),
            "producer_level": t.producer_level, "last_use_level": t.last_use_level,
            "distance": t.distance, "category": t.category,
            "swappable": "yes" if t.swappable else t.reason,
            "recomputable": "yes" if not refused else refused,
            "decision": SWAPPED if on else (RECOMPUTED if again else KEPT),
            "held": held,
            "swap": SWAP_ON if on else (SWAP_OFF if t.swappable else SWAP_NO),
            "recompute": RECOMPUTE_ON if again else (RECOMPUTE_OFF if not refused else SWAP_NO),
        })
    return rows


#: How the table says that a tensor the plan moves is not on the device at its level.
OFF_DEVICE = "off the device here"


#: What joins a tensor's name and a buffer's number in the id of its second and later
#: rows (no TensorFlow name has it): :func:`row_tensor` takes it off.
ROW_COPY = "@"


def row_tensor(row_id: str) -> str:
    """The tensor a table row's id names (:func:`hotspot_rows`).

    >>> row_tensor("conv/BiasAdd:0@2")
    'conv/BiasAdd:0'
    """
    return row_id.partition(ROW_COPY)[0]


def _reason(message: str, tensor: str) -> str:
    """A refusal about ``tensor`` without its name (the row names it).

    >>> _reason("tensor 'a:0' cannot be recomputed: backward op", "a:0")
    'cannot be recomputed: backward op'
    """
    return message.removeprefix(f"tensor {tensor!r}").lstrip(": ")


def _row_styles(tensor: str | None) -> list[dict[str, Any]]:
    styles: list[dict[str, Any]] = [
        {"if": {"filter_query": f'{{decision}} = "{SWAPPED}"'}, "backgroundColor": "#fff7ed"},
        {"if": {"filter_query": f'{{decision}} = "{RECOMPUTED}"'},
         "backgroundColor": "#ecfdf5"},
        {"if": {"column_id": "swap"}, "cursor": "pointer", "fontWeight": "600"},
        {"if": {"column_id": "recompute"}, "cursor": "pointer", "fontWeight": "600"},
    ]
    if tensor:
        safe = tensor.replace('"', "")
        styles.append({"if": {"filter_query": f'{{tensor}} = "{safe}"'},
                       "backgroundColor": "#ede9fe"})
    return styles


def fit_verdict(sim: Simulation, budget: int, host_limit: int,
                unpinned: bool = False) -> tuple[str, str]:
    """The summary's budget line and its class: the tuner's "fits", and what it counts.

    The same test as ``lms tune`` (:func:`lmscore.memory.fits` at
    :data:`~lmscore.memory.DEFAULT_SAFETY`), so the page says "fits" where the tuner does;
    the line names the margin kept free and what may come on top of the peak shown.
    ``unpinned``: the simulation is of a plan that does not pin its order of the ops (the
    tuner's do): TensorFlow may run another and hold more (a knob plan the page called
    fitting measured 1.28 of its budget in one run of three), so its "fits" is said to
    hold in the simulated order only.

    >>> from lmscore.memory import Simulation
    >>> sim = Simulation((90,), (30,), 90, 0, 40, 0, 50, 0, (), (), 1)
    >>> fit_verdict(sim, 100, 10**9)[0]
    'fits (4 B to spare, 10% of the budget above persistent memory kept free)'
    >>> fit_verdict(sim, 90, 10**9)[0]
    'does not fit (over by 5 B, 10% of the budget above persistent memory kept free)'
    >>> fit_verdict(sim, 30, 10**9)[0][:45]
    'does not fit: its persistent memory alone (40'
    >>> fit_verdict(sim, 100, 10**9, unpinned=True)[0][:60]
    'fits in the simulated order of the ops, which this plan does'
    """
    if sim.persistent_bytes >= budget:  # as the tuner says it
        return f"does not fit: {persistent_over(sim.persistent_bytes, budget)}", "bad"
    margin = fit_margin(sim, budget, DEFAULT_SAFETY)
    kept = f"{100 - round(100 * DEFAULT_SAFETY)}% of the budget above persistent memory kept free"
    race = sim.worst_peak_bytes - sim.peak_bytes
    if race > 0:
        kept += f", and {format_bytes(race)} that racing loops or swaps may hold"
    if fits_device(sim, budget, DEFAULT_SAFETY, host_bytes=host_limit):
        if unpinned:
            return (f"fits in the simulated order of the ops, which this plan does not pin: "
                    f"TensorFlow may run another and hold more; auto-tune's plans pin "
                    f"theirs ({format_bytes(margin)} to spare, {kept})", "warn")
        return f"fits ({format_bytes(margin)} to spare, {kept})", "ok"
    return f"does not fit (over by {format_bytes(-margin)}, {kept})", "bad"


def summary(loaded: LoadedGraph, base: Base, plan: Plan, plan_data: dict[str, Any],
            after: After | None, budget: int | None) -> Any:
    """The summary panel: peaks, host, swaps, recomputes, predicted overhead, whether it fits."""
    sim = base.sim
    shown = after.sim if after else sim

    def item(label: str, value: str, test_id: str, cls: str = "") -> Any:
        return html.Div([html.Span(label, className="k"),
                         html.Span(value, id=f"sum-{test_id}", className=f"v {cls}")],
                        className="kv")

    tune = plan_data.get("tune") if plan_data.get("source") == "tuner" else None
    current = plan_digest(plan_data.get("json"))
    if tune and tune.get("plan_sha") == current and tune.get("predicted_overhead") is not None:
        overhead = f"{100 * float(tune['predicted_overhead']):.1f}% of step time (tuner)"
    elif tune:
        overhead = "plan edited since auto-tune: see “compare plans” or run it again"
    elif not after:
        overhead = "none: no plan"
    else:  # (the time model takes a quarter second on ResNet-50: asked for on demand)
        overhead = "see “compare plans” for this plan's prediction"
    host_limit = host_memory_limit()
    host_peak = after.sim.host_peak_bytes if after else 0
    over_host = host_peak > host_limit
    if budget is None:
        fits, fits_cls = "no budget set", ""
    elif over_host:
        fits, fits_cls = (f"does not fit: host memory over its limit by "
                          f"{format_bytes(host_peak - host_limit)}", "bad")
    else:
        unpinned = after is not None and not plan.pin_schedule and not plan.changes_nothing()
        fits, fits_cls = fit_verdict(shown, budget, host_limit, unpinned)
    n_in = len(after.rewrite.swap_ins) if after else 0
    n_sync = len(after.rewrite.synchronous) if after else 0
    skipped = after.rewrite.skipped if after else ()
    items = [
        item("graph", f"{loaded.name}: {len(loaded.graph.ops):,} ops, "
             f"{len(sim.device_curve):,} levels, batch {base.batch}", "graph"),
        item("peak before", f"{format_bytes(sim.peak_bytes)} at level {sim.peak_level}", "before"),
        item("peak after", (f"{format_bytes(after.sim.peak_bytes)} "
                            f"({100 * (after.sim.peak_bytes / sim.peak_bytes - 1):+.1f}%)"
                            if after else "no plan"), "after"),
        item("host peak", f"{format_bytes(host_peak)} of {format_bytes(host_limit)} "
             "(TensorFlow's pinned host memory limit)", "host", "bad" if over_host else ""),
        item("swapped", (f"{counted(len(plan.swaps), 'tensor')}, "
                         f"{format_bytes(after.swap_bytes)}; "
                         f"{counted(n_in, 'swap-in')} ({n_sync} synchronous)"
                         if after and plan.swaps else "nothing"), "swapped"),
        item("recomputed", (f"{counted(len(plan.recomputes), 'tensor')}, "
                            f"{counted(len(after.rewrite.clones), 'op')} cloned"
                            if after and plan.recomputes else "nothing"), "recomputed"),
        item("overhead", overhead, "overhead"),
        item("budget", fits, "fits", fits_cls),
        item("plan", {"none": "empty", "knobs": "from the knobs", "hand": "edited by hand",
                      "tuner": "from auto-tune", "file": "loaded from a file",
                      "saved": "restored: this tab's plan for this graph"}.get(
                          str(plan_data.get("source")), "—"), "source"),
    ]
    if skipped:
        items.append(item("skipped", f"{len(skipped)} swaps could not be placed", "skipped",
                          "bad"))
    if sim.unknown_size_tensors:
        items.append(item("unknown sizes", f"{len(sim.unknown_size_tensors)} tensors counted "
                          "as 0 bytes", "unknown"))
    if sim.at_most_size_tensors:
        items.append(item("data-dependent sizes", f"{len(sim.at_most_size_tensors)} tensors "
                          "counted at their most", "at-most"))
    return items


def _editor(loaded: LoadedGraph, plan: Plan, tensor: str | None
            ) -> tuple[Any, list[dict[str, Any]]]:
    """Description of the selected swap's groups, and the group dropdown's options."""
    swap = next((s for s in plan.swaps if s.tensor == tensor), None) if tensor else None
    if swap is None:
        hint = (f"{tensor} is recomputed (see below), not swapped." if tensor in
                plan.recomputed() else f"{tensor} is not swapped." if tensor else
                "Select a swapped tensor in the table to regroup its consumers or move a "
                "swap-in's trigger.")
        return html.P(hint, className="hint"), []
    lv = lmscore.order(loaded.graph).levels
    index = loaded.graph.index
    items = []
    options = []
    for k, g in enumerate(swap.swap_ins):
        levels = sorted({lv[index[c]] for c in g.consumers})
        trig = (f"trigger {g.trigger} (level {lv[index[g.trigger]]})" if g.trigger
                else "synchronous")
        items.append(html.Li(f"swap-in {k}: {len(g.consumers)} consumer(s) at level(s) "
                             f"{', '.join(map(str, levels[:6]))}{' …' if len(levels) > 6 else ''}"
                             f"; {trig}"))
        options.append({"label": f"swap-in {k}", "value": k})
    return html.Div([html.B(swap.tensor), html.Ul(items)]), options


def _names(names: tuple[str, ...], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _recompute_item(loaded: LoadedGraph, r: Recompute) -> Any:
    """One recompute: the ops cloned, the consumers served, the trigger, with their levels."""
    lv = lmscore.order(loaded.graph).levels
    index = loaded.graph.index
    levels = sorted({lv[index[c]] for c in r.consumers})
    shown = ", ".join(map(str, levels[:6])) + (" …" if len(levels) > 6 else "")
    return html.Li([
        html.B(r.tensor),
        f": clones {_names(r.ops)} for {len(r.consumers)} consumer(s) "
        f"({_names(r.consumers)}) at level(s) {shown}; "
        f"trigger {r.trigger} (level {lv[index[r.trigger]]})",
    ])


def recompute_list(loaded: LoadedGraph, plan: Plan) -> Any:
    """The plan's recomputes, each with its clones, consumers and trigger."""
    if not plan.recomputes:
        return html.P("Nothing is recomputed. Click a row's recompute cell in the table to "
                      "recompute its tensor for its far readers instead of keeping it.",
                      className="hint")
    items = [_recompute_item(loaded, r) for r in plan.recomputes[:MAX_LISTED]]
    if len(plan.recomputes) > MAX_LISTED:
        items.append(html.Li(f"… and {len(plan.recomputes) - MAX_LISTED} more",
                             className="hint"))
    return html.Ul(items)



CONTROLS = ("batch", "budget", "device", "link", "workspace", "knob-threshold", "knob-ahead",
             "knob-groupby", "knob-sync")



def controls_values(settings: dict[str, Any]) -> list[Any]:
    """Values of the form controls (:data:`CONTROLS`, in order) for ``settings``."""
    knobs = {**default_settings(1)["knobs"], **settings.get("knobs", {})}
    return [settings.get("batch"), settings.get("budget"), settings.get("device"),
            settings.get("link"), settings.get("workspace", "accelerator"), knobs["threshold"],
            knobs["ahead"], knobs["groupby"], knobs["sync_mode"]]


def picker(graph_ref: dict[str, Any]) -> tuple[list[dict[str, str]], str]:
    """Options and value of the graph picker for the session's graph."""
    options = sample_options()
    origin = str(graph_ref.get("origin", ""))
    if origin.startswith("sample:"):
        return options, origin
    value = f"{origin}:{graph_ref.get('key', '')[:12]}"
    label = f"{graph_ref.get('name', 'graph')} ({'uploaded' if origin == 'upload' else 'file'})"
    return [{"label": label, "value": value}, *options], value


# --- the level window, drawn op by op -------------------------------------------------------

#: Levels either side of a found op when the view zooms to it.
FIND_SPAN = 12


def zoom(app: AppContext, session: dict[str, Any], relayout: Any, query: Any,
         trigger: str | None) -> tuple[Any, Any, str | None]:
    """The figure's level window drawn op by op, after a zoom or pan or a name search.

    Returns
    -------
    patch : dash.Patch or no_update
        The window's detail traces (and, for a search, the x-axis range).
    note : str or no_update
    message : str or None
        A search that found nothing says so.
    """
    from lmscore.browse import data_edges, find

    graph_ref, settings = session["graph"], session["settings"]
    loaded = app.resolve(graph_ref)
    batch = int(settings["batch"])
    base = base_of(app, loaded, batch, settings.get("workspace", "accelerator"))
    n_levels = len(base.sim.device_curve)
    patch = dash.Patch()
    if trigger == "find" and not str(query or "").strip():
        return no_update, no_update, no_update  # the field cleared (another graph came)
    if trigger == "find":
        matches = find(loaded.graph, str(query or ""), 1)
        if not matches:
            return no_update, no_update, f"no op or tensor named like {str(query or '')!r}"
        levels = lmscore.order(loaded.graph).levels
        lvl = int(levels[matches[0].op])
        window: tuple[int, int] | None = _find_window(levels, lvl, n_levels)
        for ax in ("xaxis", "xaxis2"):
            patch["layout"][ax]["range"] = [window[0] - 0.5, window[1] + 0.5]
            patch["layout"][ax]["autorange"] = False
    else:
        window = figures.window_from_relayout(relayout, n_levels, (-1, -1))
        if window == (-1, -1):  # the event did not move the x-axis
            return no_update, no_update, None
    try:
        plan = plan_of(app, loaded, (session["plan"] or {}).get("json"))
    except PlanError:
        plan = empty_plan(loaded.graph)
    edges = app.results.get_or_compute(("edges", loaded.key, batch),
                                       lambda: data_edges(loaded.graph, base.sizes))
    traces, note = figures.window_traces(base.ops, base.positions, edges, window,
                                         _swap_draws(loaded, plan),
                                         _recompute_draws(loaded, plan))
    for k, tr in enumerate(traces):
        patch["data"][figures.T_DETAIL_EDGES + k] = tr.to_plotly_json()
    return patch, note, None


def _find_window(levels: Sequence[int], lvl: int, n_levels: int) -> tuple[int, int]:
    """Levels around ``lvl`` a found op is shown in.

    :data:`FIND_SPAN` either side, fewer where that window holds too many ops to draw one
    by one (:data:`figures.DETAIL_MAX_OPS`; the first levels of ResNet-50 hold 3,964 ops
    in 15 levels, and the op was never drawn).

    >>> _find_window([0, 1, 1, 2, 5], 1, 6)
    (0, 5)
    >>> _find_window([0] * 5 + [1] + [2] * 5, 1, 3)[0] >= 0
    True
    """
    counts = np.bincount(np.asarray(levels, dtype=np.int64), minlength=n_levels)
    total = np.concatenate(([0], np.cumsum(counts)))
    for span in range(FIND_SPAN, 0, -1):
        lo, hi = max(lvl - span, 0), min(lvl + span, n_levels - 1)
        if total[hi + 1] - total[lo] <= figures.DETAIL_MAX_OPS:
            return lo, hi
    return lvl, lvl


def _recompute_draws(loaded: LoadedGraph, plan: Plan) -> list[figures.RecomputeDraw]:
    index = loaded.graph.index
    adj = loaded.graph.adjacency
    out = []
    for r in plan.recomputes:
        cloned = {index[o] for o in r.ops}
        inputs = sorted({p for o in cloned for p, _ in adj.data_in[o] if p not in cloned})
        out.append(figures.RecomputeDraw(r.tensor, r.ops, tuple(inputs),
                                         tuple(index[c] for c in r.consumers),
                                         index[r.trigger]))
    return out


def _hover(app: AppContext, base: Base, after: After | None) -> list[str]:
    """Hover text of a device curve: each level's bytes and its three largest buffers."""
    from lmscore.evaluate import dominant_by_level

    def compute() -> list[str]:
        if after is None:
            values, tops = base.sim.device_curve, dominant_by_level(base.loaded.graph, base.sim)
        else:
            values, tops = after.device, after.evaluation.dominant()
        pairs = [[(r.what, r.bytes) for r in row] for row in tops]
        return figures.level_hover(values, pairs)

    digest = "" if after is None else after.digest
    return app.results.get_or_compute(
        ("hover", base.loaded.key, base.batch, base.workspace, digest), compute)
