"""Callbacks: parse inputs, call lmscore, hand results to the figure builders.

Each callback is a thin wrapper around a plain function of this module (tested without a
browser in ``tests/test_ui_units.py``):

- :func:`control` is the only writer of the session stores. Every user action (pick or
  upload a graph, batch size, budget, presets, apply knobs, toggle a swap or a
  recomputation, select a level, tensor or op, move a trigger, regroup, load or reset a
  plan, accept a tuner result) maps to one function returning an :class:`Update`.
- :func:`render` turns the session stores into the figure, the summary, the hotspot
  table and the plan's lists. When only the plan or the selection changed it returns a
  ``dash.Patch`` that replaces the small traces and leaves the ordering points in the
  browser.
- :func:`run_tune` is the body of the auto-tune background callback.
- :func:`export_bundle` and :func:`plan_download` build the downloads.

Session state travels in ``dcc.Store`` components (``storage_type="session"``: per tab,
kept across reloads); the server keeps only the :class:`~lmsviz.state.AppContext`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import importlib
import inspect
import io
import logging
import pathlib
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import dash
import numpy as np
from dash import Input, Output, State, ctx, dcc, html, no_update

import lmscore
from lmscore.errors import ConfigError, GraphError, LmsError, PlanError
from lmscore.evaluate import PlanEvaluation, evaluate_plan
from lmscore.ir import split_tensor
from lmscore.memory import Simulation, host_memory_limit
from lmscore.memory import fits as fits_device
from lmscore.plan import (
    Plan,
    Recompute,
    add_recompute,
    add_swap,
    check_plan,
    empty_plan,
    group_consumers,
    move_trigger,
    plan_from_json,
    plan_from_params,
    recompute_refused,
    regroup,
    remove_recompute,
    remove_swap,
)
from lmscore.rewrite import Rewrite, rewrite
from lmscore.shapes import Sizes, resolve
from lmscore.units import format_bytes, parse_bytes

from . import figures
from .state import (
    AppContext,
    LoadedGraph,
    ServerBusy,
    accept_upload,
    budget_text,
    default_settings,
    empty_view,
    load_sample,
    plan_store,
    presets,
    sample_options,
)

_log = logging.getLogger("lmsviz")

#: Largest batch size accepted from the form.
MAX_BATCH = 1 << 20
SWAP_ON, SWAP_OFF, SWAP_NO = "☑ swapped", "☐ swap", "—"
RECOMPUTE_ON, RECOMPUTE_OFF = "☑ recomputed", "☐ recompute"
#: What the plan does with a tensor, as the hotspot table's ``decision`` column says it.
KEPT, SWAPPED, RECOMPUTED = "kept", "swapped", "recomputed"
#: Recomputes listed by name in the plan panel (the summary counts them all).
MAX_LISTED = 20

# --- analysis results (cached per graph content, batch and plan) --------------------------


@dataclass(frozen=True)
class Base:
    """The original graph at one batch size: sizes, simulation and the view's columns."""

    loaded: LoadedGraph
    batch: int
    workspace: str
    sizes: Sizes
    sim: Simulation
    ops: figures.OpTable
    positions: tuple[np.ndarray, np.ndarray]
    buffers: dict[str, tuple[int, int, int]]  # tensor -> (start level, end level, bytes)
    # hotspot rows by level, filled on demand (shared, like the rest, by every session)
    _live: dict[int, tuple[lmscore.LiveTensor, ...]] = field(
        default_factory=dict, repr=False, compare=False)
    _recompute: dict[tuple[str, int], str] = field(default_factory=dict, repr=False,
                                                   compare=False)

    def live(self, level: int) -> tuple[lmscore.LiveTensor, ...]:
        """:func:`lmscore.hotspots` at ``level`` (remembered for up to 256 levels)."""
        rows = self._live.get(level)
        if rows is None:
            rows = lmscore.hotspots(self.loaded.graph, self.sim, level, sizes=self.sizes)
            if len(self._live) < 256:
                self._live[level] = rows
        return rows

    def recompute_refused(self, tensor: str, ahead: int = 1) -> str:
        """Why a hand edit would not recompute ``tensor`` ("" if it would).

        The answer is :func:`lmscore.plan.recompute_refused`, :func:`lmscore.plan.add_recompute`'s
        own (remembered for up to 4096 tensors).
        """
        key = (tensor, ahead)
        reason = self._recompute.get(key)
        if reason is None:
            reason = recompute_refused(self.loaded.graph, tensor, threshold=1, ahead=ahead)
            if len(self._recompute) < 4096:
                self._recompute[key] = reason
        return reason


