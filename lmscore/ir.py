"""The intermediate representation: ops, their tensors, and the edges between them.

A :class:`Graph` is an immutable tuple of :class:`Op` records in the order of the source
file. Data inputs name tensors as ``"producer:port"``; control inputs name ops. Every
analysis (ordering, simulation, rewriting) is a pure function over a Graph; the integer
adjacency they share is computed once per Graph and cached. :meth:`Graph.to_networkx`
gives the same graph as a ``networkx.MultiDiGraph`` for ad-hoc queries.

:func:`lint` checks the invariants every graph must hold (unique names, every input
exists, ports in range, acyclic) and raises :class:`~lmscore.errors.GraphError` naming
the first offending node, and that no two ops TensorFlow may merge into one kernel
(:attr:`Graph.siblings`) wait for each other.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from .errors import GraphError

#: Bytes per element by dtype name (TensorFlow's names without the ``DT_`` prefix).
#: Types whose size is not a fixed element size (string, variant) are absent.
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "double": 8, "int32": 4, "uint8": 1, "int16": 2, "int8": 1,
    "complex64": 8, "int64": 8, "bool": 1, "qint8": 1, "quint8": 1, "qint32": 4,
    "bfloat16": 2, "qint16": 2, "quint16": 2, "uint16": 2, "complex128": 16,
    "half": 2, "uint32": 4, "uint64": 8, "float8_e5m2": 1, "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1, "float8_e4m3b11fnuz": 1, "float8_e5m2fnuz": 1,
    "int4": 1, "uint4": 1, "int2": 1, "uint2": 1, "resource": 0,
}

#: Op types that hold state for the whole step (their outputs are not transient).
VARIABLE_OPS = frozenset({
    "VarHandleOp", "VariableV2", "Variable", "TemporaryVariable", "_VarHandlesOp",
})
#: Op types whose outputs are the caller's feeds.
FEED_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault", "_Arg"})
#: Element-wise binary kernels that broadcast their inputs against each other (numpy's rule).
BROADCAST_BINARY_OPS = frozenset({
    "Add", "AddV2", "Sub", "Mul", "MulNoNan", "Div", "RealDiv", "DivNoNan", "FloorDiv",
    "FloorMod", "TruncateDiv", "Maximum", "Minimum", "Pow", "SquaredDifference", "Atan2",
    "Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual", "LogicalAnd",
    "LogicalOr",
})
#: Functional control flow and calls: each is one opaque op.
FUNCTIONAL_OPS = frozenset({
    "While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
    "PartitionedCall", "StatefulPartitionedCall", "For", "RemoteCall",
})



#: Op types that reach outside the graph: files, checkpoints, summaries, readers and
#: datasets over files, Python callbacks, debugger sinks. A training step has none; a graph
#: that has them is not run, so validating a file never reads or writes others.
SIDE_EFFECT_OPS = frozenset({
    "ReadFile", "WriteFile", "MatchingFiles", "ImmutableConst", "Save", "SaveV2",
    "SaveSlices", "Restore", "RestoreV2", "RestoreSlice", "MergeV2Checkpoints",
    "LoadAndRemapMatrix", "PyFunc", "PyFuncStateless", "EagerPyFunc",
    "InitializeTableFromTextFile", "InitializeTableFromTextFileV2",
    "CreateSummaryFileWriter", "CreateSummaryDbWriter", "WriteSummary", "WriteScalarSummary",
    "WriteHistogramSummary", "WriteImageSummary", "WriteAudioSummary", "WriteGraphSummary",
    "WriteRawProtoSummary", "FlushSummaryWriter", "ImportEvent",
    "WholeFileReader", "WholeFileReaderV2", "TextLineReader", "TextLineReaderV2",
    "TFRecordReader", "TFRecordReaderV2", "FixedLengthRecordReader",
    "FixedLengthRecordReaderV2", "LMDBReader",
    "TFRecordDataset", "TFRecordDatasetV2", "TextLineDataset", "FixedLengthRecordDataset",
    "FixedLengthRecordDatasetV2", "SnapshotDataset", "SnapshotDatasetV2", "SaveDataset",
    "SaveDatasetV2", "LoadDataset", "CacheDataset", "CacheDatasetV2",
    "MatchingFilesDataset", "ExperimentalMatchingFilesDataset", "ExperimentalLMDBDataset",
    "DebugIdentity", "DebugIdentityV2", "DebugIdentityV3", "DebugNanCount",
    "DebugNumericSummary", "DebugNumericSummaryV2",
})


def unvalidatable_op(graph: Graph) -> str:
    """An op type that keeps :func:`lmscore.measure.measure` from running the step, or "".

    Ops that reach outside the graph (:data:`SIDE_EFFECT_OPS`: a ``PyFunc``, a file) are
    refused, and a lookup table filled before the step cannot be rebuilt. Top-level ops
    only: what advice to validate a plan may name.
    """
    odd = sorted(t for t in graph.by_type if t in SIDE_EFFECT_OPS or "LookupTable" in t)
    return odd[0] if odd else ""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector meanwhile (also a decorator).

    Building a graph's records allocates a few containers per op and frees none: every
    few thousand allocations the collector would walk all that is alive so far, a third
    of the time of an import or a simulation, for records that hold no cycles. Reference
    counting still frees everything as usual. The collector is left as it was found: a
    thread leaving while another is inside turns it back on early, which only costs time.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Static type of one op output.

    Attributes
    ----------
    dtype : str
        TensorFlow dtype name without ``DT_`` (``"float"``, ``"int32"``, ``"resource"``).
    shape : tuple of int or None
        Dimensions as recorded in the graph, ``-1`` for an unknown dimension;
        ``None`` when even the rank is unknown.
    """

    dtype: str
    shape: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class Op:
    """One node of the graph.

    Attributes
    ----------
    name : str
        Unique node name.
    type : str
        TensorFlow op type (``"Conv2D"``).
    device : str
        Requested device string, possibly empty.
    inputs : tuple of str
        Data inputs as tensor names ``"producer:port"``.
    control_inputs : tuple of str
        Names of ops that must run before this one.
    outputs : tuple of TensorSpec
        One spec per output port.
    attrs : Mapping
        The few attributes analyses need (small constant values, ``perm``...), already
        decoded into Python values.
    """

    name: str
    type: str
    device: str = ""
    inputs: tuple[str, ...] = ()
    control_inputs: tuple[str, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=dict)


