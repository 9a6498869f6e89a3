"""Generate a corpus of hostile inputs for the importer, the simulator and the plan reader.

Usage::

    python tests/hostile/make_corpus.py OUTDIR [--truncations N] [--bitflips N] [--with-tf]

Everything is derived deterministically from ``sample_graphs/mlp.pb`` and fixed seeds, so
the same arguments give byte-identical files. Each case has a class (``truncated``,
``bitflip``, ``cycle``, ``plan``...), a path under OUTDIR and the outcomes allowed for it:
``"ok"`` (the graph loads and simulates, or the plan applies) or the name of an
:class:`lmscore.errors.LmsError` subclass. :func:`generate` returns the cases; the script
also writes ``OUTDIR/manifest.json``.

Cases that need TensorFlow (a SavedModel built with it, or a GraphDef without
``_output_shapes``, which TensorFlow must complete) have ``tf=True``; SavedModels built
with TensorFlow are only generated when ``with_tf`` is true.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import random
import struct
import sys
import zipfile
from collections.abc import Iterable, Sequence

from tensorboard.compat.proto import (
    event_pb2,
    function_pb2,
    graph_pb2,
    meta_graph_pb2,
    node_def_pb2,
    summary_pb2,
    tensor_pb2,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from lmscore.samples import sample_dir  # noqa: E402

OK, GRAPH, PLAN = "ok", "GraphError", "PlanError"
DT_FLOAT, DT_INT32, DT_STRING, DT_INT64, DT_RESOURCE, DT_VARIANT = 1, 3, 7, 9, 20, 21


@dataclasses.dataclass(frozen=True)
class Case:
    """One hostile input and what lmscore must make of it.

    Attributes
    ----------
    name : str
        Unique, ``"class/label"``.
    cls : str
        Class of hostility (for counting).
    path : str
        File or directory, relative to the corpus directory.
    expect : tuple of str
        Allowed outcomes: ``"ok"`` or LmsError subclass names.
    kind : str
        ``"graph"``: load the path and simulate; ``"plan"``: apply the plan at ``path`` to
        the graph at ``graph``.
    graph : str
        For plan cases: the graph file (absolute) the plan is applied to.
    tf : bool
        TensorFlow is needed to get to the outcome.
    message : str
        A substring the error message must contain (empty: no check).
    """

    name: str
    cls: str
    path: str
    expect: tuple[str, ...]
    kind: str = "graph"
    graph: str = ""
    tf: bool = False
    message: str = ""


def mlp_bytes() -> bytes:
    """The bundled MLP training step, the base of truncations and bit flips."""
    return (sample_dir() / "mlp.pb").read_bytes()


# --- GraphDef building blocks -------------------------------------------------------------


def add_node(
    gd: object,
    name: str,
    op: str,
    inputs: Iterable[str] = (),
    shapes: Sequence[Sequence[int] | None] | None = ((4,),),
    dtype: int = DT_FLOAT,
) -> object:
    """Append a node with ``T``/``dtype`` attributes and ``_output_shapes`` (None: omitted)."""
    n = gd.node.add(name=name, op=op)
    n.input.extend(inputs)
    n.attr["T"].type = dtype
    n.attr["dtype"].type = dtype
    if shapes is not None:
        lst = n.attr["_output_shapes"].list
        lst.SetInParent()
        for s in shapes:
            sh = lst.shape.add()
            if s is None:
                sh.unknown_rank = True
            else:
                for d in s:
                    sh.dim.add(size=d)
    return n


def add_const(
    gd: object,
    name: str,
    dtype: int,
    dims: Sequence[int],
    values: Sequence[float] = (),
    content: bytes = b"",
) -> object:
    """Append a ``Const`` whose value has ``dims``, ``values`` and/or ``tensor_content``."""
    n = gd.node.add(name=name, op="Const")
    t = n.attr["value"].tensor
    t.dtype = dtype
    t.tensor_shape.SetInParent()
    for d in dims:
        t.tensor_shape.dim.add(size=d)
    if content:
        t.tensor_content = content
    if dtype == DT_INT32:
        t.int_val.extend(int(v) for v in values)
    elif dtype == DT_INT64:
        t.int64_val.extend(int(v) for v in values)
    elif dtype == DT_FLOAT:
        t.float_val.extend(float(v) for v in values)
    n.attr["dtype"].type = dtype
    sh = n.attr["_output_shapes"].list.shape.add()
    for d in dims:
        sh.dim.add(size=d)
    return n


def graph(*nodes: tuple) -> bytes:
    """Serialize a GraphDef of ``(name, op, inputs[, shapes[, dtype]])`` tuples."""
    gd = graph_pb2.GraphDef()
    for spec in nodes:
        add_node(gd, *spec)
    return gd.SerializeToString()


def step_skeleton(gd: object) -> None:
    """A feed ``x``, a resource ``v`` and an update ``u = Assign(v, x * x)``: a tiny step."""
    add_node(gd, "x", "Placeholder", shapes=((-1, 4),))
    add_node(gd, "v", "Placeholder", shapes=((),), dtype=DT_RESOURCE)
    add_node(gd, "sq", "Mul", ["x", "x"], shapes=((-1, 4),))
    add_node(gd, "u", "AssignAddVariableOp", ["v", "sq"], shapes=())


# --- the generator --------------------------------------------------------------------------


class _Writer:
    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.cases: list[Case] = []

    def file(self, cls: str, label: str, data: bytes | str, expect: str | tuple[str, ...],
             *, suffix: str = ".pb", message: str = "", tf: bool = False) -> pathlib.Path:
        path = self.root / cls / f"{label}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        self.add(cls, label, path, expect, message=message, tf=tf)
        return path

    def add(self, cls: str, label: str, path: pathlib.Path, expect: str | tuple[str, ...],
            *, message: str = "", tf: bool = False, kind: str = "graph",
            graph: str = "") -> None:
        expect = (expect,) if isinstance(expect, str) else tuple(expect)
        self.cases.append(Case(
            f"{cls}/{label}", cls, str(path.relative_to(self.root)), expect, kind, graph, tf,
            message,
        ))


def generate(
    outdir: str | os.PathLike[str],
    *,
    truncations: int = 30,
    bitflips: int = 30,
    with_tf: bool = False,
) -> list[Case]:
    """Write the corpus into ``outdir`` (created) and return its cases.

    Parameters
    ----------
    outdir : path-like
    truncations : int
        Number of cut points of ``mlp.pb`` (spread over the whole file, plus the first bytes).
    bitflips : int
        Number of bit-flipped copies (seeds 0..bitflips-1, 1 to 8 bits each).
    with_tf : bool
        Also build SavedModels with TensorFlow (missing variables, missing parts).
    """
    root = pathlib.Path(outdir)
    root.mkdir(parents=True, exist_ok=True)
    w = _Writer(root)
    base = mlp_bytes()
    _truncated(w, base, truncations)
    _bitflips(w, base, bitflips)
    _other_messages(w, base)
    _text_and_empty(w, base)
    _structure(w)
    _dtypes_and_shapes(w)
    _huge(w)
    _library(w)
    _semantic(w)
    _special_files(w)
    _zips(w)
    _saved_models(w, with_tf)
    _plans(w)
    names = [c.name for c in w.cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return w.cases


def _truncated(w: _Writer, base: bytes, n: int) -> None:
    cuts = {1, 2, 3, 7, 16, len(base) - 1}
    for k in range(1, n + 1):
        cuts.add(k * len(base) // (n + 1))
    for k, cut in enumerate(sorted(cuts)[:max(n, 0)]):
        w.file("truncated", f"{k:04d}_at_{cut}", base[:cut], (GRAPH, OK))


def _bitflips(w: _Writer, base: bytes, n: int) -> None:
    for seed in range(n):
        rng = random.Random(seed)
        data = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
        w.file("bitflip", f"seed_{seed:04d}", bytes(data), (GRAPH, OK))


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of ``n`` (negative values as their 64-bit two's complement)."""
    n &= 2**64 - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _saved_model_proto(meta_graphs: Sequence[bytes]) -> bytes:
    """``SavedModel{saved_model_schema_version: 1, meta_graphs: [...]}`` encoded by hand."""
    out = b"\x08\x01"
    for mg in meta_graphs:
        out += b"\x12" + varint(len(mg)) + mg
    return out


