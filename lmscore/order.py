"""Categorized topological ordering (CTO): levels, categories and edge distances.

Levels come from Kahn peeling over data and control edges: level 0 holds the ops with no
predecessors, level k the ops whose predecessors all lie in levels < k. Ops in one level
are independent. The distance of an edge is ``level(consumer) - level(producer)``.

Categories are derived from the structure of the step, never from names:

- ``input``: the caller's feeds (non-resource placeholders, iterator reads);
- ``persistent``: variables, constants and plain reads of them;
- ``update``: ops that write variables, and the optimizer arithmetic whose only use is to
  feed those writes and that reads optimizer state;
- ``forward``: the ancestors of the loss, where the loss is the floating-point op that
  depends on the inputs but feeds no variable write through its values (gradients are
  seeded by a constant or a shape-only op such as ``OnesLike``);
- ``backward``: everything else that leads to the writes: the gradient computation.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, compress

from .errors import GraphError
from .ir import (
    FEED_OPS,
    VARIABLE_OPS,
    Graph,
    Op,
    gc_paused,
    gradient_input,
    op_signatures,
    parent_of,
    waited_for,
)

INPUT, PERSISTENT, FORWARD, BACKWARD, UPDATE = (
    "input", "persistent", "forward", "backward", "update",
)
#: Display order of the categories (one lane each in the ordering view).
CATEGORIES = (INPUT, PERSISTENT, FORWARD, BACKWARD, UPDATE)

#: Ops whose outputs depend only on the shape of their inputs, not on their values.
SHAPE_ONLY_OPS = frozenset({
    "Shape", "ShapeN", "Size", "Rank", "OnesLike", "ZerosLike", "BroadcastGradientArgs",
    "VariableShape", "TensorListLength", "TensorListElementShape",
})
#: Ops that stand for a step's results when nothing reads them (``tf.function`` returns
#: each result through an ``Identity``).
OUTPUT_OPS = frozenset({"Identity", "IdentityN", "_Retval"})


def step_results(graph: Graph) -> list[int]:
    """Indices of the ops that stand for the step's results: :data:`OUTPUT_OPS` nothing reads."""
    succs = graph.adjacency.succs
    return [i for i, op in enumerate(graph.ops) if op.type in OUTPUT_OPS and not succs[i]]


#: Ops that read a resource without writing it.
RESOURCE_READS = frozenset({
    "ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape",
    "VarIsInitializedOp", "DestroyResourceOp", "_ReadVariablesOp",
})
_ITERATOR_OPS = frozenset({"IteratorGetNext", "IteratorGetNextSync", "_Recv", "_HostRecv"})
#: Op types that may be feeds, state or plain reads of state (most ops are none of them).
_STATE_TYPES = FEED_OPS | _ITERATOR_OPS | VARIABLE_OPS | RESOURCE_READS | {
    "Const", "Identity", "IdentityN"}
_FLOATS = frozenset({"float", "double", "half", "bfloat16"})
_ELEMENTWISE = frozenset({"Mul", "RealDiv", "Div", "Neg", "Sub", "AddV2", "Add", "Cast"})


