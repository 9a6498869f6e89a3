"""Property tests of the import path: whatever the bytes, success or an LmsError.

Inputs go through ``lmscore.load.from_graphdef_bytes`` and then ``lmscore.simulate``:

* GraphDef-ish byte strings: protobuf wire format generated from a sketch of the GraphDef
  schema (nodes, attributes, shapes, tensors, function library), with wrong wire types,
  unknown fields, odd integers and truncations;
* edits of the bundled ``mlp.pb`` (overwritten runs of bytes, truncations);
* text: random text and text-format graphs with random edits;
* structured GraphDefs built with TensorBoard's ``graph_pb2``: random ops, inputs (mostly
  acyclic), ports, dtypes, recorded shapes, constants and attributes.

The only outcomes allowed are a graph that simulates, or an
:class:`lmscore.errors.LmsError` whose message is one line. TensorFlow's shape inference
(for graphs without ``_output_shapes``) is replaced by a GraphError here: it is
TensorFlow's parser, not this package's, and it takes seconds to start.

The default run draws 200 examples per property; ``-m slow`` runs 2000.
"""

from __future__ import annotations

import importlib

import pytest
from hostile.make_corpus import varint
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tensorboard.compat.proto import graph_pb2

import lmscore
from lmscore.errors import GraphError, LmsError
from lmscore.samples import sample_dir

load_module = importlib.import_module("lmscore.load")  # the package shadows it with load()
MLP = (sample_dir() / "mlp.pb").read_bytes()
FAST = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(max_examples=2000, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module", autouse=True)
def _no_tensorflow():
    def refuse(gd, source):
        raise GraphError(f"{source}: no _output_shapes (TensorFlow is not used in this test)")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(load_module, "_add_shapes_with_tensorflow", refuse)
        yield


def import_and_simulate(data: bytes, text: bool | None = None, batch: int = 4) -> str:
    """Run the import path; return "ok" or the LmsError's class name. Anything else raises."""
    try:
        graph = load_module.from_graphdef_bytes(data, source="fuzz.pb", text=text)
        lmscore.simulate(graph, batch)
    except LmsError as e:
        message = str(e)
        assert message and "\n" not in message and "\r" not in message, repr(message)
        event(type(e).__name__)
        return type(e).__name__
    event("ok")
    return "ok"


# --- protobuf wire format from a sketch of the schema ------------------------------------

NAMES = ["a", "b", "c", "x", "n0", "n1", "", "a:0", "dense/MatMul", "\u00e9"]
OPS = ["Placeholder", "Const", "Relu", "AddV2", "MatMul", "Reshape", "Transpose", "ConcatV2",
       "Fill", "Range", "StridedSlice", "Shape", "Pack", "GatherV2", "Sum", "Identity",
       "IdentityN", "While", "TensorListReserve", "TensorListStack", "VarHandleOp",
       "ReadVariableOp", "AssignAddVariableOp", "OnesLike", "Split", "NoOp", "Foo", ""]
INPUTS = ["a", "b:0", "c:1", "^a", "x", "n0:0", "ghost", "a:\u00b2", "a:" + "9" * 30, "^", ""]
ATTR_KEYS = ["_output_shapes", "T", "dtype", "value", "shape", "N", "num_split", "body",
             "transpose_a", "element_dtype", "_lms_role", "out_type", "keep_dims", "x"]
VARINTS = [0, 1, 2, 3, 4, 7, 9, 20, 21, 101, 999, 2**31 - 1, 2**31, 2**63 - 1, 2**64 - 1,
           2**64 - 2, 2**64 - 5, 2**40]

# message -> {field number: (kind, detail)}; kinds: msg, str, bytes, varint, fixed32, fixed64
SCHEMA: dict[str, dict[int, tuple[str, object]]] = {
    "GraphDef": {1: ("msg", "NodeDef"), 2: ("msg", "Library"), 3: ("varint", None),
                 4: ("msg", "Versions")},
    "NodeDef": {1: ("str", NAMES), 2: ("str", OPS), 3: ("str", INPUTS), 4: ("str", ["", "/GPU:0"]),
                5: ("msg", "AttrEntry")},
    "AttrEntry": {1: ("str", ATTR_KEYS), 2: ("msg", "AttrValue")},
    "AttrValue": {1: ("msg", "ListValue"), 2: ("bytes", None), 3: ("varint", None),
                  4: ("fixed32", None), 5: ("varint", None), 6: ("varint", None),
                  7: ("msg", "Shape"), 8: ("msg", "Tensor"), 10: ("msg", "NameAttrList")},
    "ListValue": {2: ("bytes", None), 3: ("varint", None), 6: ("varint", None),
                  7: ("msg", "Shape"), 9: ("msg", "NameAttrList")},
    "Shape": {2: ("msg", "Dim"), 3: ("varint", None)},
    "Dim": {1: ("varint", None), 2: ("str", ["", "batch"])},
    "Tensor": {1: ("varint", None), 2: ("msg", "Shape"), 4: ("bytes", None),
               5: ("fixed32", None), 7: ("varint", None), 8: ("bytes", None),
               10: ("varint", None)},
    "NameAttrList": {1: ("str", ["body", "f", ""]), 2: ("msg", "AttrEntry")},
    "Library": {1: ("msg", "FunctionDef")},
    "FunctionDef": {1: ("msg", "OpDef"), 3: ("msg", "NodeDef")},
    "OpDef": {1: ("str", ["body", "f", "cond"]), 2: ("msg", "ArgDef")},
    "ArgDef": {1: ("str", ["l", "x"]), 3: ("varint", None)},
    "Versions": {1: ("varint", None)},
}
WIRE = {"varint": 0, "fixed64": 1, "msg": 2, "str": 2, "bytes": 2, "fixed32": 5}


@st.composite
def wire_message(draw, name: str = "GraphDef", depth: int = 0) -> bytes:
    fields = SCHEMA[name]
    out = bytearray()
    for _ in range(draw(st.integers(0, 6 if depth < 4 else 1))):
        number = draw(st.sampled_from(sorted(fields)))
        kind, detail = fields[number]
        if draw(st.integers(0, 19)) == 0:  # now and then a field the schema does not have
            number = draw(st.integers(1, 2**29 - 1))
        if draw(st.integers(0, 19)) == 0:  # or the wrong wire type
            kind = draw(st.sampled_from(sorted(WIRE)))
        if kind == "msg" and (depth >= 5 or not isinstance(detail, str)):
            kind = "bytes"
        if kind == "varint":
            payload = varint(draw(st.one_of(st.sampled_from(VARINTS),
                                            st.integers(0, 2**64 - 1))))
        elif kind == "fixed32":
            payload = draw(st.binary(min_size=4, max_size=4))
        elif kind == "fixed64":
            payload = draw(st.binary(min_size=8, max_size=8))
        else:
            if kind == "msg":
                body = draw(wire_message(detail, depth + 1))
            elif kind == "str" and isinstance(detail, list):
                body = draw(st.sampled_from(detail)).encode()
            else:
                body = draw(st.binary(max_size=24))
            payload = varint(len(body)) + body
        out += varint(number << 3 | WIRE[kind]) + payload
    return bytes(out)


@st.composite
def graphdef_ish(draw) -> bytes:
    data = draw(wire_message())
    if data and draw(st.integers(0, 4)) == 0:
        data = data[: draw(st.integers(0, len(data) - 1))]
    return data


@st.composite
def mlp_edits(draw) -> bytes:
    data = bytearray(MLP)
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(data) - 1))
        data[pos:pos + 1] = draw(st.binary(min_size=1, max_size=4))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


