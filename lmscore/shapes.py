"""Tensor sizes at a given batch size.

Graphs are traced with an unknown batch dimension (``-1``). :func:`resolve` fills it in,
following the data flow in topological order rather than assuming "dimension 0 is the
batch" everywhere, because a ``Reshape(x, [-1, 768])`` of a ``[batch, 128, 768]`` tensor
has ``batch * 128`` rows. Rules, first match wins for each unknown dimension:

1. feeds: dimension 0 is the batch size;
2. ``Transpose`` with a constant permutation: the permuted input dimension;
3. ``ConcatV2`` along a constant axis: the sum of the inputs' dimensions;
4. an input of the same rank whose recorded dimension at that position was also
   unknown and is now resolved (elementwise ops, convolutions, matmuls...);
5. ``Reshape``-like ops with one unknown dimension left: the element count of the input;
   ``SpaceToBatchND`` / ``BatchToSpaceND`` (dilated convolutions): the input's first
   dimension times / divided by the block's size (before rule 4, which would copy it);
6. otherwise, an unknown leading dimension of a tensor computed from the feeds is taken
   as the batch size; these guesses are counted in :attr:`Sizes.assumed`.

Whatever is still unknown (unknown rank, other dimensions, variant or string dtypes)
is reported in :attr:`Sizes.unknown` and counts as 0 bytes in the simulation, never 1.
Sizes that only the data decide (``Where``'s coordinates, ``Unique``'s distinct values)
are taken at the most they can be and named in :attr:`Sizes.at_most`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from .errors import ConfigError, GraphError
from .ir import (
    BROADCAST_BINARY_OPS,
    FEED_OPS,
    VARIABLE_OPS,
    Graph,
    Op,
    TensorSpec,
    dtype_bytes,
    gc_paused,
    row_slice_view,
)
from .order import FUSED_APPLIES, applied_gradient, order

_ELEMENT_PRESERVING = frozenset({"Reshape", "Squeeze", "ExpandDims", "Bitcast", "Flatten"})
_MAX_BYTES = 2**62


@dataclass(frozen=True)
class Sizes:
    """Resolved shapes and byte sizes of every tensor of a graph.

    Attributes
    ----------
    batch_size : int
        The batch size the unknown batch dimensions were filled with.
    shapes : tuple
        ``shapes[i][port]`` is the resolved shape of output ``port`` of op ``i``
        (``-1`` for a dimension still unknown, None for an unknown rank).
    nbytes : tuple
        ``nbytes[i][port]``: bytes of that tensor, or ``-1`` when unknown.
    unknown : tuple of str
        Names ``"op:port"`` of the tensors whose size is unknown.
    assumed : tuple of str
        Tensors whose leading unknown dimension was taken as the batch size by rule 6.
    variable_bytes : dict
        Bytes of each variable, keyed by the op that holds it (``VarHandleOp`` or a
        resource placeholder).
    values : dict
        Values of the small integer tensors (shapes, axes, permutations) that could be
        evaluated, keyed by ``(op index, port)``, flattened.
    at_most : tuple of str
        Tensors whose size depends on the values of the data (one row per true element,
        per distinct value), counted at the most it can be: a dense mask's or table's
        figure. The tensors computed from them follow these sizes.
    """

    batch_size: int
    shapes: tuple[tuple[tuple[int, ...] | None, ...], ...]
    nbytes: tuple[tuple[int, ...], ...]
    unknown: tuple[str, ...]
    assumed: tuple[str, ...]
    variable_bytes: dict[str, int]
    values: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    at_most: tuple[str, ...] = ()


@gc_paused()
def resolve(graph: Graph, batch_size: int,
            seeds: Mapping[int, tuple[tuple[int, ...], tuple[int, ...]]] | None = None
            ) -> Sizes:
    """Resolve every tensor's shape and bytes at ``batch_size``.

    Parameters
    ----------
    graph : Graph
    batch_size : int
        Positive batch size used for unknown batch dimensions.
    seeds : mapping, optional
        Known integer values (shape, flat values) of some ops' first output: a loop body's
        arguments whose values the loop gives (:func:`resolve_function`).

    Returns
    -------
    Sizes

    Raises
    ------
    ConfigError
        If ``batch_size`` is not positive.
    GraphError
        If a shape is absurd (negative dimensions other than -1, or a byte count
        over 2**62).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch size must be a positive integer, got {batch_size!r}")
    ops = graph.ops
    adj = graph.adjacency
    ordering = order(graph)
    shapes: list[list[tuple[int, ...] | None]] = [[] for _ in ops]
    # Whether each op's value flows from the feeds through data edges, found only for the
    # ops rule 6 asks about (few, if any): a walk back to the feeds, remembered.
    from_input: list[bool | None] = [None] * len(ops)

    def fed(i: int) -> bool:
        stack = [i]
        while stack:
            j = stack[-1]
            if from_input[j] is not None:
                stack.pop()
            elif ops[j].type in FEED_OPS:
                from_input[j] = True
                stack.pop()
            else:
                todo = [p for p, _ in adj.data_in[j] if from_input[p] is None]
                if todo:
                    stack += todo
                else:
                    from_input[j] = any(from_input[p] for p, _ in adj.data_in[j])
                    stack.pop()
        return bool(from_input[i])

    assumed: list[str] = []
    vals: dict[tuple[int, int], Value] = {}
    no_values: dict[int, Value] = {}
    # Most ops have complete recorded shapes, which are then theirs, and ops share their
    # outputs' specs (the importer makes one tuple per distinct signature): whether a
    # tuple of specs is complete, and its sizes, are found once, by identity, which the
    # graph keeps alive.
    complete: dict[int, tuple[tuple | None, tuple[int, ...] | None]] = {}
    nbytes: list[Any] = [None] * len(ops)  # byte counts, here those of recorded shapes
    # A constant's value and shapes depend on nothing but its attributes and specs, which
    # the importer shares among equal constants: each such pair is evaluated once.
    constants: dict[tuple[int, int], tuple[dict[int, Value], list]] = {}
    for i in ordering.topo:
        op = ops[i]
        specs = op.outputs
        if seeds and i in seeds:
            vals[(i, 0)] = seeds[i]
        known = complete.get(id(specs))
        if known is None:
            known = complete[id(specs)] = _recorded_sizes(specs)
        if known[0] is not None and op.type != "Transpose":
            shapes[i] = known[0]
            nbytes[i] = known[1]  # (None: counted below, in the order of the ops)
            if specs and specs[0].shape == () and specs[0].dtype in _FLOAT_VALUE_DTYPES:
                # a floating-point scalar of known inputs: its value may size a tensor
                ins = adj.data_in[i]
                if op.type == "Const":
                    x = op.attrs.get("value")
                    if x and len(x) == 1 and isinstance(x[0], float) and math.isfinite(x[0]):
                        vals[(i, 0)] = ((), x)
                elif ins and all(e in vals for e in ins):
                    vals.update(((i, port), value)
                                for port, value in _int_values(graph, i, vals, shapes).items())
            continue
        if op.type == "Const":
            same = constants.get((id(op.attrs), id(specs)))
            if same is not None:
                for port, value in same[0].items():
                    vals[(i, port)] = value
                shapes[i] = same[1]
                continue
        data_in = adj.data_in[i]
        own = no_values
        if op.outputs and op.outputs[0].dtype in _VALUE_DTYPES:
            own = _int_values(graph, i, vals, shapes)
            for port, value in own.items():
                vals[(i, port)] = value
        out: list[tuple[int, ...] | None] = []
        derived = op.type == "Transpose"  # what _check_resolved checks besides derived shapes
        for port, spec in enumerate(op.outputs):
            s = spec.shape
            if s and min(s) < -1:
                raise GraphError(
                    f"{graph.source}: node {op.name!r} output {port} has an invalid shape {list(s)}"
                )
            if port in own and (s is None or len(own[port][0]) == len(s)):
                out.append(own[port][0])  # an integer tensor whose value is known
                derived = True
                continue
            if s is not None and -1 not in s:
                out.append(s)
                continue
            derived = True
            exact = _shape_from_values(graph, i, port, vals, shapes)
            if exact is not None and (s is None or len(exact) == len(s)):
                out.append(exact)
                continue
            if s is None:
                out.append(None)
                continue
            ins = [(shapes[p][q], ops[p].outputs[q].shape) for p, q in data_in]
            r = _resolve_one(graph, i, s, ins, batch_size)
            if r[0] == -1 and fed(i) and op.outputs[port].dtype != "resource":
                r = (batch_size,) + r[1:]
                assumed.append(f"{op.name}:{port}")
            out.append(r)
        if derived:  # (a recorded shape was checked above)
            _check_resolved(graph, i, out, vals)
        shapes[i] = out
        if op.type == "Const":
            constants[(id(op.attrs), id(specs))] = (own, out)
    unknown: list[str] = []
    lists = False  # whether any tensor is a TensorList (variant)
    bytes_of: dict[tuple[tuple[int, ...] | None, str], int] = {}  # few distinct shapes
    for i in [i for i in range(len(ops)) if nbytes[i] is None]:
        op = ops[i]
        row = []
        for port, spec in enumerate(op.outputs):
            if spec.dtype == "string":
                b = op.attrs.get("string_bytes", -1)
            elif spec.dtype == "variant":
                lists = True
                b = -1
            else:
                key = (shapes[i][port], spec.dtype)
                b = bytes_of.get(key)
                if b is None:
                    b = bytes_of[key] = _bytes(*key)
            if b > _MAX_BYTES:
                raise GraphError(
                    f"{graph.source}: node {op.name!r} output {port} would need {b} bytes "
                    f"(shape {list(shapes[i][port] or ())})"
                )
            if b < 0:
                unknown.append(f"{op.name}:{port}")
            row.append(b)
        nbytes[i] = row
    if lists:
        _size_tensor_lists(graph, ordering.topo, shapes, vals, nbytes, unknown, batch_size)
    var_bytes = _variable_bytes(graph, shapes, nbytes)
    at_most = tuple(
        f"{op.name}:{port}" for i, op in enumerate(ops) if op.type in AT_MOST
        for port in AT_MOST[op.type]
        if port < len(op.outputs) and -1 in (op.outputs[port].shape or (-1,))
        and nbytes[i][port] > 0
    )
    return Sizes(
        batch_size=batch_size,
        shapes=tuple(map(tuple, shapes)),
        nbytes=tuple(map(tuple, nbytes)),
        unknown=tuple(unknown),
        assumed=tuple(assumed),
        variable_bytes=var_bytes,
        # (the floating-point scalars evaluated on the way are no shape's, axis' or
        # permutation's: a reader of these values would take a float for an index)
        values={k: v[1] for k, v in vals.items() if not _floating(v)},
        at_most=at_most,
    )


#: Ops whose outputs' sizes only their input values decide, and those outputs
#: (:func:`_shape_from_values` gives the most they can be).
AT_MOST: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {"Where": (0,), "Unique": (0,), "UniqueWithCounts": (0, 2)})


def _recorded_sizes(
    specs: tuple[TensorSpec, ...]
) -> tuple[tuple[tuple[int, ...], ...] | None, tuple[int, ...] | None]:
    """The recorded shapes of ``specs`` when all are complete and nothing else decides them.

    Their shapes are None when one is unknown or absurd (resolved or refused one by one),
    or when the first output is an integer or boolean tensor, whose value may be computed. Their
    byte counts are None unless each is known from the spec alone and within bounds
    (strings, lists and unknown or huge sizes are counted one by one). Shared by every
    op of these specs, and never changed: only unknown sizes are filled in later.
    """
    if specs and specs[0].dtype in _VALUE_DTYPES:
        return None, None
    shapes = []
    for spec in specs:
        s = spec.shape
        if s is None or (s and min(s) < 0):
            return None, None
        shapes.append(s)
    row = []
    for spec, s in zip(specs, shapes, strict=True):
        b = -1 if spec.dtype in ("string", "variant") else _bytes(s, spec.dtype)
        if not 0 <= b <= _MAX_BYTES:
            return tuple(shapes), None
        row.append(b)
    return tuple(shapes), tuple(row)