@dataclass(frozen=True)
class After:
    """A plan as edited, and its evaluation (:func:`lmscore.evaluate.evaluate_plan`)."""

    plan: Plan
    evaluation: PlanEvaluation
    peak_level: int  # of the device curve on the original levels

    @property
    def rewrite(self) -> Rewrite:
        """The rewritten step."""
        return self.evaluation.rewrite

    @property
    def sim(self) -> Simulation:
        """The rewritten step's simulation."""
        return self.evaluation.after

    @property
    def device(self) -> tuple[int, ...]:
        """Device curve on the original levels."""
        return self.evaluation.device_curve

    @property
    def host(self) -> tuple[int, ...]:
        """Host curve on the original levels."""
        return self.evaluation.host_curve

    @property
    def swap_bytes(self) -> int:
        """Bytes moved to host memory."""
        return self.evaluation.swap_bytes


def base_of(
    app: AppContext, loaded: LoadedGraph, batch: int, workspace: str = "accelerator"
) -> Base:
    """Sizes, simulation and ordering-view columns of ``loaded`` at ``batch`` (cached).

    ``workspace`` is the simulator's kernel-workspace model (``"accelerator"`` or ``"cpu"``).
    """

    def compute() -> Base:
        graph = loaded.graph
        ordering = lmscore.order(graph)
        sizes = resolve(graph, batch)
        sim = lmscore.simulate(graph, batch, sizes=sizes, workspace=workspace)
        shapes = []
        nbytes = []
        for i, op in enumerate(graph.ops):
            parts = []
            for port, spec in enumerate(op.outputs):
                shape = sizes.shapes[i][port]
                dims = "?" if shape is None else "[" + ",".join(
                    "?" if d < 0 else str(d) for d in shape) + "]"
                parts.append(f"{dims} {spec.dtype}")
            shapes.append(", ".join(parts[:4]) + (" …" if len(parts) > 4 else "") or "no outputs")
            nbytes.append(sum(b for b in sizes.nbytes[i] if b > 0))
        table = figures.OpTable(
            names=[op.name for op in graph.ops], types=[op.type for op in graph.ops],
            levels=ordering.levels, categories=ordering.categories, shapes=shapes,
            nbytes=nbytes,
        )
        # kernel workspaces too: the table lists them, and a toggle of one must be refused
        # as such, not as an unknown tensor
        buffers = {t: (b.start, b.end, b.bytes) for b in sim.buffers
                   for t in (b.tensor, *b.views)}
        return Base(loaded, batch, workspace, sizes, sim, table,
                    figures.op_positions(ordering.levels, ordering.categories), buffers)

    return app.compute(("base", loaded.key, batch, workspace), compute,
                       f"simulating {loaded.name} at batch {batch}", len(loaded.graph.ops))


def plan_digest(plan_json: str | None) -> str:
    """SHA-256 of a plan's JSON text (how plans are keyed in caches and tuner verdicts)."""
    return hashlib.sha256((plan_json or "").encode()).hexdigest()


def plan_of(app: AppContext, loaded: LoadedGraph, plan_json: str | None) -> Plan:
    """The session's plan, parsed and checked against the graph (cached).

    Raises
    ------
    PlanError
        If the JSON is not a plan for this graph.
    """
    if not plan_json:
        return empty_plan(loaded.graph)
    digest = plan_digest(plan_json)

    def compute() -> Plan:
        plan = plan_from_json(plan_json)
        check_plan(loaded.graph, plan)
        return plan

    return app.compute(("plan", loaded.key, digest), compute, "checking the plan")


def after_of(app: AppContext, base: Base, plan: Plan, digest: str | None = None
             ) -> After | None:
    """The rewrite of ``plan`` and its simulation (cached); None for an empty plan.

    ``digest`` identifies the plan in the cache (default: the SHA-256 of its JSON).
    """
    if plan.changes_nothing():
        return None
    digest = digest or plan_digest(plan.to_json())

    def compute() -> After:
        ev = evaluate_plan(base.loaded.graph, plan, base.batch, workspace=base.workspace,
                           before=base.sim, sizes=base.sizes)
        return After(plan, ev, int(np.argmax(ev.device_curve)) if ev.device_curve else 0)

    return app.compute(("after", base.loaded.key, base.batch, base.workspace, digest), compute,
                       "simulating the plan", len(base.loaded.graph.ops))


# --- session updates -------------------------------------------------------------------