def check_bytes(data: bytes) -> None:
    assert import_and_simulate(data) in ("ok", "GraphError")


@FAST
@given(graphdef_ish())
def test_graphdef_ish_bytes(data):
    check_bytes(data)


@FAST
@given(st.one_of(st.binary(max_size=512), mlp_edits()))
def test_random_and_edited_bytes(data):
    check_bytes(data)


@FAST
@given(st.text(max_size=300))
def test_random_text(text):
    assert import_and_simulate(text.encode("utf-8", "surrogatepass"), text=True) in (
        "ok", "GraphError")


# --- structured GraphDefs ------------------------------------------------------------------

BUILD_OPS = ["Placeholder", "Const", "Identity", "IdentityN", "Relu", "ReluGrad", "AddV2",
             "Mul", "FloorDiv", "MatMul", "BatchMatMulV2", "Reshape", "Squeeze", "ExpandDims",
             "Transpose", "ConcatV2", "Pack", "Fill", "Range", "StridedSlice", "Shape",
             "ShapeN", "Size", "GatherV2", "Tile", "BroadcastTo", "Sum", "Prod", "Max",
             "DynamicStitch", "BroadcastGradientArgs", "OnesLike", "ZerosLike",
             "TensorListReserve", "TensorListFromTensor", "TensorListStack", "While",
             "VarHandleOp", "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp",
             "ResourceApplyGradientDescent", "Conv2DBackpropFilter", "Split", "AddN",
             "NoOp", "Slice", "Foo"]
DTYPES = [1, 1, 3, 3, 9, 20, 21, 7, 19, 101, 999, -1]
DIMS = [-1, -1, 0, 1, 1, 2, 3, 4, 8, -2, 2**31]
INTS = [-2, -1, 0, 0, 1, 1, 2, 3, 4, 64, 2**31 - 1]


