"""Auto-tuning: the plan with the least predicted step-time overhead that fits a budget.

The budget is ``(device memory - persistent memory) x safety``; a plan fits when the
simulated transient peak (device peak minus persistent memory) is within it.

Two strategies search the TFLMS v2 knobs:

- ``tflms``: the original greedy search on memory only: nothing swapped if that fits;
  else the largest threshold that fits (binary search), escalating the sync mode when
  even threshold 1 does not fit; then the largest ``ahead``; then the largest ``groupby``.
- ``knobs``: the same fitting region, searched with a time model; among the plans that
  fit it keeps the one with the least predicted overhead, then drops the smallest swaps
  for as long as the plan still fits (each swap costs transfer time and may stall).

Three plan per tensor (:mod:`lmscore.planners`, a MILP solved by HiGHS): ``swap``,
``recompute``, and ``hybrid``, the default, which may do either for each tensor and keeps
its plan, the ``swap`` plan, the ``recompute`` plan or the ``knobs`` plan, whichever is
predicted faster among those that fit (the one-kind plans are planned only when they may
win: the MILP's plan does not fit, or costs more than the MILP predicted). Where no plan
fits in the executor's order, the per-tensor planners plan again in a memory-aware one
(:mod:`lmscore.schedule`). Where still none fits, ``recompute`` and ``hybrid`` try Chen's
sqrt(n) checkpointing (:mod:`lmscore.checkpoint`), which recomputes whole segments and
holds nothing on the host.

The time model: op time = max(FLOPs / peak FLOP/s, bytes / memory bandwidth) on a device
preset, plus a launch cost; a transfer takes bytes / link bandwidth on one copy queue per
direction; a swap-in starts when its trigger has run and its swap-out is done, and its
first consumer waits for it. Compute runs in the executor order of the simulator.

Candidate plans are scored by a fast evaluator that adjusts the original simulation's
buffers instead of rewriting the graph; the chosen plan is then rewritten and simulated
in full, and a fit is only ever claimed when that full simulation shows it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import math
import os
import pickle
import statistics
import threading
import time
from bisect import bisect_right
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from .errors import ConfigError
from .evaluate import evaluate_plan
from .ir import Graph
from .memory import (
    DEFAULT_SAFETY,
    Simulation,
    fit_margin,
    fits,
    host_memory_limit,
    persistent_over,
    release_hold,
    simulate,
    transient_budget,
)
from .order import order
from .plan import (
    DEFAULT_PREDICATES,
    Plan,
    Swap,
    SwapIn,
    candidates,
    find_trigger,
    fingerprint,
    group_consumers,
)
from .planners import STRATEGIES, WIDE_GAPS, decisions, options, solve
from .presets import DEVICES, LINKS, Device, Link, preset
from .schedule import memory_schedule, scheduled
from .shapes import Sizes, resolve

if TYPE_CHECKING:
    from .profile import Profile


Progress = Callable[[float, str], None]
R = TypeVar("R")
#: Strategies of :func:`tune`, the default first.
STRATEGY_NAMES = ("hybrid", "swap", "recompute", "knobs", "tflms")


@dataclass(frozen=True)
class TuneResult:
    """Result of :func:`tune`.

    Attributes
    ----------
    plan : Plan
        The chosen plan (empty if nothing needs swapping, or if nothing fits).
    fits : bool
        Whether the full simulation of the rewritten graph fits the budget.
    budget_bytes : int
        ``(device memory - persistent) x safety``: what the transient peak must stay under.
    device_memory_bytes, persistent_bytes : int
    baseline_peak_bytes, predicted_peak_bytes : int
        Simulated device peaks (persistent included) before and after.
    predicted_host_peak_bytes : int
    predicted_overhead : float
        Predicted step-time overhead, a fraction of the unswapped step time.
    baseline_step_seconds, predicted_step_seconds : float
    swapped_tensors, swap_bytes : int
    strategy : str
    evaluations : int
        Plans scored.
    message : str
        One line for people: what was found, or why nothing fits.
    min_peak_bytes : int
        Lower bound of any plan's device peak: the largest op's inputs, outputs and
        workspace plus persistent memory.
    bound_op : str
        The op that sets that bound.
    knobs : dict
        The knobs of a TFLMS plan; for a per-tensor plan, the size of the MILP
        (``options``, ``rows``), how many solves it took (``attempts``) and the cost in
        seconds its last solve predicted (``milp_seconds``).
    recomputed_tensors : int
    host_limit_bytes : int
        Host memory the plan's swapped tensors may hold at once.
    limited_by : {"", "device", "host"}
        When nothing fits: ``"host"`` if the best plan found fits the device but holds
        more than ``host_limit_bytes`` on the host, else ``"device"``.
    unknown_size_tensors : tuple of str
        Tensors of the step whose size the simulation could not tell (counted as 0
        bytes): a plan fits only as far as the sizes go.
    """

    plan: Plan
    fits: bool
    budget_bytes: int
    device_memory_bytes: int
    persistent_bytes: int
    baseline_peak_bytes: int
    predicted_peak_bytes: int
    predicted_host_peak_bytes: int
    predicted_overhead: float
    baseline_step_seconds: float
    predicted_step_seconds: float
    swapped_tensors: int
    swap_bytes: int
    strategy: str
    evaluations: int
    message: str
    min_peak_bytes: int
    bound_op: str
    knobs: dict = field(default_factory=dict)
    recomputed_tensors: int = 0
    host_limit_bytes: int = 0
    limited_by: str = ""
    unknown_size_tensors: tuple[str, ...] = ()


# --- Time model --------------------------------------------------------------------------

_CONVS = ("Conv2D", "Conv3D", "DepthwiseConv2dNative")
_MATMULS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")


def op_seconds(graph: Graph, sizes: Sizes, device: Device) -> list[float]:
    """Roofline time of every op on ``device`` (zero for state, feeds and views)."""
    ops = graph.ops
    adj = graph.adjacency
    cats = order(graph).categories
    out: list[float] = []
    for i, op in enumerate(ops):
        if cats[i] in ("persistent", "input") or op.attrs.get("_lms_role"):
            out.append(0.0)
            continue
        outs = [max(b, 0) for b in sizes.nbytes[i]]
        ins = [max(sizes.nbytes[p][port], 0) for p, port in adj.data_in[i]]
        moved = sum(outs) + sum(ins)
        flops = _flops(graph, sizes, i)
        out.append(max(flops / device.flops, moved / device.bandwidth) + device.launch_seconds)
    return out


def _elements(shape: tuple[int, ...] | None) -> int:
    return math.prod(shape) if shape is not None and -1 not in shape else 0


def _flops(graph: Graph, sizes: Sizes, i: int) -> float:
    op = graph.ops[i]
    adj = graph.adjacency
    shapes = [sizes.shapes[p][port] for p, port in adj.data_in[i]]
    out = sizes.shapes[i][0] if op.outputs else None
    n_out = _elements(out)
    if op.type in _MATMULS and len(shapes) >= 2 and shapes[0] and len(shapes[0]) >= 2:
        a = shapes[0]
        k = a[-2] if op.attrs.get("transpose_a", op.attrs.get("adj_x", False)) else a[-1]
        return 2.0 * n_out * k
    if op.type.startswith(("Conv2D", "Conv3D", "DepthwiseConv2dNative")) and len(shapes) >= 2:
        # forward: out x taps; gradients do the same work with their operands swapped
        if "BackpropFilter" in op.type:
            filt, dy = out, shapes[2] if len(shapes) > 2 else None
        elif "BackpropInput" in op.type:
            filt, dy = shapes[1], shapes[2] if len(shapes) > 2 else None
        else:
            filt, dy = shapes[1], out
        if filt and dy and -1 not in filt:
            taps = math.prod(filt[:-1]) if op.type.startswith(_CONVS[:2]) else math.prod(
                filt[:-2]
            )
            return 2.0 * _elements(dy) * taps
    if op.type == "Einsum" and len(shapes) == 2:
        # exact for a plain matrix product (MK, KN -> MN), an estimate otherwise
        return 2.0 * math.sqrt(_elements(shapes[0]) * _elements(shapes[1]) * max(n_out, 1))
    return float(n_out)


def _time_model(graph: Graph, sizes: Sizes, device: Device, link: Link,
                profile: Profile | None) -> tuple[list[float], float]:
    """Per-op seconds and link bandwidth: the presets', or a profile's for this graph."""
    if profile is None:
        return op_seconds(graph, sizes, device), link.bandwidth
    from .profile import profiled_op_seconds

    if profile.fingerprint != fingerprint(graph):
        raise ConfigError(f"profile: made for another graph (fingerprint {profile.fingerprint}"
                          f", this graph's is {fingerprint(graph)}); profile this one")
    return profiled_op_seconds(graph, sizes, profile), profile.link_bandwidth


def plan_seconds(
    graph: Graph,
    plan: Plan,
    batch_size: int,
    *,
    device: str = "V100",
    link: str = "pcie3",
    workspace: str = "accelerator",
    profile: Profile | None = None,
) -> tuple[float, float]:
    """Predicted step time without and with ``plan``, as :func:`tune` scores plans.

    Parameters
    ----------
    graph : Graph
    plan : Plan
        A plan for ``graph`` (checked by the rewrite).
    batch_size : int
    device, link : str
        Presets of the time model, as in :func:`tune`.
    workspace : str
        Kernel workspace model of the simulation.
    profile : Profile, optional
        A profile of ``graph`` replacing the presets' times (see :func:`tune`).

    Returns
    -------
    (float, float)
        Seconds of the unswapped step and of the rewritten one.
    """
    device, link = preset(device, DEVICES, "device"), preset(link, LINKS, "link")
    step = scheduled(graph, plan.schedule) if plan.schedule else graph
    sizes = resolve(step, batch_size)
    base = simulate(step, batch_size, sizes=sizes, workspace=workspace)
    ctx = _context(step, sizes, base, *_time_model(step, sizes, DEVICES[device], LINKS[link],
                                                   profile))
    return sum(ctx.seconds), _seconds(ctx, evaluate_plan(graph, plan, batch_size,
                                                         workspace=workspace).plan)


# --- Fast evaluation of knob settings ------------------------------------------------------


@dataclass
class _Context:
    graph: Graph
    sizes: Sizes
    base: Simulation
    pos: list[int]
    seconds: list[float]
    link: float
    owner: dict  # tensor -> index of its buffer in base.buffers
    alloc: np.ndarray  # bytes allocated at each schedule position (unswapped)
    free: np.ndarray  # bytes freed after each position (unswapped)
    scratch: np.ndarray  # largest workspace at each position
    elapsed: list[float]  # compute time up to and including each position
    swappable: tuple  # lmscore.plan.candidates at threshold 0, exact=False
    readers: list  # per candidate: (tensor, producer level, ((level, name), ...), levels)
    triggers: dict = field(default_factory=dict)  # (tensor, group, ahead) -> trigger
    # what _swaps_for made: (tensor, first far reader, ahead, groupby) -> Swap
    made: dict = field(default_factory=dict)
    # per buffer and its far readers: the last position of a reader that stays
    moved: dict = field(default_factory=dict)
    # per swap object's id: what _evaluate needs of it (_spans)
    spans: dict = field(default_factory=dict)
    plans: dict = field(default_factory=dict)  # (threshold, ahead, groupby) -> swaps
    scores: dict = field(default_factory=dict)  # (swap ids, sync mode) -> _Score
    evaluations: int = 0
    # the step in a memory-aware order: (schedule, its context), made on first need
    rescheduled: tuple | None = None
    # lmscore.planners.options of every kind, made on first need; a strategy filters them
    options: tuple | None = None
    # the same over lmscore.planners.WIDE_GAPS idle stretches per buffer, made on first need
    wide_options: tuple | None = None
    # the options of each idle stretch (lmscore.planners.options' ``made``)
    stretches: dict = field(default_factory=dict)
    # host memory the swapped tensors may hold (lmscore.memory.host_memory_limit)
    host_limit: int | None = None
    safety: float = 1.0


@dataclass(frozen=True)
class _Score:
    transient_peak: int
    seconds: float
    swaps: tuple[Swap, ...]
    swap_bytes: int


def _context(
    graph: Graph, sizes: Sizes, base: Simulation, seconds: list[float], link: float
) -> _Context:
    ordering = order(graph)
    n = len(graph.ops)
    pos = ordering.position
    alloc = np.zeros(n + 1, dtype=np.int64)
    free = np.zeros(n + 1, dtype=np.int64)
    scratch = np.zeros(n + 1, dtype=np.int64)
    owner = {}
    for k, b in enumerate(base.buffers):
        if b.scratch:
            scratch[b.first] = max(scratch[b.first], b.bytes)
        elif not b.host:
            alloc[b.first] += b.bytes
            free[b.last] += b.bytes
            owner[b.tensor] = k
            for v in b.views:
                owner[v] = k
    elapsed = np.cumsum([seconds[i] for i in ordering.schedule]).tolist()
    lv = ordering.levels
    cands = []
    # Tuned plans promise a peak: swap-ins may reorder a sum's inputs (see keeps_tensor)
    swappable = candidates(graph, sizes, 0, DEFAULT_PREDICATES, exact=False)
    for c in swappable:
        if c.tensor not in owner:  # views of variables and constants hold no memory
            continue
        readers = tuple(sorted((lv[graph.index[r]], r) for r in c.far))
        cands.append((c.tensor, c.producer_level, readers, [lvl for lvl, _ in readers]))
    return _Context(graph, sizes, base, pos, seconds, link, owner, alloc, free,
                    scratch, elapsed, swappable, cands)


def _swaps_for(ctx: _Context, threshold: int, ahead: int, groupby: int) -> tuple[Swap, ...]:
    """The plan the knobs give (what :func:`lmscore.plan.plan_from_params` makes)."""
    knobs = (threshold, ahead, groupby)
    if knobs in ctx.plans:  # the searches come back to the same settings
        return ctx.plans[knobs]
    swaps = []
    for tensor, level, readers, levels in ctx.readers:
        # the readers are sorted by level: the far ones are a suffix
        cut = bisect_right(levels, level + threshold)
        if cut == len(readers):
            continue
        key = (tensor, cut, ahead, groupby)
        swap = ctx.made.get(key)
        if swap is None:
            far = [name for _, name in readers[cut:]]
            swap_ins = []
            for g in group_consumers(ctx.graph, far, groupby):
                # the trigger depends on the whole group (siblings of its consumers)
                tk = (tensor, g, ahead)
                if tk not in ctx.triggers:
                    ctx.triggers[tk] = find_trigger(ctx.graph, tensor, g, ahead, 10,
                                                    exact=False)
                swap_ins.append(SwapIn(g, ctx.triggers[tk]))
            swap = ctx.made[key] = Swap(tensor, tuple(swap_ins))
        swaps.append(swap)
    ctx.plans[knobs] = tuple(swaps)
    return ctx.plans[knobs]


def _evaluate(ctx: _Context, swaps: tuple[Swap, ...], sync_mode: int) -> _Score:
    """Transient peak and step time of ``swaps`` without rewriting the graph.

    Moves the end of each swapped buffer to its last remaining reader (or its swap-out),
    adds the swap-in buffers from their trigger to their last consumer, and replays the
    transfers on one copy queue per direction against the compute timeline.
    """
    ctx.evaluations += 1
    by_buffer: dict[int, list[tuple]] = {}
    for s in swaps:
        c = ctx.spans.get(id(s))
        if c is None or c[0] is not s:
            c = ctx.spans[id(s)] = _spans(ctx, s)
        if c[1] is not None:
            by_buffer.setdefault(c[1], []).append(c)
    # ctx.spans holds every swap scored, so an id stands for one swap for good
    key = (tuple(map(id, swaps)), sync_mode)
    if key not in ctx.scores:
        ctx.scores[key] = _score(ctx, by_buffer, sync_mode)
    return ctx.scores[key]


def _score(ctx: _Context, by_buffer: dict[int, list[tuple]], sync_mode: int) -> _Score:
    """:func:`_evaluate`'s score of the swaps of ``by_buffer`` (their :func:`_spans`)."""
    g = ctx.graph
    n = len(g.ops)
    buffers = ctx.base.buffers
    at_pos: list[int] = []  # where swap-in buffers are allocated and freed, and their bytes
    at_free: list[int] = []
    at_bytes: list[int] = []
    events: list[tuple[int, int, int, int, int]] = []  # (pos, kind, id, bytes, other id)
    swap_bytes = 0
    gid = 0
    kept: list[Swap] = []
    free = ctx.free.copy()
    for k, hit in by_buffer.items():
        b = buffers[k]
        far = hit[0][3] if len(hit) == 1 else frozenset().union(*(c[3] for c in hit))
        key = (k, far)
        last_kept = ctx.moved.get(key)
        if last_kept is None:
            moved = _moved_readers(g, b, set(far))
            last_kept = ctx.moved[key] = max(
                (ctx.pos[r] for r in b.readers if g.ops[r].name not in moved), default=-1)
        free[b.last] -= b.bytes
        free[min(max(last_kept, max(c[2] for c in hit) + 1), n - 1)] += b.bytes
        for s, _, made, _, swap_ins in hit:
            kept.append(s)
            swap_bytes += b.bytes
            out_id = gid
            events.append((made, 0, out_id, b.bytes, -1))
            gid += 1
            for first, last, at in swap_ins:
                if at is None:
                    at = made
                at_pos.append(at)
                at_free.append(last)
                at_bytes.append(b.bytes)
                events.append((at, 1, gid, b.bytes, out_id))
                events.append((first, -1, gid, b.bytes, -1))  # waits run before the op
                gid += 1
    alloc = ctx.alloc.copy()
    if at_pos:
        held = np.array(at_bytes, dtype=np.int64)
        np.add.at(alloc, np.array(at_pos), held)
        np.add.at(free, np.array(at_free), held)
    peak = int(_live(ctx, alloc, free).max()) if n else ctx.base.input_bytes
    # time: a shift accumulates every wait on a transfer that is not done yet
    elapsed = ctx.elapsed
    done: dict[int, float] = {}
    shift = d2h = h2d = 0.0
    link = ctx.link
    for p, kind, ev, nbytes, other in sorted(events):
        if kind == -1:
            start = (elapsed[p - 1] if p else 0.0) + shift
            shift += max(0.0, done.get(ev, start) - start)
            continue
        now = elapsed[p] + shift
        if kind == 0:
            d2h = max(d2h, now) + nbytes / link
            done[ev] = d2h
            if sync_mode in (1, 3):
                shift += d2h - now
        else:
            h2d = max(h2d, now, done.get(other, 0.0)) + nbytes / link
            done[ev] = h2d
            if sync_mode in (2, 3):
                shift += h2d - now
    total = (float(elapsed[-1]) if n else 0.0) + shift
    return _Score(peak, total, tuple(kept), swap_bytes)