def extend_sizes(sizes: Sizes, graph: Graph) -> Sizes:
    """The sizes of a rewrite of the graph ``sizes`` was resolved for, without resolving.

    :func:`lmscore.rewrite.rewrite` keeps the original ops at their indices and appends
    swap-outs and swap-ins, identities of a tensor of the same shape, whose sizes are their
    input's, and recomputing clones, whose sizes are their original's. Equal to
    ``resolve(graph, sizes.batch_size)`` (a property test checks it) at a fraction of the
    cost, which matters when a plan is edited interactively.

    Parameters
    ----------
    sizes : Sizes
        :func:`resolve` of the original graph.
    graph : Graph
        ``rewrite(original, plan).graph``.

    Returns
    -------
    Sizes

    Raises
    ------
    ValueError
        If ``graph`` has fewer ops than ``sizes`` or an added op is neither a one-input
        ``Identity`` nor a clone.
    """
    n = len(sizes.shapes)
    if len(graph.ops) < n:
        raise ValueError(f"{graph.source}: {len(graph.ops)} ops, fewer than the {n} sized")
    shapes = list(sizes.shapes)
    nbytes = list(sizes.nbytes)
    unknown = list(sizes.unknown)
    values = dict(sizes.values)
    data_in = graph.adjacency.data_in
    index = graph.index
    by_op: dict[int, list[tuple[int, tuple[int, ...]]]] | None = None  # on the first clone
    for i in range(n, len(graph.ops)):
        op = graph.ops[i]
        clone_of = op.attrs.get("_lms_clone_of")
        if clone_of is not None and index.get(str(clone_of), n) < n:
            src = index[str(clone_of)]  # a recomputing clone: its original's outputs
            shapes.append(shapes[src])
            nbytes.append(nbytes[src])
            unknown.extend(f"{op.name}:{k}" for k, b in enumerate(nbytes[src]) if b < 0)
            if by_op is None:
                by_op = {}
                for (j, k), v in sizes.values.items():
                    by_op.setdefault(j, []).append((k, v))
            values.update({(i, k): v for k, v in by_op.get(src, ())})
            continue
        if op.type != "Identity" or len(data_in[i]) != 1:
            raise ValueError(f"{graph.source}: added op {op.name!r} is not a one-input Identity")
        (src, port), = data_in[i]
        shapes.append((shapes[src][port],))
        nbytes.append((nbytes[src][port],))
        if nbytes[src][port] < 0:
            unknown.append(f"{op.name}:0")
        if (src, port) in values:
            values[(i, 0)] = values[(src, port)]
    return replace(sizes, shapes=tuple(shapes), nbytes=tuple(nbytes), unknown=tuple(unknown),
                   values=values)


def _check_resolved(
    graph: Graph, i: int, out: list[tuple[int, ...] | None], vals: dict[tuple[int, int], Value]
) -> None:
    """Reject what no valid graph computes: negative sizes, a transpose that is no permutation.

    Shapes computed from integer values (``Fill``, ``Reshape``, ``Const``...) are not
    checked on load; the simulator and the ops reading them need sizes >= 0.
    """
    op = graph.ops[i]
    for port, shape in enumerate(out):
        if shape and min(shape) < -1:
            raise GraphError(
                f"{graph.source}: node {op.name!r} output {port} would have a negative "
                f"dimension (shape {list(shape)})"
            )
    if op.type == "Transpose" and len(graph.adjacency.data_in[i]) == 2:
        perm = vals.get(graph.adjacency.data_in[i][1])
        if perm is not None and sorted(perm[1]) != list(range(len(perm[1]))):
            raise GraphError(
                f"{graph.source}: node {op.name!r} has perm {list(perm[1])}, not a "
                f"permutation of 0..{len(perm[1]) - 1}"
            )


_LIST_MAKERS = frozenset({"EmptyTensorList", "TensorListReserve"})
_WHILE_OPS = frozenset({"While", "StatelessWhile"})


def _size_tensor_lists(
    graph: Graph,
    topo: tuple[int, ...],
    shapes: list,
    vals: dict[tuple[int, int], Value],
    nbytes: list[list[int]],
    unknown: list[str],
    batch: int,
) -> None:
    """Give TensorList values (``variant``) the size of what they hold.

    A list is created empty (0 bytes); ``TensorListFromTensor`` holds a copy of its input;
    a while loop fills the lists it carries, up to their capacity (``max_num_elements`` x
    ``element_shape``), so the loop's list outputs hold that much until their last reader.
    ``ZerosLike`` of a list allocates a zero element for every element the list holds.
    What each loop does with its lists comes from its body (:func:`loop_body`); memory a
    body allocates and frees within one iteration is the simulator's (``lmscore.memory``).
    """
    ops = graph.ops
    adj = graph.adjacency
    capacity: dict[tuple[int, int], int] = {}
    element: dict[tuple[int, int], int] = {}  # bytes of one element, when known
    filled: dict[tuple[int, int], int] = {}  # a loop's list outputs it filled: their bytes
    for i in topo:
        op = ops[i]
        ins = adj.data_in[i]
        if op.type == "TensorListStack" and ins and nbytes[i] and nbytes[i][0] < 0:
            full = capacity.get(ins[0], filled.get(ins[0]))
            if full is not None:
                nbytes[i][0] = full  # the stacked elements of a filled list
                unknown.remove(f"{op.name}:0")
        for o in op.outputs:
            if o.dtype == "variant":
                break
        else:
            continue
        sizes = dict(enumerate(nbytes[i]))
        if op.type in _LIST_MAKERS and len(ins) == 2:
            shape, count = vals.get(ins[0]), vals.get(ins[1])
            size = dtype_bytes(op.attrs.get("element_dtype", ""))
            if shape is not None and size:
                dims = [batch if k == 0 and d == -1 else d for k, d in enumerate(shape[1])]
                if all(d >= 0 for d in dims):
                    element[(i, 0)] = math.prod(dims) * size
                    if count and count[1] and count[1][0] >= 0:
                        capacity[(i, 0)] = count[1][0] * element[(i, 0)]
            sizes[0] = 0
        elif op.type == "TensorListFromTensor" and ins:
            sizes[0] = nbytes[ins[0][0]][ins[0][1]]
        elif op.type in _WHILE_OPS:
            aliases = op.attrs.get("list_aliases", ())
            body = loop_body(graph, i, tuple(shapes[p][q] for p, q in ins))
            kinds = body.kinds if body is not None else ()
            # A list made without a count (a loop with no maximum_iterations) holds an
            # element per iteration, when the loop's condition tells how many (else 0)
            grows = any(kind in ("filled", "duplicate") and k < len(ins)
                        and ins[k] in element and ins[k] not in capacity
                        for k, kind in enumerate(kinds))
            trips = trip_count(graph, i, body, lambda t: (
                vals[t][1] if t in vals else None)) if grows else 0
            for k, src in enumerate(ins[: len(op.outputs)]):
                if op.outputs[k].dtype != "variant":
                    continue
                kind = kinds[k] if k < len(kinds) else ""
                if src in capacity and kind not in ("refs", "duplicate"):
                    # a list made empty before the loop, filled by it (a stack of it holds
                    # every element)
                    sizes[k] = 0 if k in aliases else capacity[src]
                    filled[(i, k)] = capacity[src]
                elif kind == "filled" and src in element:
                    filled[(i, k)] = trips * element[src]
                    sizes[k] = 0 if k in aliases else filled[(i, k)]
                elif kind in ("pass", "filled", "refs"):
                    # what the list holds: the input list passed on or set in place, or
                    # the list whose elements it references (memory._view_of makes these
                    # views of that input, not new buffers)
                    j = body.sources[k] if kind == "refs" else k
                    sizes[k] = max(nbytes[ins[j][0]][ins[j][1]], 0) if j < len(ins) else 0
                else:
                    # lists the loop consumes (a gradient loop pops its accumulators) and
                    # lists holding buffers another list holds
                    sizes[k] = 0
            for k, partners in (duplicated(body).items() if "duplicate" in kinds else ()):
                # A state's previous values, whose new values another list holds: only
                # the elements that list does not hold are this one's. A fixed-size list
                # the body sets one slot of (a recurrent layer's last output) holds one
                # element; the accumulator, one per iteration (a GRU's: 0.890 of measured
                # when all of them were counted as the other list's).
                src = ins[k] if k < len(ins) else None
                if k in aliases or src is None or not partners:
                    continue
                if src in capacity:
                    full = capacity[src]
                elif src in element:
                    full = trips * element[src]
                else:
                    continue
                shared = max(filled.get((i, m), 0) for m in partners)
                sizes[k] = max(full - shared, 0)
        elif op.type in BRANCH_ATTRS:
            taken = vals[ins[0]][1] if ins and ins[0] in vals else None
            for k, b in _optional_results(graph, i, shapes, batch, taken).items():
                sizes[k] = b
        elif op.type == "ZerosLike" and ins and op.outputs[0].dtype == "variant":
            # a zero tensor for every element the list holds (uninitialised ones stay so)
            if ins[0] in capacity:
                capacity[(i, 0)] = capacity[ins[0]]
            sizes[0] = nbytes[ins[0][0]][ins[0][1]]
        elif op.type == "Identity" and ins and ins[0] in capacity:
            capacity[(i, 0)] = capacity[ins[0]]
            sizes[0] = nbytes[ins[0][0]][ins[0][1]]
        for port, b in sizes.items():
            if b < 0 and ins and op.type in ("Identity", "IdentityN"):
                src = ins[port] if port < len(ins) else ins[0]
                b = nbytes[src[0]][src[1]]
            if nbytes[i][port] < 0 <= b:
                nbytes[i][port] = b
                unknown.remove(f"{op.name}:{port}")


#: Functional conditionals and the attributes naming their branch functions (their first
#: input, the predicate or the branch index, is not passed to the branch).
BRANCH_ATTRS = {"If": ("then_branch", "else_branch"),
                 "StatelessIf": ("then_branch", "else_branch"),
                 "Case": ("branches",), "StatelessCase": ("branches",)}
#: Ops whose output is an existing buffer: a tensor wrapped from one is no new memory.
_NOT_NEW = frozenset({"_LoopArg", "ReadVariableOp", "Const", "VarHandleOp"})


def _optional_results(graph: Graph, i: int, shapes: list, batch: int,
                      taken: tuple[int, ...] | None = None) -> dict[int, int]:
    """Bytes of the ``Optional`` outputs of conditional ``i``, by output port.

    A differentiable ``tf.cond`` returns, beside its results, each branch intermediate its
    gradient reads, wrapped as an optional (``variant``; the other branch returns an empty
    one): it holds that tensor's buffer until the gradient's conditional runs. One branch
    runs: those of the branch whose optionals hold the most (0 where one wraps an input,
    a variable's value or a constant).
    """
    op = graph.ops[i]
    arg_shapes = tuple(shapes[p][q] for p, q in graph.adjacency.data_in[i][1:])
    aliased = optional_aliases(graph, i, arg_shapes, taken)
    out: dict[int, int] = {}
    for body in _branches(graph, i, arg_shapes, taken):
        g = body.graph
        wrapped = {k: t for k, t in _wrapped(op, body).items() if k not in aliased}
        if not wrapped:
            continue
        try:
            sizes = resolve_function(g, batch)
        except (GraphError, ValueError):
            continue
        mine = {}
        for k, t in wrapped.items():
            name, _, port = t.rpartition(":")
            j = g.index.get(name)
            q = int(port) if port.isdigit() else 0
            ok = j is not None and g.ops[j].type not in _NOT_NEW and q < len(sizes.nbytes[j])
            mine[k] = max(sizes.nbytes[j][q], 0) if ok else 0
        if sum(mine.values()) >= sum(out.values()):
            out = mine
    return {k: out.get(k, 0) for k, spec in enumerate(op.outputs) if spec.dtype == "variant"}


def _branches(graph: Graph, i: int, arg_shapes: tuple, taken: tuple[int, ...] | None = None
              ) -> list[LoopBody]:
    """The branch functions of conditional ``i`` the graph's library holds that may run."""
    return [body for fname in branch_functions(graph.ops[i], taken)
            if (body := function_body(graph, fname, arg_shapes)) is not None]


