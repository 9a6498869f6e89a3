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
6. otherwise, an unknown leading dimension of a tensor computed from the feeds is taken
   as the batch size; these guesses are counted in :attr:`Sizes.assumed`.

Whatever is still unknown (unknown rank, other dimensions, variant or string dtypes)
is reported in :attr:`Sizes.unknown` and counts as 0 bytes in the simulation, never 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ConfigError, GraphError
from .ir import FEED_OPS, VARIABLE_OPS, Graph, dtype_bytes
from .order import order

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
    """

    batch_size: int
    shapes: tuple[tuple[tuple[int, ...] | None, ...], ...]
    nbytes: tuple[tuple[int, ...], ...]
    unknown: tuple[str, ...]
    assumed: tuple[str, ...]
    variable_bytes: dict[str, int]


def resolve(graph: Graph, batch_size: int) -> Sizes:
    """Resolve every tensor's shape and bytes at ``batch_size``.

    Parameters
    ----------
    graph : Graph
    batch_size : int
        Positive batch size used for unknown batch dimensions.

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
    from_input = [False] * len(ops)
    assumed: list[str] = []
    for i in ordering.topo:
        op = ops[i]
        ins = [(shapes[p][port], ops[p].outputs[port].shape) for p, port in adj.data_in[i]]
        from_input[i] = op.type in FEED_OPS or any(from_input[p] for p, _ in adj.data_in[i])
        out: list[tuple[int, ...] | None] = []
        for port, spec in enumerate(op.outputs):
            s = spec.shape
            if s is not None and any(d < -1 for d in s):
                raise GraphError(
                    f"{graph.source}: node {op.name!r} output {port} has an invalid shape {list(s)}"
                )
            if s is None or -1 not in s:
                out.append(s)
                continue
            r = _resolve_one(graph, i, s, ins, batch_size)
            if r[0] == -1 and from_input[i] and op.outputs[port].dtype != "resource":
                r = (batch_size,) + r[1:]
                assumed.append(f"{op.name}:{port}")
            out.append(r)
        shapes[i] = out
    nbytes: list[tuple[int, ...]] = []
    unknown: list[str] = []
    for i, op in enumerate(ops):
        row = []
        for port, spec in enumerate(op.outputs):
            b = _bytes(shapes[i][port], spec.dtype)
            if b > _MAX_BYTES:
                raise GraphError(
                    f"{graph.source}: node {op.name!r} output {port} would need {b} bytes "
                    f"(shape {list(shapes[i][port] or ())})"
                )
            if b < 0:
                unknown.append(f"{op.name}:{port}")
            row.append(b)
        nbytes.append(tuple(row))
    var_bytes = _variable_bytes(graph, shapes, nbytes)
    return Sizes(
        batch_size=batch_size,
        shapes=tuple(tuple(s) for s in shapes),
        nbytes=tuple(nbytes),
        unknown=tuple(unknown),
        assumed=tuple(assumed),
        variable_bytes=var_bytes,
    )


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
    for j, d in enumerate(dims):
        if d != -1:
            continue
        for resolved, recorded in ins:
            if (
                resolved is not None and recorded is not None and len(resolved) == len(dims)
                and recorded[j] == -1 and resolved[j] >= 0
            ):
                dims[j] = resolved[j]
                break
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
    return producer.attrs.get("value") if producer.type == "Const" else None


def _variable_bytes(
    graph: Graph,
    shapes: list[list[tuple[int, ...] | None]],
    nbytes: list[tuple[int, ...]],
) -> dict[str, int]:
    """Bytes held by each variable: declared shape, else what reads or writes of it show."""
    ops = graph.ops
    adj = graph.adjacency
    out: dict[str, int] = {}
    for i, op in enumerate(ops):
        resource = bool(op.outputs) and op.outputs[0].dtype == "resource"
        if not (op.type in VARIABLE_OPS or (op.type in FEED_OPS and resource)):
            continue
        if "shape" in op.attrs and op.attrs.get("dtype") and op.type in VARIABLE_OPS:
            declared = _bytes(tuple(op.attrs["shape"]), op.attrs["dtype"])
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
        out[op.name] = best
    return out


def _bytes_from_update(graph: Graph, var: int, nbytes: list[tuple[int, ...]]) -> int:
    """Size of a variable only seen by in-place updates: the value they add or apply."""
    adj = graph.adjacency
    for c in adj.consumers.get((var, 0), ()):
        consumer = graph.ops[c]
        if consumer.type in ("AssignAddVariableOp", "AssignSubVariableOp"):
            p, port = adj.data_in[c][1]
            if nbytes[p][port] >= 0:
                return nbytes[p][port]
        if consumer.type.startswith("ResourceApply"):
            p, port = adj.data_in[c][-1]  # the gradient, shaped like the variable
            if nbytes[p][port] >= 0:
                return nbytes[p][port]
    return -1
