"""Run a training-step GraphDef on the CPU under TensorFlow and read its allocation records.

This is the ground truth the memory simulator is compared with: the graph is imported
into a fresh ``tf.compat.v1`` graph, its captured variables are replaced by real resource
variables holding synthetic values, its inputs are fed with synthetic data, and a few
steps are run with Grappler switched off so that the graph executes as given. One step is
traced (``FULL_TRACE``) and the per-kernel allocation records of that step are turned into
an allocation timeline per device.

What TensorFlow records on the CPU (TF 2.21, observed)
------------------------------------------------------
* Every kernel that allocates gets, under its ``node_stats``, one ``memory`` entry per
  allocator with ``allocation_records`` (``alloc_micros``, ``alloc_bytes``); a negative
  ``alloc_bytes`` is a deallocation. The deallocation of a tensor is recorded under the
  node that *allocated* it, at the time its last reference is dropped, so the records
  pair up within one node. Sizes are the requested bytes. On the CPU there is a single
  allocator, named ``"cpu"`` when TensorFlow runs its Eigen kernels and ``"mklcpu"`` when
  it runs oneDNN (``TF_ENABLE_ONEDNN_OPTS``, on by default on recent x86 CPUs; see
  :attr:`Measurement.kernel_library`), never ``"cpu_pool"``; its ``allocator_bytes_in_use`` is
  always 0 (the CPU allocator keeps no statistics), ``referenced_tensor`` is always
  empty and ``memory_stats.temp_memory_size`` is set for a handful of kernels only, so
  the allocation records are the one complete source; ``output`` descriptions (buffer
  pointers) only show which outputs share a buffer.
* Kernels that forward an input buffer (``BiasAdd``, ``Relu``, element-wise ops whose
  input dies, ``Reshape``, ``Identity``...) and ``ReadVariableOp`` (which aliases the
  variable's buffer) have no records: they allocate nothing.
* Fed inputs (the ``_arg_*`` nodes) have no records: the session allocated them before the
  step. They are added here as allocations of the placeholder, with allocator ``"feed"``,
  alive for the whole step, because they occupy device memory during the step.
* ``Const`` kernels allocate their output once, on the first run of the session; later runs
  only report it as ``memory_stats.persistent_memory_size``. That is why the traced step
  should not be the first one, and why that size is counted as persistent memory.
* Tensors still referenced at the end of the step (the fetched loss, a value stored into a
  variable by ``AssignVariableOp``, a copy-on-write copy made by ``AssignSubVariableOp``
  when the old value is still read elsewhere) have no deallocation record (``free_us`` is
  ``None``); the variables' own buffers, allocated when they were initialised, never
  appear.
* Copy-on-write: a kernel that writes a variable (``AssignSubVariableOp``,
  ``ResourceApplyAdam``...) while an earlier ``ReadVariableOp`` of it is still referenced
  copies the variable into a new buffer, recorded under the update node. The variable's
  old buffer, allocated before the step, is released once the last reader of the old
  value has run, and nothing records that. So is it when ``AssignVariableOp`` adopts the
  buffer of the value it assigns (``v.assign(tf.zeros_like(v))``). :func:`measure` adds
  the release as a record of negative ``bytes`` (see :class:`Allocation`), so that the
  variable is not counted twice from then on.
* Ops inside functional control flow (``While``, ``If``, ``PartitionedCall``) are lowered
  or inlined by the runtime, recorded under runtime names prefixed by the call node's
  name (once per loop iteration), and reported under that call node's name.
* Scratch memory a kernel takes outside the TensorFlow allocator (Eigen or oneDNN
  internals) is not recorded. Scratch taken through it is, and can dominate a small
  model: the CPU ``Conv2DBackpropFilter``/``Conv2DBackpropInput`` kernels allocate a
  ~24 MiB work buffer even for tiny convolutions (Eigen kernels; oneDNN's allocate
  none, but its ``MaxPool`` outputs a workspace that lives until ``MaxPoolGrad``).

With ``devices=2`` the session has two logical CPU devices that share the same ``"cpu"``
allocator (same name, same heap); allocations are attributed to a device by the
``dev_stats`` entry they appear under. A tensor passed between the two CPU devices is not
copied (the ``_Send``/``_Recv`` pair, which does not even appear in the step stats, hands
over the same buffer), so an ``Identity`` placed on ``CPU:1`` shares the buffer of its
input and allocates nothing on ``CPU:1``, while ``DeepCopy`` allocates a new buffer,
recorded on ``CPU:1`` for as long as it lives, even while consumers on ``CPU:0`` use it.

Repeatability
-------------
With ``inter_op_threads=-1`` (the default) a single-device session runs every kernel in
the calling thread, one after the other, first in first out as they become ready (no
cost estimate is consulted then), and every step of one session runs in the same order.
That order is drawn anew in each session, though: a node's consumers are taken in the
order of its set of out-edges, which for more than 8 edges is a hash set of pointers, and
every node without inputs hangs off the source node, so the constants, variables and
feeds start in a different order each time; with oneDNN the layout pass also replaces
nodes (``Conv2DBackpropInput`` by ``_MklNativeConv2DBackpropInput``,
``Conv2DBackpropFilter`` and ``BiasAddGrad`` by one ``..FilterWithBias``) in a depth-first
order over the same sets, and consumers of one tensor run in the order their new nodes
were made. Where independent branches overlap, the peak varies between sessions: a GAN
step (two tapes, batch 16) reached its highest transient peak in 14 of 30 sessions with
oneDNN and was up to 13% lower in others (1% with Eigen, whose im2col buffers dominate);
replayed in the simulator, each session's own order gave that session's peak. The
simulator's order (first in first out, in graph order) gave the highest. An MLP, an
LSTM and a 3 MiB MLP gave spread 0. With a thread pool (``inter_op_threads >= 1``, even
1) kernels run concurrently with the calling thread and the peak varies by up to 18 %. With two
devices there are two executors and the pool is always used: the peak varies too.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.framework import function_pb2, graph_pb2, node_def_pb2, step_stats_pb2
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.framework import op_def_registry

from lmscore.errors import ConfigError, GraphError, RunError
from lmscore.ir import SIDE_EFFECT_OPS, gradient_input, split_tensor
from lmscore.load import handle_spec
from lmscore.order import FUSED_APPLIES, OUTPUT_OPS
from lmscore.shapes import BRANCH_ATTRS
from lmscore.timeline import live_curve

__all__ = ["CPU_ALLOCATORS", "Allocation", "Measurement", "measure", "synthetic_inputs"]

_RESOURCE = tf.resource.as_datatype_enum
_PREFIX = "lms_measure"
_FEED_ALLOCATOR = "feed"

#: Ops through which an integer input keeps its meaning (index or label) for the purpose
#: of finding its valid range, with the input positions that carry the value through.
_PASS_THROUGH: dict[str, tuple[int, ...] | None] = {
    "Identity": None,
    "IdentityN": None,
    "Cast": (0,),
    "Reshape": (0,),
    "ExpandDims": (0,),
    "Squeeze": (0,),
    "StridedSlice": (0,),
    "Slice": (0,),
    "Transpose": (0,),
    "Tile": (0,),
    "Reverse": (0,),
    "ReverseV2": (0,),
    "Pack": None,
    "Unpack": (0,),
    "ConcatV2": None,
    "Concat": None,
    "Split": (1,),
    "SplitV": (0,),
    "SelectV2": (1, 2),
    "Select": (1, 2),
    "StopGradient": (0,),
    "Snapshot": (0,),
    "DeepCopy": (0,),
    "CopyHost": (0,),
    "Copy": (0,),
    "Enter": (0,),
    "Switch": (0,),
    "Merge": None,
    "Exit": (0,),
    "NextIteration": (0,),
    # values taken out of the input (a sparse tensor's ids from a dense one, their
    # distinct values): still indices of what they index
    "GatherNd": (0,),
    "GatherV2": (0,),
    "Unique": (0,),
}
#: Call ops and the function attributes whose arguments receive the op's inputs, with the
#: offset between the op's input index and the function's argument index.
_CALLS: dict[str, tuple[tuple[str, int], ...]] = {
    "PartitionedCall": (("f", 0),),
    "StatefulPartitionedCall": (("f", 0),),
    "While": (("body", 0), ("cond", 0)),
    "StatelessWhile": (("body", 0), ("cond", 0)),
    "If": (("then_branch", 1), ("else_branch", 1)),
    "StatelessIf": (("then_branch", 1), ("else_branch", 1)),
    "Case": (("branches", 1),),
    "StatelessCase": (("branches", 1),),
}
#: Ops whose value input means a variable's current value has that shape.
_ASSIGNS = {
    "AssignVariableOp",
    "AssignAddVariableOp",
    "AssignSubVariableOp",
}
#: Ops that write a resource variable in place, or into a copy of it when an earlier read
#: of the variable is still referenced (copy-on-write), besides the ``_ASSIGNS``.
_UPDATE_PREFIXES = ("ResourceApply", "ResourceSparseApply", "ResourceScatter")
#: Ops whose output is their input's buffer. Nothing else can alias a variable's read:
#: the variable holds a second reference to it, so no kernel can forward it.
_VIEWS = frozenset({
    "Identity", "IdentityN", "StopGradient", "PreventGradient", "Reshape", "Squeeze",
    "ExpandDims", "EnsureShape", "Bitcast", "CheckNumerics", "Snapshot",
})
#: Ops that only make sense on non-negative values (optimizer second moments...).
_NEEDS_NON_NEGATIVE = {"Sqrt", "Rsqrt", "Log", "Log1p", "Reciprocal", "Inv", "Pow"}
#: Element-wise, reduction and shape ops through which a variable's value is followed to
#: find out whether it must be non-negative, and how many of them are followed.
_ARITHMETIC = {
    "Identity",
    "Cast",
    "Snapshot",
    "StopGradient",
    "AddV2",
    "Add",
    "Sub",
    "Mul",
    "RealDiv",
    "Div",
    "DivNoNan",
    "Maximum",
    "Minimum",
    "Mean",
    "Sum",
    "ExpandDims",
    "Reshape",
    "Squeeze",
    "BroadcastTo",
    "Tile",
}
_ARITHMETIC_DEPTH = 6
_DEFAULT_INT_BOUND = 2
_WEIGHT_LIMIT_CAP = 0.5
_SCALAR_FLOAT = 1e-3
#: Scale of the state the loss does not depend on (optimizer slots, moving statistics)
#: against a weight's: state as early in training. At a weight's scale, all positive, a
#: momentum moved every weight of VGG-16 the same way at once (loss 6.89 -> 2.8e22 -> NaN
#: in 3 steps); at a hundredth, 6.89 -> 6.86 -> 6.83.
_STATE_SCALE = 1e-2


@dataclass(frozen=True)
class Allocation:
    """One buffer allocated by a kernel during the measured step.

    Attributes
    ----------
    node : str
        Name, in the original graph, of the op whose kernel allocated the buffer (for ops
        lowered or inlined from a function body: the enclosing node of the original graph;
        for fed inputs: the input placeholder).
    device : str
        Short device name, e.g. ``"CPU:0"``.
    allocator : str
        Allocator name from the records (``"cpu"``, or ``"mklcpu"`` with oneDNN), or
        ``"feed"`` for a fed input.
    bytes : int
        Size of the buffer. Negative for a *release*: the buffer a variable had before the
        step, which TensorFlow frees without a record once a copy-on-write update has
        replaced it and the old value's last reader has run. ``node`` is then the update
        that made the copy, ``alloc_us`` the time of the release and ``free_us`` ``None``,
        so that summing ``bytes`` from ``alloc_us`` on (and subtracting them at
        ``free_us``) gives the live memory of the step, as :attr:`Measurement.peak_bytes`
        does.
    alloc_us : int
        Allocation time in microseconds, relative to the start of the measured step.
    free_us : int or None
        Deallocation time in microseconds relative to the start of the step, ``None`` if
        the buffer is still alive at the end of the step.
    """

    node: str
    device: str
    allocator: str
    bytes: int
    alloc_us: int
    free_us: int | None


@dataclass(frozen=True)
class Measurement:
    """What one measured run of a training step allocated.

    Attributes
    ----------
    peak_bytes : Mapping[str, int]
        Per device, the peak over the measured step of the sum of live transient
        allocations (fed inputs included), less the variable buffers released by then
        (the negative records of ``allocations``). Allocations and deallocations recorded
        at the same microsecond are applied allocations first, which can only
        overestimate.
    persistent_bytes : Mapping[str, int]
        Per device, the bytes resident before the step starts: the variables plus the
        persistent kernel memory reported by the step (the outputs of ``Const`` nodes).
    allocations : tuple[Allocation, ...]
        Every allocation of the measured step, and the release of each variable buffer
        replaced by a copy-on-write update (negative ``bytes``), ordered by time.
    losses : tuple[float, ...]
        The float scalar the step returns (its loss, or what it returns for it) after
        each step run.
    variables : Mapping[str, numpy.ndarray]
        Final values of the variables, keyed by the name of the resource placeholder they
        replace.
    finite : bool
        Whether every loss and every floating-point variable value is finite.
    step_seconds : tuple of float
        Wall time of each untraced step, in order (the first one includes warm-up).
    allocator_peak_bytes : int or None
        When the process runs with TensorFlow's BFC allocator on the CPU
        (``TF_CPU_ALLOCATOR_USE_BFC=1``, set before TensorFlow starts): the allocator's
        own peak over the traced step, persistent memory included, in its 256-byte
        chunks, fragmentation included; every CPU device shares that one allocator.
        ``None`` otherwise.
    op_times : tuple of Mapping
        One mapping per step run with ``op_time_steps``: each node's kernel seconds and
        kernel count in that step (:func:`_op_times`), keyed by the node's name in the
        original graph (runtime-only nodes keep their runtime names).
    executed : tuple of str
        The nodes of the original graph in the order the measured step started them on
        ``CPU:0`` (each once, at its first kernel; nodes lowered or inlined from a function
        body count as their enclosing node). With one device and ``inter_op_threads=-1``
        the kernels run one at a time, so this is the executor's order of that session,
        which :func:`lmscore.memory.simulate` can replay (``executed=``).
    """

    peak_bytes: Mapping[str, int]
    persistent_bytes: Mapping[str, int]
    allocations: tuple[Allocation, ...]
    losses: tuple[float, ...]
    variables: Mapping[str, np.ndarray]
    finite: bool
    step_seconds: tuple[float, ...] = ()
    allocator_peak_bytes: int | None = None
    op_times: tuple[Mapping[str, tuple[float, int]], ...] = ()
    executed: tuple[str, ...] = ()

    @property
    def kernel_library(self) -> str:
        """The CPU kernel library the step ran with, read from the allocator's name.

        ``"onednn"`` (allocator ``"mklcpu"``), ``"eigen"`` (``"cpu"``), or ``""`` when the
        step allocated nothing through TensorFlow.
        """
        names = {a.allocator for a in self.allocations}
        for name, library in CPU_ALLOCATORS.items():
            if name in names:
                return library
        return ""


#: CPU allocator names in TensorFlow's records and the kernel library each one means:
#: with oneDNN on, the CPU device allocates through its own ``MklCPUAllocator``.
CPU_ALLOCATORS = {"mklcpu": "onednn", "cpu": "eigen"}


@dataclass(frozen=True)
class _Var:
    name: str
    dtype: tf.DType
    shape: tuple[int, ...]
    device: str
    non_negative: bool
    state: bool = False  # the loss does not depend on it: an optimizer slot, a statistic

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.size


@dataclass(frozen=True)
class _Input:
    name: str
    dtype: tf.DType
    shape: tuple[int, ...]
    bound: int | None


# --------------------------------------------------------------------------- graph walking


class _Scope:
    """The nodes of the top-level graph or of one function body, with consumer lists."""

    def __init__(
        self,
        nodes: Iterable[node_def_pb2.NodeDef],
        fdef: function_pb2.FunctionDef | None = None,
    ) -> None:
        self.fdef = fdef
        self.nodes: dict[str, node_def_pb2.NodeDef] = {}
        self.consumers: dict[str, list[tuple[node_def_pb2.NodeDef, int]]] = defaultdict(list)
        for node in nodes:
            self.nodes[node.name] = node
        for node in self.nodes.values():
            for i, inp in enumerate(node.input):
                if inp.startswith("^"):
                    continue
                self.consumers[inp.split(":")[0]].append((node, i))
        self.args: dict[str, int] = {}
        if fdef is not None:
            self.args = {a.name: i for i, a in enumerate(fdef.signature.input_arg)}

    def output_shape(self, ref: str) -> list[int] | None:
        """Return the static shape of the tensor ``ref`` (-1 for unknown dims) or None."""
        parts = ref.split(":")
        name = parts[0]
        if name in self.args and self.fdef is not None:
            attr = self.fdef.arg_attr.get(self.args[name])
            if attr is None or "_output_shapes" not in attr.attr:
                return None
            shapes = attr.attr["_output_shapes"].list.shape
            index = 0
        else:
            node = self.nodes.get(name)
            if node is None or "_output_shapes" not in node.attr:
                return None
            shapes = node.attr["_output_shapes"].list.shape
            index = int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 0
        if index >= len(shapes) or shapes[index].unknown_rank:
            return None
        return [d.size for d in shapes[index].dim]

    def const_int(self, ref: str) -> int | None:
        """Return the value of a scalar integer ``Const`` tensor, or None."""
        node = self.nodes.get(ref.split(":")[0])
        if node is None or node.op != "Const":
            return None
        try:
            value = tf.make_ndarray(node.attr["value"].tensor)
        except (TypeError, ValueError):
            return None
        if value.size != 1 or not np.issubdtype(value.dtype, np.integer):
            return None
        return int(value.reshape(()))


class _Library:
    """Function bodies of a GraphDef, indexed lazily."""

    def __init__(self, graph_def: graph_pb2.GraphDef) -> None:
        self._fdefs = {f.signature.name: f for f in graph_def.library.function}
        self._scopes: dict[str, _Scope] = {}

    def scope(self, name: str) -> _Scope | None:
        if name not in self._fdefs:
            return None
        if name not in self._scopes:
            fdef = self._fdefs[name]
            self._scopes[name] = _Scope(fdef.node_def, fdef)
        return self._scopes[name]

    def callees(self, node: node_def_pb2.NodeDef, index: int) -> list[tuple[_Scope, str]]:
        """Return the (function scope, argument name) pairs receiving input ``index``."""
        result = []
        for attr_name, offset in _CALLS.get(node.op, ()):
            if attr_name not in node.attr or index < offset:
                continue
            attr = node.attr[attr_name]
            names = [f.name for f in attr.list.func] if attr.HasField("list") else [attr.func.name]
            for fname in names:
                scope = self.scope(fname)
                if scope is None or scope.fdef is None:
                    continue
                args = scope.fdef.signature.input_arg
                if index - offset < len(args):
                    result.append((scope, args[index - offset].name))
        return result


def _uses(
    scope: _Scope, name: str, library: _Library, seen: set[tuple[int, str]] | None = None
) -> Iterable[tuple[_Scope, node_def_pb2.NodeDef, int]]:
    """Yield every (scope, consumer, input index) of ``name``, entering called functions."""
    if seen is None:
        seen = set()
    key = (id(scope), name)
    if key in seen:
        return
    seen.add(key)
    for node, index in scope.consumers.get(name, ()):
        if node.op in _CALLS:
            for callee, arg in library.callees(node, index):
                yield from _uses(callee, arg, library, seen)
        else:
            yield scope, node, index


def _dims(shape: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


def _variable_info(
    scope: _Scope, name: str, library: _Library
) -> tuple[tf.DType | None, tuple[int, ...] | None, bool, bool]:
    """Derive dtype, shape, non-negativity and use of a resource placeholder."""
    dtype = None
    shape: tuple[int, ...] | None = None
    partial: list[int] | None = None
    non_negative = False
    used = False
    for sub, node, index in _uses(scope, name, library):
        used = True
        node_dtype = node.attr["dtype"].type if "dtype" in node.attr else 0
        if node.op == "ReadVariableOp":
            candidate = sub.output_shape(node.name + ":0")
            if _reaches(sub, node.name, _NEEDS_NON_NEGATIVE, _ARITHMETIC, _ARITHMETIC_DEPTH):
                non_negative = True
        elif node.op in _ASSIGNS and index == 0 and len(node.input) > 1:
            candidate = sub.output_shape(node.input[1])
        elif node.op.startswith(FUSED_APPLIES):
            # tf.compat.v1.train optimizers: variable and slots share the gradient's shape
            # (its rows for a sparse update) and the op's ``T``
            node_dtype = node.attr["T"].type if "T" in node.attr else 0
            grad = _apply_gradient_input(node)
            out = sub.output_shape(grad) if grad is not None else None
            candidate = None
            if out is not None and node.op.startswith("ResourceApply"):
                candidate = out
            elif out is not None and len(out) >= 1:
                partial = [-1, *out[1:]]
        elif node.op == "ResourceGather" and index == 0:
            out = sub.output_shape(node.name + ":0")
            idx = sub.output_shape(node.input[1])
            candidate = None
            if out is not None and idx is not None and node.attr["batch_dims"].i == 0:
                partial = [-1, *out[len(idx) :]]
        else:
            candidate = None
        if node_dtype and dtype is None:
            dtype = tf.as_dtype(node_dtype)
        if candidate is not None and all(d >= 0 for d in candidate) and shape is None:
            shape = _dims(candidate)
    if shape is None and partial is not None and all(d >= 0 for d in partial):
        shape = _dims(partial)
    node = scope.nodes.get(name)
    handle = handle_spec(node.attr) if node is not None else None
    if handle is not None:  # what the exporter recorded of the variable itself
        shape = shape or handle[0]
        dtype = dtype or tf.as_dtype(handle[1])
    return dtype, shape, non_negative, used


def _apply_gradient_input(node: node_def_pb2.NodeDef) -> str | None:
    """The gradient input of an optimizer's apply op (:func:`lmscore.ir.gradient_input`)."""
    k = gradient_input(node.op)
    return node.input[k] if k is not None and k < len(node.input) else None


