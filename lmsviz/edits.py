"""Session and plan edits: one plain function per user action, each returning an :class:`Update`.

:func:`control` dispatches an action (the id of the component that fired) to its
function; it is the only writer of the session stores. Nothing here draws: the render
that follows a store change does (:mod:`lmsviz.rendering`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

import lmscore
from lmscore.errors import ConfigError, LmsError, PlanError
from lmscore.plan import (
    Plan,
    add_recompute,
    add_swap,
    check_plan,
    empty_plan,
    group_consumers,
    move_trigger,
    plan_from_json,
    plan_from_params,
    regroup,
    remove_recompute,
    remove_swap,
)
from lmscore.units import parse_bytes

from . import figures, rendering
from .files import decode_upload
from .results import base_of, counted, live_row, made_for, plan_digest, plan_of
from .state import (
    AppContext,
    LoadedGraph,
    accept_upload,
    budget_text,
    empty_view,
    load_sample,
    plan_store,
    plan_text,
    presets,
    timed,
)

#: Largest batch size accepted from the form.
MAX_BATCH = 1 << 20


@dataclass(frozen=True)
class Update:
    """What an action changes; None leaves a store or control as it is.

    Attributes
    ----------
    graph, settings, plan, view : dict, optional
        New data of the session stores.
    message : str, optional
        Shown above the views ("" clears it).
    error : bool
        Whether the message reports a refusal.
    controls : bool
        Whether to set the form controls from the (new) settings.
    history : dict, optional
        New undo and redo stacks of plans (:func:`control` keeps them).
    """

    graph: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    view: dict[str, Any] | None = None
    message: str | None = None
    error: bool = False
    controls: bool = False
    history: dict[str, Any] | None = None


def refuse(message: str) -> Update:
    """An update that changes nothing and says why."""
    return Update(message=message, error=True)


def _plan_changed(app: AppContext, loaded: LoadedGraph, plan: Plan, source: str,
                  tune: dict[str, Any] | None = None) -> dict[str, Any]:
    """The new plan store (:func:`control` saves it for the tab and keeps its history)."""
    store = plan_store(plan, source, tune)
    # the render that follows finds the plan parsed and checked
    app.results.put(("plan", loaded.key, plan_digest(store["json"])), plan)
    return store


def choose_graph(app: AppContext, value: str, graph_ref: dict[str, Any],
                 settings: dict[str, Any], tab: str = "") -> Update:
    """The graph picker: load a bundled sample (or keep the current graph).

    The batch size becomes the sample's; the plan this tab last made for the graph comes
    back.
    """
    if not value or not value.startswith("sample:"):
        return Update()
    try:
        loaded = load_sample(app, value.removeprefix("sample:"))
    except LmsError as e:
        return refuse(str(e))
    batch = loaded.default_batch or settings.get("batch", 1)
    return _switch_to(app, loaded, {**settings, "batch": batch}, tab)


def _switch_to(app: AppContext, loaded: LoadedGraph, settings: dict[str, Any], tab: str
               ) -> Update:
    saved = app.saved_plan(tab, loaded)
    plan = plan_store(saved, "saved") if saved is not None and (
        saved.swaps or saved.recomputes) else plan_store(None, "none")
    ref = loaded.ref()
    msg = f"loaded {loaded.name}: {ref['ops']:,} ops, {ref['levels']:,} levels"
    fixed = ref.get("fixed_batch")
    if fixed:
        if fixed != settings.get("batch"):
            msg += f"; its batch is fixed at {fixed}, so batch size {settings.get('batch')} " \
                   "does not apply"
        settings = {**settings, "batch": fixed}
    if saved is not None and plan["json"]:
        msg += f"; restored this tab's plan for it ({plan_counts(saved)})"
    return Update(graph=ref, settings=settings, plan=plan, view=empty_view(), message=msg,
                  controls=True)


def upload_graph(app: AppContext, gate: dict[str, Any] | None,
                 settings: dict[str, Any], tab: str = "",
                 previous: dict[str, Any] | None = None) -> Update:
    """An uploaded graph file: refuse it with a clear message, or switch to it.

    The batch size stays the user's, but for one the ``previous`` graph's inputs had fixed:
    never the user's, it is not kept (a graph of an unknown batch uploaded after one fixed
    at 2 was shown at 2, where ``lms`` takes 1, and a graph fixed at 32 was said not to
    take "batch size 8", a batch the user had never typed).
    """
    inherited = bool((previous or {}).get("fixed_batch")) and (
        settings.get("batch") == previous["fixed_batch"])
    try:
        name, data = decode_upload(gate, app.upload_cap_bytes)
        loaded = accept_upload(app, name, data)
        if inherited:
            settings = {**settings, "batch": loaded.fixed_batch or loaded.default_batch or 1}
        # sized and simulated now, so that a graph that cannot be shown never replaces one
        # that can (the render that follows finds the result cached)
        base_of(app, loaded, loaded.fixed_batch or int(settings.get("batch") or 1),
                settings.get("workspace", "accelerator"))
    except LmsError as e:
        return refuse(f"upload refused: {e}")
    return _switch_to(app, loaded, settings, tab)


def whole_number(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """A form field's value as an integer from ``lo`` to ``hi``.

    Raises
    ------
    ConfigError
        Naming the field and what was typed.

    >>> whole_number("batch size", " 8 ", 1)
    8
    >>> whole_number("batch size", "2.5", 1)
    Traceback (most recent call last):
    ...
    lmscore.errors.ConfigError: batch size must be a whole number from 1, got '2.5'
    """
    text = "" if value is None else str(value).strip()
    rng = f"from {lo}" + (f" to {hi:,}" if hi is not None else "")
    if not text:
        raise ConfigError(f"{name} is empty: type a whole number {rng}")
    try:
        number = int(text)
    except ValueError:
        try:
            number = int(float(text)) if float(text).is_integer() else None
        except (ValueError, OverflowError):
            number = None
    if number is None or number < lo or (hi is not None and number > hi):
        raise ConfigError(f"{name} must be a whole number {rng}, got {text!r}")
    return number


def set_batch(settings: dict[str, Any], value: Any, graph_ref: dict[str, Any] | None = None
              ) -> Update:
    """A new batch size (a positive integer); anything else is refused.

    A graph whose feeds fix the batch keeps it, and the refusal says so.
    """
    try:
        batch = whole_number("batch size", value, 1, MAX_BATCH)
    except ConfigError as e:
        return Update(message=str(e), error=True, controls=True)
    fixed = (graph_ref or {}).get("fixed_batch")
    if fixed and batch != fixed:
        return Update(message=f"batch size {batch} does not apply: "
                      f"{(graph_ref or {}).get('name', 'the graph')}'s batch is fixed at "
                      f"{fixed} by its inputs", error=True, controls=True)
    if batch == settings.get("batch"):
        return Update(controls=True)
    return Update(settings={**settings, "batch": batch}, message="")


def set_budget(settings: dict[str, Any], text: Any) -> Update:
    """A new device budget, as text like ``16GiB``."""
    try:
        parse_bytes(str(text))
    except ConfigError as e:
        return Update(message=f"budget: {e}", error=True, controls=True)
    if text == settings.get("budget"):
        return Update()
    return Update(settings={**settings, "budget": str(text).strip()}, message="")


def set_presets(settings: dict[str, Any], device: str | None, link: str | None) -> Update:
    """Device and link presets of the tuner; a new device brings its memory as the budget."""
    devices, links = presets()
    if device not in devices or link not in links:
        return Update(controls=True)
    new = {**settings, "device": device, "link": link}
    memory = getattr(devices[device], "memory_bytes", None)
    if device != settings.get("device") and memory:
        new["budget"] = budget_text(int(memory))
        return Update(settings=new, controls=True,
                      message=f"budget set to the {device}'s memory, {new['budget']}")
    return Update(settings=new)


def set_workspace(settings: dict[str, Any], value: Any) -> Update:
    """The simulator's kernel-workspace model: ``"accelerator"`` or ``"cpu"`` (as measured)."""
    if value not in ("accelerator", "cpu"):
        return Update(controls=True)
    if value == settings.get("workspace", "accelerator"):
        return Update()
    return Update(settings={**settings, "workspace": value})