def _meta_graph(base: bytes) -> bytes:
    mg = meta_graph_pb2.MetaGraphDef()
    mg.meta_info_def.meta_graph_version = "v1"
    mg.meta_info_def.tags.append("serve")
    mg.graph_def.ParseFromString(base)
    return mg.SerializeToString()


def _other_messages(w: _Writer, base: bytes) -> None:
    s = summary_pb2.Summary()
    s.value.add(tag="loss", simple_value=0.25)
    s.value.add(tag="accuracy", simple_value=0.75)
    w.file("other_message", "summary", s.SerializeToString(), GRAPH)
    ev = event_pb2.Event(wall_time=1.0, step=3)
    ev.summary.CopyFrom(s)
    w.file("other_message", "event", ev.SerializeToString(), GRAPH)
    mg = _meta_graph(base)
    w.file("other_message", "meta_graph_def", mg, GRAPH)
    w.file("other_message", "saved_model_proto", _saved_model_proto([mg]), GRAPH)
    nd = node_def_pb2.NodeDef(name="dense/MatMul", op="MatMul", input=["x", "w"])
    w.file("other_message", "node_def", nd.SerializeToString(), GRAPH)
    fd = function_pb2.FunctionDefLibrary()
    fd.function.add().signature.name = "f"
    w.file("other_message", "function_library", fd.SerializeToString(), GRAPH)
    t = tensor_pb2.TensorProto(dtype=DT_FLOAT)
    t.tensor_shape.dim.add(size=3)
    t.float_val.extend([1.0, 2.0, 3.0])
    w.file("other_message", "tensor_proto", t.SerializeToString(), GRAPH)
    w.file("other_message", "summary_as_pbtxt", str(s), GRAPH, suffix=".pbtxt",
           message="not a GraphDef")


def _text_and_empty(w: _Writer, base: bytes) -> None:
    w.file("text", "notes", "these are my notes, not a graph\n" * 40, GRAPH)
    w.file("text", "json", json.dumps({"node": [{"name": "a", "op": "Relu"}]}), GRAPH)
    w.file("text", "csv", "step,loss\n1,0.5\n2,0.25\n", GRAPH, suffix=".txt")
    w.file("text", "utf16", "node { name: 'a' op: 'Relu' }".encode("utf-16"), GRAPH)
    w.file("text", "latin1_pbtxt", b'node { name: "caf\xe9" op: "Relu" }', GRAPH,
           suffix=".pbtxt")
    w.file("text", "unclosed_pbtxt", 'node { name: "a" op: "Const" attr { key: ', GRAPH,
           suffix=".pbtxt")
    w.file("text", "wrong_field_pbtxt", 'node { name: "a" opp: "Relu" }', GRAPH, suffix=".pbtxt")
    w.file("text", "random_binary", random.Random(7).randbytes(4096), GRAPH)
    gd = graph_pb2.GraphDef()
    gd.ParseFromString(base)
    from google.protobuf import text_format

    w.file("text", "mlp_pbtxt", text_format.MessageToString(gd), OK, suffix=".pbtxt")
    w.file("empty", "zero_bytes", b"", GRAPH, message="no nodes")
    w.file("empty", "zero_bytes_pbtxt", b"", GRAPH, suffix=".pbtxt", message="no nodes")
    w.file("empty", "one_nul", b"\0", GRAPH)
    w.file("empty", "newlines", b"\n\n\n", GRAPH)
    w.file("empty", "spaces_pbtxt", b"   \n\t ", GRAPH, suffix=".pbtxt", message="no nodes")
    gd = graph_pb2.GraphDef()
    gd.versions.producer = 1994
    w.file("zero_nodes", "versions_only", gd.SerializeToString(), GRAPH, message="no nodes")
    gd.library.function.add().signature.name = "lonely"
    w.file("zero_nodes", "library_only", gd.SerializeToString(), GRAPH, message="no nodes")
    w.file("zero_nodes", "versions_pbtxt", "versions { producer: 3 }", GRAPH, suffix=".pbtxt",
           message="no nodes")


