"""Export: rewritten graphs as GraphDefs, runnable training steps and SavedModels.

This is the only module that writes TensorFlow protos. :func:`to_graphdef` starts from the
GraphDef a graph was imported from (:attr:`lmscore.ir.Graph.graphdef`), so every attribute,
the function library and the versions survive, and emits one ``NodeDef`` per op of the IR,
in IR order, with its inputs rebuilt from the IR (a rewrite rewires consumers to swap-ins
and adds control inputs). Swap ops (``_lms_role``) become real nodes:

``mode="gpu"``
    ``Identity`` nodes, swap-outs placed on the host (``/CPU:0``), swap-ins on the
    accelerator (``/GPU:0``). TensorFlow inserts the device-to-host and host-to-device
    copies at the device boundaries, as TFLMS does.
``mode="emulate"``
    For the emulated accelerator of :func:`lmscore.measure.measure` (``devices=2``: CPU:0
    is the accelerator, CPU:1 the host). Two CPU devices share their buffers, so an
    ``Identity`` on CPU:1 would allocate nothing there; swap ops are ``DeepCopy`` nodes
    instead (swap-outs on ``/device:CPU:1``, swap-ins on ``/device:CPU:0``), which
    allocate a real copy. Every other node runs on CPU:0.

A recomputing clone is its original's ``NodeDef`` under its own name, with its inputs
from the IR and ``_lms_clone_of``/``_lms_tensor`` markers.

Every swap node carries ``_output_shapes``, the ``_lms_role``/``_lms_tensor`` (and
``_lms_group``) markers as attributes, and ``_grappler_do_not_remove = true``: Grappler puts
nodes with that attribute in the set of nodes to preserve, which every optimizer honours.
Without it, Grappler's default dependency optimizer removes swap ``Identity`` nodes that sit
on the same device as their input (or are unplaced) and wires their consumers to the
original tensor (7 of the 10 swap nodes of the MLP sample with both devices ``/CPU:0``, all
10 unplaced); ``Identity`` nodes that cross a device boundary are kept either way.

:func:`swap` rewrites a ``tf.function`` training step and returns a callable that runs the
rewritten graph on the function's own variables; :func:`save_rewritten_saved_model` writes
that step as a SavedModel. Those two import TensorFlow; :func:`to_graphdef` and
:func:`write_graphdef` only need the protos that ship with TensorBoard.
"""

from __future__ import annotations

import inspect
import logging
import os
import pathlib
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from google.protobuf import message, text_format
from tensorboard.compat.proto import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2

from .errors import ConfigError, GraphError, LmsError, PlanError, RunError
from .ir import Graph, Op, TensorSpec, lint, split_tensor
from .order import SCHEDULED_AFTER, order
from .plan import Plan, fingerprint, plan_from_params, write_atomic
from .rewrite import SWAP_IN, SWAP_OUT, Rewrite, rewrite
from .tune import TuneResult
from .units import format_bytes, parse_bytes

__all__ = [
    "EXPORT_MODES",
    "NoFitError",
    "SwappedStep",
    "exported_type",
    "save_rewritten_saved_model",
    "swap",
    "to_graphdef",
    "write_graphdef",
]

#: Export modes: real accelerator placement, or the two-CPU emulation of ``measure``.
EXPORT_MODES = ("gpu", "emulate")
#: Device strings of the emulated accelerator and host (``measure(..., devices=2)``).
EMULATED_DEVICE, EMULATED_HOST = "/device:CPU:0", "/device:CPU:1"
#: Attribute that makes Grappler keep a node (``GrapplerItem::NodesToPreserve``).
KEEP_ATTR = "_grappler_do_not_remove"
_SWAP_TYPES = {"gpu": "Identity", "emulate": "DeepCopy"}
_LMS_ATTRS = ("_lms_role", "_lms_tensor", "_lms_group")
_DEVICE_RE = re.compile(
    r"^(/job:[^/]+)?(/replica:\d+)?(/task:\d+)?(/(device:)?[A-Za-z_]+:(\d+|\*))?$"
)
_TEXT_SUFFIXES = (".pbtxt", ".txt", ".prototxt")


def exported_type(op: Op, mode: str = "gpu") -> str:
    """The node type ``op`` gets in an exported GraphDef.

    >>> exported_type(Op("lms/swapout_a_0", "Identity", attrs={"_lms_role": "swap_out"}),
    ...               "emulate")
    'DeepCopy'
    """
    return _SWAP_TYPES[mode] if op.attrs.get("_lms_role") else op.type


# --- GraphDef ------------------------------------------------------------------------------


def to_graphdef(
    graph: Graph,
    *,
    mode: str = "gpu",
    device: str = "/GPU:0",
    host: str = "/CPU:0",
    follow_producer: bool = False,
) -> bytes:
    """Serialize ``graph`` (typically a rewritten one) as a binary GraphDef.

    Parameters
    ----------
    graph : Graph
        A graph imported with :mod:`lmscore.load` (it keeps its source GraphDef), possibly
        rewritten by :func:`lmscore.rewrite.rewrite`.
    mode : {"gpu", "emulate"}
        ``"gpu"``: swap ops are ``Identity`` nodes, swap-outs on ``host`` and swap-ins on
        ``device``; other nodes keep their device. ``"emulate"``: swap ops are
        ``DeepCopy`` nodes, swap-outs on ``/device:CPU:1`` and swap-ins on
        ``/device:CPU:0``; other nodes are left unplaced or pinned to ``/device:CPU:0``
        (``device`` and ``host`` are ignored).
    device, host : str
        Device strings of the accelerator and the host (mode ``"gpu"``).
    follow_producer : bool
        Mode ``"gpu"``: put each swap-in on the device of the op that made its tensor
        (``device`` when that op is unplaced), as TFLMS v2's ``gpu_device`` does per
        replica: the swap-ins of a data-parallel step's replica ``k`` go back to replica
        ``k``'s device.

    Returns
    -------
    bytes
        Deterministic serialization of the GraphDef; its versions and function library
        are those of the source GraphDef.

    Raises
    ------
    ConfigError
        If ``mode`` or a device string is invalid.
    GraphError
        If the graph has no source GraphDef, or an op is neither in it nor a swap op.
    """
    return _graphdef(graph, mode, device, host, follow_producer).SerializeToString(
        deterministic=True)