def branch_functions(op: Op, taken: tuple[int, ...] | None = None) -> tuple[str, ...]:
    """The functions conditional ``op`` may run, all of them unless ``taken`` tells.

    ``taken`` is the value of its first input when known: the predicate, or the branch
    index. ``tf.linalg.lstsq`` chooses between a normal-equations branch and a QR branch
    by the matrix's static shape: counted with the branch that never runs, its optionals
    held 7.6 times what TensorFlow measured.

    >>> op = Op("c", "If", attrs={"then_branch": ("t",), "else_branch": ("e",)})
    >>> branch_functions(op, (0,)), branch_functions(op), branch_functions(op, (1, 0))
    (('e',), ('t', 'e'), ('t', 'e'))
    >>> case = Op("c", "Case", attrs={"branches": ("a", "b", "default")})
    >>> branch_functions(case, (1,)), branch_functions(case, (7,))
    (('b',), ('default',))
    """
    names = tuple(f for attr in BRANCH_ATTRS[op.type] for f in op.attrs.get(attr, ()))
    if taken is None or len(taken) != 1 or not names:
        return names
    v = int(taken[0])
    if op.type in ("If", "StatelessIf"):
        return (names[0],) if v else (names[-1],)
    # a Case runs its last branch (the default) for an index out of range
    return (names[v],) if 0 <= v < len(names) else (names[-1],)


def _wrapped(op: Op, body: LoopBody) -> dict[int, str]:
    """The tensor each ``Optional`` result of a branch wraps, by the conditional's port."""
    g = body.graph
    wrapped = {}
    for k, ref in enumerate(body.returns):
        j = g.index.get(ref.rpartition(":")[0]) if ref else None
        if (k < len(op.outputs) and op.outputs[k].dtype == "variant" and j is not None
                and g.ops[j].type == "OptionalFromValue" and g.ops[j].inputs):
            wrapped[k] = value_through(g, g.ops[j].inputs[0])
    return wrapped


def optional_aliases(graph: Graph, i: int, arg_shapes: tuple,
                     taken: tuple[int, ...] | None = None) -> dict[int, int]:
    """The ``Optional`` outputs of conditional ``i`` that hold one of its own results.

    A branch's gradient often reads a result of the branch itself (``relu``'s gradient
    reads its output): the optional then holds the result's buffer, no second one
    (``tf.switch_case`` over activations measured at 1.351 of its simulation with the
    optional counted apart). Maps the optional's port to that result's, where every
    branch that wraps something there wraps the same result.
    """
    op = graph.ops[i]
    found: dict[int, int] = {}
    refused: set[int] = set()
    for body in _branches(graph, i, arg_shapes, taken):
        results = {value_through(body.graph, r): k for k, r in enumerate(body.returns)
                   if r and k < len(op.outputs) and op.outputs[k].dtype != "variant"}
        for k, t in _wrapped(op, body).items():
            r = results.get(t)
            if r is None or found.setdefault(k, r) != r:
                refused.add(k)
    return {k: r for k, r in found.items() if k not in refused}


def _bytes(shape: tuple[int, ...] | None, dtype: str) -> int:
    if dtype == "resource":
        return 0
    size = dtype_bytes(dtype)
    if size is None or shape is None or -1 in shape:
        return -1
    return math.prod(shape) * size


def _resolve_one(
    graph: Graph,
    i: int,
    s: tuple[int, ...],
    ins: list[tuple[tuple[int, ...] | None, tuple[int, ...] | None]],
    batch: int,
) -> tuple[int, ...]:
    op = graph.ops[i]
    dims = list(s)
    if op.type in FEED_OPS:
        dims[0] = batch if dims[0] == -1 else dims[0]
        return tuple(dims)
    if op.type in _SPARSE_SEGMENTS and ins and ins[0][0] is not None:
        # the data's trailing dimensions; the rows (segments) stay unknown, the batch if
        # fed (rule 6: an embedding_lookup_sparse has a segment per example, where its
        # data has a row per id, 8 an example at 8,192 rows for batch 1,024)
        src = ins[0][0]
        return tuple(src[j] if d == -1 and 0 < j < len(src) else d
                     for j, d in enumerate(dims))
    if op.type == "TensorListStack" and len(dims) >= 2 and dims[1] == -1:
        # a time-major stack of a list's elements: an element's unknown first dimension is
        # the batch, as where the list is made (_size_tensor_lists)
        dims[1] = batch
    if op.type == "StridedSliceGrad" and len(ins) == 5 and ins[1][0] == (1,) and ins[4][0]:
        # x[t] or x[a:b] of a sequence a loop reads (its begin computed, so the shape the
        # gradient is given comes out of a list): the rows' dimensions are the incoming
        # gradient's (left unknown, three sequence-sized gradients a step counted 0 bytes)
        a = op.attrs
        dy = ins[4][0]
        lost = a.get("shrink_axis_mask", 0)
        if lost in (0, 1) and not a.get("new_axis_mask", 0) and not a.get("ellipsis_mask", 0) \
                and len(dy) == len(dims) - lost:
            for j in range(1, len(dims)):
                if dims[j] == -1:
                    dims[j] = dy[j - lost]
    if op.type == "Transpose" and len(ins) == 2:
        perm = _const_value(graph, i, 1)
        src = ins[0][0]
        if perm is not None and src is not None and len(perm) == len(dims) == len(src):
            for j, p in enumerate(perm):
                if dims[j] == -1 and 0 <= p < len(src):
                    dims[j] = src[p]
    if op.type == "ConcatV2" and len(ins) >= 3:
        axis = _const_value(graph, i, len(ins) - 1)
        parts = [r for r, _ in ins[:-1]]
        if axis is not None and len(axis) == 1 and all(p is not None for p in parts):
            ax = axis[0] % len(dims)
            if dims[ax] == -1 and all(len(p) == len(dims) and p[ax] >= 0 for p in parts):
                dims[ax] = sum(p[ax] for p in parts)
    if op.type in BROADCAST_BINARY_OPS or op.type == "SelectV2":
        # numpy's rule, aligned from the last axis: an input's 1 broadcasts (the gradient of
        # a max over every axis compares a [1, 1] maximum with the [batch, n] input)
        for j in range(len(dims)):
            if dims[j] != -1:
                continue
            k = len(dims) - j
            seen = [r[-k] for r, _ in ins if r is not None and len(r) >= k and r[-k] >= 0]
            if seen:
                dims[j] = max(seen)
    for j, d in enumerate(dims):
        if d != -1:
            continue
        for resolved, recorded in ins:
            if (
                resolved is not None and recorded is not None
                and len(resolved) == len(recorded) == len(dims)
                and recorded[j] == -1 and resolved[j] >= 0
            ):
                dims[j] = resolved[j]
                break
    for resolved, recorded in ins:  # a prefix: gathers, appended axes
        if (
            -1 in dims and resolved is not None and recorded is not None
            and len(resolved) == len(recorded) < len(dims) and recorded == s[: len(recorded)]
        ):
            dims[: len(recorded)] = [
                r if d == -1 else d for d, r in zip(dims[: len(recorded)], resolved, strict=True)
            ]
    if dims.count(-1) == 1 and op.type in _ELEMENT_PRESERVING and ins and ins[0][0] is not None:
        src = ins[0][0]
        if -1 not in src:
            known = math.prod(d for d in dims if d != -1)
            total = math.prod(src)
            if known > 0 and total % known == 0:
                dims[dims.index(-1)] = total // known
    return tuple(dims)


def _const_value(graph: Graph, i: int, input_index: int) -> tuple[int, ...] | None:
    """Value of a small integer constant feeding input ``input_index`` of op ``i``."""
    p, _ = graph.adjacency.data_in[i][input_index]
    producer = graph.ops[p]
    while producer.type == "Identity" and producer.inputs:
        p, _ = graph.adjacency.data_in[p][0]
        producer = graph.ops[p]
    value = producer.attrs.get("value") if producer.type == "Const" else None
    if value is None or not all(isinstance(x, int) for x in value):
        return None  # a floating-point constant is no axis or permutation
    return value


#: Op types that may hold a variable (feeds only when they hand in a resource).
_HOLDERS = VARIABLE_OPS | FEED_OPS


def _variable_bytes(
    graph: Graph,
    shapes: list[list[tuple[int, ...] | None]],
    nbytes: list[tuple[int, ...]],
) -> dict[str, int]:
    """Bytes held by each variable: declared shape, else what reads or writes of it show."""
    ops = graph.ops
    adj = graph.adjacency
    out: dict[str, int] = {}
    for i in [i for i, op in enumerate(ops) if op.type in _HOLDERS]:
        op = ops[i]
        resource = bool(op.outputs) and op.outputs[0].dtype == "resource"
        if not (op.type in VARIABLE_OPS or resource):
            continue
        if "shape" in op.attrs and op.attrs.get("dtype") and op.type in VARIABLE_OPS:
            shape = tuple(op.attrs["shape"])
            declared = _bytes(shape, op.attrs["dtype"])
            if any(d < -1 for d in shape) or declared > _MAX_BYTES:
                raise GraphError(
                    f"{graph.source}: variable {op.name!r} has an invalid shape {list(shape)}"
                    + (f" ({declared} bytes)" if declared > _MAX_BYTES else "")
                )
        elif resource and op.attrs.get("handle_dtype") and -1 not in op.attrs.get(
                "handle_shape", (-1,)):
            # a captured variable's placeholder, with what the exporter recorded of it
            declared = _bytes(op.attrs["handle_shape"], op.attrs["handle_dtype"])
        else:  # reference variables carry their shape on the output
            declared = -1 if resource or not op.outputs else nbytes[i][0]
        if declared >= 0:
            out[op.name] = declared
            continue
        best = -1
        for c in adj.consumers.get((i, 0), ()):
            consumer = ops[c]
            if consumer.type == "ReadVariableOp" and consumer.outputs:
                best = nbytes[c][0]
            elif consumer.type.startswith("Assign") and len(adj.data_in[c]) >= 2:
                p, port = adj.data_in[c][1]
                if consumer.type == "AssignVariableOp":
                    best = max(best, nbytes[p][port])
            if best >= 0:
                break
        if best < 0:
            best = _bytes_from_update(graph, i, nbytes)
        if best < 0:
            best = _bytes_in_functions(graph, i)
        out[op.name] = best
    _bytes_from_peers(graph, out)
    return out


#: Functional ops whose inputs become the arguments of a library function, with the
#: function attributes and the offset of input ``k`` to argument ``k - offset``.
_CALLS: dict[str, tuple[tuple[str, ...], int]] = {
    "PartitionedCall": (("f",), 0), "StatefulPartitionedCall": (("f",), 0),
    "While": (("body", "cond"), 0), "StatelessWhile": (("body", "cond"), 0),
    "If": (("then_branch", "else_branch"), 1), "StatelessIf": (("then_branch", "else_branch"), 1),
    "Case": (("branches",), 1), "StatelessCase": (("branches",), 1),
}


def _bytes_in_functions(graph: Graph, var: int) -> int:
    """Size of a variable that only function bodies read or update, or -1.

    A variable passed to a functional op (the loss-scale ``If`` of mixed precision holds
    every optimizer slot) is still resident for the whole step; its size is what the
    reads inside the body show (``ReadVariableOp`` outputs carry ``_output_shapes``).
    """
    adj = graph.adjacency
    calls = [
        (graph.ops[c], k) for c in adj.consumers.get((var, 0), ())
        for k, t in enumerate(adj.data_in[c]) if t == (var, 0) and graph.ops[c].type in _CALLS
    ]
    if not calls or graph.graphdef is None:
        return -1
    library = _library(graph.graphdef)
    for op, k in calls:
        attrs, offset = _CALLS[op.type]
        for fname in _call_targets(graph.graphdef, op.name, attrs):
            b = _arg_bytes(library, fname, k - offset, set())
            if b >= 0:
                return b
    return -1


@functools.lru_cache(maxsize=4)
def _library(graphdef: bytes) -> dict[str, Any]:
    """The function library of a serialized GraphDef, by function name."""
    from tensorboard.compat.proto import graph_pb2

    gd = graph_pb2.GraphDef()
    gd.ParseFromString(graphdef)
    return {f.signature.name: f for f in gd.library.function}


@functools.lru_cache(maxsize=4)
def _call_nodes(graphdef: bytes) -> dict[str, Any]:
    from tensorboard.compat.proto import graph_pb2

    gd = graph_pb2.GraphDef()
    gd.ParseFromString(graphdef)
    return {n.name: n for n in gd.node if n.op in _CALLS}


def _call_targets(graphdef: bytes, name: str, attrs: tuple[str, ...]) -> list[str]:
    node = _call_nodes(graphdef).get(name)
    return [] if node is None else _func_names(node, attrs)