@dataclass
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
    """

    graph: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    view: dict[str, Any] | None = None
    message: str | None = None
    error: bool = False
    controls: bool = False


def refuse(message: str) -> Update:
    """An update that changes nothing and says why."""
    return Update(message=message, error=True)


def _plan_changed(app: AppContext, loaded: LoadedGraph, plan: Plan, source: str,
                  tune: dict[str, Any] | None = None) -> dict[str, Any]:
    """The new plan store, saved under the data directory for restarts."""
    store = plan_store(plan, source, tune)
    app.save_plan(loaded.fingerprint, store["json"])
    # the render that follows finds the plan parsed and checked
    app.results.put(("plan", loaded.key, plan_digest(store["json"])), plan)
    return store


def choose_graph(app: AppContext, value: str, graph_ref: dict[str, Any],
                 settings: dict[str, Any]) -> Update:
    """The graph picker: load a bundled sample (or keep the current graph).

    The batch size becomes the sample's; the plan last saved for the graph comes back.
    """
    if not value or not value.startswith("sample:"):
        return Update()
    try:
        loaded = load_sample(app, value.removeprefix("sample:"))
    except LmsError as e:
        return refuse(str(e))
    batch = loaded.default_batch or settings.get("batch", 1)
    return _switch_to(app, loaded, {**settings, "batch": batch})


def _switch_to(app: AppContext, loaded: LoadedGraph, settings: dict[str, Any]) -> Update:
    saved = app.saved_plan(loaded)
    plan = plan_store(saved, "saved") if saved is not None and (
        saved.swaps or saved.recomputes) else plan_store(None, "none")
    ref = loaded.ref()
    msg = f"loaded {loaded.name}: {ref['ops']:,} ops, {ref['levels']:,} levels"
    if saved is not None and plan["json"]:
        msg += f"; restored your saved plan ({plan_counts(saved)})"
    return Update(graph=ref, settings=settings, plan=plan, view=empty_view(), message=msg,
                  controls=True)


def decode_upload(gate: dict[str, Any] | None, cap: int) -> tuple[str, bytes]:
    """Filename and bytes of an upload that passed the browser's size gate.

    Raises
    ------
    GraphError
        If the browser refused it as too large, or the contents are not base64 data.
    """
    if not gate:
        raise GraphError("nothing was uploaded")
    name = pathlib.Path(str(gate.get("filename") or "upload")).name
    if gate.get("refused") or int(gate.get("size") or 0) > cap:
        raise GraphError(f"{name} is {format_bytes(int(gate.get('size') or 0))}: over the upload "
                         f"limit of {format_bytes(cap)}")
    contents = str(gate.get("contents") or "")
    _, _, payload = contents.partition(",")
    if len(payload) * 3 // 4 > cap + 3:
        raise GraphError(f"{name}: over the upload limit of {format_bytes(cap)}")
    try:
        return name, base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise GraphError(f"{name}: the upload is not base64 data") from None


def upload_graph(app: AppContext, gate: dict[str, Any] | None,
                 settings: dict[str, Any]) -> Update:
    """An uploaded graph file: refuse it with a clear message, or switch to it."""
    try:
        name, data = decode_upload(gate, app.upload_cap_bytes)
        loaded = accept_upload(app, name, data)
        # sized and simulated now, so that a graph that cannot be shown never replaces one
        # that can (the render that follows finds the result cached)
        base_of(app, loaded, int(settings.get("batch") or 1),
                settings.get("workspace", "accelerator"))
    except LmsError as e:
        return refuse(f"upload refused: {e}")
    return _switch_to(app, loaded, settings)


def set_batch(settings: dict[str, Any], value: Any) -> Update:
    """A new batch size (a positive integer); anything else is refused."""
    try:
        batch = int(value)
        if batch != float(value) or not 1 <= batch <= MAX_BATCH:
            raise ValueError
    except (TypeError, ValueError):
        return Update(message=f"batch size must be an integer from 1 to {MAX_BATCH}, got "
                      f"{value!r}", error=True, controls=True)
    if batch == settings.get("batch"):
        return Update()
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
        If one is not an integer.
    """
    out = {}
    for name, value in (("threshold", threshold), ("ahead", ahead), ("groupby", groupby),
                        ("sync_mode", sync_mode)):
        try:
            out[name] = int(value)
            if out[name] != float(value):
                raise ValueError
        except (TypeError, ValueError):
            raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    return out


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
                  message=f"knobs applied: {len(plan.swaps)} tensors swapped")


def plan_counts(plan: Plan) -> str:
    """How many swaps (and recomputes, if any) a plan makes, for messages.

    >>> plan_counts(Plan("f", recomputes=(Recompute("a:0", ("a",), ("b",), "c"),)))
    '0 swaps, 1 recompute'
    """
    text = f"{len(plan.swaps)} swaps"
    if plan.recomputes:
        n = len(plan.recomputes)
        text += f", {n} recompute{'s' if n > 1 else ''}"
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
        row = _live_row(base, tensor)
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


def _live_row(base: Base, tensor: str) -> lmscore.LiveTensor | None:
    """The hotspot row of ``tensor`` at its producer's level (its verdict on swapping)."""
    span = base.buffers.get(tensor)
    if span is None:
        return None
    for row in base.live(span[0]):
        if tensor in (row.tensor, row.swap_tensor):
            return row
    return None


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