def _graphdef(
    graph: Graph, mode: str, device: str, host: str, follow_producer: bool = False
) -> Any:
    if mode not in EXPORT_MODES:
        raise ConfigError(f"mode: must be one of {', '.join(EXPORT_MODES)}, got {mode!r}")
    for label, value in (("device", device), ("host", host)):
        if not isinstance(value, str) or not _DEVICE_RE.match(value):
            raise ConfigError(f"{label}: not a device string: {value!r}")
    if graph.graphdef is None:
        raise GraphError(
            f"{graph.source}: no source GraphDef to export (build the graph with lmscore.load)"
        )
    source = graph_pb2.GraphDef()
    try:
        source.ParseFromString(graph.graphdef)
    except message.DecodeError:
        raise GraphError(f"{graph.source}: the stored GraphDef is corrupt") from None
    originals = {n.name: n for n in source.node}
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(source.versions)
    out.library.CopyFrom(source.library)
    if source.HasField("debug_info"):
        out.debug_info.CopyFrom(source.debug_info)
    out.version = source.version
    for op in graph.ops:
        role = op.attrs.get("_lms_role")
        if role:
            here = device
            if follow_producer and role == SWAP_IN:
                producer = split_tensor(str(op.attrs.get("_lms_tensor", "")))[0]
                here = graph.ops[graph.index[producer]].device or device
            node = _swap_node(graph, op, role, mode, here, host)
        else:
            original = originals.get(str(op.attrs.get("_lms_clone_of", op.name)))
            if original is None:
                raise GraphError(
                    f"{graph.source}: op {op.name!r} ({op.type}) is neither in the source "
                    "GraphDef nor a swap op; export cannot build its node"
                )
            if original.op != op.type:
                raise GraphError(
                    f"{graph.source}: op {op.name!r} has type {op.type} but its source node "
                    f"is {original.op}; export cannot rebuild its attributes"
                )
            node = node_def_pb2.NodeDef()
            node.CopyFrom(original)
            if "_lms_clone_of" in op.attrs:  # a recomputing clone: its original, renamed
                node.name = op.name
                for key in ("_lms_clone_of", "_lms_tensor"):
                    node.attr[key].s = str(op.attrs[key]).encode()
            node.device = op.device if mode == "gpu" else _emulated_device(op.device)
        _mark_scheduled(node, op)
        del node.input[:]
        node.input.extend(_input_name(t) for t in op.inputs)
        node.input.extend(f"^{c}" for c in op.control_inputs)
        out.node.append(node)
    return out


def _mark_scheduled(node: Any, op: Op) -> None:
    """Write which of ``op``'s control inputs a pinned order added (``_lms_after``).

    Loaded again, the step tells its own edges from the order's: left as data, the order's
    edges made every update wait for a backward op and be classified backward.
    """
    after = op.attrs.get(SCHEDULED_AFTER)
    if after:
        del node.attr[SCHEDULED_AFTER].list.s[:]
        node.attr[SCHEDULED_AFTER].list.s.extend(str(a).encode() for a in after)


def _input_name(tensor: str) -> str:
    name, port = split_tensor(tensor)
    return name if port == 0 else f"{name}:{port}"


def _emulated_device(device: str) -> str:
    """Other nodes run on the emulated accelerator: unplaced stays unplaced."""
    return EMULATED_DEVICE if device else ""


def _swap_node(graph: Graph, op: Op, role: str, mode: str, device: str, host: str) -> Any:
    if role not in (SWAP_OUT, SWAP_IN):
        raise GraphError(f"{graph.source}: op {op.name!r} has an unknown _lms_role {role!r}")
    if len(op.inputs) != 1 or len(op.outputs) != 1:
        raise GraphError(
            f"{graph.source}: swap op {op.name!r} must have one data input and one output"
        )
    spec = op.outputs[0]
    node = node_def_pb2.NodeDef(name=op.name, op=_SWAP_TYPES[mode])
    if mode == "gpu":
        node.device = host if role == SWAP_OUT else device
    else:
        node.device = EMULATED_HOST if role == SWAP_OUT else EMULATED_DEVICE
    node.attr["T"].type = _dtype_enum(graph, op, spec)
    node.attr["_output_shapes"].list.shape.add().CopyFrom(_shape_proto(spec))
    for key in _LMS_ATTRS:
        value = op.attrs.get(key)
        if isinstance(value, str):
            node.attr[key].s = value.encode()
        elif isinstance(value, int):
            node.attr[key].i = value
    node.attr[KEEP_ATTR].b = True
    return node


def _dtype_enum(graph: Graph, op: Op, spec: TensorSpec) -> int:
    name = "DT_" + spec.dtype.removesuffix("_ref").upper()
    if name not in types_pb2.DataType.keys() or name == "DT_INVALID":
        raise GraphError(
            f"{graph.source}: swap op {op.name!r}: unknown dtype {spec.dtype!r} of the "
            "swapped tensor"
        )
    return types_pb2.DataType.Value(name)


def _shape_proto(spec: TensorSpec) -> Any:
    shape = attr_value_pb2.AttrValue().shape  # a TensorShapeProto
    if spec.shape is None:
        shape.unknown_rank = True
    else:
        for d in spec.shape:
            shape.dim.add().size = d
    return shape


def write_graphdef(
    graph: Graph,
    path: str | os.PathLike[str],
    *,
    mode: str = "gpu",
    device: str = "/GPU:0",
    host: str = "/CPU:0",
    text: bool | None = None,
) -> None:
    """Write :func:`to_graphdef` of ``graph`` to ``path``, atomically.

    Parameters
    ----------
    graph : Graph
    path : path-like
        Destination; ``.pbtxt`` (or ``.txt``, ``.prototxt``) gets the text format, anything
        else the binary format, unless ``text`` says otherwise.
    mode, device, host : str
        See :func:`to_graphdef`.
    text : bool, optional
        Force the text (True) or binary (False) format.

    Raises
    ------
    ConfigError
        If ``path`` is the file the graph was loaded from, or cannot be written (nothing
        is written then).
    GraphError
        See :func:`to_graphdef`.
    """
    p = pathlib.Path(path)
    if _is_source(graph, p):
        raise ConfigError(f"{p}: refusing to overwrite the file the graph was loaded from")
    if p.is_dir():
        raise ConfigError(f"{p}: is a directory")
    gd = _graphdef(graph, mode, device, host)
    as_text = p.suffix in _TEXT_SUFFIXES if text is None else text
    data: bytes | str = (
        text_format.MessageToString(gd) if as_text else gd.SerializeToString(deterministic=True)
    )
    write_atomic(p, data)


def _is_source(graph: Graph, path: pathlib.Path) -> bool:
    """Whether ``path`` is the file ``graph`` (or the graph it was rewritten from) came from."""
    source = graph.source
    while source.endswith(" (rewritten)"):
        source = source.removesuffix(" (rewritten)")
    try:
        return path.exists() and os.path.samefile(path, source)
    except (OSError, ValueError):  # the source is not a file (a description, a function)
        return False


# --- Running the rewritten step --------------------------------------------------------------

#: Name scope of the rewritten graph inside the function that runs it.
_SCOPE = "rewritten"
_FLOATS = frozenset({"float", "double", "half", "bfloat16"})