def _reaches(scope: _Scope, name: str, targets: set[str], through: set[str], depth: int) -> bool:
    """Whether ``name``'s value reaches one of ``targets`` within ``depth`` hops."""
    frontier = [name]
    seen = {name}
    for _ in range(depth):
        following = []
        for producer in frontier:
            for node, _index in scope.consumers.get(producer, ()):
                if node.op in targets:
                    return True
                if node.op in through and node.name not in seen:
                    seen.add(node.name)
                    following.append(node.name)
        frontier = following
    return False


def _int_bound(
    scope: _Scope, name: str, library: _Library, var_shapes: Mapping[str, tuple[int, ...]]
) -> int | None:
    """Find the exclusive upper bound of the valid values of integer input ``name``.

    Follows the input's consumers through shape-only and selection ops (and into called
    functions) to the ops that use it as an index or label, and returns the smallest bound
    they impose, or None if none is found.
    """
    bounds: list[int] = []
    queue: deque[tuple[_Scope, str]] = deque([(scope, name)])
    seen: set[tuple[int, str]] = set()
    while queue:
        cur, producer = queue.popleft()
        if (id(cur), producer) in seen:
            continue
        seen.add((id(cur), producer))
        for node, index in cur.consumers.get(producer, ()):
            op = node.op
            if op in _CALLS:
                queue.extend(library.callees(node, index))
                continue
            positions = _PASS_THROUGH.get(op, ())
            if positions is None or index in positions:
                queue.append((cur, node.name))
                continue
            # (a gather passes its params' values on and takes its indices' bound)
            bound = _index_bound(cur, node, index, var_shapes)
            if bound is not None and bound > 0:
                bounds.append(bound)
    return min(bounds) if bounds else None


