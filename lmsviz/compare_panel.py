"""The compare panel: plans side by side, and the step's memory against its batch size.

The analysis is :mod:`lmscore.compare`'s (:func:`~lmscore.compare.compare_plans`,
:func:`~lmscore.compare.batch_sweep`); this module picks its inputs from the session,
caches its results and hands plain columns to :func:`lmsviz.figures.compare_figure` and
:func:`lmsviz.figures.batch_figure`.

Plans to compare with are kept per tab (``st-compare-plans``, session storage): the plans
the tab saved ("save plan") or loaded ("load plan", or a file loaded for comparison only),
each with the fingerprint of its graph, so the picker lists only the current graph's.
The batch sweep takes seconds on a large graph: it runs as a background job
(:func:`run_sweep`), and its result is kept on disk under the job directory, keyed by the
graph, the settings and the plan, so every process of the server finds it again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

from lmscore.compare import BatchSweep, PlanSummary, batch_sweep, compare_plans
from lmscore.errors import ConfigError, LmsError, PlanError
from lmscore.memory import host_memory_limit
from lmscore.plan import Plan, check_plan, empty_plan, plan_from_json
from lmscore.tune import bound_words
from lmscore.units import format_bytes, parse_bytes

from . import figures
from .files import decode_upload
from .results import base_of, plan_digest, plan_label, plan_of
from .state import AppContext

#: Plans a tab keeps for comparison (the oldest go first).
MAX_KEPT = 12
#: Columns of the comparison table (:func:`lmsviz.figures.comparison_rows`).
COLUMNS = [{"name": n, "id": i} for n, i in (
    ("plan", "plan"), ("device peak", "peak"), ("host peak", "host"),
    ("swapped · bytes", "swapped"), ("recomputed · bytes (clones)", "recomputed"),
    ("predicted overhead", "overhead"), ("predicted step", "step"), ("fits", "fits"))]


def remember(kept: list[dict[str, Any]] | None, fp: str, name: str, plan_json: str
             ) -> tuple[list[dict[str, Any]], str]:
    """Add a plan to the tab's list; the list and the plan's id (its digest).

    A plan already listed keeps its place and first name.

    >>> kept, pid = remember([], "g1", "saved 1", '{"a": 1}')
    >>> kept2, pid2 = remember(kept, "g1", "loaded x.json", '{"a": 1}')
    >>> pid == pid2, [k["name"] for k in kept2]
    (True, ['saved 1'])
    """
    pid = plan_digest(plan_json)
    entries = list(kept or [])
    if not any(e.get("id") == pid and e.get("fp") == fp for e in entries):
        entries.append({"id": pid, "fp": fp, "name": name, "json": plan_json})
    return entries[-MAX_KEPT:], pid


def options(kept: list[dict[str, Any]] | None, fp: str) -> list[dict[str, str]]:
    """The picker's options: the kept plans of graph ``fp``, newest first."""
    return [{"label": e["name"], "value": e["id"]} for e in reversed(kept or [])
            if e.get("fp") == fp]


def next_name(kept: list[dict[str, Any]] | None, what: str, plan: Plan) -> str:
    """A name for a plan the tab keeps: ``"saved 2: 3 swapped"``."""
    n = 1 + sum(1 for e in kept or [] if str(e.get("name", "")).startswith(what))
    return f"{what} {n}: {plan_label(plan)}"