@dataclass(frozen=True)
class SwappedStep:
    """A training step rewritten to swap tensors, running on the original variables.

    Call it like the original step: ``loss = step(x, y)``. It runs the rewritten graph
    and updates the same variables the original step updates.

    Attributes
    ----------
    function : tf.types.experimental.PolymorphicFunction
        A ``tf.function`` with the original step's input signature whose body imports
        :attr:`graphdef`, with the argument placeholders fed by the call's arguments and
        the captured resource placeholders fed by :attr:`variables`' handles. Its
        function library (loop bodies, branches) is the original step's own definitions.
    plan : Plan
        The plan that was applied (without skipped swaps).
    rewrite : Rewrite
        The rewrite: the rewritten IR, swap op names, skipped swaps.
    graph : Graph
        The original step as imported.
    graphdef : bytes
        The exported rewritten GraphDef (``mode="gpu"`` with :attr:`device` and
        :attr:`host`).
    variables : tuple of tf.Variable
        The variables the step reads and updates, in capture order.
    device, host : str
        Where swap-ins and swap-outs are placed (a data-parallel step's swap-ins go to
        their replica's device instead, see :func:`swap`).
    summary : str
        One line: what was decided (the plan's origin, the peak before and after, bytes
        swapped and recomputed, the predicted overhead of a tuned plan); also logged at
        INFO on the ``"lmscore"`` logger.
    tuning : tuple of TuneResult
        The tuner's results, one per device planned; empty for knob plans and given plans.
    """

    function: Any
    plan: Plan
    rewrite: Rewrite
    graph: Graph
    graphdef: bytes = field(repr=False)
    variables: tuple[Any, ...] = field(repr=False)
    device: str = ""
    host: str = ""
    summary: str = ""
    tuning: tuple[TuneResult, ...] = field(default=(), repr=False)

    def __call__(self, *args: Any) -> Any:
        """Run one rewritten step and return what the original step returns.

        Raises
        ------
        RunError
            If the arguments do not fit the step's signature or TensorFlow fails.
        """
        import tensorflow as tf

        try:
            return self.function(*args)
        except (TypeError, ValueError, tf.errors.OpError) as e:
            raise RunError(
                f"{self.graph.source}: cannot run the rewritten step: {_line(e)}"
            ) from None


class NoFitError(PlanError):
    """No plan fits the budget.

    ``result`` is the tuner's answer for the device that does not fit
    (:attr:`~lmscore.tune.TuneResult.bound_op`, :attr:`~lmscore.tune.TuneResult.min_peak_bytes`).
    """

    def __init__(self, message: str, result: TuneResult) -> None:
        super().__init__(message)
        self.result = result


#: The TFLMS knobs of :func:`swap` and the values a knob plan takes when they are not given.
_KNOB_DEFAULTS = {"threshold": 5, "ahead": 1, "groupby": 5, "sync_mode": 0}
_log = logging.getLogger("lmscore")


def swap(
    train_step: Any,
    *specs: Any,
    threshold: int | None = None,
    ahead: int | None = None,
    groupby: int | None = None,
    sync_mode: int | None = None,
    batch_size: int | None = None,
    plan: Plan | None = None,
    device: str | None = None,
    host: str | None = None,
    budget: int | str | None = None,
    preset: str | None = None,
    link: str | None = None,
    strategy: str | None = None,
    safety: float | None = None,
    workspace: str | None = None,
    **knobs: Any,
) -> SwappedStep:
    """Rewrite a ``tf.function`` training step to swap tensors to the host.

    The step is traced, imported (:func:`lmscore.load.from_function`), planned, rewritten
    and exported (``mode="gpu"``). The returned callable runs the rewritten graph on the
    variables the step captured, so it trains the same model. The plan is

    * ``plan``, when given;
    * with ``budget``: the tuner's (:func:`lmscore.tune.tune`, the default strategy of
      ``lms tune``) for a device of ``budget`` bytes at the step's batch size;
    * with no budget, no knob and no plan, on a machine with a GPU: the tuner's for the
      memory TensorFlow gives that GPU (the first logical GPU, or ``device``);
    * otherwise the TFLMS knob plan (:func:`lmscore.plan.plan_from_params`; knobs not
      given take 5, 1, 5 and 0).

    A data-parallel step (traced under ``tf.distribute.MirroredStrategy``: its ops are
    placed on two or more devices of one type) is planned per device: each device's ops
    form a step of their own, planned against the whole budget, and each swap-in goes back
    to the device of its tensor's producer (TFLMS v2's ``gpu_device`` per replica);
    swap-outs go to ``host``.

    What was decided is one line, :attr:`SwappedStep.summary`, also logged at INFO on the
    ``"lmscore"`` logger.

    Parameters
    ----------
    train_step : tf.function or ConcreteFunction
        A step that captures its variables (the usual Keras / ``GradientTape`` step, e.g.
        :func:`lmscore.tfgraph.train_step_function`).
    *specs : tf.TensorSpec
        Argument specs to trace a ``tf.function`` with; not needed when it has an
        ``input_signature`` or was traced exactly once.
    threshold, ahead, groupby, sync_mode : int, optional
        TFLMS knobs, see :func:`lmscore.plan.plan_from_params`; refused with a budget.
    batch_size : int, optional
        Batch size the plan is made for (per replica for a data-parallel step); by default
        dimension 0 of the first input's spec, when it is known.
    plan : Plan, optional
        Apply this plan instead of making one (the knobs are then ignored).
    device, host : str, optional
        Device strings of swap-ins and swap-outs. By default the first logical GPU (or
        the first CPU when there is none) and the first logical CPU, so on a machine
        without an accelerator both are the CPU and the swaps move no memory. A device
        that does not exist is soft-placed (TensorFlow 2's default placement policy).
    budget : int or str, optional
        Device memory the step must fit, in bytes or as a size (``"8GiB"``,
        :func:`lmscore.units.parse_bytes`); per device for a data-parallel step.
    preset, link, strategy, safety, workspace : optional
        Options of :func:`lmscore.tune.tune` (``preset`` is its ``device``: the time
        model's accelerator); its defaults when not given. They need a budget (or a GPU).
    **knobs
        Further keyword arguments of :func:`lmscore.plan.plan_from_params`
        (``serialize``, ``include_scopes``, ``trigger_window``...).

    Returns
    -------
    SwappedStep
        Callable; carries ``.plan``, ``.rewrite``, ``.summary`` and ``.tuning``.

    Raises
    ------
    ConfigError
        If an argument is unusable (unknown knob, knobs with a budget, a budget that is
        not a size, missing batch size, specs with a ConcreteFunction...).
    NoFitError
        If no plan fits the budget (a :class:`~lmscore.errors.PlanError` naming the op
        that bounds every plan).
    GraphError
        If the step cannot be traced or imported, or the rewritten graph cannot be
        imported into TensorFlow.
    PlanError
        If ``plan`` does not fit the step's graph.
    """
    import tensorflow as tf

    from .load import from_function

    knob_args = {k: v for k, v in (("threshold", threshold), ("ahead", ahead),
                                   ("groupby", groupby), ("sync_mode", sync_mode))
                 if v is not None}
    tune_args = {k: v for k, v in (("device", preset), ("link", link), ("strategy", strategy),
                                   ("safety", safety), ("workspace", workspace))
                 if v is not None}
    memory = None if budget is None else _budget_bytes(budget)
    if plan is None:
        allowed = set(inspect.signature(plan_from_params).parameters) - {
            "graph", "batch_size", *_KNOB_DEFAULTS,
        }
        for key in knobs:
            if key not in allowed:
                raise ConfigError(
                    f"{key}: not a planning knob (one of: {', '.join(sorted(allowed))})"
                )
        knob_args.update(knobs)
        if memory is not None and knob_args:
            raise ConfigError(f"{next(iter(knob_args))}: a knob cannot be given with a "
                              "budget (the tuner chooses the plan; pass one or the other)")
    elif knobs:
        raise ConfigError(f"{next(iter(knobs))}: planning knobs cannot be given with a plan")
    elif memory is not None or tune_args:
        what = "budget" if memory is not None else _tune_name(next(iter(tune_args)))
        raise ConfigError(f"{what}: cannot be given with a plan (the plan is applied as is)")

    cf = _concrete_function(tf, train_step, specs)
    attrs = cf.function_def.attr
    if "_XlaMustCompile" in attrs and attrs["_XlaMustCompile"].b:
        warnings.warn("jit_compile: the rewritten step runs without XLA (XLA would compile "
                      "the swaps away)", stacklevel=2)
    graph = from_function(cf)
    graph = graph.replace(graph.ops, source=getattr(train_step, "__name__", None) or cf.graph.name)
    dev, hst = _local_devices(tf)
    dev, hst = device or dev, host or hst
    origin = "budget"
    if plan is None and memory is None and not knob_args:
        memory = _accelerator_memory(tf, dev)  # None without a GPU: the knob plan
        origin = f"{dev} memory"
    if plan is None and memory is None and tune_args:
        raise ConfigError(f"{_tune_name(next(iter(tune_args)))}: a tuning option needs a "
                          "budget (there is no GPU whose memory to take)")
    if plan is None and batch_size is None:
        batch_size = _signature_batch(tf, cf)
    groups = _device_groups(graph)
    if len(groups) > 1 and plan is None:
        result, summary, tuning = _plan_per_device(
            graph, groups, batch_size, memory, origin, tune_args, knob_args)
    else:
        result, summary, tuning = _plan_step(
            graph, batch_size, memory, origin, tune_args, knob_args, plan)
    summary = f"{graph.source}: {summary}"
    data = to_graphdef(result.graph, mode="gpu", device=dev, host=hst,
                       follow_producer=len(groups) > 1)
    function, variables = _step_from_function(tf, cf, data, graph.source)
    _log.info(summary)
    return SwappedStep(function, result.plan, result, graph, data, variables, dev, hst,
                       summary, tuning)