def _index_bound(
    scope: _Scope,
    node: node_def_pb2.NodeDef,
    index: int,
    var_shapes: Mapping[str, tuple[int, ...]],
) -> int | None:
    """Return the bound an index/label-consuming op imposes on its input ``index``."""
    op = node.op
    if op in ("GatherV2", "Gather", "ResourceGather") and index == 1:
        axis = 0
        if op == "GatherV2" and len(node.input) > 2:
            const = scope.const_int(node.input[2])
            if const is None:
                return None
            axis = const
        if op == "ResourceGather":
            params = node.input[0].split(":")[0]
            shape: list[int] | tuple[int, ...] | None = var_shapes.get(params)
            if shape is None:
                # A variable read through a function argument: take the gather's own view.
                return None
        else:
            shape = scope.output_shape(node.input[0])
        if shape is None or not -len(shape) <= axis < len(shape):
            return None
        dim = shape[axis]
        return dim if dim >= 0 else None
    if op in ("SparseSoftmaxCrossEntropyWithLogits",) and index == 1:
        logits = scope.output_shape(node.input[0])
        if logits and logits[-1] >= 0:
            return logits[-1]
        return None
    if op == "OneHot" and index == 0 and len(node.input) > 1:
        return scope.const_int(node.input[1])
    if op in ("UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin") and index == 1:
        if len(node.input) > 2:
            return scope.const_int(node.input[2])
    return None


# --------------------------------------------------------------------------- synthetic data


def _glorot_limit(shape: tuple[int, ...]) -> float:
    if len(shape) == 0:
        return _SCALAR_FLOAT
    if len(shape) == 1:
        fan_in = fan_out = shape[0]
    else:
        receptive = int(np.prod(shape[:-2], dtype=np.int64)) if len(shape) > 2 else 1
        fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
    total = max(fan_in + fan_out, 1)
    return min(math.sqrt(6.0 / total), _WEIGHT_LIMIT_CAP)


def _initial_value(var: _Var, rng: np.random.Generator) -> np.ndarray:
    """Return the deterministic synthetic value of a variable (see :func:`measure`)."""
    np_dtype = var.dtype.as_numpy_dtype
    if var.dtype.is_bool:
        return np.zeros(var.shape, dtype=bool)
    if var.dtype.is_integer:
        return np.ones(var.shape, dtype=np_dtype)
    if var.dtype.is_floating or var.dtype.is_complex:
        if len(var.shape) == 0:
            return np.asarray(_SCALAR_FLOAT, dtype=np_dtype)
        limit = _glorot_limit(var.shape) * (_STATE_SCALE if var.state else 1.0)
        # a second moment stays above any squared first moment drawn (limit <= 0.5): a
        # centered RMSprop takes the square root of their difference
        low = limit / 2 if var.non_negative else -limit
        return rng.uniform(low, limit, var.shape).astype(np_dtype)
    return np.zeros(var.shape, dtype=np_dtype)