def tensor_name(op: str, port: int = 0) -> str:
    """Return the canonical tensor name ``"op:port"``.

    >>> tensor_name("dense/MatMul")
    'dense/MatMul:0'
    """
    return f"{op}:{port}"


def split_tensor(name: str) -> tuple[str, int]:
    """Split ``"op:port"`` (or a bare op name, port 0) into its parts.

    >>> split_tensor("a/b:2"), split_tensor("a/b")
    (('a/b', 2), ('a/b', 0))
    """
    op, sep, port = name.rpartition(":")
    if sep and _is_port(port):
        return op, _port_number(port)
    return name, 0


def _is_port(text: str) -> bool:
    """Whether ``text`` is an output port: ASCII digits (``"²".isdigit()`` is true too)."""
    return text.isascii() and text.isdigit()


def _port_number(text: str) -> int:
    """The port ``text`` names, saturated beyond int64.

    No op has that many outputs, so an absurd port is reported as out of range instead of
    failing to convert (``int()`` refuses more than 4300 digits).
    """
    return int(text) if len(text) <= 18 else 2**63


@dataclass(frozen=True)
class Adjacency:
    """Integer adjacency of a graph, shared by every sweep.

    Attributes
    ----------
    data_in : tuple of tuple of (int, int)
        For each op, its data inputs as (producer index, port).
    control_in : tuple of tuple of int
        For each op, its control predecessors.
    preds : tuple of tuple of int
        For each op, its distinct predecessors over data and control edges.
    succs : tuple of tuple of int
        For each op, its distinct successors over data and control edges.
    consumers : dict
        ``(producer index, port) -> tuple of consumer op indices`` (data edges only).
    """

    data_in: tuple[tuple[tuple[int, int], ...], ...]
    control_in: tuple[tuple[int, ...], ...]
    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    consumers: dict[tuple[int, int], tuple[int, ...]]

    @functools.cached_property
    def readers(self) -> tuple[tuple[int, ...], ...]:
        """For each op, the consumers of its outputs: port by port, each port's in order."""
        no_ints: tuple[int, ...] = ()
        out = [no_ints] * len(self.data_in)
        later: list[tuple[int, int]] = []  # ports past the first: few, sorted then appended
        for key, cs in self.consumers.items():
            if key[1] == 0:
                out[key[0]] = cs
            else:
                later.append(key)
        later.sort()
        for key in later:
            out[key[0]] += self.consumers[key]
        return tuple(out)