def _tune_name(key: str) -> str:
    """The name :func:`swap` gives a :func:`lmscore.tune.tune` option."""
    return "preset" if key == "device" else key


def _budget_bytes(budget: Any) -> int:
    """Bytes of a ``budget`` given as a byte count or a size string."""
    if isinstance(budget, bool) or not isinstance(budget, (int, str)):
        raise ConfigError(f"budget: expected bytes or a size such as '8GiB', got {budget!r}")
    if isinstance(budget, int):
        if budget <= 0:
            raise ConfigError(f"budget: must be positive, got {budget}")
        return budget
    try:
        return parse_bytes(budget)
    except ConfigError as e:
        raise ConfigError(f"budget: {e}") from None


def _accelerator_memory(tf: Any, device: str) -> int | None:
    """Bytes TensorFlow gives the GPU ``device`` (its allocator's limit); None for a CPU.

    TensorFlow 2 reports no memory size through ``tf.config`` (``get_memory_info`` is
    what is in use, ``get_device_details`` names the board); ``list_local_devices``
    reports each device's ``memory_limit``, what its allocator may hand out (a logical
    GPU's configured limit, or the free memory at start less TensorFlow's reserve).
    """
    spec = tf.DeviceSpec.from_string(device)
    if (spec.device_type or "").upper() != "GPU" or not tf.config.list_logical_devices("GPU"):
        return None
    from tensorflow.python.client import device_lib

    index = spec.device_index or 0
    for d in device_lib.list_local_devices():
        found = tf.DeviceSpec.from_string(d.name)
        if (found.device_type or "").upper() == "GPU" and (found.device_index or 0) == index:
            return int(d.memory_limit) or None
    return None


def _plan_step(
    graph: Graph,
    batch: int | None,
    memory: int | None,
    origin: str,
    tune_args: Mapping[str, Any],
    knob_args: Mapping[str, Any],
    plan: Plan | None,
) -> tuple[Rewrite, str, tuple[TuneResult, ...]]:
    """Plan ``graph`` (tuned, by the knobs, or ``plan``), rewrite it and say what was done."""
    from .evaluate import evaluate_plan
    from .tune import tune

    if plan is None and memory is not None:
        assert batch is not None
        found = tune(graph, batch, memory, **tune_args)
        if not found.fits:
            raise NoFitError(
                f"budget: {graph.source} at batch {batch} on a {format_bytes(memory)} device "
                f"({origin}): {found.message}", found)
        result = rewrite(graph, found.plan)
        how = (f"{found.strategy} plan for a {format_bytes(memory)} device ({origin}) "
               f"at batch {batch}")
        return result, _described(graph, batch, how, found.baseline_peak_bytes,
                                  found.predicted_peak_bytes, result.plan,
                                  found.swap_bytes, found.predicted_overhead), (found,)
    if plan is None:
        assert batch is not None
        plan = plan_from_params(graph, batch, **{**_KNOB_DEFAULTS, **knob_args})
        knobs = {k: plan.params.get(k, v) for k, v in _KNOB_DEFAULTS.items()}
        how = "knob plan (" + ", ".join(f"{k} {v}" for k, v in knobs.items()) + ")"
    else:
        how = "given plan"
        batch = batch or plan.params.get("batch_size")
    if not isinstance(batch, int):  # nothing to simulate the plan at
        result = rewrite(graph, plan)
        return result, _described(graph, None, how, 0, 0, result.plan, 0, None), ()
    ev = evaluate_plan(graph, plan, batch)
    how += f" at batch {batch}"
    return ev.rewrite, _described(graph, batch, how, ev.before.peak_bytes, ev.after.peak_bytes,
                                  ev.plan, ev.swap_bytes, None), ()


