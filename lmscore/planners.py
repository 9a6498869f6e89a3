"""Per-tensor planning: swap or recompute each tensor, chosen together by a MILP (HiGHS).

TFLMS's knobs swap every long-lived tensor or none and bring every swap-in back the same
number of levels early. Here each large buffer of the unswapped step that is idle between
two of its readers (a forward activation waiting for the backward pass) gets options:

- **swap** it over the gap, the swap-in started by a trigger chosen so that the copy ends
  just in time for the first far reader (no stall), or as late as possible (the most
  memory freed, a predicted stall);
- **recompute** it before its far readers, by clones of its producer and of those of the
  producer's ancestors whose outputs are not alive then (at most :data:`MAX_CHAIN` ops of
  the forward pass; :func:`lmscore.plan.recompute_refusal` decides what may be cloned).

Each option frees the buffer over a range of positions of the executor's schedule and
costs predicted seconds: the copies' stalls on the link, or the clones' compute time. One
binary variable per option; at most one option per idle stretch of a buffer, and several
stretches of one buffer only by swaps (a swap-in per stretch); a recompute's inputs kept
alive (no option of theirs frees them before the clones run, since the clones read the
original tensors); and, per segment of the schedule between option boundaries, what
the chosen options free there, which must cover the excess where the step is over budget
(a continuous column, defined by a chain of rows from the previous segment's: each
option enters two rows, where it starts and where it ends). Where even all options at once
leave a position over budget, no MILP is solved. The objective is the predicted seconds,
and HiGHS solves it (:func:`_highs`: within 0.1% of the best it can prove in the first
second, then within a gap that grows by 1% per second). A Checkmate-style matrix with a variable
per tensor and per step does not scale (no solution within 400 s at 353 nodes); this one
has a variable per option and two per segment.

The MILP is a model: it ignores the clones' intermediate buffers, contention on the link
and how triggers land in the rewritten schedule. So its plan is rewritten and simulated in
full (:func:`lmscore.evaluate.evaluate_plan`), and while that does not fit, the MILP is
solved again with the budget lowered by the overshoot.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .ir import Graph, split_tensor
from .load import native_output_silenced
from .memory import Simulation, allocating_positions, held_through
from .order import Ordering, order
from .plan import (
    DEFAULT_PREDICATES,
    Candidate,
    Recompute,
    Swap,
    SwapIn,
    candidates,
    find_trigger,
    recompute_refusal,
)
from .shapes import Sizes

#: Strategies of :func:`lmscore.tune.tune` planned here, and the options each may use.
STRATEGIES = {"swap": ("swap",), "recompute": ("recompute",), "hybrid": ("swap", "recompute")}
#: Longest chain of ops one recomputation clones.
MAX_CHAIN = 4
#: Buffers smaller than this fraction of the transient peak get no options: they cannot
#: matter to the fit and would only grow the MILP.
MIN_FRACTION = 1e-3
#: Idle stretches of one buffer that get options, the longest first.
MAX_GAPS = 3
#: The same, where no choice of options over :data:`MAX_GAPS` stretches covers the budget
#: (a larger MILP: planning the 28,608-op DenseNet took 5.7 s, not 3.4 s, with four for
#: every problem). A block's output in ResNet-50 has four: between its forward readers,
#: before each of the next block's two filter gradients, and before its own ReLU gradient,
#: where the next block's two input gradients are summed beside it (ResNet-50 on a V100:
#: batch 1,343 fits with four options per buffer, not with three).
WIDE_GAPS = 4
#: Shortest idle stretch that gets options, in schedule positions between two readers.
MIN_GAP = 3


@dataclass(frozen=True)
class Option:
    """One way to free a buffer over part of its life.

    Attributes
    ----------
    tensor : str
        The tensor that owns the buffer.
    kind : {"swap", "recompute"}
    lo, hi : int
        Schedule positions (inclusive) over which the buffer is not on the device.
    bytes : int
    seconds : float
        Predicted cost: stalls on the link, or the clones' compute time.
    consumers : tuple of str
        The far readers served by the swap-in or the clones.
    trigger : str
        The op that starts the swap-in or the clones.
    ops : tuple of str
        The ops cloned (recompute only), in topological order.
    keeps : tuple of str
        Buffers (by the tensor that allocates them) the clones read, which must be on the
        device at position ``hi + 1``.
    buffer : str
        The buffer freed, by the tensor that allocates it: one option per buffer, whichever
        of the tensors that share it (views, in-place results) the option names.
    """

    tensor: str
    kind: str
    lo: int
    hi: int
    bytes: int
    seconds: float
    consumers: tuple[str, ...]
    trigger: str
    ops: tuple[str, ...] = ()
    keeps: tuple[str, ...] = ()
    buffer: str = ""  # the tensor's own when empty


def options(
    graph: Graph,
    sizes: Sizes,
    base: Simulation,
    seconds: Sequence[float],
    link_bandwidth: float,
    kinds: Sequence[str] = ("swap", "recompute"),
    max_gaps: int = MAX_GAPS,
    swappable: Sequence[Candidate] | None = None,
    made: dict | None = None,
    hold: int = 0,
) -> tuple[Option, ...]:
    """The options of every large idle buffer of ``base`` (see the module docstring).

    Parameters
    ----------
    graph : Graph
    sizes : Sizes
    base : Simulation
        The unswapped step.
    seconds : sequence of float
        Predicted time of each op (:func:`lmscore.tune.op_seconds`).
    link_bandwidth : float
        Bytes per second, one direction.
    kinds : sequence of str
        ``"swap"``, ``"recompute"`` or both.
    max_gaps : int
        Idle stretches of each buffer that get options, the longest first.
    swappable : sequence of Candidate, optional
        What :func:`lmscore.plan.candidates` gives ``graph`` at threshold 0 with the
        default predicates and ``exact=False``, when the caller has it already.
    made : dict, optional
        The options of each idle stretch made by an earlier call for the same step, filled
        in by this one: widening to :data:`WIDE_GAPS` then makes only the stretches it adds.
    hold : int
        Allocations after its last near reader through which a swapped buffer may stay on
        the device (:func:`lmscore.memory.release_hold`): its swap frees it after them.

    Returns
    -------
    tuple of Option
    """
    ordering = order(graph)
    pos = ordering.position
    schedule = ordering.schedule
    elapsed = np.cumsum([seconds[i] for i in schedule]) if schedule else np.zeros(0)
    start = np.concatenate(([0.0], elapsed[:-1])) if len(elapsed) else elapsed
    if swappable is None:
        swappable = candidates(graph, sizes, 0, DEFAULT_PREDICATES, exact=False)
    by_tensor = {c.tensor: c for c in swappable}
    alive: dict[str, tuple[int, int, str]] = {}  # tensor -> its buffer's first, last, owner
    for b in base.buffers:
        if not b.scratch and not b.host:
            for t in (b.tensor, *b.views):
                alive[t] = (b.first, b.last, b.tensor)
    smallest = max(1, int(MIN_FRACTION * base.transient_peak_bytes))
    allocating = allocating_positions(base.buffers)
    out: list[Option] = []
    for b in base.buffers:
        if b.scratch or b.host or b.bytes < smallest or not b.readers:
            continue
        readers = sorted({pos[r] for r in b.readers})
        marks = [b.first, *readers]
        gaps = np.diff(marks)
        # the longest idle stretches (a gradient read early and again by a late sum has
        # two): an option frees the buffer over one, for all the readers after it
        for k in np.argsort(-gaps, kind="stable")[:max_gaps]:
            if gaps[k] < MIN_GAP:
                continue
            key = (b.tensor, int(marks[k]), int(marks[k + 1]), tuple(kinds))
            opts = None if made is None else made.get(key)
            if opts is None:
                opts = _buffer_options(graph, ordering, b, marks[k], marks[k + 1], readers,
                                       alive, by_tensor, elapsed, start, seconds,
                                       link_bandwidth, kinds, allocating, hold)
                if made is not None:
                    made[key] = opts
            out.extend(opts)
    return tuple(out)


def _buffer_options(graph, ordering, b, p_a, p_b, readers, alive, swappable, elapsed, start,
                    seconds, link_bandwidth, kinds, allocating, hold) -> list[Option]:
    """The options that free buffer ``b`` after position ``p_a`` until ``p_b``."""
    pos = ordering.position
    schedule = ordering.schedule
    idx = graph.index
    out: list[Option] = []
    far = tuple(graph.ops[schedule[q]].name for q in readers if q >= p_b)
    # the far readers must all read one tensor of the buffer (itself or a view of it,
    # such as a Relu written into its input), besides what they wrote into it in place
    # themselves: one swap-in or one clone serves them
    shared = {b.tensor, *b.views}
    read = {t for c in far for t in graph.ops[idx[c]].inputs
            if t in shared and split_tensor(t)[0] not in far}
    if len(read) != 1:
        return out
    tensor = read.pop()
    far = tuple(c for c in far if tensor in graph.ops[idx[c]].inputs)
    producer, port = split_tensor(tensor)
    p = idx[producer]
    if "swap" in kinds and tensor in swappable and set(far) <= set(
            swappable[tensor].far):
        move = b.bytes / link_bandwidth
        held = held_through(allocating, int(p_a), hold)
        # the op after p_a waits for the swap-out, which starts when the producer ends
        stall_out = max(0.0, float(elapsed[pos[p]]) + move - float(start[p_a + 1]))
        triggers = {trigger_near(graph, ordering, tensor, far, schedule[lead])
                    for lead in _leads(start, p_a, p_b, move)}  # two leads may meet
        for trigger in sorted(triggers - {None}):
            t = pos[idx[trigger]]
            if not held < t < p_b:
                continue
            stall_in = max(0.0, float(elapsed[t]) + move - float(start[p_b]))
            # TensorFlow may free the device buffer only after the next allocations
            # (lmscore.memory.held_through, which "fits" counts)
            out.append(Option(tensor, "swap", held + 1, t, b.bytes,
                              stall_out + stall_in, far, trigger, buffer=b.tensor))
    if "recompute" in kinds:
        chain = recompute_chain(graph, ordering, p, p_b, alive, {b.tensor}, MAX_CHAIN)
        if isinstance(chain, str):
            return out
        trigger = trigger_near(graph, ordering, tensor, far, schedule[p_b - 1])
        if trigger is None:
            return out
        t = pos[idx[trigger]]
        if not p_a < t < p_b:
            return out
        ops, keeps = chain
        cost = sum(seconds[idx[o]] for o in ops)
        out.append(Option(tensor, "recompute", p_a + 1, t, b.bytes, cost, far, trigger,
                          ops, keeps, b.tensor))
    return out


def _leads(start: np.ndarray, p_a: int, p_b: int, move: float) -> list[int]:
    """Trigger positions to offer: the latest that hides the copy, and the latest of all."""
    latest = p_b - 1
    hidden = int(np.searchsorted(start, start[p_b] - move, side="right")) - 1
    picks = {latest}
    if p_a < hidden < latest:
        picks.add(hidden)
    return sorted(picks)


def trigger_near(
    graph: Graph, ordering: Ordering, tensor: str, far: Sequence[str], op: int
) -> str | None:
    """A trigger for ``far`` near op ``op``'s level that reaches the first far reader."""
    first = min((graph.index[c] for c in far), key=lambda c: (ordering.levels[c], c))
    ahead = max(1, ordering.levels[first] - ordering.levels[op])
    return find_trigger(graph, tensor, far, ahead, 10, exact=False)