def _structure(w: _Writer) -> None:
    cyc = "cycle"
    w.file(cyc, "data", graph(("a", "Placeholder", []), ("b", "AddV2", ["a", "c"]),
                              ("c", "Relu", ["b"])), GRAPH, message="cycle")
    w.file(cyc, "control", graph(("a", "Placeholder", []), ("b", "Relu", ["a", "^c"]),
                                 ("c", "NoOp", ["^b"], ())), GRAPH, message="cycle")
    w.file(cyc, "self_data", graph(("a", "Relu", ["a"])), GRAPH, message="cycle")
    w.file(cyc, "self_control", graph(("a", "NoOp", ["^a"], ())), GRAPH, message="cycle")
    w.file(cyc, "mixed", graph(("a", "Placeholder", []), ("b", "Relu", ["a", "^d"]),
                               ("c", "Relu", ["b"]), ("d", "Relu", ["c"])), GRAPH,
           message="cycle")
    long = [("n0", "Relu", ["n999"])] + [(f"n{k}", "Relu", [f"n{k - 1}"]) for k in range(1, 1000)]
    w.file(cyc, "long_1000", graph(*long), GRAPH, message="cycle")
    w.file(cyc, "newline_names", graph(("a\nb", "Relu", ["c\rd"]), ("c\rd", "Relu", ["a\nb"])),
           GRAPH, message="cycle")
    w.file(cyc, "behind_a_valid_part", graph(
        ("x", "Placeholder", []), ("y", "Relu", ["x"]), ("p", "AddV2", ["y", "q"]),
        ("q", "Relu", ["p"]), ("z", "Relu", ["y"])), GRAPH, message="cycle")
    d = "dangling"
    w.file(d, "missing_node", graph(("a", "Placeholder", []), ("b", "Relu", ["ghost"])), GRAPH,
           message="ghost")
    w.file(d, "missing_port", graph(("a", "Placeholder", []), ("b", "Relu", ["a:1"])), GRAPH,
           message="output")
    w.file(d, "huge_port", graph(("a", "Placeholder", []), ("b", "Relu", ["a:4294967296"])),
           GRAPH, message="output")
    w.file(d, "port_5000_digits", graph(("a", "Placeholder", []),
                                        ("b", "Relu", ["a:" + "9" * 5000])), GRAPH)
    w.file(d, "unicode_digit_port", graph(("a", "Placeholder", []), ("b", "Relu", ["a:\u00b2"])),
           GRAPH)
    w.file(d, "arabic_digit_port", graph(("a", "Placeholder", []),
                                         ("b", "Relu", ["a:\u0661"])), GRAPH)
    w.file(d, "negative_port", graph(("a", "Placeholder", []), ("b", "Relu", ["a:-1"])), GRAPH)
    w.file(d, "empty_input", graph(("a", "Placeholder", []), ("b", "Relu", [""])), GRAPH)
    w.file(d, "bare_caret", graph(("a", "Placeholder", []), ("b", "Relu", ["a", "^"])), GRAPH)
    w.file(d, "missing_control", graph(("a", "Placeholder", []), ("b", "Relu", ["a", "^ghost"])),
           GRAPH, message="ghost")
    w.file(d, "port_of_no_output_op", graph(("a", "NoOp", [], ()), ("b", "Relu", ["a"])), GRAPH)
    dup = "duplicate"
    w.file(dup, "two_nodes", graph(("a", "Placeholder", []), ("a", "Relu", ["a"])), GRAPH,
           message="duplicate")
    w.file(dup, "far_apart", graph(*([("x", "Placeholder", [])]
                                     + [(f"n{k}", "Relu", ["x"]) for k in range(500)]
                                     + [("x", "Relu", ["n3"])])), GRAPH, message="duplicate")
    nm = "names"
    w.file(nm, "empty_name", graph(("", "Placeholder", [])), GRAPH, message="empty name")
    w.file(nm, "no_op_type", graph(("a", "", [])), GRAPH, message="no op type")
    w.file(nm, "nul_and_newline", graph(("a\0b", "Placeholder", []), ("c\nd", "Relu", ["a\0b"])),
           OK)
    w.file(nm, "colons", graph(("a:0", "Placeholder", []), ("b", "Relu", ["a:0:0"])), OK)
    w.file(nm, "name_50k", graph(("n" * 50_000, "Placeholder", []),
                                 ("b", "Relu", ["n" * 50_000])), OK)
    unk = "unknown_op"
    w.file(unk, "with_shapes", graph(("a", "Placeholder", []), ("b", "FooBarBaz", ["a"]),
                                     ("c", "Relu", ["b"])), OK)
    w.file(unk, "three_outputs", graph(("a", "Placeholder", []),
                                       ("b", "FooBarBaz", ["a"], ((4,), (2, 2), None)),
                                       ("c", "AddV2", ["b:1", "b:2"])), OK)
    w.file(unk, "without_shapes", graph(("a", "Placeholder", []), ("b", "FooBarBaz", ["a"], None)),
           GRAPH, tf=True, message="FooBarBaz")


def _dtypes_and_shapes(w: _Writer) -> None:
    dt = "unknown_dtype"
    for label, value in (("999", 999), ("negative", -3), ("int32_max", 2**31 - 1),
                         ("ref_float", 101), ("variant", DT_VARIANT), ("string", DT_STRING)):
        w.file(dt, label, graph(("a", "Placeholder", [], ((-1, 4),), value),
                                ("b", "Relu", ["a"], ((-1, 4),), value)), OK)
    gd = graph_pb2.GraphDef()
    n = add_node(gd, "a", "Placeholder", shapes=((3,), (3,)))
    n.attr["Tout"].list.type.extend([999, -7])
    add_node(gd, "s", "IdentityN", ["a:0", "a:1"], shapes=((3,), (3,)))
    w.file(dt, "type_list", gd.SerializeToString(), OK)
    sh = "absurd_shape"
    for label, dims in (("minus_five", (-5, 4)), ("minus_two", (4, -2)),
                        ("int64_min", (-(2**63), 1))):
        w.file(sh, label, graph(("a", "Placeholder", [], (dims,))), GRAPH, message="invalid shape")
    for label, dims in (("three_2_40", (2**40, 2**40, 2**40)), ("int64_max", (2**63 - 1, 8)),
                        ("two_2_31", (2**31, 2**31, 2**31))):
        w.file(sh, label, graph(("a", "Placeholder", [], (dims,))), GRAPH, message="bytes")
    w.file(sh, "zero_dims", graph(("a", "Placeholder", [], ((0, 4),)),
                                  ("b", "Relu", ["a"], ((0, 4),))), OK)
    w.file(sh, "unknown_rank", graph(("a", "Placeholder", [], (None,)),
                                     ("b", "Relu", ["a"], (None,))), OK)
    w.file(sh, "rank_1000", graph(("a", "Placeholder", [], ((1,) * 1000,))), OK)
    gd = graph_pb2.GraphDef()
    n = add_node(gd, "v", "VarHandleOp", shapes=((),), dtype=DT_RESOURCE)
    n.attr["dtype"].type = DT_FLOAT
    for d in (2**40, 2**40):
        n.attr["shape"].shape.dim.add(size=d)
    add_node(gd, "r", "ReadVariableOp", ["v"], shapes=((-1, -1),))
    w.file(sh, "variable_2_80_bytes", gd.SerializeToString(), GRAPH, message="bytes")
    gd = graph_pb2.GraphDef()
    n = add_node(gd, "v", "VarHandleOp", shapes=((),), dtype=DT_RESOURCE)
    n.attr["dtype"].type = DT_FLOAT
    for d in (-4, 3):
        n.attr["shape"].shape.dim.add(size=d)
    w.file(sh, "variable_negative_dims", gd.SerializeToString(), GRAPH, message="shape")
    gd = graph_pb2.GraphDef()
    add_const(gd, "c", DT_INT32, (-3,), (1, 2, 3))
    add_node(gd, "r", "Relu", ["c"], shapes=((3,),), dtype=DT_INT32)
    w.file(sh, "const_negative_dims", gd.SerializeToString(), GRAPH, message="shape")
    gd = graph_pb2.GraphDef()
    add_const(gd, "shape", DT_INT32, (2,), (-7, 3))
    add_const(gd, "one", DT_FLOAT, (), (1.0,))
    add_node(gd, "f", "Fill", ["shape", "one"], shapes=((-1, 3),))
    w.file(sh, "fill_negative_dims", gd.SerializeToString(), GRAPH, message="negative")
    gd = graph_pb2.GraphDef()
    add_node(gd, "x", "Placeholder", shapes=((-1, 4),))
    add_const(gd, "shape", DT_INT32, (2,), (-7, -2))
    add_node(gd, "r", "Reshape", ["x", "shape"], shapes=((-1, -1),))
    w.file(sh, "reshape_two_negatives", gd.SerializeToString(), (OK, GRAPH))
    gd = graph_pb2.GraphDef()
    add_const(gd, "shape", DT_INT64, (3,), (2**40, 2**40, 2**40))
    add_const(gd, "one", DT_FLOAT, (), (1.0,))
    add_node(gd, "f", "Fill", ["shape", "one"], shapes=((-1, -1, -1),))
    w.file(sh, "fill_2_120", gd.SerializeToString(), GRAPH, message="bytes")