#: Filter gradients TensorFlow may merge with the ``BiasAddGrad`` beside them, and the input
#: through which they read the same gradient (the ``BiasAddGrad``'s input 0): oneDNN's
#: layout pass (``_MklNativeConv2DBackpropFilterWithBias``, when both ops have the same
#: control inputs, which Grappler's dependency optimizer often makes so) and Grappler's
#: remapper with oneDNN. Neither checks for a path from one op to the other.
MERGED_WITH_BIAS_GRAD: dict[str, int] = {"Conv2DBackpropFilter": 2, "Conv3DBackpropFilterV2": 2}


#: Graphs made by :meth:`Graph.derive` and the graph each keeps the ops of.
_PARENTS: weakref.WeakKeyDictionary[Graph, Graph] = weakref.WeakKeyDictionary()


def parent_of(graph: Graph) -> Graph | None:
    """The graph ``graph`` was derived from (:meth:`Graph.derive`), if any.

    Its ops are the parent's, at the same positions and with the same names, with some
    inputs changed and ops appended (a rewrite's swaps, clones and control edges).
    """
    return _PARENTS.get(graph)


#: Kernels that update a resource variable row by row (see :attr:`Graph.copy_on_read`).
SPARSE_UPDATES = ("ResourceSparseApply", "ResourceScatter")