def _input_value(inp: _Input, rng: np.random.Generator) -> np.ndarray:
    """Return the deterministic synthetic feed of one input placeholder."""
    np_dtype = inp.dtype.as_numpy_dtype
    if inp.dtype.is_bool:
        return rng.integers(0, 2, inp.shape).astype(bool)
    if inp.dtype.is_integer:
        high = inp.bound if inp.bound is not None else _DEFAULT_INT_BOUND
        high = min(high, int(inp.dtype.max) + 1)
        return rng.integers(0, high, inp.shape).astype(np_dtype)
    if inp.dtype.is_floating or inp.dtype.is_complex:
        return rng.standard_normal(inp.shape).astype(np_dtype)
    if inp.dtype == tf.string:
        return np.full(inp.shape, b"", dtype=object)
    raise RunError(f"input '{inp.name}': cannot synthesise data of dtype {inp.dtype.name}")


# --------------------------------------------------------------------------- devices


_CPU_RE = re.compile(r"(?:^|/)(?:device:)?cpu:(\d+)$", re.IGNORECASE)


def _device_index(device: str) -> int:
    """Return 1 if ``device`` names CPU:1, else 0 (everything else is the accelerator)."""
    match = _CPU_RE.search(device.strip())
    return 1 if match is not None and match.group(1) == "1" else 0


def _short_device(device: str) -> str:
    match = re.search(r"device:([A-Za-z_]+):(\d+)$", device)
    if match is None:
        return device
    return f"{match.group(1).upper()}:{match.group(2)}"


# --------------------------------------------------------------------------- measuring