def read_knobs(threshold: Any, ahead: Any, groupby: Any, sync_mode: Any) -> dict[str, int]:
    """The knobs of the form as integers.

    Raises
    ------
    ConfigError
        If one is not a whole number in its range (the message names it).
    """
    return {"threshold": whole_number("threshold", threshold, 1),
            "ahead": whole_number("ahead", ahead, 1),
            "groupby": whole_number("groupby", groupby, 0),
            "sync_mode": whole_number("sync mode", sync_mode, 0, 3)}


def apply_knobs(app: AppContext, graph_ref: dict[str, Any], settings: dict[str, Any],
                knobs: dict[str, Any]) -> Update:
    """Make a plan from the TFLMS knobs (:func:`lmscore.plan.plan_from_params`)."""
    try:
        values = read_knobs(**knobs)
        loaded = app.resolve(graph_ref)
        base = base_of(app, loaded, settings["batch"], settings.get("workspace", "accelerator"))
        plan = plan_from_params(loaded.graph, settings["batch"], sizes=base.sizes, **values)
    except LmsError as e:
        return refuse(f"knobs: {e}")
    store = _plan_changed(app, loaded, plan, "knobs")
    return Update(settings={**settings, "knobs": values}, plan=store,
                  message=f"knobs applied: {counted(len(plan.swaps), 'tensor')} swapped")