@dataclass(frozen=True, eq=False)
class Graph:
    """An immutable training-step graph.

    Attributes
    ----------
    ops : tuple of Op
        The ops in source order; this order breaks every tie.
    source : str
        Where the graph came from (a path or a description), used in messages.
    functions : frozenset of str
        Names of the functions of the graph's function library.
    graphdef : bytes or None
        The serialized GraphDef the graph was imported from: export starts from it so
        that every attribute and the function library survive a rewrite.
    """

    ops: tuple[Op, ...]
    source: str = "<graph>"
    functions: frozenset[str] = frozenset()
    graphdef: bytes | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.ops)

    @functools.cached_property
    def index(self) -> dict[str, int]:
        """Map op name to its position in :attr:`ops`."""
        idx = {op.name: i for i, op in enumerate(self.ops)}
        if len(idx) != len(self.ops):
            seen: set[str] = set()
            for op in self.ops:
                if op.name in seen:
                    raise GraphError(f"{self.source}: duplicate node name {op.name!r}")
                seen.add(op.name)
        return idx

    @functools.cached_property
    def by_type(self) -> dict[str, tuple[int, ...]]:
        """Indices of the ops of each type, in graph order (one pass for every lookup)."""
        out: dict[str, list[int]] = {}
        for i, op in enumerate(self.ops):
            out.setdefault(op.type, []).append(i)
        return {t: tuple(v) for t, v in out.items()}

    def of_types(self, types: Iterable[str]) -> list[int]:
        """Indices of the ops whose type is one of ``types``, in graph order."""
        return sorted(i for t in types for i in self.by_type.get(t, ()))

    @functools.cached_property
    def calls(self) -> tuple[int, ...]:
        """Indices of the functional ops (:data:`FUNCTIONAL_OPS`: loops, conditionals, calls)."""
        return tuple(self.of_types(FUNCTIONAL_OPS))

    @functools.cached_property
    def siblings(self) -> dict[int, tuple[int, ...]]:
        """Ops TensorFlow may merge into one kernel, each mapped to those it may merge with.

        The ``BiasAddGrad`` ops and the filter gradients reading the same gradient tensor
        (:data:`MERGED_WITH_BIAS_GRAD`): each bias gradient may merge with any of the
        filter gradients (TensorFlow takes the first it finds), and the other way round.
        Two convolutions reading one tensor share its gradient (an attention gate's two
        1x1 convolutions after an ``Add``). Merged while one waits for the other through
        other ops (a swap-in's trigger, a pinned order), the kernel waits for itself:
        TensorFlow then ends the step without running it ("Retval[0] does not have value").
        """
        adj = self.adjacency
        groups: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        for b, op in enumerate(self.ops):
            if op.type != "BiasAddGrad" or not adj.data_in[b]:
                continue
            key = adj.data_in[b][0]
            if key not in groups:
                filters = []
                for c in dict.fromkeys(adj.consumers.get(key, ())):
                    port = MERGED_WITH_BIAS_GRAD.get(self.ops[c].type)
                    if port is not None and port < len(adj.data_in[c]) and (
                            adj.data_in[c][port] == key):
                        filters.append(c)
                groups[key] = ([], filters)
            groups[key][0].append(b)
        partners: dict[int, tuple[int, ...]] = {}
        for biases, filters in groups.values():
            if filters:
                partners.update(dict.fromkeys(biases, tuple(filters)))
                partners.update(dict.fromkeys(filters, tuple(biases)))
        return partners

    @functools.cached_property
    def copy_on_read(self) -> frozenset[tuple[int, int]]:
        """Resource variables that a sparse kernel updates, as (op, port) of their handle.

        A sparse update (``ResourceSparseApplyAdagrad``, ``ResourceScatterAdd``...) puts
        the variable in copy-on-read mode for good (``EnsureSparseVariableAccess``): from
        then on every ``ReadVariableOp`` of it copies the whole variable into a new
        buffer instead of handing out the variable's own.
        """
        adj = self.adjacency
        sparse = {t for t in {op.type for op in self.ops} if t.startswith(SPARSE_UPDATES)}
        return frozenset(
            adj.data_in[i][0] for i, op in enumerate(self.ops)
            if op.type in sparse and adj.data_in[i]
        ) if sparse else frozenset()

    def op(self, name: str) -> Op:
        """Return the op called ``name``.

        Raises
        ------
        GraphError
            If there is no such op.
        """
        try:
            return self.ops[self.index[name]]
        except KeyError:
            raise GraphError(f"{self.source}: no node named {name!r}") from None

    def spec(self, tensor: str) -> TensorSpec:
        """Return the :class:`TensorSpec` of tensor ``"op:port"``."""
        op_name, port = split_tensor(tensor)
        op = self.op(op_name)
        if port >= len(op.outputs):
            raise GraphError(f"{self.source}: node {op_name!r} has no output {port}")
        return op.outputs[port]

    @functools.cached_property
    @gc_paused()
    def adjacency(self) -> Adjacency:
        """Integer adjacency (computed once; raises GraphError on a dangling input)."""
        ops = self.ops
        n_out = [len(op.outputs) for op in ops]
        data_in: list[tuple[tuple[int, int], ...]] = []
        control_in: list[tuple[int, ...]] = []
        preds: list[tuple[int, ...]] = []
        succs: list[list[int]] = [[] for _ in ops]
        consumers: dict[tuple[int, int], list[int]] = {}
        # Each tensor is read a few times: its name is parsed once and its key shared.
        keys: dict[str, tuple[int, int]] = {}
        index = self.index  # refuses a duplicate name
        no_ints: tuple[int, ...] = ()
        for i, op in enumerate(ops):
            ins: list[tuple[int, int]] = []
            for t in op.inputs:
                key = keys.get(t)
                if key is None:
                    name, sep, port_text = t.rpartition(":")
                    p = index.get(name)
                    # "name:0" is most reads: the general parse only for the others
                    if port_text != "0" or p is None or not n_out[p]:
                        key = self._tensor_key(op, t, n_out)
                    else:
                        key = (p, 0)
                    keys[t] = key
                    consumers[key] = [i]
                else:
                    consumers[key].append(i)
                ins.append(key)
            ins_t = tuple(ins)
            if op.control_inputs:
                ctl = self._control_keys(op)
                ctl_t = tuple(ctl)
                ps = tuple(dict.fromkeys([p for p, _ in ins_t] + ctl))
            else:
                ctl_t = no_ints
                if len(ins_t) == 1:
                    ps = (ins_t[0][0],)
                elif len(ins_t) == 2:
                    a, b = ins_t[0][0], ins_t[1][0]
                    ps = (a,) if a == b else (a, b)
                elif ins_t:
                    ps = tuple(dict.fromkeys([p for p, _ in ins_t]))
                else:
                    ps = no_ints
            data_in.append(ins_t)
            control_in.append(ctl_t)
            preds.append(ps)
            for p in ps:
                succs[p].append(i)
        return Adjacency(
            data_in=tuple(data_in),
            control_in=tuple(control_in),
            preds=tuple(preds),
            succs=tuple(map(tuple, succs)),
            consumers=dict(zip(consumers, map(tuple, consumers.values()), strict=True)),
        )

    def _tensor_key(self, op: Op, t: str, n_out: list[int]) -> tuple[int, int]:
        """``(producer index, port)`` of the tensor ``t`` that ``op`` reads."""
        name, sep, port_text = t.rpartition(":")
        if sep and _is_port(port_text):
            port = _port_number(port_text)
        else:
            name, port = t, 0
        p = self.index.get(name)
        if p is None or port >= n_out[p]:
            raise GraphError(self._dangling(op.name, t, name, p))
        return p, port

    def _control_keys(self, op: Op, names: tuple[str, ...] | None = None) -> list[int]:
        """Indices of the ops ``op`` has control inputs from (``names``: only those)."""
        get = self.index.get
        ctl = []
        for c_name in op.control_inputs if names is None else names:
            p = get(c_name)
            if p is None:
                raise GraphError(f"{self.source}: node {op.name!r} has a control input from "
                                 f"{c_name!r} but no such node exists")
            ctl.append(p)
        return ctl

    def _edges(self, op: Op, n_out: list[int]
               ) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...], tuple[int, ...]]:
        """Data inputs, control inputs and distinct predecessors of ``op`` (indices)."""
        ins_t = tuple(self._tensor_key(op, t, n_out) for t in op.inputs)
        ctl = self._control_keys(op)
        if len(ins_t) == 1 and not ctl:
            ps: tuple[int, ...] = (ins_t[0][0],)
        else:
            ps = tuple(dict.fromkeys([p for p, _ in ins_t] + ctl))
        return ins_t, tuple(ctl), ps

    def _edges_like(self, op: Op, before: Op, ins_before: tuple[tuple[int, int], ...],
                    ctl_before: tuple[int, ...], n_out: list[int]
                    ) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...], tuple[int, ...]]:
        """:meth:`_edges` of ``op``, an edit of ``before`` at the same position.

        The inputs and control inputs it shares with ``before`` keep their keys: a rewrite
        changes one input of a consumer, or adds control inputs, and parsing every name
        again was most of the cost of deriving a rewritten graph.
        """
        if op.inputs == before.inputs:
            ins_t = ins_before
        elif len(op.inputs) == len(before.inputs):
            ins_t = tuple(k if t == u else self._tensor_key(op, t, n_out)
                          for t, u, k in zip(op.inputs, before.inputs, ins_before, strict=True))
        else:
            ins_t = tuple(self._tensor_key(op, t, n_out) for t in op.inputs)
        if op.control_inputs == before.control_inputs:
            ctl = ctl_before
        elif op.control_inputs[:len(before.control_inputs)] == before.control_inputs:
            ctl = ctl_before + tuple(self._control_keys(
                op, op.control_inputs[len(before.control_inputs):]))
        else:
            ctl = tuple(self._control_keys(op))
        if len(ins_t) == 1 and not ctl:
            ps: tuple[int, ...] = (ins_t[0][0],)
        else:
            ps = tuple(dict.fromkeys([p for p, _ in ins_t] + list(ctl)))
        return ins_t, ctl, ps

    def derive(self, ops: Iterable[Op], source: str | None = None) -> Graph:
        """Like :meth:`replace`, for a graph that keeps this one's ops at their positions.

        The new graph may change some ops' inputs and control inputs and append ops (what
        a rewrite does); its adjacency is then patched from this graph's instead of
        rebuilt, which is what makes re-simulating an edited plan fast, and it remembers
        this graph as its parent (:func:`parent_of`). Anything else falls back to
        :meth:`replace`. Equal to a fresh build (a property test checks it).
        """
        new = self.replace(ops, source)
        n = len(self.ops)
        if len(new.ops) < n:
            return new
        # ops left as they were are the same objects: only the others can have a new name
        changed = [i for i, (a, b) in enumerate(zip(self.ops, new.ops, strict=False))
                   if a is not b]
        if any(self.ops[i].name != new.ops[i].name
               or len(self.ops[i].outputs) != len(new.ops[i].outputs) for i in changed):
            return new  # the unchanged readers of a lost output would need checking
        _PARENTS[new] = self
        old = self.adjacency
        # the parent's names are at the same positions: its index, plus the new names
        index = dict(self.index)
        for i in range(n, len(new.ops)):
            index.setdefault(new.ops[i].name, i)
        if len(index) == len(new.ops):  # else the index property reports the duplicate
            new.__dict__["index"] = index
        n_out = [len(op.outputs) for op in new.ops]
        changed += range(n, len(new.ops))
        data_in = list(old.data_in) + [()] * (len(new.ops) - n)
        control_in = list(old.control_in) + [()] * (len(new.ops) - n)
        preds = list(old.preds) + [()] * (len(new.ops) - n)
        succs: dict[int, set[int]] = {}
        consumers: dict[tuple[int, int], list[int]] = {}

        def touch_succs(p: int) -> set[int]:
            if p not in succs:
                succs[p] = set(old.succs[p]) if p < n else set()
            return succs[p]

        def touch_consumers(key: tuple[int, int]) -> list[int]:
            if key not in consumers:
                consumers[key] = list(old.consumers.get(key, ()))
            return consumers[key]

        for i in changed:
            if i < n:
                ins_t, ctl, ps = new._edges_like(new.ops[i], self.ops[i], data_in[i],
                                                 control_in[i], n_out)
            else:
                ins_t, ctl, ps = new._edges(new.ops[i], n_out)
            if ps != preds[i]:  # same predecessors: their successors stay as they are
                for p in preds[i]:
                    touch_succs(p).discard(i)
                for p in ps:
                    touch_succs(p).add(i)
            if ins_t != data_in[i]:
                for key in data_in[i]:
                    touch_consumers(key).remove(i)
                for key in ins_t:
                    touch_consumers(key).append(i)
            data_in[i], control_in[i], preds[i] = ins_t, ctl, ps
        all_succs = list(old.succs) + [()] * (len(new.ops) - n)
        for p, ss in succs.items():
            all_succs[p] = tuple(sorted(ss))
        all_consumers = dict(old.consumers)
        for key, cs in consumers.items():
            if cs:
                all_consumers[key] = tuple(sorted(cs))
            else:
                del all_consumers[key]
        new.__dict__["adjacency"] = Adjacency(
            data_in=tuple(data_in), control_in=tuple(control_in), preds=tuple(preds),
            succs=tuple(all_succs), consumers=all_consumers,
        )
        return new

    def _dangling(self, op: str, tensor: str, name: str, producer: int | None) -> str:
        if producer is None:
            return f"{self.source}: node {op!r} reads {tensor!r} but no node {name!r} exists"
        return (f"{self.source}: node {op!r} reads {tensor!r} but {name!r} has "
                f"{len(self.ops[producer].outputs)} output(s)")

    def to_networkx(self) -> Any:
        """Return the graph as a ``networkx.MultiDiGraph``.

        Nodes are op names with attributes ``type``, ``device`` and ``outputs``; data
        edges carry ``kind="data"``, ``src_port`` and ``dst_port``; control edges carry
        ``kind="control"``.
        """
        import networkx as nx  # only here: it takes a quarter second to import

        g = nx.MultiDiGraph(source=self.source)
        for op in self.ops:
            g.add_node(op.name, type=op.type, device=op.device, outputs=op.outputs)
        for op in self.ops:
            for dst_port, t in enumerate(op.inputs):
                src, src_port = split_tensor(t)
                g.add_edge(src, op.name, kind="data", src_port=src_port, dst_port=dst_port)
            for c in op.control_inputs:
                g.add_edge(c, op.name, kind="control")
        return g

    def replace(self, ops: Iterable[Op], source: str | None = None) -> Graph:
        """Return a new graph with ``ops`` (same library), e.g. after a rewrite."""
        return Graph(
            tuple(ops), self.source if source is None else source, self.functions, self.graphdef
        )