def _parse(graph_def: bytes | graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    if isinstance(graph_def, graph_pb2.GraphDef):
        copy = graph_pb2.GraphDef()
        copy.CopyFrom(graph_def)
        return copy
    parsed = graph_pb2.GraphDef()
    try:
        parsed.ParseFromString(bytes(graph_def))
    except (DecodeError, TypeError, ValueError) as exc:
        raise GraphError(f"graph_def: not a serialized GraphDef ({exc})") from None
    return parsed


@dataclass(frozen=True)
class _Plan:
    variables: tuple[_Var, ...]
    inputs: tuple[_Input, ...]
    sinks: tuple[str, ...]
    loss: str


def _output_dtypes(node: node_def_pb2.NodeDef) -> list[int]:
    """Return the dtype enums of a node's outputs (empty if its op is unknown)."""
    op_def = op_def_registry.get(node.op)
    if op_def is None:
        return []
    result: list[int] = []
    for arg in op_def.output_arg:
        if arg.type_list_attr:
            result.extend(node.attr[arg.type_list_attr].list.type)
            continue
        dtype = arg.type or node.attr[arg.type_attr].type
        count = node.attr[arg.number_attr].i if arg.number_attr else 1
        result.extend([dtype] * count)
    return result


def _returned_scalar(gdef: graph_pb2.GraphDef, top: _Scope, sinks: list[str]) -> str:
    """Return the name of the float scalar the step returns (a sink node's output).

    What each run reports (:attr:`Measurement.losses`), the same tensor in the step and
    in its rewrite, whatever the step returns (its loss, or the metric Keras' ``fit``
    returns). Which op computes the loss is :func:`lmscore.order.order`'s question: this
    one is only which value to fetch. A step's gradient graph can leave dead float
    scalars as sinks too (the unused branch of a ``DivNoNan`` gradient...), so the graph
    output proper is preferred: an ``Identity`` with control inputs (``Identity(loss,
    ^NoOp)``), then any node with control inputs, then the last candidate in graph order.
    Outputs without a recorded shape are only taken when no output is known to be a
    scalar.
    """
    best: tuple[tuple[bool, bool, bool, int], str] | None = None
    for position, name in enumerate(sinks):
        node = top.nodes[name]
        controlled = any(i.startswith("^") for i in node.input)
        for index, dtype in enumerate(_output_dtypes(node)):
            shape = top.output_shape(f"{name}:{index}")
            if not tf.as_dtype(dtype).is_floating or shape not in ([], None):
                continue
            key = (shape == [], controlled and node.op == "Identity", controlled, position)
            if best is None or key > best[0]:
                best = (key, f"{name}:{index}")
            break
    if best is None:
        raise GraphError("graph_def: no sink node has a float scalar output (the loss)")
    return best[1]


def _data_ancestors(top: _Scope, tensor: str) -> set[str]:
    """Return the nodes the value of ``tensor`` depends on through data edges."""
    seen: set[str] = set()
    stack = [tensor.split(":")[0]]
    while stack:
        name = stack.pop()
        if name in seen or name not in top.nodes:
            continue
        seen.add(name)
        stack.extend(i.split(":")[0] for i in top.nodes[name].input if not i.startswith("^"))
    return seen


def _collect(gdef: graph_pb2.GraphDef, batch_size: int) -> _Plan:
    """Find the variables, inputs, sink nodes and loss of the graph."""
    top = _Scope(gdef.node)
    library = _Library(gdef)
    consumed = set()
    for node in gdef.node:
        for inp in node.input:
            consumed.add(inp.lstrip("^").split(":")[0])
    sinks = [n.name for n in gdef.node if n.name not in consumed and n.op != "Placeholder"]
    loss = _returned_scalar(gdef, top, sinks)
    forward = _data_ancestors(top, loss)

    infos = {
        node.name: _variable_info(top, node.name, library)
        for node in gdef.node
        if node.op == "Placeholder" and node.attr["dtype"].type == _RESOURCE
    }
    # An optimizer slot that only its apply op uses takes the shape of the variable it
    # is applied with (a sparse apply tells only the rows' shape).
    for node in gdef.node:
        if node.op.startswith(FUSED_APPLIES):
            peers = [i for i in node.input if i in infos]
            known = [infos[i][1] for i in peers if infos[i][1] is not None]
            for i in peers:
                if infos[i][1] is None and known:
                    infos[i] = (infos[i][0], known[0], *infos[i][2:])
    variables: list[_Var] = []
    for node in gdef.node:
        if node.name not in infos or node.op != "Placeholder":
            continue
        dtype, shape, reaches_root, used = infos[node.name]
        if not used:
            continue
        if dtype is None or shape is None:
            readers = sorted({n.op for n in gdef.node
                              if any(i.split(":")[0] == node.name for i in n.input)})
            if any("Table" in r for r in readers):
                raise RunError(
                    f"resource placeholder '{node.name}' is a lookup table's handle (read by "
                    f"{', '.join(readers)}): validation cannot rebuild a table filled before "
                    "the step (inspect and tune do not need it)")
            what = "dtype" if dtype is None else "full shape"
            raise RunError(f"variable placeholder '{node.name}': no consumer tells its {what} "
                           f"(read by {', '.join(readers) or 'nothing'}), so validation cannot "
                           "make the variable")
        state = node.name not in forward
        device = f"CPU:{_device_index(node.device)}"
        variables.append(_Var(node.name, dtype, shape, device, reaches_root or state, state))
    var_shapes = {v.name: v.shape for v in variables}

    inputs: list[_Input] = []
    for node in gdef.node:
        if node.op != "Placeholder" or node.attr["dtype"].type == _RESOURCE:
            continue
        dtype = tf.as_dtype(node.attr["dtype"].type)
        if "shape" in node.attr and not node.attr["shape"].shape.unknown_rank:
            dims = [d.size for d in node.attr["shape"].shape.dim]
        else:
            dims = top.output_shape(node.name)
        if dims is None:
            raise RunError(f"input '{node.name}': unknown rank, cannot synthesise data")
        shape = []
        for i, d in enumerate(dims):
            if d >= 0:
                shape.append(d)
            elif i == 0:
                shape.append(batch_size)
            else:
                raise RunError(
                    f"input '{node.name}': dimension {i} is unknown "
                    "(only the batch dimension 0 may be)"
                )
        bound = _int_bound(top, node.name, library, var_shapes) if dtype.is_integer else None
        inputs.append(_Input(node.name, dtype, tuple(shape), bound))
    return _Plan(tuple(variables), tuple(inputs), tuple(sinks), loss)


def _plan(gdef: graph_pb2.GraphDef, batch_size: int) -> _Plan:
    """Run :func:`_collect`, turning what a malformed graph makes TF raise into GraphError."""
    try:
        return _collect(gdef, batch_size)
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise GraphError(f"graph_def: malformed graph: {_tf_error_line(exc)}") from None


def _feeds(plan: _Plan, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([seed, 1])
    return {i.name: _input_value(i, rng) for i in plan.inputs}


def synthetic_inputs(
    graph_def: bytes | graph_pb2.GraphDef, batch_size: int, *, seed: int = 0
) -> dict[str, np.ndarray]:
    """Return the synthetic data :func:`measure` feeds to the graph's inputs.

    Parameters
    ----------
    graph_def : bytes or GraphDef
        The training-step graph (see :func:`measure`).
    batch_size : int
        Value of the unknown dimension 0 of every input.
    seed : int, optional
        Same meaning as in :func:`measure`; the same seed gives the same data.

    Returns
    -------
    dict[str, numpy.ndarray]
        One array per non-resource ``Placeholder``, keyed by its name.

    Raises
    ------
    GraphError
        If ``graph_def`` cannot be parsed or has no loss output.
    RunError
        If an input has an unknown dimension other than 0 or a variable's shape cannot
        be derived.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size: must be an integer >= 1, got {batch_size!r}")
    return _feeds(_plan(_parse(graph_def), batch_size), seed)


def _prepare(gdef: graph_pb2.GraphDef, devices: int, seed: int) -> None:
    """Pin every node to CPU:0 or CPU:1, drop colocation hints, fix unseeded random ops."""
    for node in gdef.node:
        index = _device_index(node.device) if devices == 2 else 0
        node.device = f"/device:CPU:{index}"
        if "_class" in node.attr:
            del node.attr["_class"]
    bodies = [gdef.node] + [f.node_def for f in gdef.library.function]
    count = 0
    for nodes in bodies:
        for node in nodes:
            if "seed" in node.attr and "seed2" in node.attr:
                if node.attr["seed"].i == 0 and node.attr["seed2"].i == 0:
                    count += 1
                    node.attr["seed"].i = seed + 1
                    node.attr["seed2"].i = count
                    if "deterministic" in node.attr:
                        # seeded, a fractional pool must say so (its kernel refuses seeds
                        # otherwise: "Both seed and seed2 should be 0 if deterministic is
                        # false"); its draws are then fixed, as every other random op's
                        node.attr["deterministic"].b = True


def _session_config(
    devices: int, inter_op_threads: int, intra_op_threads: int, grappler: bool = False
) -> config_pb2.ConfigProto:
    """The session's configuration: Grappler and the classic optimizer off, or defaults.

    With ``grappler`` the rewriter and optimizer options are TensorFlow's defaults (empty
    protos), which is what a ``tf.function`` gets: the graph that runs is Grappler's.
    """
    if grappler:
        rewrite = rewriter_config_pb2.RewriterConfig()
        optimizer = config_pb2.OptimizerOptions()
    else:
        rewrite = rewriter_config_pb2.RewriterConfig(
            disable_meta_optimizer=True,
            constant_folding=rewriter_config_pb2.RewriterConfig.OFF,
            arithmetic_optimization=rewriter_config_pb2.RewriterConfig.OFF,
            dependency_optimization=rewriter_config_pb2.RewriterConfig.OFF,
            layout_optimizer=rewriter_config_pb2.RewriterConfig.OFF,
            remapping=rewriter_config_pb2.RewriterConfig.OFF,
            memory_optimization=rewriter_config_pb2.RewriterConfig.NO_MEM_OPT,
        )
        optimizer = config_pb2.OptimizerOptions(
            opt_level=config_pb2.OptimizerOptions.L0,
            do_common_subexpression_elimination=False,
            do_constant_folding=False,
            do_function_inlining=False,
        )
    return config_pb2.ConfigProto(
        device_count={"CPU": devices, "GPU": 0},
        inter_op_parallelism_threads=inter_op_threads,
        intra_op_parallelism_threads=intra_op_threads,
        use_per_session_threads=inter_op_threads > 0,
        allow_soft_placement=False,
        graph_options=config_pb2.GraphOptions(rewrite_options=rewrite, optimizer_options=optimizer),
    )


def _tf_error_line(exc: Exception) -> str:
    """Return one line naming the failing node and TensorFlow's reason.

    A session error reads ``Graph execution error:``, a ``Detected at node ...`` traceback,
    ``Node: 'X'``, the reason, then ``[[{{node X}}]]``: the reason is the last line before
    the first ``[[{{node`` marker that is not the ``Node:`` line.
    """
    message = getattr(exc, "message", None) or str(exc)
    lines = [line.strip() for line in message.splitlines()]
    node = re.search(r"\{\{node ([^}]+)\}\}", message)
    reason = ""
    marker = next((i for i, line in enumerate(lines) if "[[{{node" in line), None)
    if marker is not None:
        for line in reversed(lines[:marker]):
            if line and not line.startswith("Node: "):
                reason = line
                break
    if not reason:
        useful = [line for line in lines if line and line != "Graph execution error:"]
        reason = useful[0] if useful else type(exc).__name__
    reason = re.sub(r"\s+", " ", reason)
    if node is not None:
        return f"node '{node.group(1)}': {reason}"
    return reason


@dataclass(frozen=True)
class _Writes:
    """Which top-level nodes write and read each variable, to find copy-on-write releases.

    Attributes
    ----------
    sizes : Mapping[str, int]
        Bytes of each variable, keyed by its resource placeholder.
    updates : Mapping[str, tuple[str, ...]]
        Each node writing variables (:func:`_is_update`), with the variables it takes, in
        input order (an optimizer apply takes its slots too).
    reads : Mapping[str, tuple[str, ...]]
        The ``ReadVariableOp`` nodes of each variable.
    holders : Mapping[str, tuple[str, ...]]
        For each read: the nodes that hold its buffer (the read, the views of it, and
        the consumers of either), whose last one to finish drops the last reference.
    assigns : Mapping[str, tuple[str, ...] | None]
        The update nodes that are ``AssignVariableOp``, each with the other readers of
        the value it assigns (and of the views it is read through), or None when the
        value cannot be adopted (a constant, a fed input).
    """

    sizes: Mapping[str, int]
    updates: Mapping[str, tuple[str, ...]]
    reads: Mapping[str, tuple[str, ...]]
    holders: Mapping[str, tuple[str, ...]]
    assigns: Mapping[str, tuple[str, ...] | None]


def _is_update(op: str) -> bool:
    """Whether ``op`` writes a resource variable (an assignment or an optimizer apply)."""
    return op in _ASSIGNS or op.startswith(_UPDATE_PREFIXES)


def _variable_writes(gdef: graph_pb2.GraphDef, variables: Iterable[_Var]) -> _Writes:
    """Collect the top-level writers, reads and read holders of each variable.

    Function bodies are not entered: a read inside one, or a copy made inside one, is
    reported under the call node, whose records are left as they are.
    """
    top = _Scope(gdef.node)
    sizes = {v.name: v.nbytes for v in variables}

    def variable(ref: str) -> str | None:
        # Resource handles may reach the op through Identity nodes.
        name = ref.split(":")[0]
        seen = set()
        while name in top.nodes and top.nodes[name].op == "Identity" and name not in seen:
            seen.add(name)
            name = top.nodes[name].input[0].split(":")[0]
        return name if name in sizes else None

    updates: dict[str, tuple[str, ...]] = {}
    assigns: dict[str, tuple[str, ...] | None] = {}
    reads: dict[str, list[str]] = defaultdict(list)
    holders: dict[str, tuple[str, ...]] = {}
    for node in gdef.node:
        if node.op == "ReadVariableOp" and node.input:
            var = variable(node.input[0])
            if var is None:
                continue
            reads[var].append(node.name)
            held = {node.name: None}  # ordered set
            frontier = [node.name]
            while frontier:
                producer = frontier.pop()
                for consumer, _index in top.consumers.get(producer, ()):
                    if consumer.name in held:
                        continue
                    held[consumer.name] = None
                    if consumer.op in _VIEWS:
                        frontier.append(consumer.name)
            holders[node.name] = tuple(held)
        elif _is_update(node.op):
            written = [v for i in node.input if not i.startswith("^") and (v := variable(i))]
            if written:
                updates[node.name] = tuple(written)
                if node.op == "AssignVariableOp":
                    value = node.input[1].split(":")[0] if len(node.input) > 1 else ""
                    chain = [value]
                    while value in top.nodes and top.nodes[value].op in _VIEWS and (
                            value not in chain[:-1]) and top.nodes[value].input:
                        value = top.nodes[value].input[0].split(":")[0]
                        chain.append(value)
                    root = top.nodes.get(value)
                    others = {c.name for v in chain for c, _ in top.consumers.get(v, ())}
                    others -= {node.name, *chain}
                    assigns[node.name] = None if root is None or root.op in (
                        "Const", "Placeholder", "HostConst") else tuple(sorted(others))
    return _Writes(
        sizes=sizes,
        updates=updates,
        reads={k: tuple(v) for k, v in reads.items()},
        holders=holders,
        assigns=MappingProxyType(assigns),
    )


class _NameMap:
    """Map runtime node names back to the names of the original graph."""

    def __init__(self, names: Iterable[str], var_nodes: Mapping[str, str]) -> None:
        self._names = set(names)
        self._vars = dict(var_nodes)
        self._cache: dict[str, str] = {}

    def __call__(self, runtime: str) -> str:
        if runtime in self._cache:
            return self._cache[runtime]
        result = self._lookup(runtime)
        self._cache[runtime] = result
        return result

    def _lookup(self, runtime: str) -> str:
        if runtime in self._names:
            return runtime
        if runtime in self._vars:
            return self._vars[runtime]
        if runtime.startswith("Func/"):
            runtime = runtime[len("Func/") :]
        parts = runtime.split("/")
        for cut in range(len(parts) - 1, 0, -1):
            prefix = "/".join(parts[:cut])
            if prefix in self._names:
                return prefix
        return runtime


def _timeline(
    step_stats: step_stats_pb2.StepStats,
    names: _NameMap,
    feeds: Mapping[str, str],
    writes: _Writes | None = None,
) -> tuple[list[Allocation], dict[str, int], dict[str, int]]:
    """Turn traced step stats into allocations, peaks and persistent kernel memory.

    With ``writes``, the unrecorded releases of variable buffers replaced by copy-on-write
    updates are added as negative records (:func:`_copy_releases`).
    """
    starts = [
        ns.all_start_micros
        for ds in step_stats.dev_stats
        for ns in ds.node_stats
        if ns.all_start_micros > 0
    ]
    start = min(starts) if starts else 0
    allocations: list[Allocation] = []
    persistent: dict[str, int] = defaultdict(int)
    persistent_seen: set[tuple[str, str]] = set()
    devices: list[str] = []
    for ds in step_stats.dev_stats:
        device = _short_device(ds.device)
        if device not in devices:
            devices.append(device)
        for ns in sorted(ds.node_stats, key=lambda n: (n.all_start_nanos, n.all_start_micros)):
            node = names(ns.node_name)
            size = ns.memory_stats.persistent_memory_size
            if size > 0 and (device, ns.node_name) not in persistent_seen:
                persistent_seen.add((device, ns.node_name))
                persistent[device] += size
            if ns.node_name in feeds:
                for out in ns.output:
                    requested = out.tensor_description.allocation_description.requested_bytes
                    if requested > 0:
                        allocations.append(
                            Allocation(
                                feeds[ns.node_name],
                                device,
                                _FEED_ALLOCATOR,
                                int(requested),
                                0,
                                None,
                            )
                        )
            for mem in ns.memory:
                allocations.extend(_pair_records(mem, node, device, start))
    if writes is not None:
        allocations.extend(_copy_releases(step_stats, names, writes, allocations, start))
    # Stable: records at the same microsecond keep the order of the step stats.
    allocations.sort(key=lambda a: a.alloc_us)
    peaks = _peaks(allocations)
    for device in devices:
        peaks.setdefault(device, 0)
    return allocations, peaks, dict(persistent)


def _pair_records(
    mem: step_stats_pb2.AllocatorMemoryUsed, node: str, device: str, start: int
) -> list[Allocation]:
    """Pair the allocation and deallocation records of one node and allocator."""
    records = sorted(
        ((r.alloc_micros, r.alloc_bytes) for r in mem.allocation_records),
        key=lambda r: (r[0], -r[1]),
    )
    open_allocs: dict[int, deque[int]] = defaultdict(deque)
    pairs: list[tuple[int, int, int | None]] = []
    for micros, size in records:
        if size > 0:
            open_allocs[size].append(len(pairs))
            pairs.append((size, micros, None))
        elif size < 0 and open_allocs[-size]:
            index = open_allocs[-size].popleft()
            pairs[index] = (pairs[index][0], pairs[index][1], micros)
    return [
        Allocation(
            node,
            device,
            mem.allocator_name,
            size,
            alloc - start,
            None if free is None else free - start,
        )
        for size, alloc, free in pairs
    ]


def _copy_releases(
    step_stats: step_stats_pb2.StepStats,
    names: _NameMap,
    writes: _Writes,
    allocations: Iterable[Allocation],
    start: int,
) -> list[Allocation]:
    """The releases of variable buffers replaced by copy-on-write updates, unrecorded.

    An update that finds an earlier read of its variable still referenced writes into a
    copy of the variable, allocated under the update node and outliving its kernel. The
    old buffer goes when the last reference to the old value drops: at the latest end of
    a kernel holding a read of the variable made after its previous update and before
    this one (the reads, their views, and the views' consumers). When that buffer is the
    one the variable had before the step (counted in the persistent memory), TensorFlow
    records nothing, so the release is returned as an :class:`Allocation` of negative
    bytes at that time, under the update node.

    An ``AssignVariableOp`` that is the last user of its value adopts the value's buffer
    (recorded under whichever kernel allocated it, the value having perhaps been computed
    in place): the old buffer goes at the assignment, or when the last read of it is
    done.

    Only a variable's first copy in the step is released: a later copy replaces a buffer
    allocated during the step, whose deallocation is recorded. A var-sized record is only
    taken for a copy if a read of the variable is held until the copy is allocated (a
    record the reads do not explain, e.g. a read held inside a function body, is left as
    it is), and a variable is left alone after an ``AssignVariableOp`` that adopted
    nothing. Either way the double count stays, which can only overestimate.

    Parameters
    ----------
    step_stats : StepStats
        The traced step.
    names : _NameMap
        Runtime to original node names.
    writes : _Writes
        The variables' writers, reads and read holders.
    allocations : Iterable[Allocation]
        The paired records of the step.
    start : int
        Start of the step, in microseconds since the epoch.

    Returns
    -------
    list[Allocation]
        One negative record per released variable buffer.
    """
    begin: dict[str, int] = {}  # earliest kernel start of each node, ns (orders kernels)
    first: dict[str, int] = {}  # the same, us from the step start
    end: dict[str, int] = {}  # latest kernel end of each node, us from the step start
    device: dict[str, str] = {}  # where each variable's writes ran
    for ds in step_stats.dev_stats:
        for ns in ds.node_stats:
            node = names(ns.node_name)
            started = ns.all_start_nanos or ns.all_start_micros * 1000
            finished = ns.all_start_micros + ns.all_end_rel_micros - start
            begin[node] = min(begin.get(node, started), started)
            first[node] = min(first.get(node, finished), ns.all_start_micros - start)
            end[node] = max(end.get(node, finished), finished)
            for var in writes.updates.get(node, ()):
                device.setdefault(var, _short_device(ds.device))
    # Candidate copies: records of update kernels that outlive the kernel.
    made: dict[str, list[Allocation]] = defaultdict(list)
    for a in allocations:
        if a.bytes > 0 and a.node in writes.updates and a.node in end and (
            a.free_us is None or a.free_us > end[a.node]
        ):
            made[a.node].append(a)
    allocator = {a.device: a.allocator for a in allocations if a.bytes > 0}
    writers: dict[str, list[str]] = defaultdict(list)
    for node, variables in writes.updates.items():
        if node in begin:
            for var in dict.fromkeys(variables):
                writers[var].append(node)
    releases = []
    taken: set[int] = set()
    for var, nodes in writers.items():
        size = writes.sizes[var]
        previous = -1
        for node in sorted(nodes, key=begin.__getitem__):
            update = begin[node]
            copy = next(
                (a for a in made[node] if id(a) not in taken and a.bytes == size), None
            )
            # The old value is held until the last holder of a read since the previous
            # update ends; reads after this update already see the copy.
            held = [
                end[h]
                for r in writes.reads.get(var, ())
                if r in begin and previous < begin[r] < update
                for h in writes.holders[r]
                if h in end
            ]
            until = max(held, default=-1)
            others = writes.assigns.get(node, None)
            if copy is None and others is not None and node in first and all(
                    end.get(o, -1) <= first[node] for o in others):
                # AssignVariableOp adopts the buffer of a value it is the last user of
                # (``forward_input``): the variable's old buffer goes at the assignment,
                # or when the last read of it is done.
                releases.append(Allocation(
                    node, device[var], allocator.get(device[var], ""), -size,
                    max(until, end[node]), None))
                break
            if copy is not None and until >= copy.alloc_us:
                taken.add(id(copy))
                releases.append(
                    Allocation(copy.node, copy.device, copy.allocator, -size, until, None)
                )
            if copy is not None or node in writes.assigns:
                break  # the variable's buffer may have changed: later copies are unknown
            previous = update
    return releases


def _peaks(allocations: Iterable[Allocation]) -> dict[str, int]:
    """Peak of the live bytes per device (:func:`lmscore.timeline.live_curve`)."""
    by_device: dict[str, list[Allocation]] = defaultdict(list)
    for a in allocations:
        by_device[a.device].append(a)
    return {device: live_curve(records)[2] for device, records in by_device.items()}




def refuse_side_effects(gdef: graph_pb2.GraphDef) -> None:
    """Refuse to run a graph whose ops (or library functions' ops) reach outside it.

    Parameters
    ----------
    gdef : GraphDef
        The graph about to be run.

    Raises
    ------
    RunError
        Naming the first such node, its op type and its function, if any.
    """
    places = [("", gdef.node)] + [(f" in function {f.signature.name!r}", f.node_def)
                                  for f in gdef.library.function]
    for where, nodes in places:
        for node in nodes:
            stream = node.attr["output_stream"].s if "output_stream" in node.attr else b""
            if node.op in SIDE_EFFECT_OPS or stream.startswith(b"file://"):
                raise RunError(f"node {node.name!r}{where} is a {node.op}, which reads or "
                               "writes outside the graph: refusing to run it")


def measure(
    graph_def: bytes | graph_pb2.GraphDef,
    batch_size: int,
    *,
    steps: int = 2,
    seed: int = 0,
    devices: int = 1,
    trace_step: int = -1,
    inter_op_threads: int = -1,
    intra_op_threads: int = 0,
    grappler: bool = False,
    op_time_steps: int = 0,
) -> Measurement:
    """Run a training step on the CPU and measure what TensorFlow allocates.

    Parameters
    ----------
    graph_def : bytes or GraphDef
        Serialized ``GraphDef`` of a training step: inputs are ``Placeholder`` nodes with
        an unknown batch dimension, captured variables are ``DT_RESOURCE`` placeholders,
        and a sink node outputs the float scalar loss.
    batch_size : int
        Value of the unknown dimension 0 of every input.
    steps : int, optional
        How many steps to run (default 2: one warm-up step, then the traced one).
    seed : int, optional
        Seed of the synthetic variable values and input data.
    devices : int, optional
        1: everything runs on ``CPU:0``. 2: the emulated-accelerator mode, with two
        logical CPU devices; nodes whose device string names CPU:1 (the host) run there,
        every other node on CPU:0 (the accelerator).
    trace_step : int, optional
        Index of the step to trace (negative counts from the end; default the last).
        Tracing step 0 also records the one-off allocations of ``Const`` outputs.
    inter_op_threads : int, optional
        ``inter_op_parallelism_threads`` of the session. The default, -1, runs the kernels
        of a single-device session one at a time in the calling thread, which makes the
        peak repeatable; ``n >= 1`` uses a pool of ``n`` threads of the session's own.
    intra_op_threads : int, optional
        ``intra_op_parallelism_threads`` of the session (0: one per core). TensorFlow
        shares one intra-op pool per process, sized by the first session or eager
        context, so this only takes effect for the first one (or if the environment
        variable ``TF_OVERRIDE_GLOBAL_THREADPOOL=1`` was set before TensorFlow started).
        It did not change any measured peak.
    grappler : bool, optional
        False (the default): Grappler and the classic graph optimizer are off, so the
        graph runs as given, which is what the memory simulator models. True: both run
        with TensorFlow's default configuration, as in a ``tf.function`` (the user's
        runtime, :func:`lmscore.swap`): fused kernels, rewritten arithmetic, folded
        constants. Use it to compare numerics, not memory (the graph that runs is not the
        one given; allocations of fused nodes are reported under the fused node's name).
    op_time_steps : int, optional
        After the ``steps`` steps (and after reading the final variables), run this many
        more, each traced, and record every node's kernel times in
        :attr:`Measurement.op_times` (what :mod:`lmscore.profile` reads). Each is followed
        by an untraced step whose wall time joins ``step_seconds``, so that the kernel
        times and the wall times see the machine in the same state.

    Returns
    -------
    Measurement
        Peaks and persistent bytes per device, the allocations of the traced step, the
        loss after each step, the final variable values and whether all are finite.

    Raises
    ------
    GraphError
        If ``graph_def`` cannot be parsed or imported, or has no float scalar output.
    RunError
        If a variable's dtype or shape, or an input's shape, cannot be derived, or
        TensorFlow fails to run the graph.
    ConfigError
        If an argument is out of range.

    Notes
    -----
    Synthetic values are drawn from ``numpy.random.default_rng([seed, 0])`` (variables)
    and ``numpy.random.default_rng([seed, 1])`` (inputs, see :func:`synthetic_inputs`) in
    graph order, so a run is reproducible:

    * a variable's dtype and shape come from its consumers (``ReadVariableOp``'s ``dtype``
      and ``_output_shapes``, the value of ``Assign*VariableOp``, ``ResourceGather``),
      following it into called functions (``While``, ``If``, ``PartitionedCall``);
    * integer variables (iteration counters, seed states) are 1, boolean ones False;
    * floating-point scalars (learning rate, loss scale, ...) are 0.001;
    * the other floating-point variables the loss depends on (the weights) are uniform
      in ``[-l, l)`` with the Glorot limit ``l = min(sqrt(6 / (fan_in + fan_out)), 0.5)``;
      those it does not depend on (optimizer slots, moving statistics) are uniform in
      ``[0, l / 100)`` (state as early in training: at a weight's scale, all positive, a
      momentum moves every weight the same way at once and the loss blows up), and any
      other variable whose value reaches ``Sqrt``, ``Rsqrt``, ``Log``, ``Pow``... within
      six element-wise, reduction or reshaping ops is uniform in ``[l / 2, l)``, so that
      square roots and divisions of optimizer second moments never produce NaN (nor the
      square root of a second moment less a squared first one, as centered RMSprop takes);
    * float inputs are standard normal, boolean inputs fair coin flips; integer inputs are
      uniform in ``[0, bound)``, where the bound is found by following the input through
      ``Cast``, ``Reshape``, ``StridedSlice``, ``SelectV2``... to the ops using it as an
      index or label: ``GatherV2``/``ResourceGather`` (dim ``axis`` of the params),
      ``SparseSoftmaxCrossEntropyWithLogits`` (classes), ``OneHot`` (depth); inputs with no
      such use get values in ``[0, 2)``. Every step is fed the same batch.

    The step runs the loss and every sink node of the graph (so the variable updates and
    any dead branch run, as in the graph given). Allocations and deallocations recorded
    at the same microsecond are applied allocations first, the conservative order (on the
    graphs tried, both orders gave the same peaks).

    Unseeded stateful random ops get a fixed seed derived from ``seed``, Grappler and the
    classic graph optimizer are switched off (unless ``grappler``), and every node is
    pinned to its CPU device, so two calls with the same arguments give bit-identical
    losses and variables.
    """
    for label, value, low in (
        ("batch_size", batch_size, 1),
        ("steps", steps, 1),
        ("inter_op_threads", inter_op_threads, -1),
        ("intra_op_threads", intra_op_threads, 0),
        ("op_time_steps", op_time_steps, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{label}: must be an integer >= {low}, got {value!r}")
    if devices not in (1, 2):
        raise ConfigError(f"devices: must be 1 or 2, got {devices!r}")
    if not isinstance(grappler, bool):
        raise ConfigError(f"grappler: must be True or False, got {grappler!r}")
    if not isinstance(trace_step, int) or not -steps <= trace_step < steps:
        raise ConfigError(f"trace_step: must be in [{-steps}, {steps}), got {trace_step!r}")
    traced = trace_step % steps

    gdef = _parse(graph_def)
    refuse_side_effects(gdef)
    plan = _plan(gdef, batch_size)
    variables, inputs, sinks = plan.variables, plan.inputs, plan.sinks
    original_names = [n.name for n in gdef.node]
    _prepare(gdef, devices, seed)
    var_rng = np.random.default_rng([seed, 0])
    initial = {v.name: _initial_value(v, var_rng) for v in variables}
    feed_values = _feeds(plan, seed)

    prefix = _PREFIX
    while any(n == prefix or n.startswith(prefix + "/") for n in original_names):
        prefix += "_"
    graph = tf.Graph()
    var_nodes: dict[str, str] = {}
    try:
        with graph.as_default():
            input_map = {}
            init_ops = []
            init_feeds = {}
            handles = {}
            for k, var in enumerate(variables):
                with tf.device(f"/device:{var.device}" if devices == 2 else "/device:CPU:0"):
                    handle = tf.raw_ops.VarHandleOp(
                        dtype=var.dtype,
                        shape=var.shape,
                        shared_name=f"{prefix}_v{k}",
                        name=f"{prefix}/v{k}",
                    )
                    value = tf.compat.v1.placeholder(var.dtype, var.shape, name=f"{prefix}/p{k}")
                    init_ops.append(
                        tf.raw_ops.AssignVariableOp(
                            resource=handle, value=value, name=f"{prefix}/init{k}"
                        )
                    )
                init_feeds[value] = initial[var.name]
                input_map[var.name + ":0"] = handle
                handles[var.name] = handle
                var_nodes[handle.op.name] = var.name
            tf.compat.v1.import_graph_def(gdef, input_map=input_map, name="")
            reads = {}
            for k, var in enumerate(variables):
                with tf.device(f"/device:{var.device}" if devices == 2 else "/device:CPU:0"):
                    reads[var.name] = tf.raw_ops.ReadVariableOp(
                        resource=handles[var.name], dtype=var.dtype, name=f"{prefix}/read{k}"
                    )
    except (ValueError, TypeError, KeyError, tf.errors.OpError) as exc:
        raise GraphError(f"graph_def: cannot import: {_tf_error_line(exc)}") from None

    loss = graph.get_tensor_by_name(plan.loss)
    # What a tf.function runs: its outputs and every stateful op with what leads to them
    # (the function runtime prunes the rest, e.g. the shape of a dead gradient branch).
    # Running all sinks would keep stateless dead ops that hold buffers no user's step
    # holds.
    targets = [op for op in (graph.get_operation_by_name(name) for name in sinks)
               if op.type in OUTPUT_OPS or (op.op_def is not None and op.op_def.is_stateful)]
    feed_dict = {
        graph.get_tensor_by_name(name + ":0"): value for name, value in feed_values.items()
    }

    losses: list[float] = []
    step_seconds: list[float] = []
    bfc = os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("1", "true")
    allocator_peak: int | None = None
    run_metadata = config_pb2.RunMetadata()
    config = _session_config(devices, inter_op_threads, intra_op_threads, grappler)
    try:
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            session.run(init_ops, feed_dict=init_feeds)
            for step in range(steps):
                if step == traced:
                    if bfc:
                        tf.config.experimental.reset_memory_stats("CPU:0")
                    options = config_pb2.RunOptions(
                        trace_level=config_pb2.RunOptions.FULL_TRACE,
                        output_partition_graphs=True,
                    )
                    value, _ = session.run(
                        [loss, targets],
                        feed_dict=feed_dict,
                        options=options,
                        run_metadata=run_metadata,
                    )
                    if bfc:
                        allocator_peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
                else:
                    started = time.perf_counter()
                    value, _ = session.run([loss, targets], feed_dict=feed_dict)
                    step_seconds.append(time.perf_counter() - started)
                value = np.asarray(value)
                if value.size != 1:
                    raise RunError(
                        f"loss '{plan.loss}': output has shape {list(value.shape)}, "
                        "expected a scalar"
                    )
                losses.append(float(value.reshape(())))
            final = session.run(reads) if reads else {}
            traces = []
            for _ in range(op_time_steps):
                timed = config_pb2.RunMetadata()
                session.run([loss, targets], feed_dict=feed_dict, run_metadata=timed,
                            options=config_pb2.RunOptions(
                                trace_level=config_pb2.RunOptions.FULL_TRACE))
                traces.append(timed.step_stats)
                # an untraced step beside each traced one: both see the machine alike
                started = time.perf_counter()
                session.run([loss, targets], feed_dict=feed_dict)
                step_seconds.append(time.perf_counter() - started)
    except (tf.errors.OpError, TypeError, ValueError) as exc:
        raise RunError(_tf_error_line(exc)) from None

    names = _NameMap(original_names, var_nodes)
    feeds = {f"_arg_{i.name}_0_{k}": i.name for k, i in enumerate(inputs)}
    feeds = _feed_nodes(run_metadata.step_stats, {i.name for i in inputs}) or feeds
    writes = _variable_writes(gdef, variables)
    allocations, peaks, kernel_persistent = _timeline(
        run_metadata.step_stats, names, feeds, writes
    )

    device_names = [f"CPU:{d}" for d in range(devices)]
    persistent = {d: 0 for d in device_names}
    for var in variables:
        persistent[var.device if devices == 2 else "CPU:0"] += var.nbytes
    for device, size in kernel_persistent.items():
        persistent[device] = persistent.get(device, 0) + size
    for device in device_names:
        peaks.setdefault(device, 0)

    finite = all(math.isfinite(x) for x in losses) and all(
        bool(np.all(np.isfinite(v)))
        for v in final.values()
        if np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.complexfloating)
    )
    return Measurement(
        peak_bytes=MappingProxyType(dict(sorted(peaks.items()))),
        persistent_bytes=MappingProxyType(dict(sorted(persistent.items()))),
        allocations=tuple(allocations),
        losses=tuple(losses),
        variables=MappingProxyType({k: np.asarray(v) for k, v in final.items()}),
        finite=finite,
        step_seconds=tuple(step_seconds),
        allocator_peak_bytes=allocator_peak,
        op_times=tuple(_op_times(s, names, feeds) for s in traces),
        executed=_executed(run_metadata, names, feeds, gdef),
    )


def _executed(
    run_metadata: config_pb2.RunMetadata,
    names: _NameMap,
    feeds: Mapping[str, str],
    gdef: graph_pb2.GraphDef,
) -> tuple[str, ...]:
    """Original node names in the order their first kernel started on ``CPU:0``.

    Nodes the runtime fused into another (oneDNN's layout pass: ``Conv2D`` into the
    ``BiasAdd`` after it, ``BiasAddGrad`` into the ``Conv2DBackpropFilter`` beside it) have
    no kernel of their own; each is placed just before the node that ran it: the node
    its consumers now read from instead, else the consumer that took it in (one that
    reads the fused node's own inputs in its place).
    """
    def original(runtime: str) -> str:
        return feeds.get(runtime) or names(runtime)

    top = _Scope(gdef.node)
    started: dict[str, None] = {}
    last: dict[str, int] = {}  # a conditional: the position of its last kernel
    for ds in run_metadata.step_stats.dev_stats:
        if _short_device(ds.device) != "CPU:0":
            continue
        # Stable: kernels started in the same microsecond keep the order of the records.
        for ns in sorted(ds.node_stats, key=lambda n: (n.all_start_nanos, n.all_start_micros)):
            name = original(ns.node_name)
            started.setdefault(name, None)
            node = top.nodes.get(name)
            if node is not None and node.op in BRANCH_ATTRS:
                last[name] = len(started)
    if last:
        # A lowered conditional's first kernels (the switches of its predicate) start as
        # soon as the predicate exists, its branch once the data arrives: it allocates
        # and returns with its last kernels (a gradient's: in the backward pass).
        keys = {name: (last.get(name, k + 1), k) for k, name in enumerate(started)}
        started = dict.fromkeys(sorted(started, key=keys.__getitem__))
    rank = {name: k for k, name in enumerate(started)}

    # Data inputs as (producer, port): the runtime's, named back to the original graph.
    runtime_inputs: dict[str, set[tuple[str, int]]] = {}
    for pg in run_metadata.partition_graphs:
        for node in pg.node:
            ins = runtime_inputs.setdefault(original(node.name), set())
            for t in node.input:
                if not t.startswith("^"):
                    producer, port = split_tensor(t)
                    ins.add((original(producer), port))

    def data_inputs(node: node_def_pb2.NodeDef) -> set[tuple[str, int]]:
        return {split_tensor(t) for t in node.input if not t.startswith("^")}

    before: dict[str, list[str]] = defaultdict(list)
    for name, node in top.nodes.items():
        if name in rank or name in runtime_inputs:
            continue
        own = {producer for producer, _ in data_inputs(node)}
        anchors = []
        for consumer, _index in top.consumers.get(name, ()):
            c = consumer.name
            if c not in rank:
                continue
            new = {p for p, _ in runtime_inputs.get(c, set()) - data_inputs(consumer)} - own
            anchors += new or [c]
        anchors = [a for a in anchors if a in rank]
        if anchors:
            before[min(anchors, key=rank.__getitem__)].append(name)
    return tuple(x for name in started for x in (*before.get(name, ()), name))


def _op_times(
    step_stats: step_stats_pb2.StepStats, names: _NameMap, feeds: Mapping[str, str]
) -> Mapping[str, tuple[float, int]]:
    """Each node's kernel seconds and kernel count in one traced step.

    A kernel's time runs from its compute's start to its end (``op_start`` to ``op_end``),
    without the executor's bookkeeping around it; the kernels of a lowered loop or an
    inlined call add up under the call node.
    """
    times: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for ds in step_stats.dev_stats:
        for ns in ds.node_stats:
            entry = times[feeds.get(ns.node_name) or names(ns.node_name)]
            entry[0] += max(ns.op_end_rel_nanos - ns.op_start_rel_nanos, 0) / 1e9
            entry[1] += 1
    return MappingProxyType({k: (v[0], v[1]) for k, v in times.items()})


def _feed_nodes(step_stats: step_stats_pb2.StepStats, inputs: set[str]) -> dict[str, str]:
    """Map the runtime ``_arg_<input>_<i>_<j>`` node names to input names."""
    result = {}
    pattern = re.compile(r"^_arg_(.+)_\d+_\d+$")
    for ds in step_stats.dev_stats:
        for ns in ds.node_stats:
            match = pattern.match(ns.node_name)
            if match is not None and match.group(1) in inputs:
                result[ns.node_name] = match.group(1)
    return result
