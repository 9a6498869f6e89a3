"""Import: GraphDef files, SavedModels, tf.functions and Keras models into the IR.

This is the only module that reads TensorFlow protos. A GraphDef with ``_output_shapes``
(what ``as_graph_def(add_shapes=True)`` writes, and what every graph exported by this
package has) is parsed with the compiled protos that ship with TensorBoard, without
importing TensorFlow; output dtypes come from a table of TensorFlow's op registry
(``data/opdefs.json``). Only a GraphDef that lacks shapes, a SavedModel, a tf.function or a
Keras model needs TensorFlow itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import struct
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterable, Iterator
from sys import intern
from typing import Any

from google.protobuf import message, text_format
from tensorboard.compat.proto import graph_pb2, types_pb2

from .errors import ConfigError, GraphError
from .ir import Graph, Op, TensorSpec, gc_paused, op_signatures, row_slice_view

#: TensorFlow's largest tensor rank (``TensorShape::MaxDimensions``): a recorded shape of
#: more dimensions is taken as unknown.
MAX_RANK = 254
#: Largest binary GraphDef read (protobuf cannot parse messages of 2 GiB or more).
MAX_FILE_BYTES = 2**31 - 1
#: Largest text GraphDef read: text parsing is about 20x slower than binary.
MAX_TEXT_BYTES = 256 * 2**20
#: Most ops (nodes plus library function nodes) imported, unless ``max_ops`` or the
#: environment variable ``LMS_MAX_OPS`` says otherwise; memory grows by ~2.5 KB an op.
DEFAULT_MAX_OPS = 2_000_000
#: Largest total size a zipped SavedModel may unpack to (guards against zip bombs).
_MAX_UNZIPPED = 8 * 2**30
#: Integer constants up to this many elements are decoded (shape arguments, axes, perms).
_SMALL_CONST = 64
#: Outputs of one op when no ``_output_shapes`` says how many (a count attribute's cap).
_MAX_OUTPUTS = 1 << 16
_DTYPE_NAMES = {v: k[3:].lower() for k, v in types_pb2.DataType.items()}
#: Attributes naming library functions, kept so functional ops can be described.
_FUNC_ATTRS = ("f", "body", "cond", "then_branch", "else_branch", "branches")
#: Integer and boolean attributes the shape evaluator uses.
_SCALAR_ATTRS = (
    "transpose_a", "transpose_b", "adj_x", "adj_y", "N", "axis", "keep_dims",
    "begin_mask", "end_mask", "shrink_axis_mask", "ellipsis_mask", "new_axis_mask",
    "parallel_iterations",
)


def load(path: str | os.PathLike[str], *, function: str | None = None,
         max_ops: int | None = None) -> Graph:
    """Load a training step from a file or directory.

    Parameters
    ----------
    path : path-like
        A GraphDef (``.pb`` binary, ``.pbtxt`` text), a SavedModel directory, or a
        ``.zip`` of a SavedModel directory.
    function : str, optional
        For a SavedModel: the attribute or signature to load (default: ``train_step``
        if the model has one, else its only signature).
    max_ops : int, optional
        Most ops imported (default :func:`max_ops_limit`: ``$LMS_MAX_OPS`` or
        :data:`DEFAULT_MAX_OPS`). Files are limited to :data:`MAX_FILE_BYTES` (binary)
        and :data:`MAX_TEXT_BYTES` (text).

    Returns
    -------
    Graph

    Raises
    ------
    GraphError
        If the path is missing or does not hold a usable graph, or is over a limit; the
        message names it.
    """
    p = pathlib.Path(path)
    if p.is_dir():
        return _load_saved_model(p, function, max_ops)
    if not p.exists():
        raise GraphError(f"{p}: no such file or directory")
    if not p.is_file():  # a pipe or a device would block or never end
        raise GraphError(f"{p}: not a regular file (expected a GraphDef file, a SavedModel "
                         "directory or a .zip)")
    if zipfile.is_zipfile(p):
        return _load_zipped_saved_model(p, function, max_ops)
    text = p.suffix in (".pbtxt", ".txt", ".prototxt")
    _check_size(p.stat().st_size, str(p), text)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise GraphError(f"{p}: cannot read ({e.strerror})") from None
    return from_graphdef_bytes(data, source=str(p), text=text, max_ops=max_ops)


def max_ops_limit(max_ops: int | None = None) -> int:
    """The op limit in force: ``max_ops``, else ``$LMS_MAX_OPS``, else the default.

    Raises
    ------
    ConfigError
        If ``LMS_MAX_OPS`` is not a positive integer.
    """
    if max_ops is not None:
        return max_ops
    env = os.environ.get("LMS_MAX_OPS", "").strip()
    if not env:
        return DEFAULT_MAX_OPS
    if not env.isdigit() or int(env) < 1:
        raise ConfigError(f"LMS_MAX_OPS must be a positive integer, got {env[:40]!r}")
    return int(env)


def _check_size(n: int, source: str, text: bool | None) -> None:
    limit = MAX_TEXT_BYTES if text else MAX_FILE_BYTES
    if n > limit:
        kind = "a text GraphDef" if text else "a GraphDef"
        hint = " (save it as binary .pb)" if text else ""
        raise GraphError(f"{source}: {n:,} bytes is over the limit of {limit:,} for {kind}{hint}")


def _check_count(gd: Any, source: str, max_ops: int | None) -> None:
    limit = max_ops_limit(max_ops)
    n = len(gd.node) + sum(len(f.node_def) for f in gd.library.function)
    if n > limit:
        raise GraphError(f"{source}: {n:,} ops (nodes and function bodies) is over the limit "
                         f"of {limit:,} (set LMS_MAX_OPS to raise it)")


@gc_paused()
def from_graphdef_bytes(data: bytes, *, source: str = "<bytes>", text: bool | None = None,
                        max_ops: int | None = None) -> Graph:
    """Build the IR from a serialized GraphDef.

    Parameters
    ----------
    data : bytes
        Binary or text protobuf.
    source : str
        Name used in messages.
    text : bool, optional
        Force text (True) or binary (False) parsing; by default binary is tried first.
    max_ops : int, optional
        Most ops accepted (default :func:`max_ops_limit`).

    Returns
    -------
    Graph

    Raises
    ------
    GraphError
        If the bytes are not a usable GraphDef, or exceed the size or op limits.
    """
    _check_size(len(data), source, text)
    gd, was_text = _parse(data, source, text)
    _check_count(gd, source, max_ops)
    if len(gd.node) == 0:
        raise GraphError(f"{source}: not a training graph: the GraphDef has no nodes")
    try:
        graph = _unlinked_graph(gd, source=source, graphdef=gd.SerializeToString() if was_text
                                else data)
    except _MissingShapes:
        _check_names(gd, source)  # what is wrong anyway is said without TensorFlow
        gd = _add_shapes_with_tensorflow(gd, source)
        graph = _unlinked_graph(gd, source=source, graphdef=gd.SerializeToString())
    del gd  # the parsed message's memory is free again before the adjacency is built
    graph.adjacency  # noqa: B018 - validate names, inputs and ports now, with the file named
    return graph


class _MissingShapes(Exception):
    """A node with outputs has no ``_output_shapes``: TensorFlow must infer them."""


def _check_names(gd: Any, source: str) -> None:
    """Unique node names and inputs that name nodes, as the IR checks them after import."""
    names: set[str] = set()
    for node in gd.node:
        if not node.name:
            raise GraphError(f"{source}: a node has an empty name")
        if not node.op:
            raise GraphError(f"{source}: node {node.name!r} has no op type")
        if node.name in names:
            raise GraphError(f"{source}: duplicate node name {node.name!r}")
        names.add(node.name)
    for node in gd.node:
        for t in node.input:
            if t[:1] == "^":
                if t[1:] not in names:
                    raise GraphError(f"{source}: node {node.name!r} has a control input from "
                                     f"{t[1:]!r} but no such node exists")
                continue
            name, sep, port = t.rpartition(":")
            if not (sep and port.isascii() and port.isdigit()):
                name = t
            if name not in names:
                raise GraphError(f"{source}: node {node.name!r} reads {t!r} but no node "
                                 f"{name!r} exists")


def _other_format(data: bytes) -> str | None:
    """What a file that is no GraphDef is instead, when it is something a user may load.

    A plan's JSON renamed ``.pb`` and a SavedModel's ``saved_model.pb`` were called
    damaged protobufs (or refused with a text parser's error): each is named, with where
    it belongs.
    """
    head = data.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            return None
        if isinstance(doc, dict) and "swaps" in doc and "version" in doc:
            return "a plan (JSON), not a graph: load it as a plan (--plan, or 'load plan')"
        return "a JSON file, not a GraphDef"
    # SavedModel: field 1, its schema version (a varint), then field 2, a MetaGraphDef
    if data[:1] == b"\x08" and len(data) > 3:
        k = 1
        while k < len(data) and data[k] & 0x80:
            k += 1
        if data[k + 1:k + 2] == b"\x12":
            return ("a SavedModel's saved_model.pb, not a GraphDef: load the SavedModel's "
                    "directory (a .zip of it in the web app)")
    return None


def _parse(data: bytes, source: str, text: bool | None) -> tuple[Any, bool]:
    """Parse binary (tried first) or text; return the message and whether it was text."""
    gd = graph_pb2.GraphDef()
    if text is not True:
        try:
            gd.ParseFromString(data)
            if len(gd.node) or text is False or not data:
                return gd, False
        except message.DecodeError:
            other = _other_format(data)
            if other:
                raise GraphError(f"{source}: {other}") from None
            if text is False:
                raise GraphError(
                    f"{source}: not a GraphDef (corrupt or truncated protobuf)"
                ) from None
    if text is None:  # binary did not parse: the text limit applies now
        _check_size(len(data), source, True)
    try:
        return text_format.Parse(data.decode("utf-8"), graph_pb2.GraphDef()), True
    except RecursionError:
        raise GraphError(f"{source}: not a GraphDef (text protobuf nested too deeply)") from None
    except (text_format.ParseError, UnicodeDecodeError) as e:
        other = _other_format(data)
        if other:
            raise GraphError(f"{source}: {other}") from None
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        kind = "text" if text else "binary or text"
        raise GraphError(f"{source}: not a GraphDef ({kind} protobuf): {why}") from None


def from_graphdef(
    gd: Any, *, source: str = "<graphdef>", graphdef: bytes | None = None,
    require_shapes: bool = True,
) -> Graph:
    """Build the IR from a parsed ``GraphDef`` message (TensorBoard's or TensorFlow's).

    Raises ``_MissingShapes`` (internal) when ``require_shapes`` and a node with outputs
    lacks ``_output_shapes``, so that the caller can let TensorFlow infer them.
    """
    graph = _unlinked_graph(gd, source=source, graphdef=graphdef,
                            require_shapes=require_shapes)
    graph.adjacency  # noqa: B018 - validate names, inputs and ports now, with the file named
    return graph


def _unlinked_graph(
    gd: Any, *, source: str, graphdef: bytes | None, require_shapes: bool = True,
) -> Graph:
    """:func:`from_graphdef` up to the adjacency, which validates the ops' inputs."""
    sigs = _compiled_signatures()
    one_output = _one_output_signatures()
    pushes = _list_pushes(gd)
    ops = []
    empty: dict[str, Any] = {}
    consts: dict[bytes, dict[str, Any]] = {}
    # A step has a few hundred distinct output shapes and signatures among thousands of
    # ops: each is decoded once and its specs are shared (TensorSpec is immutable).
    shapes_of: dict[bytes, list[tuple[int, ...] | None]] = {}
    specs_of: dict[tuple[tuple[str, ...], bytes | None], tuple[TensorSpec, ...]] = {}
    one_specs: dict[tuple[str, bytes | None], tuple[TensorSpec, ...]] = {}  # one output
    new_op = object.__new__
    set_name, set_type, set_device, set_inputs, set_control, set_outputs, set_attrs = (
        _op_setters())
    for node in gd.node:
        name = node.name
        # One string per op type, not per op: every analysis looks op types up, and a few
        # dozen strings stay in the processor's caches where tens of thousands would not.
        op_type = intern(node.op)
        if not name:
            raise GraphError(f"{source}: a node has an empty name")
        if not op_type:
            raise GraphError(f"{source}: node {name!r} has no op type")
        attr = node.attr
        inputs = node.input
        if inputs:
            # one copy, as a list: each read of the field makes new strings, and iterating
            # it ends in an IndexError, whose message costs as much as the strings
            inputs = inputs[:]
            data_in = tuple([t if ":" in t else t + ":0" for t in inputs if t[:1] != "^"])
            control_in = tuple([t[1:] for t in inputs if t[:1] == "^"]) if len(
                data_in) != len(inputs) else ()
        else:
            data_in = control_in = ()
        recorded = attr.get("_output_shapes")
        if recorded is not None:
            key: bytes | None = recorded.SerializeToString()
            shapes = shapes_of.get(key)
            if shapes is None:
                shapes = shapes_of[key] = [
                    # a rank no tensor has is no shape (a million dimensions took 14 s)
                    None if sh.unknown_rank or len(sh.dim) > MAX_RANK
                    else tuple([d.size for d in sh.dim[:]])
                    for sh in recorded.list.shape[:]  # (copies, see inputs above)
                ]
        else:
            key = shapes = None
            if require_shapes:
                sig = sigs.get(op_type)
                if sig is None or sig:
                    raise _MissingShapes(name)
        one = one_output.get(op_type)
        if one is not None and (shapes is None or len(shapes) == 1):
            # most ops: one output whose dtype is fixed or the type attribute's
            type_attr, dt = one
            if type_attr:
                a = attr.get(type_attr)
                if a is not None:
                    dt = _DTYPE_NAMES.get(a.type, "unknown")
            outputs = one_specs.get((dt, key))
            if outputs is None:
                outputs = one_specs[(dt, key)] = (
                    TensorSpec(dt, shapes[0] if shapes is not None else None),)
        else:
            dtypes = _output_dtypes(attr, sigs.get(op_type),
                                    len(shapes) if shapes is not None else None)
            if shapes is None:
                shapes = [None] * len(dtypes)
            elif len(shapes) != len(dtypes):
                # Unknown op or odd attrs: trust the recorded shapes for the arity.
                dtypes = (dtypes + ["unknown"] * len(shapes))[: len(shapes)]
            spec_key = (tuple(dtypes), key)
            outputs = specs_of.get(spec_key)
            if outputs is None:
                outputs = specs_of[spec_key] = tuple(
                    [TensorSpec(d, sh) for d, sh in zip(dtypes, shapes, strict=True)]
                )
        op = new_op(Op)  # Op(name, op_type, ...), see _op_setters
        set_name(op, name)
        set_type(op, op_type)
        set_device(op, node.device)
        set_inputs(op, data_in)
        set_control(op, control_in)
        set_outputs(op, outputs)
        # an exported rewrite marks ops of any type: the pinned order's edges (on ops with
        # control inputs) and the clones (named lms/...)
        set_attrs(op, _small_attrs(node, pushes, consts, attr=attr, op_type=op_type)
                  if op_type in _ATTR_OPS else _lms_attrs(attr)
                  if control_in or name.startswith("lms/") else empty)
        ops.append(op)
    functions = frozenset(f.signature.name for f in gd.library.function)
    return Graph(tuple(ops), source, functions, graphdef)


@functools.cache
def _op_setters() -> tuple[Callable[[Op, Any], None], ...]:
    """The setters of :class:`Op`'s fields, in order, for the importer.

    ``Op`` is a frozen dataclass: its ``__init__`` sets each field through
    ``object.__setattr__``, looked up anew for each. The importer builds an op per node
    and sets their slots directly, in a quarter less time. Refuses an ``Op`` whose fields
    are not the ones the importer sets.
    """
    names = ("name", "type", "device", "inputs", "control_inputs", "outputs", "attrs")
    if tuple(f.name for f in dataclasses.fields(Op)) != names:
        raise RuntimeError("lmscore.ir.Op's fields changed: lmscore.load sets them one by one")
    return tuple(Op.__dict__[name].__set__ for name in names)


@functools.cache
def _compiled_signatures() -> dict[str, tuple[tuple[str, str, str, str, bool], ...]]:
    """Output signatures as ``(kind, key, default, count_attr, ref)`` per output argument.

    kind is ``"fixed"`` (key = dtype), ``"attr"`` (key = type attribute), or ``"list"``
    (key = type-list attribute); count_attr names a number attribute ("" = one).
    """
    out = {}
    for op, sig in op_signatures().items():
        args = []
        for arg in sig["out"]:
            ref = arg.endswith("&")
            arg = arg.rstrip("&")
            count = ""
            if "*" in arg and not arg.startswith("*"):
                count, arg = arg.split("*", 1)
            if arg.startswith("*"):
                args.append(("list", arg[1:], "", count, ref))
            elif arg.startswith("@"):
                key, _, default = arg[1:].partition("=")
                args.append(("attr", key, default or "unknown", count, ref))
            else:
                args.append(("fixed", arg, "", count, ref))
        out[op] = tuple(args)
    return out


@functools.cache
def _one_output_signatures() -> dict[str, tuple[str, str]]:
    """Op types with one output, neither a list nor a reference, as ``(type attribute, dtype)``.

    The dtype is the type attribute's when the op has it (``""``: a fixed dtype), else the
    default: what :func:`_output_dtypes` computes for them, without walking the signature.
    """
    out = {}
    for op, sig in _compiled_signatures().items():
        if len(sig) == 1 and sig[0][0] != "list" and not sig[0][3] and not sig[0][4]:
            kind, key, default, _, _ = sig[0]
            out[op] = (key, default) if kind == "attr" else ("", key)
    return out


def _output_dtypes(attr: Any, sig: tuple | None, n_shapes: int | None) -> list[str]:
    if sig is None:
        guess = next((k for k in ("T", "dtype", "out_type", "Tout") if k in attr), None)
        dt = _DTYPE_NAMES.get(attr[guess].type, "unknown") if guess else "unknown"
        return [dt] * (n_shapes if n_shapes is not None else 1)
    out: list[str] = []
    for kind, key, default, count_attr, ref in sig:
        if kind == "list":
            out.extend(_DTYPE_NAMES.get(t, "unknown") for t in attr[key].list.type)
            continue
        if kind == "attr":
            dt = _DTYPE_NAMES.get(attr[key].type, "unknown") if key in attr else default
        else:
            dt = key
        if ref:
            dt += "_ref"
        if count_attr:
            count = attr[count_attr].i if count_attr in attr else 0
            # The recorded shapes give the arity; a huge count must not build a huge list.
            limit = n_shapes if n_shapes is not None else _MAX_OUTPUTS
            out.extend([dt] * min(max(count, 0), limit))
        else:
            out.append(dt)
    return out


#: Op types whose few attributes the analyses read; all other ops carry none.
_ATTR_OPS = frozenset({
    "Const", "VarHandleOp", "VariableV2", "Placeholder", "While", "StatelessWhile", "If",
    "StatelessIf", "Case", "StatelessCase", "PartitionedCall", "StatefulPartitionedCall",
    "EmptyTensorList", "TensorListReserve", "MatMul", "BatchMatMul", "BatchMatMulV2",
    "BatchMatMulV3", "StridedSlice", "Sum", "Mean", "Max", "Min", "Prod", "All", "Any",
    "Pack", "Unpack", "ConcatV2", "GatherV2", "AddN", "Split", "SplitV", "Identity",
    "DeepCopy", "Einsum", "RaggedTensorToTensor",
})


def _small_attrs(node: Any, pushes: dict[str, tuple[int, ...]] | None = None,
                 consts: dict[bytes, dict[str, Any]] | None = None, *,
                 attr: Any = None, op_type: str | None = None) -> dict[str, Any]:
    """Decode the few attributes analyses use; everything else stays in the source file.

    ``consts`` memoizes the decoded values of constants by their serialized ``value``
    attribute: a step holds thousands of constants but a few dozen distinct ones.
    ``attr`` and ``op_type`` are the node's attributes and op type, if the caller has
    them already (each read of a field of the message makes a new object).
    """
    if attr is None:
        attr = node.attr
    if op_type is None:
        op_type = node.op
    if op_type == "Const" and consts is not None and len(attr) == (
            ("value" in attr) + ("dtype" in attr) + ("_output_shapes" in attr)):
        # most constants: nothing but their value, dtype and shapes (told by counting
        # those keys, without making a string per key), decoded once for all its copies
        # (one dict for them all; nothing changes an op's attributes)
        if "value" not in attr:
            return {}
        value = attr["value"]
        key = value.SerializeToString()
        decoded = consts.get(key)
        if decoded is None:
            decoded = consts[key] = _const_attrs(value.tensor)
        return decoded
    present = set(attr)  # one pass over the map instead of a lookup per candidate key
    out: dict[str, Any] = {}
    if not present.isdisjoint(_LMS_KEYS):
        out.update(_lms_attrs(attr))
    if op_type in ("Identity", "DeepCopy"):
        return out
    if op_type == "Einsum":
        if "equation" in present:
            out["equation"] = attr["equation"].s.decode("utf-8", "replace")
        return out
    if op_type == "RaggedTensorToTensor":
        if "row_partition_types" in present:
            out["row_partition_types"] = tuple(
                x.decode("utf-8", "replace") for x in attr["row_partition_types"].list.s)
        return out
    if op_type in ("While", "StatelessWhile") and pushes:
        out["list_aliases"] = pushes.get(attr["body"].func.name, ())
    if op_type == "Const" and "value" in present:
        if consts is None:
            out.update(_const_attrs(attr["value"].tensor))
        else:
            value = attr["value"]
            key = value.SerializeToString()
            decoded = consts.get(key)
            if decoded is None:
                decoded = consts[key] = _const_attrs(value.tensor)
            out.update(decoded)
    if op_type in ("VarHandleOp", "VariableV2", "Placeholder"):
        for key in ("shape", "dtype"):
            if key in present:
                a = attr[key]
                out[key] = (
                    tuple([d.size for d in a.shape.dim[:]]) if key == "shape"
                    else _DTYPE_NAMES.get(a.type)
                )
        handle = handle_spec(attr)
        if handle is not None:
            out["handle_shape"], out["handle_dtype"] = handle[0], _DTYPE_NAMES.get(handle[1])
    if present.isdisjoint(_OTHER_ATTRS):
        return out
    if "element_dtype" in present:
        out["element_dtype"] = _DTYPE_NAMES.get(attr["element_dtype"].type, "unknown")
    for key in _FUNC_ATTRS:
        if key in present:
            a = attr[key]
            names = [f.name for f in a.list.func] if a.list.func else [a.func.name]
            out[key] = tuple(n for n in names if n)
    for key in _SCALAR_ATTRS:
        if key in present:
            a = attr[key]
            which = a.WhichOneof("value")
            if which in ("b", "i"):
                out[key] = getattr(a, which)
    return out


#: The attributes :func:`_small_attrs` reads of any op type.
_OTHER_ATTRS = frozenset({"element_dtype", *_FUNC_ATTRS, *_SCALAR_ATTRS})
#: What an exported rewrite marks its ops with: swap ops, clones, and the pinned order's
#: control edges (:data:`lmscore.order.SCHEDULED_AFTER`).
_LMS_KEYS = frozenset({"_lms_role", "_lms_tensor", "_lms_clone_of", "_lms_after"})


def _lms_attrs(attr: Any) -> dict[str, Any]:
    """The marks of an exported rewrite among ``attr`` (a node's attribute map)."""
    out: dict[str, Any] = {}
    for key in ("_lms_role", "_lms_tensor", "_lms_clone_of"):
        if key in attr:
            out[key] = attr[key].s.decode("utf-8", "replace")
    if "_lms_after" in attr:
        out["_lms_after"] = tuple(x.decode("utf-8", "replace") for x in attr["_lms_after"].list.s)
    return out


def _const_attrs(t: Any) -> dict[str, Any]:
    """What :func:`_small_attrs` keeps of a constant's ``value`` tensor ``t``."""
    out: dict[str, Any] = {"const_shape": tuple(d.size for d in t.tensor_shape.dim)}
    value = _small_int_tensor(t)
    if value is not None:
        out["value"] = value
    if t.dtype == types_pb2.DT_STRING:  # a tstring is 24 bytes, plus long strings
        n = max(len(t.string_val), 1)
        out["string_bytes"] = 24 * n + sum(len(x) for x in t.string_val if len(x) > 22)
    return out


#: Ops whose output refers to memory that already exists (nothing new is allocated).
_REFERENCES = frozenset({"ReadVariableOp", "TensorListGetItem", "Identity", "Const"})


def _list_pushes(gd: Any) -> dict[str, tuple[int, ...]]:
    """For each loop body, the loop variables (lists) it pushes references into.

    Gradient accumulators of a while loop collect one tensor per iteration. When that
    tensor is a variable read or an element of another list, the list holds references
    to memory that exists anyway; otherwise it keeps each iteration's fresh tensor alive.
    """
    out: dict[str, tuple[int, ...]] = {}
    for f in gd.library.function:
        args = {a.name: k for k, a in enumerate(f.signature.input_arg)}
        nodes = {n.name: n for n in f.node_def}
        aliases = []
        # tensors every iteration passes on unchanged (a kernel read before the loop): a
        # push of one references the same buffer each time
        outs = [a.name for a in f.signature.output_arg]
        pushed: set[str] = {
            a.name for k, a in enumerate(f.signature.input_arg)
            if k < len(outs) and _view_root(f.ret.get(outs[k], ""), nodes) == a.name}
        for n in f.node_def:
            if n.op != "TensorListPushBack" or len(n.input) < 2:
                continue
            k = args.get(n.input[0])
            src = nodes.get(n.input[1].split(":")[0])
            # or a view of such a tensor, or of one another accumulator holds already: a
            # ConvLSTM pushes each step's input (an element of the input's list) and
            # state once per gate convolution, each through its own ExpandDims (1.956
            # of measured when each push counted as a new tensor)
            root = _view_root(n.input[1], nodes)
            base = nodes.get(root.split(":")[0])
            if k is not None and (src is not None and src.op in _REFERENCES or root in pushed
                                  or base is not None and base.op in _REFERENCES):
                aliases.append(k)
            pushed.add(root)
        if aliases:
            out[f.signature.name] = tuple(aliases)
    return out


#: Ops of a function body whose output is a view of their first input.
_BODY_VIEWS = frozenset({"Identity", "ExpandDims", "Reshape", "Squeeze", "Snapshot",
                         "StopGradient", "EnsureShape", "PreventGradient"})


def _view_root(ref: str, nodes: dict[str, Any]) -> str:
    """The tensor of a function body that ``ref`` is a view of (itself if none)."""
    for _ in range(64):
        node = nodes.get(ref.split(":")[0])
        if node is None or not node.input or not (
                node.op in _BODY_VIEWS or node.op == "StridedSlice" and _row_view(node, nodes)):
            break
        ref = node.input[0]
    return ref


def _row_view(node: Any, nodes: dict[str, Any]) -> bool:
    """Whether body ``StridedSlice`` ``node`` is a view (:func:`lmscore.ir.row_slice_view`)."""
    consts = []
    for ref in list(node.input)[1:4]:
        src = nodes.get(ref.split(":")[0])
        consts.append(_small_int_tensor(src.attr["value"].tensor)
                      if src is not None and src.op == "Const" and "value" in src.attr else None)
    if len(consts) != 3 or "_output_shapes" not in node.attr:
        return False
    recorded = node.attr["_output_shapes"].list.shape
    if len(recorded) != 1 or recorded[0].unknown_rank:
        return False
    attrs = {k: node.attr[k].i for k in ("shrink_axis_mask", "ellipsis_mask", "new_axis_mask")
             if k in node.attr}
    return row_slice_view(attrs, *consts, [d.size for d in recorded[0].dim],
                          _DTYPE_NAMES.get(node.attr["T"].type, "") if "T" in node.attr else "")


def handle_spec(attr: Any) -> tuple[tuple[int, ...], int] | None:
    """The shape and dtype enum a resource placeholder's node records of its variable.

    ``attr`` is the node's attribute map; :mod:`lmscore.tfgraph` writes them as
    ``_handle_shapes`` and ``_handle_dtypes``. None unless both tell one known shape.
    """
    if "_handle_shapes" not in attr or "_handle_dtypes" not in attr:
        return None
    shapes, types = attr["_handle_shapes"].list.shape, attr["_handle_dtypes"].list.type
    if len(shapes) != 1 or len(types) != 1 or shapes[0].unknown_rank:
        return None
    dims = tuple([d.size for d in shapes[0].dim[:]])
    return (dims, types[0]) if all(d >= 0 for d in dims) else None


def _small_int_tensor(t: Any) -> tuple[int | float, ...] | None:
    """Values of a small integer constant, or of a scalar floating-point constant.

    A tensor whose shape is negative or whose packed content does not hold exactly the
    elements of its shape is inconsistent: its value is not decoded (None).
    """
    n = 1
    for d in t.tensor_shape.dim:
        if d.size < 0:
            return None
        n *= d.size
    if t.dtype in (types_pb2.DT_FLOAT, types_pb2.DT_DOUBLE):
        if n != 1:
            return None
        if t.tensor_content:
            fmt = "<f" if t.dtype == types_pb2.DT_FLOAT else "<d"
            if len(t.tensor_content) != struct.calcsize(fmt):
                return None
            return struct.unpack(fmt, t.tensor_content)
        vals = t.float_val if t.dtype == types_pb2.DT_FLOAT else t.double_val
        return (float(vals[0]),) if len(vals) else (0.0,)
    if t.dtype not in (types_pb2.DT_INT32, types_pb2.DT_INT64):
        return None
    if n > _SMALL_CONST:
        return None
    if t.tensor_content:
        # TensorFlow packs tensor_content little-endian; struct reads it without numpy,
        # whose import would be a sixth of the time of ``lms inspect``.
        fmt = f"<{n}{'i' if t.dtype == types_pb2.DT_INT32 else 'q'}"
        if len(t.tensor_content) != struct.calcsize(fmt):
            return None
        return struct.unpack(fmt, t.tensor_content)
    vals = list(t.int_val if t.dtype == types_pb2.DT_INT32 else t.int64_val)
    if not vals:
        return (0,) * n
    if len(vals) > n:
        return None
    if len(vals) < n:  # TensorFlow repeats the last value to fill the shape
        vals += [vals[-1]] * (n - len(vals))
    return tuple(int(v) for v in vals)


#: Per descriptor: (threads inside native_output_silenced, the saved descriptor). The first
#: thread in redirects and the last one out restores, so that threads (the web app's jobs)
#: never restore each other's scratch file.
_SILENCED: dict[int, list[int]] = {}
_SILENCE_LOCK = threading.Lock()


@contextlib.contextmanager
def native_output_silenced(fd: int = 2) -> Iterator[None]:
    """Send file descriptor ``fd`` (2: stderr, 1: stdout) to a scratch file meanwhile.

    TensorFlow's C++ runtime writes log lines (CUDA probing, CPU features, attributes it
    does not know) straight to descriptor 2, and HiGHS prints a debugging line of its MIP
    solver straight to 1; they would break the one-line error and the ``--json`` output
    of the command line. Failures still come back as exceptions.
    """
    stream = sys.stderr if fd == 2 else sys.stdout
    with _SILENCE_LOCK:
        state = _SILENCED.get(fd)
        if state is None:
            try:
                stream.flush()
                saved = os.dup(fd)
                with tempfile.TemporaryFile() as scratch:
                    os.dup2(scratch.fileno(), fd)
            except (OSError, ValueError, AttributeError):  # no descriptor to redirect
                saved = -1
            state = _SILENCED[fd] = [0, saved]
        state[0] += 1
    try:
        yield
    finally:
        with _SILENCE_LOCK:
            state[0] -= 1
            if state[0] == 0:
                del _SILENCED[fd]
                if state[1] >= 0:
                    with contextlib.suppress(OSError, ValueError, AttributeError):
                        stream.flush()
                    os.dup2(state[1], fd)
                    os.close(state[1])


def _tfgraph(source: str) -> Any:
    """Import :mod:`lmscore.tfgraph` (and TensorFlow) without TensorFlow's log lines."""
    try:
        with native_output_silenced():
            from . import tfgraph
    except ImportError as e:
        raise GraphError(f"{source}: TensorFlow is needed to read this graph but cannot be "
                         f"imported ({_one_line(e)})") from None
    return tfgraph


def _add_shapes_with_tensorflow(gd: Any, source: str) -> Any:
    """Run TensorFlow's shape inference on a GraphDef that lacks ``_output_shapes``."""
    tfgraph = _tfgraph(source)
    with native_output_silenced():
        data = tfgraph.graphdef_with_shapes(gd.SerializeToString(), source=source)
    out = graph_pb2.GraphDef()
    out.ParseFromString(data)
    return out


def _load_saved_model(path: pathlib.Path, function: str | None, max_ops: int | None = None
                      ) -> Graph:
    if not (path / "saved_model.pb").exists() and not (path / "saved_model.pbtxt").exists():
        raise GraphError(f"{path}: not a SavedModel directory (no saved_model.pb)")
    tfgraph = _tfgraph(str(path))
    with native_output_silenced():
        data = tfgraph.graphdef_from_saved_model(str(path), function)
    return from_graphdef_bytes(data, source=str(path), text=False, max_ops=max_ops)


def _load_zipped_saved_model(path: pathlib.Path, function: str | None,
                             max_ops: int | None = None) -> Graph:
    import zlib

    with tempfile.TemporaryDirectory(prefix="lms-savedmodel-") as tmp:
        root = pathlib.Path(tmp).resolve()
        try:
            with zipfile.ZipFile(path) as zf:
                total = sum(info.file_size for info in zf.infolist())
                if total > _MAX_UNZIPPED:
                    raise GraphError(f"{path}: the zip archive would unpack to {total} bytes "
                                     f"(limit {_MAX_UNZIPPED})")
                for info in zf.infolist():
                    target = (root / info.filename).resolve()
                    if not target.is_relative_to(root):
                        raise GraphError(
                            f"{path}: zip member {info.filename!r} escapes the archive"
                        )
                zf.extractall(root)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, zlib.error,
                ValueError, NotImplementedError, RuntimeError) as e:  # RuntimeError: encrypted
            raise GraphError(f"{path}: unreadable zip archive ({_one_line(e)})") from None
        candidates = sorted(p.parent for p in root.rglob("saved_model.pb"))
        if not candidates:
            raise GraphError(f"{path}: the zip archive holds no SavedModel (no saved_model.pb)")
        try:
            graph = _load_saved_model(candidates[0], function, max_ops)
        except GraphError as e:  # name the archive, not the scratch directory it is gone from
            raise GraphError(str(e).replace(str(root), str(path))) from None
    return graph.replace(graph.ops, source=str(path))


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def from_function(fn: Any, *specs: Any) -> Graph:
    """Import a ``tf.function`` (traced with ``specs``) or a ConcreteFunction.

    Parameters
    ----------
    fn : tf.function or ConcreteFunction
        The training step.
    *specs : tf.TensorSpec
        Input signature when ``fn`` is a polymorphic ``tf.function``.

    Returns
    -------
    Graph
    """
    from . import tfgraph

    data = tfgraph.graphdef_from_function(fn, *specs)
    return from_graphdef_bytes(data, source=getattr(fn, "__name__", "<function>"), text=False)


