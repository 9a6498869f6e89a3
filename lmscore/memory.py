"""Memory simulator: device and host curves over the CTO levels.

The simulation is "first and last use, then one sweep over events":

1. Map every tensor to a *buffer*. Ops that return a view of their input (``Identity``,
   ``Reshape``, ``ReadVariableOp``...) share their input's buffer. Elementwise kernels
   that TensorFlow lets overwrite their input (``forward_input_or_allocate_output``:
   ``Relu``, ``AddV2``, ``BiasAdd``, ``ReluGrad``...) reuse the buffer of an input of the
   same shape and dtype when they are its last reader.
2. A buffer is allocated when its producer runs and freed after its last reader has run
   (a buffer nobody reads is freed right after its producer). Variables and constants are
   persistent; feeds are held by the caller for the whole step.
3. Sweep the levels: allocate what each level produces, note the live bytes, free what
   it was the last reader of.

Ops placed on the host (swap-outs of a rewritten graph) allocate on the host curve.
Tensors of unknown size count 0 bytes and are reported. A variable written while an
earlier read of it is still in use gets a second buffer until that read is done
(copy-on-write). Kernel workspace follows the ``workspace`` model of :func:`simulate`:
none for accelerators (the default, independent of the machine), TensorFlow's Eigen or
oneDNN CPU kernels for validation on this CPU.

A ``While`` op is one op of the schedule, read through its body
(:func:`lmscore.shapes.loop_body`): a loop variable the loop dies with is carried in its
buffer, lists it passes on, sets in place or references are views of their input list,
each iteration's temporaries are the body's simulated transient peak, and a gradient loop
never holds the lists it pops and the lists it fills all full together.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import math
import operator
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

from .errors import ConfigError, GraphError
from .ir import (
    BROADCAST_BINARY_OPS,
    FEED_OPS,
    VARIABLE_OPS,
    Graph,
    Op,
    dtype_bytes,
    gc_paused,
    op_signatures,
    waited_for,
)
from .order import Ordering, order, replayed
from .shapes import (
    BRANCH_ATTRS,
    LoopBody,
    Sizes,
    as_feed,
    branch_functions,
    duplicated,
    function_body,
    loop_body,
    loop_seeds,
    optional_aliases,
    resolve,
    resolve_function,
    trip_count,
)

#: Ops whose output ``k`` is a view of input ``k`` (0 for single-output ops).
ALIAS_OPS = frozenset({
    "Identity", "IdentityN", "StopGradient", "PreventGradient", "Reshape", "Squeeze",
    "ExpandDims", "Snapshot", "EnsureShape", "Bitcast", "CheckNumerics",
    "ReadVariableOp", "_Retval",
})
#: Kernels that write their output into an input buffer when nobody else holds it.
FORWARDING_OPS = frozenset({
    # unary cwise
    "Abs", "Neg", "Sign", "Reciprocal", "Inv", "Square", "Sqrt", "Rsqrt", "Exp", "Expm1",
    "Log", "Log1p", "Sin", "Cos", "Tan", "Tanh", "Sigmoid", "Erf", "Erfc", "Floor", "Ceil",
    "Round", "Rint", "Relu", "Relu6", "Elu", "Selu", "Softplus", "Softsign", "LeakyRelu",
    "LogicalNot", "IsFinite", "Cast",
    # binary cwise
    *BROADCAST_BINARY_OPS, "BiasAdd", "AddN", "Softmax", "LogSoftmax",
    # activation gradients
    "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "SigmoidGrad", "TanhGrad",
    "SoftplusGrad", "SoftsignGrad", "LeakyReluGrad", "RsqrtGrad", "SqrtGrad",
    "ReciprocalGrad",
    # fills: ``ZerosLikeOp`` and ``OnesLikeOp`` write into their input when they may (a
    # ``tf.scan``'s initial state ``zeros_like(xs[0])`` keeps all of ``xs``)
    "ZerosLike", "OnesLike",
})

_DEVICE, _HOST = 0, 1
#: What :func:`_buffers` makes of an op type's outputs.
_OTHER, _FEED, _VARIABLE, _CONST = range(4)


@dataclass(frozen=True)
class Buffer:
    """One allocation of the simulation.

    Attributes
    ----------
    tensor : str
        The tensor that allocated it (``"op:port"``); views and in-place results share it.
    bytes : int
        Its size (0 when unknown).
    start : int
        Level at which it is allocated.
    end : int
        Last level at which it is alive (its last reader's level).
    producer : int
        Index of the producing op.
    readers : tuple of int
        Indices of the ops that read it (through any view), sorted by level.
    host : bool
        True if it lives in host memory.
    scratch : bool
        True for a kernel's temporary workspace (allocated and freed within the op).
    first, last : int
        Positions in the executor schedule of its producer and of its last reader.
    views : tuple of str
        The other tensors that share this buffer (views and in-place results).
    ahead : bool
        True for what a loop's early part computed ahead of the loop
        (:func:`_loop_effects`): how much that is follows the schedule (how far ahead the
        early part gets), so it is no part of the loop's own working set.
    """

    tensor: str
    bytes: int
    start: int
    end: int
    producer: int
    readers: tuple[int, ...]
    host: bool = False
    scratch: bool = False
    first: int = 0
    last: int = 0
    views: tuple[str, ...] = ()
    ahead: bool = False

    @property
    def distance(self) -> int:
        """Levels between allocation and last use."""
        return self.end - self.start


# :func:`_buffers` sets these fields of each record itself (``ahead`` keeps its default).
if [f.name for f in dataclasses.fields(Buffer)] != [
        "tensor", "bytes", "start", "end", "producer", "readers", "host", "scratch", "first",
        "last", "views", "ahead"]:
    raise RuntimeError("lmscore.memory.Buffer's fields changed: _buffers sets them one by one")


@dataclass(frozen=True)
class LiveTensor:
    """A buffer alive at some level, as shown in the hotspot table.

    Attributes
    ----------
    tensor : str
        Name ``"op:port"``.
    bytes : int
    producer_level : int
    last_use_level : int
    distance : int
    category : str
        Category of the producing op.
    swappable : bool
        Whether it is a swap candidate (design: produced on the accelerator by an op that
        is not a constant, variable or feed; rank >= 2; read after a gap).
    reason : str
        Why it is not swappable (empty when it is).
    swap_tensor : str
        The tensor to swap to move this buffer off the device: of the tensors sharing the
        buffer (views, in-place results), the one with the longest edge to a reader.
    """

    tensor: str
    bytes: int
    producer_level: int
    last_use_level: int
    distance: int
    category: str
    swappable: bool
    reason: str
    swap_tensor: str = ""


@dataclass(frozen=True)
class Simulation:
    """Result of :func:`simulate`.

    Attributes
    ----------
    device_curve : tuple of int
        Peak device bytes within each level (persistent + feeds + transient).
    host_curve : tuple of int
        Peak host bytes within each level (swapped tensors).
    peak_bytes : int
        Maximum of ``device_curve``.
    peak_level : int
        First level where it is reached.
    persistent_bytes : int
        Variables (including optimizer state) and constants, held for the whole step.
    input_bytes : int
        Feeds, held by the caller for the whole step.
    transient_peak_bytes : int
        ``peak_bytes - persistent_bytes - input_bytes``.
    host_peak_bytes : int
        Maximum of ``host_curve``.
    buffers : tuple of Buffer
        Every transient allocation, in order of allocation.
    unknown_size_tensors : tuple of str
        Tensors whose size is unknown (counted as 0 bytes).
    batch_size : int
    level_peak_position : tuple of int
        For each level, the schedule position (one of the level's ops) where the level's
        device peak occurs.
    peak_position : int
        Schedule position of the overall peak.
    race_bytes : int
        How much more than ``peak_bytes`` the step may hold when the executor's threads
        let a while loop's early part (see :func:`simulate`) run its whole
        ``parallel_iterations`` window ahead while the loop runs, where the expected
        course has it only a few iterations ahead, or when a swapped tensor is freed only
        after the op that waits for its swap-out has allocated (:func:`_release_races`).
        The peak is the expected course; a budget must hold ``peak_bytes + race_bytes``
        (:attr:`worst_peak_bytes`).
    at_most_size_tensors : tuple of str
        Tensors whose size the data's values decide, counted at the most it can be
        (:attr:`lmscore.shapes.Sizes.at_most`): the peak may be lower on real data.
    """

    device_curve: tuple[int, ...]
    host_curve: tuple[int, ...]
    peak_bytes: int
    peak_level: int
    persistent_bytes: int
    input_bytes: int
    transient_peak_bytes: int
    host_peak_bytes: int
    buffers: tuple[Buffer, ...]
    unknown_size_tensors: tuple[str, ...]
    batch_size: int
    level_peak_position: tuple[int, ...] = ()
    peak_position: int = 0
    race_bytes: int = 0
    at_most_size_tensors: tuple[str, ...] = ()

    @property
    def worst_peak_bytes(self) -> int:
        """``peak_bytes + race_bytes``: what a device must hold for the step to fit."""
        return self.peak_bytes + self.race_bytes


#: The share of the transient budget (the device less the persistent memory) a step may
#: use, unless told otherwise: what ``tune``, ``lms tune --safety`` and the web app's
#: verdicts take, the rest left to the allocator's fragmentation and the runtime's own
#: buffers. (The web app's summary judged at 1.0 and said "fits" where ``tune`` swapped.)
DEFAULT_SAFETY = 0.9


def fits(sim: Simulation, device_bytes: int, safety: float = 1.0,
         host_bytes: int | None = None) -> bool:
    """Whether a simulated step fits a device of ``device_bytes``: the one "fits".

    The step's persistent memory stays resident; its transient peak, with what a while
    loop's race may add (:attr:`Simulation.worst_peak_bytes`), must stay within
    ``safety`` of the rest. With ``host_bytes``, what the step keeps in host memory (its
    swapped tensors, :attr:`Simulation.host_peak_bytes`) must stay within that too.

    Examples
    --------
    >>> sim = Simulation((100,), (30,), 100, 0, 40, 0, 60, 30, (), (), 1)
    >>> fits(sim, 100), fits(sim, 99), fits(sim, 100, safety=0.9)
    (True, False, False)
    >>> fits(sim, 100, host_bytes=30), fits(sim, 100, host_bytes=29)
    (True, False)
    """
    if host_bytes is not None and sim.host_peak_bytes > host_bytes:
        return False
    return fit_margin(sim, device_bytes, safety) >= 0


def fit_margin(sim: Simulation, device_bytes: int, safety: float = 1.0) -> int:
    """Device bytes a simulated step leaves to spare under :func:`fits`'s test.

    Negative: how far over it the step is. Host memory is not part of it.

    >>> sim = Simulation((100,), (30,), 100, 0, 40, 0, 60, 30, (), (), 1)
    >>> fit_margin(sim, 100), fit_margin(sim, 99), fit_margin(sim, 100, safety=0.9)
    (0, -1, -6)
    """
    return transient_budget(device_bytes, sim.persistent_bytes, safety) - (
        sim.worst_peak_bytes - sim.persistent_bytes)


#: TensorFlow's limit of its pinned host allocator (``gpu_host_bfc``, where swapped
#: tensors live) when ``TF_GPU_HOST_MEM_LIMIT_IN_MB`` is not set: 2^17 MiB, 128 GiB
#: (``gpu_process_state.cc``; TensorFlow 1.x and early 2.x used 64 GiB).
DEFAULT_HOST_LIMIT_MIB = 1 << 17


def host_memory_limit(environ: Mapping[str, str] | None = None) -> int:
    """Bytes TensorFlow lets a step keep in pinned host memory.

    ``TF_GPU_HOST_MEM_LIMIT_IN_MB`` (MiB, as TensorFlow reads it) when set, else
    :data:`DEFAULT_HOST_LIMIT_MIB`.

    Examples
    --------
    >>> limit = host_memory_limit({"TF_GPU_HOST_MEM_LIMIT_IN_MB": "4096"})
    >>> host_memory_limit({}) == 128 * 2**30, limit
    (True, 4294967296)

    Raises
    ------
    ConfigError
        If the variable is set to something other than a positive integer.
    """
    env = os.environ if environ is None else environ
    text = env.get("TF_GPU_HOST_MEM_LIMIT_IN_MB", "").strip()
    if not text:
        return DEFAULT_HOST_LIMIT_MIB << 20
    try:
        mib = int(text)
    except ValueError:
        mib = 0
    if mib <= 0:
        raise ConfigError(
            f"TF_GPU_HOST_MEM_LIMIT_IN_MB: expected a positive number of MiB, got {text!r}")
    return mib << 20


def transient_budget(device_bytes: int, persistent_bytes: int, safety: float = 1.0) -> int:
    """Bytes a step's transient memory may use on a device: ``(device - persistent) x safety``.

    Negative (persistent memory alone over the device): by how much, with no margin taken
    off (scaled by ``safety``, the shortfall came out smaller than it is).

    >>> transient_budget(100, 40, 0.9), transient_budget(100, 140, 0.9)
    (54, -40)
    """
    free = device_bytes - persistent_bytes
    return int(free * safety) if free > 0 else free


def persistent_over(persistent_bytes: int, device_bytes: int) -> str:
    """Why a step fits no device its persistent memory fills, in one phrase.

    >>> persistent_over(200, 100).split(" (")[0], persistent_over(200, 100).endswith(
    ...     "fills the 100 B device")
    ('its persistent memory alone', True)
    """
    from .units import format_bytes

    return (f"its persistent memory alone ({format_bytes(persistent_bytes)}: variables, "
            f"optimizer slots, constants) fills the {format_bytes(device_bytes)} device")


#: Kernel workspace models :func:`simulate` accepts (see its ``workspace`` parameter).
WORKSPACES = ("accelerator", "eigen", "onednn", "none", "cpu")

#: Working-set target of TensorFlow's CPU convolution-gradient kernels: a constant in the
#: kernels (``l3_cache_size = 30LL << 20`` in ``conv_grad_input_ops.h``,
#: ``conv_grad_filter_ops.cc`` and ``conv_grad_ops_3d.cc``), not this machine's cache.
_TF_CPU_L3 = 30 << 20
#: Per-thread work below which the input-gradient kernel shards the batch instead of
#: running one parallel contraction (``l2_cache_size = 256LL << 10`` there).
_TF_CPU_L2 = 256 << 10
#: The 3-D kernels fall back to Eigen (no im2col buffer) above this buffer/tensors ratio
#: (``kMaxTempAllocationOverhead`` in ``conv_grad_ops_3d.cc``).
_MAX_OVERHEAD_3D = 25

_CONV_SCRATCH = frozenset({
    "Conv2DBackpropFilter", "Conv2DBackpropInput",
    "Conv3DBackpropFilterV2", "Conv3DBackpropInputV2", "Conv3DBackpropFilter",
    "Conv3DBackpropInput",
})
#: Dtypes whose convolutions oneDNN runs on the CPU; the others (half, double) keep
#: TensorFlow's Eigen kernels even with oneDNN on (measured: a float16 Conv2D gradient
#: allocates the same im2col buffer with and without ``TF_ENABLE_ONEDNN_OPTS``).
_ONEDNN_DTYPES = frozenset({"float", "bfloat16"})


def cpu_kernel_library() -> str:
    """The CPU kernel library TensorFlow runs in this process: ``"onednn"`` or ``"eigen"``.

    TensorFlow decides once per process, from ``TF_ENABLE_ONEDNN_OPTS`` and, when it is
    unset, from the CPU (x86 Linux builds turn oneDNN on by default on CPUs with AVX-512
    VNNI, AVX-512 BF16, AVX-VNNI or AMX). When TensorFlow is already imported its own
    answer (``IsMklEnabled``, the function behind that decision) is used; otherwise the
    variable and the CPU flags in ``/proc/cpuinfo`` are read the same way, so that asking
    never imports TensorFlow. A measured step tells for sure: see
    :attr:`lmscore.measure.Measurement.kernel_library`. Only CPU validation needs this:
    predictions for accelerators never depend on the machine they are made on.

    Returns
    -------
    str
        ``"onednn"`` or ``"eigen"``.
    """
    if "tensorflow" in sys.modules:
        try:
            from tensorflow.python.util import _pywrap_util_port

            return "onednn" if _pywrap_util_port.IsMklEnabled() else "eigen"
        except (ImportError, AttributeError):  # a private module: it may move
            pass
    flag = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip().lower()
    if flag in ("0", "false"):
        return "eigen"
    if flag in ("1", "true"):
        return "onednn"
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return "eigen"
    vnni = {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"}
    return "onednn" if flags & vnni and os.uname().machine in ("x86_64", "AMD64") else "eigen"


@functools.cache
def _cpu_threads() -> int:
    """Threads of TensorFlow's intra-op pool by default: the schedulable CPUs."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def cpu_scratch_bytes(
    op_type: str,
    filter_shape: tuple[int, ...] | None,
    out_backprop: tuple[int, ...] | None,
    input_shape: tuple[int, ...] | None,
    dtype_size: int,
    threads: int = 1,
) -> int:
    """Workspace of TensorFlow's Eigen convolution-gradient kernels (an im2col buffer).

    The kernels (``Conv2DCustomBackprop{Filter,Input}Op`` and their 3-D versions) lower
    the gradient to matrix products over a ``[shard, output pixels, filter taps x input
    channels]`` buffer. ``shard = ceil(30 MiB / dtype size / work)`` images, with ``work``
    the elements of one image's three matrices, *not* capped by the batch: a 16x16 layer
    at batch 8 gets a 22 MiB buffer. The input-gradient kernel uses one image instead when
    the batch is 1 or the per-thread work exceeds 256 KiB. No case is skipped: 1x1 filters
    take the same path. 3-D kernels use one image at batch 1 only (measured) and fall back
    to Eigen's bufferless path when the buffer exceeds 25x the tensors involved (a 3-D
    input gradient at batch 4 was given one image's buffer, 1.7 MB TensorFlow never took).

    Checked against TensorFlow 2.21's allocation records on every 2-D convolution gradient
    of the zoo and the samples (507 kernels, float32 and float16, exact to the byte).

    Parameters
    ----------
    op_type : str
    filter_shape, out_backprop, input_shape : tuple of int or None
        Shapes of the filter, the output gradient and the input (NHWC / NDHWC).
    dtype_size : int
        Bytes per element.
    threads : int
        Threads of TensorFlow's intra-op pool.

    Returns
    -------
    int
        Bytes (0 when the kernel allocates no buffer or a shape is unknown).

    Examples
    --------
    >>> cpu_scratch_bytes("Conv2DBackpropFilter", (3, 3, 16, 32), (8, 16, 16, 32),
    ...                   (8, 16, 16, 16), 4, 2)
    23445504
    >>> cpu_scratch_bytes("Conv3DBackpropFilterV2", (3, 3, 3, 32, 16), (1, 64, 64, 64, 16),
    ...                   (1, 64, 64, 64, 32), 4)
    905969664
    >>> cpu_scratch_bytes("Conv3DBackpropInputV2", (3, 3, 3, 16, 8), (4, 12, 12, 7, 8),
    ...                   (4, 12, 12, 7, 16), 4, 2)
    0
    """
    if op_type not in _CONV_SCRATCH or not (filter_shape and out_backprop and input_shape):
        return 0
    if -1 in filter_shape or -1 in out_backprop or -1 in input_shape:
        return 0
    batch = out_backprop[0]
    out_pixels = math.prod(out_backprop[1:-1])
    out_depth = filter_shape[-1]
    taps = math.prod(filter_shape[:-1])
    work = out_pixels * out_depth + taps * out_depth + out_pixels * taps
    if work == 0:
        return 0
    target = _TF_CPU_L3 // dtype_size
    three_d = op_type.startswith("Conv3D")
    if "Input" in op_type:
        # the 3-D kernel contracts in parallel only at batch 1 (``use_parallel_contraction``)
        parallel = batch == 1 or (not three_d
                                  and work // max(threads, 1) >= _TF_CPU_L2 // dtype_size)
        shard = 1 if parallel else -(-target // work)
    else:
        shard = 1 if three_d and batch == 1 else -(-target // work)
    col = shard * out_pixels * taps
    if three_d:
        total = math.prod(input_shape) + math.prod(filter_shape) + math.prod(out_backprop)
        if total == 0 or col // total > _MAX_OVERHEAD_3D:
            return 0
    return col * dtype_size


def is_host_op(op_device: str, op_attrs: dict) -> bool:
    """Whether an op runs on the host: it is marked as a swap-out by a rewrite."""
    return op_attrs.get("_lms_role") == "swap_out"


@gc_paused()
def simulate(
    graph: Graph,
    batch_size: int,
    *,
    sizes: Sizes | None = None,
    host_op: Callable[[str, dict], bool] = is_host_op,
    workspace: str = "accelerator",
    executed: Sequence[str] = (),
) -> Simulation:
    """Simulate the memory of one training step, level by level.

    Parameters
    ----------
    graph : Graph
    batch_size : int
        Fills unknown batch dimensions.
    sizes : Sizes, optional
        Precomputed :func:`lmscore.shapes.resolve` result for this graph and batch.
    host_op : callable, optional
        ``host_op(device, attrs)`` says whether an op allocates on the host.
    workspace : {"accelerator", "eigen", "onednn", "none", "cpu"}
        Which kernels' temporary workspace to add to the tensors:

        - ``"accelerator"`` (default, for predictions): no optional workspace, only the
          temporaries a kernel allocates on every device (the cross-entropy kernels' one
          value per row of the logits). cuDNN picks its convolution
          algorithm at run time, with a workspace up to ``TF_CUDNN_WORKSPACE_LIMIT_IN_MB``
          (4 GiB by default), and TensorFlow keeps a no-workspace algorithm beside it
          (``AlgorithmConfig.algorithm_no_scratch``) that it runs when the workspace cannot
          be allocated; cuBLAS takes its workspace outside the step. A step whose tensors
          fit therefore runs, so the prediction is the tensors and those temporaries,
          the same on every machine.
        - ``"eigen"``: TensorFlow's own CPU kernels: the im2col buffers of the convolution
          gradients (:func:`cpu_scratch_bytes`), the int64 argmax of ``MaxPoolGrad`` and
          the float32 copies of half-precision matrix products.
        - ``"onednn"``: TensorFlow's oneDNN CPU kernels: no im2col buffer for float32 and
          bfloat16 convolutions; other dtypes keep the Eigen kernels (half matrix
          products too).
        - ``"none"``: tensors only.
        - ``"cpu"``: the CPU library TensorFlow runs in this process
          (:func:`cpu_kernel_library`); for validation on this machine only.
    executed : sequence of str, optional
        Replay the order of one measured session (op names as they started,
        :attr:`lmscore.measure.Measurement.executed`; :func:`lmscore.order.replayed`)
        instead of the first-in first-out order in graph order, which predictions use.

    Returns
    -------
    Simulation

    Raises
    ------
    ConfigError
        For an unknown ``workspace``.

    Examples
    --------
    >>> from lmscore.ir import Graph, Op, TensorSpec
    >>> f = (TensorSpec("float", (-1, 256)),)
    >>> g = Graph((Op("x", "Placeholder", outputs=f),
    ...            Op("a", "MatMul", inputs=("x:0", "x:0"), outputs=f),
    ...            Op("b", "Tanh", inputs=("a:0",), outputs=f)))
    >>> sim = simulate(g, 1)
    >>> sim.device_curve, sim.input_bytes   # Tanh reuses the MatMul output buffer
    ((1024, 2048, 2048), 1024)
    """
    if workspace not in WORKSPACES:
        raise ConfigError(f"workspace must be one of {', '.join(WORKSPACES)}; got {workspace!r}")
    if workspace == "cpu":
        workspace = cpu_kernel_library()
    if sizes is None:
        sizes = resolve(graph, batch_size)
    return _simulate(graph, batch_size, sizes, host_op, workspace, 0, executed)


def _simulate(
    graph: Graph,
    batch_size: int,
    sizes: Sizes,
    host_op: Callable[[str, dict], bool],
    workspace: str,
    depth: int,
    executed: Sequence[str] = (),
) -> Simulation:
    """:func:`simulate` with its arguments checked; ``depth`` counts enclosing loops."""
    ordering = replayed(order(graph), executed) if executed else order(graph)
    buffers, persistent, feeds = _buffers(graph, ordering, sizes, host_op, workspace)
    buffers += _update_copies(graph, ordering, sizes)
    if workspace in ("eigen", "onednn"):
        buffers += _cpu_scratch(graph, ordering, sizes, workspace)
    if workspace != "none":
        buffers += _kernel_temporaries(graph, ordering, sizes)
    loops, credit, race = _loop_effects(graph, ordering, sizes, buffers, workspace, depth)
    buffers += loops
    if workspace in RELEASE_RACE_LIBRARIES:
        for pos, more in _release_races(graph, ordering, buffers).items():
            race[pos] = race.get(pos, 0) + more
    branches, less = _branch_effects(graph, ordering, sizes, buffers, workspace, depth)
    buffers += branches
    for pos, c in less.items():
        credit[pos] = credit.get(pos, 0) + c
    n = len(graph.ops)
    dev_alloc = [0] * (n + 1)
    dev_free = [0] * (n + 1)
    host_alloc = [0] * (n + 1)
    host_free = [0] * (n + 1)
    scratch = [0] * (n + 1)
    for buf in buffers:
        if buf.scratch:  # freed before the next op starts
            scratch[buf.first] = max(scratch[buf.first], buf.bytes)
        elif buf.host:
            host_alloc[buf.first] += buf.bytes
            host_free[buf.last] += buf.bytes
        else:
            dev_alloc[buf.first] += buf.bytes
            dev_free[buf.last] += buf.bytes
    base = persistent + feeds
    levels = ordering.levels
    n_levels = ordering.num_levels
    # The device bytes while each op runs: what is allocated up to it and not freed
    # before it, its workspace, less what a loop's credit says it never holds at once.
    held = [base] * (n + 1)
    for pos, c in credit.items():
        held[pos] -= c
    steps = map(operator.sub, dev_alloc, [0, *dev_free[:-1]])
    now_at = list(map(operator.add, accumulate(steps), map(operator.add, scratch, held)))[:n]
    device_curve = [-1] * n_levels
    host_curve = [0] * n_levels
    level_pos = [0] * n_levels
    for pos, lvl in enumerate([levels[i] for i in ordering.schedule]):
        if now_at[pos] > device_curve[lvl]:  # the first position of the level's peak
            device_curve[lvl] = now_at[pos]
            level_pos[lvl] = pos
    if any(host_alloc):
        host_live = 0
        for pos, i in enumerate(ordering.schedule):
            host_live += host_alloc[pos]
            if host_live > host_curve[levels[i]]:
                host_curve[levels[i]] = host_live
            host_live -= host_free[pos]
    peak = max(now_at, default=base)
    peak, peak_pos = (peak, now_at.index(peak)) if peak > base else (base, 0)
    # without a race, worst stays at most the peak: no race bytes
    worst = max([now_at[pos] + r for pos, r in race.items()], default=base)
    peak_level = levels[ordering.schedule[peak_pos]] if n else 0
    return Simulation(
        device_curve=tuple(device_curve),
        host_curve=tuple(host_curve),
        peak_bytes=peak,
        peak_level=peak_level,
        persistent_bytes=persistent,
        input_bytes=feeds,
        transient_peak_bytes=peak - base,
        host_peak_bytes=max(host_curve, default=0),
        buffers=tuple(buffers),
        unknown_size_tensors=sizes.unknown,
        batch_size=sizes.batch_size,
        level_peak_position=tuple(level_pos),
        peak_position=peak_pos,
        race_bytes=max(worst - peak, 0),
        at_most_size_tensors=sizes.at_most,
    )


#: How many device allocations after a swap-out its tensor may still be held through.
#: Two until a BatchNorm student CNN's swapped 128 KiB product outlived its swap-out by
#: three quick ``Tile``/``Sub`` allocations, in 8 runs of 9 (its plan measured 1.15 of
#: the prediction, once 1.016 of B).
RELEASE_RACE_ALLOCATIONS = 3
#: The kernel libraries (workspaces) of the emulated accelerator, where the host takes
#: the device's buffer over without a copy and the release race is counted.
RELEASE_RACE_LIBRARIES = frozenset({"eigen", "onednn"})


def release_hold(workspace: str) -> int:
    """Allocations a swapped tensor may outlive its swap-out by, for ``workspace``'s runtime."""
    if workspace == "cpu":
        workspace = cpu_kernel_library()
    return RELEASE_RACE_ALLOCATIONS if workspace in RELEASE_RACE_LIBRARIES else 0


#: Allocations smaller than this (scalars, shape vectors) do not count towards the hold:
#: their kernels take microseconds and leave the sender the cores, and a pinned plan may
#: leave them out of its chain. A segment-pooling plan's swap-out of a 256 KiB tensor ran
#: after the next device ``MatMul`` in 3 runs of 4, with 11 scalar kernels between them
#: in the simulated order, two of which had ended the hold (the plan measured 1.047 of B
#: with ``safety=1.0``, saving 0.835 of predicted).
RELEASE_RACE_MIN_BYTES = 1024


def allocating_positions(buffers: Sequence[Buffer]) -> list[int]:
    """The schedule positions, sorted, of the ops that allocate device memory.

    Those whose allocations are all under :data:`RELEASE_RACE_MIN_BYTES` are left out.
    """
    return sorted({b.first for b in buffers
                   if not b.host and not b.scratch and b.bytes >= RELEASE_RACE_MIN_BYTES})


def held_through(allocating: Sequence[int], after: int,
                 count: int = RELEASE_RACE_ALLOCATIONS) -> int:
    """The last schedule position a buffer released after position ``after`` may live to.

    ``allocating`` lists, sorted, the positions of the ops that allocate device memory.
    TensorFlow drops the last reference to a swapped tensor's device buffer when the thread
    that sent it to the host clears the send's input; the op that waits for the swap-out
    may start first, on another thread (a kernel's own threads may hold the cores). On the
    emulated accelerator the buffer outlived the waiting op and the next allocating one
    (a reversed-sequence model: a 4 MiB buffer freed 2.5-4 ms after its copy, during the
    ``Cumsum`` two ops later; a normalisation net's plan measured 1.079 of its device).
    So it may be held through the next ``count`` allocations. On an accelerator the copy
    itself outlasts that window (a GPU's send thread clears its input while the DMA runs),
    so only the CPU kernels' emulation counts them (:data:`RELEASE_RACE_LIBRARIES`).

    >>> held_through([3, 5, 9], 2, 2), held_through([3, 5, 9], 5, 2), held_through([3], 3)
    (5, 9, 3)
    >>> held_through([3, 5, 9, 12], 2)  # three allocations on
    9
    >>> held_through([3, 5, 9], 2, count=0)
    2
    """
    if count <= 0:
        return after
    k = bisect.bisect_right(allocating, after) + count - 1
    if k < len(allocating):
        return allocating[k]
    return allocating[-1] if allocating and allocating[-1] > after else after


def _release_races(graph: Graph, ordering: Ordering, buffers: list[Buffer]) -> dict[int, int]:
    """What swapped tensors may still hold after their swap-outs (:func:`held_through`).

    The expected curve keeps the usual course, the buffer freed once its swap-out ran;
    "fits" also holds it through the next allocations (the race of
    :attr:`Simulation.race_bytes`). By schedule position, the bytes.
    """
    outs = {b.producer for b in buffers if b.host}  # the swap-outs' host copies
    if not outs:
        return {}
    allocating = allocating_positions(buffers)
    race: dict[int, int] = {}
    for b in buffers:
        if b.host or b.scratch or not b.bytes or not b.readers or b.readers[-1] not in outs:
            continue
        for q in range(b.last + 1, held_through(allocating, b.last) + 1):
            race[q] = race.get(q, 0) + b.bytes
    return race


def _buffers(
    graph: Graph,
    ordering: Ordering,
    sizes: Sizes,
    host_op: Callable[[str, dict], bool],
    workspace: str = "accelerator",
) -> tuple[list[Buffer], int, int]:
    """Assign tensors to buffers; return the transient buffers, persistent and feed bytes.

    ``workspace`` names the kernels: Eigen's CPU kernels forward more inputs than others
    (:data:`_EIGEN_FORWARD_INTO`).
    """
    forward_into = _FORWARD_INTO | _EIGEN_FORWARD_INTO if workspace == "eigen" else _FORWARD_INTO
    forward_types = _FORWARD_TYPES | _EIGEN_FORWARD_INTO.keys() if workspace == "eigen" else (
        _FORWARD_TYPES)
    ops = graph.ops
    adj = graph.adjacency
    level = ordering.levels
    pos = ordering.position
    consumers = adj.consumers
    nbytes = sizes.nbytes
    # Buffer of each tensor, by op and port (filled in schedule order): id into the
    # parallel lists below.
    owner: list[list[int]] = [[]] * len(ops)  # (each op's own list once it has run)
    root: list[tuple[int, int]] = []
    kind: list[str] = []  # "transient", "persistent", "feed", "pruned"
    readers: list[list[int]] = []  # needed readers of the tensors of each transient buffer
    members: list[list[tuple[int, int]]] = []  # tensors that are views of each buffer
    persistent = sum(b for b in sizes.variable_bytes.values() if b > 0)
    feeds = 0

    # The schedule positions of the two latest readers over every view of each transient
    # buffer (-1: none), so that "has every other reader run?" costs O(1) however long a
    # chain of views grows. Only transient buffers are ever forwarded: the others' stay
    # unknown, as do their readers, which nothing asks for.
    latest: list[int] = []
    second: list[int] = []

    # TensorFlow prunes the ops that lead to no variable write and not to the loss
    # (the shape of a dead gradient branch, a gradient nobody applies): they never run,
    # so they neither allocate nor keep a buffer alive.
    needed = ordering.needed

    def note_readers(b: int, tensor: tuple[int, int]) -> None:
        cs = consumers.get(tensor)
        if cs is None:
            return
        first, then = latest[b], second[b]
        mine = readers[b]
        for c in cs:
            if needed[c]:
                mine.append(c)
                at = pos[c]
                if at > first:
                    first, then = at, first
                elif at != first and at > then:
                    then = at
        latest[b], second[b] = first, then

    def new_buffer(tensor: tuple[int, int], k: str) -> int:
        b = len(root)
        root.append(tensor)
        kind.append(k)
        readers.append([])
        members.append([tensor])
        latest.append(-1)
        second.append(-1)
        return b

    # Tensors that are no transient buffer's (state, feeds, the outputs of pruned ops) are
    # never forwarded nor reported: one entry of each kind stands for all of them.
    held_by = {k: new_buffer((-1, 0), k) for k in ("persistent", "feed", "pruned")}
    pruned, fed, state = held_by["pruned"], held_by["feed"], held_by["persistent"]

    data_in = adj.data_in
    shapes = sizes.shapes

    def forwardable(i: int, port: int) -> int | None:
        """Buffer of an input that op ``i`` may overwrite in place, or None.

        TensorFlow forwards an input when its buffer has no other reference left: the
        input is transient, has the output's shape and dtype, is read once by op ``i``,
        and every other reader of any view of its buffer has already run.
        """
        op = ops[i]
        op_type = op.type
        if op_type in FORWARDING_OPS:  # most: output 0 into any input
            if port:
                return None
            candidates = None
        else:
            out_port, candidates = forward_into.get(op_type, (0, None))
            if op_type in _WHILE_OPS and op.outputs[port].dtype != "variant":
                # A loop variable the loop dies with: each iteration's kernels overwrite it
                # in place or free it for the next value, so the result needs no second
                # buffer.
                out_port, candidates = port, (port,)
            if port != out_port or candidates is None:
                return None
        out_shape = shapes[i][port]
        if out_shape is None or -1 in out_shape:
            return None
        out_dtype = op.outputs[port].dtype
        if out_dtype == "variant" and op_type in FORWARDING_OPS:
            return None  # a list's zeros are a new list
        ins = data_in[i]
        n = len(ins)
        me = pos[i]
        for k in candidates if candidates is not None else range(n):
            if k >= n:
                continue
            p, pt = ins[k]
            b = owner[p][pt]
            if kind[b] != "transient":
                continue
            if shapes[p][pt] != out_shape or ops[p].outputs[pt].dtype != out_dtype:
                continue
            if n == 2:  # (most: binary kernels)
                (p0, t0), (p1, t1) = ins
                if owner[p0][t0] == owner[p1][t1]:  # read twice by op i
                    continue
            elif n > 2 and [owner[q][qt] for q, qt in ins].count(b) > 1:
                continue
            other = latest[b] if latest[b] != me else second[b]  # the latest but i
            if other < me:
                return b
        return None

    # What the loop below does with an op depends on its type: found once per type.
    roles: dict[str, tuple[int, bool, bool]] = {}  # (_OTHER... _CONST, may view, may forward)
    for i in ordering.schedule:
        op = ops[i]
        op_type = op.type
        role = roles.get(op_type)
        if role is None:
            role = roles[op_type] = (
                _FEED if op_type in FEED_OPS else _VARIABLE if op_type in VARIABLE_OPS
                else _CONST if op_type == "Const" else _OTHER,
                op_type in _VIEW_TYPES, op_type in forward_types,
            )
        what, may_view, may_forward = role
        if not needed[i] and (what == _OTHER or what == _CONST):
            owner[i] = [pruned] * len(op.outputs)
            continue
        if what == _FEED:  # (no feed, variable or constant is a view)
            owner[i] = [fed] * len(op.outputs)
            for port, spec in enumerate(op.outputs):
                if spec.dtype == "resource":
                    owner[i][port] = state
                else:
                    feeds += max(nbytes[i][port], 0)
            continue
        if what != _OTHER:  # variables and constants
            owner[i] = [state] * len(op.outputs)
            if what == _CONST:
                for b in nbytes[i]:
                    if b > 0:
                        persistent += b
            continue
        own = owner[i] = [0] * len(op.outputs)
        for port in range(len(own)):
            t = (i, port)
            src = _view_of(graph, sizes, i, port) if may_view else None
            if src is None and may_forward:
                b = forwardable(i, port)
                if b is None:
                    own[port] = b = new_buffer(t, "transient")
                    note_readers(b, t)
                    continue
            elif src is None:
                own[port] = b = new_buffer(t, "transient")
                note_readers(b, t)
                continue
            else:
                b = owner[src[0]][src[1]]
            # a view or an in-place result: the buffer gains a tensor and its readers
            own[port] = b
            members[b].append(t)
            if kind[b] == "transient":
                note_readers(b, t)
    out: list[Buffer] = []
    new_record = object.__new__
    for b, (p, port) in enumerate(root):
        if kind[b] != "transient":
            continue
        rs = readers[b]
        # Appended view by view: each reader once, in schedule order.
        if len(rs) > 1:
            rs = sorted(set(rs), key=pos.__getitem__)
            end = max(map(level.__getitem__, rs))
        else:
            end = level[rs[0]] if rs else level[p]
        op = ops[p]
        views = members[b]
        # Buffer(...) with its fields set directly: a frozen dataclass's __init__ sets each
        # through object.__setattr__, three times slower for the thousands of buffers.
        buf = new_record(Buffer)
        buf.__dict__.update(
            tensor=f"{op.name}:{port}",
            bytes=max(nbytes[p][port], 0),
            start=level[p],
            end=end,
            producer=p,
            readers=tuple(rs),
            # (the default reads the attributes only: no copy to protect the op's)
            host=host_op(op.device, op.attrs if host_op is is_host_op else dict(op.attrs)),
            scratch=False,
            first=pos[p],
            last=pos[rs[-1]] if rs else pos[p],
            views=tuple([f"{ops[q].name}:{k}" for q, k in views[1:]]) if len(views) > 1 else (),
        )
        out.append(buf)
    return out, persistent, feeds


_REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "All", "Any"})
#: List reads whose output ``k`` is an element the list holds (no new buffer).
_LIST_READS = {"TensorListGetItem": 0, "TensorListPopBack": 1}
_WHILE_OPS = frozenset({"While", "StatelessWhile"})


#: Op types :func:`_view_of` may find a view in (it answers None for all others).
_VIEW_TYPES = ALIAS_OPS | _LIST_READS.keys() | _WHILE_OPS | _REDUCTIONS | {
    "Transpose", "StridedSlice", "Slice", "Split", "SplitV", "OptionalFromValue",
    "OptionalGetValue", "Unpack", "BroadcastTo", "Tile"} | BRANCH_ATTRS.keys()
#: Alignment a split's parts must keep to share its input's buffer: TensorFlow's
#: ``EIGEN_MAX_ALIGN_BYTES``, 64 on AVX-512 builds (a coarser build shares more, never
#: less, so the prediction holds on any machine).
_SPLIT_ALIGN = 64


def _view_of(graph: Graph, sizes: Sizes, i: int, port: int) -> tuple[int, int] | None:
    """The input tensor whose buffer output ``port`` of op ``i`` shares, if any.

    Besides the view ops, a reduction over no axis (gradients of broadcasts reduce over
    the axes that were broadcast, often none) and a transpose that keeps the memory
    order hand their input through.
    """
    op = graph.ops[i]
    ins = graph.adjacency.data_in[i]
    if not ins or op.attrs.get("_lms_role"):  # swap ops are copies, never views
        return None
    if op.type == "ReadVariableOp" and ins[0] in graph.copy_on_read:
        return None  # a variable that sparse kernels update is copied by each read
    if op.type in ALIAS_OPS:
        return ins[port] if op.type == "IdentityN" and port < len(ins) else ins[0]
    if op.type in ("OptionalFromValue", "OptionalGetValue") and port < len(ins):
        return ins[port]  # an optional holds its tensor: the same buffer
    if op.type in _LIST_READS and port == _LIST_READS[op.type]:
        return ins[0]  # an element of the list: the list's memory, not a new buffer
    if op.type in _WHILE_OPS and port < len(ins):
        body = loop_body(graph, i, tuple(sizes.shapes[p][q] for p, q in ins))
        kind = body.kinds[port] if body is not None and port < len(body.kinds) else ""
        if kind == "pass":
            return ins[port]
        if kind == "refs":  # pushes elements of another list: holds that list's memory
            return ins[body.sources[port]]
        if kind == "filled" and op.outputs[port].dtype == "variant":
            src = ins[port]
            if sizes.nbytes[src[0]][src[1]] > 0:  # elements set in place in a full list
                return src
        return None
    if op.type in BRANCH_ATTRS:
        if op.outputs[port].dtype != "variant":
            return None
        r = optional_aliases(graph, i, tuple(sizes.shapes[p][q] for p, q in ins[1:]),
                             sizes.values.get(ins[0])).get(port)
        return None if r is None else (i, r)  # an optional holding the conditional's result
    if op.type in ("Split", "SplitV"):
        return _split_part_of(sizes, ins, op.type == "Split", len(op.outputs))
    if op.type == "Tile":
        # every multiple 1: the kernel hands its input through (``TileOp``; keras.ops.repeat
        # by 1 and UpSampling3D((2, 2, 1)) measured 1.500 and 1.066 counted as a copy)
        multiples = sizes.values.get(ins[1]) if len(ins) > 1 else None
        return ins[0] if multiples is not None and all(m == 1 for m in multiples) else None
    if op.type == "BroadcastTo":
        # to its own shape, the kernel hands its input through (``BroadcastToOp``): a
        # same-shape broadcast (keras.ops.take_along_axis) measured 1.189 counted a copy
        src = sizes.shapes[ins[0][0]][ins[0][1]]
        return ins[0] if src is not None and -1 not in src and src == sizes.shapes[i][port] \
            else None
    if op.type in _REDUCTIONS or op.type in ("Transpose", "StridedSlice", "Slice"):
        src = sizes.shapes[ins[0][0]][ins[0][1]]
        out = sizes.shapes[i][port]
        if src is None or out is None or -1 in src or -1 in out:
            return None
        if op.type == "StridedSlice" and len(ins) > 3:
            strides = sizes.values.get(ins[3])
            if strides is None or any(k != 1 for k in strides):
                # only a slice with unit strides shares its input (``x[:, ::-1]`` keeps
                # every element, reversed, in a new buffer: 4 MiB counted as a view)
                return None
        if op.type == "Transpose":
            perm = sizes.values.get(ins[1]) if len(ins) > 1 else None
            if perm is None or len(perm) != len(src):
                return None
            moving = [k for k in perm if src[k] != 1]  # size-1 axes move for free
            return ins[0] if moving == sorted(moving) else None
        # a reduction over no axis, or a slice that keeps everything
        if math.prod(src) == math.prod(out):
            return ins[0]
        if op.type in ("StridedSlice", "Slice") and _dim0_slice(graph, sizes, i, src, out):
            return ins[0]
        return None
    if op.type == "Unpack" and op.attrs.get("axis", 0) == 0:
        # rows of an aligned tensor unstacked along its first axis share its buffer
        # (``UnpackOp``: "Aligned, so we can share the underlying buffer")
        src = sizes.shapes[ins[0][0]][ins[0][1]]
        if src and -1 not in src and len(src) >= 2 and _aligned_rows(sizes, ins[0], src,
                                                                      graph):
            return ins[0]
    return None


def _aligned_rows(sizes: Sizes, tensor: tuple[int, int], shape: tuple[int, ...],
                  graph: Graph | None = None) -> bool:
    """Whether each row (first-axis index) of a tensor starts at an aligned address.

    With ``graph``, a tensor counted 0 bytes here (a loop body's argument, which the loop
    holds) is sized from its shape and dtype: a body's slice of a whole batch,
    ``x[i * m:(i + 1) * m]``, is a view of it.
    """
    nbytes = sizes.nbytes[tensor[0]][tensor[1]]
    if nbytes <= 0 and graph is not None:
        size = dtype_bytes(graph.ops[tensor[0]].outputs[tensor[1]].dtype)
        nbytes = math.prod(shape) * size if size else 0
    return shape[0] > 0 and nbytes > 0 and (nbytes // shape[0]) % _SPLIT_ALIGN == 0


def _dim0_slice(graph: Graph, sizes: Sizes, i: int, src: tuple[int, ...],
                out: tuple[int, ...]) -> bool:
    """Whether slice ``i`` takes whole rows of its input's first axis, aligned.

    TensorFlow's slice kernels then hand out that part of the input's buffer, no copy
    (``IsDim0SliceAligned`` in ``slice_op.cc`` and ``strided_slice_op.cc``): a
    ``TimeDistributed`` layer's frames of its transposed input are views of it, which
    lives as long as any of them (a frame-wise CNN + LSTM measured 0.917 of its simulated
    peak with Eigen, whose ``MaxPoolGrad`` writes into such a frame).
    """
    op = graph.ops[i]
    if len(src) < 2 or not _aligned_rows(sizes, graph.adjacency.data_in[i][0], src, graph):
        return False
    if op.type == "StridedSlice":
        strides = sizes.values.get(graph.adjacency.data_in[i][3]) if len(
            graph.adjacency.data_in[i]) > 3 else None
        masks = [op.attrs.get(m, 0) for m in ("ellipsis_mask", "new_axis_mask",
                                              "shrink_axis_mask")]
        if (strides is None or any(s != 1 for s in strides) or masks[0] or masks[1]
                or masks[2] not in (0, 1) or not all(isinstance(m, int) for m in masks)):
            return False
        if masks[2] == 1:  # x[t]: one row, its first axis dropped
            return out == src[1:]
    return len(out) == len(src) and out[1:] == src[1:]


def _split_part_of(
    sizes: Sizes, ins: list[tuple[int, int]], split: bool, n_parts: int
) -> tuple[int, int] | None:
    """The input a ``Split``/``SplitV`` output is a slice of, if it shares its buffer.

    TensorFlow's split kernels hand out slices of the input, no copy, when they split the
    first axis into parts that keep the alignment (``SplitHasAlignedOutputsInFirstDimension``
    in ``split_op.cc``): for a vector, each part's start and size; otherwise the bytes of
    one row. A single part is the input itself.
    """
    if len(ins) < (2 if split else 3):  # (a malformed node: no view to find)
        return None
    value, axis = (ins[1], ins[0]) if split else (ins[0], ins[2])
    if n_parts == 1:
        return value
    shape = sizes.shapes[value[0]][value[1]]
    dim = sizes.values.get(axis) if axis is not None else None
    nbytes = sizes.nbytes[value[0]][value[1]]
    if shape is None or -1 in shape or not shape or dim is None or len(dim) != 1 or nbytes <= 0:
        return None
    if dim[0] % len(shape) != 0:
        return None
    if shape[0] == 0:
        return None
    if len(shape) > 1:
        return value if _aligned_rows(sizes, value, shape) else None
    row = nbytes // shape[0]
    parts = [shape[0] // n_parts] * n_parts if split else sizes.values.get(ins[1])
    if parts is None:
        return None
    start = 0
    for part in parts:
        if (start * row) % _SPLIT_ALIGN or (part * row) % _SPLIT_ALIGN:
            return None
        start += part
    return value


@functools.lru_cache(maxsize=1024)
def _is_update(op_type: str) -> bool:
    """Kernels that write a resource variable (assignments and optimizer applies)."""
    return op_type in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp") or (
        op_type.startswith(("ResourceApply", "ResourceSparseApply", "ResourceScatter"))
    )


def _update_copies(graph: Graph, ordering: Ordering, sizes: Sizes) -> list[Buffer]:
    """Second buffers of variables written while an earlier read of them is still in use.

    ``ReadVariableOp`` hands out the variable's own buffer. A kernel that then writes the
    variable while such a read is still referenced cannot write in place: it copies the
    variable into a new buffer (copy-on-write in ``resource_variable_ops.cc``), or, for
    ``AssignVariableOp``, keeps the assigned value as the variable's storage. Either way
    one more variable-sized buffer is resident from the update until the last reader of
    the old value has run (then the old buffer goes). Graphs hit this when an update has
    no data dependency on the forward pass (decoupled weight decay, ``assign`` of a
    constant): automatic control dependencies order it after the forward *read* only.
    """
    ops = graph.ops
    adj = graph.adjacency
    needed = ordering.needed
    pos = ordering.position
    data_in = adj.data_in
    # Most ops are neither reads nor updates: only the types that are (graph.by_type).
    watched = {t for t in graph.by_type if _is_update(t)} | {"ReadVariableOp"}
    reads: dict[tuple[int, int], list[int]] = {}
    updates: dict[tuple[int, int], list[int]] = {}
    for i in graph.of_types(watched):
        t = ops[i].type
        if data_in[i] and needed[i] and (
                data_in[i][0] not in graph.copy_on_read):  # (reads copy it: nothing shared)
            (reads if t == "ReadVariableOp" else updates).setdefault(data_in[i][0], []).append(i)
    # The schedule position of the last reader over all views of each read of a variable
    # that some update writes: views are followed from the read down its readers.
    last: dict[int, int] = {}
    consumers = adj.consumers
    for var in updates:
        for r in reads.get(var, ()):
            end = pos[r]
            stack = [(r, 0)]
            while stack:
                tensor = stack.pop()
                for c in set(consumers.get(tensor, ())):  # once per reader: views form a tree
                    if not needed[c]:
                        continue
                    end = max(end, pos[c])
                    if ops[c].type in _VIEW_TYPES:
                        stack.extend((c, k) for k in range(len(ops[c].outputs))
                                     if _view_of(graph, sizes, c, k) == tensor)
            last[r] = end
    out = []
    for var, ups in updates.items():
        size = sizes.variable_bytes.get(ops[var[0]].name, -1)
        if size <= 0:
            continue
        ups.sort(key=lambda u: pos[u])
        previous = -1
        for u in ups:
            # Reads since the previous update share the buffer this update writes.
            held = [last.get(r, pos[r]) for r in reads.get(var, ()) if previous < pos[r] < pos[u]]
            until = max(held, default=-1)
            first = pos[u] + 1 if _takes_over(graph, ordering, u) else pos[u]
            if until >= first and until > pos[u]:
                lvl = ordering.levels
                out.append(Buffer(
                    f"{ops[u].name}/copy", size, lvl[ordering.schedule[first]],
                    lvl[ordering.schedule[until]], u, (), first=first, last=until,
                ))
            previous = pos[u]
    return out


def _takes_over(graph: Graph, ordering: Ordering, u: int) -> bool:
    """Whether update ``u`` keeps the value it assigns as the variable's new buffer.

    ``AssignVariableOp`` takes the value's buffer over when nothing else holds it: no
    second buffer is allocated, the value's own lives on (:func:`_update_copies` counts
    it from the op after). An L-BFGS step shifting its history variables with
    ``S.assign(tf.concat([S[1:], d[None]], 0))`` simulated at 1.20 of measured with a
    copy beside the value.
    """
    op = graph.ops[u]
    if op.type != "AssignVariableOp" or len(graph.adjacency.data_in[u]) < 2:
        return False
    p, port = graph.adjacency.data_in[u][1]
    if graph.ops[p].type in _VIEW_TYPES or graph.ops[p].type in FEED_OPS or (
            graph.ops[p].type == "ReadVariableOp"):
        return False
    pos, needed = ordering.position, ordering.needed
    return pos[u] + 1 < len(ordering.schedule) and all(
        pos[c] <= pos[u] for c in graph.adjacency.consumers.get((p, port), ()) if needed[c])


#: Matrix products whose CPU kernels compute half precision through float32 copies.
_MATMULS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"})


def _float32_matmul_bytes(
    a: tuple[int, ...] | None, b: tuple[int, ...] | None, out: tuple[int, ...] | None
) -> int:
    """Temporaries of a half-precision matrix product on the CPU.

    TensorFlow's CPU ``MatMul``/``BatchMatMul`` kernels have no half-precision
    contraction: they cast both operands to float32 (a broadcast operand is cast once,
    not per batch), multiply into a float32 product, then cast it to the half output.
    All three float32 buffers are alive together while the product runs. Checked against
    TensorFlow 2.21's records on every half product of the zoo (oneDNN off and on: half
    keeps the Eigen kernels).

    Parameters
    ----------
    a, b, out : tuple of int or None
        Shapes of the two operands and of the product.

    Returns
    -------
    int
        Bytes (0 when a shape is unknown).

    Examples
    --------
    >>> _float32_matmul_bytes((128, 32), (32, 128), (128, 128))
    98304
    """
    if a is None or b is None or out is None or -1 in (*a, *b, *out):
        return 0
    return 4 * (math.prod(a) + math.prod(b) + math.prod(out))


def _loop_effects(
    graph: Graph, ordering: Ordering, sizes: Sizes, buffers: list[Buffer], workspace: str,
    depth: int = 0,
) -> tuple[list[Buffer], dict[int, int]]:
    """What ``While`` ops hold while they run, beyond their inputs and outputs.

    A loop runs its body once per iteration. Three things differ from an opaque op that
    holds its inputs and allocates its outputs:

    - each iteration's temporaries (the body's own transient peak, simulated on the body
      with its loop variables already counted outside): a weight gradient's partial
      product per step, the gates of a recurrent cell. Returned as a workspace buffer.
    - the executor runs a lowered loop's iterations as soon as their inputs are ready, up
      to ``parallel_iterations`` of them at once: the part of the body that does not wait
      for the loop variables that arrive last (a gradient loop's pops of its forward
      accumulators and what it computes from them alone, a forward loop's input
      projections) runs ahead, from the moment its own inputs exist. The executor
      dispatches one op at a time per thread, so the early part gets as many iterations
      ahead as the ops dispatched meanwhile allow (:func:`_ahead_iterations`). What it
      computes for the waiting part is held until that part runs (:func:`_run_ahead`).
      Returned as buffers from then to the loop's position.
    - the lists a gradient loop pops (its forward loop's accumulators, when the loop is
      their last reader) and the run-ahead results drain while the lists it fills grow,
      so they are never all full together (:func:`_drain_credit`). Returned as a credit
      at the loop's schedule position.

    The early part may also run its whole window ahead while the loop runs, and, where
    the kernels run on the executor's threads (the CPU kernels' emulation), the partials
    an accumulator sums may wait for it, a window of iterations of them (a QRNN's slice
    gradients: 17.76 MB measured on the emulated accelerator beside 12.71 MB simulated):
    how much more that holds at the loop's position is returned as the race per schedule
    position (:attr:`Simulation.race_bytes`).

    Returns
    -------
    tuple
        The body workspace and run-ahead buffers, the credit and the race per schedule
        position.
    """
    pos = ordering.position
    levels = ordering.levels
    owner: dict[str, Buffer] = {}
    extra: list[Buffer] = []
    credit: dict[int, int] = {}
    race: dict[int, int] = {}
    adj = graph.adjacency
    loops = [i for i in graph.calls if graph.ops[i].type in _WHILE_OPS]
    if loops:  # the buffer of each tensor, for the loops' inputs and outputs
        for b in buffers:
            for t in (b.tensor, *b.views):
                owner[t] = b
    for i in loops:
        op = graph.ops[i]
        if not ordering.needed[i]:
            continue
        ins = adj.data_in[i]
        body = loop_body(graph, i, tuple(sizes.shapes[p][q] for p, q in ins))
        if body is None:
            continue
        p = pos[i]
        lvl = levels[i]
        extra += _kept_by_duplicates(graph, ordering, i, body, owner)
        consumed: dict[str, int] = {}
        popped: dict[int, str] = {}  # loop variable -> the list buffer it pops
        filled = 0
        for k, kind in enumerate(body.kinds):
            if kind == "consumed" and k < len(ins):
                src = graph.ops[ins[k][0]]
                b = owner.get(f"{src.name}:{ins[k][1]}")
                if b is not None and b.last == p:
                    consumed[b.tensor] = b.bytes
                    popped[k] = b.tensor
            elif kind == "filled" and k < len(op.outputs):
                b = owner.get(f"{op.name}:{k}")
                if b is not None and b.producer == i and b.first == p:
                    filled += b.bytes
        arrivals = tuple(pos[s] for s, _ in ins[: len(body.kinds)])
        cost = _body_cost(body, sizes.batch_size, workspace, depth, arrivals,
                          loop_seeds(graph, i, body, sizes.values.get))
        # A lowered loop's Enter nodes all wait for its control inputs (TensorFlow's
        # lowering gives them one NoOp of those): no part of it runs ahead of them (a
        # pinned plan chains the loop right after the op before it)
        gate = max((pos[c] for c in adj.control_in[i]), default=-1)
        if gate > cost.ahead_from:
            cost = dataclasses.replace(cost, ahead_from=gate, waits=tuple(
                (max(a, gate), u, w) for a, u, w in cost.waits))
        trips = trip_count(graph, i, body, sizes.values.get)
        limit = min(int(op.attrs.get("parallel_iterations", 10) or 1), trips) if trips else 1
        window = _ahead_iterations(graph, ordering, sizes, cost, limit, max(arrivals, default=0))
        ahead = cost.ahead_bytes * (window - 1)
        # the lists whose elements the early part frees as it pops them, `window` ahead:
        # not those another popped list still holds (a view of it, or the duplicate of a
        # forward loop's state) until the late part reads it
        kept = {popped[k] for k in popped if k not in cost.released}
        for k, kind in enumerate(body.kinds):
            if kind == "consumed" and k not in cost.released and k < len(ins):
                kept |= _partners(graph, ins[k], sizes, owner)
        lists = {popped[k] for k in cost.released if k in popped} - kept
        released = sum(consumed[t] for t in lists) if trips else 0
        if released and cost.ahead_from < p:
            for q in range(cost.ahead_from + 1, p):
                credit[q] = credit.get(q, 0) + released * window // trips
        if cost.ahead_bytes > 0 and cost.ahead_from < p:
            first = cost.ahead_from + 1
            start = levels[ordering.schedule[first]]
            if ahead > 0:
                extra.append(Buffer(
                    f"{op.name}/ahead", ahead, start, lvl, i, (i,), first=first, last=p,
                    ahead=True,
                ))
            if first < p:  # the current iteration's share, until the loop itself runs
                extra.append(Buffer(
                    f"{op.name}/ahead-current", cost.ahead_bytes, start, levels[
                        ordering.schedule[p - 1]], i, (), first=first, last=p - 1, ahead=True,
                ))
        for since, until, per_iteration in cost.waits:
            until = min(until, p)
            if since + 1 >= until:
                continue
            w = _ahead_iterations(graph, ordering, sizes,
                                  dataclasses.replace(cost, ahead_from=since), limit, until)
            first = since + 1
            extra.append(Buffer(
                f"{op.name}/ahead-wait-{since}", per_iteration * w,
                levels[ordering.schedule[first]], levels[ordering.schedule[until]], i, (),
                first=first, last=until, ahead=True,
            ))
        drained = sum(consumed.values())
        c = _drain_credit(drained, filled, cost.ahead_bytes, window, trips or 1, released)
        if c > 0:
            credit[p] = credit.get(p, 0) + c
        if window < limit:  # the whole window ahead, draining as the loop runs
            full = _drain_credit(drained, filled, cost.ahead_bytes, limit, trips, released)
            more = (limit - window) * cost.ahead_bytes - (full - c)
            if more > 0:
                race[p] = race.get(p, 0) + more
        if cost.partials and limit > 1 and workspace in RELEASE_RACE_LIBRARIES:
            # an accumulator's partials, the window at once, where kernels run on the
            # executor's threads (a GPU's only enqueue them: each accumulator takes its
            # partial in as soon as both are enqueued; not measured on a GPU)
            race[p] = race.get(p, 0) + (limit - 1) * cost.partials
        if cost.overlap and limit > 1 and workspace in RELEASE_RACE_LIBRARIES:
            # the next iterations' early parts beside this one's, the window of them, on
            # the executor's threads (one was counted, and a run held 1.08 of that)
            race[p] = race.get(p, 0) + (limit - 1) * cost.overlap
        if cost.peak > 0:
            extra.append(Buffer(
                f"{op.name}/body", cost.peak, lvl, lvl, i, (), scratch=True, first=p, last=p
            ))
    return extra, credit, race


def _branch_effects(
    graph: Graph, ordering: Ordering, sizes: Sizes, buffers: list[Buffer], workspace: str,
    depth: int = 0,
) -> tuple[list[Buffer], dict[int, int]]:
    """What a conditional holds while its branch runs, beside its inputs and outputs.

    An ``If`` is one op of the schedule, but its branch runs a function. Simulated as a
    step of its own, the branch holds, at its peak: the inputs the conditional reads last
    (it may write into them and frees them as it goes: the gradient of a ``tf.cond``
    overwrites the incoming gradient), what it computes, and its results until it returns.
    The schedule counts instead every input and every output at once. The difference is
    a workspace of the op where the branch holds more (a loss-scale optimizer's update
    computes each slot's new value beside the gradients: an MLP under ``mixed_float16``
    with ``LossScaleOptimizer(SGD(momentum=0.9))`` simulated at 0.833 of measured without
    it), a credit at its position where it holds less. Inputs read after the conditional
    stay the caller's; the largest peak over the branches counts.

    Returns
    -------
    tuple
        The workspace buffers and the credit per schedule position.
    """
    extra: list[Buffer] = []
    credit: dict[int, int] = {}
    branching = [i for i in graph.calls
                 if graph.ops[i].type in BRANCH_ATTRS and ordering.needed[i]]
    if not branching or depth >= _MAX_LOOP_DEPTH:
        return extra, credit
    owner = {t: b for b in buffers for t in (b.tensor, *b.views)}
    adj = graph.adjacency
    for i in branching:
        op = graph.ops[i]
        p, lvl = ordering.position[i], ordering.levels[i]
        ins = adj.data_in[i][1:]
        shapes = tuple(sizes.shapes[q][k] for q, k in ins)
        of = [owner.get(f"{graph.ops[q].name}:{k}") for q, k in ins]
        # an input the conditional reads last, once, goes in with its bytes; one read
        # after it is fed (the caller holds it); a resource handle stays an argument of
        # 0 bytes (read through a feed it would be a copy)
        mine = {a: b.bytes for a, b in enumerate(of)
                if b is not None and b.last == p and of.count(b) == 1}
        held = frozenset(a for a, b in enumerate(of) if b is not None and a not in mine)
        peak = 0
        for fname in branch_functions(op, sizes.values.get(adj.data_in[i][0])):
            body = function_body(graph, fname, shapes)
            if body is not None:
                peak = max(peak, _branch_peak(body, held, mine, sizes.batch_size,
                                              workspace, depth))
        if not peak:
            continue
        more = peak - sum(mine.values()) - sum(max(b, 0) for b in sizes.nbytes[i])
        if more > 0:
            extra.append(Buffer(
                f"{op.name}/branch", more, lvl, lvl, i, (), scratch=True, first=p, last=p
            ))
        elif more < 0:
            credit[p] = credit.get(p, 0) - more
    return extra, credit


def _branch_peak(body: LoopBody, held: frozenset[int], given: Mapping[int, int],
                 batch_size: int, workspace: str, depth: int) -> int:
    """Transient peak of a branch function, its results held until it returns.

    ``held`` arguments are fed (0 bytes), ``given`` ones are buffers of those bytes.
    """
    sim = _simulate_function(_returning(body), held, batch_size, workspace, depth, given)
    return 0 if sim is None else max(sim.transient_peak_bytes, 0)


@functools.lru_cache(maxsize=64)
def _returning(body: LoopBody) -> Graph:
    """The ops of a branch that run, and a reader of every result, last: it returns them.

    One graph per branch, so that its simulations are found again (:func:`_function_simulation`).
    """
    g = _running(body).graph
    rets = tuple(r for r in body.returns if r and r.rpartition(":")[0] in g.index)
    if rets:
        g = g.replace((*g.ops, Op(f"{g.source}/return", _RETURN, inputs=rets)), g.source)
    return g


#: The op type of the reader :func:`_branch_peak` gives a branch's results.
_RETURN = "_LmsReturn"


def _simulate_function(g: Graph, held: frozenset[int], batch_size: int, workspace: str,
                       depth: int, given: Mapping[int, int] | None = None,
                       seeds: tuple[tuple[str, tuple[int, ...]], ...] = ()
                       ) -> Simulation | None:
    """Simulation of a function body whose arguments (``_LoopArg`` ops) are counted outside.

    Shapes as if the arguments were feeds (their batch dimension is the batch); simulated
    as transient buffers of 0 bytes (or of the bytes ``given`` for them), so that kernels
    may write into them (a loop variable nobody else holds), except those in ``held``:
    fed, as buffers the caller still holds. ``seeds``: the arguments' known integer
    values (:func:`lmscore.shapes.loop_seeds`). None when the body cannot be resolved or
    simulated.
    """
    return _function_simulation(g, held, batch_size, workspace, depth,
                                tuple(sorted((given or {}).items())), seeds)


@functools.lru_cache(maxsize=256)
def _function_simulation(g: Graph, held: frozenset[int], batch_size: int, workspace: str,
                         depth: int, given_items: tuple[tuple[int, int], ...],
                         seeds: tuple[tuple[str, tuple[int, ...]], ...] = ()
                         ) -> Simulation | None:
    """:func:`_simulate_function`, once per body, held arguments, batch and workspace.

    A step's loop bodies and branches are the same in each simulation of its plans (a
    plan rewrites the step, not its functions): half the time of simulating a recurrent
    step went to simulating its bodies again.
    """
    run = g.replace([as_feed(op) if k in held else op for k, op in enumerate(g.ops)],
                    g.source) if held else g
    given = dict(given_items)
    try:
        sizes = resolve_function(g, batch_size, seeds)
        nbytes = list(sizes.nbytes)
        for k, op in enumerate(g.ops):
            if op.type == "_LoopArg":
                nbytes[k] = (given.get(k, 0), *(0 for _ in nbytes[k][1:]))
        sizes = dataclasses.replace(sizes, nbytes=tuple(nbytes))
        return _simulate(run, batch_size, sizes, is_host_op, workspace, depth + 1)
    except (GraphError, ValueError, KeyError):
        return None


def _kept_by_duplicates(graph: Graph, ordering: Ordering, i: int, body: LoopBody,
                        owner: Mapping[str, Buffer]) -> list[Buffer]:
    """What a loop's ``"duplicate"`` lists hold once the lists they share with are gone.

    A forward loop pushes a state's new value into one list and, the next iteration, its
    previous value into an accumulator: both hold the same buffers, counted once, in the
    first (:func:`lmscore.shapes.duplicated`). Where that list dies first (a recurrent
    layer's output sequence, stacked right after the loop) the accumulator keeps its
    elements until its own last reader, the gradient loop: a buffer of the shared bytes
    from then on (a bidirectional GRU under a CTC loss measured 0.933 of the simulation
    without it).
    """
    op = graph.ops[i]
    schedule, levels = ordering.schedule, ordering.levels
    out = []
    for k, partners in duplicated(body).items():
        d = owner.get(f"{op.name}:{k}")
        shared = [b for m in partners
                  if (b := owner.get(f"{op.name}:{m}")) is not None and b.producer == i]
        if d is None or d.producer != i or not shared:
            continue
        until = max(b.last for b in shared)
        held = max(b.bytes for b in shared)
        if d.last > until and held > 0:
            out.append(Buffer(f"{op.name}/kept-{k}", held, levels[schedule[until + 1]], d.end,
                              i, d.readers, first=until + 1, last=d.last))
    return out


def _partners(
    graph: Graph, src: tuple[int, int], sizes: Sizes, owner: Mapping[str, Buffer]
) -> set[str]:
    """The list buffers holding the elements of the list output ``src`` of a loop.

    For a forward loop's ``"duplicate"`` accumulator, the lists it duplicates (all of the
    loop's lists when they are not found); none for other tensors.
    """
    i, port = src
    op = graph.ops[i]
    if op.type not in _WHILE_OPS:
        return set()
    ins = graph.adjacency.data_in[i]
    body = loop_body(graph, i, tuple(sizes.shapes[p][q] for p, q in ins))
    if body is None or port >= len(body.kinds) or body.kinds[port] != "duplicate":
        return set()
    ports = duplicated(body).get(port) or range(len(op.outputs))
    return {b.tensor for k in ports if (b := owner.get(f"{op.name}:{k}")) is not None}


def _ahead_iterations(
    graph: Graph, ordering: Ordering, sizes: Sizes, cost: _BodyCost, window: int,
    late_from: int,
) -> int:
    """Iterations of a loop whose early part has run when its late part starts.

    The early part can start once its last input exists (schedule position
    ``cost.ahead_from``), the late part once the loop's last input does (``late_from``).
    In between, the executor runs the ops that lead from the one to the other (a loop
    among them runs its body's ops once per iteration); ops off that path run alongside
    and gain the early part nothing. The executor dispatches one op at a time per thread,
    so the early part, ``cost.early_ops`` ops per iteration, gets one op in for each of
    them. At most ``window`` (``parallel_iterations``, or the trip count if smaller)
    iterations run at once.
    """
    if window <= 1 or cost.early_ops <= 0 or late_from <= cost.ahead_from:
        return 1
    adj = graph.adjacency
    schedule = ordering.schedule
    pos = ordering.position
    gap = schedule[cost.ahead_from: late_from + 1]
    start = gap[0]  # the producer of the early part's last input
    after = {start}
    for q in gap[1:]:
        if any(p in after for p in adj.preds[q]):
            after.add(q)
    before = {schedule[late_from]}
    for q in reversed(gap[:-1]):
        if any(c in before for c in adj.succs[q]):
            before.add(q)
    dispatched = 0
    for q in sorted((after & before) - {start}, key=pos.__getitem__):
        if not ordering.needed[q]:
            continue
        dispatched += 1
        if graph.ops[q].type in _WHILE_OPS:
            ins = adj.data_in[q]
            body = loop_body(graph, q, tuple(sizes.shapes[p][k] for p, k in ins))
            if body is not None:
                dispatched += len(body.graph.ops) * max(
                    trip_count(graph, q, body, sizes.values.get), 1)
        if dispatched >= window * cost.early_ops:
            return window
    return min(window, 1 + dispatched // cost.early_ops)


def _drain_credit(
    consumed: int, filled: int, ahead: int, window: int, trips: int, released: int = 0
) -> int:
    """Bytes a loop never holds at once of what it consumes, fills and runs ahead.

    Over ``trips`` iterations the popped lists drain and the filled lists grow at an even
    pace, and ``min(window - 1, trips - 1 - t)`` iterations' run-ahead results (``ahead``
    bytes each) wait while iteration ``t`` runs. ``released`` bytes of the popped lists
    are freed by the early part as it pops them, ``window`` iterations ahead of the rest.
    The loop's position counts all of ``consumed + filled + (window - 1) * ahead``; what
    it really holds at once is the largest sum over the iterations, reached at the start,
    at the end, or where the run-ahead window starts to shrink.

    Examples
    --------
    >>> _drain_credit(100, 40, 0, 1, 20)   # no run-ahead: max(consumed, filled) is held
    40
    >>> _drain_credit(0, 200, 10, 11, 20)  # 100 bytes ahead drain as 200 fill
    100
    >>> _drain_credit(100, 0, 0, 20, 20, released=40)  # 40 popped all ahead: 60 held
    40
    """
    total = consumed + filled + (window - 1) * ahead
    held = 0
    for t in {0, max(trips - window, 0), trips}:
        share = ahead * max(0, min(window - 1, trips - 1 - t))
        popped = (consumed - released) * (trips - t) + released * max(trips - t - window, 0)
        held = max(held, share + (filled * t + popped) // trips)
    return total - held


#: Loops nested deeper than this inside loop bodies are taken as opaque ops.
_MAX_LOOP_DEPTH = 4


@dataclass(frozen=True)
class _BodyCost:
    """What one iteration of a loop body costs (see :func:`_body_cost`)."""

    peak: int = 0
    ahead_bytes: int = 0
    ahead_from: int = 0
    early_ops: int = 0
    released: tuple[int, ...] = ()
    waits: tuple[tuple[int, int, int], ...] = ()
    partials: int = 0
    overlap: int = 0


def _body_cost(
    body: LoopBody, batch_size: int, workspace: str, depth: int, arrivals: tuple[int, ...],
    seeds: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...] = (),
) -> _BodyCost:
    """Transient peak of one iteration of a loop body, and what it computes ahead.

    The peak excludes the loop variables: they are inputs of 0 bytes (the ``While`` op's
    buffers hold them) that the body's kernels may still overwrite in place, as
    TensorFlow forwards a loop variable nobody else holds (a gradient accumulator's
    ``AddN`` writes into it). ``arrivals`` are the schedule positions at which the loop's
    inputs are produced, for :func:`_run_ahead`. ``seeds``: the loop variables' known
    values at the iterations to size (:func:`lmscore.shapes.loop_seeds`); the one with
    the largest peak is taken.
    """
    if depth >= _MAX_LOOP_DEPTH:
        return _BodyCost()
    body = _running(body)
    sims = [_simulate_function(body.graph, frozenset(), batch_size, workspace, depth,
                               seeds=one) for one in seeds or ((),)]
    sim = max((x for x in sims if x is not None), default=None,
              key=lambda x: x.transient_peak_bytes)
    if sim is None:
        return _BodyCost()
    # the body's own buffers: kernel workspaces and a nested loop's results are not read
    # across the early/late boundary
    ahead, since, early, released, waits, partials, overlap = _run_ahead(
        body, list(sim.buffers), arrivals)
    return _BodyCost(max(sim.transient_peak_bytes, 0), ahead, since, early, released, waits,
                     partials, overlap)


def _run_ahead(
    body: LoopBody, buffers: list[Buffer], arrivals: tuple[int, ...]
) -> tuple[int, int, int, tuple[int, ...], tuple[tuple[int, int, int], ...], int]:
    """Bytes per iteration the early part of a body computes for its waiting part.

    The loop variables produced last (largest ``arrivals``) are *late*, and so is every
    loop variable whose next value is computed from a late one. The body's ops that read
    no late variable, directly or not, are *early*: the executor runs them for the next
    ``parallel_iterations`` iterations before the late part of the first one can start.
    Their buffers that a late op reads wait for it, and so does an early loop variable's
    next value when late ops read that variable. A list the body pops whose elements
    only early ops read (or none: their readers are pruned) loses an element to each
    iteration run ahead: the kernel slices a gradient loop pops for the gradient of a fed
    input, the zeros of a list-write gradient.

    Within the early part, an op runs once the loop variables it reads exist: a buffer
    whose readers are all early but wait for a variable that arrives after the buffer's
    own (a list-write gradient's zeros, made from a popped element, set into the input
    gradient's list, which arrives later) is held meanwhile, iteration after iteration.

    The late part has a race of its own. What an accumulator adds to itself each
    iteration (a weight gradient's product for one step of a recurrent layer, the slice
    gradient of a sequence the loop reads whole) does not wait for the accumulator: when
    the variables it is computed from run ahead (a cheap carried gradient), the partials
    of several iterations are computed before the accumulator takes them in, one at a
    time. Those partials are returned too, in bytes per iteration (but for those the
    early part computes for a late accumulator, counted above).

    Returns
    -------
    tuple
        Those bytes per iteration, the latest arrival among the loop variables the early
        part reads (when it can start), the number of early ops, the loop variables
        (popped lists) whose elements the early part releases, the waits within the
        early part: (arrival it starts at, arrival it waits for, bytes per iteration),
        the partials' bytes per iteration, and the peak of the early part's own buffers
        (the next iterations', running beside this one: a micro-batch's activations when
        only the accumulation of its gradients waits).
    """
    g = body.graph
    n = len(arrivals)
    if n == 0:
        return 0, 0, 0, (), (), 0, 0
    deps = [0] * len(g.ops)  # bit k: reads loop variable k
    for j in order(g).topo:
        if g.ops[j].type == "_LoopArg":
            deps[j] = 1 << j if j < n else 0
        for q in g.adjacency.preds[j]:
            deps[j] |= deps[q]
    last = max(arrivals)
    late = sum(1 << k for k, t in enumerate(arrivals) if t == last)
    grown = True
    while grown:  # a variable computed from a late one is late from the next iteration on
        grown = False
        for k, ref in enumerate(body.returns[:n]):
            j = g.index.get(ref.rpartition(":")[0]) if ref else None
            if j is not None and not late >> k & 1 and deps[j] & late:
                late |= 1 << k
                grown = True
    early = [deps[j] & late == 0 and op.type != "_LoopArg" for j, op in enumerate(g.ops)]

    def ready(j: int) -> int:  # the arrival of the last loop variable op j reads
        return max((t for k, t in enumerate(arrivals) if deps[j] >> k & 1), default=0)

    total, reads = 0, 0
    released = []
    waits: dict[tuple[int, int], int] = {}
    # An early loop variable that late ops read: its next value, computed early, waits for
    # the late part of the next iteration (a gradient loop's zeros for the next step's
    # output gradient, made from a popped element)
    read_late = {b.producer for b in buffers
                 if b.producer < n and any(not early[r] for r in b.readers)}
    carried = set()
    for k, ref in enumerate(body.returns[:n]):
        if ref and k in read_late and not late >> k & 1:
            carried.add(ref)
    for b in buffers:
        if b.host or b.scratch:
            continue
        j = b.producer
        if carried and b.bytes > 0 and early[j] and not carried.isdisjoint((b.tensor, *b.views)):
            total += b.bytes
            reads |= deps[j]
            continue
        if j < n and g.ops[j].type == "_LoopArg" and body.kinds[j] == "consumed" and not (
                late >> j & 1):
            # a popped list (0 bytes here: the While's input holds it), its elements views
            if b.readers and all(early[r] for r in b.readers):
                released.append(j)
                for r in b.readers:
                    reads |= deps[r]
            continue
        if b.bytes <= 0 or not early[j]:
            continue
        if any(not early[r] for r in b.readers):
            total += b.bytes
            reads |= deps[j]
        elif b.readers:
            start, until = ready(j), max(ready(r) for r in b.readers)
            if until > start:
                waits[start, until] = waits.get((start, until), 0) + b.bytes
    since = max((t for k, t in enumerate(arrivals) if reads >> k & 1), default=0)
    nexts = {}  # loop variable -> the op computing its next value (through identities)
    for k, ref in enumerate(body.returns[:n]):
        j = g.index.get(ref.rpartition(":")[0]) if ref else None
        while j is not None and g.ops[j].type == "Identity" and g.adjacency.data_in[j]:
            j = g.adjacency.data_in[j][0][0]
        if j is not None:
            nexts[k] = j
    # An accumulator's partial must not wait for the accumulator in any iteration: not
    # read a variable whose next value the accumulator's reaches (a forward LSTM's
    # ``i * g``, added to the cell state, reads ``h``, computed from that state)
    accumulators = {}  # the op computing a carried variable's next value from it -> mask
    for k, j in nexts.items():
        if body.kinds[k] != "carried" or not deps[j] >> k & 1:
            continue
        reached, grown = 1 << k, True
        while grown:
            grown = False
            for v, jv in nexts.items():
                if not reached >> v & 1 and deps[jv] & reached:
                    reached |= 1 << v
                    grown = True
        accumulators[j] = reached
    # (an early partial that a late accumulator reads is run-ahead already, in `total`)
    partials = sum(
        b.bytes for b in buffers
        if b.bytes > 0 and not b.host and not b.scratch and b.producer >= n
        and any(r in accumulators and not deps[b.producer] & accumulators[r]
                and not (early[b.producer] and not early[r]) for r in b.readers))
    # The early parts of the next iterations run beside this one's: the peak of their own
    # buffers (made and read by early ops: a micro-batch's activations when only the
    # accumulation is late), per iteration (the caller counts the window of them)
    events: dict[int, int] = {}
    for b in buffers:
        if (b.bytes > 0 and not b.host and not b.scratch and b.producer >= n
                and early[b.producer] and b.readers and all(early[r] for r in b.readers)):
            events[b.first] = events.get(b.first, 0) + b.bytes
            events[b.last + 1] = events.get(b.last + 1, 0) - b.bytes
    overlap = max(accumulate(events[k] for k in sorted(events)), default=0)
    return (total, since, sum(early), tuple(released),
            tuple((a, u, w) for (a, u), w in sorted(waits.items())), partials, max(overlap, 0))


@functools.lru_cache(maxsize=64)
def _running(body: LoopBody) -> LoopBody:
    """``body`` without the ops an iteration does not run.

    TensorFlow runs the body's ops that lead to a loop variable's next value and its
    stateful ops, and prunes the rest, as it does for a step: in a gradient loop, the
    gradient of an input nobody differentiates (a fed sequence) and of a dropout mask.
    Pruned, they neither allocate nor keep a popped element waiting. The loop variables
    stay, in their places.
    """
    g = body.graph
    signatures = op_signatures()

    def runs(op: Op) -> bool:
        sig = signatures.get(op.type)
        return op.type == "_LoopArg" or sig is None or bool(sig["stateful"])

    seeds = [j for j, op in enumerate(g.ops) if runs(op)]
    seeds += [j for ref in body.returns if ref
              and (j := g.index.get(ref.rpartition(":")[0])) is not None]
    keep = waited_for(g, seeds)
    if all(keep):
        return body
    ops = [op for op, k in zip(g.ops, keep, strict=True) if k]
    return dataclasses.replace(body, graph=g.replace(ops))


#: Cross-entropy kernels that allocate a temporary of one value per row of the logits
#: (``allocate_temp`` in ``sparse_xent_op.cc`` and ``xent_op.cc``, on every device).
_XENT_OPS = frozenset({"SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits"})


def _scratch(name: str, nbytes: int, i: int, ordering: Ordering, what: str = "scratch") -> Buffer:
    """A kernel's temporary: ``nbytes`` held by op ``i`` while it runs, and only then."""
    lvl = ordering.levels[i]
    at = ordering.position[i]
    return Buffer(f"{name}/{what}", nbytes, lvl, lvl, i, (), scratch=True, first=at, last=at)


def _xent_bytes(graph: Graph, sizes: Sizes, i: int) -> int:
    """The cross-entropy kernels' row temporary: one value of the logits' dtype per row.

    The loss of every row is reduced there. A segmentation step has a row per pixel: a
    DeepLab-like step simulated at 0.994 of its measured peak, short by exactly that
    temporary at the loss.
    """
    p, port = graph.adjacency.data_in[i][0]
    logits = sizes.shapes[p][port]
    width = dtype_bytes(graph.ops[i].outputs[0].dtype) or 0
    if not logits or None in logits or -1 in logits:
        return 0
    return math.prod(logits[:-1]) * width


class EinsumProduct(NamedTuple):
    """How TensorFlow's two-operand ``Einsum`` kernel computes its equation.

    Attributes
    ----------
    batch, m, k, n : int
        The batched matrix product it runs: ``batch`` products of ``[m, k] x [k, n]``.
    a_transposed, b_transposed : bool
        Whether the product reads an operand in the transposed layout (``[k, m]``,
        ``[n, k]``: ``BatchMatMul``'s ``adj_x``, ``adj_y``).
    held : int
        Elements of the operand copies and of the transposed result held beside the output.
    """

    batch: int
    m: int
    k: int
    n: int
    a_transposed: bool
    b_transposed: bool
    held: int


def einsum_product(equation: str,
                   shapes: Sequence[tuple[int, ...] | None]) -> EinsumProduct | None:
    """The batched product behind a two-operand ``Einsum``, or ``None`` if not modelled.

    The kernel (CPU and GPU alike) contracts ``[batch, free, contract]`` operands in one
    batched matrix product. An operand whose labels are in that order, or in
    ``[batch, contract, free]`` (a transposed product), is used as it is; any other is
    transposed into a copy first, and an operand with labels of its own that the output
    drops is reduced into one. The product's result is ``[batch, free of the first, free
    of the second]``; where the output orders its labels otherwise, it is transposed into
    the output, and both are held. Labels of a kind are ordered as they first appear.
    An ellipsis of the same dimensions in both operands and the output is batch labels;
    other ellipses, repeated labels and one-operand equations are not modelled.

    Examples
    --------
    >>> einsum_product("btv,btd->vd", [(8, 50, 96), (8, 50, 64)])
    EinsumProduct(batch=1, m=96, k=400, n=64, a_transposed=True, b_transposed=False, held=0)
    >>> einsum_product("btd,vd->btv", [(8, 50, 64), (96, 64)])
    EinsumProduct(batch=1, m=400, k=64, n=96, a_transposed=False, b_transposed=True, held=0)
    """
    lhs, arrow, out = equation.replace(" ", "").partition("->")
    ins = lhs.split(",")
    if not arrow or len(ins) != 2 or len(shapes) != 2:
        return None
    if "..." in equation:
        # an ellipsis the output keeps, of the same dimensions in both operands, is
        # batch labels of its own (``...qd,...qk->...kd``: a transposed result, measured)
        if not all("..." in x for x in (*ins, out)) or any(s is None for s in shapes):
            return None
        n = [len(sh) - len(x) + 3 for x, sh in zip(ins, shapes, strict=True)]
        spans = [sh[x.index("..."):x.index("...") + k]
                 for x, sh, k in zip(ins, shapes, n, strict=True)]
        free_letters = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in equation]
        if n[0] != n[1] or n[0] < 0 or spans[0] != spans[1] or n[0] > len(free_letters):
            return None
        dots = "".join(free_letters[:n[0]])
        ins = [x.replace("...", dots) for x in ins]
        out = out.replace("...", dots)
        equation = f"{ins[0]},{ins[1]}->{out}"
    if "." in equation:
        return None
    if any(s is None or len(s) != len(labels) or -1 in s
           for s, labels in zip(shapes, ins, strict=True)):
        return None
    if any(len(set(x)) != len(x) for x in (*ins, out)):
        return None
    first = {c: k for k, c in enumerate(dict.fromkeys(ins[0] + ins[1] + out))}
    size = {c: d for labels, s in zip(ins, shapes, strict=True)
            for c, d in zip(labels, s, strict=True)}
    batch, free, contract, reduce_ = 1, 2, 3, 4

    def kind(c: str) -> int:
        both = c in ins[0] and c in ins[1]
        return (batch if c in out else contract) if both else (free if c in out else reduce_)

    held = 0
    frees: list[list[str]] = []
    swaps: list[bool] = []
    for labels in ins:
        kinds = [kind(c) for c in labels]
        in_order = sorted(labels, key=lambda c: (kind(c), first[c])) == list(labels)
        swapped = {free: contract, contract: free}
        transposed = sorted(labels, key=lambda c: (swapped.get(kind(c), kind(c)), first[c])) == (
            list(labels))
        if reduce_ in kinds:
            held += math.prod(size[c] for c in labels if kind(c) != reduce_)
        elif not (in_order or transposed):
            held += math.prod(size[c] for c in labels)
        # TensorFlow's ``ShouldSwapFreeAndContract``: an operand already in the
        # ``[batch, contract, free]`` order is read so; any other is permuted (or used) as
        # ``[batch, free, contract]``, which the second operand reads transposed
        swaps.append(transposed)
        frees.append(sorted((c for c in labels if kind(c) == free), key=first.__getitem__))
    result = sorted((c for c in first if kind(c) == batch), key=first.__getitem__)
    result += frees[0] + frees[1]
    if result != list(out):
        held += math.prod(size[c] for c in out)
    dims = {k: math.prod(size[c] for c in first if kind(c) == k and c in ins[0] + ins[1])
            for k in (batch, contract)}
    return EinsumProduct(
        dims[batch], math.prod(size[c] for c in frees[0]), dims[contract],
        math.prod(size[c] for c in frees[1]), swaps[0], not swaps[1], held,
    )


def einsum_scratch_bytes(equation: str, shapes: Sequence[tuple[int, ...] | None],
                         width: int) -> int:
    """Bytes TensorFlow's two-operand ``Einsum`` kernel holds beside its output.

    The operand copies and transposed result of :func:`einsum_product`. Exact on the
    allocation records of eight equations (the forward and gradient einsums of
    projections, attention heads, attention scores and a mixture of experts' per-token
    weights) under Eigen; oneDNN's product takes scratch of its own besides
    (:func:`onednn_matmul_scratch_bytes`). Equations not modelled: 0.

    Examples
    --------
    >>> einsum_scratch_bytes("btv,btd->dv", [(8, 50, 96), (8, 50, 64)], 4)  # transposed result
    24576
    >>> einsum_scratch_bytes("bqhd,bkhd->bhqk", [(8, 20, 4, 16)] * 2, 4)  # two operand copies
    81920
    >>> einsum_scratch_bytes("btd,dv->btv", [(8, 50, 64), (64, 96)], 4)
    0
    >>> einsum_scratch_bytes("...qd,...qk->...kd", [(8, 20, 16), (8, 20, 30)], 4)
    15360
    """
    product = einsum_product(equation, shapes)
    return product.held * width if product else 0


def onednn_matmul_scratch_bytes(batch: int, m: int, k: int, n: int, a_transposed: bool,
                                b_transposed: bool, threads: int) -> int:
    """Scratch of oneDNN's float32 batched matrix product on the CPU (``[m, k] x [k, n]``).

    TensorFlow's oneDNN ``BatchMatMul`` and ``Einsum`` kernels (not ``MatMul``) hand the
    product to oneDNN's blocked GEMM, which copies an operand read in the transposed
    layout into blocks through TensorFlow's allocator:

    - a transposed ``a`` (``[k, m]``): a block of its rows per thread, of ``k`` columns
      rounded up to 16 (528 from ``k = 512`` on). The threads take a product each when
      the batch divides among them (blocks of at most 256 rows); else they share each
      product: all its rows each when ``m < 64`` and ``n > 64`` (a share of the columns),
      blocks of 16 rows while ``m`` is under 16 per thread, else as many equal blocks of
      at most 256 rows as a multiple of the threads (rounded up to 16 rows when there
      are several products). A single product with ``k >= 2048`` is split along ``k`` instead: 1,184
      columns of up to 256 rows, 128 floats per further row and 128 bytes;
    - a transposed ``b`` (``[n, k]``): 128 rows by ``k`` columns rounded up to 16, 512
      columns from ``k = 512`` on and 1,024 from ``k = 1,024`` on, whatever ``n`` and
      the batch;
    - 1,408 bytes besides, and 128 more per transposed operand.

    Fitted to TensorFlow 2.21's allocation records on 2 threads: of 187 products measured
    (``m`` 4 to 2,000, ``k`` 8 to 8,192, ``n`` 4 to 1,000, batch 1 to 32, 80 of them drawn
    at random), 176 exact to the byte and none under; the others 1.006 to 1.84 of the
    records, odd batches and single products with ``k >= 2048`` all. A tied embedding's
    weight gradient (``btv,btd->vd``) held 542,208 bytes beside its 65,536-byte output:
    the step simulated at 0.664 of measured without them.

    Examples
    --------
    >>> onednn_matmul_scratch_bytes(1, 256, 512, 64, True, False, 2)
    542208
    >>> onednn_matmul_scratch_bytes(1, 256, 64, 256, False, True, 2)
    34304
    """
    held = 1408
    if a_transposed:
        held += 128
        blocks = -(-m // 256)
        if batch == 1 and k >= 2048 and threads > 1:
            held += 128 + min(m, 256) * 1184 * 4 + max(m - 256, 0) * 512
        else:
            if batch % threads == 0:  # a product per thread
                rows = -(-m // blocks)
            elif m < 64 and n > 64:  # each thread all rows, a share of the columns
                rows = m
            elif m < 16 * threads:  # blocks of 16 rows
                rows = min(m, 16)
            else:  # as many blocks as a multiple of the threads
                rows = -(-m // (-(-blocks // threads) * threads))
                if batch > 1:
                    rows = -(-rows // 16) * 16
            held += threads * rows * (-(-k // 16) * 16 if k < 512 else 528) * 4
    if b_transposed:
        held += 128 + 128 * (-(-k // 16) * 16 if k < 512 else 512 if k < 1500 else 1024) * 4
    return held


def _einsum_bytes(graph: Graph, sizes: Sizes, i: int) -> int:
    """The ``Einsum`` kernel's operand copies and transposed result.

    See :func:`einsum_scratch_bytes`: the weight gradient of a mixture of experts'
    per-token expert weights (``nd,nf->nfd``) held two 134 MB tensors where one was
    counted (0.686 of measured).
    """
    op = graph.ops[i]
    equation = op.attrs.get("equation")
    if not isinstance(equation, str):
        return 0
    shapes = [sizes.shapes[p][port] for p, port in graph.adjacency.data_in[i]]
    return einsum_scratch_bytes(equation, shapes, dtype_bytes(op.outputs[0].dtype) or 4)


def _mirror_pad_grad_bytes(graph: Graph, sizes: Sizes, i: int) -> int:
    """``MirrorPadGrad``'s temporary of its padded input's shape.

    The kernel folds the padded gradient into a scratch tensor of the input's shape
    before writing the output (none when nothing is padded: the input is handed
    through). A REFLECT-padded generator's step measured 0.925 without it.
    """
    p, port = graph.adjacency.data_in[i][0]
    if sizes.shapes[p][port] == sizes.shapes[i][0]:
        return 0
    return max(sizes.nbytes[p][port], 0)


#: Kernels whose CPU and GPU implementations alike hold a temporary while they run (no
#: workspace a device may do without), and its bytes.
_KERNEL_TEMPORARIES: dict[str, Callable[[Graph, Sizes, int], int]] = {
    **dict.fromkeys(_XENT_OPS, _xent_bytes),
    "Einsum": _einsum_bytes,
    "MirrorPadGrad": _mirror_pad_grad_bytes,
}


def _kernel_temporaries(graph: Graph, ordering: Ordering, sizes: Sizes) -> list[Buffer]:
    """The temporaries of :data:`_KERNEL_TEMPORARIES`, each alive during its op."""
    out = []
    needed = ordering.needed
    adj = graph.adjacency
    for i in graph.of_types(tuple(_KERNEL_TEMPORARIES)):
        op = graph.ops[i]
        if needed[i] and adj.data_in[i] and op.outputs:
            b = _KERNEL_TEMPORARIES[op.type](graph, sizes, i)
            if b:
                out.append(_scratch(op.name, b, i, ordering))
    return out


#: The kernels that run a float32 product through oneDNN's batched GEMM when oneDNN is
#: on (``MatMul`` takes another path, with no scratch: measured).
_ONEDNN_PRODUCTS = frozenset({"BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"})


def _onednn_product(
    op: Op, shapes: Sequence[tuple[int, ...] | None], out: tuple[int, ...] | None
) -> tuple[int, int, int, int, bool, bool] | None:
    """``(batch, m, k, n, a transposed, b transposed)`` of a batched product, if known."""
    if op.type == "Einsum":
        equation = op.attrs.get("equation")
        p = einsum_product(equation, shapes) if isinstance(equation, str) else None
        return None if p is None else (p.batch, p.m, p.k, p.n, p.a_transposed, p.b_transposed)
    if len(shapes) < 2 or out is None or -1 in out or len(out) < 2:
        return None
    a, b = shapes[0], shapes[1]
    if a is None or b is None or len(a) < 2 or len(b) < 2 or -1 in a or -1 in b:
        return None
    ta, tb = bool(op.attrs.get("adj_x")), bool(op.attrs.get("adj_y"))
    return math.prod(out[:-2]), out[-2], a[-2] if ta else a[-1], out[-1], ta, tb


def _cpu_scratch(graph: Graph, ordering: Ordering, sizes: Sizes, library: str) -> list[Buffer]:
    """Workspace buffers of the CPU kernels of ``library``, alive during their op."""
    out = []
    adj = graph.adjacency
    pos = ordering.position
    threads = _cpu_threads()
    needed = ordering.needed
    for i, op in enumerate(graph.ops):
        if not op.outputs or not adj.data_in[i] or not needed[i]:
            continue
        shape_of = [sizes.shapes[p][port] for p, port in adj.data_in[i]]
        dtype = op.outputs[0].dtype
        b = 0
        if op.type in _CONV_SCRATCH and len(shape_of) >= 3:
            if library == "onednn" and dtype in _ONEDNN_DTYPES:
                continue  # oneDNN's convolution gradients take no im2col buffer
            if "Filter" in op.type:
                filt, inp = sizes.shapes[i][0], shape_of[0]
            else:
                filt, inp = shape_of[1], sizes.shapes[i][0]
            b = cpu_scratch_bytes(
                op.type, filt, shape_of[2], inp, dtype_bytes(dtype) or 4, threads
            )
        elif op.type == "MaxPool" and library == "onednn" and dtype in _ONEDNN_DTYPES:
            # oneDNN's max pooling also outputs a workspace (one byte per pooled value)
            # that its MaxPoolGrad reads: it lives from the forward op to that gradient.
            grads = [c for c in adj.consumers.get((i, 0), ()) if graph.ops[c].type == "MaxPoolGrad"
                     and needed[c]]
            pooled = sizes.shapes[i][0]
            if grads and pooled is not None and -1 not in pooled:
                end = max(grads, key=lambda c: pos[c])
                out.append(Buffer(
                    f"{op.name}/workspace", math.prod(pooled), ordering.levels[i],
                    ordering.levels[end], i, (end,), first=pos[i], last=pos[end],
                ))
            continue
        elif library == "onednn" and dtype == "float" and op.type in _ONEDNN_PRODUCTS:
            product = _onednn_product(op, shape_of, sizes.shapes[i][0])
            if product is not None:
                # beside an ``Einsum``'s own copies (``{name}/scratch``)
                out.append(_scratch(op.name, onednn_matmul_scratch_bytes(*product, threads), i,
                                    ordering, "gemm"))
            continue
        elif op.type in ("ScaleAndTranslate", "ScaleAndTranslateGrad") and len(shape_of) >= 2:
            # The CPU kernel resizes one direction at a time through a float32 temporary:
            # [batch, output rows, input columns] forward, [batch, input rows, output
            # columns] in the gradient (an antialiased resize's gradient measured 0.830
            # of the records without it)
            made, read = sizes.shapes[i][0], shape_of[0]  # rows of the one, columns of the other
            if made is not None and read is not None and len(made) == len(read) == 4 and (
                    -1 not in made and -1 not in read):
                b = made[0] * made[1] * read[2] * made[3] * 4
        elif op.type in _MATMULS and dtype == "half" and len(shape_of) >= 2:
            # Neither library multiplies half matrices natively on the CPU: the kernel
            # converts both operands to float32, multiplies into a float32 product and
            # converts that back (three float32 temporaries beside the half output).
            b = _float32_matmul_bytes(shape_of[0], shape_of[1], sizes.shapes[i][0])
        elif op.type == "MaxPoolGrad" and library == "eigen" and len(shape_of) >= 2:
            # Eigen's kernel recomputes the argmax of every pooled value into an int64
            # tensor shaped like the pooling output (``MaxPoolingGradOp``).
            pooled = shape_of[1]
            if pooled is not None and -1 not in pooled:
                b = math.prod(pooled) * 8
        if b:
            out.append(_scratch(op.name, b, i, ordering))
    return out


#: Kernels that may write output ``k`` into one of the given inputs (default: output 0
#: into any input).
_FORWARD_INTO = {
    "SparseSoftmaxCrossEntropyWithLogits": (1, (0,)),
    "SoftmaxCrossEntropyWithLogits": (1, (0,)),
    # ``forward_input_or_allocate_output({"t", "e"}, ...)``: a dropout mask's gradient
    # writes into the incoming gradient.
    "Select": (0, (1, 2)),
    "SelectV2": (0, (1, 2)),
}


#: Eigen's CPU kernels that may also write output ``k`` into one of the given inputs:
#: ``MaxPoolingGradOp`` writes the gradient into the pooling's input once nothing else
#: holds it (its last reader, or the last frame of a transposed sequence it is a view
#: of: a frame-wise CNN + LSTM measured 0.917 of the simulation without it).
_EIGEN_FORWARD_INTO = {"MaxPoolGrad": (0, (0,))}

#: Op types whose outputs :func:`_buffers` may write into an input (none of the others).
_FORWARD_TYPES = FORWARDING_OPS | _FORWARD_INTO.keys() | _WHILE_OPS


def workspace_reason(b: Buffer) -> str:
    """What a buffer that is no tensor of the graph holds (a kernel's or a loop's).

    >>> workspace_reason(Buffer("while/body", 8, 0, 0, 0, (), scratch=True))
    "an iteration's temporaries of a loop body"
    """
    if b.scratch and b.tensor.endswith("/body"):
        return "an iteration's temporaries of a loop body"
    if b.scratch and b.tensor.endswith("/branch"):
        return "what a conditional's branch allocates"
    if b.scratch or b.tensor.endswith("/workspace"):
        return "kernel workspace"
    if b.tensor.rpartition("/")[2].startswith("kept-"):
        return "states a loop's accumulator keeps for its gradient (no tensor of the graph)"
    return "results a loop computed ahead (no tensor of the graph)"


def live_at(sim: Simulation, level: int) -> tuple[Buffer, ...]:
    """Device buffers alive when ``level`` reaches its peak, largest first."""
    if not 0 <= level < len(sim.level_peak_position):
        return ()
    p = sim.level_peak_position[level]
    live = [
        b for b in sim.buffers
        if not b.host and (b.first == p if b.scratch else b.first <= p <= b.last)
    ]
    return tuple(sorted(live, key=lambda b: -b.bytes))


def hotspots(
    graph: Graph, sim: Simulation, level: int | None = None, *, limit: int | None = None,
    sizes: Sizes | None = None,
) -> tuple[LiveTensor, ...]:
    """The tensors alive at ``level`` (default: the peak), largest first.

    Parameters
    ----------
    graph : Graph
    sim : Simulation
    level : int, optional
    limit : int, optional
        Keep only the largest ``limit`` tensors.
    sizes : Sizes, optional
        The graph's sizes at the simulation's batch size (resolved when not given).

    Returns
    -------
    tuple of LiveTensor
        Each row says whether a hand toggle would swap the tensor: the tensor (or a view of
        it) passes :func:`lmscore.swappable.swap_refusal` and has a reader more than one level
        after it, as ``lmscore.plan.add_swap`` requires.
    """
    ordering = order(graph)
    if sizes is None:
        sizes = resolve(graph, sim.batch_size)
    lvl = sim.peak_level if level is None else level
    return tuple(live_tensor(graph, b, sizes=sizes, ordering=ordering)
                 for b in live_at(sim, lvl)[:limit])


def live_tensor(graph: Graph, b: Buffer, *, sizes: Sizes, ordering: Ordering | None = None
                ) -> LiveTensor:
    """One buffer of a simulation of ``graph`` as a hotspot row (see :func:`hotspots`).

    Parameters
    ----------
    graph : Graph
    b : Buffer
        A device buffer of the simulation.
    sizes : Sizes
        The graph's sizes at the simulation's batch size.
    ordering : Ordering, optional
        ``order(graph)``, if the caller has it.
    """
    from .swappable import running_readers, swap_refusal

    ordering = ordering or order(graph)
    lv = ordering.levels
    best, reach = b.tensor, -1
    own = b.tensor.rpartition(":")[0] in graph.index
    for t in (b.tensor, *b.views) if own and not b.scratch else ():
        name, _, port = t.rpartition(":")
        i = graph.index[name]
        far = max((lv[c] - lv[i] for c in running_readers(ordering, i, int(port))), default=-1)
        if far > reach:
            best, reach = t, far
    if b.scratch or not own:
        reason = workspace_reason(b)
    else:
        name, _, port = best.rpartition(":")
        reason = swap_refusal(graph, ordering, sizes, graph.index[name], int(port))
    if not reason and reach <= 1:  # every reader of every view is adjacent to it
        reason = "no gap between producer and last reader"
    return LiveTensor(
        tensor=b.tensor,
        bytes=b.bytes,
        producer_level=b.start,
        last_use_level=b.end,
        distance=b.distance,
        category=ordering.categories[b.producer],
        swappable=not reason,
        reason=reason,
        swap_tensor=best if own and not b.scratch else "",
    )