def plan_counts(plan: Plan) -> str:
    """How many swaps (and recomputes, if any) a plan makes, for messages.

    >>> from lmscore.plan import Recompute
    >>> plan_counts(Plan("f", recomputes=(Recompute("a:0", ("a",), ("b",), "c"),)))
    '0 swaps, 1 recompute'
    """
    text = counted(len(plan.swaps), "swap")
    if plan.recomputes:
        text += f", {counted(len(plan.recomputes), 'recompute')}"
    return text


def toggle_swap(app: AppContext, graph_ref: dict[str, Any], settings: dict[str, Any],
                plan_data: dict[str, Any], view: dict[str, Any], tensor: str) -> Update:
    """Swap a hotspot tensor, or stop swapping it (the plan's other decisions are kept).

    A recomputed tensor is swapped instead; if the swap is refused it stays recomputed.
    """
    def edit(loaded: LoadedGraph, plan: Plan) -> tuple[Plan, str] | Update:
        if tensor in plan.swapped():
            return remove_swap(plan, tensor), "no longer swapped"
        base = base_of(app, loaded, settings["batch"], settings.get("workspace", "accelerator"))
        row = live_row(base, tensor)
        if row is not None and not row.swappable:
            return refuse(f"{tensor} cannot be swapped: {row.reason}")
        knobs = settings.get("knobs", {})
        # one decision per tensor: the click replaces a recomputation
        was_recomputed = tensor in plan.recomputed()
        start = remove_recompute(plan, tensor) if was_recomputed else plan
        # a hand toggle moves the tensor off the device for every consumer that is not
        # adjacent to it (what the table calls swappable); ahead and groupby are the knobs'
        new = add_swap(loaded.graph, start, tensor, threshold=1,
                       ahead=int(knobs.get("ahead", 1)), groupby=int(knobs.get("groupby", 5)),
                       sizes=base.sizes)
        return new, "swapped instead of recomputed" if was_recomputed else "swapped"

    return _hand_edit(app, graph_ref, plan_data, view, tensor, edit)


def toggle_recompute(app: AppContext, graph_ref: dict[str, Any], settings: dict[str, Any],
                     plan_data: dict[str, Any], view: dict[str, Any], tensor: str) -> Update:
    """Recompute a hotspot tensor for its far readers, or stop recomputing it.

    The edit is :func:`lmscore.plan.add_recompute` at threshold 1 (every reader that is not
    adjacent to the tensor reads the recomputed copy), its trigger about the ``ahead`` knob
    before the first of them; a refusal says why in the core's words. A swapped tensor is
    recomputed instead; if the recomputation is refused it stays swapped.
    """
    def edit(loaded: LoadedGraph, plan: Plan) -> tuple[Plan, str]:
        if tensor in plan.recomputed():
            return remove_recompute(plan, tensor), "no longer recomputed"
        was_swapped = tensor in plan.swapped()
        start = remove_swap(plan, tensor) if was_swapped else plan
        ahead = int(settings.get("knobs", {}).get("ahead", 1))
        new = add_recompute(loaded.graph, start, tensor, threshold=1, ahead=ahead)
        return new, "recomputed instead of swapped" if was_swapped else "recomputed"

    return _hand_edit(app, graph_ref, plan_data, view, tensor, edit)