def _spans(ctx: _Context, s: Swap) -> tuple:
    """What :func:`_evaluate` needs of one swap, on ``ctx``'s schedule.

    ``(s, its buffer's index or None, the producer's position, the far consumers,
    ((first consumer's position, last consumer's, trigger's or None), ...))``: kept per
    swap object (with it, so that its id is not reused) as the searches score the same
    swaps in many plans.
    """
    idx, pos = ctx.graph.index, ctx.pos
    spans = []
    for si in s.swap_ins:
        cons = [pos[idx[c]] for c in si.consumers]
        spans.append((min(cons), max(cons), pos[idx[si.trigger]] if si.trigger else None))
    far = frozenset(c for si in s.swap_ins for c in si.consumers)
    return (s, ctx.owner.get(s.tensor), pos[idx[s.tensor.rpartition(":")[0]]], far,
            tuple(spans))


def _live(ctx: _Context, alloc: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Transient bytes on the device at each schedule position.

    What was allocated so far, minus what was freed before it, plus the position's
    workspace and the feeds.
    """
    n = len(ctx.pos)
    return (np.cumsum(alloc[:n]) - np.concatenate(([0], np.cumsum(free[: n - 1])))
            + ctx.scratch[:n] + ctx.base.input_bytes)


def _moved_readers(g: Graph, b, far: set[str]) -> set[str]:
    """Readers that leave the buffer with the swap.

    They are the far consumers and the readers of views those consumers wrote in place
    (after the rewrite those views live in the swap-in's buffer).
    """
    tensors = (b.tensor, *b.views)
    moved = set(far)
    changed = True
    while changed:
        changed = False
        moved_views = {v for v in tensors if v.rpartition(":")[0] in moved}
        for r in b.readers:
            name = g.ops[r].name
            if name in moved:
                continue
            read = [t for t in g.ops[r].inputs if t in tensors]
            if read and all(t in moved_views for t in read):
                moved.add(name)
                changed = True
    return moved


# --- The search --------------------------------------------------------------------------


def _collector_paused(fn: Callable) -> Callable:
    """``fn`` run with Python's cyclic garbage collector paused (reference counting frees).

    A search allocates millions of small tuples; the survivors trigger collections that
    walk every object alive, the graph's hundreds of thousands among them: 10-14% of a
    ResNet-50 tune. What a search makes is freed by reference counting or, if cyclic, by
    the first collection after it. A caller that paused the collector keeps it paused.
    """
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return run


def tune(
    graph: Graph,
    batch_size: int,
    budget_bytes: int | None = None,
    *,
    device: str = "V100",
    link: str = "pcie3",
    safety: float = DEFAULT_SAFETY,
    strategy: str = "hybrid",
    workspace: str = "accelerator",
    progress: Progress | None = None,
    cancel: Callable[[], bool] | None = None,
    host_memory: int | None = None,
    profile: Profile | None = None,
) -> TuneResult:
    """Find the plan with the least predicted overhead that fits the device memory.

    Parameters
    ----------
    graph : Graph
    batch_size : int
    budget_bytes : int, optional
        Device memory; default: the device preset's.
    device : str
        A key of :data:`DEVICES`.
    link : str
        A key of :data:`LINKS`.
    safety : float
        Fraction of the free device memory that may be used (0 < safety <= 1).
    strategy : {"hybrid", "swap", "recompute", "knobs", "tflms"}
        ``hybrid`` (the default; ``"default"`` is the same) plans per tensor, swap or
        recompute (:mod:`lmscore.planners`), and keeps that plan or the ``knobs`` one,
        whichever is predicted faster among those that fit (when its own does not fit,
        or when the best of them costs more than the MILP predicted by over
        :data:`MODEL_SLACK` of the step, the ``swap`` and ``recompute`` plans are
        candidates too); ``swap`` and ``recompute`` plan per tensor with one kind of
        option only (``swap`` keeps the ``knobs`` plan instead where that is predicted
        faster: its plans are swaps too); ``knobs`` searches TFLMS's knobs with the time
        model; ``tflms`` is TFLMS's own greedy search on memory.
    workspace : str
        Kernel workspace model of the simulator (:data:`lmscore.memory.WORKSPACES`):
        ``"accelerator"`` for a GPU, ``"cpu"`` for the emulated accelerator on this CPU.
    progress : callable, optional
        ``progress(fraction, message)`` during the search.
    cancel : callable, optional
        Returning True stops the search; the best plan so far is returned.
    host_memory : int, optional
        Host memory the swapped tensors may hold at once; default: TensorFlow's pinned
        host allocator limit (:func:`lmscore.memory.host_memory_limit`).
    profile : Profile, optional
        A time model measured on the user's device (:func:`lmscore.profile.profile`) for
        this graph: its op times and copy bandwidth replace ``device``'s and ``link``'s
        (the device preset still gives the default memory).

    Returns
    -------
    TuneResult

    Raises
    ------
    ConfigError
        For an unknown preset or strategy, or a safety outside (0, 1].
    """
    return _tune(graph, batch_size, budget_bytes, device=device, link=link, safety=safety,
                 strategy=strategy, workspace=workspace, progress=progress, cancel=cancel,
                 host_memory=host_memory, profile=profile)


@_collector_paused
def _tune(graph, batch_size, budget_bytes, *, device, link, safety, strategy, workspace,
          progress, cancel, host_memory, profile, first_fit: bool = False) -> TuneResult:
    """:func:`tune`, or with ``first_fit`` the first plan found that fits.

    With ``first_fit``, ``hybrid`` returns the first of its candidates that fits (the swap
    planner's plan first, where it may fit): its ``fits`` is :func:`tune`'s, its plan not
    necessarily the quickest. That is what :func:`max_batch` asks of each batch it tries.
    """
    device, link = preset(device, DEVICES, "device"), preset(link, LINKS, "link")
    if strategy == "default":
        strategy = "hybrid"
    if strategy not in STRATEGY_NAMES:
        raise ConfigError(f"unknown strategy {strategy!r} (choose from "
                          f"{', '.join(STRATEGY_NAMES)})")
    if not 0 < safety <= 1:
        raise ConfigError(f"safety must be in (0, 1], got {safety}")
    dev = DEVICES[device]
    memory = dev.memory_bytes if budget_bytes is None else budget_bytes
    if memory <= 0:
        raise ConfigError(f"budget must be positive, got {memory}")
    host = host_memory_limit() if host_memory is None else host_memory
    if host <= 0:
        raise ConfigError(f"host memory must be positive, got {host}")
    report = progress or (lambda f, m: None)
    stop = cancel or (lambda: False)
    sizes = resolve(graph, batch_size)
    base = simulate(graph, batch_size, sizes=sizes, workspace=workspace)
    persistent = base.persistent_bytes
    budget = transient_budget(memory, persistent, safety)
    ctx = _context(graph, sizes, base, *_time_model(graph, sizes, dev, LINKS[link], profile))
    ctx.host_limit, ctx.safety = host, safety
    base_seconds = sum(ctx.seconds)
    min_peak, bound = _lower_bound(graph, base)

    report(0.0, "simulating the unswapped step")
    empty = Plan(fingerprint(graph), params={"strategy": strategy})
    if budget < 0 or min_peak - persistent > budget:
        return _result(graph, batch_size, empty, False, budget, memory, base, base,
                       base_seconds, base_seconds, strategy, ctx, min_peak, bound, {},
                       workspace, reason="bound")
    if fits(base, memory, safety):
        return _result(graph, batch_size, empty, True, budget, memory, base, base,
                       base_seconds, base_seconds, strategy, ctx, min_peak, bound, {},
                       workspace)
    args = (graph, batch_size, ctx, budget, memory, safety, workspace, min_peak, bound,
            base_seconds, report, stop)
    if strategy not in STRATEGIES:
        return _knob_search(strategy, *args)
    swap = None
    if (strategy == "hybrid" and first_fit
            and base.worst_peak_bytes - persistent - host <= budget):
        # Where swaps alone fit, the swap planner's plan is the quickest to find (a third of
        # hybrid's time, a fifth on MobileNetV3Small over PCIe 3); where the step's peak is
        # over the budget by more than the host can take, swaps alone cannot fit in this
        # order, and hybrid's own plan is tried first (the DenseNet near its largest batch).
        swap = _per_tensor("swap", *args)
        if swap.fits:
            return swap
    if strategy == "recompute" or first_fit:
        per, choice = _per_tensor(strategy, *args), None
    else:
        # the knobs' plans are asked for below whatever the MILP answers: their search
        # runs while HiGHS solves it
        with _knobs_beside(ctx, budget, stop) as choice:
            per = _per_tensor(strategy, *args)
    if strategy == "recompute" and not per.fits:
        return _checkpointed(*args) or per
    if strategy == "recompute" or (first_fit and per.fits):
        return per
    # The knobs' plans are not among the MILP's options: they are always candidates, of
    # swap as of hybrid (they are swaps only). The MILP costs each swap as if it had the
    # link alone: over PCIe 3 its swaps of ResNet-50 at batch 128 (60% budget) moved less
    # than the knobs' and cost 84.6% where the knobs' cost 70.8%, BERT's 69.3% to 46.4%.
    knob = _knob_search("knobs", *args, beat=per.predicted_step_seconds if per.fits else None,
                        choice=choice)
    if first_fit and knob is not None and knob.fits:
        return replace(knob, strategy=strategy, evaluations=ctx.evaluations)
    best = _best((per,) if knob is None else (per, knob))
    if strategy == "swap":
        return replace(best, strategy="swap", evaluations=ctx.evaluations)
    # The MILP's model errs (the clones' intermediate buffers; the link's queue, since it
    # costs each swap as if it had the link alone). Swaps alone and recomputations alone
    # are candidates too when its plan does not fit, or when the best plan in hand costs
    # more than the MILP's optimum predicted: their MILPs, over fewer options, predict no
    # less, but may be the ones whose predictions hold. All share one context.
    if not per.fits or _costs_more_than_solved(best, per, base_seconds):
        # a plan that fits beats every plan that does not (_best): with one in hand, what
        # stops a candidate from fitting is not worth finding out (diagnose)
        diagnose = not best.fits
        best = _best((best, swap or _per_tensor("swap", *args, diagnose=diagnose),
                      _per_tensor("recompute", *args, diagnose=diagnose)))
    if not best.fits:
        best = _checkpointed(*args) or best
    return replace(best, strategy="hybrid", evaluations=ctx.evaluations)


@contextlib.contextmanager
def _knobs_beside(ctx: _Context, budget: int, stop: Callable[[], bool]):
    """:func:`_knob_choice` of ``knobs`` on a thread of its own, while the caller plans.

    Yields its future, answered when the block is left. The search is Python and HiGHS
    releases the GIL while it solves, so the two overlap: on the 28,608-op DenseNet near
    its largest batch over PCIe 3, a 0.9 s search beside a 2.9 s MILP. The search shares
    ``ctx``'s caches (each entry is computed the same by either thread) but counts its
    evaluations apart, added to ``ctx``'s at the end; it reports no progress (the caller's
    bar follows the MILP). Leaving the block by an exception stops the search.
    """
    side = replace(ctx, evaluations=0)
    left = threading.Event()
    with ThreadPoolExecutor(1, thread_name_prefix="lms-knobs") as pool:
        future = pool.submit(_knob_choice, "knobs", side, budget, lambda f, m: None,
                             lambda: left.is_set() or stop())
        try:
            yield future
        except BaseException:
            left.set()
            raise
        finally:
            future.exception()  # waits for it, whatever happened
            ctx.evaluations += side.evaluations


def _checkpointed(graph, batch, ctx, budget, memory, safety, workspace, min_peak, bound,
                  base_seconds, report, stop) -> TuneResult | None:
    """Chen's sqrt(n) checkpointing (:func:`lmscore.checkpoint.chen_plan`), if it fits.

    A candidate where no per-tensor plan fits: its segments recompute whole stretches of
    the forward pass, where a per-tensor recomputation clones at most
    :data:`lmscore.planners.MAX_CHAIN` ops, and it moves nothing to the host, which stops
    the swaps first on a large device (the 28,608-op DenseNet on an A100: 1,906 against
    1,587 for the per-tensor plans, whose swaps fill TensorFlow's 128 GiB host limit).
    """
    from .checkpoint import checkpointing

    if stop():
        return None
    report(0.9, "sqrt(n) checkpointing")
    # chen_plan's, from the simulation in hand (its activations are the same buffers)
    plan = checkpointing(graph, batch, sizes=ctx.sizes, base=ctx.base).plan
    if plan.changes_nothing():
        return None
    # pinned, as every plan tune makes: unpinned, TensorFlow runs the clones in an order of
    # its own (MobileNetV2 under Eigen's kernels measured 61.5 MB of a 43.1 MB device)
    plan = replace(plan, pin_schedule=True)
    ev = evaluate_plan(graph, plan, batch, workspace=workspace, before=ctx.base,
                       sizes=ctx.sizes)
    ctx.evaluations += 1
    if not ev.fits(memory, safety, ctx.host_limit):
        return None
    return _result(graph, batch, ev.plan, True, budget, memory, ctx.base, ev.after,
                   base_seconds, _seconds(ctx, ev.plan), "recompute", ctx, min_peak, bound,
                   {"baseline": "sqrt(n)"}, workspace)


def _best(results: tuple[TuneResult, ...]) -> TuneResult:
    """The quickest of the plans that fit, else the one with the smallest peak."""
    return min(results, key=lambda r: (not r.fits, r.predicted_step_seconds
                                       if r.fits else r.predicted_peak_bytes))


#: Step time a per-tensor plan may cost beyond its MILP's prediction before the plans of one
#: kind of option are tried too (a fraction of the unplanned step's time).
MODEL_SLACK = 0.01


def _costs_more_than_solved(best: TuneResult, per: TuneResult, base_seconds: float) -> bool:
    """Whether ``best`` costs more than the per-tensor MILP's optimum ``per`` predicted.

    By more than :data:`MODEL_SLACK` of the step: below that, another plan could gain the
    user nothing worth another solve.
    """
    solved = per.knobs.get("milp_seconds")
    if solved is None:
        return False
    extra = best.predicted_step_seconds - base_seconds
    return extra - solved > MODEL_SLACK * base_seconds


def _knob_search(strategy, graph, batch_size, ctx, budget, memory, safety, workspace,
                 min_peak, bound, base_seconds, report, stop,
                 beat: float | None = None, choice: Future | None = None) -> TuneResult | None:
    """The TFLMS knob searches: ``tflms`` on memory alone, ``knobs`` with the time model.

    With ``beat`` (the step seconds of a plan that fits, already in hand), a ``knobs``
    plan whose time-model estimate is not below it is not verified: None. ``choice``:
    :func:`_knob_choice`'s answer, computed beside a MILP (:func:`_knobs_beside`).
    """
    chosen = (_knob_choice(strategy, ctx, budget, report, stop) if choice is None
              else choice.result())
    if chosen is None:
        empty = Plan(fingerprint(graph), params={"strategy": strategy})
        return _result(graph, batch_size, empty, False, budget, memory, ctx.base, ctx.base,
                       base_seconds, base_seconds, strategy, ctx, min_peak, bound, {},
                       workspace, reason="search")
    knobs, swaps = chosen
    # The full simulation is the costly part (about a third of a ResNet-50 tune). A
    # verified plan is timed by this same model, on these swaps or, when they do not fit
    # in full, on smaller groups, later swap-ins or more swaps.
    if (strategy == "knobs" and beat is not None
            and _evaluate(ctx, swaps, knobs["sync_mode"]).seconds >= beat):
        return None
    report(0.9, "verifying the plan with the full simulation")
    return _verify(graph, batch_size, swaps, knobs, budget, memory, ctx.base, base_seconds,
                   strategy, ctx, min_peak, bound, workspace, safety)


def _knob_choice(strategy: str, ctx: _Context, budget: int, report, stop,
                 ) -> tuple[dict, tuple[Swap, ...]] | None:
    """The knobs and swaps of a TFLMS search, by the fast evaluator (None: no threshold fits).

    ``tflms`` takes TFLMS v2's search on memory alone; ``knobs`` then scores a grid of
    settings with the time model and drops the swaps the fit does not need.
    """
    base = ctx.base

    def fits_fast(score: _Score) -> bool:
        # the fast evaluator's estimate, with the race of the unswapped step's loops; the
        # full simulation of the plan decides (_verify)
        return score.transient_peak + base.race_bytes <= budget

    max_dist = max((b.end - b.start for b in base.buffers), default=1)
    best: tuple[float, int, dict, tuple[Swap, ...]] | None = None
    # Largest threshold that fits, escalating the sync mode (TFLMS v2).
    for sync in range(4):
        lo, hi, found = 1, max(max_dist, 1), None
        while lo <= hi and not stop():
            mid = (lo + hi) // 2
            sc = _evaluate(ctx, _swaps_for(ctx, mid, 1, 5), sync)
            if fits_fast(sc):
                found, lo = mid, mid + 1
            else:
                hi = mid - 1
            report(0.3 * (sync + (1 - (hi - lo) / max(max_dist, 1))) / 4,
                   f"threshold search, sync mode {sync}")
        if found is not None:
            break
    if found is None:
        return None
    knobs = {"threshold": found, "ahead": 1, "groupby": 5, "sync_mode": sync}
    knobs = _tflms_refine(ctx, knobs, fits_fast, report, stop)
    swaps = _swaps_for(ctx, knobs["threshold"], knobs["ahead"], knobs["groupby"])
    if strategy == "knobs":
        # Start from the TFLMS choice, so the time model can only improve on it.
        seed = _evaluate(ctx, swaps, knobs["sync_mode"])
        best = _grid(ctx, knobs, fits_fast, report, stop,
                     (seed.seconds, seed.swap_bytes, knobs, seed.swaps))
        knobs, swaps = best[2], best[3]
        swaps = _prune(ctx, swaps, knobs["sync_mode"], fits_fast, report, stop)
    return knobs, swaps


def _tflms_refine(ctx: _Context, knobs: dict, fits_fast, report, stop) -> dict:
    """TFLMS v2: then the largest ahead, then the largest groupby that still fit."""
    t, sync = knobs["threshold"], knobs["sync_mode"]
    ahead = _largest(lambda a: fits_fast(_evaluate(ctx, _swaps_for(ctx, t, a, 5), sync)), 1, t,
                     stop)
    report(0.6, "largest ahead")
    groupby = _largest(
        lambda gb: fits_fast(_evaluate(ctx, _swaps_for(ctx, t, ahead, gb), sync)), 5, 2 * t, stop
    )
    report(0.8, "largest groupby")
    return {"threshold": t, "ahead": ahead, "groupby": groupby, "sync_mode": sync}


def _largest(ok: Callable[[int], bool], lo: int, hi: int, stop) -> int:
    best = lo
    while lo <= hi and not stop():
        mid = (lo + hi) // 2
        if ok(mid):
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _grid(ctx: _Context, knobs: dict, fits_fast, report, stop, best):
    """Score thresholds up to the largest fitting one against ahead and groupby."""
    top, sync = knobs["threshold"], knobs["sync_mode"]
    thresholds = sorted({top, max(1, top * 3 // 4), max(1, top // 2)}, reverse=True)
    aheads = sorted({4, 16, 64, knobs["ahead"], max(1, knobs["ahead"] * 2)})
    groupbys = sorted({5, 50, knobs["groupby"]})
    total = len(thresholds) * len(aheads) * len(groupbys)
    k = 0
    for t in thresholds:
        for a in aheads:
            for gb in groupbys:
                if stop():
                    return best
                k += 1
                sc = _evaluate(ctx, _swaps_for(ctx, t, a, gb), sync)
                if fits_fast(sc):
                    key = (sc.seconds, sc.swap_bytes,
                           {"threshold": t, "ahead": a, "groupby": gb, "sync_mode": sync},
                           sc.swaps)
                    if key[:2] < best[:2]:
                        best = key
                report(0.3 + 0.4 * k / total, "scoring knob settings with the time model")
    return best


def _prune(ctx: _Context, swaps: tuple[Swap, ...], sync: int, fits_fast, report, stop):
    """Drop the smallest swaps for as long as the plan still fits (binary search)."""
    by_size = {b.tensor: b.bytes for b in ctx.base.buffers}
    ordered = sorted(swaps, key=lambda s: by_size.get(s.tensor, 0))
    keep_from = _largest(
        lambda k: fits_fast(_evaluate(ctx, tuple(ordered[k:]), sync)), 0, len(ordered), stop
    )
    report(0.85, f"dropped {keep_from} swaps that the fit does not need")
    kept = ordered[keep_from:]
    rank = {s.tensor: j for j, s in enumerate(swaps)}
    return tuple(sorted(kept, key=lambda s: rank[s.tensor]))


def _verify(graph, batch, swaps, knobs, budget, memory, base, base_seconds, strategy, ctx,
            min_peak, bound, workspace, safety) -> TuneResult:
    """Rewrite and simulate in full; if the full simulation does not fit, swap more."""
    # Pinned: a tuned plan promises a peak, and only the simulated order keeps it.
    plan = Plan(fingerprint(graph), tuple(swaps), knobs["sync_mode"], (),
                {"strategy": strategy, "batch_size": batch, **knobs}, pin_schedule=True)
    best_sim = None
    for _attempt in range(16):
        ev = evaluate_plan(graph, plan, batch, workspace=workspace, before=base)
        rw, sim = ev.rewrite, ev.after
        if ev.fits(memory, safety, ctx.host_limit):
            seconds = _evaluate(ctx, rw.plan.swaps, plan.sync_mode).seconds
            return _result(graph, batch, rw.plan, True, budget, memory, base, sim,
                           base_seconds, seconds, strategy, ctx, min_peak, bound, knobs,
                           workspace)
        if best_sim is None or sim.peak_bytes < best_sim[0].peak_bytes:
            best_sim = (sim, rw, knobs)
        if ev.fits(memory, safety):
            break  # the host is over its limit, and the knobs only ever swap more
        # The fast evaluator was optimistic: smaller groups, later swap-ins, more swaps,
        # then synchronous copies, until the full simulation fits.
        if knobs["groupby"] > 5:
            knobs = {**knobs, "groupby": max(5, knobs["groupby"] // 4)}
        elif knobs["ahead"] > 1:
            knobs = {**knobs, "ahead": max(1, knobs["ahead"] // 2)}
        elif knobs["threshold"] > 1:
            knobs = {**knobs, "threshold": max(1, knobs["threshold"] * 2 // 3)}
        elif knobs["sync_mode"] < 3:
            knobs = {**knobs, "sync_mode": knobs["sync_mode"] + 1}
        else:
            break
        plan = replace(plan, sync_mode=knobs["sync_mode"], swaps=_swaps_for(
            ctx, knobs["threshold"], knobs["ahead"], knobs["groupby"]))
    sim, rw, knobs = best_sim
    return _result(graph, batch, rw.plan, False, budget, memory, base, sim, base_seconds,
                   _evaluate(ctx, rw.plan.swaps, rw.plan.sync_mode).seconds, strategy, ctx,
                   min_peak, bound, knobs, workspace, reason="verify")


def _per_tensor(strategy, graph, batch, ctx, budget, memory, safety, workspace, min_peak,
                bound, base_seconds, report, stop, diagnose: bool = True) -> TuneResult:
    """Plan per tensor (:mod:`lmscore.planners`), then check with the full simulation.

    While the rewritten step does not fit, the MILP is solved again for a budget lowered
    by the overshoot: the MILP does not see the clones' intermediate buffers, the link's
    queue or where triggers land in the rewritten schedule. Without ``diagnose`` (a plan
    that fits is in hand), a MILP that host memory makes infeasible ends the search
    there, without planning for the device alone to say what stops it (the plan that
    result would carry does not fit), and the memory-aware order is not made for it.
    """
    base = ctx.base
    best, knobs = _solve_and_check(strategy, graph, batch, ctx, (), budget, memory, safety,
                                   workspace, report, stop, base, diagnose)
    if (best is None or not best[2]) and (diagnose or ctx.rescheduled is not None):
        # The executor's order runs parallel branches op by op in alternation, and what
        # is on the device there cannot all be freed: plan again in a memory-aware order
        # (made for a fallback only, not for a candidate beside a plan that fits: a
        # DenseNet's swap-only candidate near its largest batch, 1.1 s to find nothing)
        if ctx.rescheduled is None:
            report(0.5, "a memory-aware order of the step")
            names = memory_schedule(graph, base, ctx.sizes)
            step = scheduled(graph, names)
            sim = simulate(step, batch, sizes=ctx.sizes, workspace=workspace)
            ctx.rescheduled = (names, _context(step, ctx.sizes, sim, ctx.seconds, ctx.link))
            ctx.rescheduled[1].host_limit = ctx.host_limit
        names, other = ctx.rescheduled
        again, knobs2 = _solve_and_check(strategy, graph, batch, other, names, budget,
                                         memory, safety, workspace, report, stop, base,
                                         diagnose)
        ctx.evaluations += other.evaluations
        other.evaluations = 0
        if again is not None and (best is None or again[2] or again[0].after.worst_peak_bytes
                                  < best[0].after.worst_peak_bytes):
            best, knobs = again, {**knobs2, "schedule": "memory-aware"}
    if best is None:
        empty = Plan(fingerprint(graph), params={"strategy": strategy})
        return _result(graph, batch, empty, False, budget, memory, base, base, base_seconds,
                       base_seconds, strategy, ctx, min_peak, bound, knobs, workspace,
                       reason="milp")
    ev, seconds, fit = best
    return _result(graph, batch, ev.plan, fit, budget, memory, base, ev.after, base_seconds,
                   seconds, strategy, ctx, min_peak, bound, knobs, workspace,
                   reason="" if fit else "verify")


def _solve_and_check(strategy, graph, batch, ctx, schedule, budget, memory, safety, workspace,
                     report, stop, before, diagnose: bool = True):
    """Solve the MILP on ``ctx``'s order and evaluate its plan in full, up to 8 times.

    Returns ``((evaluation, seconds, fits), knobs)``: the first plan that fits, else the
    one with the smallest peak (None if the MILP found none). ``diagnose``: see
    :func:`_per_tensor`.
    """
    report(0.1, "options per tensor")
    step = ctx.graph  # the original, or the original in ``schedule``'s order
    hold = release_hold(workspace)
    if ctx.options is None:  # the options of one kind do not depend on the other's
        ctx.options = options(step, ctx.sizes, ctx.base, ctx.seconds, ctx.link,
                              swappable=ctx.swappable, made=ctx.stretches, hold=hold)
    opts = [o for o in ctx.options if o.kind in STRATEGIES[strategy]]
    live = _live(ctx, ctx.alloc, ctx.free)
    target = budget - ctx.base.race_bytes
    best = None
    knobs: dict = {"options": len(opts)}
    widened = False
    for attempt in range(8):
        if stop():
            break
        report(0.2 + 0.1 * attempt, f"solving the MILP ({len(opts)} options)")
        sol = solve(opts, live, target, host_limit=ctx.host_limit)
        ctx.evaluations += 1
        if not sol.feasible and not widened:
            # options over more idle stretches of each buffer: a larger MILP, asked for
            # only where the smaller has no answer
            widened = True
            if ctx.wide_options is None:
                ctx.wide_options = options(step, ctx.sizes, ctx.base, ctx.seconds,
                                           ctx.link, max_gaps=WIDE_GAPS,
                                           swappable=ctx.swappable, made=ctx.stretches,
                                           hold=hold)
            opts = [o for o in ctx.wide_options if o.kind in STRATEGIES[strategy]]
            sol = solve(opts, live, target, host_limit=ctx.host_limit)
            ctx.evaluations += 1
        host_bound = False
        if not sol.feasible and best is None and sol.host_rows and diagnose:
            # would the device alone take a plan? Then the host is what stops it (without
            # host rows the MILP was the device's alone already)
            sol, host_bound = solve(opts, live, target), True
        if not sol.feasible:
            break
        swaps, recomputes = decisions(sol.chosen)
        plan = Plan(fingerprint(graph), swaps, 0, (),
                    {"strategy": strategy, "batch_size": batch}, pin_schedule=True,
                    recomputes=recomputes, schedule=tuple(schedule))
        ev = evaluate_plan(graph, plan, batch, workspace=workspace, before=before,
                           sizes=ctx.sizes)
        seconds = _seconds(ctx, ev.plan)
        knobs = {"options": len(opts), "rows": sol.rows, "attempts": attempt + 1,
                 "milp_seconds": round(float(sol.seconds), 6)}
        if ev.fits(memory, safety, ctx.host_limit):
            return (ev, seconds, True), knobs
        if best is None or ev.after.worst_peak_bytes < best[0].after.worst_peak_bytes:
            best = (ev, seconds, False)
        if host_bound:
            break
        over = ev.after.worst_peak_bytes - ctx.base.persistent_bytes - budget
        target -= max(over, budget // 100, 1)
    return best, knobs


def _seconds(ctx: _Context, plan: Plan) -> float:
    """Predicted step time of ``plan``: its copies on the link, plus its clones' compute."""
    idx = ctx.graph.index
    clones = sum(ctx.seconds[idx[o]] for r in plan.recomputes for o in r.ops)
    return _evaluate(ctx, plan.swaps, plan.sync_mode).seconds + clones


def _lower_bound(graph: Graph, base: Simulation) -> tuple[int, str]:
    """No plan goes below the largest op's inputs + outputs + workspace (+ persistent).

    Counted on the simulation's buffers, each once: an output that is a view of an input
    or computed in place (``IdentityN``, ``ReadVariableOp``, an element-wise kernel reusing
    its input) holds no memory of its own, and variables, constants and feeds are in the
    persistent and input memory already. Counted per tensor instead, the bound exceeded
    the unplanned step's own peak (the MLP's optimizer ``IdentityN``: 16.1 MB against a
    13.4 MB peak), and ``tune`` refused budgets the step fits.
    """
    need = [0] * len(graph.ops)
    for b in base.buffers:
        if b.host or b.ahead:
            # (a loop's run-ahead: how far ahead its early part gets is the schedule's,
            # which a plan changes; counted, the bound was over a knob plan's own peak)
            continue
        for i in {b.producer, *b.readers}:
            need[i] += b.bytes
    best, name = 0, ""
    for i, op in enumerate(graph.ops):
        if not op.attrs.get("_lms_role") and need[i] > best:
            best, name = need[i], op.name
    # the unplanned step is a plan too (a loop's workspace can hold its inputs again)
    return min(best + base.persistent_bytes + base.input_bytes, base.worst_peak_bytes), name


def bound_words(op: str) -> str:
    """What stops every plan at the one-op bound, in words.

    >>> bound_words("conv")
    "op 'conv' alone"
    >>> bound_words("")
    "the step's inputs and persistent memory alone"
    """
    return f"op {op!r} alone" if op else "the step's inputs and persistent memory alone"


#: Why no plan was made, by the search that found none.
_NO_PLAN = {
    "milp": ("does not fit: even every {options} considered at once leaves some "
             "op over the budget ({budget} + {persistent} persistent), in the executor's "
             "order and in a memory-aware one"),
    "search": ("does not fit: no threshold of the TFLMS search, in any sync mode, fits the "
               "budget ({budget} + {persistent} persistent)"),
}


def _bound_note(min_peak: int, bound: str, usable: int) -> str:
    """What the one-op bound says of a refusal: that op stops every plan, or it does not.

    >>> _bound_note(5 << 20, "conv", 4 << 20)
    "; no plan gets below 5.00 MiB (op 'conv')"
    >>> _bound_note(3 << 20, "conv", 4 << 20)[:62]
    '; no single op stops it (the largest, conv, needs 3.00 MiB wit'
    """
    from .units import format_bytes

    if min_peak > usable:
        return f"; no plan gets below {format_bytes(min_peak)} (op {bound!r})"
    return (f"; no single op stops it (the largest, {bound}, needs {format_bytes(min_peak)} "
            "with persistent memory): the tensors alive together around some op cannot all "
            "be freed there")


def _result(graph, batch, plan, fitted, budget, memory, base, sim, base_seconds, seconds,
            strategy, ctx, min_peak, bound, knobs, workspace, reason: str = "") -> TuneResult:
    from .units import format_bytes

    swap_bytes = sum(b.bytes for b in sim.buffers if b.host)
    overhead = max(0.0, seconds / base_seconds - 1) if base_seconds else 0.0
    host = ctx.host_limit if ctx.host_limit is not None else host_memory_limit()
    limited_by = ""
    if not fitted:
        # the best plan fits the device: what it holds on the host is what stops it
        device_ok = reason != "bound" and fits(sim, memory, ctx.safety)
        limited_by = "host" if device_ok else "device"
    if fitted and plan.changes_nothing():
        need = format_bytes(base.worst_peak_bytes - base.persistent_bytes)
        race = (f", plus {format_bytes(base.race_bytes)} that racing loops or swaps may "
                "hold" if base.race_bytes else "")
        # (both above the persistent memory: "needs 191 MiB of 752 MiB" read as half the
        # step's own 380 MiB peak)
        message = (f"fits without swapping: the step needs {need} above its "
                   f"{format_bytes(base.persistent_bytes)} persistent memory, of the "
                   f"{format_bytes(budget)} left for it (device peak "
                   f"{format_bytes(base.peak_bytes)}{race})")
    elif fitted:
        rec = f" and {len(plan.recomputes)} recomputed" if plan.recomputes else ""
        what = f"{len(plan.swaps)} swapped tensors ({format_bytes(swap_bytes)}){rec}"
        if not plan.swaps and plan.recomputes:
            what = f"{len(plan.recomputes)} recomputed tensors"
        if (knobs or {}).get("baseline"):
            what += f" ({knobs['baseline']} checkpointing)"
        how = " in a memory-aware order" if plan.schedule else ""
        message = (f"fits with {what}{how}: peak "
                   f"{format_bytes(base.peak_bytes)} -> "
                   f"{format_bytes(sim.peak_bytes)}, host {format_bytes(sim.host_peak_bytes)}"
                   f" of {format_bytes(host)}, predicted overhead {overhead:.1%}")
    elif reason == "bound" and base.persistent_bytes >= memory:
        message = f"does not fit: {persistent_over(base.persistent_bytes, memory)}"
    elif reason == "bound":
        usable = format_bytes(budget + base.persistent_bytes)
        message = (f"does not fit: op {bound!r} alone needs {format_bytes(min_peak)} with "
                   f"persistent memory, over the usable {usable} of the "
                   f"{format_bytes(memory)} device")
    elif limited_by == "host":
        message = (f"does not fit: host memory stops it: the best plan fits the device (peak "
                   f"{format_bytes(sim.peak_bytes)}) but holds "
                   f"{format_bytes(sim.host_peak_bytes)} on the host, over the host memory "
                   f"limit of {format_bytes(host)}")
    elif reason in _NO_PLAN:
        # no plan was made: the unplanned step's peak is no "smallest peak found"
        # the options of this strategy only: with recomputations alone, the bound of one
        # op (which any plan of any strategy meets) can lie well under the budget
        options = {"swap": "swap", "recompute": "recomputation"}.get(
            strategy, "swap and recomputation")
        message = _NO_PLAN[reason].format(
            options=options, budget=format_bytes(budget),
            persistent=format_bytes(base.persistent_bytes),
        ) + _bound_note(min_peak, bound, budget + base.persistent_bytes)
        if strategy in ("swap", "recompute"):
            message += "; the hybrid strategy (the default) takes both kinds of option"
    else:
        race = (f", {format_bytes(sim.worst_peak_bytes)} when a loop runs ahead or a "
                "swapped tensor outlives its copy" if sim.race_bytes else "")
        message = (f"does not fit: the smallest peak found is {format_bytes(sim.peak_bytes)}"
                   f"{race} (budget {format_bytes(budget)} + "
                   f"{format_bytes(base.persistent_bytes)} persistent)"
                   + _bound_note(min_peak, bound, budget + base.persistent_bytes))
    del graph
    # what the plan was made for: lms validate --plan measures the step against it
    plan = replace(plan, params={**plan.params, "device_bytes": int(memory),
                                 "workspace": workspace})
    return TuneResult(
        plan=plan, fits=fitted, budget_bytes=budget, device_memory_bytes=memory,
        persistent_bytes=base.persistent_bytes, baseline_peak_bytes=base.peak_bytes,
        predicted_peak_bytes=sim.peak_bytes, predicted_host_peak_bytes=sim.host_peak_bytes,
        predicted_overhead=overhead, baseline_step_seconds=base_seconds,
        predicted_step_seconds=seconds, swapped_tensors=len(plan.swaps), swap_bytes=swap_bytes,
        strategy=strategy, evaluations=ctx.evaluations, message=message,
        min_peak_bytes=min_peak, bound_op=bound, knobs=knobs,
        recomputed_tensors=len(plan.recomputes), host_limit_bytes=host, limited_by=limited_by,
        unknown_size_tensors=base.unknown_size_tensors,
    )


def max_batch(
    graph: Graph,
    budget_bytes: int | None = None,
    *,
    rewrite_plans: bool = True,
    limit: int = 1 << 16,
    tuned: dict[int, TuneResult] | None = None,
    bound: int | None = None,
    workers: int = 1,
    **tune_kwargs,
) -> tuple[int, int]:
    """Largest batch that fits without rewriting, and with the tuned rewrite.

    Fitting is monotone in the batch size. Without rewriting, a batch fits when its
    simulated step does (:func:`lmscore.memory.fits`, what :func:`tune` checks before it
    plans anything), found where its margin (:func:`lmscore.memory.fit_margin`) crosses
    zero (:func:`_largest_by_margin`); with the rewrite, by doubling then bisection
    (:func:`_largest_batch`). Returns ``(without, with)``; 0 when
    not even batch 1 fits. Each batch tried with the rewrite is tuned until a plan fits
    (``hybrid`` stops at the swap planner's plan or its own, where one fits, and weighs
    neither against the knobs' plan), so ``with`` is where :func:`tune` stops fitting.
    ``tuned``, when given, gets the result at every batch tried with the rewrite (the
    first plan found where one fits; :func:`tune`'s where none does, and the one after the
    largest says what stops it: :attr:`TuneResult.limited_by`). ``bound``, when given, is
    :func:`bound_batch`'s: no plan fits a larger batch, so none is tried, and the bound is
    tried first (where the plans reach it, that one try is the whole search). ``workers``
    batches are tried at once, each in a process of its own (on Linux and macOS, where
    processes fork): a machine with that many idle cores finds the same batches sooner.
    """
    # tune's own defaults, for what is not given
    opts = {k: p.default for k, p in inspect.signature(tune).parameters.items()
            if p.kind is p.KEYWORD_ONLY} | tune_kwargs
    device = preset(opts["device"], DEVICES, "device")
    preset(opts["link"], LINKS, "link")  # refused here, not mid-search
    memory = DEVICES[device].memory_bytes if budget_bytes is None else budget_bytes
    safety, workspace = opts["safety"], opts["workspace"]

    def plain(b: int) -> tuple[int, None]:  # fit_margin >= 0 is fits, with no host bound
        sim = simulate(graph, b, sizes=resolve(graph, b), workspace=workspace)
        return fit_margin(sim, memory, safety), None

    without = _largest_by_margin(plain, limit)[0]
    if not rewrite_plans:
        return without, without
    top = limit if bound is None else min(limit, bound)
    if top <= without:
        return without, without
    parent = os.getpid()
    report = opts["progress"] or (lambda f, m: None)
    if workers > 1:
        _imported_for_workers()

    def tuned_at(b: int) -> TuneResult:
        # a forked worker reports no progress: its messages would interleave
        quiet = {**opts, "progress": None} if os.getpid() != parent else opts
        return _tune(graph, b, budget_bytes, **quiet, first_fit=True)

    def asked(b: int) -> None:  # how many batches it tries is not known: no fraction
        report(0.0, f"trying batch {b:,}")

    with_rewrite, answers = _largest_batch(
        tuned_at, lambda b, r: r.fits, top, max(without, 1), known=without > 0,
        top_first=bound is not None, workers=workers, asked=asked,
        guess=int(NEAR_BOUND * top) if bound is not None else None)
    if tuned is not None:
        tuned.update(answers)
    return without, max(with_rewrite, without)


def bound_batch(
    graph: Graph,
    budget_bytes: int | None = None,
    *,
    device: str = "V100",
    safety: float = DEFAULT_SAFETY,
    workspace: str = "accelerator",
    limit: int = 1 << 16,
) -> tuple[int, str]:
    """Largest batch that no plan can exceed: the one op's working set still fits.

    A plan moves and recomputes tensors, never an op's own inputs and outputs while it
    runs: above this batch, the op named (whose inputs, outputs and workspace are the
    largest) does not fit the budget beside the persistent memory, whatever the plan.
    Found by :func:`_largest_by_margin` (a few simulations, one at a time).

    Returns
    -------
    (int, str)
        The batch (0 when not even batch 1 is bounded below the budget) and the op.
    """
    device = preset(device, DEVICES, "device")
    memory = DEVICES[device].memory_bytes if budget_bytes is None else budget_bytes

    def ok(b: int) -> tuple[int, str]:
        sizes = resolve(graph, b)
        base = simulate(graph, b, sizes=sizes, workspace=workspace)
        need, op = _lower_bound(graph, base)
        return transient_budget(memory, base.persistent_bytes, safety) - (
            need - base.persistent_bytes), op

    batch, answers = _largest_by_margin(ok, limit)
    if batch and batch + 1 not in answers:
        answers[batch + 1] = ok(batch + 1)
    return batch, answers.get(batch + 1, answers.get(batch, (0, "")))[1]


#: Interpolated asks in a row that may leave more than half of the bracket before a
#: bisection is forced (:func:`_largest_by_margin`).
_FALSI_STEPS = 2


def _largest_by_margin(ask: Callable[[int], tuple[float, R]], limit: int
                       ) -> tuple[int, dict[int, tuple[float, R]]]:
    """Largest batch in [1, limit] whose margin is at least 0, and every answer.

    ``ask(batch)`` returns ``(margin, anything)``: the bytes to spare under a budget,
    negative when over it, which must fall as the batch grows. Memory grows almost
    linearly with the batch (tensor sizes are linear in it; kernel workspaces and the
    allocator's rounding bend the line a little), so each batch asked is where the line
    through the nearest answers crosses 0: beyond the last batch that fits while none is
    known not to (extrapolated, at most :data:`_FALSI_STEPS` times in a row, else doubled),
    inside the bracket afterwards (regula falsi, forced to a bisection after
    :data:`_FALSI_STEPS` asks in a row that did not halve it). The answer is bisection's:
    the largest batch with a margin of 0 or more whose successor, when within ``limit``,
    has less. Doubling then bisection asked 20-33 batches; this asks 3-7 for the batch
    without rewriting and for :func:`bound_batch` on the samples, the zoo's EfficientNetB0
    and the 28k-op DenseNet, with the same answers. On a margin that bends as the square
    of the batch it asks up to a third more than bisection (a property test bounds it).
    """
    answers: dict[int, tuple[float, R]] = {}

    def margin(b: int) -> float:
        if b not in answers:
            answers[b] = ask(b)
        return answers[b][0]

    if margin(1) < 0:
        return 0, answers
    lo, hi = 1, limit + 1  # lo holds; hi does not (limit + 1: not asked)
    prev = None  # the batch that held before lo (extrapolation's second point)
    slow = 0  # interpolated asks in a row that did not halve the bracket
    # Illinois: an end kept twice in a row has its margin halved in the interpolation, so
    # that a curved line does not creep up on the answer from one side
    weight = {"lo": 1.0, "hi": 1.0}
    moved = ""
    while hi - lo > 1:
        m_lo = margin(lo)
        if hi > limit:  # not bracketed: extrapolate from the two largest batches that held
            b = 0
            if prev is not None and slow < _FALSI_STEPS:
                slope = (m_lo - margin(prev)) / (lo - prev)
                if slope < 0:
                    b = lo + int(m_lo / -slope) + 1  # the first batch the line says fails
            if not b:
                b, slow = 2 * lo, -1
            b = min(max(b, lo + 1), limit)
        elif slow >= _FALSI_STEPS:
            b, slow = (lo + hi) // 2, -1
        else:
            a, c = m_lo * weight["lo"], -margin(hi) * weight["hi"]
            b = min(max(lo + int((hi - lo) * a / (a + c)), lo + 1), hi - 1)
        width = hi - lo
        side = "lo" if margin(b) >= 0 else "hi"
        if side == "lo":
            prev, lo = lo, b
        else:
            hi = b
        other = "hi" if side == "lo" else "lo"
        weight[side] = 1.0
        weight[other] = weight[other] / 2 if moved == side else 1.0
        moved = side
        slow = 0 if slow < 0 or 2 * (hi - lo) <= width else slow + 1
    return lo, answers


#: Where the tuned rewrite's largest batch usually is, as a fraction of :func:`bound_batch`
#: (91-99.6% on the samples' V100 rows in the README; 59% where the host stops the swaps):
#: :func:`max_batch` asks it right after the bound. On the DenseNet (1,213 of 1,298) the
#: search then asks 9 batches instead of 12 one at a time, or 6 rounds of two instead of 7.
NEAR_BOUND = 0.9


def _largest_batch(ask: Callable[[int], R], holds: Callable[[int, R], bool], limit: int,
                   start: int = 1, *, known: bool = False, top_first: bool = False,
                   workers: int = 1, asked: Callable[[int], None] | None = None,
                   guess: int | None = None) -> tuple[int, dict[int, R]]:
    """Largest batch in [start, limit] where ``holds(batch, ask(batch))``, and every answer.

    ``holds`` must be monotone (true up to some batch, false above): doubling from
    ``start``, then bisection. 0 when it fails at ``start`` (``start - 1`` where that holds).
    ``holds`` is called here, once per answer, as answers come.

    Parameters
    ----------
    known : bool
        It holds at ``start``; not asked.
    top_first : bool
        ``limit`` is asked first: where the answer is the limit, that is the whole search.
    workers : int
        Batches asked at once, each in a forked process of its own (:func:`_forked`). As
        each answer comes, the next batch asked is the middle of the widest gap left between
        the batches known and those being asked, and a batch the answer made useless is
        stopped: no worker waits for a round to end.
    asked : callable, optional
        ``asked(batch)``, here, as each batch is asked (a forked worker reports nothing).
    guess : int, optional
        With ``top_first``: asked next (at once, with two workers), where the answer is
        likely: it splits the gap unevenly, so it saves asks where it is right and costs one
        where it is not.
    """
    search = _Search(limit, start, known, top_first, asked, guess)
    answers: dict[int, R] = {}
    if workers > 1 and hasattr(os, "fork"):
        for b, answer in _forked(ask, search, workers):
            answers[b] = answer
            search.settle(b, holds(b, answer))
    else:
        while (b := search.next()) is not None:
            answers[b] = ask(b)
            search.settle(b, holds(b, answers[b]))
    if search.lo == 0 and start > 1:  # fails at start: the batch below, as before
        return (start - 1 if holds(start - 1, ask(start - 1)) else 0), answers
    return search.lo, answers


class _Search:
    """Where a monotone search stands, and which batch to ask next (:func:`_largest_batch`).

    ``lo`` holds (0: none known), ``hi`` does not (``limit + 1``: past the limit, not asked);
    ``asking`` are the batches being asked.
    """

    def __init__(self, limit: int, start: int, known: bool, top_first: bool,
                 asked: Callable[[int], None] | None = None, guess: int | None = None) -> None:
        self.limit, self.start, self.asked = limit, start, asked
        self.held = [start] if known else []
        self.lo, self.hi = (start if known else 0), limit + 1
        # hi was asked, or the limit is asked first: bisect up to it, no doubling
        self.bounded = top_first
        self.asking: set[int] = set()
        self.first = ([limit] if top_first and limit > start else []) + ([] if known else [start])
        if top_first and guess is not None and start < guess < limit:
            self.first.append(guess)

    def next(self, free: int = 1) -> int | None:
        """The batch to ask next (added to :attr:`asking`), or None: nothing is worth it.

        ``free``: workers about to be given a batch, this one included. Two free workers in
        one gap take its thirds, not its half and then a quarter.
        """
        b = self._pick(free)
        if b is not None:
            self.asking.add(b)
            if self.asked is not None:
                self.asked(b)
        return b

    def _pick(self, free: int = 1) -> int | None:
        while self.first:
            b = self.first.pop(0)
            if self.lo < b < self.hi:
                return b
        if self.lo == 0:  # start not answered yet, or failed
            return None
        if not self.bounded:  # doubling, past every batch being asked
            b = max([self.lo, *self.asking]) * 2
            return b if b <= self.limit else (None if self.asking else self._unbound())
        marks = sorted({self.lo, self.hi, *(b for b in self.asking if self.lo < b < self.hi)})
        gap, a = max((y - x, x) for x, y in zip(marks, marks[1:], strict=False))
        return a + max(1, gap // (free + 1)) if gap > 1 else None

    def _unbound(self) -> int | None:
        # doubling passed the limit with every batch below it holding: bisect up to it
        self.bounded = True
        return self._pick()

    def settle(self, b: int, holds: bool) -> None:
        """Take the answer at ``b``."""
        self.asking.discard(b)
        if holds:
            self.held.append(b)
        elif b < self.hi:
            self.hi, self.bounded = b, True
        # a batch that holds above one that does not would break monotony: not trusted
        self.lo = max((h for h in self.held if h < self.hi), default=0)
        if not holds and b == self.start:
            self.first.clear()

    def useless(self, b: int) -> bool:
        """Whether the answer at ``b`` can no longer move the search."""
        return not self.lo < b < self.hi


def _imported_for_workers() -> None:
    """Import here what a tune imports on first use, rather than once in every worker.

    SciPy's optimizer alone took 0.25 s to import: a forked worker that imported it paid
    that for every batch (VGG-16's search took twice as long with two workers as with one).
    """
    import highspy  # noqa: F401
    import scipy.sparse  # noqa: F401

    from . import checkpoint, units  # noqa: F401


#: Seconds a forked worker's answer must take (the median so far) for the search to go on
#: forking: a fork and its pipe cost about 25-50 ms, more than a small graph's simulation.
FORK_ABOVE = 0.1


def _forked(ask: Callable[[int], R], search: _Search, workers: int):
    """Yield ``(batch, ask(batch))`` as each forked worker answers, ``workers`` at once.

    The search is pure Python, one core each: with more idle cores, batches asked at once
    take the time of one. A child sends its answer pickled through a pipe (an exception as
    an exception, raised here); one that dies is asked again here; one whose batch the
    answers so far made useless is killed.
    """
    import select
    import signal

    running: dict[int, tuple[int, int, float]] = {}  # read fd -> (batch, pid, start)
    took: list[float] = []
    try:
        while True:
            # answers quicker than a fork: no more workers, the rest here, one at a time
            quick = len(took) >= workers and statistics.median_high(took) < FORK_ABOVE
            if quick and not running:
                while (b := search.next()) is not None:
                    yield b, ask(b)
                return
            while (not quick and len(running) < workers
                   and (b := search.next(workers - len(running))) is not None):
                read, pid = _fork(ask, b)
                running[read] = (b, pid, time.perf_counter())
            if not running:
                return
            ready, _, _ = select.select(list(running), [], [])
            for read in ready:
                b, pid, started = running.pop(read)
                took.append(time.perf_counter() - started)
                with os.fdopen(read, "rb") as f:
                    data = f.read()
                os.waitpid(pid, 0)
                try:
                    ok, value = pickle.loads(data)
                except Exception:  # noqa: BLE001 - the child died before it answered
                    ok, value = True, ask(b)
                if not ok:
                    raise value
                yield b, value
            for read, (b, pid, _) in list(running.items()):
                if search.useless(b):
                    os.kill(pid, signal.SIGKILL)
                    os.close(read)
                    os.waitpid(pid, 0)
                    search.asking.discard(b)
                    del running[read]
    finally:
        for read, (_, pid, _) in running.items():
            os.kill(pid, signal.SIGKILL)
            os.close(read)
            os.waitpid(pid, 0)


def _fork(ask: Callable[[int], R], b: int) -> tuple[int, int]:
    """Ask ``b`` in a forked child: (the pipe to read its pickled answer from, its pid)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write)
        return read, pid
    code = 0  # the child: answer, send, exit without running the parent's cleanup
    try:
        os.close(read)
        try:
            data = pickle.dumps((True, ask(b)))
        except BaseException as e:  # noqa: BLE001 - raised again in the parent
            data = pickle.dumps((False, e))
        with os.fdopen(write, "wb") as f:
            f.write(data)
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        code = 1
    finally:
        os._exit(code)


__all__ = ["DEVICES", "LINKS", "STRATEGY_NAMES", "Device", "Link", "TuneResult", "bound_batch",
           "max_batch",
           "op_seconds", "preset", "tune"]