def _described(graph: Graph, batch: int | None, how: str, before: int, after: int,
               plan: Plan, swap_bytes: int, overhead: float | None) -> str:
    """One line: how the plan was made, the peaks, what it moves and recomputes."""
    from .shapes import resolve

    parts = [how]
    if batch is not None:
        parts.append(f"peak {format_bytes(before)} -> {format_bytes(after)}")
    moved = f"{len(plan.swaps)} tensors swapped"
    if batch is not None:
        moved += f" ({format_bytes(swap_bytes)})"
    parts.append(moved)
    if plan.recomputes:
        recomputed = f"{len(plan.recomputes)} recomputed"
        if batch is not None:
            sizes = resolve(graph, batch)
            total = sum(max(sizes.nbytes[graph.index[name]][port], 0)
                        for name, port in (split_tensor(r.tensor) for r in plan.recomputes))
            recomputed += f" ({format_bytes(total)})"
        parts.append(recomputed)
    if overhead is not None:
        parts.append(f"predicted overhead {overhead:.1%}")
    return ", ".join(parts)


# --- Data-parallel steps: one plan per device ------------------------------------------------

_DEVICE_KIND = re.compile(r"(?:^|/)(?:device:)?([A-Za-z_]+):(\d+)$")
#: Name suffix of the ops a device's step gets for the tensors other devices read.
_BOUNDARY = "/lms_boundary_out"


def _device_groups(graph: Graph) -> dict[str, tuple[int, ...]]:
    """The ops of each device of a data-parallel step; empty for a single-device step.

    A step traced under ``tf.distribute.MirroredStrategy`` places every replica's ops on
    its device; what the trace leaves unplaced (feeds, variable reads, constants) belongs
    to the device of all its placed readers (the placer colocates a read with its
    variable), or of all its inputs; what several devices read belongs to none. A step
    is data-parallel when two or more devices of one type hold ops.
    """
    adj = graph.adjacency
    device = [_canonical(op.device) for op in graph.ops]
    kinds: dict[str, set[str]] = {}
    for d in set(device) - {""}:
        kinds.setdefault(d.split(":")[0], set()).add(d)
    if not any(len(v) > 1 for v in kinds.values()):
        return {}
    readers: list[set[int]] = [set() for _ in graph.ops]
    for (p, _port), cs in adj.consumers.items():
        readers[p].update(cs)
    topo = list(order(graph).schedule)  # a topological order
    # Data edges only: the step's last op waits for every stateful op of every device.
    for i in reversed(topo):
        if not device[i]:
            seen = {device[c] for c in readers[i]} - {""}
            if len(seen) == 1:
                device[i] = seen.pop()
    for i in topo:
        if not device[i]:
            seen = {device[p] for p, _port in adj.data_in[i]}
            if len(seen) == 1 and "" not in seen:
                device[i] = seen.pop()
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(device):
        if d:
            groups.setdefault(d, []).append(i)
    return {d: _without_reentry(graph, v) for d, v in sorted(groups.items())}


def _without_reentry(graph: Graph, group: Sequence[int]) -> tuple[int, ...]:
    """``group`` without the ops that depend on it through ops outside it.

    A device's step sees what other devices send it as feeds, ready when it starts; an
    op that waits for something that waits for this device (the step's outputs wait for
    every device's updates) would then be pinned before what it waits for, a cycle.
    """
    succs = graph.adjacency.succs
    inside = set(group)
    stack = [s for i in group for s in succs[i] if s not in inside]
    seen = set(stack)
    while stack:
        for s in succs[stack.pop()]:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return tuple(i for i in group if i not in seen)


def _canonical(device: str) -> str:
    """``"CPU:1"`` for ``/job:localhost/replica:0/task:0/device:CPU:1``; "" if unplaced."""
    m = _DEVICE_KIND.search(device or "")
    return f"{m.group(1).upper()}:{m.group(2)}" if m else ""


def _device_step(graph: Graph, members: Sequence[int], device: str) -> tuple[Graph, set[str]]:
    """The step one device runs: its ops, with what other devices send it as feeds.

    Tensors from other devices become ``Placeholder`` ops under their producers' names
    (the device receives them, as a step receives its inputs), tensors other devices read
    get an ``Identity`` output (what the device sends is kept until the step's end, as a
    step's outputs are), and control edges from other devices are left out. Returns the
    step and the names of those added ops.
    """
    adj = graph.adjacency
    inside = set(members)
    feeds: dict[int, Op] = {}
    sent: list[Op] = []
    ops: list[Op] = []
    for i in members:
        op = graph.ops[i]
        for p, _port in adj.data_in[i]:
            if p not in inside and p not in feeds:
                src = graph.ops[p]
                feeds[p] = Op(src.name, "Placeholder", outputs=src.outputs, device=src.device)
        kept = tuple(c for c in op.control_inputs if graph.index[c] in inside)
        ops.append(op if kept == op.control_inputs else replace(op, control_inputs=kept))
        for port in range(len(op.outputs)):
            readers = adj.consumers.get((i, port), ())
            if any(c not in inside for c in readers):
                sent.append(Op(f"{op.name}{_BOUNDARY}_{port}", "Identity",
                               inputs=(f"{op.name}:{port}",), outputs=(op.outputs[port],),
                               device=op.device))
    step = graph.replace([*feeds.values(), *ops, *sent], source=f"{graph.source} on {device}")
    return step, {op.name for op in (*feeds.values(), *sent)}


def _plan_per_device(
    graph: Graph,
    groups: Mapping[str, tuple[int, ...]],
    batch: int,
    memory: int | None,
    origin: str,
    tune_args: Mapping[str, Any],
    knob_args: Mapping[str, Any],
) -> tuple[Rewrite, str, tuple[TuneResult, ...]]:
    """Plan and rewrite each device's step, then put the rewritten steps back together."""
    done: list[tuple[tuple[int, ...], Rewrite, set[str]]] = []
    lines, tuning = [], []
    for name, members in groups.items():
        step, added = _device_step(graph, members, name)
        result, line, found = _plan_step(step, batch, memory, origin, tune_args, knob_args,
                                         None)
        done.append((members, result, added))
        lines.append(f"{name}: {line}")
        tuning.extend(found)
    merged = _merged(graph, done)
    return merged, f"{len(groups)} devices planned each; " + "; ".join(lines), tuple(tuning)