@dataclass(frozen=True)
class Ordering:
    """Result of :func:`order`.

    Attributes
    ----------
    levels : tuple of int
        Level of each op (indexed like ``graph.ops``).
    by_level : tuple of tuple of int
        Op indices of each level, in source order.
    topo : tuple of int
        A topological order of all ops (level by level, source order within a level).
    categories : tuple of str
        Category of each op.
    loss : str or None
        Name of the op identified as the loss, if the graph trains.
    schedule : tuple of int
        The order in which TensorFlow's executor runs the ops when it runs them one at a
        time: first-in first-out in the order ops become ready, a consumer becoming ready
        when its last producer finishes (consumers taken in source order).
    graph : Graph
        The graph ordered.
    """

    levels: tuple[int, ...]
    by_level: tuple[tuple[int, ...], ...]
    topo: tuple[int, ...]
    schedule: tuple[int, ...]
    graph: Graph = field(repr=False, compare=False)

    @functools.cached_property
    def position(self) -> tuple[int, ...]:
        """Position of each op in :attr:`schedule`."""
        pos = [0] * len(self.schedule)
        for k, i in enumerate(self.schedule):
            pos[i] = k
        return tuple(pos)

    @functools.cached_property
    def reach(self) -> tuple[tuple[int, int, int], ...]:
        """``(levels, op, port)`` of every output the step computes and something reads.

        ``levels``: how far past its producer's level its last reader runs, over every
        reader (those the step prunes too). Farthest first, then by op and port: the
        tensors a distance threshold keeps are a prefix, whatever the threshold.
        """
        lv = self.levels
        needed = self.needed
        out = [(max([lv[c] for c in readers]) - lv[i], i, port)
               for (i, port), readers in self.graph.adjacency.consumers.items() if needed[i]]
        out.sort(key=lambda t: (-t[0], t[1], t[2]))
        return tuple(out)

    @functools.cached_property
    def needed(self) -> tuple[bool, ...]:
        """Whether each op leads to a variable write, the loss or an output.

        A ``tf.function`` runs its outputs and its stateful ops and prunes the rest (a
        gradient nobody applies, the shape of a dead branch) before it runs a step: such
        ops never run, so they allocate nothing, and an edge into one orders nothing. The
        outputs are the ``Identity`` ops nothing reads (:data:`OUTPUT_OPS`), as
        ``tf.function`` names its results.
        """
        seeds = list(map(self.graph.index.__getitem__, self._seeds))
        if not seeds:  # not a training step: nothing tells what is pruned
            return (True,) * len(self.graph.ops)
        return tuple(waited_for(self.graph, seeds + list(step_results(self.graph))))

    @functools.cached_property
    def _seeds(self) -> tuple[str, ...]:
        """The updates and the loss, by name: what :attr:`needed` is walked back from.

        A rewritten step keeps its original's ops by name (:func:`lmscore.ir.parent_of`)
        and adds swaps, clones and control edges, none of them an update or the loss: its
        seeds are its original's, and classifying every op of it again (a third of the
        time of re-simulating an edited plan) is not needed.
        """
        parent = parent_of(self.graph)
        if parent is not None:
            return order(parent)._seeds
        ops = self.graph.ops
        names = tuple([ops[i].name for i, c in enumerate(self.categories) if c == UPDATE])
        return names + ((self.loss,) if self.loss is not None else ())

    @property
    def num_levels(self) -> int:
        """Number of levels."""
        return len(self.by_level)

    # Categories are computed on first use: the simulator never needs them, and a plan
    # edited in the web app re-orders the rewritten graph on every edit.
    @functools.cached_property
    def _classified(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return _categories(self.graph, self.topo)

    @property
    def categories(self) -> tuple[str, ...]:
        """Category of each op."""
        return self._classified[0]

    @property
    def loss(self) -> str | None:
        """Name of the op identified as the loss, if the graph trains."""
        return self._classified[1][0] if self._classified[1] else None

    @property
    def losses(self) -> tuple[str, ...]:
        """Every loss the step differentiates, :attr:`loss` first.

        A step with several gradient tapes (a GAN's generator and discriminator losses,
        SAM's second pass, micro-batches accumulated) has one loss per tape; the step's
        loss is the one it returns, else the first computed.
        """
        return self._classified[1]


def levels(graph: Graph) -> tuple[int, ...]:
    """Kahn level of every op over data and control edges.

    Raises
    ------
    GraphError
        If the graph has a cycle (the message names its ops).

    Examples
    --------
    >>> from lmscore.ir import Graph, Op, TensorSpec
    >>> f = (TensorSpec("float", (2,)),)
    >>> g = Graph((Op("a", "Placeholder", outputs=f), Op("b", "Relu", inputs=("a:0",), outputs=f),
    ...            Op("c", "AddV2", inputs=("a:0", "b:0"), outputs=f)))
    >>> levels(g)
    (0, 1, 2)
    """
    return _levels(graph)[0]


def _levels(graph: Graph) -> tuple[tuple[int, ...], tuple[int, ...]]:
    adj = graph.adjacency
    preds, succs = adj.preds, adj.succs
    n = len(graph.ops)
    indeg = list(map(len, preds))
    level = [0] * n
    # First in, first out: the list is the queue, walked while it grows.
    topo = [i for i, d in enumerate(indeg) if not d]
    for i in topo:
        li = level[i] + 1
        for s in succs[i]:
            if level[s] < li:
                level[s] = li
            indeg[s] -= 1
            if not indeg[s]:
                topo.append(s)
    if len(topo) != n:
        from .ir import _describe_cycle

        raise GraphError(f"{graph.source}: {_describe_cycle(graph, indeg)}")
    return tuple(level), tuple(topo)


@functools.lru_cache(maxsize=8)
@gc_paused()
def order(graph: Graph) -> Ordering:
    """Compute the categorized topological ordering of ``graph``.

    Parameters
    ----------
    graph : Graph

    Returns
    -------
    Ordering
        Levels, ops per level, a topological order and categories.
    """
    lv, fifo = _levels(graph)
    by_level: list[list[int]] = [[] for _ in range(max(lv, default=-1) + 1)]
    for i, lvl in enumerate(lv):
        by_level[lvl].append(i)
    topo = tuple(chain.from_iterable(by_level))
    return Ordering(lv, tuple(map(tuple, by_level)), topo, fifo, graph)


def replayed(ordering: Ordering, executed: Sequence[str]) -> Ordering:
    """``ordering`` with the schedule of a run whose executor started ops in ``executed``.

    TensorFlow's executor draws its order of ready ops anew in each session (see
    :mod:`lmscore.measure`), so a measured peak belongs to one order; replaying that order
    separates what the memory model gets right from what the order changes.

    Parameters
    ----------
    ordering : Ordering
        :func:`order` of the graph.
    executed : sequence of str
        Op names in the order they ran (:attr:`lmscore.measure.Measurement.executed`).
        Ops not named (constants, pruned ops) run as soon as they are ready.

    Returns
    -------
    Ordering
        The same levels and categories; ``schedule`` is the topological order that runs
        every ready op by its rank in ``executed``.

    Examples
    --------
    >>> from lmscore.ir import Graph, Op, TensorSpec
    >>> f = (TensorSpec("float", (4,)),)
    >>> g = Graph((Op("x", "Placeholder", outputs=f), Op("a", "Relu", inputs=("x:0",), outputs=f),
    ...            Op("b", "Tanh", inputs=("x:0",), outputs=f)))
    >>> order(g).schedule, replayed(order(g), ["x", "b", "a"]).schedule
    ((0, 1, 2), (0, 2, 1))
    """
    graph = ordering.graph
    rank = {name: k for k, name in enumerate(executed)}
    key = [rank.get(op.name, -1) for op in graph.ops]
    adj = graph.adjacency
    indeg = [len(p) for p in adj.preds]
    ready = [(key[i], i) for i in range(len(indeg)) if indeg[i] == 0]
    heapq.heapify(ready)
    schedule: list[int] = []
    while ready:
        i = heapq.heappop(ready)[1]
        schedule.append(i)
        for s in adj.succs[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (key[s], s))
    return replace(ordering, schedule=tuple(schedule))


def distance(ordering: Ordering, producer: int, consumer: int) -> int:
    """Level distance of the edge ``producer -> consumer`` (op indices)."""
    return ordering.levels[consumer] - ordering.levels[producer]


def _is_write(op_type: str, input_dtypes: list[str], n_outputs: int = 1) -> bool:
    """Whether an op writes a resource it reads.

    A stateful op with resource inputs and no outputs can only act on those resources:
    a functional ``If`` applying the update (loss scaling skips non-finite steps that
    way) is one.
    """
    return _writes(op_type, "resource" in input_dtypes, not n_outputs)


@functools.lru_cache(maxsize=1024)
def _writes(op_type: str, reads_resource: bool, no_outputs: bool) -> bool:
    """:func:`_is_write` by what it depends on (memoized: a step has few op types)."""
    sig = op_signatures().get(op_type)
    if op_type in RESOURCE_READS:
        return False
    if sig is not None and any(a.endswith("&") for a in sig["in"]):
        return bool(sig["stateful"]) or op_type.startswith(("Assign", "Apply", "Scatter"))
    return reads_resource and (
        op_type.startswith(("Assign", "ResourceApply", "ResourceSparseApply", "ResourceScatter"))
        or (sig is not None and sig["stateful"] and (not sig["out"] or no_outputs))
    )


#: Attribute of an op made to wait for others only to fix the order ops run in
#: (:func:`lmscore.schedule.scheduled`): the names of those others.
SCHEDULED_AFTER = "_lms_after"


def _unscheduled(graph: Graph) -> Graph:
    """``graph`` without the control edges that only fix its order (:data:`SCHEDULED_AFTER`).

    What an op is (forward, backward, update) does not change with the order it runs in.
    """
    for op in graph.ops:
        if SCHEDULED_AFTER in op.attrs:
            break
    else:
        return graph
    ops = []
    for op in graph.ops:
        after = set(op.attrs.get(SCHEDULED_AFTER, ()))
        if after:
            op = replace(op, control_inputs=tuple(c for c in op.control_inputs
                                                  if c not in after))
        ops.append(op)
    return graph.derive(ops, source=graph.source)


@gc_paused()
def _categories(
    graph: Graph, topo: tuple[int, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    graph = _unscheduled(graph)
    ops = graph.ops
    adj = graph.adjacency
    n = len(ops)
    cat: list[str | None] = [None] * n
    data_in = adj.data_in
    succs = adj.succs
    types = [op.type for op in ops]
    readers = adj.readers

    # One pass in topological order. Feeds, state and reads of state. Value flow from the
    # feeds (from_input: shape-only ops cut it, their outputs ignore values) and dependence
    # on the feeds through any data edge, shapes included (from_data). Writes: of a few op
    # types (found once each), and of some of them only when they read a resource.
    from_input = [False] * n
    from_data = [False] * n
    write = [False] * n
    writers = {t for t in set(types) if _writes(t, True, True) or _writes(t, True, False)}
    for i in topo:
        t = types[i]
        ins = data_in[i]
        if t in _STATE_TYPES:
            if t in FEED_OPS:
                outs = ops[i].outputs
                cat[i] = PERSISTENT if outs and outs[0].dtype == "resource" else INPUT
            elif t in _ITERATOR_OPS:
                cat[i] = INPUT
            elif t in VARIABLE_OPS or t == "Const":
                cat[i] = PERSISTENT
            elif t in RESOURCE_READS and t != "ResourceGather" and all(
                cat[p] == PERSISTENT for p, _ in ins
            ):
                cat[i] = PERSISTENT
            elif t in ("Identity", "IdentityN") and ins and all(
                cat[p] == PERSISTENT for p, _ in ins
            ):
                cat[i] = PERSISTENT
        c = cat[i]
        if c is None:
            values = t not in SHAPE_ONLY_OPS
            for p, _ in ins:  # from_input[p] implies from_data[p]
                if from_data[p]:
                    from_data[i] = True
                    if not values:
                        break
                    if from_input[p]:
                        from_input[i] = True
                        break
        elif c == INPUT:
            from_input[i] = from_data[i] = True
        if t in writers:
            resource = any(ops[p].outputs[port].dtype == "resource" for p, port in ins)
            write[i] = _writes(t, resource, not ops[i].outputs)

    def reads_state(i: int) -> bool:
        """Whether op ``i`` reads a resource or a read of one: computes on state.

        An embedding's lookup (``ResourceGather``) is an activation, not a read of state:
        the first layer's weight gradient reads it.
        """
        return any(ops[p].outputs[port].dtype == "resource" or (
            types[p] in RESOURCE_READS and types[p] != "ResourceGather")
            for p, port in data_in[i])

    # What a gradient kernel reads is the forward or the backward pass, never optimizer
    # arithmetic, even where every later use is a write (a tf.compat.v1 optimizer applies
    # the gradients themselves, so the seed's constant arithmetic leads only to writes).
    fused = {t for t in set(types) if t.startswith(FUSED_APPLIES)}
    applied = {
        g[0] for c in (range(n) if fused else ())
        if types[c] in fused and (g := applied_gradient(graph, c)) is not None
    }
    # In reverse: whether every path from an op ends in a write (only_writes), and
    # whether it leads to what a gradient kernel reads (to_kernel).
    only_writes = [False] * n
    to_kernel = [False] * n
    for i in reversed(topo):
        if cat[i] is not None:
            continue
        if write[i]:
            only_writes[i] = True
            continue
        succ = succs[i]
        if succ:
            for s in succ:
                if not only_writes[s]:
                    break
            else:
                only_writes[i] = True
        if i in applied or types[i] in GRADIENT_PORTS:
            to_kernel[i] = True
        else:
            for c in readers[i]:
                if to_kernel[c]:
                    to_kernel[i] = True
                    break
    update = [False] * n
    for i in topo:
        if cat[i] is not None:
            continue
        ins = data_in[i]
        if only_writes[i] and not to_kernel[i]:
            update[i] = (
                write[i]
                or not from_data[i]
                # a matrix product of a weight is a layer's, or the gradient of its input
                # (the first layer's, which only an embedding's update reads), never an
                # optimizer's arithmetic, which is elementwise
                or (reads_state(i) and types[i] not in _PRODUCTS)
                or all(update[p] or cat[p] == PERSISTENT for p, _ in ins)
                # lr * grad: an elementwise scaling by state that feeds the write directly
                or (
                    types[i] in _ELEMENTWISE
                    and any(cat[p] == PERSISTENT for p, _ in ins)
                    and all(write[s] for s in succs[i])
                )
            )
        # control-only joins after writes (the step's final NoOp); no data input reads
        # one, so the rule above never waits for this one
        if not update[i] and not ins and not ops[i].outputs and any(
            update[p] for p in adj.preds[i]
        ):
            update[i] = True
        if update[i]:  # (no later op of this pass asks whether it is persistent)
            cat[i] = UPDATE

    losses: list[int] = []
    seeds: list[int] = []
    from_seed = [False] * n
    meets_seed = [False] * n
    gradient_side = [False] * n
    trains = any(update)
    if trains:
        seeds, losses, gradient_side = _gradient_structure(
            graph, topo, cat, from_input, only_writes)
        if not seeds:  # no gradient kernel to tell the seed by: the widest constant 1
            found = _find_seed(graph, topo, cat)
            seeds = [found] if found is not None else []
        if not losses and seeds and ops[seeds[0]].type == "OnesLike" and adj.data_in[seeds[0]]:
            losses = [adj.data_in[seeds[0]][0][0]]
        if seeds:
            for seed in seeds:
                from_seed[seed] = True
            for i in topo:
                if cat[i] is None and not from_seed[i]:
                    for p, _ in data_in[i]:
                        if from_seed[p]:
                            from_seed[i] = True
                            break
    # In reverse: which ops feed a write through their values (the forward and backward
    # passes), and the partial gradients computed before they meet the seed (of a loss's
    # denominator, of a broadcast's shape), which lead into the backward pass.
    feeds_write = [False] * n
    for i in reversed(topo):
        rs = readers[i]
        if not rs:
            continue
        if cat[i] is None:
            for c in rs:
                if update[c] or (feeds_write[c] and types[c] not in SHAPE_ONLY_OPS):
                    feeds_write[i] = True
                    break
        if seeds:
            for c in rs:
                if from_seed[c] or meets_seed[c]:
                    meets_seed[i] = True
                    break
    if trains:
        # Values computed from the forward pass only to be stored (BatchNorm's moving
        # statistics, a metric's running total) are updates of state, not gradients; the
        # loss and what it is computed from are not, even where the step only stores
        # the loss (Keras' fit: the gradient is seeded without reading it).
        on_loss = _closure(graph, losses, cat, down=False)
        for i in topo:
            if cat[i] is None and only_writes[i] and not (
                from_seed[i] or gradient_side[i] or meets_seed[i] or on_loss[i]
            ):
                if seeds or losses:
                    cat[i] = UPDATE
        if not losses:
            candidates = [
                i for i in topo
                if cat[i] is None and from_input[i] and not feeds_write[i] and not from_seed[i]
                and ops[i].outputs and ops[i].outputs[0].dtype in _FLOATS
            ]
            apart = [i for i in candidates if not meets_seed[i]]
            picked = _pick_loss(graph, apart or candidates)
            losses = [picked] if picked is not None else []
    forward = [False] * n
    if losses:
        stack = list(losses)
        for i in losses:
            forward[i] = True
        while stack:
            i = stack.pop()
            for p, _ in adj.data_in[i]:
                if not forward[p] and cat[p] is None:
                    forward[p] = True
                    stack.append(p)
    for i in topo:
        if cat[i] is not None:
            continue
        if not losses or forward[i]:
            cat[i] = FORWARD
        elif gradient_side[i] or feeds_write[i] or from_seed[i] or meets_seed[i] or any(
            cat[p] == BACKWARD for p, _ in adj.data_in[i]
        ):
            cat[i] = BACKWARD
        else:
            cat[i] = FORWARD  # outputs and metrics that read the forward pass
    if trains:
        # No optimizer feeds a matrix product or a gradient kernel: an op taken for
        # optimizer arithmetic (a gradient scaled by state) that a backward product reads
        # is the backward pass's (the gradient through Keras Attention's learned scale,
        # (batch, 32, 32), was called update), and so is what only such ops read.
        moved = [False] * n
        for i in reversed(topo):
            if cat[i] == UPDATE and not write[i] and readers[i] and any(
                    moved[c] or (cat[c] == BACKWARD and (types[c] in _PRODUCTS
                                                          or types[c] in GRADIENT_PORTS))
                    for c in readers[i]):
                cat[i] = BACKWARD
                moved[i] = True
    return tuple(c or FORWARD for c in cat), tuple(ops[i].name for i in losses)


#: Matrix products (:func:`_categories`: never optimizer arithmetic).
_PRODUCTS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"})


#: Gradient kernels and the inputs that carry the incoming gradient; their other
#: floating-point inputs are values of the forward pass.
GRADIENT_PORTS: dict[str, tuple[int, ...]] = {
    **dict.fromkeys(("ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "SoftplusGrad",
                     "SoftsignGrad", "LeakyReluGrad", "BiasAddGrad", "BiasAddGradV1",
                     "FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3",
                     "ResizeBilinearGrad", "ResizeNearestNeighborGrad", "ResizeBicubicGrad",
                     "LRNGrad", "GeluGrad"), (0,)),
    **dict.fromkeys(("TanhGrad", "SigmoidGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad",
                     "InvGrad", "AvgPoolGrad", "AvgPool3DGrad"), (1,)),
    **dict.fromkeys(("Conv2DBackpropFilter", "Conv2DBackpropInput", "Conv3DBackpropFilter",
                     "Conv3DBackpropInput", "Conv3DBackpropFilterV2", "Conv3DBackpropInputV2",
                     "DepthwiseConv2dNativeBackpropFilter",
                     "DepthwiseConv2dNativeBackpropInput", "MaxPoolGrad", "MaxPoolGradV2",
                     "MaxPool3DGrad", "MaxPoolGradWithArgmax"), (2,)),
    "StridedSliceGrad": (4,),
}


#: Fused optimizer kernels (``tf.compat.v1.train``, legacy Keras): each updates a
#: variable and its slots from one gradient input.
FUSED_APPLIES = ("ResourceApply", "ResourceSparseApply")


def applied_gradient(graph: Graph, c: int) -> tuple[int, int] | None:
    """The gradient tensor a fused optimizer kernel (:data:`FUSED_APPLIES`) applies.

    Its input named ``grad`` by the op's definition (:func:`lmscore.ir.gradient_input`).
    """
    if not graph.ops[c].type.startswith(FUSED_APPLIES):
        return None
    k = gradient_input(graph.ops[c].type)
    ins = graph.adjacency.data_in[c]
    return ins[k] if k is not None and k < len(ins) else None


def _closure(
    graph: Graph, start: list[int], cat: list[str | None], down: bool, values: bool = False
) -> list[bool]:
    """Ops reachable from ``start`` (included) through data edges among uncategorized ops.

    With ``values``, shape-only ops stop the walk (their outputs ignore input values).
    """
    adj = graph.adjacency
    ops = graph.ops
    seen = [False] * len(ops)
    reached = [i for i in start if cat[i] is None]
    for i in reached:
        seen[i] = True
    if down:
        readers = adj.readers
        for j in reached:  # (the list grows as it is walked: each op once)
            for k in readers[j]:
                if not seen[k] and cat[k] is None and not (
                        values and ops[k].type in SHAPE_ONLY_OPS):
                    seen[k] = True
                    reached.append(k)
    else:
        data_in = adj.data_in
        for j in reached:
            for k, _ in data_in[j]:
                if not seen[k] and cat[k] is None and not (
                        values and ops[k].type in SHAPE_ONLY_OPS):
                    seen[k] = True
                    reached.append(k)
    return seen


def _gradient_structure(
    graph: Graph,
    topo: tuple[int, ...],
    cat: list[str | None],
    from_input: list[bool],
    only_writes: list[bool],
) -> tuple[list[int], list[int], list[bool]]:
    """Gradient seeds, losses and the ops of the backward pass, found from gradient kernels.

    Gradient kernels (``ReluGrad``, ``Conv2DBackpropFilter``...) read the incoming gradient
    on known inputs (:data:`GRADIENT_PORTS`) and values of the forward pass on the others.
    So the ancestors of their forward inputs are the forward side, and the gradient seed
    is a constant 1 that leads to a gradient input without being on the forward side: a
    dropout's random range or the ``1`` of ``1 + erf(x)`` feed forward values and cannot be
    taken for it. A step with several tapes has several seeds. Each seed's loss is then a
    floating-point scalar computed from the feeds, not from a seed nor from a gradient
    kernel: the one that computes the most of what its gradient reads, walked back from
    values that only scale it for a write or for the tape (loss scaling, a metric's
    running total) to the value the step returns.

    Returns
    -------
    seeds, losses : list of int
        The step's loss first; empty when the graph has no gradient kernel (or no
        candidate).
    backward : list of bool
        Ops downstream of a seed or of a gradient kernel.
    """
    ops = graph.ops
    adj = graph.adjacency
    n = len(ops)
    kernels, ones = [], []  # the gradient kernels, and the ops that may be a constant 1
    for i in topo:
        t = ops[i].type
        if t in GRADIENT_PORTS:
            if cat[i] is None:
                kernels.append(i)
        elif t in _ONE_TYPES:
            ones.append(i)
    if not kernels:
        return [], [], [False] * n
    fwd_in, grad_in = [], []
    for k in kernels:
        ports = GRADIENT_PORTS[ops[k].type]
        for j, (p, port) in enumerate(adj.data_in[k]):
            if ops[p].outputs[port].dtype in _FLOATS:
                (grad_in if j in ports else fwd_in).append(p)
    forward_side = _closure(graph, fwd_in, cat, down=False)
    to_gradient = _closure(graph, grad_in, cat, down=False)
    seeds = [i for i in _one_constants(graph, topo, cat, ones) if not forward_side[i] and any(
        to_gradient[c] for c in adj.consumers.get((i, 0), ()))]
    # A constant 1 of the loss itself multiplies a value computed from the feeds into one
    # that no gradient reads but the step uses (a loss weight of 1 times one output's loss,
    # summed into the loss a metric records), where the seed's consumers are gradient
    # arithmetic (its product with a loss's denominator, the gradient of a count, is
    # pruned). It need not reach what the step returns: Keras' fit returns its metrics'
    # variables, and the seed may reach a gradient returned through tf.identity, so the
    # reach below would take the seed for the constant.
    loose = {i: [c for c in adj.consumers.get((i, 0), ())
                 if from_input[c] and not to_gradient[c] and not forward_side[c]]
             for i in seeds}
    if any(loose.values()):
        used = _closure(graph, step_results(graph), cat, down=False)
        of_loss = [i for i in seeds if any(used[c] or only_writes[c] for c in loose[i])]
        if len(of_loss) < len(seeds):
            seeds = [i for i in seeds if i not in of_loss]
    # A constant 1 of the forward pass (a dropout mask's range, the 1 of 1 + erf(x))
    # computes values that the seed's consumers read, and the seed's own first ops (the
    # gradient of the loss's reduction) lie outside its reach: such a constant is
    # dropped. A constant 1 of the backward pass (a mean over one element) is reached
    # from the seed entirely, and loses to it on reach.
    below_of = {s: _below(graph, s, cat) for s in seeds}
    # The loss is computed before its gradient, so the seed reaches none of the results
    # that it reaches: a constant 1 in the loss itself (Huber's delta) reaches the loss
    # the step returns and the gradients too, as the gradient reads what it computed.
    # (its floating-point scalars: what else it returns, a gradient an optimizer passes
    # through tf.identity, each seed reaches of its own)
    results = _loss_like_results(graph)
    reached = {s: frozenset(r for r in results if below_of[s][r]) for s in seeds}
    in_loss = {t for t in seeds if any(reached[u] < reached[t] for u in seeds)}
    # Every gradient depends on the seed: a constant 1 in the loss (a loss weight of one
    # of two outputs) reaches the gradient kernels of its own output only. Not against a
    # constant of the loss itself: two tape.gradient calls on one loss seed a gradient
    # each, each covering its own kernels, and a constant 1 in the loss (the + 1 of a
    # masked mean's denominator) reaches the kernels of both.
    backward_kernels = [k for k in kernels if not forward_side[k]]
    covers = {s: frozenset(k for k in backward_kernels if below_of[s][k]) for s in seeds}
    seeds = [s for s in seeds
             if not any(covers[s] < covers[t] for t in seeds if t not in in_loss)]
    seeds = _computed_before_the_loss(seeds, reached)
    # What each candidate first meets: the values its own constant arithmetic is
    # combined with (a dropout's random numbers; the forward values the seed's consumers
    # read), not what ops further down read.
    reads_from = {}
    for s, d in below_of.items():
        pure = {s}
        outside: set[int] = set()
        for j in compress(topo, map(d.__getitem__, topo)):
            ins = [p for p, _ in adj.data_in[j]]
            if not any(p in pure for p in ins):
                continue
            other = [p for p in ins if p not in pure and cat[p] is None]
            if other:
                outside.update(other)
            else:
                pure.add(j)
        reads_from[s] = outside

    def inside(a: list[bool], b: list[bool]) -> bool:
        return all(y or not x for x, y in zip(a, b, strict=True))

    upstream = {
        s for s in seeds
        if any(
            t != s and any(below_of[s][p] for p in reads_from[t])
            and not inside(below_of[t], below_of[s])
            for t in seeds
        )
    }
    # Steps with several tapes (a GAN's two losses, SAM's second pass, gradient
    # accumulation over micro-batches) seed one gradient each: besides the seed of widest
    # reach, a seed counts that reaches gradient kernels no other one does and whose own
    # reach lies inside no other's.
    reach = {s: sum(below_of[s]) for s in seeds}
    chosen: list[int] = []
    covered: set[int] = set()
    for s in sorted((s for s in seeds if s not in upstream), key=lambda s: -reach[s]):
        if not chosen or (covers[s] - covered and not any(
                inside(below_of[s], below_of[t]) for t in chosen)):
            chosen.append(s)
            covered |= covers[s]
    below_seed = [False] * n
    for s in chosen:
        below_seed = [a or b for a, b in zip(below_seed, below_of[s], strict=True)]
    # Without a seed, what the gradient kernels compute; with one, only what it reaches:
    # a transposed convolution runs a gradient kernel in the forward pass.
    backward = below_seed if chosen else _closure(graph, kernels, cat, down=True)

    # Partial gradients computed before they meet the seed (of a loss's denominator, say)
    # lead into the backward pass; the loss does not.
    # In the same sweep: the floating-point scalars computed from the feeds, outside the
    # backward pass (found last first).
    meets = [False] * n
    readers = adj.readers
    apart = []
    for i in reversed(topo):
        for c in readers[i]:
            if below_seed[c] or meets[c]:
                meets[i] = True
                break
        if from_input[i] and not backward[i] and cat[i] is None and _float_scalar(ops[i]):
            apart.append(i)
    apart.reverse()
    pool = [i for i in apart if not meets[i]] or apart
    if not pool:
        return chosen, [], backward
    ancestors = {i: _ancestors(graph, i) for i in pool}
    # Each seed's loss is what its gradient differentiates: of the values its gradient
    # reads (activations, weights, a loss's own terms), the loss computes the most, and
    # those of the other seeds the least (one micro-batch's loss, not the step's mean of
    # them all); then the most ancestors (the total, not one of its terms).
    reads = {
        s: {p for j in compress(range(n), below_of[s]) for p, _ in adj.data_in[j]
            if not below_of[s][p] and ops[p].type != "Const"}
        for s in chosen
    }
    losses: list[int] = []
    in_pool = set(pool)
    for s in chosen or [None]:
        own = reads.get(s, set())
        others = set().union(*(reads[t] for t in chosen if t != s)) - own

        def score(i: int, own: set[int] = own, others: set[int] = others) -> tuple:
            a = ancestors[i]
            return (len(own & a), -len(others & a), len(a), -i)

        loss = max(pool, key=score)
        while True:
            loss_readers = adj.consumers.get((loss, 0), ())
            if loss_readers and not all(only_writes[c] for c in loss_readers):
                break
            ins = [p for p, _ in adj.data_in[loss] if p in in_pool]
            if len(ins) != 1:  # (two such values summed: the total of a model's losses)
                break
            if any(p not in in_pool and _computed_scalar(graph, p)
                   for p, _ in adj.data_in[loss]) and not _stopped(graph, ins[0], in_pool):
                # a term computed from the weights alone (an L2 penalty) added to it: the
                # sum is the loss, not a scaling of it (a loss scale is a variable's read).
                # Not where the value comes through tf.stop_gradient: no gradient is of
                # it (a running average of the loss, 0.9 * ema + 0.1 * stop_gradient(l))
                break
            loss = ins[0]
        if loss not in losses:
            losses.append(loss)
    # The step's loss first: the one it returns, else the first computed.
    results = set(step_results(graph))

    def returned(i: int) -> bool:
        stack = [i]
        while stack:
            j = stack.pop()
            if j in results:
                return True
            stack.extend(c for c in readers[j] if ops[c].type in OUTPUT_OPS)
        return False

    # A function's outputs wait for its side effects (a control input each); a value only
    # computed (a second tape's loss nobody returns) is a result too, without one.
    waits = {r for r in results if ops[r].control_inputs}

    def awaited(i: int) -> bool:
        return any(c in waits for c in readers[i]) or i in waits

    losses.sort(key=lambda i: (not awaited(i), not returned(i), topo.index(i)))
    return chosen, losses, backward


def _ancestors(graph: Graph, i: int) -> set[int]:
    """Data ancestors of op ``i`` (itself included)."""
    data_in = graph.adjacency.data_in
    seen = {i}
    found = [i]
    for j in found:  # (the list grows as it is walked: each op once)
        for p, _ in data_in[j]:
            if p not in seen:
                seen.add(p)
                found.append(p)
    return seen


_ONE_TYPES = frozenset({"OnesLike", "Const", "Fill"})


def _one_constants(
    graph: Graph, topo: tuple[int, ...], cat: list[str | None],
    candidates: list[int] | None = None,
) -> list[int]:
    """Floating-point constants equal to 1 (``Const``, ``Fill`` of one, ``OnesLike``).

    ``candidates``: the ops of ``topo`` of those types, in its order, if the caller has them.
    """
    ops = graph.ops
    adj = graph.adjacency

    def one(i: int) -> bool:
        while ops[i].type == "Fill" and len(adj.data_in[i]) == 2:  # Fill(shape, Fill(...))
            i = adj.data_in[i][1][0]
        return ops[i].type == "Const" and ops[i].attrs.get("value") == (1.0,)

    out = []
    if candidates is None:
        candidates = [i for i in topo if ops[i].type in _ONE_TYPES]
    for i in candidates:
        op = ops[i]
        # the most selective test first: few constants are 1
        if op.type == "Const" and op.attrs.get("value") != (1.0,):
            continue
        if op.type == "OnesLike" and cat[i] is not None or op.type == "Fill" and not one(i):
            continue
        if op.outputs and op.outputs[0].dtype in _FLOATS and any(
                cat[c] is None for c in adj.consumers.get((i, 0), ())):
            out.append(i)
    return out


def _below(graph: Graph, seed: int, cat: list[str | None]) -> list[bool]:
    """What a candidate seed computes: the values its consumers lead to (shapes cut)."""
    return _closure(graph, list(graph.adjacency.consumers.get((seed, 0), ())), cat,
                    down=True, values=True)


def _computed_before_the_loss(seeds: list[int], reached: dict[int, frozenset[int]]
                              ) -> list[int]:
    """``seeds`` without the constants 1 of the loss itself.

    The loss is computed before its gradient: a constant of the loss reaches the loss
    the step returns and the gradients, the seed only the gradients. ``reached`` maps a
    candidate to the loss-like results (:func:`_loss_like_results`) it reaches; one that
    reaches more of them than another candidate is dropped.
    """
    return [s for s in seeds if not any(reached[t] < reached[s] for t in seeds)]


def _loss_like_results(graph: Graph) -> list[int]:
    """The step's results that may be its loss: floating-point values of rank 0.

    A gradient the optimizer passes through ``tf.identity`` is a result too, and the
    gradient of a one-element bias (``Dense(1)``, a one-channel output convolution) has
    every dimension 1: taken for a scalar, the seed was found to reach a returned value,
    and a constant 1 of the backward pass (the ``2 - 1`` of a square's gradient) won
    over it (a VAE's loss became its bias gradient). A loss is reduced to rank 0.

    A function's returned values wait for its side effects (a control input each): where
    some do, only those. The gradient of a loop or a ``tf.cond`` by an input no one
    differentiates (``tf.linalg.expm``'s) is a scalar nothing reads, which the seed
    reaches, so the seed was taken for a constant of the loss, and a constant 1 of the
    backward pass for the seed (the loss became that gradient's ``Identity``).
    """
    ops = graph.ops
    scalars = [r for r in step_results(graph)
               if _float_scalar(ops[r]) and ops[r].outputs[0].shape == ()]
    return [r for r in scalars if ops[r].control_inputs] or scalars


def _find_seed(graph: Graph, topo: tuple[int, ...], cat: list[str | None]) -> int | None:
    """The gradient seed: the constant 1 (or ``OnesLike``) that reaches the most gradient ops.

    Every gradient depends on the seed; other constants equal to 1 feed a few ops each.
    The loss is computed before its gradient, so a constant 1 of the loss (the ``1 +`` of
    a VAE's KL term) reaches the loss the step returns and the gradients, the seed only
    the gradients: candidates that reach returned loss-like values another one does not
    are dropped first (without any gradient kernel, the KL term's ``1`` reached more ops
    than the seed and was taken for it, and the loss for a gradient).
    """
    ops = graph.ops
    adj = graph.adjacency
    succs_of = adj.consumers
    likes = [i for i in topo if ops[i].type == "OnesLike" and cat[i] is None]
    if len(likes) == 1:
        return likes[0]
    seeds = _one_constants(graph, topo, cat)[:64]
    results = _loss_like_results(graph)
    if len(seeds) > 1 and results:
        below_of = {s: _below(graph, s, cat) for s in seeds}
        seeds = _computed_before_the_loss(
            seeds, {s: frozenset(r for r in results if below_of[s][r]) for s in seeds})

    def reach(s: int) -> int:
        seen = {s}
        stack = [s]
        while stack:
            j = stack.pop()
            for port in range(len(ops[j].outputs)):
                for c in succs_of.get((j, port), ()):
                    if c not in seen and cat[c] is None:
                        seen.add(c)
                        stack.append(c)
        return len(seen) - 1

    best = max(seeds, key=lambda s: (reach(s), -s), default=None)
    return best


#: Ops that hand a value on: a scalar behind them is what they read.
_HANDS_ON = frozenset({"Cast", "Identity", "StopGradient", "Snapshot", "BroadcastTo", "Reshape",
                       "ExpandDims", "Squeeze"})


def _stopped(graph: Graph, i: int, pool: set[int]) -> bool:
    """Whether value ``i`` comes from the scalars of ``pool`` through a ``StopGradient``.

    Followed back through ops with one input in ``pool``.
    """
    data_in = graph.adjacency.data_in
    for _ in range(16):
        if graph.ops[i].type == "StopGradient":
            return True
        ins = [p for p, _ in data_in[i] if p in pool]
        if len(ins) != 1:
            return False
        i = ins[0]
    return False


def _computed_scalar(graph: Graph, i: int) -> bool:
    """Whether op ``i`` computes a floating-point scalar from floating-point values.

    Not a constant, a feed or a variable's read, which it may only pass on (a cast), nor
    a count cast from integers (Keras' ``fit`` weighs the loss by the batch's rows).
    """
    ops, adj = graph.ops, graph.adjacency
    if not _float_scalar(ops[i]):
        return False
    while ops[i].type in _HANDS_ON and adj.data_in[i]:
        p, port = adj.data_in[i][0]
        if ops[p].outputs[port].dtype not in _FLOATS:
            return False
        i = p
    return ops[i].type not in ("Const", "ReadVariableOp", "Placeholder", "_Arg")


def _float_scalar(op: Op) -> bool:
    """Whether ``op``'s first output is a floating-point scalar (every dimension 1).

    A loss is one.
    """
    if not op.outputs:
        return False
    spec = op.outputs[0]
    return spec.dtype in _FLOATS and spec.shape is not None and all(d == 1 for d in spec.shape)


def _pick_loss(graph: Graph, candidates: list[int]) -> int | None:
    """The loss among ops that depend on the feeds but feed no write through their values.

    Gradients make the loss a scalar, so scalars come first; among them, the one with the
    most data ancestors (the total loss, not a metric), walked back through Identity
    chains to the op that computes it. Dead gradient outputs (rank >= 1) lose to it.
    """
    if not candidates:
        return None
    adj = graph.adjacency
    ops = graph.ops

    def scalar(i: int) -> bool:
        shape = ops[i].outputs[0].shape
        return shape is not None and all(d == 1 for d in shape)

    pool = [i for i in candidates if scalar(i)] or candidates
    if len(pool) > 64:  # many sinks: the deepest is the cheap proxy
        lv = _levels(graph)[0]
        best = max(pool, key=lambda i: (lv[i], -i))
    else:
        best = max(pool, key=lambda i: (len(_ancestors(graph, i)), -i))
    while ops[best].type in ("Identity", "StopGradient") and adj.data_in[best]:
        prev = adj.data_in[best][0][0]
        if prev not in pool:
            break
        best = prev
    return best