def recompute_chain(
    graph: Graph, ordering: Ordering, producer: int, at: int,
    alive: Mapping[str, tuple[int, int, str]], freed: Collection[str],
    limit: int | None = None,
) -> tuple[tuple[str, ...], tuple[str, ...]] | str:
    """The ops to clone so that ``producer``'s outputs are made again at position ``at``.

    Walks back from the producer: an input whose buffer is on the device at ``at`` anyway
    (``alive``: tensor -> its buffer's first and last schedule positions and owner tensor)
    and is not one of the buffers ``freed`` (by owner tensor: the buffer being freed, an
    in-place result's input) is read as it is, and so is a variable, a constant or a feed;
    any other input's producer is cloned too.

    Returns
    -------
    tuple or str
        The ops to clone in the executor's order and the owners of the buffers they read
        as they are; or why none: an op :func:`lmscore.plan.recompute_refusal` refuses, or
        more than ``limit`` ops.
    """
    adj = graph.adjacency
    cats = ordering.categories
    chain: set[int] = set()
    keeps: set[str] = set()
    stack = [producer]
    while stack:
        i = stack.pop()
        if i in chain:
            continue
        reason = recompute_refusal(graph, ordering, i)
        if reason:
            return f"{graph.ops[i].name!r} cannot be recomputed: {reason}"
        if limit is not None and len(chain) >= limit:
            return f"more than {limit} ops to clone"
        chain.add(i)
        for q, port in adj.data_in[i]:
            span = alive.get(f"{graph.ops[q].name}:{port}")
            if span is None and cats[q] in ("persistent", "input"):
                continue
            if span is not None and span[0] <= at <= span[1] and span[2] not in freed:
                keeps.add(span[2])
                continue
            stack.append(q)
    pos = ordering.position
    ops = tuple(graph.ops[i].name for i in sorted(chain, key=lambda i: pos[i]))
    return ops, tuple(sorted(keeps))