def _merged(graph: Graph, done: Sequence[tuple[tuple[int, ...], Rewrite, set[str]]]) -> Rewrite:
    """The step with every device's rewritten ops in place of its own.

    The feeds and outputs a device's step was given are dropped again; a control edge
    into or out of one (a pinned schedule may chain an output) is bridged, so the order
    each device's plan pins survives. The plan is every device's swaps and recomputations
    together (each was applied to its device's step, and its schedule pinned there only:
    one chain through all devices would make a replica's all-reduce wait for ops of
    another replica that wait for it).
    """
    ops = list(graph.ops)
    appended: list[Op] = []
    for members, result, added in done:
        new = {op.name: op for op in result.graph.ops}

        def bridged(names: Sequence[str], new: dict[str, Op] = new,
                    added: set[str] = added) -> tuple[str, ...]:
            out: list[str] = []
            stack = list(names)[::-1]
            while stack:
                c = stack.pop()
                if c in added:
                    stack.extend(reversed(new[c].control_inputs))
                elif c not in out:
                    out.append(c)
            return tuple(out)

        for i in members:
            old = ops[i]
            op = new[old.name]
            controls = bridged(op.control_inputs)
            outside = tuple(c for c in old.control_inputs if c not in controls)
            ops[i] = replace(op, control_inputs=(*controls, *outside))
        names = {graph.ops[i].name for i in members} | added
        appended.extend(replace(op, control_inputs=bridged(op.control_inputs))
                        for op in result.graph.ops if op.name not in names)
    step = graph.derive([*ops, *appended], source=f"{graph.source} (rewritten)")
    lint(step)
    plans = [result.plan for _, result, _ in done]
    plan = Plan(
        fingerprint(graph),
        tuple(s for p in plans for s in p.swaps),
        max(p.sync_mode for p in plans),
        (),
        {"per_device": [p.params for p in plans]},
        pin_schedule=any(p.pin_schedule for p in plans),
        recomputes=tuple(r for p in plans for r in p.recomputes),
    )

    def every(field_name: str) -> tuple[Any, ...]:
        return tuple(x for _, result, _ in done for x in getattr(result, field_name))

    return Rewrite(step, plan, every("swap_outs"), every("swap_ins"), every("synchronous"),
                   every("skipped"), every("clones"))


def _concrete_function(tf: Any, fn: Any, specs: tuple[Any, ...]) -> Any:
    """Trace ``fn`` (or take the one trace it has) and return the concrete function."""
    concrete = tf.types.experimental.ConcreteFunction
    name = getattr(fn, "__name__", None) or getattr(fn, "name", None) or type(fn).__name__
    if isinstance(fn, concrete):
        if specs:
            raise ConfigError(f"specs: {name} is already traced; pass no specs")
        return fn
    if not isinstance(fn, tf.types.experimental.PolymorphicFunction):
        raise ConfigError(
            f"train_step: expected a tf.function or a ConcreteFunction, got {type(fn).__name__}"
        )
    try:
        if specs or fn.input_signature is not None:
            return fn.get_concrete_function(*specs)
    except LmsError:
        raise
    except Exception as e:  # user code and TensorFlow raise anything while tracing
        raise GraphError(f"{name}: cannot trace the step: {_line(e)}") from None
    traces = list(getattr(fn, "_list_all_concrete_functions", list)())
    if len(traces) != 1:
        raise ConfigError(
            f"specs: {name} has no input_signature and was traced {len(traces)} times; "
            "pass the argument specs"
        )
    return traces[0]


def _signature_batch(tf: Any, cf: Any) -> int:
    """Dimension 0 of the step's first input, when the trace knows it."""
    leaves = tf.nest.flatten(cf.structured_input_signature, expand_composites=True)
    shape = getattr(leaves[0], "shape", None) if leaves else None
    if shape is not None and shape.rank and shape[0] is not None:
        return int(shape[0])
    raise ConfigError("batch_size: the step's batch dimension is unknown; pass batch_size")


def _local_devices(tf: Any) -> tuple[str, str]:
    """The first logical accelerator (or CPU) and the first logical CPU."""
    cpus = tf.config.list_logical_devices("CPU")
    gpus = tf.config.list_logical_devices("GPU")
    host = cpus[0].name if cpus else "/device:CPU:0"
    return (gpus[0].name if gpus else host), host


def _step_from_function(
    tf: Any, cf: Any, data: bytes, source: str
) -> tuple[Any, tuple[Any, ...]]:
    """A ``tf.function`` running ``data`` in place of ``cf``, on ``cf``'s captures."""
    fg = cf.graph
    args_sig, kwargs_sig = cf.structured_input_signature
    if kwargs_sig:
        raise ConfigError(
            f"{source}: keyword arguments are not supported; trace with positional specs"
        )
    leaves = tf.nest.flatten(args_sig, expand_composites=True)
    if not all(isinstance(s, tf.TypeSpec) for s in leaves):
        raise ConfigError(f"{source}: every argument of the step must be a tensor")
    # Captured by reference: values read at each call (a MirroredStrategy step's
    # collective instance keys, fresh per call), after the captured values.
    deferred = fg.function_captures
    late = [(t.op.name, _CallTime(deferred.by_ref_external[key],
                                  deferred.by_ref_tracetype[key]))
            for key, t in deferred.by_ref_internal.items()]
    n_caps = len(fg.internal_captures) + len(late)
    arg_names = [t.op.name for t in fg.inputs[: len(fg.inputs) - n_caps]]
    if len(arg_names) != len(leaves):
        raise GraphError(
            f"{source}: {len(arg_names)} argument placeholders for {len(leaves)} argument specs"
        )
    by_handle = {id(v.handle): v for v in fg.variables}
    values = cf.captured_inputs[: len(fg.internal_captures)]
    captures = [
        (t.op.name, by_handle.get(id(h), h))
        for t, h in zip(fg.internal_captures, values, strict=True)
    ] + late
    variables = tuple(c for _, c in captures if isinstance(c, tf.Variable))
    structure = cf.structured_outputs
    leaves = tf.nest.flatten(structure, expand_composites=True)
    out_names = [t.name for t in leaves if isinstance(t, tf.Tensor) and t.graph is fg]

    def pack(imported: Sequence[Any]) -> Any:
        by_name = dict(zip(out_names, imported, strict=True))
        return tf.nest.pack_sequence_as(
            structure,
            [by_name.get(t.name, t) if isinstance(t, tf.Tensor) else t for t in leaves],
            expand_composites=True,
        )

    # The exported library is the shape-annotated copy of the step's functions
    # (``as_graph_def(add_shapes=True)``) under the same names as the definitions TensorFlow
    # registered for the step. Importing that copy gives the rewritten graph a second,
    # different definition per name, which TensorFlow refuses to register ("duplicate
    # function ... definitions differ") when the graph's functions are added to the eager
    # context, as ``tf.saved_model.save`` does. The rewrite never changes function bodies,
    # so import the step's own definitions instead.
    fn = _importing_function(
        tf, data, arg_names, tuple(args_sig), captures, out_names, pack, source,
        library=fg.as_graph_def().library,
    )
    return fn, variables