def _huge(w: _Writer) -> None:
    h = "huge_attr"
    gd = graph_pb2.GraphDef()
    add_node(gd, "a", "Placeholder")
    add_node(gd, "b", "Relu", ["a"]).attr["blob"].s = b"\xff" * (50 * 2**20)
    w.file(h, "string_50mb", gd.SerializeToString(), OK)
    gd = graph_pb2.GraphDef()
    add_node(gd, "a", "Placeholder", shapes=((1,) * 10**6,))
    w.file(h, "shape_1e6_dims", gd.SerializeToString(), OK)
    gd = graph_pb2.GraphDef()
    n = add_node(gd, "a", "Placeholder")
    n.attr["ksize"].list.i.extend(range(10**6))
    w.file(h, "int_list_1e6", gd.SerializeToString(), OK)
    gd = graph_pb2.GraphDef()
    add_node(gd, "a", "Placeholder")
    add_node(gd, "b", "FooBarBaz", ["a"], shapes=[(1,)] * 10**5)
    add_node(gd, "c", "AddV2", ["b:0", "b:99999"], shapes=((1,),))
    w.file(h, "outputs_1e5", gd.SerializeToString(), OK)
    for label, count in (("num_split_1e12", 10**12), ("num_split_negative", -5),
                         ("num_split_int64_max", 2**63 - 1)):
        gd = graph_pb2.GraphDef()
        add_node(gd, "a", "Placeholder", shapes=((8,),))
        add_const(gd, "axis", DT_INT32, (), (0,))
        n = add_node(gd, "s", "Split", ["axis", "a"], shapes=((4,), (4,)))
        n.attr["num_split"].i = count
        add_node(gd, "b", "AddV2", ["s:0", "s:1"])
        w.file(h, label, gd.SerializeToString(), OK)
    gd = graph_pb2.GraphDef()
    add_const(gd, "c", DT_INT32, (4,), content=b"\1\0\0\0" * (12 * 2**20))
    add_node(gd, "r", "Reshape", ["c", "c"], shapes=((-1,),), dtype=DT_INT32)
    w.file(h, "const_content_48mb", gd.SerializeToString(), OK)
    gd = graph_pb2.GraphDef()
    n = add_const(gd, "s", DT_STRING, (3,))
    n.attr["value"].tensor.string_val.extend([b"x" * 2**20, b"\xff" * 10, b""])
    w.file(h, "string_const", gd.SerializeToString(), OK)
    gd = graph_pb2.GraphDef()
    for k in range(20_000):
        add_node(gd, f"n{k}", "Relu" if k else "Placeholder", [f"n{k - 1}"] if k else [])
    w.file(h, "nodes_20k_chain", gd.SerializeToString(), OK)
    gd = graph_pb2.GraphDef()
    add_node(gd, "a", "Placeholder")
    add_node(gd, "b", "AddN", ["a"] * 100_000)
    w.file(h, "inputs_1e5", gd.SerializeToString(), OK)


def _library(w: _Writer) -> None:
    lib = "deep_library"
    gd = graph_pb2.GraphDef()
    for k in range(1000):
        f = gd.library.function.add()
        f.signature.name = f"f{k}"
        f.signature.input_arg.add(name="x", type=DT_FLOAT)
        f.signature.output_arg.add(name="y", type=DT_FLOAT)
        call = f.node_def.add(name="call", op="PartitionedCall", input=["x"])
        call.attr["f"].func.name = f"f{k + 1}" if k < 999 else "f0"
        f.ret["y"] = "call:output:0"
    add_node(gd, "x", "Placeholder")
    n = add_node(gd, "call", "PartitionedCall", ["x"])
    n.attr["f"].func.name = "f0"
    add_node(gd, "y", "Relu", ["call"])
    w.file(lib, "functions_1000_recursive", gd.SerializeToString(), OK)
    gd = graph_pb2.GraphDef()
    f = gd.library.function.add()
    f.signature.name = "body"
    f.signature.input_arg.add(name="l", type=DT_VARIANT)
    f.node_def.add(name="push", op="TensorListPushBack", input=["l"])  # one input only
    f.node_def.add(name="push2", op="TensorListPushBack", input=["ghost", "nowhere:0"])
    add_node(gd, "x", "Placeholder", dtype=DT_VARIANT)
    n = add_node(gd, "w", "While", ["x"], dtype=DT_VARIANT)
    n.attr["body"].func.name = "body"
    w.file(lib, "broken_loop_body", gd.SerializeToString(), OK)
    # An attribute nested 2000 deep (func -> attr -> func ...), binary and text.
    gd = graph_pb2.GraphDef()
    add_node(gd, "a", "Placeholder")
    value = b""  # AttrValue{func: NameAttrList{name: "n", attr: {"k": <value>}}}, nested
    for _ in range(2000):
        entry = b"\x0a\x01k\x12" + varint(len(value)) + value
        name_attr = b"\x0a\x01n\x12" + varint(len(entry)) + entry
        value = b"\x52" + varint(len(name_attr)) + name_attr
    entry = b"\x0a\x04deep\x12" + varint(len(value)) + value
    node = b"\x0a\x01b\x12\x04Relu\x1a\x01a" + b"\x2a" + varint(len(entry)) + entry
    data = gd.SerializeToString() + b"\x0a" + varint(len(node)) + node
    w.file(lib, "attr_nested_2000_binary", data, (GRAPH, OK))
    text = ('node { name: "a" op: "Relu" attr { key: "f" value { func { name: "n" '
            + 'attr { key: "k" value { func { name: "n" ' * 3000 + "} } }" * 3000
            + " } } } }")
    w.file(lib, "attr_nested_3000_text", text, GRAPH, suffix=".pbtxt")