def lint(graph: Graph) -> None:
    """Check the invariants of ``graph``.

    Unique names, every data and control input names an existing op and output port, no
    cycle through data and control edges, and no path from one op of a pair TensorFlow
    may merge into one kernel (:attr:`Graph.siblings`) to the other: the merged kernel
    would wait for itself.

    Raises
    ------
    GraphError
        With a message naming the first offending node.
    """
    from .order import order  # here: order imports this module

    graph.adjacency  # noqa: B018 - names, inputs and ports
    # Levels are longest paths from a source: every path climbs them. Kahn's algorithm
    # refuses a cycle, and the ordering it makes is what simulating the graph needs next.
    level = order(graph).levels
    for a, partners in graph.siblings.items():
        for b in partners:
            if reaches(graph, a, b, level):
                raise GraphError(
                    f"{graph.source}: node {graph.ops[b].name!r} waits for "
                    f"{graph.ops[a].name!r}, and TensorFlow may merge the two into one "
                    "kernel (oneDNN), which would wait for itself"
                )


def waited_for(graph: Graph, seeds: Iterable[int]) -> list[bool]:
    """Whether each op is one of ``seeds`` or one they wait for (data or control edges).

    What TensorFlow runs of a function or of a loop body when ``seeds`` are its results
    and stateful ops: it prunes the rest.

    >>> f = (TensorSpec("float", ()),)
    >>> g = Graph((Op("a", "Const", outputs=f), Op("b", "Neg", inputs=("a:0",), outputs=f),
    ...            Op("c", "Const", outputs=f)))
    >>> waited_for(g, [1])
    [True, True, False]
    """
    seen = [False] * len(graph.ops)
    stack = []
    for i in seeds:
        if not seen[i]:
            seen[i] = True
            stack.append(i)
    preds = graph.adjacency.preds
    while stack:
        for p in preds[stack.pop()]:
            if not seen[p]:
                seen[p] = True
                stack.append(p)
    return seen