@dataclass(frozen=True)
class _CallTime:
    """A capture whose value ``closure()`` is read at each call (TensorFlow's by reference)."""

    closure: Callable[[], Any]
    spec: Any

    def value(self) -> Any:
        """The capture's value now (the closure gives its flattened tensors)."""
        import tensorflow as tf

        return tf.nest.pack_sequence_as(self.spec, self.closure(), expand_composites=True)


def _importing_function(
    tf: Any,
    data: bytes,
    arg_names: Sequence[str],
    signature: tuple[Any, ...],
    captures: Sequence[tuple[str, Any]],
    out_names: Sequence[str],
    pack: Callable[[Sequence[Any]], Any],
    source: str,
    *,
    library: Any = None,
) -> Any:
    """A traced ``tf.function`` whose body imports the GraphDef ``data``.

    Argument placeholders are fed by the call's (flattened) arguments, capture
    placeholders by the captures (variables by their handle); both are dropped from the
    imported GraphDef. The function returns ``pack`` of the imported ``out_names``.
    ``library`` (a ``FunctionDefLibrary``), when given, replaces ``data``'s own.
    """
    gd = tf.compat.v1.GraphDef()
    gd.ParseFromString(data)
    if library is not None:
        gd.library.CopyFrom(library)
    mapped = set(arg_names) | {name for name, _ in captures}
    nodes = [n for n in gd.node if n.name not in mapped]
    for n in nodes:
        _scope_marks(n, _SCOPE)
        _drop_colocation(n, mapped)
    del gd.node[:]
    gd.node.extend(nodes)
    # an argument no op reads (a step that ignores its labels) is mapped to nothing: the
    # import refuses a map entry for a tensor that is not in the graph
    read = {t if ":" in t else f"{t}:0" for n in nodes for t in n.input if not t.startswith("^")}

    def run(*args: Any) -> Any:
        graph = tf.compat.v1.get_default_graph()
        flat = tf.nest.flatten(args, expand_composites=True)
        input_map = {f"{n}:0": a for n, a in zip(arg_names, flat, strict=True)
                     if f"{n}:0" in read}
        for name, value in captures:
            if f"{name}:0" not in read:
                continue
            if isinstance(value, _CallTime):
                input_map[f"{name}:0"] = graph.capture_call_time_value(value.value, value.spec)
                continue
            handle = value.handle if isinstance(value, tf.Variable) else value
            input_map[f"{name}:0"] = graph.capture(handle)
        imported = tf.graph_util.import_graph_def(
            gd, input_map=input_map, return_elements=list(out_names), name=_SCOPE
        )
        return pack(imported)

    fn = tf.function(run, input_signature=signature, autograph=False)
    try:
        fn.get_concrete_function()
    except Exception as e:  # TensorFlow raises many types while importing
        raise GraphError(
            f"{source}: TensorFlow cannot import the rewritten graph: {_line(e)}"
        ) from None
    return fn


def _drop_colocation(node: Any, dropped: set[str]) -> None:
    """Remove ``node``'s colocation with nodes the import drops (placeholders it maps).

    ``tf.nn.embedding_lookup`` colocates its gather with the variable's capture placeholder
    (``_class: loc:@...``); the placeholder is replaced by the captured handle, and the
    import refuses a colocation with a node it does not have. The placer still puts a
    resource's readers with the resource.
    """
    marks = node.attr["_class"].list.s if "_class" in node.attr else ()
    kept = [m for m in marks if m.decode(errors="replace").removeprefix("loc:@") not in dropped]
    if len(kept) == len(marks):
        return
    if kept:
        del node.attr["_class"].list.s[:]
        node.attr["_class"].list.s.extend(kept)
    else:
        del node.attr["_class"]


def _scope_marks(node: Any, scope: str) -> None:
    """Prefix the op names a rewrite's marks hold with ``scope``, as the import renames ops.

    Loaded from the SavedModel, the step then tells the pinned order's edges from its own
    (they named ``x`` where the edge came from ``rewritten/x``: a tuned GPT-like step,
    saved and loaded, had 262 updates where it has 874, the rest called backward).
    """
    if SCHEDULED_AFTER in node.attr:
        names = [f"{scope}/{x.decode()}".encode() for x in node.attr[SCHEDULED_AFTER].list.s]
        del node.attr[SCHEDULED_AFTER].list.s[:]
        node.attr[SCHEDULED_AFTER].list.s.extend(names)
    for key in ("_lms_clone_of", "_lms_tensor"):
        if key in node.attr and node.attr[key].s:
            node.attr[key].s = f"{scope}/{node.attr[key].s.decode()}".encode()


def _line(exc: BaseException) -> str:
    """One line of an exception message: TensorFlow's span many, with tracebacks."""
    text = getattr(exc, "message", None) or str(exc)
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    node = re.search(r"\{\{node ([^}]+)\}\}", text)
    marker = next((i for i, x in enumerate(lines) if "[[{{node" in x), None)
    if marker is not None:
        reason = next(
            (x for x in reversed(lines[:marker]) if not x.startswith("Node: ")), ""
        )
    else:
        skip = ("Graph execution error", "Detected at node", "File ", "in user code", "Traceback")
        reason = next((x for x in lines if not x.startswith(skip)), "")
    reason = re.sub(r"\s+", " ", reason.split(" Received args:")[0]) or type(exc).__name__
    if len(reason) > 300:
        reason = reason[:297] + "..."
    return f"node {node.group(1)!r}: {reason}" if node else reason


# --- SavedModel --------------------------------------------------------------------------