def _func_names(node: Any, attrs: tuple[str, ...]) -> list[str]:
    out = []
    for key in attrs:
        if key in node.attr:
            a = node.attr[key]
            out += [f.name for f in a.list.func] if a.list.func else [a.func.name]
    return [n for n in out if n]


def _dtype_name(enum: int) -> str:
    """TensorFlow's dtype name for a ``DataType`` enum (``DT_HALF`` -> ``"half"``)."""
    from tensorboard.compat.proto import types_pb2

    name = types_pb2.DataType.Name(enum) if enum in types_pb2.DataType.values() else ""
    return name[3:].lower()


def _arg_bytes(library: dict[str, Any], fname: str, k: int, seen: set[str]) -> int:
    """Bytes of resource argument ``k`` of function ``fname``, from the reads of it."""
    f = library.get(fname)
    if f is None or fname in seen or not 0 <= k < len(f.signature.input_arg):
        return -1
    seen.add(fname)
    arg = f.signature.input_arg[k].name
    for node in f.node_def:
        ins = [t for t in node.input if not t.startswith("^")]
        for j, t in enumerate(ins):
            if t.split(":")[0] != arg:
                continue
            if node.op == "ReadVariableOp" and "_output_shapes" in node.attr:
                shapes = node.attr["_output_shapes"].list.shape
                dtype = _dtype_name(node.attr["dtype"].type)
                if shapes and not shapes[0].unknown_rank:
                    b = _bytes(tuple(d.size for d in shapes[0].dim), dtype)
                    if b >= 0:
                        return b
            if node.op in _CALLS:
                attrs, offset = _CALLS[node.op]
                for inner in _func_names(node, attrs):
                    b = _arg_bytes(library, inner, j - offset, seen)
                    if b >= 0:
                        return b
    return -1


def _bytes_from_update(graph: Graph, var: int, nbytes: list[tuple[int, ...]]) -> int:
    """Size of a variable only seen by in-place updates: the value they add or apply."""
    adj = graph.adjacency
    for c in adj.consumers.get((var, 0), ()):
        consumer = graph.ops[c]
        if consumer.type in ("AssignAddVariableOp", "AssignSubVariableOp"):
            if len(adj.data_in[c]) < 2:
                continue
            p, port = adj.data_in[c][1]
            if nbytes[p][port] >= 0:
                return nbytes[p][port]
        if consumer.type.startswith("ResourceApply"):
            grad = applied_gradient(graph, c)  # shaped like the variable
            if grad is not None and nbytes[grad[0]][grad[1]] >= 0:
                return nbytes[grad[0]][grad[1]]
    return -1


def _bytes_from_peers(graph: Graph, out: dict[str, int]) -> None:
    """Size optimizer slots that only their apply op uses like the variable it updates.

    A sparse apply (``ResourceSparseApplyAdagradV2``) shows only the updated rows; the
    variable and each slot it takes are the same size.
    """
    adj = graph.adjacency
    ops = graph.ops
    fused = {t for t in {op.type for op in ops} if t.startswith(FUSED_APPLIES)}
    for c in [c for c, op in enumerate(ops) if op.type in fused] if fused else ():
        peers = [ops[p].name for p, _ in adj.data_in[c] if ops[p].name in out]
        known = [out[name] for name in peers if out[name] >= 0]
        for name in peers:
            if out[name] < 0 and known:
                out[name] = known[0]


# --- Integer values of shape arithmetic -------------------------------------------------
# Gradient code computes shapes at run time (Shape -> BroadcastGradientArgs -> Sum ->
# Reshape). Evaluating those small integer tensors once the batch is known gives the exact
# output shapes that static shapes leave unknown.

Value = tuple[tuple[int, ...], tuple[int, ...]]  # (shape, flat values)
#: Dtypes whose small tensors' values are computed (booleans as 0 and 1).
_VALUE_DTYPES = frozenset({"int32", "int64", "bool"})
#: Floating-point scalars of known inputs are evaluated too: a size computed in floating
#: point from a shape (a mixture of experts' capacity, ``ceil(1.25 * tokens / experts)``,
#: cast back to an integer) was left unknown, and the dispatch tensors it sized counted
#: 0 bytes.
_FLOAT_VALUE_DTYPES = frozenset({"float", "double", "half", "bfloat16"})
_MAX_VALUE = 64
_REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm"})
_BINARY = {
    "Add": lambda a, b: a + b, "AddV2": lambda a, b: a + b, "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b, "FloorDiv": lambda a, b: a // b if b else None,
    "RealDiv": lambda a, b: a / b if b and isinstance(a, float) else None,
    "Maximum": max, "Minimum": min, "FloorMod": lambda a, b: a % b if b else None,
    # comparisons, as 0 and 1: a Select between permutations on a dimension's size
    # (tf.vectorized_map's matrix-vector products) takes one of them
    "Equal": lambda a, b: int(a == b), "NotEqual": lambda a, b: int(a != b),
    "Less": lambda a, b: int(a < b), "LessEqual": lambda a, b: int(a <= b),
    "Greater": lambda a, b: int(a > b), "GreaterEqual": lambda a, b: int(a >= b),
}


def _known(shape: tuple[int, ...] | None) -> bool:
    return shape is not None and -1 not in shape


def _int_values(
    graph: Graph, i: int, vals: dict[tuple[int, int], Value], shapes: list
) -> dict[int, Value]:
    """Values of op ``i``'s small integer outputs, when its inputs' values are known."""
    op = graph.ops[i]
    t = op.type
    if t == "Const":  # most of them: a constant's decoded value, if it is an integer one
        attrs = op.attrs
        if "value" not in attrs or not all(isinstance(x, int) for x in attrs["value"]):
            return {}
        shape = attrs.get("const_shape", op.outputs[0].shape if op.outputs else ())
        const = (tuple(shape or ()), tuple(attrs["value"]))
        return {} if len(const[1]) > _MAX_VALUE else {0: const}
    ins = graph.adjacency.data_in[i]

    if t not in _FLOAT_ARITHMETIC and any(_floating(vals.get(e)) for e in ins):
        return {}  # floating-point values enter only arithmetic and casts

    def v(k: int) -> Value | None:
        return vals.get(ins[k]) if k < len(ins) else None

    def in_shape(k: int) -> tuple[int, ...] | None:
        p, port = ins[k]
        return shapes[p][port]

    out: Value | None = None
    if t == "Shape" and ins and _known(in_shape(0)):
        s = in_shape(0)
        out = ((len(s),), s)
    elif t == "ShapeN":
        res = {}
        for k in range(len(ins)):
            if _known(in_shape(k)):
                res[k] = ((len(in_shape(k)),), in_shape(k))
        return res
    elif t == "Unpack" and v(0) is not None and len(v(0)[0]) == 1 and op.attrs.get(
            "axis", 0) in (0, -1):
        # a shape's dimensions one by one (tf.image.extract_patches' gradient builds its
        # reshapes from them: left unknown, its 1.1 MiB tensors counted 0 bytes)
        return {k: ((), (x,)) for k, x in enumerate(v(0)[1])}
    elif t == "Size" and ins and _known(in_shape(0)):
        out = ((), (math.prod(in_shape(0)),))
    elif t == "Rank" and ins and in_shape(0) is not None:
        out = ((), (len(in_shape(0)),))
    elif t in ("Identity", "StopGradient") and v(0) is not None:
        out = v(0)
    elif t == "Cast" and v(0) is not None:
        out = _cast(v(0), op.outputs[0].dtype)
    elif t in _ROUNDINGS and v(0) is not None and len(v(0)[1]) == 1 and isinstance(
            v(0)[1][0], float):
        out = ((), (float(_ROUNDINGS[t](v(0)[1][0])),))
    elif t == "InvertPermutation" and v(0) is not None and len(v(0)[0]) == 1 and sorted(
        v(0)[1]
    ) == list(range(len(v(0)[1]))):
        # Tensordot's gradient transposes by the inverse of its forward permutation.
        inverse = [0] * len(v(0)[1])
        for k, p in enumerate(v(0)[1]):
            inverse[p] = k
        out = (v(0)[0], tuple(inverse))
    elif t == "Pack" and ins and all(v(k) is not None and v(k)[0] == () for k in range(len(ins))):
        out = ((len(ins),), tuple(v(k)[1][0] for k in range(len(ins))))
    elif t == "ConcatV2" and len(ins) >= 2 and all(v(k) is not None for k in range(len(ins))):
        parts = [v(k) for k in range(len(ins) - 1)]
        if all(len(s) == 1 for s, _ in parts):
            flat = tuple(x for _, xs in parts for x in xs)
            out = ((len(flat),), flat)
        elif len(v(len(ins) - 1)[1]) == 1 and len({len(s) for s, _ in parts}) == 1:
            # an axis of N-D values (a padding's [[before, after], ...] built column by
            # column: flattened, its values came out in the wrong places)
            import numpy as np  # (here only: `lms inspect` starts without numpy)

            axis = v(len(ins) - 1)[1][0]
            try:
                joined = np.concatenate([np.asarray(xs).reshape(s) for s, xs in parts], axis)
            except (ValueError, np.exceptions.AxisError):
                joined = None
            if joined is not None:
                out = (tuple(joined.shape), tuple(int(x) for x in joined.ravel()))
    elif t in ("Reshape", "ExpandDims", "Squeeze") and v(0) is not None:
        n = len(v(0)[1])
        out = ((n,), v(0)[1]) if t != "Squeeze" or n == 1 else None
        if t == "Squeeze" and n == 1:
            out = ((), v(0)[1])
        elif t == "Reshape" and len(ins) > 1 and v(1) is not None:
            # the shape it is given, which a later concatenation along an axis needs
            dims = list(v(1)[1])
            if dims.count(-1) == 1 and math.prod(d for d in dims if d != -1):
                dims[dims.index(-1)] = n // math.prod(d for d in dims if d != -1)
            if -1 not in dims and math.prod(dims) == n:
                out = (tuple(dims), v(0)[1])
    elif t == "GatherV2" and v(0) is not None and v(1) is not None and len(v(0)[0]) == 1:
        params, idx = v(0)[1], v(1)[1]
        if all(-len(params) <= k < len(params) for k in idx):
            out = (v(1)[0], tuple(params[k] for k in idx))
    elif t == "StridedSlice" and all(v(k) is not None for k in range(4)) and len(v(0)[0]) == 1:
        out = _strided_slice(op, v(0)[1], v(1)[1], v(2)[1], v(3)[1])
    elif (t == "Slice" and all(v(k) is not None for k in range(3)) and len(v(0)[0]) == 1
            and len(v(1)[1]) == len(v(2)[1]) == 1):
        # a vector's part (a list's element shape: a stacked sequence's shape less its
        # first dimension); size -1 takes the rest
        xs, begin, size = v(0)[1], v(1)[1][0], v(2)[1][0]
        end = len(xs) if size == -1 else begin + size
        if 0 <= begin <= end <= len(xs):
            out = ((end - begin,), tuple(xs[begin:end]))
    elif t in ("Prod", "Sum", "Max", "Min") and v(0) is not None and len(v(0)[0]) <= 1:
        xs = v(0)[1]
        red = {"Prod": math.prod, "Sum": sum, "Max": max, "Min": min}[t]
        if xs or t in ("Prod", "Sum"):
            keep = op.attrs.get("keep_dims", False) and len(v(0)[0]) == 1
            out = ((1,) if keep else (), (int(red(xs)),))
    elif (t in _BINARY and v(0) is not None and v(1) is not None
          and not (v(0)[1] and v(1)[1]) and len(v(0)[1]) <= 1 and len(v(1)[1]) <= 1):
        # an empty vector with a scalar is empty (the axes of an einsum gradient's sum
        # over no axis: left unknown, its 1 MiB tensors counted 0 bytes)
        out = v(0) if not v(0)[1] else v(1)
    elif t in _BINARY and v(0) is not None and v(1) is not None and v(0)[1] and v(1)[1]:
        a, b = v(0), v(1)
        if len(a[1]) == 1 or len(b[1]) == 1 or len(a[1]) == len(b[1]):
            n = max(len(a[1]), len(b[1]))
            xs = [_BINARY[t](a[1][k % len(a[1])], b[1][k % len(b[1])]) for k in range(n)]
            if None not in xs:
                out = (a[0] if len(a[1]) >= len(b[1]) else b[0], tuple(xs))
    elif t in ("Select", "SelectV2") and all(v(k) is not None and v(k)[1] for k in range(3)):
        cond, a, b = v(0), v(1), v(2)
        if len(cond[1]) == 1 and (t == "Select" or a[0] == b[0]):
            out = a if cond[1][0] else b  # a scalar condition picks a whole tensor
        elif len(cond[1]) == len(a[1]) == len(b[1]) and a[0] == b[0]:
            out = (a[0], tuple(x if c else y for c, x, y in zip(cond[1], a[1], b[1],
                                                                 strict=True)))
    elif t == "Range" and all(v(k) is not None and v(k)[1] for k in range(3)):
        start, limit, delta = v(0)[1][0], v(1)[1][0], v(2)[1][0]
        if delta and 0 <= (limit - start) // delta <= _MAX_VALUE:
            r = tuple(range(start, limit, delta))
            out = ((len(r),), r)
    elif t == "Fill" and v(0) is not None and v(1) is not None and len(v(0)[1]) <= 1 and v(1)[1]:
        n = v(0)[1][0] if v(0)[1] else 1
        if 0 <= n <= _MAX_VALUE:
            out = (v(0)[1], (v(1)[1][0],) * n)
    elif t in ("DynamicStitch", "ParallelDynamicStitch") and len(ins) % 2 == 0 and all(
        v(k) is not None for k in range(len(ins))
    ):
        half = len(ins) // 2
        merged: dict[int, int] = {}
        for k in range(half):
            for idx, x in zip(v(k)[1], v(half + k)[1], strict=False):
                merged[idx] = x
        if sorted(merged) == list(range(len(merged))):
            out = ((len(merged),), tuple(merged[k] for k in range(len(merged))))
    elif t == "ListDiff" and v(0) is not None and v(1) is not None and len(v(0)[0]) == 1:
        # the axes a reduction's gradient keeps (tf.reduce_prod's: its transposes' sizes)
        drop = set(v(1)[1])
        kept = [(k, x) for k, x in enumerate(v(0)[1]) if x not in drop]
        return {0: ((len(kept),), tuple(x for _, x in kept)),
                1: ((len(kept),), tuple(k for k, _ in kept))}
    elif t == "BroadcastGradientArgs" and v(0) is not None and v(1) is not None:
        r0, r1 = _broadcast_gradient_args(v(0)[1], v(1)[1])
        return {0: ((len(r0),), r0), 1: ((len(r1),), r1)}
    return {} if out is None or len(out[1]) > _MAX_VALUE else {0: out}