def reaches(graph: Graph, src: int, dst: int, lv: Sequence[int]) -> bool:
    """Whether op ``src`` reaches op ``dst`` (indices), searching only below dst's level.

    ``lv`` holds levels that every edge climbs (longest paths from the sources).
    """
    if lv[src] >= lv[dst]:
        return False
    succs = graph.adjacency.succs
    seen = {src}
    stack = [src]
    while stack:
        for s in succs[stack.pop()]:
            if s == dst:
                return True
            if s not in seen and lv[s] < lv[dst]:
                seen.add(s)
                stack.append(s)
    return False


def _describe_cycle(graph: Graph, indeg: list[int]) -> str:
    """Name the ops of one cycle among the ops Kahn's algorithm could not peel."""
    import networkx as nx

    stuck = {i for i, d in enumerate(indeg) if d > 0}
    sub = nx.DiGraph()
    adj = graph.adjacency
    for i in stuck:
        for p in adj.preds[i]:
            if p in stuck:
                sub.add_edge(graph.ops[p].name, graph.ops[i].name)
    try:
        cycle = [u for u, _ in nx.find_cycle(sub)]
    except nx.NetworkXNoCycle:  # pragma: no cover - stuck ops always contain a cycle
        cycle = sorted(graph.ops[i].name for i in stuck)[:5]
    cycle = [c if c.isprintable() else repr(c) for c in cycle]  # one line, whatever the names
    shown = " -> ".join(cycle[:6]) + (" -> ..." if len(cycle) > 6 else f" -> {cycle[0]}")
    return f"the graph has a cycle through data/control edges: {shown}"


