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
import os
import pathlib
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import message, text_format
from tensorboard.compat.proto import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2

from .errors import ConfigError, GraphError, LmsError, RunError
from .ir import Graph, Op, TensorSpec, split_tensor
from .plan import Plan, plan_from_params, write_atomic
from .rewrite import SWAP_IN, SWAP_OUT, Rewrite, rewrite

__all__ = [
    "EXPORT_MODES",
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
    graph: Graph, *, mode: str = "gpu", device: str = "/GPU:0", host: str = "/CPU:0"
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
    return _graphdef(graph, mode, device, host).SerializeToString(deterministic=True)


def _graphdef(graph: Graph, mode: str, device: str, host: str) -> Any:
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
            node = _swap_node(graph, op, role, mode, device, host)
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
        del node.input[:]
        node.input.extend(_input_name(t) for t in op.inputs)
        node.input.extend(f"^{c}" for c in op.control_inputs)
        out.node.append(node)
    return out


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
        Where swap-ins and swap-outs are placed.
    """

    function: Any
    plan: Plan
    rewrite: Rewrite
    graph: Graph
    graphdef: bytes = field(repr=False)
    variables: tuple[Any, ...] = field(repr=False)
    device: str = ""
    host: str = ""

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


def swap(
    train_step: Any,
    *specs: Any,
    threshold: int = 5,
    ahead: int = 1,
    groupby: int = 5,
    sync_mode: int = 0,
    batch_size: int | None = None,
    plan: Plan | None = None,
    device: str | None = None,
    host: str | None = None,
    **knobs: Any,
) -> SwappedStep:
    """Rewrite a ``tf.function`` training step to swap tensors to the host.

    The step is traced, imported (:func:`lmscore.load.from_function`), planned
    (:func:`lmscore.plan.plan_from_params` with the knobs, unless ``plan`` is given),
    rewritten and exported (``mode="gpu"``). The returned callable runs the rewritten graph
    on the variables the step captured, so it trains the same model.

    Parameters
    ----------
    train_step : tf.function or ConcreteFunction
        A step that captures its variables (the usual Keras / ``GradientTape`` step, e.g.
        :func:`lmscore.tfgraph.train_step_function`).
    *specs : tf.TensorSpec
        Argument specs to trace a ``tf.function`` with; not needed when it has an
        ``input_signature`` or was traced exactly once.
    threshold, ahead, groupby, sync_mode : int
        TFLMS knobs, see :func:`lmscore.plan.plan_from_params`.
    batch_size : int, optional
        Batch size the plan is made for; by default dimension 0 of the first input's
        spec, when it is known.
    plan : Plan, optional
        Apply this plan instead of making one (the knobs are then ignored).
    device, host : str, optional
        Device strings of swap-ins and swap-outs. By default the first logical GPU (or
        the first CPU when there is none) and the first logical CPU, so on a machine
        without an accelerator both are the CPU and the swaps move no memory. A device
        that does not exist is soft-placed (TensorFlow 2's default placement policy).
    **knobs
        Further keyword arguments of :func:`lmscore.plan.plan_from_params`
        (``serialize``, ``include_scopes``, ``trigger_window``...).

    Returns
    -------
    SwappedStep
        Callable; carries ``.plan`` and ``.rewrite``.

    Raises
    ------
    ConfigError
        If an argument is unusable (unknown knob, missing batch size, specs with a
        ConcreteFunction...).
    GraphError
        If the step cannot be traced or imported, or the rewritten graph cannot be
        imported into TensorFlow.
    PlanError
        If ``plan`` does not fit the step's graph.
    """
    import tensorflow as tf

    from .load import from_function

    cf = _concrete_function(tf, train_step, specs)
    graph = from_function(cf)
    graph = graph.replace(graph.ops, source=getattr(train_step, "__name__", None) or cf.graph.name)
    if plan is None:
        allowed = set(inspect.signature(plan_from_params).parameters) - {
            "graph", "batch_size", "threshold", "ahead", "groupby", "sync_mode",
        }
        for key in knobs:
            if key not in allowed:
                raise ConfigError(
                    f"{key}: not a planning knob (one of: {', '.join(sorted(allowed))})"
                )
        if batch_size is None:
            batch_size = _signature_batch(tf, cf)
        plan = plan_from_params(
            graph, batch_size, threshold=threshold, ahead=ahead, groupby=groupby,
            sync_mode=sync_mode, **knobs,
        )
    elif knobs:
        raise ConfigError(f"{next(iter(knobs))}: planning knobs cannot be given with a plan")
    result = rewrite(graph, plan)
    dev, hst = _local_devices(tf)
    dev, hst = device or dev, host or hst
    data = to_graphdef(result.graph, mode="gpu", device=dev, host=hst)
    function, variables = _step_from_function(tf, cf, data, graph.source)
    return SwappedStep(function, result.plan, result, graph, data, variables, dev, hst)


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
    n_caps = len(fg.internal_captures)
    arg_names = [t.op.name for t in fg.inputs[: len(fg.inputs) - n_caps]]
    if len(arg_names) != len(leaves):
        raise GraphError(
            f"{source}: {len(arg_names)} argument placeholders for {len(leaves)} argument specs"
        )
    by_handle = {id(v.handle): v for v in fg.variables}
    captures = [
        (t.op.name, by_handle.get(id(h), h))
        for t, h in zip(fg.internal_captures, cf.captured_inputs, strict=True)
    ]
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
    del gd.node[:]
    gd.node.extend(nodes)

    def run(*args: Any) -> Any:
        graph = tf.compat.v1.get_default_graph()
        flat = tf.nest.flatten(args, expand_composites=True)
        input_map = {f"{n}:0": a for n, a in zip(arg_names, flat, strict=True)}
        for name, value in captures:
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