#: What reads floating-point values (:func:`_int_values`): a cast, arithmetic, roundings.
_FLOAT_ARITHMETIC = frozenset({"Cast", "Identity", "StopGradient", "Mul", "RealDiv", "AddV2",
                               "Add", "Sub", "Maximum", "Minimum", "Ceil", "Floor", "Round"})


def _floating(value: Value | None) -> bool:
    """Whether an evaluated value is a floating-point one (:data:`_FLOAT_VALUE_DTYPES`).

    >>> _floating(((), (1.25,))), _floating(((2,), (3, 4))), _floating(None)
    (True, False, False)
    """
    return value is not None and bool(value[1]) and isinstance(value[1][0], float)


#: Roundings of a floating-point scalar (TensorFlow's ``Round`` rounds half to even, as
#: Python's ``round``).
_ROUNDINGS = {"Ceil": math.ceil, "Floor": math.floor, "Round": round}


def _cast(value: Value, dtype: str) -> Value | None:
    """``value`` cast to ``dtype``: a float truncated toward zero into an integer.

    >>> _cast(((), (160.0,)), "int32"), _cast(((), (3,)), "float"), _cast(((2,), (1, 0)), "bool")
    (((), (160,)), ((), (3.0,)), ((2,), (True, False)))
    """
    shape, xs = value
    if dtype in _FLOAT_VALUE_DTYPES:
        return (shape, tuple(float(x) for x in xs)) if len(xs) == 1 and not shape else None
    if dtype == "bool":
        return shape, tuple(bool(x) for x in xs)
    if dtype in _VALUE_DTYPES:
        return shape, tuple(int(x) for x in xs)  # (int() truncates toward zero, as TF)
    return None


def _strided_slice(op: Op, x, begin, end, strides) -> Value | None:
    a = op.attrs
    if a.get("ellipsis_mask", 0) or a.get("new_axis_mask", 0) or len(begin) != 1:
        return None
    if len(end) != 1 or len(strides) != 1:
        return None
    n, stride = len(x), strides[0]
    if stride == 0:
        return None
    if a.get("shrink_axis_mask", 0) & 1:
        k = begin[0] + n if begin[0] < 0 else begin[0]
        return ((), (x[k],)) if 0 <= k < n else None
    b = None if a.get("begin_mask", 0) & 1 else begin[0]
    e = None if a.get("end_mask", 0) & 1 else end[0]
    sl = x[slice(b, e, stride)]
    return ((len(sl),), tuple(sl))


