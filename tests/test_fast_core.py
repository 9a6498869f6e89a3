"""What the fast paths of import and analysis must keep: the public names, the collector's
state, and records equal to the plain computation's."""

import gc
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

import lmscore
from lmscore.ir import Graph, GraphError, Op, TensorSpec, gc_paused
from lmscore.load import from_graphdef_bytes

F = (TensorSpec("float", (-1, 4)),)


def test_package_names_stay_functions_whichever_module_comes_first():
    code = (
        "import lmscore.tune, lmscore.rewrite, lmscore.load, lmscore.order, lmscore\n"
        "assert all(callable(f) and not hasattr(f, '__path__') for f in "
        "(lmscore.tune, lmscore.rewrite, lmscore.load, lmscore.order))\n"
        "from lmscore import plan_from_params, swap, DEVICES\n"
        "assert lmscore.plan_from_params is plan_from_params\n"
        "assert set(lmscore.__all__) <= set(dir(lmscore))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_lmscore_pulls_in_neither_numpy_nor_tensorflow():
    code = ("import sys, lmscore\n"
            "print(sorted(m for m in ('numpy', 'tensorflow', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    assert out.strip() == "[]"


def test_unknown_attribute_is_an_attribute_error():
    try:
        lmscore.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_gc_paused_restores_the_collector_as_found():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        gc.enable()


def test_gc_paused_restores_after_an_error():
    try:
        with gc_paused():
            raise ValueError
    except ValueError:
        pass
    assert gc.isenabled()


def _graph() -> Graph:
    return Graph((
        Op("x", "Placeholder", outputs=F),
        Op("s", "Split", inputs=("x:0",), outputs=F + F),
        Op("a", "Relu", inputs=("s:1",), outputs=F),
        Op("b", "AddV2", inputs=("s:0", "s:1"), outputs=F, control_inputs=("a",)),
        Op("c", "AddV2", inputs=("x:0", "x:0"), outputs=F),
    ))


def test_readers_are_the_consumers_port_by_port():
    adj = _graph().adjacency
    for i, rs in enumerate(adj.readers):
        expected = [c for port in range(3) for c in adj.consumers.get((i, port), ())]
        assert list(rs) == expected
    assert adj.readers[0] == (1, 4, 4)
    assert adj.readers[1] == (3, 2, 3)


def test_adjacency_shares_keys_and_matches_the_inputs():
    g = _graph()
    adj = g.adjacency
    assert adj.data_in[3] == ((1, 0), (1, 1))
    assert adj.control_in[3] == (2,)
    assert adj.preds[3] == (1, 2)
    assert adj.preds[4] == (0,)
    assert adj.succs[0] == (1, 4)
    assert adj.data_in[2][0] is adj.data_in[3][1]  # "s:1" parsed once


def test_loaded_specs_are_shared_and_equal_to_the_recorded_shapes():
    from tensorboard.compat.proto import graph_pb2

    gd = graph_pb2.GraphDef()
    for k in range(3):
        n = gd.node.add(name=f"r{k}", op="Relu")
        if k:
            n.input.append(f"r{k - 1}")
        n.attr["T"].type = 1
        s = n.attr["_output_shapes"].list.shape.add()
        for d in (-1, 8):
            s.dim.add().size = d
    g = from_graphdef_bytes(gd.SerializeToString())
    assert all(op.outputs == (TensorSpec("float", (-1, 8)),) for op in g.ops)
    assert g.ops[0].outputs is g.ops[2].outputs


_NAMES = ("x", "s", "a", "b", "c", "n0", "n1", "zz")


@st.composite
def _edits(draw: st.DrawFn) -> tuple[Op, ...]:
    """Edits of :func:`_graph`: some ops' inputs, control inputs or outputs changed, and
    ops appended, some of them reading or naming what does not exist."""
    ops = list(_graph().ops)
    for i in draw(st.lists(st.integers(0, len(ops) - 1), max_size=4)):
        op = ops[i]
        ins = draw(st.lists(st.sampled_from(("x:0", "s:0", "s:1", "a", "b:0", "n0:0",
                                             "s:2", "c:0")), max_size=3))
        ctl = draw(st.lists(st.sampled_from(_NAMES), max_size=2))
        keep = draw(st.booleans())
        ops[i] = Op(op.name, op.type,
                    inputs=op.inputs + tuple(ins) if keep else tuple(ins),
                    control_inputs=op.control_inputs + tuple(ctl),
                    outputs=op.outputs if draw(st.booleans()) else F)
    for k in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(("n0", "n1", "a", f"new{k}")))
        ops.append(Op(name, "Identity", inputs=(draw(st.sampled_from(("x:0", "s:1", "n0:0"))),),
                      control_inputs=tuple(draw(st.lists(st.sampled_from(_NAMES),
                                                         max_size=2))), outputs=F))
    return tuple(ops)


@settings(max_examples=300, deadline=None)
@given(_edits())
def test_a_derived_graph_equals_a_fresh_build_or_fails_like_one(ops):
    g = _graph()
    g.adjacency  # noqa: B018 - the parent's is what derive patches
    fresh = Graph(ops, "fresh")
    try:
        expected, error = (fresh.index, fresh.adjacency), None
    except GraphError as e:
        expected, error = None, str(e)
    try:
        derived = g.derive(ops, "fresh")
        got = (derived.index, derived.adjacency)
    except GraphError as e:
        assert str(e) == error
        return
    assert error is None
    assert got == expected


def test_reach_lists_each_read_output_farthest_first():
    from lmscore.order import order

    ordering = order(_graph())
    assert ordering.levels == (0, 1, 2, 3, 1)
    # s:0 and s:1 are last read by b, two levels on; x:0 one level on; a's edge to b is a
    # control edge and reads nothing
    assert ordering.reach == ((2, 1, 0), (2, 1, 1), (1, 0, 0))