@dataclass(frozen=True)
class Solution:
    """The options a MILP chose, and how it went.

    Attributes
    ----------
    chosen : tuple of Option
    feasible : bool
        False when no choice of options covers the excess (or the solver gave up).
    seconds : float
        The chosen options' predicted cost.
    rows, columns : int
        Size of the MILP.
    status : str
        The solver's message.
    host_rows : int
        Rows of the host limit among ``rows`` (0: the host limit did not constrain it).
    """

    chosen: tuple[Option, ...]
    feasible: bool
    seconds: float
    rows: int
    columns: int
    status: str
    host_rows: int = 0


def solve(
    opts: Sequence[Option], live: np.ndarray, budget: int, time_limit: float = 20.0,
    host_limit: int | None = None,
) -> Solution:
    """Choose options so that ``live`` minus what they free stays within ``budget``.

    Parameters
    ----------
    opts : sequence of Option
    live : numpy.ndarray
        Transient bytes on the device at each schedule position, unswapped.
    budget : int
    time_limit : float
        Seconds HiGHS may take; its best solution so far is used.
    host_limit : int, optional
        Host memory the swapped tensors may hold at once: a swap holds its bytes on the
        host over the positions it frees on the device (a row per segment where all swap
        options together could exceed it).

    Returns
    -------
    Solution
    """
    n = len(live)
    if n == 0 or int(live.max()) <= budget:
        return Solution((), True, 0.0, 0, 0, "fits as it is")
    opts = [o for o in opts if o.lo <= o.hi]
    if not opts:
        return Solution((), False, 0.0, 0, 0, "no tensor can be swapped or recomputed")
    short = _uncovered(opts, live, budget)
    if short >= 0:  # no need to ask HiGHS: even every option at once is not enough there
        return Solution((), False, 0.0, 0, len(opts),
                        f"every option together leaves position {short} over budget")
    cuts = sorted({0, n, *(o.lo for o in opts), *(o.hi + 1 for o in opts)})
    cuts = [c for c in cuts if 0 <= c <= n]
    seg_max = np.maximum.reduceat(live, cuts[:-1])
    seg_index = {c: k for k, c in enumerate(cuts)}
    k = len(seg_max)  # segments: every option frees its buffer over a run of them
    first = np.array([seg_index[o.lo] for o in opts])
    end = np.array([seg_index[o.hi + 1] for o in opts])
    nbytes = np.array([o.bytes for o in opts], dtype=np.int64)
    # bytes in units of the largest live value (HiGHS scales poorly at 1e10)
    unit = float(max(int(live.max()), 1))
    over = seg_max > budget
    swaps = np.array([o.kind == "swap" for o in opts])
    host_hot = np.zeros(k, dtype=bool)
    if host_limit is not None and swaps.any():
        # what all swaps could hold on the host per segment; bounded only where that is over
        held = np.zeros(k + 1, dtype=np.int64)
        np.add.at(held, first[swaps], nbytes[swaps])
        np.add.at(held, end[swaps], -nbytes[swaps])
        host_hot = np.cumsum(held)[:-1] > host_limit
    chosen, message, rows = (), "", 0
    for margin in MARGINS:
        res, rows = _milp(opts, first, end, nbytes / unit, swaps if host_hot.any() else None,
                          np.maximum(seg_max - budget, nbytes.min() / 2) / unit + margin,
                          over, host_hot, (host_limit or 0) / unit - margin, time_limit)
        message = str(res.message)
        if res.x is None:
            return Solution((), False, 0.0, rows, len(opts), message, int(host_hot.sum()))
        pick = res.x[:len(opts)] > 0.5
        # checked in bytes: the tolerances of HiGHS are in units
        freed = np.zeros(k + 1, dtype=np.int64)
        np.add.at(freed, first[pick], nbytes[pick])
        np.add.at(freed, end[pick], -nbytes[pick])
        ok = bool((seg_max - np.cumsum(freed)[:-1] <= budget).all())
        if host_hot.any():
            on = pick & swaps
            held = np.zeros(k + 1, dtype=np.int64)
            np.add.at(held, first[on], nbytes[on])
            np.add.at(held, end[on], -nbytes[on])
            ok = ok and bool((np.cumsum(held)[:-1][host_hot] <= host_limit).all())
        chosen = tuple(o for o, x in zip(opts, pick, strict=True) if x)
        if ok:
            return Solution(chosen, True, float(sum(o.seconds for o in chosen)), rows,
                            len(opts), message, int(host_hot.sum()))
    return Solution((), False, 0.0, rows, len(opts),
                    f"{message}; its choice is over budget by rounding", int(host_hot.sum()))