def click_figure(view: dict[str, Any], click: dict[str, Any] | None, graph_ref: dict[str, Any]
                 ) -> Update:
    """A click on the figure: an op (selects it and its level), a swap op, or a level."""
    if not click or not click.get("points"):
        return Update()
    point = click["points"][0]
    curve = point.get("curveNumber")
    n_levels = int(graph_ref.get("levels", 1))
    up = select_level(view, point.get("x"), n_levels)
    new_view = up.view or dict(view)
    data = point.get("customdata")
    on_op = curve is not None and curve < len(figures.CATEGORIES)
    if on_op and isinstance(data, int) and data >= 0:
        new_view["op"] = data
    elif curve == figures.T_SWAP_OPS and isinstance(data, str):
        new_view["tensor"] = data
    return Update(view=new_view)


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
            try:
                gb = int(groupby)
            except (TypeError, ValueError):
                raise ConfigError(f"groupby must be an integer, got {groupby!r}") from None
            if gb < 0:
                raise ConfigError(f"groupby must be >= 0, got {gb}")
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


def load_plan_file(app: AppContext, graph_ref: dict[str, Any], gate: dict[str, Any] | None
                   ) -> Update:
    """A plan uploaded as JSON, checked against the graph (:func:`lmscore.plan.check_plan`)."""
    try:
        name, data = decode_upload(gate, app.upload_cap_bytes)
        loaded = app.resolve(graph_ref)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise PlanError(f"{name}: not a JSON plan (binary data)") from None
        plan = plan_from_json(text, name)
        check_plan(loaded.graph, plan)
    except LmsError as e:
        return refuse(f"plan refused: {e}")
    return Update(plan=_plan_changed(app, loaded, plan, "file"),
                  message=f"plan loaded from {name}: {plan_counts(plan)}")


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
    verdict["plan_sha"] = plan_digest(plan.to_json())
    fits = "fits" if result.get("fits") else "does not fit"
    return Update(plan=_plan_changed(app, loaded, plan, "tuner", verdict),
                  message=f"auto-tune: {fits}; {result.get('message') or ''}".rstrip("; "))


def restore() -> Update:
    """The session stores were restored (page reload): set the form from them."""
    return Update(controls=True)


# --- rendering --------------------------------------------------------------------------


@dataclass
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
    graph_ref, settings = session["graph"], session["settings"]
    plan_data, view = session["plan"] or {}, session["view"] or empty_view()
    loaded = app.resolve(graph_ref)
    batch = int(settings["batch"])
    base = base_of(app, loaded, batch, settings.get("workspace", "accelerator"))
    message = None
    try:
        plan = plan_of(app, loaded, plan_data.get("json"))
    except PlanError as e:
        plan = empty_plan(loaded.graph)
        message = f"the stored plan does not fit this graph and was ignored: {e}"
    after = after_of(app, base, plan, plan_digest(plan_data.get("json")) if not message else None)
    try:
        budget: int | None = parse_bytes(settings.get("budget") or "")
    except ConfigError:
        budget = None
    sim = base.sim
    curves = figures.Curves(
        before=sim.device_curve,
        after=after.device if after else None,
        host=after.host if after else None,
        peak_before=(sim.peak_level, sim.peak_bytes),
        peak_after=(after.peak_level, after.sim.peak_bytes) if after else None,
        budget=budget,
    )
    level = view.get("level")
    table_level = level if level is not None else (after.peak_level if after else sim.peak_level)
    hl = _highlight(loaded, base, view)
    swaps = _swap_draws(loaded, after.rewrite.plan if after else plan)
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
                figure["data"][figures.T_SWAP_EDGES + k] = tr.to_plotly_json()
            figure["layout"]["yaxis2"]["range"] = figures.memory_range(curves)
        figure["layout"]["shapes"] = figures.selection_shapes(hl, base.positions)
        note = no_update
    ahead = int(settings.get("knobs", {}).get("ahead", 1))
    rows = hotspot_rows(base, plan, table_level, ahead=ahead)
    styles = _row_styles(view.get("tensor"))
    where = ("selected level" if level is not None else
             "peak with the plan" if after else "peak")
    caption = (f"Tensors live at level {table_level} ({where}): {len(rows)}. "
               "Click a row to see its lifetime; click its swap or recompute cell to toggle it.")
    editor, groups = _editor(loaded, plan, view.get("tensor"))
    return Rendered(
        figure=figure, note=note, summary=summary(loaded, base, plan, plan_data, after, budget),
        rows=rows, row_styles=styles, caption=caption, editor=editor, groups=groups,
        rendered={"key": loaded.key, "batch": batch, "workspace": base.workspace},
        message=message, recomputes=recompute_list(loaded, plan),
    )


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