@st.composite
def structured_graphdef(draw) -> tuple[bytes, int]:
    gd = graph_pb2.GraphDef()
    n = draw(st.integers(1, 16))
    names = [f"n{k}" for k in range(n)]
    fault = draw(st.integers(0, 9))  # 0-3: one structural fault, else a well-formed DAG
    odd = draw(st.integers(0, n - 1))
    if fault == 0:
        names[odd] = draw(st.sampled_from(["", "n0", "a:0", "x\ny"]))
    for k, name in enumerate(names):
        op = draw(st.sampled_from(BUILD_OPS))
        node = gd.node.add(name=name, op=op)
        for _ in range(draw(st.integers(0, 4)) if k else 0):
            target = names[draw(st.integers(0, k - 1))]
            if fault == 1 and k == odd:
                target = draw(st.sampled_from(names + ["ghost"]))
            port = draw(st.sampled_from(["", "", ":0", ":1", ":\u00b2"])) if fault == 2 else ""
            control = draw(st.integers(0, 5)) == 0
            node.input.append("^" + target if control else target + port)
        attr = node.attr
        dt = draw(st.sampled_from(DTYPES))
        for key in draw(st.lists(st.sampled_from(["T", "dtype", "out_type", "element_dtype"]),
                                 max_size=3, unique=True)):
            attr[key].type = dt
        if not (fault == 3 and k == odd):
            lst = attr["_output_shapes"].list
            lst.SetInParent()
            outs = 0 if op in ("NoOp", "AssignVariableOp", "AssignAddVariableOp") else 1
            for _ in range(outs + draw(st.sampled_from([0, 0, 0, 1, 2]))):
                sh = lst.shape.add()
                if draw(st.integers(0, 7)) == 0:
                    sh.unknown_rank = True
                else:
                    for d in draw(st.lists(st.sampled_from(DIMS), max_size=4)):
                        sh.dim.add(size=d)
        if op == "Const":
            t = attr["value"].tensor
            t.dtype = draw(st.sampled_from([3, 3, 9, 1, 7]))
            t.tensor_shape.SetInParent()
            for d in draw(st.lists(st.sampled_from(DIMS[:8]), max_size=2)):
                t.tensor_shape.dim.add(size=d)
            if draw(st.integers(0, 3)) == 0:
                t.tensor_content = draw(st.binary(max_size=24))
            elif t.dtype == 3:
                t.int_val.extend(draw(st.lists(st.sampled_from(INTS), max_size=5)))
            elif t.dtype == 9:
                t.int64_val.extend(draw(st.lists(st.sampled_from(INTS + [2**40]), max_size=5)))
            elif t.dtype == 1:
                t.float_val.extend(draw(st.lists(st.sampled_from([0.0, 1.0, -1.0]), max_size=3)))
            else:
                t.string_val.extend(draw(st.lists(st.binary(max_size=30), max_size=3)))
        if op in ("VarHandleOp", "Placeholder") and draw(st.booleans()):
            attr["shape"].shape.SetInParent()
            for d in draw(st.lists(st.sampled_from(DIMS), max_size=3)):
                attr["shape"].shape.dim.add(size=d)
        for key in draw(st.lists(st.sampled_from(
                ["transpose_a", "transpose_b", "keep_dims", "N", "num_split", "axis",
                 "begin_mask", "end_mask", "shrink_axis_mask"]), max_size=3, unique=True)):
            kind = draw(st.integers(0, 2))
            if kind == 0:
                attr[key].b = draw(st.booleans())
            elif kind == 1:
                attr[key].i = draw(st.sampled_from(INTS + [10**6, 10**12, -(2**63)]))
            else:
                attr[key].s = draw(st.binary(max_size=3))
        if draw(st.integers(0, 11)) == 0:
            attr["_lms_role"].s = draw(st.sampled_from([b"swap_out", b"swap_in", b"\xff"]))
    return gd.SerializeToString(), draw(st.integers(1, 5))


def check_structured(example) -> None:
    data, batch = example
    assert import_and_simulate(data, batch=batch) in ("ok", "GraphError")


@FAST
@given(structured_graphdef())
def test_structured_graphdefs(example):
    check_structured(example)


@FAST
@given(structured_graphdef())
def test_structured_graphdefs_as_text(example):
    from google.protobuf import text_format

    gd = graph_pb2.GraphDef.FromString(example[0])
    text = text_format.MessageToString(gd).encode()
    assert import_and_simulate(text, text=True, batch=example[1]) in ("ok", "GraphError")


# --- the same properties, many more examples ----------------------------------------------


@pytest.mark.slow
@SLOW
@given(graphdef_ish())
def test_graphdef_ish_bytes_many(data):
    check_bytes(data)


@pytest.mark.slow
@SLOW
@given(st.one_of(st.binary(max_size=2048), mlp_edits()))
def test_random_and_edited_bytes_many(data):
    check_bytes(data)


@pytest.mark.slow
@SLOW
@given(structured_graphdef())
def test_structured_graphdefs_many(example):
    check_structured(example)