def from_keras(model: Any, loss: Any, optimizer: Any, x_spec: Any, y_spec: Any) -> Graph:
    """Import a Keras model as a custom-training-loop step (forward, gradients, update).

    Parameters
    ----------
    model : keras.Model
    loss : callable or str
        ``loss(y_true, y_pred)``, e.g. a ``keras.losses.Loss``, or a name ``model.compile``
        accepts (``"sparse_categorical_crossentropy"``), resolved as it does.
    optimizer : keras.optimizers.Optimizer or str
        The optimizer, or its Keras name (``"adam"``).
    x_spec, y_spec : tf.TensorSpec
        Input and label specs, batch dimension ``None``.

    Returns
    -------
    Graph

    Raises
    ------
    ConfigError
        If ``loss`` or ``optimizer`` is a name Keras does not know.
    """
    from . import tfgraph

    data = tfgraph.graphdef_from_keras(model, loss, optimizer, x_spec, y_spec)
    return from_graphdef_bytes(data, source=getattr(model, "name", "<keras model>"), text=False)


def iter_tensors(graph: Graph) -> Iterable[tuple[str, TensorSpec]]:
    """Yield ``("op:port", spec)`` for every output of every op, in source order."""
    for op in graph.ops:
        for port, spec in enumerate(op.outputs):
            yield f"{op.name}:{port}", spec