@functools.cache
def op_signatures() -> dict[str, dict[str, Any]]:
    """Return the registered output signatures of TensorFlow ops (see ``make_opdefs.py``)."""
    text = resources.files("lmscore.data").joinpath("opdefs.json").read_text()
    return json.loads(text)


def gradient_input(op_type: str) -> int | None:
    """The position of the gradient input of an optimizer's apply op, by its op definition.

    The input TensorFlow names ``grad`` (``delta`` for gradient descent) wherever the op
    takes it (``ResourceApplyMomentum`` takes it fourth, its momentum last); None for an
    op that applies no gradient.

    >>> gradient_input("ResourceApplyMomentum"), gradient_input("ResourceApplyGradientDescent")
    (3, 2)
    >>> gradient_input("MatMul") is None
    True
    """
    sig = op_signatures().get(op_type)
    return None if sig is None else sig.get("grad")


def feed_batches(graph: Graph) -> list[int]:
    """The leading dimension of each batched feed, in graph order (-1: unknown)."""
    dims = []
    for op in graph.ops:
        if op.type in FEED_OPS and op.outputs and op.outputs[0].dtype != "resource":
            shape = op.outputs[0].shape
            if shape is None or shape:  # scalars (a learning rate) have no batch
                dims.append(-1 if shape is None else shape[0])
    return dims


