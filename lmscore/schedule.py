"""A memory-aware order of the device ops, and the graph that runs in it.

TensorFlow's executor runs ready ops first in, first out: on a GPU with one compute stream
the device runs them in the order :func:`lmscore.order.order` simulates. Where the step
has parallel branches (a ResNet block's shortcut and its main path, whose gradients run
side by side) that order interleaves them, and every branch's working set is on the
device at once. A swap or a recomputation frees a tensor while it waits; it cannot free
the tensors of two branches that the executor computes op by op in alternation.

:func:`memory_schedule` is a greedy list scheduler over the same buffers as the
simulation (XLA's list memory scheduler works the same way): among the ready ops it runs
the one that frees the most bytes net of what it allocates, the executor's order breaking
ties, so that a branch is finished before the next is started. A result written in place
into its input is charged as a new buffer unless its op reads that input last, since the
order decides which reader may overwrite it. :func:`scheduled` pins an
order with control edges (each op after the previous), which is what a plan with a
``schedule`` does before its swaps and recomputations (:func:`lmscore.rewrite.rewrite`),
so the simulation and the device both run it. On ResNet-50 at batch 800 (V100 16 GiB) no
plan fits in the executor's order (what cannot be freed there is 17.4 GiB of a 14.2 GiB
budget) and a swap plan in this order fits.
"""

from __future__ import annotations

import heapq
import weakref
from collections.abc import Sequence
from dataclasses import replace

from .ir import Graph, parent_of, shape_arithmetic, split_tensor
from .memory import _VIEW_TYPES, Simulation, _view_of
from .order import BACKWARD, FORWARD, SCHEDULED_AFTER, UPDATE, Ordering, order
from .shapes import Sizes, resolve


def chained_ops(graph: Graph, ordering: Ordering, schedule: Sequence[int]) -> list[int]:
    """The ops of ``schedule`` that a pinned order chains: those that run on the device.

    Swap-outs run on the host; feeds, variables and constants are there before the step
    starts; ops the step prunes never run; shape arithmetic (:func:`shape_arithmetic`)
    runs whenever its inputs are there.
    """
    from .rewrite import SWAP_OUT

    cats = _categories_by_origin(graph, ordering)
    return [
        i for i in schedule
        if ordering.needed[i] and graph.ops[i].attrs.get("_lms_role") != SWAP_OUT
        and (cats[i] in (FORWARD, BACKWARD, UPDATE) or graph.ops[i].attrs.get("_lms_role"))
        and not shape_arithmetic(graph, i)
    ]


def _categories_by_origin(graph: Graph, ordering: Ordering) -> Sequence[str]:
    """Each op's category; for a rewritten step (:func:`lmscore.ir.parent_of`), its original's.

    A rewrite keeps the original's ops by name and appends swaps and clones: an op stays
    what it was, and a clone is what it clones (what is neither gets ""; swap ops have
    their ``_lms_role``). Classifying the rewritten step again took 0.45 s of the 0.7 s
    a tuned plan's evaluation took on the zoo's EfficientNetB0 (14k ops).
    """
    parent = parent_of(graph)
    if parent is None:
        return ordering.categories
    known = _categories_by_origin(parent, order(parent))
    index = parent.index
    out = []
    for op in graph.ops:
        j = index.get(op.name)
        if j is None:
            j = index.get(op.attrs.get("_lms_clone_of", ""))
        out.append(known[j] if j is not None else "")
    return out


#: Each graph's last scheduled step: checking a plan, rewriting it and planning it ask for
#: the same one (graphs are immutable, and the same object keeps its cached ordering).
_SCHEDULED: weakref.WeakKeyDictionary[Graph, tuple[tuple[str, ...], Graph]] = (
    weakref.WeakKeyDictionary())


def scheduled(graph: Graph, names: Sequence[str]) -> Graph:
    """``graph`` with each op of ``names`` made to wait for the previous one (control edges).

    The names must be in an order the graph allows (:func:`lmscore.plan.check_plan`
    checks a plan's), so the edges close no cycle::

        before:  a -> b ;  a -> c        (b and c ready together, either may run first)
        after:   a -> b ;  a -> c ; b ->^ c

    Ops TensorFlow may merge into one kernel (:attr:`lmscore.ir.Graph.siblings`) are
    chained as one unit: the earlier move down beside the last, what waits for them moves
    after the unit, and each waits for the op before the unit and is waited for by the op
    after it, with no edge between them. A chain through other ops between two of them
    would make the merged kernel wait for itself::

        names:   x, b, d, c, y          (b and c siblings, d does not need b)
        edges:   x ->^ d ->^ b ; d ->^ c ; b ->^ y ; c ->^ y
    """
    names = tuple(names)
    last = _SCHEDULED.get(graph)
    if last is not None and last[0] == names:
        return last[1]
    ops = list(graph.ops)
    idx = graph.index
    # (a plan's stored schedule may name them: it was saved before they left the chain)
    units = _units(graph, [n for n in names if not shape_arithmetic(graph, idx[n])])
    # each unit waits for the one before it, and for the shape reads left out before it
    waits: list[list[str]] = [[], *map(list, units[:-1])] if units else []
    for unit, reader in _readers_left_out(graph, units):
        waits[unit].append(reader)
    for before, unit in zip(waits, units, strict=True):
        for b in unit:
            j = idx[b]
            op = ops[j]
            new = tuple(a for a in before if a not in op.control_inputs)
            if new:
                ops[j] = replace(op, control_inputs=(*op.control_inputs, *new), attrs={
                    **op.attrs, SCHEDULED_AFTER: (*op.attrs.get(SCHEDULED_AFTER, ()), *new)})
    step = graph.derive(ops, source=graph.source)
    _SCHEDULED[graph] = (names, step)
    return step