def hotspot_rows(base: Base, plan: Plan, level: int, *, ahead: int = 1
                 ) -> list[dict[str, Any]]:
    """Rows of the hotspot table: the tensors live at ``level``, largest first.

    Each row says what the plan does with its tensor (``decision``) and whether a hand
    edit would swap it (``swappable``, :func:`lmscore.hotspots`' verdict) or recompute it
    (``recomputable``, :meth:`Base.recompute_refused` with the ``ahead`` knob).
    """
    swapped = set(plan.swapped())
    recomputed = set(plan.recomputed())
    rows = []
    for t in base.live(level):
        # a row is a buffer; a toggle edits the tensor of it that is read farthest away
        tensor = t.swap_tensor or t.tensor
        on = t.tensor in swapped or t.swap_tensor in swapped
        again = t.tensor in recomputed or t.swap_tensor in recomputed
        if split_tensor(tensor)[0] in base.loaded.graph.index:
            refused = _reason(base.recompute_refused(tensor, ahead), tensor)
        else:  # a kernel workspace or a loop's results: no tensor of the graph to name
            refused = t.reason
        rows.append({
            "id": tensor, "tensor": t.tensor,
            "mib": round(t.bytes / figures.MIB, 3),
            "producer_level": t.producer_level, "last_use_level": t.last_use_level,
            "distance": t.distance, "category": t.category,
            "swappable": "yes" if t.swappable else t.reason,
            "recomputable": "yes" if not refused else refused,
            "decision": SWAPPED if on else (RECOMPUTED if again else KEPT),
            "swap": SWAP_ON if on else (SWAP_OFF if t.swappable else SWAP_NO),
            "recompute": RECOMPUTE_ON if again else (RECOMPUTE_OFF if not refused else SWAP_NO),
        })
    return rows


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
        overhead = "plan edited since auto-tune: run it again"
    else:
        overhead = "run auto-tune for a prediction"
    host_limit = host_memory_limit()
    host_peak = after.sim.host_peak_bytes if after else 0
    over_host = host_peak > host_limit
    if budget is None:
        fits, fits_cls = "no budget set", ""
    elif over_host:
        fits, fits_cls = (f"does not fit: host memory over its limit by "
                          f"{format_bytes(host_peak - host_limit)}", "bad")
    elif fits_device(shown, budget, host_bytes=host_limit):
        fits, fits_cls = f"fits ({format_bytes(budget - shown.worst_peak_bytes)} to spare)", "ok"
    else:
        fits, fits_cls = (f"does not fit (over by {format_bytes(shown.worst_peak_bytes - budget)})",
                          "bad")
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
        item("swapped", (f"{len(plan.swaps)} tensors, {format_bytes(after.swap_bytes)}; "
                         f"{n_in} swap-ins ({n_sync} synchronous)" if after and plan.swaps
                         else "nothing"),
             "swapped"),
        item("recomputed", (f"{len(plan.recomputes)} tensors, "
                            f"{len(after.rewrite.clones)} ops cloned"
                            if after and plan.recomputes else "nothing"), "recomputed"),
        item("overhead", overhead, "overhead"),
        item("budget", fits, "fits", fits_cls),
        item("plan", {"none": "empty", "knobs": "from the knobs", "hand": "edited by hand",
                      "tuner": "from auto-tune", "file": "loaded from a file",
                      "saved": "restored from your last session"}.get(
                          str(plan_data.get("source")), "—"), "source"),
    ]
    if skipped:
        items.append(item("skipped", f"{len(skipped)} swaps could not be placed", "skipped",
                          "bad"))
    if sim.unknown_size_tensors:
        items.append(item("unknown sizes", f"{len(sim.unknown_size_tensors)} tensors counted "
                          "as 0 bytes", "unknown"))
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


# --- background job and downloads --------------------------------------------------------


def tuner_module() -> Any | None:
    """``lmscore.tune`` when it is installed, else None."""
    try:
        tune = importlib.import_module("lmscore.tune")
    except ImportError:
        return None
    return tune if callable(getattr(tune, "tune", None)) else None


def run_tune(app: AppContext, graph_ref: dict[str, Any], settings: dict[str, Any],
             progress: Callable[[float, str], None], tuner: Any | None = None) -> dict[str, Any]:
    """Run the auto-tuner for the session's graph, batch, budget and presets.

    Returns
    -------
    dict
        The result (plan JSON, fits, predictions, graph key and batch) or ``{"error": ...}``.
    """
    tuner = tuner if tuner is not None else tuner_module()
    if tuner is None:
        return {"error": "tuner unavailable (lmscore.tune is not installed yet)"}
    try:
        budget = parse_bytes(settings.get("budget") or "")
        loaded = app.resolve(graph_ref)
        batch = int(settings["batch"])
        last = [0.0, -1.0]

        def report(fraction: float, message: str) -> None:
            now = time.monotonic()
            if fraction >= 1 or now - last[0] > 0.25 or fraction - last[1] > 0.05:
                last[0], last[1] = now, fraction
                progress(float(fraction), str(message))

        kwargs: dict[str, Any] = {"device": settings.get("device", "V100"),
                                  "link": settings.get("link", "pcie3"), "progress": report}
        if "workspace" in inspect.signature(tuner.tune).parameters:
            kwargs["workspace"] = settings.get("workspace", "accelerator")
        with app.slots.slot("auto-tune"):
            res = tuner.tune(loaded.graph, batch, budget, **kwargs)
    except LmsError as e:
        return {"error": str(e)}
    return {
        "key": loaded.key, "batch": batch, "plan": res.plan.to_json(), "fits": bool(res.fits),
        "budget_bytes": int(res.budget_bytes), "predicted_peak_bytes":
        int(res.predicted_peak_bytes), "predicted_overhead": float(res.predicted_overhead),
        "swapped_tensors": int(res.swapped_tensors), "swap_bytes": int(res.swap_bytes),
        "message": str(res.message),
    }