def read_upload(app: AppContext, graph_ref: dict[str, Any], gate: dict[str, Any] | None
                ) -> tuple[str, Plan]:
    """A plan file loaded for comparison only: its name and the plan, checked.

    Raises
    ------
    LmsError
        Not a plan, or a plan of another graph (the message says which).
    """
    name, data = decode_upload(gate, app.upload_cap_bytes)
    if not name.lower().endswith(".json"):
        raise PlanError(f"{name}: not a plan file (a .json written by save plan or lms tune)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PlanError(f"{name}: not a JSON plan (binary data)") from None
    plan = plan_from_json(text, name)
    check_plan(app.resolve(graph_ref).graph, plan)
    return name, plan


def _budget(settings: dict[str, Any]) -> int | None:
    try:
        return parse_bytes(settings.get("budget") or "")
    except ConfigError:
        return None


def summary_of(app: AppContext, graph_ref: dict[str, Any], settings: dict[str, Any],
               name: str, plan_json: str | None) -> PlanSummary:
    """One plan's :class:`~lmscore.compare.PlanSummary` at the session's settings (cached)."""
    loaded = app.resolve(graph_ref)
    batch = int(settings["batch"])
    workspace = settings.get("workspace", "accelerator")
    base = base_of(app, loaded, batch, workspace)
    plan = plan_of(app, loaded, plan_json) if plan_json else empty_plan(loaded.graph)
    device, link, budget = settings.get("device", "V100"), settings.get("link", "pcie3"), \
        _budget(settings)

    def compute() -> PlanSummary:
        (s,) = compare_plans(loaded.graph, {name: plan}, batch, device=device, link=link,
                             workspace=workspace, device_bytes=budget, sizes=base.sizes,
                             before=base.sim)
        return s

    key = ("compare", loaded.key, batch, workspace, device, link, budget, name,
           plan_digest(plan_json))
    return app.compute(key, compute, "comparing plans", len(loaded.graph.ops))


def comparison(app: AppContext, graph_ref: dict[str, Any], settings: dict[str, Any],
               plan_data: dict[str, Any] | None, other: dict[str, Any] | None
               ) -> tuple[list[dict[str, Any]], Any]:
    """The comparison table's rows and the overlaid device curves.

    The unplanned step, the session's plan (when it has one) and ``other`` (a kept plan),
    in that order.
    """
    wanted: list[tuple[str, str | None]] = [("no plan", None)]
    current = (plan_data or {}).get("json")
    if current:
        wanted.append(("current", current))
    if other and other.get("json"):
        wanted.append((str(other.get("name") or "saved"), other["json"]))
    sums = [summary_of(app, graph_ref, settings, n, j) for n, j in wanted]
    fig = figures.compare_figure([(s.name, s.device_curve) for s in sums], _budget(settings))
    return figures.comparison_rows(sums), fig


# --- the batch sweep ------------------------------------------------------------------------


def sweep_key(graph_ref: dict[str, Any], settings: dict[str, Any],
              plan_data: dict[str, Any] | None) -> str:
    """What a sweep depends on, hashed: graph, budget, presets, workspace, plan, host limit.

    The session's batch size is not in it: the sweep covers every batch.
    """
    parts = [graph_ref.get("key"), settings.get("budget"), settings.get("device"),
             settings.get("link"), settings.get("workspace", "accelerator"),
             plan_digest((plan_data or {}).get("json")), host_memory_limit()]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def _cache_path(app: AppContext, key: str) -> Any:
    return app.jobs_dir / "sweeps" / f"{key}.json"


def cached_sweep(app: AppContext, key: str) -> dict[str, Any] | None:
    """A sweep computed before for ``key`` (by any process of this server), or None."""
    try:
        return json.loads(_cache_path(app, key).read_text())
    except (OSError, ValueError):
        return None


def run_sweep(app: AppContext, graph_ref: dict[str, Any], settings: dict[str, Any],
              plan_data: dict[str, Any] | None, progress: Callable[[float, str], None]
              ) -> dict[str, Any]:
    """The batch job: :func:`lmscore.compare.batch_sweep` for the session, cached on disk.

    The tuner is asked about the batch after the largest that fits (device or host
    memory?). Returns ``{"key", "sweep"}`` or ``{"key", "error"}``.
    """
    key = sweep_key(graph_ref, settings, plan_data)
    hit = cached_sweep(app, key)
    if hit is not None:
        return hit
    try:
        budget = parse_bytes(settings.get("budget") or "")
        loaded = app.resolve(graph_ref)
        plan_json = (plan_data or {}).get("json")
        plan = plan_of(app, loaded, plan_json) if plan_json else None
        with app.slots.slot("the batch sweep"):
            sw = batch_sweep(loaded.graph, budget, plan=plan, device=settings.get("device", "V100"),
                             link=settings.get("link", "pcie3"),
                             workspace=settings.get("workspace", "accelerator"),
                             ask_tuner=True, progress=progress)
    except LmsError as e:
        return {"key": key, "error": str(e)}
    out = {"key": key, "sweep": dataclasses.asdict(sw)}
    path = _cache_path(app, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        tmp.replace(path)  # atomic: a reader never sees half a file
    except OSError:
        pass  # no cache: the next request computes it again
    return out


def batch_view(app: AppContext, graph_ref: dict[str, Any], settings: dict[str, Any],
               plan_data: dict[str, Any] | None, result: dict[str, Any] | None
               ) -> tuple[Any, str]:
    """The batch plot for the session, and a line about it.

    The job's ``result`` when it is for the session's graph, settings and plan, else one
    computed before for them; without either, None and what to do.
    """
    key = sweep_key(graph_ref, settings, plan_data)
    if not result or result.get("key") != key:
        result = cached_sweep(app, key)
    if not result:
        return None, ("Peak memory against the batch size, for this graph, budget and plan: "
                      "press the button (it simulates the step at a dozen batch sizes and "
                      "asks the tuner about the next batch that does not fit).")
    if result.get("error"):
        return None, f"no batch plot: {result['error']}"
    sw = BatchSweep(**{k: tuple(v) if isinstance(v, list) else v
                       for k, v in result["sweep"].items()})
    plot = figures.BatchPlot(
        sw.batches, sw.peak_bytes, sw.step_seconds, sw.device_bytes, sw.max_without,
        plan_peak_bytes=sw.plan_peak_bytes, max_with_plan=sw.max_with_plan, bound=sw.bound,
        current=int(settings.get("batch") or 0) or None, plan_host_bytes=sw.plan_host_bytes,
        host_bytes=sw.host_bytes, next_batch=sw.next_batch,
        next_limited_by=sw.next_limited_by)
    lines = [f"largest batch that fits {format_bytes(sw.device_bytes)} without a plan: "
             f"{sw.max_without}"]
    if sw.plan_peak_bytes is not None:
        lines.append(f"with the current plan: {sw.max_with_plan} (of the batches drawn)")
    if sw.bound:
        lines.append(f"no plan fits beyond batch {sw.bound} ({bound_words(sw.bound_op)} "
                     "would fill the device)")
    note = figures.limit_note(plot)
    if note:
        lines.append(note)
    return figures.batch_figure(plot), "; ".join(lines) + "."