def _readers_left_out(graph: Graph, units: Sequence[tuple[str, ...]]
                      ) -> list[tuple[int, int]]:
    """``(unit, op)``: shape arithmetic reading a computed tensor, and the unit that waits for it.

    Left out of the chain, such an op runs whenever the executor gets to it, and until it
    runs, the tensor it reads stays alive: a dilated convolution's gradient ``ShapeN``
    read the 2 MB ``SpaceToBatchND`` output, ran three kernels late in one run of eight,
    and its tuned plan measured 1.054 of the device. So the chain waits for it once its
    inputs are there: the unit after the last chained op it depends on waits for it (a
    one-way edge; nothing of the chain runs before it that did not already, so no cycle,
    and nothing waits for itself when Grappler folds the op into a constant). Reads of
    shape arithmetic itself hold a few bytes and stay free.
    """
    pos = {graph.index[n]: k for k, unit in enumerate(units) for n in unit}
    if not pos:
        return []
    ordering = order(graph)
    needed, adj, ops = ordering.needed, graph.adjacency, graph.ops
    after = [-1] * len(ops)  # the last chain unit an op depends on (itself included)
    out = []
    for i in ordering.topo:
        last = max((after[p] for p in adj.preds[i]), default=-1)
        after[i] = pos.get(i, last)
        if (i not in pos and needed[i] and 0 <= last < len(units) - 1
                and shape_arithmetic(graph, i)
                and any(not shape_arithmetic(graph, p) and ops[p].inputs
                        for p, _ in adj.data_in[i])):
            out.append((last + 1, ops[i].name))
    return out


def _units(graph: Graph, names: Sequence[str]) -> list[tuple[str, ...]]:
    """``names`` in chain units: single ops, and groups of siblings brought together.

    A group is the bias and filter gradients of one gradient tensor
    (:attr:`lmscore.ir.Graph.siblings`). From its first member to its last, the ops that
    wait for a member move after the group and the members move together; every other op
    keeps its place. Where a member itself waits for one of the ops that move, the group
    stays apart (:func:`lmscore.ir.lint` then names the two ops).
    """
    sib = graph.siblings
    idx = graph.index
    seq = [idx[n] for n in names]
    if not sib:
        return [(n,) for n in names]
    preds = graph.adjacency.preds
    at = {i: n for n, i in enumerate(seq)}  # kept up to date as groups move
    # What an op waits for among the chained ops, also through ops left out of the chain
    # (a variable's read after an update): a direct-predecessor check let an optimizer
    # step move ahead of the update its read waits for, and the chain closed a cycle
    reached: dict[int, frozenset[int]] = {}

    def waits_for(i: int) -> frozenset[int]:
        stack = [p for p in preds[i] if p not in at and p not in reached]
        while stack:
            q = stack[-1]
            todo = [p for p in preds[q] if p not in at and p not in reached]
            if todo:
                stack += todo
                continue
            stack.pop()
            reached[q] = frozenset(p for p in preds[q] if p in at).union(
                *(reached[p] for p in preds[q] if p not in at))
        return frozenset(p for p in preds[i] if p in at).union(
            *(reached[p] for p in preds[i] if p not in at))
    unit_of: dict[int, int] = {}  # member -> its group's first member
    k = 0
    while k < len(seq):
        head = seq[k]
        if head not in sib or head in unit_of:
            k += 1
            continue
        group = {head, *sib[head]}
        for m in sib[head]:
            group.update(sib[m])
        where = sorted(at[m] for m in group if m in at)
        if where[0] < k or not any(m in at for m in sib[head]):
            k += 1
            continue
        last = where[-1]
        early, members, late = [], [head], []
        moved: set[int] = set()
        for i in seq[k + 1:last + 1]:
            if i in group:
                if any(p in moved for p in waits_for(i)):
                    break  # a member waits for an op that would move: the group stays apart
                members.append(i)
            elif any(p in moved or p in group for p in waits_for(i)):
                moved.add(i)
                late.append(i)
            else:
                early.append(i)
        else:
            seq[k:last + 1] = [*early, *members, *late]
            at.update((i, n) for n, i in enumerate(seq[k:last + 1], k))
            unit_of.update(dict.fromkeys(members, head))
            continue
        k += 1
    units: list[tuple[str, ...]] = []
    ops = graph.ops
    last_unit = None
    for i in seq:
        unit = unit_of.get(i)
        if unit is not None and unit == last_unit:
            units[-1] = (*units[-1], ops[i].name)
        else:
            units.append((ops[i].name,))
        last_unit = unit
    return units