def _stem(name: str) -> str:
    stem = pathlib.Path(name).name
    for suffix in (".pbtxt", ".pb", ".zip", ".txt", ".prototxt", ".graphdef"):
        stem = stem.removesuffix(suffix)
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem) or "graph"


def export_bundle(app: AppContext, graph_ref: dict[str, Any], plan_data: dict[str, Any],
                  device: str = "/GPU:0", host: str = "/CPU:0") -> tuple[str, bytes]:
    """The rewritten graph and its plan, zipped.

    The GraphDef is exactly what ``lms rewrite FILE --plan PLAN --out X.pb --device DEVICE
    --host HOST`` writes for the session's plan, and the plan is what ``--plan-out`` writes
    (the applied plan, without swaps the rewrite had to skip).

    Returns
    -------
    filename : str
    data : bytes
        A zip holding ``<graph>.lms.pb`` and ``<graph>.plan.json``.
    """
    from lmscore.export import to_graphdef

    loaded = app.resolve(graph_ref)
    plan = plan_of(app, loaded, plan_data.get("json"))
    with app.slots.slot("export"):
        rw = rewrite(loaded.graph, plan)
        pb = to_graphdef(rw.graph, device=device or "/GPU:0", host=host or "/CPU:0")
    stem = _stem(loaded.name)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in ((f"{stem}.lms.pb", pb), (f"{stem}.plan.json", rw.plan.to_json())):
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return f"{stem}.lms.zip", buf.getvalue()


def plan_download(app: AppContext, graph_ref: dict[str, Any], plan_data: dict[str, Any]
                  ) -> tuple[str, str]:
    """The session's plan as a JSON file (name, text)."""
    loaded = app.resolve(graph_ref)
    plan = plan_of(app, loaded, plan_data.get("json"))
    return f"{_stem(loaded.name)}.plan.json", plan.to_json()


# --- wiring ---------------------------------------------------------------------------

_CONTROLS = ("batch", "budget", "device", "link", "workspace", "knob-threshold", "knob-ahead",
             "knob-groupby", "knob-sync")

_GATE_JS = """
function(contents, filename, cap) {
    var nu = window.dash_clientside.no_update;
    if (!contents) { return [nu, nu]; }
    var comma = contents.indexOf(',');
    var payload = contents.length - comma - 1;
    var pad = contents.endsWith('==') ? 2 : (contents.endsWith('=') ? 1 : 0);
    var size = Math.max(0, Math.floor(payload * 3 / 4) - pad);
    var nonce = Date.now();
    if (size > cap) {
        return [{filename: filename, size: size, refused: true, nonce: nonce}, null];
    }
    return [{filename: filename, size: size, contents: contents, nonce: nonce}, null];
}
"""