def _semantic(w: _Writer) -> None:
    """Well-formed protobufs whose values trip the shape evaluator and the categorizer."""
    s = "semantic"

    def case(label: str, build, expect=OK, message: str = "") -> None:
        gd = graph_pb2.GraphDef()
        build(gd)
        w.file(s, label, gd.SerializeToString(), expect, message=message)

    case("const_content_odd_int", lambda gd: (
        add_const(gd, "c", DT_INT32, (1,), content=b"\1\2\3"),
        add_node(gd, "r", "Reshape", ["c", "c"], shapes=((-1,),), dtype=DT_INT32)))
    case("const_content_odd_float", lambda gd: add_const(gd, "c", DT_FLOAT, (), content=b"\1\2"))
    case("const_content_too_long", lambda gd: (
        add_const(gd, "c", DT_INT32, (2,), content=b"\1\0\0\0" * 9),
        add_node(gd, "p", "Placeholder", shapes=((-1, -1),)),
        add_node(gd, "r", "Reshape", ["p", "c"], shapes=((-1, -1),))))

    def float_axis(gd):
        add_node(gd, "a", "Placeholder", shapes=((-1, 4),))
        add_const(gd, "ax", DT_FLOAT, (), (0.0,))
        add_node(gd, "c", "ConcatV2", ["a", "a", "ax"], shapes=((-1, 4),))
    case("concat_float_axis", float_axis)

    def float_perm(gd):
        add_node(gd, "a", "Placeholder", shapes=((-1,),))
        add_const(gd, "p", DT_FLOAT, (), (0.0,))
        add_node(gd, "t", "Transpose", ["a", "p"], shapes=((-1,),))
    case("transpose_float_perm", float_perm)

    def perm_oob(gd):
        add_node(gd, "a", "Placeholder", shapes=((2, 4),))
        add_const(gd, "p", DT_INT32, (2,), (5, 0))
        add_node(gd, "t", "Transpose", ["a", "p"], shapes=((4, 2),))
        add_node(gd, "r", "Relu", ["t"], shapes=((4, 2),))
    case("transpose_perm_out_of_range", perm_oob, GRAPH, message="perm")

    def perm_rank(gd):  # the recorded output rank disagrees with the input's
        add_node(gd, "a", "Placeholder", shapes=((2, 4),))
        add_const(gd, "p", DT_INT32, (2,), (3, 0))
        add_node(gd, "t", "Transpose", ["a", "p"], shapes=((4, 2, 1),))
    case("transpose_perm_other_rank", perm_rank, GRAPH, message="perm")

    def empty_operands(op, n_in, out_shape=((-1,),)):
        def build(gd):
            add_const(gd, "e", DT_INT32, (0,))
            add_const(gd, "o", DT_INT32, (1,), (1,))
            ins = ["o"] * (n_in - 1) + ["e"]
            add_node(gd, "r", op, ins, shapes=out_shape, dtype=DT_INT32)
            add_node(gd, "r2", op, ["e"] + ["o"] * (n_in - 1), shapes=out_shape, dtype=DT_INT32)
        return build
    for op, n_in in (("Range", 3), ("Fill", 2), ("StridedSlice", 4), ("AddV2", 2),
                     ("FloorDiv", 2), ("Pack", 2), ("Prod", 2), ("Max", 2), ("GatherV2", 3),
                     ("DynamicStitch", 4), ("BroadcastGradientArgs", 2), ("Squeeze", 1),
                     ("TensorListReserve", 2), ("ConcatV2", 3), ("Tile", 2),
                     ("BroadcastTo", 2), ("Reshape", 2)):
        case(f"empty_operand_{op}", empty_operands(op, n_in))

    def ints_op(op, values, out=((-1,),)):
        def build(gd):
            names = []
            for k, v in enumerate(values):
                big = any(abs(x) >= 2**31 for x in v)
                add_const(gd, f"c{k}", DT_INT64 if big else DT_INT32, (len(v),), v)
                names.append(f"c{k}")
            add_node(gd, "r", op, names, shapes=out, dtype=DT_INT32)
        return build
    case("range_huge", ints_op("Range", [(0,), (2**62,), (1,)]))
    case("range_negative_step", ints_op("Range", [(10,), (0,), (-1,)]))
    case("floordiv_by_zero", ints_op("FloorDiv", [(4,), (0,)]))
    case("strided_zero_stride", ints_op("StridedSlice", [(1, 2), (0,), (1,), (0,)]))
    case("gather_out_of_range", ints_op("GatherV2", [(1, 2), (7,), (0,)]))
    case("stitch_holes", ints_op("DynamicStitch", [(0,), (5,), (1,), (2,)]))
    case("fill_huge_count", ints_op("Fill", [(10**12,), (1,)]))

    def assign_one_input(gd):
        add_node(gd, "v", "Placeholder", shapes=((),), dtype=DT_RESOURCE)
        add_node(gd, "u", "AssignAddVariableOp", ["v"], shapes=())
        add_node(gd, "a", "ResourceApplyGradientDescent", ["v"], shapes=())
    case("update_with_one_input", assign_one_input)

    def lone_ones_like(gd):
        step_skeleton(gd)
        add_node(gd, "o", "OnesLike", [], shapes=((-1, 4),))
        add_node(gd, "m", "Mul", ["sq", "o"], shapes=((-1, 4),))
        add_node(gd, "u2", "AssignAddVariableOp", ["v", "m"], shapes=())
        add_node(gd, "sink", "Relu", ["o"], shapes=((-1, 4),))
    case("ones_like_without_input", lone_ones_like)

    def fill_chain(gd):
        step_skeleton(gd)
        add_const(gd, "one", DT_FLOAT, (), (1.0,))
        add_const(gd, "shape", DT_INT32, (1,), (4,))
        prev = "one"
        for k in range(3000):
            add_node(gd, f"f{k}", "Fill", ["shape", prev])
            prev = f"f{k}"
        add_node(gd, "m", "Mul", ["sq", prev], shapes=((-1, 4),))
        add_node(gd, "u2", "AssignAddVariableOp", ["v", "m"], shapes=())
    case("fill_chain_3000", fill_chain)

    def list_stack_no_output(gd):
        add_const(gd, "es", DT_INT32, (1,), (4,))
        add_const(gd, "n", DT_INT32, (), (3,))
        n = add_node(gd, "l", "TensorListReserve", ["es", "n"], shapes=((),), dtype=DT_VARIANT)
        n.attr["element_dtype"].type = DT_FLOAT
        add_node(gd, "w", "While", ["l"], shapes=((),), dtype=DT_VARIANT)
        add_node(gd, "s", "TensorListStack", ["w", "es"], shapes=())
    case("list_stack_without_outputs", list_stack_no_output)

    def list_negative(gd):
        add_const(gd, "es", DT_INT32, (2,), (-4, -4))
        add_const(gd, "n", DT_INT32, (), (-3,))
        n = add_node(gd, "l", "TensorListReserve", ["es", "n"], shapes=((),), dtype=DT_VARIANT)
        n.attr["element_dtype"].type = DT_FLOAT
        add_node(gd, "w", "While", ["l"], shapes=((),), dtype=DT_VARIANT)
        add_node(gd, "s", "TensorListStack", ["w", "es"], shapes=((-1, -1, -1),))
    case("list_negative_sizes", list_negative)

    def conv_scratch(gd):  # a convolution-gradient workspace is alive at the peak
        add_node(gd, "i", "Placeholder", shapes=((-1, 8, 8, 4),))
        add_node(gd, "fs", "Placeholder", shapes=((4,),), dtype=DT_INT32)
        add_node(gd, "g", "Placeholder", shapes=((-1, 8, 8, 4),))
        add_node(gd, "c", "Conv2DBackpropFilter", ["i", "fs", "g"], shapes=((3, 3, 4, 4),))
    case("conv_grad_scratch", conv_scratch)

    def conv_zero(gd):
        add_node(gd, "i", "Placeholder", shapes=((0, 4, 4, 0),))
        add_node(gd, "fs", "Placeholder", shapes=((4,),), dtype=DT_INT32)
        add_node(gd, "g", "Placeholder", shapes=((0, 4, 4, 0),))
        add_node(gd, "c", "Conv2DBackpropFilter", ["i", "fs", "g"], shapes=((3, 3, 0, 0),))
    case("conv_grad_zero_sizes", conv_zero)

    def lms_role_binary(gd):
        add_node(gd, "a", "Placeholder")
        n = add_node(gd, "b", "Identity", ["a"])
        n.attr["_lms_role"].s = b"\xff\xfeswap_out"
        n.attr["_lms_tensor"].s = b"\x80"
    case("lms_role_not_utf8", lms_role_binary)

    def attr_kinds(gd):  # attributes of the wrong kind everywhere the importer looks
        n = add_node(gd, "a", "Placeholder")
        n.attr["shape"].s = b"not a shape"
        n = add_node(gd, "b", "MatMul", ["a", "a"])
        n.attr["transpose_a"].s = b"yes"
        n.attr["transpose_b"].list.i.extend([1, 2])
        n = add_node(gd, "c", "StridedSlice", ["a", "a", "a", "a"])
        n.attr["shrink_axis_mask"].f = 1.5
        n = add_node(gd, "d", "While", ["a"])
        n.attr["body"].i = 3
        n = add_node(gd, "e", "Split", ["a", "a"], shapes=((2,), (2,)))
        n.attr["num_split"].s = b"2"
        n = add_node(gd, "f", "VarHandleOp", shapes=((),), dtype=DT_RESOURCE)
        n.attr["dtype"].list.type.append(DT_FLOAT)
    case("attributes_of_the_wrong_kind", attr_kinds)