def _hand_edit(app: AppContext, graph_ref: dict[str, Any], plan_data: dict[str, Any],
               view: dict[str, Any], tensor: str,
               edit: Callable[[LoadedGraph, Plan], tuple[Plan, str] | Update]) -> Update:
    """Apply a hand edit of ``tensor``'s decision to the current plan, or say why not."""
    try:
        loaded = app.resolve(graph_ref)
        done = edit(loaded, plan_of(app, loaded, plan_data.get("json")))
    except LmsError as e:
        return refuse(f"edit refused: {e}")
    if isinstance(done, Update):
        return done
    new, verb = done
    return Update(plan=_plan_changed(app, loaded, new, "hand"), view={**view, "tensor": tensor},
                  message=f"{tensor} {verb}; the plan has {plan_counts(new)}")



def select_level(view: dict[str, Any], level: Any, n_levels: int) -> Update:
    """Select a level (the table then lists the tensors live there)."""
    try:
        lvl = int(round(float(level)))
    except (TypeError, ValueError):
        return Update()
    lvl = min(max(lvl, 0), max(n_levels - 1, 0))
    return Update(view={**view, "level": lvl})


def select_tensor(view: dict[str, Any], tensor: str) -> Update:
    """Select a tensor: its lifetime is drawn and its producer and consumers ringed."""
    return Update(view={**view, "tensor": tensor})


def click_figure(app: AppContext, view: dict[str, Any], click: dict[str, Any] | None,
                 graph_ref: dict[str, Any]) -> Update:
    """A click on the figure: an op (selects it and its level), a swap op, or a level.

    Plotly's click event names a point by its trace and its index in it (``curveNumber``,
    ``pointNumber``); a lane trace holds its category's ops in graph order, so the op is
    found from those two (the point's ``customdata`` does not survive as an op index).
    """
    if not click or not click.get("points"):
        return Update()
    point = click["points"][0]
    curve = point.get("curveNumber")
    n_levels = int(graph_ref.get("levels", 1))
    up = select_level(view, point.get("x"), n_levels)
    new_view = dict(up.view or view)
    data = point.get("customdata")
    if isinstance(curve, int) and 0 <= curve < len(figures.CATEGORIES):
        try:
            loaded = app.resolve(graph_ref)
        except LmsError as e:
            return refuse(str(e))
        op = op_at(app, loaded, curve, point.get("pointNumber"), new_view.get("level"))
        if op is None:
            return Update(view=new_view, message="this point stands for many ops: zoom in "
                          "(drag over the ordering view) to pick one")
        new_view["op"] = op
        return Update(view=new_view, message=f"selected op {loaded.graph.ops[op].name} "
                      f"(level {new_view.get('level')})")
    if curve == figures.T_DETAIL_OPS and isinstance(data, int) and data >= 0:
        try:
            loaded = app.resolve(graph_ref)
        except LmsError as e:
            return refuse(str(e))
        if data >= len(loaded.graph.ops):
            return refuse("that op is not in this graph: reload the page")
        new_view["op"] = data  # the window's ops carry their index
        return Update(view=new_view, message=f"selected op {loaded.graph.ops[data].name} "
                      f"(level {new_view.get('level')})")
    if curve in (figures.T_SWAP_OPS, figures.T_DETAIL_MARKS) and isinstance(data, str):
        new_view["tensor"] = data
    return Update(view=new_view)


def find_name(app: AppContext, graph_ref: dict[str, Any], view: dict[str, Any], query: Any
              ) -> Update:
    """Select the op or tensor whose name best matches ``query`` (:func:`lmscore.browse.find`)."""
    from lmscore.browse import find

    if not str(query or "").strip():
        return Update()  # the field cleared (another graph came)
    try:
        loaded = app.resolve(graph_ref)
    except LmsError as e:
        return refuse(str(e))
    matches = find(loaded.graph, str(query or ""), FIND_MORE + 1)
    if not matches:
        return refuse(f"no op or tensor named like {str(query or '')!r}") if query else Update()
    m = matches[0]
    level = int(lmscore.order(loaded.graph).levels[m.op])
    new_view = {**view, "op": m.op, "level": level}
    if m.is_tensor:
        new_view["tensor"] = m.name
    # the best of several is taken: say so, with the others' names to refine by
    more = ""
    if len(matches) > 1:
        others = ", ".join(x.name for x in matches[1:4])
        count = f"{len(matches) - 1}" if len(matches) <= FIND_MORE else f"over {FIND_MORE - 1}"
        more = f" ({count} more match: {others}{', …' if len(matches) > 4 else ''})"
    return Update(view=new_view, message=f"found {m.name} at level {level}{more}")