#: Margins (in units of the largest live value) by which the MILP's bounds must be met:
#: the next is tried when a choice meets them within HiGHS' tolerances but not in bytes.
MARGINS = (0.0, 1e-6, 1e-4)


def _milp(opts, first, end, size, swaps, need, over, host_hot, host_cap, time_limit):
    """HiGHS on the per-option problem; returns its result and the number of rows.

    Columns: a binary per option, then per segment what the chosen options free there (F)
    and, with ``swaps``, what the chosen swaps hold on the host (H). A chain of equality
    rows defines them, F[s] = F[s-1] + the options starting at s - those ending before s,
    so each option has two nonzeros, where a row per segment summing every option alive
    over it had one per segment it spans (ResNet-50 at batch 706: 60,246 nonzeros in 479
    rows, 4-11x slower). F is bounded below by ``need`` where the step is ``over`` budget
    (the excess; at least half the smallest option, which any choice that frees the
    segment at all exceeds), H above by ``host_cap`` where ``host_hot``.
    """
    from scipy.sparse import coo_array

    m, k = len(opts), len(need)
    chains = [(np.ones(m, dtype=bool), m)]
    if swaps is not None:
        chains.append((swaps, m + k))
    rows, cols, vals = [], [], []
    for r0, (members, col0) in enumerate(chains):
        seg = np.arange(k)
        rows += [r0 * k + seg, r0 * k + seg[1:]]
        cols += [col0 + seg, col0 + seg[1:] - 1]
        vals += [np.ones(k), -np.ones(k - 1)]
        js = np.flatnonzero(members)
        rows.append(r0 * k + first[js])
        cols.append(js)
        vals.append(-size[js])
        ends = js[end[js] < k]
        rows.append(r0 * k + end[ends])
        cols.append(ends)
        vals.append(size[ends])
    n_cols = m + k * len(chains)
    blocks = [(coo_array((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         shape=(k * len(chains), n_cols)), 0.0, 0.0)]
    # at most one option per idle stretch of a buffer (its options share ``lo``); two
    # stretches of one buffer only by swaps (_exclusive); a recomputation's inputs stay
    # on the device
    by_buffer: dict[str, list[int]] = {}
    for j, o in enumerate(opts):
        by_buffer.setdefault(o.buffer or o.tensor, []).append(j)
    pairs: list[list[int]] = []
    for js in by_buffer.values():
        pairs.extend(_exclusive(opts, js))
    for j, o in enumerate(opts):
        for t in o.keeps:
            # the clones read the original tensor: an option that frees it before them
            # (even one whose swap-in is back by then) would keep the original alive
            for i in by_buffer.get(t, ()):
                if opts[i].lo <= o.hi + 1:
                    pairs.append([j, i])
    if pairs:
        r = np.concatenate([np.full(len(p), i) for i, p in enumerate(pairs)])
        c = np.concatenate([np.asarray(p) for p in pairs])
        blocks.append((coo_array((np.ones(len(c)), (r, c)), shape=(len(pairs), n_cols)),
                       -np.inf, 1.0))
    lower = np.zeros(n_cols)
    upper = np.full(n_cols, np.inf)
    upper[:m] = 1.0
    lower[m:m + k] = np.where(over, need, 0.0)
    if swaps is not None:
        upper[m + k:] = np.where(host_hot, host_cap, np.inf)
    # seconds first; among equals, fewer bytes moved or recomputed
    # (in milliseconds: HiGHS takes costs near 1 best)
    total = float(size.sum()) or 1.0
    cost = np.zeros(n_cols)
    cost[:m] = [1e3 * o.seconds for o in opts]
    cost[:m] += 1e-3 * size / total
    res = _highs(cost, blocks, lower, upper, m, time_limit)
    return res, k * len(chains) + len(pairs)


#: Seconds HiGHS may take to prove its choice within 0.1% of the best; after that, the
#: gap it may leave grows by :data:`GAP_PER_SECOND` (a fraction of the predicted seconds)
#: for every second more.
PATIENT_SECONDS = 1.0
GAP_PER_SECOND = 0.01


@dataclass(frozen=True)
class _Solved:
    """What HiGHS answered: its best choice (None if it has none) and why it stopped."""

    x: np.ndarray | None
    message: str


def _highs(cost: np.ndarray, blocks: list[tuple[Any, float, float]], lower: np.ndarray,
           upper: np.ndarray, n_int: int, time_limit: float) -> _Solved:
    """Minimise ``cost @ x`` over the rows ``lo <= A x <= hi`` of ``blocks`` (HiGHS).

    The first ``n_int`` columns are binary (their bounds are 0 and 1).
    """
    import highspy
    from scipy.sparse import vstack

    a = vstack([b for b, _, _ in blocks]).tocsc()
    inf = highspy.kHighsInf
    row_lo = np.concatenate([np.full(b.shape[0], lo) for b, lo, _ in blocks])
    row_hi = np.concatenate([np.full(b.shape[0], hi) for b, _, hi in blocks])
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
    lp.col_cost_ = cost
    lp.col_lower_ = lower
    lp.col_upper_ = np.where(np.isinf(upper), inf, upper)
    lp.row_lower_ = np.where(np.isinf(row_lo), -inf, row_lo)
    lp.row_upper_ = np.where(np.isinf(row_hi), inf, row_hi)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = a.indptr
    lp.a_matrix_.index_ = a.indices
    lp.a_matrix_.value_ = a.data
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n_int + [
        highspy.HighsVarType.kContinuous] * (a.shape[1] - n_int)
    started = time.perf_counter()

    def enough(event: Any) -> None:
        # a second of planning is worth more than 1% of the overhead (a 27k-op DenseNet
        # near its largest batch over PCIe 3: 1.8% at 2.1 s, still 0.2% at 20 s)
        out = event.data_out
        waited = time.perf_counter() - started - PATIENT_SECONDS
        if waited > 0 and out.mip_gap <= GAP_PER_SECOND * waited:
            event.interrupt()

    for tolerance, reduced_cost in TOLERANCES:
        left = time_limit - (time.perf_counter() - started)
        # HiGHS 1.16 prints a banner to stdout when made, its MIP solver a stray line when
        # it runs: either would break the command line's --json output
        with native_output_silenced(1):
            h = highspy.Highs()
            h.setOptionValue("output_flag", False)
            h.setOptionValue("threads", 1)
            h.setOptionValue("time_limit", float(max(left, 0.1)))
            h.setOptionValue("mip_rel_gap", 1e-3)
            h.setOptionValue("mip_feasibility_tolerance", tolerance)
            h.setOptionValue("mip_heuristic_run_root_reduced_cost", reduced_cost)
            h.passModel(lp)
            h.cbMipInterrupt.subscribe(enough)
            h.run()
        status = h.getModelStatus()
        if status != highspy.HighsModelStatus.kInfeasible:
            break
    message = h.modelStatusToString(status)
    info = h.getInfo()
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible
        return _Solved(None, message)
    return _Solved(np.asarray(h.getSolution().col_value), message)


#: HiGHS' MIP feasibility tolerance and whether its root reduced-cost heuristic runs, in
#: the order tried; the next only where HiGHS calls the problem infeasible. HiGHS 1.13-1.16
#: call some of these problems infeasible at their default 1e-6, where HiGHS 1.12 finds the
#: optimum (the zoo's EfficientNetB0 at batch 49,974 over PCIe 3, in the memory-aware
#: order: 0.08 s to "infeasible", against 11.38 s of swaps exactly within every row); at
#: 1e-9 it finds it in 0.15 s. But at 1e-7 and below, HiGHS 1.15's root reduced-cost
#: heuristic can loop for ever in the presolve of its sub-MIP, past the time limit (a small
#: CNN's plan at one batch of --max-batch), so it is off there. At 1e-6 it runs: it finds
#: the incumbent that lets the 27k-op DenseNet's MILP near its largest batch over PCIe 3
#: stop (2.7 s; 4.3 s at 1e-9 without it).
TOLERANCES = ((1e-6, True), (1e-9, False))


def _uncovered(opts: Sequence[Option], live: np.ndarray, budget: int) -> int:
    """The first position that stays over ``budget`` with every option chosen, else -1.

    A relaxation of :func:`solve`'s problem (a buffer counts once wherever any of its
    options frees it, whatever excludes what), so a position it finds proves the MILP
    infeasible, and HiGHS takes far longer to say so.
    """
    n = len(live)
    freed = np.zeros(n + 1, dtype=np.int64)
    by_buffer: dict[str, list[tuple[int, int]]] = {}
    size: dict[str, int] = {}
    for o in opts:
        key = o.buffer or o.tensor
        by_buffer.setdefault(key, []).append((o.lo, o.hi))
        size[key] = max(size.get(key, 0), o.bytes)  # a relaxation: the most any frees
    for key, spans in by_buffer.items():
        spans.sort()
        lo, hi = spans[0]
        for a, b in spans[1:] + [(n + 1, n + 1)]:
            if a > hi + 1:  # a gap between merged spans: close the current one
                freed[lo] += size[key]
                freed[min(hi + 1, n)] -= size[key]
                lo, hi = a, b
            else:
                hi = max(hi, b)
    over = np.flatnonzero(live - np.cumsum(freed)[:n] > budget)
    return int(over[0]) if len(over) else -1


def _exclusive(opts: Sequence[Option], js: Sequence[int]) -> list[list[int]]:
    """Sets of one buffer's options ``js`` of which at most one may be chosen.

    Two options of one buffer go together only over two idle stretches (their ``lo``
    differs), and only when both are swaps. Of one tensor, it is copied out once and back
    in before each stretch's first reader (:func:`decisions`). Of two tensors (a residual
    gradient read through a reshape after the first stretch), the later is a view of the
    first's swap-in, since all readers after a stretch read the one tensor its option
    swaps: each is copied out and in on its own. A recomputation's clones would read the
    buffer it frees, so it excludes every other option. The sets are therefore, per
    stretch, its swaps with all the recomputations: a row each, which holds every pair's
    row with fewer rows and a tighter relaxation (ResNet-50 at batch 706: 1,700 pair rows
    before).

    >>> o = lambda kind, lo: Option("t", kind, lo, lo + 1, 1, 0.0, (), "")
    >>> opts = [o("swap", 0), o("swap", 5), o("recompute", 5), o("swap", 9), o("swap", 9)]
    >>> _exclusive(opts, [0, 1, 2, 3, 4])
    [[2, 0], [2, 1], [2, 3, 4]]
    >>> _exclusive(opts[:2], [0, 1])
    []
    """
    recomputes = [j for j in js if opts[j].kind != "swap"]
    swaps_at: dict[int, list[int]] = {}
    for j in js:
        if opts[j].kind == "swap":
            swaps_at.setdefault(opts[j].lo, []).append(j)
    stretches = sorted({opts[j].lo for j in js})
    cliques = [recomputes + swaps_at.get(lo, []) for lo in stretches]
    # stretches are the gaps between a buffer's readers and never overlap; options that
    # claim overlapping ones would free one buffer twice
    swaps = [j for lo in stretches for j in swaps_at.get(lo, [])]
    cliques += [[i, j] for x, i in enumerate(swaps) for j in swaps[x + 1:]
                if opts[i].lo != opts[j].lo and opts[i].lo <= opts[j].hi
                and opts[j].lo <= opts[i].hi]
    return [c for c in cliques if len(c) > 1]


def decisions(chosen: Sequence[Option]) -> tuple[tuple[Swap, ...], tuple[Recompute, ...]]:
    """The swaps and recomputes of a plan that applies ``chosen``.

    Swap options of one tensor over several idle stretches make one swap with a swap-in
    per stretch; each swap-in serves the readers up to the next stretch (an option's
    consumers are all the readers after its stretch).
    """
    by_tensor: dict[str, list[Option]] = {}
    for o in chosen:
        if o.kind == "swap":
            by_tensor.setdefault(o.tensor, []).append(o)
    swaps = []
    for tensor, group in by_tensor.items():
        group.sort(key=lambda o: o.lo)
        # a later stretch's readers are among an earlier one's: the next one takes them
        after = [set(g.consumers) for g in group[1:]] + [set()]
        swaps.append(Swap(tensor, tuple(
            SwapIn(tuple(c for c in o.consumers if c not in later), o.trigger)
            for o, later in zip(group, after, strict=True))))
    recomputes = tuple(Recompute(o.tensor, o.ops, o.consumers, o.trigger)
                       for o in chosen if o.kind == "recompute")
    return tuple(swaps), recomputes


__all__ = ["MAX_CHAIN", "STRATEGIES", "Option", "Solution", "decisions", "options",
           "recompute_chain", "solve", "trigger_near"]