def _special_files(w: _Writer) -> None:
    sp = "special_file"
    d = w.root / sp
    d.mkdir(parents=True, exist_ok=True)
    (d / "plain_dir").mkdir(exist_ok=True)
    (d / "plain_dir" / "readme.txt").write_text("no model here\n")
    w.add(sp, "dir_not_saved_model", d / "plain_dir", GRAPH, message="SavedModel")
    fifo = d / "fifo.pb"
    if hasattr(os, "mkfifo") and not fifo.exists():
        os.mkfifo(fifo)
    if fifo.exists():
        w.add(sp, "fifo", fifo, GRAPH, message="regular file")
    link = d / "dev_zero.pb"
    if pathlib.Path("/dev/zero").exists() and not link.is_symlink():
        link.symlink_to("/dev/zero")
    if link.is_symlink():
        w.add(sp, "dev_zero", link, GRAPH, message="regular file")
    dangling = d / "dangling_link.pb"
    if not dangling.is_symlink():
        dangling.symlink_to(d / "nowhere.pb")
    w.add(sp, "dangling_symlink", dangling, GRAPH, message="no such file")
    loop = d / "loop.pb"
    if not loop.is_symlink():
        loop.symlink_to(loop)
    w.add(sp, "symlink_loop", loop, GRAPH)


def _zip(path: pathlib.Path, members: Sequence[tuple[str, bytes]],
         method: int = zipfile.ZIP_DEFLATED) -> bytes:
    with zipfile.ZipFile(path, "w", compression=method) as zf:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = method
            zf.writestr(info, data)
    return path.read_bytes()