def fixed_batch(graph: Graph) -> int | None:
    """The batch size every batched feed of ``graph`` fixes, or None (unknown or no feed)."""
    dims = feed_batches(graph)
    return dims[0] if dims and -1 not in dims and dims[0] > 0 else None


#: Alignment TensorFlow's slice and split kernels need to hand out part of an input's
#: buffer instead of a copy: ``EIGEN_MAX_ALIGN_BYTES``, 64 on AVX-512 builds (a coarser
#: build shares more, never less).
ROW_ALIGN = 64


def row_slice_view(attrs: Mapping[str, Any], begin: Sequence[int] | None,
                   end: Sequence[int] | None, strides: Sequence[int] | None,
                   out_shape: Sequence[int] | None, dtype: str) -> bool:
    """Whether a ``StridedSlice`` is a view of its input, told from the op alone.

    It is when it takes whole rows of the input's first axis (``x[t]``, ``x[a:b]``: one
    entry of ``begin``, ``end`` and ``strides``, the stride 1) and each row starts at an
    aligned address whatever the unknown dimensions (``IsDim0SliceAligned``): the bytes of
    a row's known dimensions are a multiple of :data:`ROW_ALIGN`. A loop body's
    ``e[0]`` of a ``tf.scan`` element is then the element's own memory.

    >>> row_slice_view({"shrink_axis_mask": 1}, [0], [1], [1], [-1, 16, 4], "float")
    True
    >>> row_slice_view({"shrink_axis_mask": 1}, [0], [1], [1], [-1, 3], "float")
    False
    >>> row_slice_view({}, [0, 0], [1, 2], [1, 1], [1, 2], "float")
    False
    """
    size = dtype_bytes(dtype)
    if (not size or out_shape is None or begin is None or end is None or strides is None
            or not len(begin) == len(end) == len(strides) == 1 or strides[0] != 1
            or attrs.get("ellipsis_mask", 0) or attrs.get("new_axis_mask", 0)):
        return False
    shrink = attrs.get("shrink_axis_mask", 0)
    if shrink not in (0, 1):
        return False
    row = list(out_shape) if shrink else list(out_shape)[1:]
    known = math.prod(d for d in row if d >= 0) * size
    return bool(row) and known % ROW_ALIGN == 0


def dtype_bytes(dtype: str) -> int | None:
    """Bytes per element of ``dtype``, or None when it has no fixed size (string, variant)."""
    return DTYPE_BYTES.get(dtype.removesuffix("_ref"))


#: Integer and boolean dtypes: what shape arithmetic computes.
_INTEGERS = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                       "uint64", "bool"})
#: Ops that read only the shape of their input and return integers.
_SHAPE_READS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


def shape_arithmetic(graph: Graph, i: int) -> bool:
    """Whether op ``i`` computes integers from integers or from shapes alone.

    A pinned order leaves these out of its chain. Grappler's constant folding evaluates
    them where the shapes are known, and its result, inheriting the control edges of a
    chain through them, could wait for itself: a transposed 1-D convolution's output
    shape (``Pack`` of a batch read by ``Shape``, ``ConcatV2``) chained after a gradient's
    ``Shape`` failed to run under default Grappler ("Incomplete graph, missing 1 inputs"),
    where it ran with Grappler off. They allocate a few bytes each; what they read is
    another matter, since a tensor stays alive until its last reader ran, so the chain
    waits for a shape read of a computed tensor once its inputs are there (a one-way edge,
    :func:`lmscore.schedule.scheduled`). For the same reasons no swap's control edge
    starts or ends at one (:func:`lmscore.plan.find_trigger`,
    :func:`lmscore.rewrite.rewrite`): out of the chain it runs whenever its inputs are
    there, and Grappler may fold it away.
    """
    op = graph.ops[i]
    if not op.outputs or any(o.dtype not in _INTEGERS for o in op.outputs):
        return False
    if op.type in _SHAPE_READS:
        return True
    ops = graph.ops
    return all(ops[p].outputs[port].dtype in _INTEGERS for p, port in graph.adjacency.data_in[i])