def _strided_slice_shape(
    attrs: dict, src: tuple[int, ...], begin, end, strides,
) -> tuple[int, ...] | None:
    """Output shape of a ``StridedSlice`` of a tensor of shape ``src`` (TensorFlow's rule).

    Each entry of ``begin``/``end``/``strides`` takes the next input dimension as Python's
    slice does (a mask bit leaves that bound open), but a ``shrink_axis_mask`` bit drops it,
    a ``new_axis_mask`` bit inserts a 1 instead, and the ``ellipsis_mask`` bit stands for
    the dimensions no other entry takes; dimensions left after the last entry are kept.

    Examples
    --------
    >>> _strided_slice_shape({"new_axis_mask": 1, "begin_mask": 2, "end_mask": 2},
    ...                      (512,), (0, 0), (0, 0), (1, 1))   # s[None, :]
    (1, 512)
    >>> _strided_slice_shape({"ellipsis_mask": 1, "shrink_axis_mask": 2},
    ...                      (4, 5, 6), (0, -1), (0, 0), (1, 1))   # x[..., -1]
    (4, 5)
    >>> _strided_slice_shape({}, (10, 3), (2,), (-1,), (3,))   # x[2:-1:3]
    (3, 3)
    """
    k = len(begin)
    if len(end) != k or len(strides) != k:
        return None
    bm, em = attrs.get("begin_mask", 0), attrs.get("end_mask", 0)
    el, na, sh = (attrs.get(m, 0) for m in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask"))
    out: list[int] = []
    d = 0
    for i in range(k):
        if el >> i & 1:
            taken = sum(1 for j in range(i + 1, k) if not (na >> j & 1 or el >> j & 1))
            n = len(src) - d - taken
            if n < 0 or el >> (i + 1):  # (one ellipsis at most)
                return None
            out.extend(src[d:d + n])
            d += n
            continue
        if na >> i & 1:
            out.append(1)
            continue
        if d >= len(src) or strides[i] == 0:
            return None
        n = src[d]
        d += 1
        if sh >> i & 1:
            continue
        lo = None if bm >> i & 1 else begin[i]
        hi = None if em >> i & 1 else end[i]
        out.append(len(range(*slice(lo, hi, strides[i]).indices(n))))
    return (*out, *src[d:])


def _broadcast_gradient_args(s0, s1) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Reduction indices of each side of a broadcast binary op (TensorFlow's rule)."""
    n = max(len(s0), len(s1))
    a = (1,) * (n - len(s0)) + tuple(s0)
    b = (1,) * (n - len(s1)) + tuple(s1)
    r0 = tuple(k for k in range(n) if a[k] == 1 and b[k] != 1 or (a[k] == b[k] == 1))
    r1 = tuple(k for k in range(n) if b[k] == 1 and a[k] != 1 or (a[k] == b[k] == 1))
    return r0, r1


#: Image ops whose output is the input images resampled to a size: the input holding it.
_IMAGE_RESAMPLES = {
    "ImageProjectiveTransformV2": 2, "ImageProjectiveTransformV3": 2,
    "ResizeBilinear": 1, "ResizeNearestNeighbor": 1, "ResizeBicubic": 1, "ResizeArea": 1,
    "ScaleAndTranslate": 1,
}


#: Segment reductions whose row count is their ``num_segments`` input.
_UNSORTED_SEGMENTS = frozenset({
    "UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin", "UnsortedSegmentProd",
})
#: Sparse segment reductions (``tf.nn.embedding_lookup_sparse``): one row per segment,
#: which only the segment ids say, not one per row of their data.
_SPARSE_SEGMENTS = frozenset({"SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN"})
#: Sparse segment ops whose rows are their fourth input's value: ``num_segments``, or a
#: gradient's ``output_dim0``.
_SPARSE_SEGMENT_COUNTED = frozenset({
    "SparseSegmentSumWithNumSegments", "SparseSegmentMeanWithNumSegments",
    "SparseSegmentSqrtNWithNumSegments", "SparseSegmentSumGrad", "SparseSegmentMeanGrad",
    "SparseSegmentSqrtNGrad",
})


def _rows_indexed(graph: Graph, i: int, shapes: list) -> int | None:
    """The fewest rows of a table that output 0 of op ``i`` indexes (a gather's indices).

    Valid indices of a table of R rows take at most R distinct values. None where no
    consumer is a gather along the first axis of a table of known rows.
    """
    ops, adj = graph.ops, graph.adjacency
    best = None
    for c in dict.fromkeys(adj.consumers.get((i, 0), ())):
        op = ops[c]
        ins = adj.data_in[c]
        if len(ins) < 2 or ins[1] != (i, 0) or op.attrs.get("batch_dims", 0):
            continue
        rows = None
        p, q = ins[0]
        if op.type in ("GatherV2", "Gather"):
            axis = _const_value(graph, c, 2) if op.type == "GatherV2" else (0,)
            params = shapes[p][q] if shapes[p] else None
            if axis == (0,) and params and params[0] >= 0:
                rows = params[0]
        elif op.type == "ResourceGather":
            while ops[p].type == "Identity" and adj.data_in[p]:
                p, _ = adj.data_in[p][0]
            shape = ops[p].attrs.get("shape" if ops[p].type in VARIABLE_OPS else "handle_shape")
            if shape and shape[0] >= 0:
                rows = shape[0]
        if rows is not None:
            best = rows if best is None else min(best, rows)
    return best


def _einsum_shape(equation: str, shapes: list[tuple[int, ...] | None]
                  ) -> tuple[int, ...] | None:
    """Output shape of an ``Einsum`` from its equation and its inputs' shapes, or None.

    Each label takes its dimension from the inputs; ``...`` stands for the dimensions no
    label takes, broadcast across the inputs as numpy does. The recorded shape of an
    ellipsis output moved to the end (``...te,...td->de...``, an einsum gradient) left the
    batch unknown.

    Examples
    --------
    >>> _einsum_shape("...te,...td->de...", [(8, 16, 32), (8, 16, 4)])
    (4, 32, 8)
    >>> _einsum_shape("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)])
    (2, 3, 5)
    """
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if not arrow or len(terms) != len(shapes) or any(s is None for s in shapes):
        return None
    dims: dict[str, int] = {}
    ellipsis: list[int] = []
    for term, shape in zip(terms, shapes, strict=True):
        head, dots, tail = term.partition("...")
        n = len(shape) - len(head) - len(tail)
        if n < 0 or (not dots and n):
            return None
        labels = head + tail
        for label, d in zip(labels, shape[:len(head)] + shape[len(shape) - len(tail):],
                            strict=True):
            if d >= 0 and dims.get(label, 1) in (1, -1):
                dims[label] = d
            else:
                dims.setdefault(label, d)
        own = list(shape[len(head):len(head) + n])
        if len(own) > len(ellipsis):
            ellipsis = [1] * (len(own) - len(ellipsis)) + ellipsis
        for k, d in enumerate(own, start=len(ellipsis) - len(own)):
            if ellipsis[k] in (1, -1) and d != 1:
                ellipsis[k] = d
    head, dots, tail = rhs.partition("...")
    if any(label not in dims for label in head + tail):
        return None
    out = (*(dims[x] for x in head), *(ellipsis if dots else ()), *(dims[x] for x in tail))
    return None if -1 in out else tuple(out)


def _svd_shape(attrs: dict, port: int, src: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Output ``port`` of ``Svd`` (``s``, ``u``, ``v``) of a ``[..., m, n]`` input.

    ``s`` has ``p = min(m, n)`` values, ``u`` is ``[m, p]`` and ``v`` ``[n, p]`` (``m`` and
    ``n`` square with ``full_matrices``). The gradient of ``svd(z, compute_uv=False)`` of a
    tall ``[batch, 24]`` product computes ``u`` and ``v`` again: left unknown, and the
    singular values' diagonal sized by the batch, it simulated at 3.71 of measured.

    >>> _svd_shape({}, 0, (256, 24)), _svd_shape({}, 1, (256, 24)), _svd_shape({}, 2, (256, 24))
    ((24,), (256, 24), (24, 24))
    >>> _svd_shape({"full_matrices": True}, 1, (8, 5, 3))
    (8, 5, 5)
    """
    if src is None or len(src) < 2 or -1 in src or not 0 <= port <= 2:
        return None
    *lead, m, n = src
    p = min(m, n)
    full = bool(attrs.get("full_matrices"))
    if port == 0:
        return (*lead, p)
    side = m if port == 1 else n
    return (*lead, side, side if full else p)


def _shape_from_values(
    graph: Graph, i: int, port: int, vals: dict[tuple[int, int], Value], shapes: list
) -> tuple[int, ...] | None:
    """Exact output shape of ops whose shape is given by an integer input, or None."""
    op = graph.ops[i]
    t = op.type
    ins = graph.adjacency.data_in[i]
    if t == "Svd" and ins:
        return _svd_shape(op.attrs, port, shapes[ins[0][0]][ins[0][1]])
    if port != 0:
        return None

    def v(k: int) -> tuple[int, ...] | None:
        val = vals.get(ins[k]) if k < len(ins) else None
        if val is None or _floating(val):
            return None  # (a floating-point scalar is no size, axis or permutation)
        return val[1]

    def in_shape(k: int) -> tuple[int, ...] | None:  # None for an input it lacks
        if k >= len(ins):
            return None
        p, pt = ins[k]
        return shapes[p][pt]

    if t == "RaggedTensorToTensor" and v(0) is not None and len(ins) > 3:
        # the dense shape asked for, its unknown first dimension the rows of the first
        # row partition: a ROW_SPLITS vector has one more entry than rows (the dense
        # tensor took 33 rows for 32, and its gradient's mask the 2,048 flat values')
        dims = list(v(0))
        kind = (*op.attrs.get("row_partition_types", ()), "")[0]
        splits, first = in_shape(3), v(3)
        if dims and dims[0] == -1:
            if kind == "ROW_SPLITS" and splits and len(splits) == 1 and splits[0] > 0:
                dims[0] = splits[0] - 1
            elif kind == "FIRST_DIM_SIZE" and first is not None and len(first) == 1:
                dims[0] = first[0]
        return tuple(dims) if -1 not in dims else None
    if t == "Einsum" and isinstance(op.attrs.get("equation"), str):
        shape = _einsum_shape(op.attrs["equation"], [in_shape(k) for k in range(len(ins))])
        if shape is not None:
            return shape
    if t == "Reshape" and v(1) is not None:
        dims = list(v(1))
        src = in_shape(0)
        if dims.count(-1) == 1 and _known(src):
            known = math.prod(d for d in dims if d != -1)
            if known > 0:
                dims[dims.index(-1)] = math.prod(src) // known
        return tuple(dims) if -1 not in dims else None
    if t in _REDUCTIONS and v(1) is not None and in_shape(0) is not None:
        src = in_shape(0)
        axes = {a % len(src) for a in v(1)} if src else set()
        if op.attrs.get("keep_dims", False):
            return tuple(1 if k in axes else d for k, d in enumerate(src))
        return tuple(d for k, d in enumerate(src) if k not in axes)
    if t == "Tile" and v(1) is not None and _known(in_shape(0)) and len(v(1)) == len(in_shape(0)):
        return tuple(d * m for d, m in zip(in_shape(0), v(1), strict=True))
    if t in ("BroadcastTo", "StridedSliceGrad") and v(1 if t == "BroadcastTo" else 0) is not None:
        return v(1 if t == "BroadcastTo" else 0)
    if t == "Fill" and v(0) is not None:
        return v(0)
    if t == "TensorListStack" and v(1) is not None and min(v(1), default=0) >= 0:
        # the elements' shape as an input value, where the recorded one left the batch
        # open inside it (a tf.scan's gradient stacks elements [2, batch, ...] of a stacked
        # [time, 2, batch, ...] sequence: counted as 0 bytes, 0.90 of measured)
        count = op.outputs[0].shape[0] if op.outputs[0].shape else -1
        if count < 0:
            count = op.attrs.get("num_elements", -1)
        if isinstance(count, int) and count >= 0:
            return (count, *v(1))
    if t in ("ScatterNd", "CropAndResizeGradImage") and v(2 if t == "ScatterNd" else 3):
        # the shape given as an input value (a max-unpooling's output from tf.size, a crop
        # gradient's from the images' shape); the data flow gave the updates' rows, or
        # the boxes' for the images
        return v(2 if t == "ScatterNd" else 3)
    if t == "CropAndResize" and v(3) is not None and len(v(3)) == 2:
        boxes, images = in_shape(1), in_shape(0)
        if boxes and images and len(images) == 4 and boxes[0] >= 0 and images[3] >= 0:
            # one crop per box, not per image (eight boxes an image measured 8x the
            # simulated crops, and their gradients' images 8x over)
            return (boxes[0], *v(3), images[3])
    if t in ("Pad", "PadV2", "MirrorPad") and v(1) is not None and _known(in_shape(0)):
        src, pads = in_shape(0), v(1)
        if len(pads) == 2 * len(src):
            return tuple(d + pads[2 * k] + pads[2 * k + 1] for k, d in enumerate(src))
    if t == "Range" and all(v(k) is not None and len(v(k)) == 1 for k in range(3)):
        # its length, where its values are too many to keep (the first, a batch, was taken
        # for it: the token indices of a mixture of experts counted 16 rows for 1,024)
        start, limit, delta = v(0)[0], v(1)[0], v(2)[0]
        n = max(0, -(-(limit - start) // delta)) if delta else -1
        if 0 <= n <= _MAX_BYTES // 8:  # (a length no tensor can have leaves it unknown)
            return (n,)
    if (t == "StridedSlice" and _known(in_shape(0))
            and all(v(k) is not None for k in (1, 2, 3))):
        # any dimension, where only the first followed the data (s[None, :] of a batch
        # of scores stayed (1, unknown), and a pairwise difference with it a batch wide)
        exact = _strided_slice_shape(op.attrs, in_shape(0), v(1), v(2), v(3))
        if exact is not None:
            return exact
    if t == "SparseTensorDenseMatMul" and v(2) is not None and _known(in_shape(3)):
        # rows of the sparse operand's dense shape (an input value), columns of the dense
        # operand's; the data flow would carry its rows from the coordinates' count
        a_shape, b = v(2), in_shape(3)
        if len(a_shape) == 2 and len(b) == 2:
            return (a_shape[1] if op.attrs.get("adjoint_a") else a_shape[0],
                    b[0] if op.attrs.get("adjoint_b") else b[1])
    if t == "OneHot" and v(1) is not None and len(v(1)) == 1 and _known(in_shape(0)):
        # the depth a computed value gives (a mixture of experts' capacity)
        src, depth = in_shape(0), v(1)[0]
        axis = op.attrs.get("axis", -1)
        if depth >= 0 and isinstance(axis, int) and -1 <= axis <= len(src):
            axis = len(src) if axis == -1 else axis
            return (*src[:axis], depth, *src[axis:])
    if t == "Where" and len(ins) == 1 and _known(in_shape(0)):
        # one row of coordinates per true element: how many is known only from the data,
        # so every element (the most it can be, and what a dense mask gives). Filled with
        # the batch, a (64, 20000) mask's 20.5 MB of coordinates counted 1 KB.
        return (math.prod(in_shape(0)), len(in_shape(0)))
    if t == "Slice" and v(1) is not None and v(2) is not None and _known(in_shape(0)):
        # size -1: the rest of the dimension from begin (a sampled softmax slices the
        # sampled classes' weights after the batch's own rows)
        src, begin, size = in_shape(0), v(1), v(2)
        if len(begin) == len(size) == len(src) and all(
                0 <= b <= d for b, d in zip(begin, src, strict=True)):
            out = tuple(d - b if n == -1 else n
                        for b, n, d in zip(begin, size, src, strict=True))
            if all(0 <= n for n in out):
                return out
    if t == "Pack" and ins and all(_known(in_shape(k)) for k in range(len(ins))):
        # N equal shapes stacked along a new axis (a TimeDistributed layer's steps)
        src = in_shape(0)
        axis = op.attrs.get("axis", 0)
        if isinstance(axis, int) and all(in_shape(k) == src for k in range(len(ins))):
            axis = axis + len(src) + 1 if axis < 0 else axis
            if 0 <= axis <= len(src):
                return (*src[:axis], len(ins), *src[axis:])
    if t in ("MatrixDiag", "MatrixDiagV2", "MatrixDiagV3") and _known(in_shape(0)) and in_shape(0):
        # a main diagonal made a matrix (tf.eye): square, unless its rows or columns are set
        diag = in_shape(0)
        if t == "MatrixDiag":
            return (*diag, diag[-1])
        if v(1) in ((0,), ()) and len(ins) >= 4:
            rows = v(2)[0] if v(2) and v(2)[0] > 0 else diag[-1]
            cols = v(3)[0] if v(3) and v(3)[0] > 0 else diag[-1]
            return (*diag[:-1], rows, cols)
    if t in ("GatherV2", "Gather") and _known(in_shape(0)) and _known(in_shape(1)):
        # params[:axis] + indices[batch_dims:] + params[axis + 1:]: rows per index, not
        # per row of params (a graph network's edges gathered from its nodes)
        params, indices = in_shape(0), in_shape(1)
        axis = (v(2) or (None,))[0] if t == "GatherV2" else 0
        nb = op.attrs.get("batch_dims", 0) or 0
        if axis is not None and params and isinstance(nb, int) and 0 <= nb <= len(indices):
            axis %= len(params)
            return (*params[:axis], *indices[nb:], *params[axis + 1:])
    if t == "GatherNd" and _known(in_shape(0)) and _known(in_shape(1)) and in_shape(1):
        params, indices = in_shape(0), in_shape(1)
        if indices[-1] <= len(params):
            return (*indices[:-1], *params[indices[-1]:])
    if t in _UNSORTED_SEGMENTS and v(2) is not None and len(v(2)) == 1 and v(2)[0] >= 0 and (
            _known(in_shape(0)) and in_shape(1) is not None):
        # num_segments rows of the data's trailing dimensions
        return (v(2)[0], *in_shape(0)[len(in_shape(1)):])
    if t in _SPARSE_SEGMENT_COUNTED and v(3) is not None and len(v(3)) == 1 and v(3)[0] >= 0 and (
            _known(in_shape(0))):
        # rows given by an input (num_segments; a gradient's output_dim0, the rows gathered)
        return (v(3)[0], *in_shape(0)[1:])
    if t in ("Unique", "UniqueWithCounts") and _known(in_shape(0)) and len(in_shape(0)) == 1:
        # distinct values: at most one per element and, where they index a table, one per
        # row of it (8 ids per example over a 1,000-row embedding: 8,192 rows counted at
        # batch 1,024 where at most 1,000 can be)
        n = in_shape(0)[0]
        rows = _rows_indexed(graph, i, shapes)
        return (n if rows is None else min(n, rows),)
    if t == "Transpose" and v(1) is not None and _known(in_shape(0)):
        # a computed permutation (the gradient's InvertPermutation of the forward one)
        src, perm = in_shape(0), v(1)
        if sorted(perm) == list(range(len(src))):
            return tuple(src[k] for k in perm)
    # images [batch, height, width, channels] resampled to the size an input gives
    # (Keras' RandomRotation, RandomZoom, Resizing compute it from the images' shape)
    size_input = _IMAGE_RESAMPLES.get(t)
    if size_input is not None and len(ins) > size_input:
        src, size = in_shape(0), v(size_input)
        if src is not None and len(src) == 4 and size is not None and len(size) == 2:
            return (src[0], *size, src[3])
    if t in ("SpaceToBatchND", "BatchToSpaceND") and len(ins) == 3:
        return _space_batch(t, in_shape(0), v(1), v(2), op.outputs[0].shape)
    if t in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3") and len(ins) >= 2:
        a, b = in_shape(0), in_shape(1)
        if not (_known(a) and _known(b)) or len(a) < 2 or len(b) < 2:
            return None
        ta = op.attrs.get("transpose_a", op.attrs.get("adj_x", False))
        tb = op.attrs.get("transpose_b", op.attrs.get("adj_y", False))
        rows = a[-1] if ta else a[-2]
        cols = b[-2] if tb else b[-1]
        batch_a, batch_b = a[:-2], b[:-2]
        n = max(len(batch_a), len(batch_b))
        batch_a = (1,) * (n - len(batch_a)) + batch_a
        batch_b = (1,) * (n - len(batch_b)) + batch_b
        return tuple(max(x, y) for x, y in zip(batch_a, batch_b, strict=True)) + (rows, cols)
    return None


def _space_batch(
    op_type: str, src: tuple[int, ...] | None, block: tuple[int, ...] | None,
    pads: tuple[int, ...] | None, recorded: tuple[int, ...] | None,
) -> tuple[int, ...] | None:
    """Output shape of ``SpaceToBatchND`` / ``BatchToSpaceND`` (a dilated convolution).

    Their first dimension is the input's times (or divided by) the block's size, not the
    input's: rule 4 would size a dilation-8 convolution's tensors 8 times too small.
    ``pads`` (paddings or crops, ``[start, end]`` per block dimension) may be unknown; the
    recorded spatial dimensions serve then.

    >>> _space_batch("SpaceToBatchND", (4, 100, 16), (8,), (0, 4), None)
    (32, 13, 16)
    >>> _space_batch("BatchToSpaceND", (32, 13, 16), (8,), (0, 4), (-1, 100, 16))
    (4, 100, 16)
    >>> _space_batch("BatchToSpaceND", (30, 13, 16), (8,), None, (-1, 100, 16)) is None
    True
    """
    if not _known(src) or block is None or not block or min(block) < 1 or len(src) <= len(block):
        return None
    m, k = len(block), math.prod(block)
    if op_type == "SpaceToBatchND":
        first = src[0] * k
    elif src[0] % k == 0:
        first = src[0] // k
    else:
        return None
    if pads is not None and len(pads) == 2 * m:
        if op_type == "SpaceToBatchND":
            spatial = [(src[1 + j] + pads[2 * j] + pads[2 * j + 1]) // block[j] for j in range(m)]
        else:
            spatial = [src[1 + j] * block[j] - pads[2 * j] - pads[2 * j + 1] for j in range(m)]
    elif recorded is not None and len(recorded) == len(src):
        spatial = list(recorded[1:1 + m])
    else:
        return None
    out = (first, *spatial, *src[1 + m:])
    return out if min(out) >= 0 else None


# --- While loops: the body as a graph of its own ------------------------------------------

#: Output argument names of the multi-output ops found in loop bodies (TensorFlow's op
#: registry), so that a body's ``node:arg:index`` references map to output ports. Ops with
#: one output argument need none (the index is the port).
_OUTPUT_ARGS: dict[str, tuple[str, ...]] = {
    "TensorListPopBack": ("output_handle", "tensor"),
    "BroadcastGradientArgs": ("r0", "r1"),
    "Unique": ("y", "idx"),
    "TopKV2": ("values", "indices"),
    "Switch": ("output_false", "output_true"),
    "Merge": ("output", "value_index"),
    "SparseSoftmaxCrossEntropyWithLogits": ("loss", "backprop"),
    "SoftmaxCrossEntropyWithLogits": ("loss", "backprop"),
    "FusedBatchNormV3": ("y", "batch_mean", "batch_variance", "reserve_space_1",
                         "reserve_space_2", "reserve_space_3"),
    "FusedBatchNormGradV3": ("x_backprop", "scale_backprop", "offset_backprop",
                             "reserve_space_4", "reserve_space_5"),
}
#: Ops of a body through which a value passes unchanged.
_PASS_OPS = frozenset({"Identity", "IdentityN", "StopGradient", "Snapshot"})
#: Loop-variable kinds :func:`loop_variables` reports.
LOOP_KINDS = ("pass", "carried", "filled", "consumed", "refs", "duplicate")


@dataclass(frozen=True)
class LoopBody:
    """What one iteration of a ``While`` op does with its loop variables.

    Attributes
    ----------
    graph : Graph
        The body as a graph: one ``_LoopArg`` op per loop variable (its shape is the
        ``While`` input's, known at the batch size), then the body's nodes.
    kinds : tuple of str
        Per loop variable: ``"pass"`` (returned unchanged), ``"carried"`` (a new value
        each iteration), ``"filled"`` (a list the body pushes or sets fresh values into),
        ``"consumed"`` (a list the body pops), ``"refs"`` (a list the body pushes elements
        of another list into: it holds that list's memory), ``"duplicate"`` (a list the
        body pushes a loop variable's previous value into, which another list holds as
        that variable's new value one iteration earlier).
    sources : tuple of int
        Per loop variable, for ``"refs"``: the loop variable whose list it references;
        else -1.
    returns : tuple of str
        Per loop variable, the body tensor (``"op:port"``) that is its next value (``""``
        when the body does not name one).
    """

    graph: Graph
    kinds: tuple[str, ...]
    sources: tuple[int, ...]
    returns: tuple[str, ...] = ()


def _body_ref(ref: str, args: dict[str, int], nodes: dict[str, Any]) -> str:
    """A body reference (``arg``, ``node:out_arg:k``) as ``"op:port"``."""
    parts = ref.split(":")
    if parts[0] in args or len(parts) == 1:
        return f"{parts[0]}:0"
    node = nodes.get(parts[0])
    k = int(parts[-1]) if parts[-1].isdigit() else 0
    names = _OUTPUT_ARGS.get(node.op, ()) if node is not None else ()
    if len(parts) == 3 and parts[1] in names:
        return f"{parts[0]}:{names.index(parts[1]) + k}"
    return f"{parts[0]}:{k}"


def loop_body(graph: Graph, i: int, sizes_of_inputs: tuple[tuple[int, ...] | None, ...]
              ) -> LoopBody | None:
    """The body of ``While`` op ``i`` as a graph, and what it does with each loop variable.

    Parameters
    ----------
    graph : Graph
        The graph holding the ``While`` op (and, in its GraphDef, the function library).
    i : int
        Index of the ``While`` op.
    sizes_of_inputs : tuple
        Resolved shapes of the op's inputs (the loop variables' shapes).

    Returns
    -------
    LoopBody or None
        None when the graph keeps no GraphDef or the body is not in its library.
    """
    op = graph.ops[i]
    names = op.attrs.get("body", ())
    if graph.graphdef is None or not names:
        return None
    key = (names[0], tuple(sizes_of_inputs))
    return _loop_body(graph.graphdef, key)


def resolve_function(body: Graph, batch_size: int,
                     seeds: tuple[tuple[str, tuple[int, ...]], ...] = ()) -> Sizes:
    """:func:`resolve` of a function body (:func:`function_body`, :func:`loop_body`).

    Its arguments (``_LoopArg`` ops, of the caller's shapes) resolve as feeds would: an
    unknown first dimension is the batch. ``seeds``: ``(argument's name, flat values)``
    of the small integer arguments whose values are known (:func:`loop_seeds`), shaped as
    the argument is.
    """
    known = {}
    for name, flat in seeds:
        k = body.index.get(name)
        if k is None or body.ops[k].type != "_LoopArg":
            continue
        shape = body.ops[k].outputs[0].shape if body.ops[k].outputs else None
        if shape is not None and -1 not in shape and math.prod(shape) == len(flat):
            known[k] = (tuple(shape), tuple(flat))
    return resolve(body.replace([as_feed(op) if op.type == "_LoopArg" else op
                                 for op in body.ops], body.source), batch_size, known)


def loop_seeds(graph: Graph, i: int, body: LoopBody,
               value_of: Callable[[tuple[int, int]], tuple[int, ...] | None]
               ) -> tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]:
    """Known values of a ``While`` op's small integer loop variables, per iteration to size.

    Those iterations are the first and, when the trip count is known, the last. A
    variable the body passes on unchanged keeps the value it enters with (a micro-batch
    size); a counter the body steps by a constant (``i + 1``) has its first value, then
    its last. A body's slice ``x[i * m:(i + 1) * m]`` of a whole batch was sized as the
    whole batch, every iteration: a gradient accumulated over 8 micro-batches in a
    ``tf.while_loop`` simulated at 2.19 of measured. Sizes that grow or shrink with the
    counter are largest at one end of the loop; the caller takes the larger.

    Returns
    -------
    tuple
        One seeds tuple (:func:`resolve_function`) per iteration to size; empty when
        nothing is known.
    """
    ins = graph.adjacency.data_in[i]
    fixed: list[tuple[str, tuple[int, ...]]] = []
    counters: list[tuple[int, int, int]] = []
    for k, kind in enumerate(body.kinds):
        if k >= len(ins) or graph.ops[ins[k][0]].outputs[ins[k][1]].dtype not in (
                "int32", "int64"):
            continue
        value = value_of(ins[k])
        if value is None or len(value) > _MAX_VALUE:
            continue
        if kind == "pass":
            fixed.append((body.graph.ops[k].name, tuple(value)))
        elif kind == "carried" and len(value) == 1:
            step = _counter_step(body, k)
            if step:
                counters.append((k, value[0], step))
    trips = trip_count(graph, i, body, value_of) if counters else 0
    if not trips:  # a counter's values unknown past its first: left to the batch
        return (tuple(fixed),) if fixed else ()
    names = [body.graph.ops[k].name for k, _, _ in counters]
    first = (*fixed, *((n, (start,)) for n, (_, start, _) in zip(names, counters, strict=True)))
    last = (*fixed, *((n, (start + (trips - 1) * step,))
                      for n, (_, start, step) in zip(names, counters, strict=True)))
    return (first,) if trips == 1 else (first, last)



def as_feed(op: Op) -> Op:
    """A function argument (``_LoopArg``) as a placeholder."""
    return dataclasses.replace(op, type="Placeholder")


def function_body(graph: Graph, name: str, sizes_of_args: tuple[tuple[int, ...] | None, ...]
                  ) -> LoopBody | None:
    """Function ``name`` of the graph's library as a graph (a branch of an ``If``).

    Read as :func:`loop_body` reads a loop's body: one ``_LoopArg`` op per argument, of
    the shapes given. None when the graph keeps no GraphDef or has no such function.
    """
    if graph.graphdef is None:
        return None
    return _loop_body(graph.graphdef, (name, tuple(sizes_of_args)))


@functools.lru_cache(maxsize=64)
def _loop_body(graphdef: bytes, key: tuple[str, tuple]) -> LoopBody | None:
    from .ir import TensorSpec
    from .load import _compiled_signatures, _output_dtypes, _small_attrs

    fname, arg_shapes = key
    f = _library(graphdef).get(fname)
    if f is None:
        return None
    sigs = _compiled_signatures()
    args = {a.name: k for k, a in enumerate(f.signature.input_arg)}
    nodes = {n.name: n for n in f.node_def}
    ops: list[Op] = []
    for k, a in enumerate(f.signature.input_arg):
        shape = arg_shapes[k] if k < len(arg_shapes) else None
        ops.append(Op(a.name, "_LoopArg", outputs=(TensorSpec(_dtype_name(a.type), shape),)))
    for n in f.node_def:
        shapes = [
            None if sh.unknown_rank else tuple(d.size for d in sh.dim)
            for sh in n.attr["_output_shapes"].list.shape
        ] if "_output_shapes" in n.attr else None
        sig = sigs.get(n.op)
        dtypes = _output_dtypes(n.attr, sig, len(shapes) if shapes is not None else None)
        if shapes is None:
            shapes = [None] * len(dtypes)
        dtypes = (dtypes + ["unknown"] * len(shapes))[: len(shapes)]
        ops.append(Op(
            n.name, n.op, "",
            tuple(_body_ref(t, args, nodes) for t in n.input if not t.startswith("^")),
            tuple(t[1:] for t in n.input if t.startswith("^")),
            tuple(TensorSpec(d, s) for d, s in zip(dtypes, shapes, strict=True)),
            _small_attrs(n),
        ))
    try:
        body = Graph(tuple(ops), f"{fname} (loop body)")
        body.adjacency  # noqa: B018 - a body that does not link up is not modelled
    except GraphError:
        return None
    rets = [f.ret.get(a.name, "") for a in f.signature.output_arg]
    kinds, sources = [], []
    for k, ref in enumerate(rets):
        kind, src = _loop_kind(body, args, nodes, k, ref, rets)
        kinds.append(kind)
        sources.append(src)
    returns = tuple(_body_ref(r, args, nodes) if r else "" for r in rets)
    return LoopBody(body, tuple(kinds), tuple(sources), returns)


def trip_count(graph: Graph, i: int, body: LoopBody | None,
               value_of: Callable[[tuple[int, int]], tuple[int, ...] | None]) -> int:
    """Iterations of ``While`` op ``i`` when they are known before it runs, else 0.

    ``while_v2`` passes ``maximum_iterations`` as loop variable 1, unchanged by the body
    (-1 when the loop has none); a Keras RNN sets it to the number of time steps. A loop
    written by hand (``tf.while_loop(lambda t, h: t < 25, ...)``) has none: its condition
    compares a counter the body steps by a constant with a constant (or a loop variable
    passed unchanged), and the counter's first value is known.

    Parameters
    ----------
    graph : Graph
    i : int
        The ``While`` op.
    body : LoopBody or None
        :func:`loop_body` of the op.
    value_of : callable
        The integer value of a tensor ``(op, port)`` of ``graph``, if known.
    """
    ins = graph.adjacency.data_in[i]
    if body is None:
        return 0
    if len(ins) >= 2 and len(body.kinds) >= 2 and body.kinds[1] == "pass":
        value = value_of(ins[1])
        if value is None:
            value = _iterations_run(graph, ins[1], value_of)
        if value is not None and len(value) == 1 and value[0] > 0:
            return value[0]
    names = graph.ops[i].attrs.get("cond", ())
    bound = _cond_bound(graph.graphdef, names[0]) if graph.graphdef and names else None
    if bound is None:
        return 0
    j, inclusive, limit = bound
    if isinstance(limit, str):  # the limit is a loop variable the body passes on
        m = int(limit)
        if m >= len(ins) or m >= len(body.kinds) or body.kinds[m] != "pass":
            return 0
        value = value_of(ins[m])
        if value is None:  # a gradient loop runs as many iterations as its forward loop
            value = _iterations_run(graph, ins[m], value_of)
        if value is None or len(value) != 1:
            return 0
        limit = value[0]
    if j >= len(ins) or j >= len(body.returns) or not body.returns[j]:
        return 0
    start = value_of(ins[j])
    step = _counter_step(body, j)
    if start is None or len(start) != 1 or not step:
        return 0
    span = limit - start[0] + (step if inclusive else step - 1)
    return max(0, span // step)


def _counter_step(body: LoopBody, j: int) -> int:
    """The positive constant loop variable ``j`` grows by each iteration (``j + 2``: 2), or 0."""
    if j >= len(body.returns) or not body.returns[j]:
        return 0
    step_op = body.graph.index.get(value_through(body.graph, body.returns[j]).rpartition(":")[0])
    if step_op is None:
        return 0
    op = body.graph.ops[step_op]
    arg = f"{body.graph.ops[j].name}:0"
    if op.type not in ("AddV2", "Add") or len(op.inputs) != 2 or arg not in op.inputs:
        return 0
    other = body.graph.index.get(op.inputs[1 - op.inputs.index(arg)].rpartition(":")[0])
    step = body.graph.ops[other].attrs.get("value") if other is not None and (
        body.graph.ops[other].type == "Const") else None
    if not step or len(step) != 1 or not isinstance(step[0], int) or step[0] <= 0:
        return 0
    return step[0]


def _iterations_run(graph: Graph, tensor: tuple[int, int],
                    value_of: Callable[[tuple[int, int]], tuple[int, ...] | None]
                    ) -> tuple[int] | None:
    """The iterations a ``While`` ran, when ``tensor`` is its loop counter after the loop.

    ``while_v2``'s loop variable 0 counts the iterations from 0; a gradient loop runs
    until its own counter reaches the forward loop's final count (a QRNN's f-pooling
    over 24 steps, written with ``tf.while_loop``: its gradient loop had no known count).
    """
    w, port = tensor
    op = graph.ops[w]
    ins = graph.adjacency.data_in[w]
    if port != 0 or op.type not in ("While", "StatelessWhile") or not ins:
        return None
    if value_of(ins[0]) != (0,):
        return None
    body = loop_body(graph, w, (None,) * len(ins))
    if body is None or not body.returns or not body.returns[0]:
        return None
    step = body.graph.index.get(value_through(body.graph, body.returns[0]).rpartition(":")[0])
    if step is None or body.graph.ops[step].type not in ("AddV2", "Add"):
        return None
    arg = f"{body.graph.ops[0].name}:0"
    one = [body.graph.index.get(t.rpartition(":")[0]) for t in body.graph.ops[step].inputs
           if t != arg]
    if arg not in body.graph.ops[step].inputs or len(one) != 1 or one[0] is None or (
            body.graph.ops[one[0]].attrs.get("value") not in ([1], (1,))):
        return None
    trips = trip_count(graph, w, body, value_of)
    return (trips,) if trips > 0 else None


@functools.lru_cache(maxsize=64)
def _cond_bound(graphdef: bytes, name: str) -> tuple[int, bool, int | str] | None:
    """``(j, inclusive, limit)`` of a loop condition ``var_j < limit`` (``<=``: inclusive).

    ``limit`` is an integer constant, or the index of a loop variable as a string; None
    for any other condition.
    """
    from .load import _small_attrs

    f = _library(graphdef).get(name)
    if f is None or len(f.signature.output_arg) != 1:
        return None
    args = [a.name for a in f.signature.input_arg]
    nodes = {n.name: n for n in f.node_def}
    ref = f.ret.get(f.signature.output_arg[0].name, "")
    node = nodes.get(ref.split(":")[0])
    while node is not None and node.op == "Identity" and node.input:
        node = nodes.get(node.input[0].split(":")[0])
    if node is None or node.op not in ("Less", "LessEqual") or len(node.input) != 2:
        return None
    left, right = (t.split(":")[0] for t in node.input)
    if left not in args:
        return None
    if right in args:
        return args.index(left), node.op == "LessEqual", str(args.index(right))
    const = nodes.get(right)
    value = _small_attrs(const).get("value") if const is not None and const.op == "Const" else None
    if not value or len(value) != 1 or not isinstance(value[0], int):
        return None
    return args.index(left), node.op == "LessEqual", value[0]


def value_through(body: Graph, tensor: str) -> str:
    """The tensor of ``body`` whose value ``tensor`` is, past pass-through ops (Identity...)."""
    seen = 0
    while seen < 64:
        name, _, port = tensor.rpartition(":")
        idx = body.index.get(name)
        if idx is None:
            return tensor
        op = body.ops[idx]
        if op.type not in _PASS_OPS or not op.inputs:
            return tensor
        tensor = op.inputs[int(port) if op.type == "IdentityN" else 0]
        seen += 1
    return tensor


def _loop_kind(
    body: Graph, args: dict[str, int], nodes: dict[str, Any], k: int, ret: str,
    rets: list[str],
) -> tuple[str, int]:
    """Kind of loop variable ``k`` (see :class:`LoopBody`) and its source variable."""
    arg_of = {f"{a}:0": j for a, j in args.items()}
    t = value_through(body, _body_ref(ret, args, nodes)) if ret else ""
    if arg_of.get(t) == k:
        return "pass", -1
    pushed: list[str] = []
    kind = ""
    while t and t not in arg_of:
        name = t.rpartition(":")[0]
        op = body.ops[body.index[name]] if name in body.index else None
        if op is None or not op.inputs:
            break
        if op.type == "TensorListPopBack":
            kind = "consumed"
        elif op.type in ("TensorListPushBack", "TensorListSetItem"):
            kind = kind or "filled"
            pushed.append(value_through(body, op.inputs[-1]))
        elif op.type not in _PASS_OPS:
            break
        t = value_through(body, op.inputs[0])
    if arg_of.get(t) != k or not kind:
        return "carried", -1
    if kind == "consumed":
        return kind, -1
    for x in pushed:
        x = _row_source(body, x)
        name = x.rpartition(":")[0]
        op = body.ops[body.index[name]] if name in body.index else None
        if op is not None and op.type == "TensorListGetItem" and op.inputs:
            src = arg_of.get(value_through(body, op.inputs[0]), -1)
            if src >= 0:
                return "refs", src
        m = arg_of.get(x)
        if m is not None and m != k and m < len(rets):
            new = value_through(body, _body_ref(rets[m], args, nodes))
            if rets[m] and arg_of.get(new) == m:
                # rows of a loop variable passed on unchanged (a sequence the loop reads,
                # z[t]): the list holds that variable's memory, which lives as long as
                # the list (its gradient's zeros_like, written in place, was a second
                # buffer)
                return "refs", m
            # The previous value of loop variable m: if another list pushes m's new
            # value, both lists hold the same buffers (all but the first).
            if any(value_through(body, p.inputs[-1]) == new for p in _pushes(body) if p.inputs):
                return "duplicate", -1
    return "filled", -1


def _row_source(body: Graph, tensor: str) -> str:
    """The tensor whose rows ``tensor`` is a view of (:func:`lmscore.ir.row_slice_view`).

    A ``tf.scan`` over a stacked sequence pushes ``e[0]`` of each element for its
    gradient: rows of the element, whose list then lives as long as that accumulator
    (0.904 of measured when the element's list was freed after the forward loop).
    """
    for _ in range(8):
        idx = body.index.get(tensor.rpartition(":")[0])
        op = body.ops[idx] if idx is not None else None
        if op is None or op.type != "StridedSlice" or len(op.inputs) != 4 or not op.outputs:
            return tensor
        consts = []
        for k, ref in enumerate(op.inputs[1:]):
            src = body.index.get(ref.rpartition(":")[0])
            value = body.ops[src].attrs.get("value") if src is not None and body.ops[
                src].type == "Const" else None
            if value is None and k < 2 and src is not None:
                # a computed bound (x[t] of a loop's counter): only its length matters
                port = int(ref.rpartition(":")[2] or 0)
                spec = body.ops[src].outputs[port] if port < len(body.ops[src].outputs) \
                    else None
                value = (0,) if spec is not None and spec.shape == (1,) else None
            consts.append(value if isinstance(value, tuple) else None)
        if not row_slice_view(op.attrs, *consts, op.outputs[0].shape, op.outputs[0].dtype):
            return tensor
        tensor = value_through(body, op.inputs[0])
    return tensor


def _pushes(body: Graph) -> list[Op]:
    """The ops of a body that put a value into a list."""
    return [op for op in body.ops if op.type in ("TensorListPushBack", "TensorListSetItem")]


@functools.lru_cache(maxsize=64)
def duplicated(body: LoopBody) -> Mapping[int, tuple[int, ...]]:
    """For each ``"duplicate"`` list variable of a loop, the list variables it shares with.

    A forward loop pushes a state's new value into one accumulator (and its output
    sequence) and, the next iteration, its previous value into another: they hold the
    same buffers (but the first). A list variable whose partners are not found maps to
    ``()``. Found once per body (sizing and each simulation ask; read-only).
    """
    g = body.graph
    n = len(body.kinds)

    def pushed(ref: str) -> str:
        """What the push that makes ``ref`` pushes, through pass ops ("" if none)."""
        t = value_through(g, ref) if ref else ""
        j = g.index.get(t.rpartition(":")[0])
        op = g.ops[j] if j is not None else None
        if op is None or op.type not in ("TensorListPushBack", "TensorListSetItem"):
            return ""
        return value_through(g, op.inputs[-1]) if op.inputs else ""

    values = [pushed(ref) for ref in body.returns[:n]]
    args = {f"{g.ops[k].name}:0": k for k in range(min(n, len(g.ops)))}
    out: dict[int, tuple[int, ...]] = {}
    for k, kind in enumerate(body.kinds):
        if kind != "duplicate":
            continue
        m = args.get(values[k]) if k < len(values) else None
        ref = body.returns[m] if m is not None and m < len(body.returns) else ""
        new = value_through(g, ref) if ref else ""
        out[k] = tuple(j for j, v in enumerate(values) if j != k and v and v == new)
    return MappingProxyType(out)