#: How many other matches "find" counts before it says "over ...".
FIND_MORE = 20


def op_at(app: AppContext, loaded: LoadedGraph, lane: int, point: Any, level: Any
          ) -> int | None:
    """The op drawn as point ``point`` of lane trace ``lane``, or None.

    None when the view is aggregated (a point is a bin of ops) or the point does not match
    an op at ``level`` (the figure on the page is not this graph's).
    """
    if not isinstance(point, int) or point < 0 or len(loaded.graph.ops) > app.max_points:
        return None

    def lanes() -> tuple[np.ndarray, ...]:
        cats = np.asarray(lmscore.order(loaded.graph).categories)
        return tuple(np.flatnonzero(cats == c) for c in figures.CATEGORIES)

    members = app.results.get_or_compute(("lanes", loaded.key), lanes)[lane]
    if point >= len(members):
        return None
    op = int(members[point])
    if level is not None and lmscore.order(loaded.graph).levels[op] != level:
        return None
    return op


def set_trigger(app: AppContext, graph_ref: dict[str, Any], plan_data: dict[str, Any],
                tensor: str | None, group: Any, trigger_op: int | None) -> Update:
    """Move the trigger of one swap-in to the selected op (None: synchronous)."""
    if not tensor:
        return refuse("select a swapped tensor first (click it in the table)")
    try:
        loaded = app.resolve(graph_ref)
        plan = plan_of(app, loaded, plan_data.get("json"))
        name = None
        if trigger_op is not None:
            if not 0 <= int(trigger_op) < len(loaded.graph.ops):
                raise PlanError("the selected op is not in this graph")
            name = loaded.graph.ops[int(trigger_op)].name
        new = move_trigger(loaded.graph, plan, tensor, int(group or 0), name)
    except LmsError as e:
        return refuse(f"edit refused: {e}")
    what = f"triggered by {name}" if name else "synchronous"
    return Update(plan=_plan_changed(app, loaded, new, "hand"),
                  message=f"swap-in {int(group or 0)} of {tensor} is now {what}")


def regroup_swap(app: AppContext, graph_ref: dict[str, Any], plan_data: dict[str, Any],
                 tensor: str | None, groupby: Any) -> Update:
    """Regroup the consumers of a swapped tensor: ``groupby`` levels per swap-in (None: one)."""
    if not tensor:
        return refuse("select a swapped tensor first (click it in the table)")
    try:
        loaded = app.resolve(graph_ref)
        plan = plan_of(app, loaded, plan_data.get("json"))
        swap = next((s for s in plan.swaps if s.tensor == tensor), None)
        if swap is None:
            raise PlanError(f"tensor {tensor!r} is not swapped by this plan")
        consumers = [c for g in swap.swap_ins for c in g.consumers]
        if groupby is None:
            groups: list[tuple[str, ...]] = [tuple(consumers)]
        else:
            gb = whole_number("groupby", groupby, 0)
            groups = group_consumers(loaded.graph, consumers, gb)
        new = regroup(loaded.graph, plan, tensor, groups)
    except LmsError as e:
        return refuse(f"edit refused: {e}")
    return Update(plan=_plan_changed(app, loaded, new, "hand"),
                  message=f"{tensor}: {len(groups)} swap-in group(s)")


def reset_plan(app: AppContext, graph_ref: dict[str, Any]) -> Update:
    """Drop every swap and recomputation."""
    try:
        loaded = app.resolve(graph_ref)
    except LmsError as e:
        return refuse(str(e))
    return Update(plan=_plan_changed(app, loaded, empty_plan(loaded.graph), "none"),
                  message="plan reset: nothing swapped or recomputed")


