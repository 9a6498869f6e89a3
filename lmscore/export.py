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

Every swap node carries ``_output_shapes``, the ``_lms_role``/``_lms_tensor`` (and
``_lms_group``) markers as attributes, and ``_grappler_do_not_remove = true``: Grappler puts
nodes with that attribute in the set of nodes to preserve, which every optimizer honours.
Without it the default optimizers (dependency optimizer, arithmetic optimizer) remove the
swap ``Identity`` nodes of a CPU-placed graph, or forward their consumers past them.

:func:`swap` rewrites a ``tf.function`` training step and returns a callable that runs the
rewritten graph on the function's own variables; :func:`save_rewritten_saved_model` writes
that step as a SavedModel. Those two import TensorFlow; :func:`to_graphdef` and
:func:`write_graphdef` only need the protos that ship with TensorBoard.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import message, text_format
from tensorboard.compat.proto import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2

from .errors import ConfigError, GraphError, RunError
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
            original = originals.get(op.name)
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
    """Whether ``path`` names the file ``graph`` (or the graph it was rewritten from) came from."""
    source = graph.source
    while source.endswith(" (rewritten)"):
        source = source.removesuffix(" (rewritten)")
    src = pathlib.Path(source)
    try:
        if path.exists() and src.exists():
            return os.path.samefile(path, src)
        return path.resolve() == src.resolve()
    except (OSError, ValueError):
        return False