def save_rewritten_saved_model(
    source: SwappedStep | Graph,
    path: str | os.PathLike[str],
    *,
    variables: Mapping[str, Any] | None = None,
    output: str | None = None,
    device: str | None = None,
    host: str | None = None,
    overwrite: bool = False,
) -> None:
    """Write a rewritten training step as a SavedModel with its variables.

    The SavedModel's root object has a ``train_step`` function (one concrete function,
    the step's input signature; it returns the loss and updates the variables) and the
    variables, saved with their values at the time of the call. Load it with
    ``tf.saved_model.load(path).train_step(x, y)``; :func:`lmscore.load` reads it back
    as well (its default function is ``train_step``). Custom gradients
    (``tf.custom_gradient``) are not saved: the step's own backward pass is in its graph,
    but TensorFlow cannot differentiate *through* the loaded ``train_step`` where such
    ops are.

    Two sources are accepted:

    * a :class:`SwappedStep` (from :func:`swap`): its function is saved as is, with the
      live variables it updates, i.e. the model and optimizer state after the steps run
      so far;
    * a rewritten :class:`~lmscore.ir.Graph` and ``variables``, the values of its
      resource placeholders keyed by placeholder name, e.g.
      :attr:`lmscore.measure.Measurement.variables`. New variables are created with those
      values; the step's arguments are the graph's other placeholders, in graph order.

    Parameters
    ----------
    source : SwappedStep or Graph
    path : path-like
        Destination directory; written to a temporary directory beside it and renamed.
    variables : mapping, optional
        With a Graph: ``{resource placeholder name: array}`` for every variable read by
        the graph.
    output : str, optional
        With a Graph: the tensor ``"op:port"`` the step returns; by default the graph's
        float scalar output (the loss).
    device, host : str, optional
        With a Graph: placement of swap-ins and swap-outs (default: the first logical
        accelerator, or CPU, and the first logical CPU).
    overwrite : bool
        Replace an existing directory at ``path``.

    Raises
    ------
    ConfigError
        If ``path`` exists (without ``overwrite``), is where the graph was loaded from, or
        cannot be written; if a variable value or the output is missing or invalid.
    GraphError
        If the graph cannot be exported or imported.
    RunError
        If TensorFlow fails to save.
    """
    import tensorflow as tf

    p = pathlib.Path(path)
    if isinstance(source, SwappedStep):
        if variables is not None or output is not None:
            raise ConfigError("variables: a SwappedStep is saved with its own variables")
    elif isinstance(source, Graph):
        if _is_source(source, p):
            raise ConfigError(f"{p}: refusing to overwrite the SavedModel the graph came from")
    else:
        raise ConfigError(
            f"source: expected a SwappedStep or a Graph, got {type(source).__name__}"
        )
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{p}: exists and is not a directory")
    if p.exists() and not overwrite:
        raise ConfigError(f"{p}: already exists (pass overwrite=True to replace it)")
    if not p.parent.is_dir():
        raise ConfigError(f"{p}: cannot write (no directory {str(p.parent)!r})")
    if isinstance(source, SwappedStep):
        function, owned = source.function, source.variables
    else:
        dev, hst = _local_devices(tf)
        data = to_graphdef(source, mode="gpu", device=device or dev, host=host or hst)
        function, owned = _step_from_graph(tf, source, data, variables, output)
    module = tf.Module()
    module.train_step = function
    module.step_variables = list(owned)
    _save_atomic(tf, module, p)


def _save_atomic(tf: Any, module: Any, p: pathlib.Path) -> None:
    """Save ``module`` to a temporary directory beside ``p``, then rename it into place."""
    try:
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{p.name}.", dir=p.parent))
    except OSError as e:
        raise ConfigError(f"{p}: cannot write ({e.strerror})") from None
    # Custom gradients (``tf.custom_gradient``, e.g. Keras' swish, or inside the cond of a
    # loss-scaling optimizer) are Python closures over the *original* trace's tensors,
    # keyed by the ``_gradient_op_type`` the imported ops still carry. The saver cannot
    # re-trace them for the imported graph ("Found invalid capture", or "Unable to save
    # gradient functions when exporting a _DefinedFunction" for ops inside imported
    # cond/while bodies), and where it can they would describe the original graph. The
    # step already holds its backward pass, so save no custom gradients.
    options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
    try:
        try:
            tf.saved_model.save(module, str(tmp), options=options)
        except (TypeError, ValueError, AssertionError, tf.errors.OpError) as e:
            raise RunError(f"{p}: TensorFlow cannot save the step: {_line(e)}") from None
        old = p.parent / f"{tmp.name}.old" if p.exists() else None
        try:
            if old is not None:
                p.rename(old)
            tmp.rename(p)
        except OSError as e:
            if old is not None and old.exists() and not p.exists():
                old.rename(p)
            raise ConfigError(f"{p}: cannot write ({e.strerror})") from None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _step_from_graph(
    tf: Any, graph: Graph, data: bytes, values: Mapping[str, Any] | None, output: str | None
) -> tuple[Any, tuple[Any, ...]]:
    """A ``tf.function`` running ``data`` on new variables holding ``values``."""
    import numpy as np

    loss = output or _loss_tensor(graph)
    producer, port = split_tensor(loss)
    if producer not in graph.index or port >= len(graph.op(producer).outputs):
        raise ConfigError(f"output: no tensor {loss!r} in the graph")
    gd = tf.compat.v1.GraphDef()
    gd.ParseFromString(data)
    nodes = {n.name: n for n in gd.node}
    read = {split_tensor(t)[0] for op in graph.ops for t in op.inputs}
    resource = tf.resource.as_datatype_enum
    args: list[tuple[str, Any]] = []
    captures: list[tuple[str, Any]] = []
    values = dict(values or {})
    for op in graph.ops:
        if op.type != "Placeholder":
            continue
        node = nodes[op.name]
        dtype = node.attr["dtype"].type
        if dtype == resource:
            if op.name not in values:
                if op.name in read:
                    raise ConfigError(f"variables: no value for the variable {op.name!r}")
                continue
            try:
                var = tf.Variable(np.asarray(values.pop(op.name)), name=_safe(op.name))
            except (TypeError, ValueError) as e:
                raise ConfigError(f"variables: {op.name!r}: {_line(e)}") from None
            captures.append((op.name, var))
        else:
            s = node.attr["shape"].shape
            shape = None if s.unknown_rank else [d.size if d.size >= 0 else None for d in s.dim]
            spec = tf.TensorSpec(shape, tf.as_dtype(dtype), name=_safe(op.name))
            args.append((op.name, spec))
    if values:
        raise ConfigError(f"variables: {next(iter(values))!r} is not a resource placeholder")
    fn = _importing_function(
        tf, data, [n for n, _ in args], tuple(s for _, s in args), captures,
        [f"{producer}:{port}"], lambda imported: imported[0], graph.source,
    )
    return fn, tuple(v for _, v in captures)


def _loss_tensor(graph: Graph) -> str:
    """The graph's output: a float scalar that nothing reads (``Identity`` with controls first)."""
    used = {split_tensor(t)[0] for op in graph.ops for t in op.inputs}
    used |= {c for op in graph.ops for c in op.control_inputs}
    found = [
        (op, port)
        for op in graph.ops
        if op.name not in used
        for port, spec in enumerate(op.outputs)
        if spec.dtype in _FLOATS and spec.shape == ()
    ]
    if len(found) > 1:
        found = [(op, port) for op, port in found if op.type == "Identity" and op.control_inputs]
    if len(found) != 1:
        raise ConfigError(
            f"output: {graph.source} has {len(found)} candidate loss outputs; "
            "pass output='op:port'"
        )
    op, port = found[0]
    return f"{op.name}:{port}"


def _safe(name: str) -> str:
    """A name TensorFlow accepts for a variable or an argument."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name).lstrip("_.-") or "arg"