def load_plan_file(app: AppContext, graph_ref: dict[str, Any], gate: dict[str, Any] | None,
                   batch: int | None = None) -> Update:
    """A plan uploaded as JSON, checked against the graph (:func:`lmscore.plan.check_plan`)."""
    try:
        name, data = decode_upload(gate, app.upload_cap_bytes)
        loaded = app.resolve(graph_ref)
        if not name.lower().endswith(".json"):
            raise PlanError(f"{name}: not a plan file (load plan takes the .json file that "
                            "save plan or lms tune --out wrote)")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise PlanError(f"{name}: not a JSON plan (binary data)") from None
        plan = plan_from_json(text, name)
        check_plan(loaded.graph, plan)
    except LmsError as e:
        return refuse(f"plan refused: {e}")
    other = made_for(plan, batch, only_other=True)
    return Update(plan=_plan_changed(app, loaded, plan, "file"),
                  message=f"plan loaded from {name}: {plan_counts(plan)}"
                          + (f"; {other}" if other else ""))


def accept_tune(app: AppContext, graph_ref: dict[str, Any], settings: dict[str, Any],
                result: dict[str, Any] | None) -> Update:
    """The auto-tuner's result: its plan becomes the session's plan."""
    if not result:
        return Update()
    if result.get("error"):
        return refuse(f"auto-tune: {result['error']}")
    if result.get("key") != graph_ref.get("key") or result.get("batch") != settings.get("batch"):
        return refuse("auto-tune finished for another graph or batch size; run it again")
    try:
        loaded = app.resolve(graph_ref)
        plan = plan_from_json(result["plan"], "tuner")
        check_plan(loaded.graph, plan)
    except LmsError as e:
        return refuse(f"auto-tune returned an unusable plan: {e}")
    verdict = {k: result.get(k) for k in (
        "fits", "budget_bytes", "predicted_peak_bytes", "predicted_overhead", "swapped_tensors",
        "swap_bytes", "message")}
    verdict["plan_sha"] = plan_digest(plan_text(plan))
    fits = "fits" if result.get("fits") else "does not fit"
    return Update(plan=_plan_changed(app, loaded, plan, "tuner", verdict),
                  message=f"auto-tune: {fits}; {result.get('message') or ''}".rstrip("; "))


def restore() -> Update:
    """The session stores were restored (page reload): set the form from them."""
    return Update(controls=True)


#: Plans kept per tab for undo (and for redo); older ones are dropped.
MAX_HISTORY = 30
#: Characters of plan JSON a history keeps in the tab itself (only when the server cannot
#: keep the texts, :meth:`AppContext.keep_version`).
MAX_HISTORY_CHARS = 2_000_000