def _zips(w: _Writer) -> None:
    z = "zip"
    d = w.root / z
    d.mkdir(parents=True, exist_ok=True)
    readme = [("model/readme.txt", b"hello\n" * 100)]
    _zip(d / "not_saved_model.zip", readme)
    w.add(z, "not_saved_model", d / "not_saved_model.zip", GRAPH, message="no SavedModel")
    _zip(d / "empty.zip", [])
    w.add(z, "empty", d / "empty.zip", GRAPH, message="no SavedModel")
    _zip(d / "empty_dirs.zip", [("model/", b""), ("model/variables/", b"")])
    w.add(z, "only_directories", d / "empty_dirs.zip", GRAPH, message="no SavedModel")
    for label, member in (("dotdot", "../../evil/saved_model.pb"),
                          ("absolute", "/tmp/lms_evil/saved_model.pb"),
                          ("nested_dotdot", "model/../../evil.pb"),
                          ("backslash_dotdot", "..\\..\\evil\\saved_model.pb")):
        _zip(d / f"traversal_{label}.zip", [("model/saved_model.pb", b"x"), (member, b"owned")])
        expect = (GRAPH,)
        w.add(z, f"traversal_{label}", d / f"traversal_{label}.zip", expect,
              tf=label == "backslash_dotdot")
    data = bytearray(_zip(d / "bad_crc.zip", readme, zipfile.ZIP_STORED))
    data[data.index(b"hello")] ^= 0x01  # payload no longer matches its CRC
    (d / "bad_crc.zip").write_bytes(bytes(data))
    w.add(z, "bad_crc", d / "bad_crc.zip", GRAPH)
    data = bytearray(_zip(d / "bad_deflate.zip", [("m/readme.txt", bytes(range(256)) * 64)]))
    start = 30 + len("m/readme.txt")
    data[start:start + 16] = b"\xff" * 16  # an invalid deflate stream
    (d / "bad_deflate.zip").write_bytes(bytes(data))
    w.add(z, "bad_deflate", d / "bad_deflate.zip", GRAPH)
    data = bytearray(_zip(d / "encrypted.zip", readme))
    for sig in (b"PK\x03\x04", b"PK\x01\x02"):  # set the "encrypted" flag bit everywhere
        k = data.index(sig)
        off = k + (6 if sig == b"PK\x03\x04" else 8)
        data[off] |= 1
    (d / "encrypted.zip").write_bytes(bytes(data))
    w.add(z, "encrypted_flag", d / "encrypted.zip", GRAPH)
    data = bytearray(_zip(d / "method_99.zip", readme, zipfile.ZIP_STORED))
    for sig, off in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        k = data.index(sig)
        data[k + off:k + off + 2] = struct.pack("<H", 99)
    (d / "method_99.zip").write_bytes(bytes(data))
    w.add(z, "unknown_compression", d / "method_99.zip", GRAPH)
    data = bytearray(_zip(d / "claims_12gb.zip", [(f"m/part{k}", b"x") for k in range(3)],
                          zipfile.ZIP_STORED))
    k = 0
    while (k := data.find(b"PK\x01\x02", k)) >= 0:  # central directory: 4 GiB each
        data[k + 24:k + 28] = b"\xff\xff\xff\xfe"
        k += 4
    (d / "claims_12gb.zip").write_bytes(bytes(data))
    w.add(z, "claims_12gb", d / "claims_12gb.zip", GRAPH, message="unpack")
    full = _zip(d / "truncated.zip", readme)
    (d / "truncated.zip").write_bytes(full[: len(full) // 2])
    w.add(z, "truncated", d / "truncated.zip", GRAPH)
    _zip(d / "garbage_saved_model.zip", [("m/saved_model.pb", b"garbage" * 10)])
    w.add(z, "garbage_saved_model", d / "garbage_saved_model.zip", GRAPH, tf=True)
    zpb = d / "zip_named.pb"
    _zip(zpb, readme)
    w.add(z, "zip_named_pb", zpb, GRAPH, message="no SavedModel")


def _saved_models(w: _Writer, with_tf: bool) -> None:
    sm = "saved_model"
    d = w.root / sm
    d.mkdir(parents=True, exist_ok=True)
    (d / "empty_dir").mkdir(exist_ok=True)
    w.add(sm, "empty_dir", d / "empty_dir", GRAPH, message="no saved_model.pb")
    for label, data in (("garbage_pb", b"\x00garbage\xff" * 50), ("empty_pb", b""),
                        ("no_meta_graphs", _saved_model_proto([])),
                        ("graph_def_only", _saved_model_proto([_meta_graph(mlp_bytes())]))):
        (d / label).mkdir(exist_ok=True)
        (d / label / "saved_model.pb").write_bytes(data)
        w.add(sm, label, d / label, GRAPH, tf=True)
    (d / "garbage_pbtxt").mkdir(exist_ok=True)
    (d / "garbage_pbtxt" / "saved_model.pbtxt").write_text("meta_graphs { oops")
    w.add(sm, "garbage_pbtxt", d / "garbage_pbtxt", GRAPH, tf=True)
    if with_tf:
        _tf_saved_models(w, d)


def _tf_saved_models(w: _Writer, d: pathlib.Path) -> None:
    """SavedModels written by TensorFlow, then damaged."""
    import shutil

    import tensorflow as tf

    class Step(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(tf.ones([4, 2]))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
        def train_step(self, x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.matmul(x, self.w))
            self.w.assign_sub(0.1 * tape.gradient(loss, self.w))
            return loss

    good = d / "good"
    if not good.exists():
        tf.saved_model.save(Step(), str(good))
    w.add("saved_model", "good", good, OK, tf=True)
    damaged = {
        "missing_variables": lambda p: shutil.rmtree(p / "variables"),
        "missing_variables_data": lambda p: [
            f.unlink() for f in (p / "variables").glob("variables.data*")],
        "garbage_variables_index": lambda p: (p / "variables" / "variables.index").write_bytes(
            b"\0" * 64),
        "truncated_saved_model_pb": lambda p: (p / "saved_model.pb").write_bytes(
            (p / "saved_model.pb").read_bytes()[:200]),
        "bitflipped_saved_model_pb": lambda p: _flip_file(p / "saved_model.pb", 11),
    }
    for label, damage in damaged.items():
        p = d / label
        if not p.exists():
            shutil.copytree(good, p)
            damage(p)
        expect = (GRAPH, OK) if label.startswith(("missing_variables", "garbage_var", "bit")) \
            else GRAPH
        w.add("saved_model", label, p, expect, tf=True)
    zp = d / "missing_variables.zip"
    if not zp.exists():
        with zipfile.ZipFile(zp, "w") as zf:
            for f in sorted((d / "missing_variables").rglob("*")):
                zf.write(f, f.relative_to(d))
    w.add("saved_model", "missing_variables_zip", zp, (GRAPH, OK), tf=True)


def _flip_file(path: pathlib.Path, seed: int) -> None:
    rng = random.Random(seed)
    data = bytearray(path.read_bytes())
    for _ in range(16):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def _plans(w: _Writer) -> None:
    """Plan files applied to ``mlp.pb`` (``lms rewrite mlp.pb --plan PLAN``)."""
    from lmscore.load import load
    from lmscore.plan import fingerprint, plan_from_params

    mlp = str(sample_dir() / "mlp.pb")
    g = load(mlp)
    good = json.loads(plan_from_params(g, 32, threshold=2).to_json())
    assert good["swaps"], "the mlp plan should swap something"
    other = fingerprint(load(sample_dir() / "lstm.pb"))
    tensor = good["swaps"][0]["tensor"]
    consumer = good["swaps"][0]["swap_ins"][0]["consumers"][0]

    def variant(**changes) -> str:
        doc = json.loads(json.dumps(good))
        for k, v in changes.items():
            if v is _DROP:
                doc.pop(k, None)
            else:
                doc[k] = v
        return json.dumps(doc)

    def swap(**changes) -> str:
        s = {"tensor": tensor, "swap_ins": [{"consumers": [consumer], "trigger": None}]}
        s.update(changes)
        return variant(swaps=[s])

    p = "plan"
    d = w.root / p
    d.mkdir(parents=True, exist_ok=True)
    cases: list[tuple[str, bytes | str, str, str]] = [
        ("valid", json.dumps(good), OK, ""),
        ("valid_empty", variant(swaps=[]), OK, ""),
        ("not_json", "threshold = 3\nahead = 1\n", PLAN, "not JSON"),
        ("binary", b"\xff\xfe\x00\x81" * 100, PLAN, ""),
        ("empty", b"", PLAN, "not JSON"),
        ("truncated_json", json.dumps(good)[:60], PLAN, "not JSON"),
        ("array", "[1, 2, 3]", PLAN, "object"),
        ("string", '"plan"', PLAN, "object"),
        ("version_3", variant(version=3), PLAN, "version"),
        ("version_string", variant(version="1"), PLAN, "version"),
        ("version_missing", variant(version=_DROP), PLAN, "version"),
        ("version_float", variant(version=1.5), PLAN, "version"),
        ("graph_missing", variant(graph=_DROP), PLAN, "graph"),
        ("graph_number", variant(graph=7), PLAN, "graph"),
        ("other_graph", variant(graph=other), PLAN, "another graph"),
        ("sync_mode_list", variant(sync_mode=[0]), PLAN, "sync_mode"),
        ("sync_mode_object", variant(sync_mode={"a": 1}), PLAN, "sync_mode"),
        ("sync_mode_7", variant(sync_mode=7), PLAN, "sync_mode"),
        ("serialize_strings", variant(serialize=["a"]), PLAN, "serialize"),
        ("serialize_out_of_range", variant(serialize=[10**9]), PLAN, "serialize"),
        ("params_list", variant(params=[1]), PLAN, "params"),
        ("swaps_object", variant(swaps={"a": 1}), PLAN, "swaps"),
        ("swap_not_object", variant(swaps=[3]), PLAN, "swaps[0]"),
        ("swap_unknown_tensor", swap(tensor="ghost:0"), PLAN, "ghost"),
        ("swap_bad_port", swap(tensor=tensor.rsplit(":", 1)[0] + ":\u00b2"), PLAN, ""),
        ("swap_port_5000_digits", swap(tensor=tensor.rsplit(":", 1)[0] + ":" + "9" * 5000), PLAN,
         ""),
        ("swap_no_swap_ins", swap(swap_ins=[]), PLAN, "no swap-in"),
        ("swap_ins_not_list", swap(swap_ins="x"), PLAN, "swap_ins"),
        ("consumers_empty", swap(swap_ins=[{"consumers": []}]), PLAN, "consumers"),
        ("consumer_not_reading", swap(swap_ins=[{"consumers": ["images"]}]), PLAN,
         "does not read"),
        ("consumer_twice", swap(swap_ins=[{"consumers": [consumer]},
                                          {"consumers": [consumer]}]), PLAN, "two groups"),
        ("trigger_unknown", swap(swap_ins=[{"consumers": [consumer], "trigger": "ghost"}]), PLAN,
         "ghost"),
        ("trigger_number", swap(swap_ins=[{"consumers": [consumer], "trigger": 5}]), PLAN,
         "trigger"),
        ("trigger_is_consumer", swap(swap_ins=[{"consumers": [consumer], "trigger": consumer}]),
         PLAN, "trigger"),
        ("swapped_twice", variant(swaps=good["swaps"][:1] * 2), PLAN, "twice"),
        ("nested_100000", "[" * 100_000 + "]" * 100_000, PLAN, ""),
        ("int_5000_digits", variant(version=_RAW).replace(f'"{_RAW}"', "9" * 5000), PLAN, ""),
        ("nan_version", variant(version=_RAW).replace(f'"{_RAW}"', "NaN"), PLAN, "version"),
        ("huge_file", json.dumps({**good, "params": {"pad": "x" * (20 * 2**20)}}), OK, ""),
    ]
    for label, data, expect, message in cases:
        path = d / f"{label}.json"
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        w.add(p, label, path, expect, kind="plan", graph=mlp, message=message)
    (d / "a_directory.json").mkdir(exist_ok=True)
    w.add(p, "directory", d / "a_directory.json", PLAN, kind="plan", graph=mlp)
    w.add(p, "missing_file", d / "missing.json", PLAN, kind="plan", graph=mlp,
          message="no such plan file")


_DROP = object()
#: Placeholder replaced by a raw JSON fragment (numbers json.dumps will not write).
_RAW = "__raw_json_fragment__"


def main(argv: Sequence[str] | None = None) -> int:
    """Write the corpus and its manifest; print the number of cases per class."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--truncations", type=int, default=30)
    ap.add_argument("--bitflips", type=int, default=30)
    ap.add_argument("--with-tf", action="store_true", help="also build SavedModels with TF")
    args = ap.parse_args(argv)
    cases = generate(args.outdir, truncations=args.truncations, bitflips=args.bitflips,
                     with_tf=args.with_tf)
    manifest = pathlib.Path(args.outdir) / "manifest.json"
    manifest.write_text(json.dumps([dataclasses.asdict(c) for c in cases], indent=1))
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.cls] = counts.get(c.cls, 0) + 1
    for cls, n in counts.items():
        print(f"{cls:16s} {n}")
    print(f"{'total':16s} {len(cases)} -> {manifest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