def memory_schedule(graph: Graph, sim: Simulation, sizes: Sizes | None = None) -> tuple[str, ...]:
    """The device ops of ``graph`` in a memory-aware order (see the module docstring).

    Parameters
    ----------
    graph : Graph
    sim : Simulation
        The step simulated in the executor's order: its buffers (who allocates them and
        who reads them) and their sizes drive the choice.
    sizes : Sizes, optional
        ``sim``'s sizes (resolved again if not given).

    Returns
    -------
    tuple of str
        The names of the ops to chain, in order (:func:`chained_ops` of the order).
    """
    ordering = order(graph)
    adj = graph.adjacency
    n = len(graph.ops)
    pos = ordering.position
    if sizes is None:
        sizes = resolve(graph, sim.batch_size)
    sizes_, producers, reads = _buffer_model(graph, sizes, sim)
    alloc = [0] * n
    for k, p in enumerate(producers):
        alloc[p] += sizes_[k]
    left = [len(r) for r in reads]
    reads_of: list[list[int]] = [[] for _ in range(n)]
    for k, rs in enumerate(reads):
        for r in rs:
            reads_of[r].append(k)
    # what an op frees when it runs now: the buffers it is the last unscheduled reader of
    frees = [sum(sizes_[k] for k in reads_of[i] if left[k] == 1) for i in range(n)]
    indeg = [len(adj.preds[i]) for i in range(n)]
    heap = [(alloc[i] - frees[i], pos[i], i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    done = [False] * n
    out: list[int] = []
    while heap:
        key, _, i = heapq.heappop(heap)
        if done[i] or key != alloc[i] - frees[i]:
            continue  # a stale entry: the op was run, or its key has improved since
        done[i] = True
        out.append(i)
        for k in reads_of[i]:
            left[k] -= 1
            if left[k] == 1:  # its one reader left now frees it
                for r in reads[k]:
                    if not done[r]:
                        frees[r] += sizes_[k]
                        if indeg[r] == 0:  # ready: its entry's key has improved
                            heapq.heappush(heap, (alloc[r] - frees[r], pos[r], r))
        for s in adj.succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (alloc[s] - frees[s], pos[s], s))
    return tuple(graph.ops[i].name for i in chained_ops(graph, ordering, out))


def _buffer_model(graph: Graph, sizes: Sizes, sim: Simulation
                  ) -> tuple[list[int], list[int], list[tuple[int, ...]]]:
    """The device buffers as an order other than ``sim``'s would have them.

    A view shares its source's buffer in any order; a result written in place into its
    input (``forward_input_or_allocate_output``) does only where its op is the input's
    last reader, which is what the order decides. So each in-place result of ``sim`` is a
    buffer of its own here: an op that would overwrite its input is charged its output
    unless it runs last of that input's readers (then what it frees pays for it)::

        g read by m (in place in the executor's order, its last reader) and by a:
        run m before a: m allocates |g|, a frees g         (m's key +|g|, not 0)
        run a before m: a allocates, m frees g into its own result (m's key 0)

    Returns
    -------
    sizes, producers : list of int
        Each buffer's bytes and the op that allocates it.
    readers : list of tuple of int
        Each buffer's readers (of any of its tensors).
    """
    index = graph.index
    consumers = graph.adjacency.consumers
    ops = graph.ops
    of: dict[tuple[int, int], int] = {}
    nbytes: list[int] = []
    producers: list[int] = []
    readers: list[set[int]] = []
    for b in sim.buffers:
        if b.scratch or b.host:
            continue
        first = len(nbytes)
        seen: set[int] = set()
        for name in (b.tensor, *b.views):  # a view after its source (schedule order)
            op, port = split_tensor(name)
            i = index.get(op)
            if i is None:  # memory no tensor names: a pooling's workspace for its gradient
                nbytes.append(b.bytes)
                producers.append(b.producer)
                readers.append(set())
                break
            t = (i, port)
            src = _view_of(graph, sizes, i, port) if ops[i].type in _VIEW_TYPES else None
            k = of.get(src) if src is not None else None
            if k is None:
                k = len(nbytes)
                nbytes.append(b.bytes)
                producers.append(i)
                readers.append(set())
            of[t] = k
            cs = consumers.get(t, ())
            readers[k].update(cs)
            seen.update(cs)
        # readers the simulation adds beyond the data edges (a pooling's gradient reads
        # the forward op's buffer) stay with the buffer's first tensor
        readers[first].update(r for r in b.readers if r not in seen)
    return nbytes, producers, [tuple(r) for r in readers]


__all__ = ["chained_ops", "memory_schedule", "scheduled", "shape_arithmetic"]