def _bounded(stack: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest entries of ``stack`` within :data:`MAX_HISTORY` and the size bound."""
    kept: list[dict[str, Any]] = []
    size = 0
    for entry in reversed(stack[-MAX_HISTORY:]):
        size += len(entry.get("json") or "")
        if size > MAX_HISTORY_CHARS and kept:
            break
        kept.append(entry)
    return kept[::-1]


def history_entry(app: AppContext, tab: str, store: dict[str, Any]) -> dict[str, Any]:
    """A plan store as the undo history holds it: its text on the server, its digest here.

    >>> history_entry(None, "", {"json": None, "source": "none"})
    {'json': None, 'source': 'none'}
    """
    text = store.get("json")
    if not text:
        return dict(store)
    digest = plan_digest(text)
    if not app.keep_version(tab, digest, text):
        return dict(store)  # the server cannot keep it: the tab carries the text
    return {**{k: v for k, v in store.items() if k != "json"}, "digest": digest}


def _store_of(app: AppContext, tab: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The plan store a history entry stands for.

    Raises
    ------
    PlanError
        If the server no longer has the plan's text (its data directory was cleared).
    """
    if "digest" not in entry:
        return dict(entry)
    text = app.version(tab, str(entry["digest"]))
    if text is None or plan_digest(text) != entry["digest"]:
        raise PlanError("that plan is no longer on the server")
    return {**{k: v for k, v in entry.items() if k != "digest"}, "json": text}


def _digests(history: dict[str, Any]) -> set[str]:
    return {str(e["digest"]) for k in ("undo", "redo") for e in history.get(k) or ()
            if isinstance(e, dict) and "digest" in e}


def undo_redo(app: AppContext, graph_ref: dict[str, Any], plan_data: dict[str, Any],
              history: dict[str, Any], redo: bool, tab: str = "") -> Update:
    """Go back to the plan before the last edit (``redo``: forward again)."""
    take, give = ("redo", "undo") if redo else ("undo", "redo")
    stack = list(history.get(take) or [])
    if not stack:
        return refuse(f"nothing to {take}")
    entry = stack.pop()
    try:
        store = _store_of(app, tab, entry)
        loaded = app.resolve(graph_ref)
        plan = plan_of(app, loaded, store.get("json"))
    except LmsError as e:
        return refuse(f"{take}: {e}")
    other = _bounded([*(history.get(give) or []), history_entry(app, tab, plan_data)])
    return Update(plan=store, history={take: stack, give: other},
                  message=f"{take} done: the plan has {plan_counts(plan)}")


def control(app: AppContext, trigger: str | None, values: dict[str, Any],
            session: dict[str, Any]) -> Update:
    """Dispatch one user action to its function.

    Parameters
    ----------
    trigger : str
        Id of the component that fired.
    values : dict
        Current values of the inputs and form fields, by component id.
    session : dict
        ``graph``, ``settings``, ``plan``, ``view`` and ``history`` store data and the
        tab's id (``tab``).

    Returns
    -------
    Update
        A changed plan is saved for the tab (``plans/<tab>/``) and the plan before it
        pushed on the tab's undo stack; a successful action clears an earlier message.
    """
    with timed(f"control {trigger}"):
        return _control(app, trigger, values, session)


#: Form fields: when one fires with another action in one request (the field's value is
#: sent when it loses the focus, to the button clicked), the field goes first.
FIELDS = ("graph-picker", "graph-gate", "batch", "budget", "workspace", "device", "link",
          "find")


def control_all(app: AppContext, triggers: list[str], values: dict[str, Any],
                session: dict[str, Any]) -> tuple[Update, str | None]:
    """Every action of one request, fields first, each on the session the last one left.

    Each goes through :func:`control`; a refusal stops there. Returns the update of them
    all and the action it answers (the last one done: the message goes next to it). A batch
    size typed and then "apply knobs" clicked reach the page in one request: with only the
    first answered, the click was lost without a word.
    """
    order = sorted(dict.fromkeys(triggers), key=lambda t: (t not in FIELDS, triggers.index(t)))
    if len(order) <= 1:
        trigger = order[0] if order else None
        return control(app, trigger, values, session), trigger
    done, trigger = Update(), None
    for trigger in order:
        up = control(app, trigger, values, session)
        done = Update(**{f: getattr(up, f) if getattr(up, f) is not None else getattr(done, f)
                         for f in ("graph", "settings", "plan", "view", "message", "history")},
                      error=up.error, controls=done.controls or up.controls)
        if up.error:
            break
        session = {**session, **{f: getattr(up, f) for f in ("graph", "settings", "plan",
                                                              "view", "history")
                                 if getattr(up, f) is not None}}
    return done, trigger


def _control(app: AppContext, trigger: str | None, values: dict[str, Any],
             session: dict[str, Any]) -> Update:
    up = _dispatch(app, trigger, values, session)
    if up.graph is not None and values.get("tune-run") is True and up.message:
        # the page cancels a run when another graph comes (lmsviz.callbacks): said, where
        # it went without a word
        up = replace(up, message=f"{up.message}; the auto-tune that was running is cancelled")
    tab = str(session.get("tab") or "")
    history = session.get("history") or {}
    if (up.plan is not None and up.history is None and not up.error and up.graph is None
            and up.plan.get("json") == (session.get("plan") or {}).get("json")):
        # an edit that leaves the plan as it was (one group of a single swap-in, the same
        # trigger again) takes no undo step: five of sixteen did, undone with no change
        said = f": {up.message}" if up.message else ""
        up = replace(up, plan=None, message=f"the plan is unchanged{said}")
    if up.plan is not None and up.history is None and not up.error:
        if up.graph is not None:  # another graph: its plans are another history
            history = {"undo": [], "redo": []}
        else:
            entry = history_entry(app, tab, session["plan"] or {})
            history = {"undo": _bounded([*(history.get("undo") or []), entry]), "redo": []}
        up = replace(up, history=history)
    if up.history is not None:  # the texts of the plans it no longer names go
        app.forget_versions(tab, _digests(session.get("history") or {}) - _digests(up.history))
    if up.plan is not None and not up.error:
        fp = str((up.graph or session["graph"] or {}).get("fingerprint", ""))
        app.save_plan(tab, fp, up.plan.get("json"))
    if up.message is None and not up.error and trigger in USER_ACTIONS:
        up = replace(up, message="")  # the last refusal no longer applies
    return up


#: Components whose firing is a user's action (the stores fire on reloads too).
USER_ACTIONS = frozenset({
    "graph-picker", "graph-gate", "batch", "budget", "workspace", "device", "link",
    "knobs-apply", "plan-reset", "plan-gate", "hotspots", "st-click", "edit-trigger",
    "edit-swap-op", "edit-recompute-op", "edit-sync", "edit-regroup", "edit-onegroup", "undo",
    "redo",
    "tune-cancel", "st-tune",
})


def _dispatch(app: AppContext, trigger: str | None, values: dict[str, Any],
              session: dict[str, Any]) -> Update:
    """The action's own function (see :func:`control`)."""
    g, s, p, v = session["graph"], session["settings"], session["plan"] or {}, session["view"]
    v = v or empty_view()
    tab = str(session.get("tab") or "")
    if trigger == "graph-picker":
        return choose_graph(app, values.get("graph-picker") or "", g, s, tab)
    if trigger == "graph-gate":
        return upload_graph(app, values.get("graph-gate"), s, tab, g)
    if trigger == "batch":
        return set_batch(s, values.get("batch"), g)
    if trigger == "budget":
        return set_budget(s, values.get("budget"))
    if trigger == "workspace":
        return set_workspace(s, values.get("workspace"))
    if trigger in ("device", "link"):
        return set_presets(s, values.get("device"), values.get("link"))
    if trigger == "knobs-apply":
        return apply_knobs(app, g, s, {
            "threshold": values.get("knob-threshold"), "ahead": values.get("knob-ahead"),
            "groupby": values.get("knob-groupby"), "sync_mode": values.get("knob-sync")})
    if trigger == "plan-reset":
        return reset_plan(app, g)
    if trigger == "plan-gate":
        return load_plan_file(app, g, values.get("plan-gate"), s.get("batch"))
    if trigger == "hotspots":
        cell = values.get("hotspots") or {}
        tensor = cell.get("row_id")
        if not tensor:
            return Update()
        tensor = rendering.row_tensor(str(tensor))
        if cell.get("column_id") == "swap":
            return toggle_swap(app, g, s, p, v, tensor)
        if cell.get("column_id") == "recompute":
            return toggle_recompute(app, g, s, p, v, tensor)
        return select_tensor(v, tensor)
    if trigger == "st-click":
        return click_figure(app, v, values.get("st-click"), g)
    if trigger == "find":
        return find_name(app, g, v, values.get("find"))
    if trigger == "edit-trigger":
        if v.get("op") is None:
            return refuse("click an op in the ordering view first: it becomes the trigger")
        return set_trigger(app, g, p, v.get("tensor"), values.get("edit-group"), v.get("op"))
    if trigger in ("edit-swap-op", "edit-recompute-op"):
        op = v.get("op")
        verb = "swapped" if trigger == "edit-swap-op" else "recomputed"
        if op is None:
            return refuse("click an op in the ordering view (or find it by name) first: "
                          f"its output is {verb}")
        try:
            name = app.resolve(g).graph.ops[int(op)].name
        except (LmsError, IndexError, ValueError) as e:
            return refuse(str(e))
        toggle = toggle_swap if trigger == "edit-swap-op" else toggle_recompute
        return toggle(app, g, s, p, v, f"{name}:0")
    if trigger == "edit-sync":
        return set_trigger(app, g, p, v.get("tensor"), values.get("edit-group"), None)
    if trigger == "edit-regroup":
        return regroup_swap(app, g, p, v.get("tensor"), values.get("edit-groupby"))
    if trigger == "edit-onegroup":
        return regroup_swap(app, g, p, v.get("tensor"), None)
    if trigger in ("undo", "redo"):
        return undo_redo(app, g, p, session.get("history") or {}, trigger == "redo", tab)
    if trigger == "tune-cancel":
        return Update(message="auto-tune cancelled; the plan is unchanged")
    if trigger == "st-tune":
        return accept_tune(app, g, s, values.get("st-tune"))
    if trigger in ("st-graph", "st-settings"):
        return restore()
    return Update()