def _controls_out(settings: dict[str, Any]) -> list[Any]:
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
        ``graph``, ``settings``, ``plan``, ``view`` store data.
    """
    g, s, p, v = session["graph"], session["settings"], session["plan"] or {}, session["view"]
    v = v or empty_view()
    if trigger == "graph-picker":
        return choose_graph(app, values.get("graph-picker") or "", g, s)
    if trigger == "graph-gate":
        return upload_graph(app, values.get("graph-gate"), s)
    if trigger == "batch":
        return set_batch(s, values.get("batch"))
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
        return load_plan_file(app, g, values.get("plan-gate"))
    if trigger == "hotspots":
        cell = values.get("hotspots") or {}
        tensor = cell.get("row_id")
        if not tensor:
            return Update()
        if cell.get("column_id") == "swap":
            return toggle_swap(app, g, s, p, v, tensor)
        if cell.get("column_id") == "recompute":
            return toggle_recompute(app, g, s, p, v, tensor)
        return select_tensor(v, tensor)
    if trigger == "studio":
        return click_figure(v, values.get("studio"), g)
    if trigger == "edit-trigger":
        if v.get("op") is None:
            return refuse("click an op in the ordering view first: it becomes the trigger")
        return set_trigger(app, g, p, v.get("tensor"), values.get("edit-group"), v.get("op"))
    if trigger == "edit-swap-op":
        op = v.get("op")
        if op is None:
            return refuse("click an op in the ordering view first: its output is swapped")
        try:
            name = app.resolve(g).graph.ops[int(op)].name
        except (LmsError, IndexError, ValueError) as e:
            return refuse(str(e))
        return toggle_swap(app, g, s, p, v, f"{name}:0")
    if trigger == "edit-sync":
        return set_trigger(app, g, p, v.get("tensor"), values.get("edit-group"), None)
    if trigger == "edit-regroup":
        return regroup_swap(app, g, p, v.get("tensor"), values.get("edit-groupby"))
    if trigger == "edit-onegroup":
        return regroup_swap(app, g, p, v.get("tensor"), None)
    if trigger == "tune-cancel":
        return Update(message="auto-tune cancelled; the plan is unchanged")
    if trigger == "st-tune":
        return accept_tune(app, g, s, values.get("st-tune"))
    if trigger in ("st-graph", "st-settings"):
        return restore()
    return Update()


def register(app: dash.Dash, state: AppContext) -> None:
    """Attach every callback of the page to ``app``."""
    inputs = {
        "graph-picker": "value", "graph-gate": "data", "batch": "value", "budget": "value",
        "device": "value", "link": "value", "workspace": "value", "knobs-apply": "n_clicks",
        "plan-reset": "n_clicks",
        "plan-gate": "data", "hotspots": "active_cell", "studio": "clickData",
        "edit-trigger": "n_clicks", "edit-sync": "n_clicks", "edit-regroup": "n_clicks",
        "edit-swap-op": "n_clicks", "tune-cancel": "n_clicks",
        "edit-onegroup": "n_clicks", "st-tune": "data", "st-graph": "data",
        "st-settings": "data",
    }
    fields = {"knob-threshold": "value", "knob-ahead": "value", "knob-groupby": "value",
              "knob-sync": "value", "edit-group": "value", "edit-groupby": "value"}
    stores = ("st-graph", "st-settings", "st-plan", "st-view")

    app.clientside_callback(
        _GATE_JS, Output("graph-gate", "data"), Output("graph-upload", "contents"),
        Input("graph-upload", "contents"), State("graph-upload", "filename"),
        State("st-config", "data"), prevent_initial_call=True,
    )
    app.clientside_callback(
        _GATE_JS, Output("plan-gate", "data"), Output("plan-upload", "contents"),
        Input("plan-upload", "contents"), State("plan-upload", "filename"),
        State("st-config", "data"), prevent_initial_call=True,
    )

    @app.callback(
        *[Output(s, "data") for s in stores],
        Output("message", "children"), Output("message", "className"),
        Output("graph-picker", "options"), Output("graph-picker", "value"),
        *[Output(c, "value") for c in _CONTROLS],
        Output("hotspots", "active_cell"), Output("hotspots", "selected_cells"),
        *[Input(k, prop) for k, prop in inputs.items()],
        *[State(k, prop) for k, prop in fields.items()],
        State("st-plan", "data"), State("st-view", "data"),
        prevent_initial_call=True,
    )
    def _control(*args: Any) -> tuple[Any, ...]:
        names = [*inputs, *fields]
        values = dict(zip(names, args[: len(names)], strict=True))
        plan, view = args[len(names):]
        session = {"graph": values["st-graph"], "settings": values["st-settings"],
                   "plan": plan, "view": view}
        trigger = ctx.triggered_id if isinstance(ctx.triggered_id, str) else None
        try:
            up = control(state, trigger, values, session)
        except Exception as e:  # noqa: BLE001 - a bug must not leave the page without an answer
            return (*[no_update] * 4, internal_error(trigger or "this action", e),
                    "message error", *[no_update] * (4 + len(_CONTROLS)))
        return _outputs(up, session)

    @app.callback(
        Output("studio", "figure"), Output("ordering-note", "children"),
        Output("summary", "children"), Output("hotspots", "data"),
        Output("hotspots", "style_data_conditional"), Output("hotspot-caption", "children"),
        Output("swap-editor", "children"), Output("edit-group", "options"),
        Output("recompute-list", "children"), Output("st-rendered", "data"),
        Output("message", "children", allow_duplicate=True),
        Output("message", "className", allow_duplicate=True),
        *[Input(s, "data") for s in stores],
        State("st-rendered", "data"),
        prevent_initial_call=True,
    )
    def _render(graph: Any, settings: Any, plan: Any, view: Any, rendered: Any
                ) -> tuple[Any, ...]:
        session = {"graph": graph, "settings": settings, "plan": plan, "view": view}
        full = not rendered or any(rendered.get(k) != v for k, v in (
            ("key", graph.get("key")), ("batch", settings.get("batch")),
            ("workspace", settings.get("workspace", "accelerator"))))
        only_view = {t["prop_id"].split(".")[0] for t in ctx.triggered} == {"st-view"}
        try:
            r = render(state, session, full=full, data=not only_view)
        except ServerBusy as e:
            return (*([no_update] * 10), str(e), "message error")
        except LmsError as e:
            return (*([no_update] * 10), f"cannot show this graph: {e}", "message error")
        except Exception as e:  # noqa: BLE001 - a bug must not leave the page without an answer
            return (*([no_update] * 10), internal_error("drawing", e), "message error")
        msg = (r.message, "message error") if r.message else (no_update, no_update)
        return (r.figure, r.note, r.summary, r.rows, r.row_styles, r.caption, r.editor,
                r.groups, r.recomputes, r.rendered, *msg)

    @app.callback(
        Output("download", "data", allow_duplicate=True),
        Output("message", "children", allow_duplicate=True),
        Output("message", "className", allow_duplicate=True),
        Input("export", "n_clicks"), State("st-graph", "data"), State("st-plan", "data"),
        State("export-device", "value"), State("export-host", "value"),
        prevent_initial_call=True,
    )
    def _export(_n: Any, graph: Any, plan: Any, device: Any, host: Any) -> tuple[Any, ...]:
        try:
            name, data = export_bundle(state, graph, plan or {}, device or "/GPU:0",
                                       host or "/CPU:0")
        except LmsError as e:
            return no_update, f"export failed: {e}", "message error"
        except Exception as e:  # noqa: BLE001
            return no_update, internal_error("export", e), "message error"
        return (dcc.send_bytes(data, name), f"exported {name} (rewritten graph and plan)",
                "message ok")

    @app.callback(
        Output("download", "data", allow_duplicate=True),
        Input("plan-save", "n_clicks"), State("st-graph", "data"), State("st-plan", "data"),
        prevent_initial_call=True,
    )
    def _save_plan(_n: Any, graph: Any, plan: Any) -> Any:
        try:
            name, text = plan_download(state, graph, plan or {})
        except Exception as e:  # noqa: BLE001 - nothing to download; the log says why
            if not isinstance(e, LmsError):
                internal_error("plan download", e)
            return no_update
        return {"content": text, "filename": name, "type": "application/json"}

    if getattr(app, "_background_manager", None) is None:
        # without diskcache/multiprocess/psutil the tuner runs inside the request
        @app.callback(
            Output("st-tune", "data"),
            Input("tune-run", "n_clicks"), State("st-graph", "data"),
            State("st-settings", "data"), prevent_initial_call=True,
        )
        def _tune_inline(_n: Any, graph: Any, settings: Any) -> dict[str, Any]:
            try:
                return run_tune(state, graph, settings, lambda f, m: None)
            except Exception as e:  # noqa: BLE001 - a failing tuner must not break the page
                return {"error": f"the tuner failed: {type(e).__name__}: {e}"}

        return

    @app.callback(
        Output("st-tune", "data"),
        Input("tune-run", "n_clicks"), State("st-graph", "data"), State("st-settings", "data"),
        background=True,
        running=[
            (Output("tune-run", "disabled"), True, False),
            (Output("tune-cancel", "disabled"), False, True),
            (Output("tune-progress", "style"), {"visibility": "visible"},
             {"visibility": "hidden"}),
        ],
        progress=[Output("tune-progress", "value"), Output("tune-status", "children")],
        progress_default=[0, ""],
        cancel=[Input("tune-cancel", "n_clicks")],
        interval=400,
        prevent_initial_call=True,
    )
    def _tune(set_progress: Callable[[Any], None], _n: Any, graph: Any, settings: Any
              ) -> dict[str, Any]:
        set_progress((0, "starting…"))
        try:
            return run_tune(state, graph, settings,
                            lambda f, m: set_progress((round(100 * f), m)))
        except Exception as e:  # noqa: BLE001 - a failing tuner must not leave the UI stuck
            return {"error": f"the tuner failed: {type(e).__name__}: {e}"}



def internal_error(action: str, exc: BaseException) -> str:
    """Log an unexpected exception with its traceback; return the one line the page shows.

    Parameters
    ----------
    action : str
        What failed (the component that fired, "drawing", "export").
    exc : BaseException

    Returns
    -------
    str
    """
    _log.error("internal error in %s", action, exc_info=exc)
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return (f"internal error in {action}: {type(exc).__name__}{': ' + first if first else ''}"
            " (the server keeps running; the traceback is in its log)")


def _outputs(up: Update, session: dict[str, Any]) -> tuple[Any, ...]:
    """The control callback's outputs for an update."""
    stores = [
        up.graph if up.graph is not None else no_update,
        up.settings if up.settings is not None else no_update,
        up.plan if up.plan is not None else no_update,
        up.view if up.view is not None else no_update,
    ]
    if up.message is None:
        msg: list[Any] = [no_update, no_update]
    else:
        msg = [up.message, "message error" if up.error else ("message ok" if up.message else
                                                               "message")]
    graph = up.graph or session["graph"]
    settings = up.settings or session["settings"]
    if up.controls:
        options, value = picker(graph)
        controls = [options, value, *_controls_out(settings)]
    else:
        controls = [no_update] * (2 + len(_CONTROLS))
    return (*stores, *msg, *controls, None, [])
