"""Chen et al.'s sqrt(n) checkpointing as a recompute plan: the baseline of the planners.

Chen, Xu, Zhang and Guestrin ("Training Deep Nets with Sublinear Memory Cost", 2016) cut
the forward pass into about sqrt(n) segments, keep each segment's boundary output (its
checkpoint) and recompute every other activation from the checkpoints when the backward
pass needs it: O(sqrt(n)) activations on the device instead of n.

Here the activations are the buffers of the unplanned step's simulation that a forward op
allocates and a backward op reads the values of (a gradient's ``Shape`` reads no values),
those of at least :data:`lmscore.planners.MIN_FRACTION` of the transient peak (smaller
ones are kept: they cannot matter to the peak, and a recomputation reads them as they
are); ``n`` is their count. In the executor's order they are cut into ``segments`` runs of
about ``n / segments`` activations (default ``round(sqrt(n))``: by count, as the paper's
analysis), each closed by an activation where the forward pass narrows to that one tensor
(:func:`cut_points`, the paper's "candidate stage splitting points": a residual block's
output), which is kept. Chen's greedy variant cuts by bytes instead, a segment closing at
the first such point after its activations exceed a budget (``segment_bytes``).

Each other activation becomes one :class:`lmscore.plan.Recompute` per tensor of its buffer
that the backward pass reads: its backward readers read a clone, made by cloning the
tensor's producer and, walking back, the producers of every input that is not on the
device when the clones run (an activation dropped here, or a forward intermediate already
freed), down to tensors that are: the previous checkpoint, kept activations, variables,
constants and feeds. The clones start after a trigger near the first backward reader,
chosen as the per-tensor planners choose theirs (:func:`lmscore.planners.trigger_near`).
An activation is kept when its recomputation needs an op that
:func:`lmscore.plan.recompute_refusal` refuses, when no trigger fits, or when a backward
reader must read the original (:func:`lmscore.plan.keeps_tensor`: a pooling gradient
paired with its forward op).

How the rewrite makes two recomputations that clone one op: each
:class:`~lmscore.plan.Recompute` gets its own clones, named after its tensor
(``lms/recompute_<tensor>/<op>``), reading the clones of its own ``ops`` and the original
tensors otherwise; a clone of one recomputation is never read by another. So the plan
types cannot say "recompute the segment once and let the backward pass read every clone":
a recomputation that cloned the whole segment for its last activation would free none of
the others, whose readers would still read the originals. Of the expressions that free
every dropped activation, the one taken gives each its own chain back to the checkpoint,
started just before its own readers: the device holds about one chain at a time (less
than Chen's whole recomputed segment), and a segment's forward ops run again once per
dropped activation after them, about ``k / 2`` times for ``k`` activations a segment,
instead of once. The predicted time counts every clone. Recomputing each segment once
would need the rewrite to share clones between recomputations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ConfigError
from .ir import Graph, split_tensor
from .memory import Buffer, Simulation, simulate
from .order import BACKWARD, FORWARD, SHAPE_ONLY_OPS, Ordering, order
from .plan import Plan, Recompute, fingerprint, keeps_tensor
from .planners import MIN_FRACTION, recompute_chain, trigger_near
from .shapes import Sizes, resolve


@dataclass(frozen=True)
class Segment:
    """One run of activations in the executor's order.

    Attributes
    ----------
    activations : tuple of str
        The activations of the run, each named by the tensor that allocates its buffer,
        in the executor's order; the last is the checkpoint.
    checkpoint : str
        The activation kept at the run's end.
    bytes : int
        The run's activations' bytes.
    """

    activations: tuple[str, ...]
    checkpoint: str
    bytes: int


@dataclass(frozen=True)
class Checkpointing:
    """Chen's checkpointing of one step: its segments, and the plan that applies it.

    Attributes
    ----------
    plan : Plan
        Recomputations only, in the executor's order (no schedule, nothing pinned).
    segments : tuple of Segment
    activations : int
        ``n``: the activations segmented.
    recomputed : tuple of str
        The activations dropped (by the tensor that allocates each buffer).
    kept : tuple of (str, str)
        ``(activation, reason)`` for the activations that are not checkpoints but stay on
        the device.
    clones : int
        Ops the plan clones, over all its recomputations.
    """

    plan: Plan
    segments: tuple[Segment, ...]
    activations: int
    recomputed: tuple[str, ...]
    kept: tuple[tuple[str, str], ...]
    clones: int

    @property
    def checkpoints(self) -> tuple[str, ...]:
        """The segments' checkpoints, in the executor's order."""
        return tuple(s.checkpoint for s in self.segments)


def activations(graph: Graph, base: Simulation) -> tuple[Buffer, ...]:
    """The buffers Chen's segments are made of, in the executor's order.

    Those of ``base`` (the unplanned step's simulation) that a forward op allocates on the
    device, a backward op reads, and that hold at least :data:`MIN_FRACTION` of the
    transient peak.
    """
    cats = order(graph).categories
    smallest = _smallest(base)
    out = [b for b in base.buffers
           if not b.scratch and not b.host and b.bytes >= smallest
           and cats[b.producer] == FORWARD and any(_reads_values(graph, cats, r)
                                                   for r in b.readers)]
    return tuple(sorted(out, key=lambda b: b.first))


def cut_points(graph: Graph, base: Simulation, acts: Sequence[Buffer]) -> tuple[bool, ...]:
    """Which activations cut the forward pass: nothing made before them is read after.

    Chen et al. split a network where its graph narrows to one tensor (their "candidate
    stage splitting points": a residual block's output, not a convolution inside it, whose
    block input the shortcut still carries). A checkpoint elsewhere lets a recomputation
    walk back around it, through the shortcut, to an earlier checkpoint. Activation ``b``
    is a cut when no other buffer that a forward op allocated from the feeds before it is
    read by a forward op after it, apart from buffers too small to segment (a cast of the
    labels, a batch mean: a recomputation reads them if they are on the device and clones
    their producers if not, as any input).

    Parameters
    ----------
    graph : Graph
    base : Simulation
        The unplanned step's simulation.
    acts : sequence of Buffer
        :func:`activations` of ``base``.

    Returns
    -------
    tuple of bool
        One per activation.
    """
    ordering = order(graph)
    cats = ordering.categories
    pos = ordering.position
    adj = graph.adjacency
    fed = [False] * len(graph.ops)  # depends on a feed: an activation, not a parameter
    for i in ordering.topo:
        fed[i] = cats[i] == "input" or any(fed[p] for p in adj.preds[i])
    smallest = _smallest(base)
    # each forward buffer from the feeds: the position of its last forward reader
    open_at: list[tuple[int, int]] = []  # (first, last forward reader)
    for b in base.buffers:
        if (b.scratch or b.host or b.bytes < smallest or cats[b.producer] != FORWARD
                or not fed[b.producer]):
            continue
        last = max((pos[r] for r in b.readers if cats[r] == FORWARD), default=b.first)
        open_at.append((b.first, last))
    # a sweep: how many buffers are open over the step from position p to p + 1
    n = len(ordering.schedule)
    delta = [0] * (n + 1)
    for first, last in open_at:
        if last > first:
            delta[first] += 1
            delta[last] -= 1
    crossing, running = [0] * n, 0
    for p in range(n):
        running += delta[p]
        crossing[p] = running
    # at an activation's own position it is open itself (when a later op reads it)
    return tuple(crossing[b.first] <= 1 for b in acts)


def split(sizes: Sequence[int], segments: int | None = None,
          segment_bytes: int | None = None,
          cuts: Sequence[bool] | None = None) -> tuple[tuple[int, int], ...]:
    """Cut a run of activations into segments: ``(start, stop)`` index ranges.

    Parameters
    ----------
    sizes : sequence of int
        Bytes of each activation, in order.
    segments : int, optional
        How many segments of about equal counts; default ``round(sqrt(n))``.
    segment_bytes : int, optional
        Chen's greedy cut instead: a segment ends at the first activation that brings its
        bytes over ``segment_bytes``.
    cuts : sequence of bool, optional
        Which activations may end a segment (:func:`cut_points`); default all. A segment
        that should end at one that may not ends at the nearest that may (the earlier of
        two as near). The greedy cut closes a segment at the first that may.

    Returns
    -------
    tuple of (int, int)

    Examples
    --------
    >>> split([1] * 9)
    ((0, 3), (3, 6), (6, 9))
    >>> split([1] * 10, 4)
    ((0, 2), (2, 5), (5, 7), (7, 10))
    >>> split([1] * 9, cuts=[False, True, False, False, False, False, False, True, False])
    ((0, 2), (2, 8), (8, 9))
    >>> split([3, 1, 1, 4, 1], segment_bytes=4)
    ((0, 3), (3, 5))
    """
    n = len(sizes)
    if n == 0:
        return ()
    can = [True] * n if cuts is None else [bool(c) for c in cuts]
    can[-1] = True  # the last activation closes the last segment
    ends: list[int] = []  # the index after each segment
    if segment_bytes is not None:
        held = 0
        for k, size in enumerate(sizes):
            held += size
            if held > segment_bytes and can[k]:
                ends.append(k + 1)
                held = 0
    else:
        s = min(n, max(1, round(math.sqrt(n)) if segments is None else segments))
        for j in range(1, s + 1):
            lo = ends[-1] if ends else 0  # this segment's last activation: lo or after
            if lo >= n:
                break
            target = j * n // s - 1
            k = min((k for k in range(lo, n) if can[k]), key=lambda k: (abs(k - target), k))
            ends.append(k + 1)
    if not ends or ends[-1] != n:
        ends.append(n)
    return tuple(zip([0, *ends[:-1]], ends, strict=True))


def checkpointing(
    graph: Graph,
    batch_size: int,
    *,
    sizes: Sizes | None = None,
    segments: int | None = None,
    segment_bytes: int | None = None,
    base: Simulation | None = None,
) -> Checkpointing:
    """Chen's sqrt(n) checkpointing of ``graph``'s forward pass (see the module docstring).

    Parameters
    ----------
    graph : Graph
    batch_size : int
    sizes : Sizes, optional
        ``resolve(graph, batch_size)``, if the caller has it.
    segments : int, optional
        Number of segments; default ``round(sqrt(n))`` for ``n`` activations.
    segment_bytes : int, optional
        Chen's greedy variant: cut by bytes, a segment closing once its activations hold
        more than this (``segments`` is then ignored).
    base : Simulation, optional
        The unplanned step's simulation at this batch size, if the caller has it.

    Returns
    -------
    Checkpointing

    Raises
    ------
    ConfigError
        If ``segments`` or ``segment_bytes`` is out of range.
    """
    if segments is not None and (not isinstance(segments, int) or segments < 1):
        raise ConfigError(f"segments must be an integer >= 1, got {segments!r}")
    if segment_bytes is not None and (not isinstance(segment_bytes, int) or segment_bytes < 0):
        raise ConfigError(f"segment_bytes must be an integer >= 0, got {segment_bytes!r}")
    sizes = sizes or resolve(graph, batch_size)
    base = base or simulate(graph, batch_size, sizes=sizes)
    ordering = order(graph)
    acts = activations(graph, base)
    cuts = cut_points(graph, base, acts)
    runs = split([b.bytes for b in acts], segments, segment_bytes, cuts)
    segs = tuple(Segment(tuple(b.tensor for b in acts[a:z]), acts[z - 1].tensor,
                         sum(b.bytes for b in acts[a:z])) for a, z in runs)
    checkpoints = {s.checkpoint for s in segs}
    # every device buffer's tensors: where each lives, and over which positions
    alive: dict[str, tuple[int, int, str]] = {}
    for b in base.buffers:
        if not b.scratch and not b.host:
            for t in (b.tensor, *b.views):
                alive[t] = (b.first, b.last, b.tensor)
    dropped: set[str] = set()  # buffers freed so far, by their owner tensor
    recomputes: list[Recompute] = []
    recomputed: list[str] = []
    kept: list[tuple[str, str]] = []
    for b in acts:
        if b.tensor in checkpoints:
            continue
        made, reason = _recomputes(graph, ordering, b, alive, dropped | {b.tensor})
        if reason:
            kept.append((b.tensor, reason))
            continue
        dropped.add(b.tensor)
        recomputed.append(b.tensor)
        recomputes.extend(made)
    params = {"strategy": "checkpoint", "batch_size": batch_size, "activations": len(acts),
              "segments": len(segs)}
    if segment_bytes is not None:
        params["segment_bytes"] = segment_bytes
    plan = Plan(fingerprint(graph), params=params, recomputes=tuple(recomputes))
    return Checkpointing(plan, segs, len(acts), tuple(recomputed), tuple(kept),
                         sum(len(r.ops) for r in recomputes))


def chen_plan(
    graph: Graph,
    batch_size: int,
    *,
    sizes: Sizes | None = None,
    segments: int | None = None,
    segment_bytes: int | None = None,
) -> Plan:
    """The plan of :func:`checkpointing`: Chen's sqrt(n) checkpointing as recomputations.

    Evaluate it with :func:`lmscore.evaluate.evaluate_plan` and time it with
    :func:`lmscore.tune.plan_seconds`, as any plan.
    """
    return checkpointing(graph, batch_size, sizes=sizes, segments=segments,
                         segment_bytes=segment_bytes).plan


def _smallest(base: Simulation) -> int:
    """The bytes of the smallest buffer segmented: :data:`MIN_FRACTION` of the peak."""
    return max(1, int(MIN_FRACTION * base.transient_peak_bytes))


def _reads_values(graph: Graph, cats: Sequence[str], reader: int) -> bool:
    """Whether op ``reader`` is a backward op that reads its inputs' values.

    A shape-only reader (a gradient's ``Shape``) runs right after the producer, in the
    forward pass: it reads the original, as a near reader does.
    """
    return cats[reader] == BACKWARD and graph.ops[reader].type not in SHAPE_ONLY_OPS


def _recomputes(
    graph: Graph, ordering: Ordering, b: Buffer, alive: dict[str, tuple[int, int, str]],
    freed: set[str],
) -> tuple[list[Recompute], str]:
    """The recomputations that free buffer ``b`` from the backward pass, or why none can.

    One per tensor of the buffer that a forward op makes and a backward op reads (the
    buffer and its views, such as a ``Relu`` computed in place).
    """
    adj = graph.adjacency
    cats = ordering.categories
    pos = ordering.position
    schedule = ordering.schedule
    out: list[Recompute] = []
    for tensor in (b.tensor, *b.views):
        name, port = split_tensor(tensor)
        p = graph.index.get(name)
        if p is None:  # memory no tensor names: a pooling's workspace for its gradient
            return [], f"{tensor!r} is a kernel's workspace, no tensor of the graph"
        if cats[p] != FORWARD:
            continue  # a backward result written into the buffer: the clones' buffer takes it
        readers = [c for c in dict.fromkeys(adj.consumers.get((p, port), ()))
                   if _reads_values(graph, cats, c)]
        if not readers:
            continue
        for c in readers:
            if keeps_tensor(graph, c, p, port, exact=False):
                return [], f"{graph.ops[c].name!r} must read {tensor!r} itself"
        readers.sort(key=lambda c: pos[c])
        # a chain reaches back to the segment's checkpoint through every activation
        # dropped on the way (the planners' chains stop at MAX_CHAIN ops)
        chain = recompute_chain(graph, ordering, p, pos[readers[0]], alive, freed)
        if isinstance(chain, str):
            return [], chain
        ops = chain[0]
        far = tuple(graph.ops[c].name for c in readers)
        trigger = trigger_near(graph, ordering, tensor, far, schedule[pos[readers[0]] - 1])
        if trigger is None:
            return [], f"no trigger before {far[0]!r} can start the recomputation of {tensor!r}"
        out.append(Recompute(tensor, ops, far, trigger))
    return out, ""


__all__ = ["Checkpointing", "Segment", "activations", "checkpointing", "chen_plan", "split"]
