"""Ordering, categories, sizes and the simulator on hand-built graphs with exact answers."""

from __future__ import annotations

import dataclasses

import pytest
from graphs import TINY_CATEGORIES, TINY_CURVE_B2, TINY_LEVELS, t, tiny_step

import lmscore
from lmscore.errors import ConfigError, GraphError
from lmscore.ir import Graph, Op, TensorSpec, lint
from lmscore.memory import hotspots, live_at, simulate
from lmscore.order import order, replayed
from lmscore.shapes import LoopBody, resolve


def by_name(graph: Graph, values) -> dict[str, object]:
    return {op.name: v for op, v in zip(graph.ops, values, strict=True)}


def test_tiny_step_levels_and_categories():
    g = tiny_step()
    o = order(g)
    assert by_name(g, o.levels) == TINY_LEVELS
    assert by_name(g, o.categories) == TINY_CATEGORIES
    assert o.loss == "loss"
    assert o.num_levels == 11
    assert [[g.ops[i].name for i in lvl] for lvl in o.by_level][4] == ["loss", "shape_act"]


def test_categories_do_not_depend_on_names():
    plain = tiny_step()
    renamed_map = {k: f"n{i:02d}" for i, k in enumerate(sorted(TINY_LEVELS, reverse=True))}
    renamed = tiny_step(renamed_map)
    assert order(renamed).categories == order(plain).categories
    assert order(renamed).loss == renamed_map["loss"]


def test_tiny_step_curve_exact():
    # Buffers at batch 2 (float32): mm [2,2] 16 B, levels 2..6 (Relu writes in place,
    # ReluGrad at 6 is the last reader); loss 4 B 4..10; shape_act 8 B 4..5;
    # g_tile 16 B 5..7 (ReluGrad overwrites it, g_w reads it at 7); g_w 32 B 7..9
    # (the lr multiply overwrites it; the write reads it at 9).
    sim = simulate(tiny_step(), 2)
    assert sim.persistent_bytes == 48
    assert sim.input_bytes == 32
    assert sim.device_curve == TINY_CURVE_B2
    assert (sim.peak_bytes, sim.peak_level, sim.transient_peak_bytes) == (132, 7, 52)
    assert sim.unknown_size_tensors == ()
    live = {b.tensor: (b.bytes, b.start, b.end) for b in live_at(sim, 7)}
    assert live == {"g_w:0": (32, 7, 9), "g_tile:0": (16, 5, 7), "loss:0": (4, 4, 10)}


def test_select_writes_into_its_then_or_else_input():
    # The gradient of a dropout's where(mask, x, 0): two selects read the incoming
    # gradient g (4x4 float32, 64 B); the later one writes into g's buffer, as
    # TensorFlow's Select kernels forward their "t"/"e" inputs.
    f = (TensorSpec("float", (4, 4)),)
    m = (TensorSpec("bool", (4, 4)),)
    s = (TensorSpec("float", ()),)
    g = Graph((
        Op("x", "Placeholder", outputs=f), Op("mask", "Placeholder", outputs=m),
        Op("zero", "Const", outputs=s),
        Op("g", "Exp", inputs=("x:0",), outputs=f),
        Op("dx", "SelectV2", inputs=("mask:0", "g:0", "zero:0"), outputs=f),
        Op("dz", "SelectV2", inputs=("mask:0", "zero:0", "g:0"), outputs=f),
        Op("a", "AddN", inputs=("dx:0", "dz:0"), outputs=f),
    ))
    sim = simulate(g, 1)
    owners = {b.tensor: b.views for b in sim.buffers}
    assert sum("dx:0" in v or "dz:0" in v for v in owners.values()) == 1
    # g then one select's output, then the sum written into one of them: 2 x 64 B
    assert sim.transient_peak_bytes == 2 * 64


def test_transpose_by_an_inverted_identity_permutation_is_a_view():
    # Tensordot's gradient transposes by InvertPermutation(its forward permutation); for
    # a dense layer on the last axis that is the identity, and TensorFlow's Transpose
    # hands the input through: no second 256 B buffer.
    f = (TensorSpec("float", (4, 4, 4)),)
    g = Graph((
        Op("x", "Placeholder", outputs=f),
        Op("perm", "Const", outputs=(TensorSpec("int32", (3,)),), attrs={"value": (0, 1, 2)}),
        Op("inv", "InvertPermutation", inputs=("perm:0",), outputs=(TensorSpec("int32", (3,)),)),
        Op("a", "Exp", inputs=("x:0",), outputs=f),
        Op("t", "Transpose", inputs=("a:0", "inv:0"), outputs=f),
        Op("b", "Mul", inputs=("t:0", "x:0"), outputs=f),
        Op("c", "Mul", inputs=("t:0", "b:0"), outputs=f),
    ))
    assert resolve(g, 1).values[(g.index["inv"], 0)] == (0, 1, 2)
    sim = simulate(g, 1)
    # t is a's buffer (and c, its last reader, writes into it in place)
    assert {b.tensor: b.views for b in sim.buffers}["a:0"] == ("t:0", "c:0")


def test_ops_the_step_prunes_allocate_nothing():
    # A dead gradient branch: its ops lead to no update, loss or output, so a
    # tf.function never runs them. Added to the tiny step, they change no byte; an
    # output (an Identity nothing reads) is kept.
    base = tiny_step()
    f = (TensorSpec("float", (-1, 2)),)
    dead = (Op("dead", "Exp", inputs=("act:0",), outputs=f),
            Op("dead_shape", "Shape", inputs=("dead:0",), outputs=t("int32", 2)))
    g = Graph((*base.ops, *dead), "tiny_dead")
    o = order(g)
    assert not o.needed[g.index["dead"]] and not o.needed[g.index["dead_shape"]]
    assert o.needed[g.index["out"]]
    assert simulate(g, 2).device_curve == TINY_CURVE_B2
    kept = Graph((*base.ops, dead[0], Op("result", "Identity", inputs=("dead:0",), outputs=f)),
                 "tiny_out")
    assert order(kept).needed[kept.index["dead"]]
    assert simulate(kept, 2).device_curve != TINY_CURVE_B2


def test_hotspots_at_peak():
    g = tiny_step()
    sim = simulate(g, 2)
    rows = hotspots(g, sim)
    assert [(h.tensor, h.bytes, h.producer_level, h.last_use_level, h.distance) for h in rows] == [
        ("g_w:0", 32, 7, 9, 2), ("g_tile:0", 16, 5, 7, 2), ("loss:0", 4, 4, 10, 6),
    ]
    # g_w's buffer lives 7..9 only through the in-place lr multiply: each of its tensors is
    # read by the very next level, so no swap can free it
    assert not rows[0].swappable and rows[0].reason == "no gap between producer and last reader"
    assert rows[0].swap_tensor == "g_w:0"
    assert not rows[2].swappable and rows[2].reason == "rank < 2"


def test_hotspot_names_the_tensor_to_swap():
    from graphs import long_edge

    g = long_edge()
    rows = hotspots(g, simulate(g, 1))
    a = next(h for h in rows if h.tensor == "a:0")
    assert a.swappable and a.swap_tensor == "a:0" and a.distance == 5


def test_batch_fills_unknown_dims():
    g = tiny_step()
    s8 = resolve(g, 8)
    assert s8.shapes[g.index["mm"]] == ((8, 2),)
    assert s8.nbytes[g.index["x"]] == (8 * 4 * 4,)
    assert s8.variable_bytes == {"w": 32}
    assert simulate(g, 8).input_bytes == 128


def test_reshape_of_batch_uses_element_count():
    f = "float"
    ops = (
        Op("x", "Placeholder", outputs=t(f, -1, 128, 64)),
        Op("s", "Const", outputs=t("int32", 2), attrs={"value": (-1, 64)}),
        Op("r", "Reshape", inputs=("x:0", "s:0"), outputs=t(f, -1, 64)),
        Op("p", "Const", outputs=t("int32", 3), attrs={"value": (1, 0, 2)}),
        Op("tr", "Transpose", inputs=("x:0", "p:0"), outputs=t(f, 128, -1, 64)),
        Op("ax", "Const", outputs=t("int32"), attrs={"value": (0,)}),
        Op("c", "ConcatV2", inputs=("r:0", "r:0", "ax:0"), outputs=t(f, -1, 64)),
    )
    s = resolve(Graph(ops), 3)
    assert s.shapes[2] == ((384, 64),)
    assert s.shapes[4] == ((128, 3, 64),)
    assert s.shapes[6] == ((768, 64),)
    assert s.assumed == ()


def test_dilated_convolution_has_batch_times_dilation_rows():
    """SpaceToBatchND multiplies the unknown batch by the block, BatchToSpaceND divides."""
    f = "float"
    ops = (
        Op("x", "Placeholder", outputs=t(f, -1, 100, 8)),
        Op("block", "Const", outputs=t("int32", 1), attrs={"value": (4,)}),
        Op("pad", "Const", outputs=t("int32", 1, 2), attrs={"value": (2, 2)}),
        Op("s2b", "SpaceToBatchND", inputs=("x:0", "block:0", "pad:0"), outputs=t(f, -1, 26, 8)),
        Op("relu", "Relu", inputs=("s2b:0",), outputs=t(f, -1, 26, 8)),
        Op("crop", "Const", outputs=t("int32", 1, 2), attrs={"value": (2, 2)}),
        Op("b2s", "BatchToSpaceND", inputs=("relu:0", "block:0", "crop:0"),
           outputs=t(f, -1, 100, 8)),
    )
    s = resolve(Graph(ops), 3)
    assert s.shapes[3] == ((12, 26, 8),)
    assert s.shapes[4] == ((12, 26, 8),)
    assert s.shapes[6] == ((3, 100, 8),)
    assert s.nbytes[3] == (12 * 26 * 8 * 4,)


def test_rows_from_indices_segments_stacks_and_diagonals():
    """Shapes a step traced with an unknown batch leaves open, decided by another input:
    a gather has a row per index, an unsorted segment sum a row per segment, a stack N
    rows along its new axis, a diagonal matrix its diagonal's length twice (``tf.eye``)."""
    f = "float"
    ops = (
        Op("x", "Placeholder", outputs=t(f, -1, 8)),
        Op("idx", "Placeholder", outputs=t("int32", -1)),
        Op("four", "Const", outputs=t("int32", 1), attrs={"value": (4,)}),
        Op("edges", "Tile", inputs=("idx:0", "four:0"), outputs=t("int32", -1)),
        Op("ax", "Const", outputs=t("int32"), attrs={"value": (0,)}),
        Op("g", "GatherV2", inputs=("x:0", "edges:0", "ax:0"), outputs=t(f, -1, 8)),
        Op("n", "Const", outputs=t("int32"), attrs={"value": (5,)}),
        Op("seg", "UnsortedSegmentSum", inputs=("g:0", "edges:0", "n:0"),
           outputs=t(f, -1, 8)),
        Op("a", "Relu", inputs=("x:0",), outputs=t(f, -1, 8)),
        Op("stack", "Pack", inputs=("a:0", "a:0", "x:0"), outputs=t(f, 3, -1, 8),
           attrs={"axis": 0, "N": 3}),
        Op("d", "Placeholder", outputs=t(f, -1)),
        Op("k", "Const", outputs=t("int32"), attrs={"value": (0,)}),
        Op("m1", "Const", outputs=t("int32"), attrs={"value": (-1,)}),
        Op("pad", "Const", outputs=t(f), attrs={"value": (0.0,)}),
        Op("eye", "MatrixDiagV3", inputs=("d:0", "k:0", "m1:0", "m1:0", "pad:0"),
           outputs=t(f, -1, -1)),
    )
    g = Graph(ops)
    s = resolve(g, 3)
    assert s.shapes[g.index["g"]] == ((12, 8),)  # 3 x 4 indices, not 3 rows of x
    assert s.shapes[g.index["seg"]] == ((5, 8),)  # num_segments, not the 12 rows of g
    assert s.shapes[g.index["stack"]] == ((3, 3, 8),)
    assert s.shapes[g.index["eye"]] == ((3, 3),)
    assert s.unknown == ()


def test_a_slice_takes_its_rows_from_begin_and_size():
    """``tf.slice(w, [batch, 0], [-1, -1])`` keeps the rows after the batch's own.

    A sampled softmax gathers the batch's and the sampled classes' weights together and
    slices the sampled ones out: given the input's rows, its logits were a batch wide
    (a step simulated at 1.744 of measured).
    """
    f = "float"
    ops = (
        Op("x", "Placeholder", outputs=t(f, -1, 8)),
        Op("shape", "Shape", inputs=("x:0",), outputs=t("int32", 2)),
        Op("b", "Const", outputs=t("int32", 1), attrs={"value": (0,)}),
        Op("e", "Const", outputs=t("int32", 1), attrs={"value": (1,)}),
        Op("rows", "StridedSlice", inputs=("shape:0", "b:0", "e:0", "e:0"),
           outputs=t("int32"), attrs={"begin_mask": 0, "end_mask": 0, "shrink_axis_mask": 1,
                                      "ellipsis_mask": 0, "new_axis_mask": 0}),
        Op("zero", "Const", outputs=t("int32"), attrs={"value": (0,)}),
        Op("begin", "Pack", inputs=("rows:0", "zero:0"), outputs=t("int32", 2),
           attrs={"axis": 0, "N": 2}),
        Op("rest", "Const", outputs=t("int32", 2), attrs={"value": (-1, -1)}),
        Op("sixteen", "Const", outputs=t(f, 16, 8)),
        Op("ax", "Const", outputs=t("int32"), attrs={"value": (0,)}),
        Op("both", "ConcatV2", inputs=("x:0", "sixteen:0", "ax:0"), outputs=t(f, -1, 8),
           attrs={"N": 2}),
        Op("sampled", "Slice", inputs=("both:0", "begin:0", "rest:0"), outputs=t(f, -1, -1)),
        Op("at", "Const", outputs=t("int32", 2), attrs={"value": (1, 2)}),
        Op("size", "Const", outputs=t("int32", 2), attrs={"value": (2, 3)}),
        Op("corner", "Slice", inputs=("both:0", "at:0", "size:0"), outputs=t(f, -1, -1)),
    )
    g = Graph(ops)
    s = resolve(g, 5)
    assert s.shapes[g.index["both"]] == ((21, 8),)
    assert s.shapes[g.index["sampled"]] == ((16, 8),)
    assert s.shapes[g.index["corner"]] == ((2, 3),)
    assert s.unknown == ()


def test_a_size_computed_in_floating_point_from_a_shape_is_evaluated():
    """A mixture of experts' capacity, ``ceil(1.25 * tokens / experts)`` cast back to an
    integer, sizes its dispatch one-hot: left unknown, the one-hot and the dispatch tensors
    counted 0 bytes (a switch layer simulated at 0.078 of measured)."""
    f = "float"

    def const(name, dtype, value, *shape):
        return Op(name, "Const", outputs=t(dtype, *shape), attrs={"value": value})

    ops = (
        Op("x", "Placeholder", outputs=t(f, -1, 32)),
        Op("pos", "Placeholder", outputs=t("int32", -1)),
        Op("shape", "Shape", inputs=("x:0",), outputs=t("int32", 2)),
        const("zero", "int32", (0,), 1), const("one", "int32", (1,), 1),
        Op("n", "StridedSlice", inputs=("shape:0", "zero:0", "one:0", "one:0"),
           outputs=t("int32"), attrs={"shrink_axis_mask": 1}),
        Op("nf", "Cast", inputs=("n:0",), outputs=t(f)),
        const("factor", f, (1.25,)), const("experts", f, (4.0,)),
        Op("scaled", "Mul", inputs=("factor:0", "nf:0"), outputs=t(f)),
        Op("per", "RealDiv", inputs=("scaled:0", "experts:0"), outputs=t(f)),
        Op("up", "Ceil", inputs=("per:0",), outputs=t(f)),
        Op("capacity", "Cast", inputs=("up:0",), outputs=t("int32")),
        const("on", f, (1.0,)), const("off", f, (0.0,)),
        Op("slots", "OneHot", inputs=("pos:0", "capacity:0", "on:0", "off:0"),
           outputs=t(f, -1, -1), attrs={"axis": -1}),
    )
    g = Graph(ops)
    s = resolve(g, 510)
    assert (g.index["per"], 0) not in s.values  # a float: no size, axis or index
    assert s.values[(g.index["capacity"], 0)] == (160,)
    assert s.shapes[g.index["slots"]] == ((510, 160),)
    assert s.unknown == ()


def test_a_where_counts_every_element_and_a_sparse_product_its_dense_rows():
    """``tf.sparse.from_dense(x)``: ``Where`` gives a row of coordinates per true element,
    at most every element; the sparse product's rows are its dense shape's, not the
    coordinates' (a bag of words over 20,000 words simulated at 0.754 of measured, its
    coordinates counted as a batch of rows)."""
    f = "float"
    ops = (
        Op("x", "Placeholder", outputs=t(f, -1, 20)),
        Op("zero", "Const", outputs=t(f), attrs={"value": (0.0,)}),
        Op("mask", "NotEqual", inputs=("x:0", "zero:0"), outputs=t("bool", -1, 20)),
        Op("where", "Where", inputs=("mask:0",), outputs=t("int64", -1, 2)),
        Op("values", "GatherNd", inputs=("x:0", "where:0"), outputs=t(f, -1)),
        Op("dense_shape", "Shape", inputs=("x:0",), outputs=t("int64", 2),
           attrs={"out_type": "int64"}),
        Op("emb", "Const", outputs=t(f, 20, 16)),
        Op("h", "SparseTensorDenseMatMul",
           inputs=("where:0", "values:0", "dense_shape:0", "emb:0"), outputs=t(f, -1, 16)),
    )
    g = Graph(ops)
    s = resolve(g, 4)
    assert s.shapes[g.index["where"]] == ((80, 2),)
    assert s.shapes[g.index["values"]] == ((80,),)
    assert s.shapes[g.index["h"]] == ((4, 16),)
    assert s.unknown == ()
    # the coordinates' count is the data's: named, so that a report can say it is a most
    assert s.at_most == ("where:0",)
    assert simulate(g, 4, sizes=s).at_most_size_tensors == ("where:0",)
    # with a known size, nothing is taken at its most
    fixed = Graph(tuple(dataclasses.replace(op, outputs=t("int64", 80, 2))
                        if op.name == "where" else op for op in ops))
    assert resolve(fixed, 4).at_most == ()


def test_a_strided_slice_resolves_every_dimension():
    """``s[:, None] - s[None, :]``: a pairwise difference of a batch of scores is batch x
    batch. Only the first dimension followed the data, so ``s[None, :]`` stayed (1, -1),
    the difference was unknown and counted 0 bytes (a ranking loss simulated at 0.049 of
    measured)."""
    f = "float"

    def const(name, *value):
        return Op(name, "Const", outputs=t("int32", len(value)), attrs={"value": value})

    ops = (
        Op("s", "Placeholder", outputs=t(f, -1)),
        const("b0", 0, 0), const("e0", 0, 0), const("one", 1, 1),
        Op("col", "StridedSlice", inputs=("s:0", "b0:0", "e0:0", "one:0"),
           outputs=t(f, -1, 1), attrs={"begin_mask": 1, "end_mask": 1, "new_axis_mask": 2}),
        Op("row", "StridedSlice", inputs=("s:0", "b0:0", "e0:0", "one:0"),
           outputs=t(f, 1, -1), attrs={"begin_mask": 2, "end_mask": 2, "new_axis_mask": 1}),
        Op("d", "Sub", inputs=("col:0", "row:0"), outputs=t(f, -1, -1)),
    )
    g = Graph(ops)
    s = resolve(g, 6)
    assert s.shapes[g.index["row"]] == ((1, 6),)
    assert s.shapes[g.index["d"]] == ((6, 6),)
    assert s.unknown == ()


def test_a_range_takes_its_length_from_its_bounds():
    """``tf.range(n)`` with ``n`` the rows of ``reshape(x, [-1, d])`` (batch x tokens): too
    long for its values to be kept, its length was the batch's (a mixture of experts'
    token indices counted 16 rows for 1,024, and its per-token weights with them)."""
    f = "float"

    def const(name, *value):
        return Op(name, "Const", outputs=t("int32", len(value)), attrs={"value": value})

    ops = (
        Op("x", "Placeholder", outputs=t(f, -1, 64, 8)),
        const("flat", -1, 8),
        Op("tok", "Reshape", inputs=("x:0", "flat:0"), outputs=t(f, -1, 8)),
        Op("shape", "Shape", inputs=("tok:0",), outputs=t("int32", 2)),
        const("b", 0), const("e", 1), const("s", 1),
        Op("n", "StridedSlice", inputs=("shape:0", "b:0", "e:0", "s:0"), outputs=t("int32"),
           attrs={"shrink_axis_mask": 1}),
        Op("zero", "Const", outputs=t("int32"), attrs={"value": (0,)}),
        Op("one", "Const", outputs=t("int32"), attrs={"value": (1,)}),
        Op("idx", "Range", inputs=("zero:0", "n:0", "one:0"), outputs=t("int32", -1)),
        Op("rows", "GatherV2", inputs=("tok:0", "idx:0", "zero:0"), outputs=t(f, -1, 8)),
    )
    g = Graph(ops)
    s = resolve(g, 16)
    assert s.shapes[g.index["idx"]] == ((1024,),)
    assert s.shapes[g.index["rows"]] == ((1024, 8),)


def test_shapes_given_as_values_crops_scatters_and_paddings():
    """Ops whose output shape is an input's value, where the data flow gave another:
    ``CropAndResize`` has a row per box (8 boxes an image: the crops counted 1/8 and
    their image gradients 8x), ``CropAndResizeGradImage`` the images' shape, ``ScatterNd``
    its ``shape`` input (a max-unpooling: 0.797 of measured), and a ``Pad`` whose paddings
    are two columns concatenated along axis 1 (a slice's gradient: 0.811)."""
    f = "float"

    def const(name, *value, shape=None):
        return Op(name, "Const", outputs=t("int32", *(shape or (len(value),))),
                  attrs={"value": value})

    ops = (
        Op("img", "Placeholder", outputs=t(f, -1, 32, 32, 8)),
        Op("boxes", "Const", outputs=t(f, 16, 4)),
        Op("box_ind", "Const", outputs=t("int32", 16)),
        const("crop", 7, 7),
        Op("crops", "CropAndResize", inputs=("img:0", "boxes:0", "box_ind:0", "crop:0"),
           outputs=t(f, -1, 7, 7, 8)),
        Op("img_shape", "Shape", inputs=("img:0",), outputs=t("int32", 4)),
        Op("grad_img", "CropAndResizeGradImage",
           inputs=("crops:0", "boxes:0", "box_ind:0", "img_shape:0"), outputs=t(f, -1, 32, 32, 8)),
        Op("size", "Size", inputs=("img:0",), outputs=t("int32")),
        const("one", 1), const("flat_shape", -1, 1, shape=(2,)),
        Op("n", "Reshape", inputs=("size:0", "one:0"), outputs=t("int32", 1)),
        Op("idx", "Placeholder", outputs=t("int32", -1, 1)),
        Op("upd", "Placeholder", outputs=t(f, -1)),
        Op("unpooled", "ScatterNd", inputs=("idx:0", "upd:0", "n:0"), outputs=t(f, -1)),
        const("before", 0, 0, 0), const("after", 0, 5, 0), const("col", 3, 1, shape=(2,)),
        Op("b2", "Reshape", inputs=("before:0", "col:0"), outputs=t("int32", 3, 1)),
        Op("a2", "Reshape", inputs=("after:0", "col:0"), outputs=t("int32", 3, 1)),
        Op("ax", "Const", outputs=t("int32"), attrs={"value": (1,)}),
        Op("pads", "ConcatV2", inputs=("b2:0", "a2:0", "ax:0"), outputs=t("int32", 3, 2)),
        Op("x", "Placeholder", outputs=t(f, -1, 4, 16)),
        Op("padded", "Pad", inputs=("x:0", "pads:0"), outputs=t(f, -1, -1, -1)),
    )
    g = Graph(ops)
    s = resolve(g, 2)
    assert s.shapes[g.index["crops"]] == ((16, 7, 7, 8),)
    assert s.shapes[g.index["grad_img"]] == ((2, 32, 32, 8),)
    assert s.shapes[g.index["unpooled"]] == ((2 * 32 * 32 * 8,),)
    assert s.shapes[g.index["padded"]] == ((2, 9, 16),)


def test_a_permutation_selected_on_a_dimensions_size():
    """``tf.vectorized_map`` of a matrix-vector product transposes by a permutation chosen
    with ``Select(Equal(min(batch, n), 1), ...)``: left unevaluated, the transpose and
    everything after it had unknown sizes, counted 0 bytes (a tuned plan measured 1.200
    of its device, its simulation 0.739 of measured)."""
    f = "float"
    i32 = "int32"

    def const(name, *value, dtype=i32, shape=None):
        return Op(name, "Const", outputs=t(dtype, *(shape if shape is not None
                                                     else (len(value),))),
                  attrs={"value": value})

    ops = (
        Op("x", "Placeholder", outputs=t(f, -1, 512, 1)),
        Op("shape", "Shape", inputs=("x:0",), outputs=t(i32, 3)),
        const("b0", 0), const("b1", 1), const("b2", 2),
        Op("rows", "StridedSlice", inputs=("shape:0", "b0:0", "b1:0", "b1:0"),
           outputs=t(i32), attrs={"shrink_axis_mask": 1}),
        Op("cols", "StridedSlice", inputs=("shape:0", "b1:0", "b2:0", "b1:0"),
           outputs=t(i32), attrs={"shrink_axis_mask": 1}),
        Op("least", "Minimum", inputs=("rows:0", "cols:0"), outputs=t(i32)),
        const("one", 1, shape=()),
        Op("single", "Equal", inputs=("least:0", "one:0"), outputs=t("bool")),
        const("keep", 0, 1, 2), const("swap", 1, 0, 2),
        Op("perm", "Select", inputs=("single:0", "keep:0", "swap:0"), outputs=t(i32, 3)),
        Op("xt", "Transpose", inputs=("x:0", "perm:0"), outputs=t(f, -1, -1, -1)),
        Op("wide", "Greater", inputs=("cols:0", "rows:0"), outputs=t("bool")),
        Op("pick", "SelectV2", inputs=("wide:0", "cols:0", "rows:0"), outputs=t(i32)),
    )
    g = Graph(ops)
    s = resolve(g, 256)
    assert s.values[(g.index["single"], 0)] == (0,)
    assert s.values[(g.index["perm"], 0)] == (1, 0, 2)
    assert s.shapes[g.index["xt"]] == ((512, 256, 1),)
    assert s.values[(g.index["pick"], 0)] == (512,)


@pytest.mark.parametrize("op_type", ["GatherV2", "Gather", "GatherNd", "Pack", "MatrixDiag",
                                     "MatrixDiagV3", "UnsortedSegmentSum", "Transpose",
                                     "Slice"])
def test_an_op_without_the_inputs_its_shape_rule_reads_keeps_its_recorded_shape(op_type):
    """Found by fuzzing the import: a GatherV2 with no inputs made the rule raise."""
    g = Graph((Op("n0", op_type, outputs=t("float", -1, 8)),))
    assert resolve(g, 2).shapes == (((-1, 8),),)
    simulate(g, 2)


def test_odd_attributes_of_a_stack_or_a_gather_keep_the_recorded_shape():
    """A hand-made or corrupted axis or batch_dims (not an integer) is no rule's input."""
    f = "float"
    ops = (
        Op("x", "Placeholder", outputs=t(f, -1, 8)),
        Op("s", "Pack", inputs=("x:0", "x:0"), outputs=t(f, 2, -1, 8), attrs={"axis": "a"}),
        Op("i", "Placeholder", outputs=t("int32", -1)),
        Op("ax", "Const", outputs=t("int32"), attrs={"value": (0,)}),
        Op("g", "GatherV2", inputs=("x:0", "i:0", "ax:0"), outputs=t(f, -1, 8),
           attrs={"batch_dims": "b"}),
    )
    s = resolve(Graph(ops), 3)
    assert s.shapes[1] == ((2, -1, 8),) and "s:0" in s.unknown  # left open, and said so
    assert s.shapes[4] == ((3, 8),)  # the same-rank input's batch, as before the rule


def test_axes_from_an_empty_list_a_listdiff_and_an_ellipsis_einsum():
    """Shape arithmetic the gradients of einsums and products compute: an empty vector
    plus a scalar is empty (the einsum gradient's sum over no axes: it hands its input
    through), ``ListDiff`` the axes a product's gradient keeps, and an ``Einsum`` whose
    ellipsis the output moves to its end (``...te,...td->de...``) has the batch last."""
    f = "float"
    i32 = "int32"
    ops = (
        Op("x", "Placeholder", outputs=t(f, -1, 16, 32)),
        Op("d", "Placeholder", outputs=t(f, -1, 16, 4)),
        Op("none", "Const", outputs=t(i32, 0), attrs={"value": ()}),
        Op("two", "Const", outputs=t(i32), attrs={"value": (2,)}),
        Op("axes", "AddV2", inputs=("none:0", "two:0"), outputs=t(i32, -1)),
        Op("same", "Sum", inputs=("x:0", "axes:0"), outputs=t(f, -1, -1, -1)),
        Op("all", "Const", outputs=t(i32, 3), attrs={"value": (0, 1, 2)}),
        Op("one", "Const", outputs=t(i32, 1), attrs={"value": (1,)}),
        Op("kept", "ListDiff", inputs=("all:0", "one:0"), outputs=t(i32, -1) + t(i32, -1)),
        Op("grad", "Einsum", inputs=("x:0", "d:0"), outputs=t(f, 4, 32, -1),
           attrs={"equation": "...te,...td->de..."}),
    )
    g = Graph(ops)
    s = resolve(g, 8)
    assert s.values[(g.index["axes"], 0)] == ()
    assert s.shapes[g.index["same"]] == ((8, 16, 32),)
    assert s.values[(g.index["kept"], 0)] == (0, 2)
    assert s.values[(g.index["kept"], 1)] == (0, 2)
    assert s.shapes[g.index["grad"]] == ((4, 32, 8),)


def test_a_reversed_slice_is_a_copy_and_a_broadcast_to_its_own_shape_a_view():
    """``x[:, ::-1]`` keeps every element in a new buffer (it was counted as a view: 4 MiB
    missing); ``BroadcastTo`` to its input's shape hands the input through (counted as a
    copy: 1.189 of measured)."""
    f = "float"
    i32 = "int32"

    def const(name, *value):
        return Op(name, "Const", outputs=t(i32, len(value)), attrs={"value": value})

    def step(kind: str) -> Graph:
        if kind == "flip":
            op = Op("y", "StridedSlice", inputs=("h:0", "b:0", "e:0", "rev:0"),
                    outputs=t(f, -1, 256), attrs={"begin_mask": 3, "end_mask": 3})
        else:
            op = Op("y", "BroadcastTo", inputs=("h:0", "shape:0"), outputs=t(f, -1, 256))
        return Graph((
            Op("x", "Placeholder", outputs=t(f, -1, 256)),
            Op("h", "Relu", inputs=("x:0",), outputs=t(f, -1, 256)),
            const("b", 0, 0), const("e", 0, 0), const("rev", 1, -1),
            Op("shape", "Shape", inputs=("h:0",), outputs=t(i32, 2)),
            op,
            Op("out", "Tanh", inputs=("y:0",), outputs=t(f, -1, 256)),
            Op("keep", "Sigmoid", inputs=("h:0",), outputs=t(f, -1, 256)),
        ))

    def shares_h(kind: str) -> set[str]:
        h = next(b for b in simulate(step(kind), 64).buffers if b.tensor == "h:0")
        return set(h.views)

    assert "y:0" not in shares_h("flip")  # a buffer of its own
    assert "y:0" in shares_h("broadcast")  # h itself


def test_a_broadcast_comparison_takes_the_larger_side_and_a_tile_by_ones_is_a_view():
    """The gradient of a max over every axis compares the ``[1, 1]`` maximum with the
    ``[batch, n]`` input: the result is ``[batch, n]`` (it was sized ``[1, n]`` from the
    first input, 0.945 of measured and a plan 1.009 of its device). ``Tile`` by all ones
    hands its input through (keras.ops.repeat by 1: 1.500 counted as a copy)."""
    f = "float"
    i32 = "int32"
    g = Graph((
        Op("x", "Placeholder", outputs=t(f, -1, 256)),
        Op("h", "Relu", inputs=("x:0",), outputs=t(f, -1, 256)),
        Op("m", "Max", inputs=("h:0", "axes:0"), outputs=t(f)),
        Op("axes", "Const", outputs=t(i32, 2), attrs={"value": (0, 1)}),
        Op("two", "Const", outputs=t(i32, 2), attrs={"value": (1, 1)}),
        Op("m2", "Reshape", inputs=("m:0", "two:0"), outputs=t(f, -1, -1)),
        Op("eq", "Equal", inputs=("m2:0", "h:0"), outputs=t("bool", -1, 256)),
        Op("ones", "Const", outputs=t(i32, 2), attrs={"value": (1, 1)}),
        Op("rep", "Tile", inputs=("h:0", "ones:0"), outputs=t(f, -1, 256)),
        Op("out", "Select", inputs=("eq:0", "rep:0", "h:0"), outputs=t(f, -1, 256)),
    ))
    sizes = resolve(g, 64)
    assert sizes.shapes[g.index["m2"]] == ((1, 1),)
    assert sizes.shapes[g.index["eq"]] == ((64, 256),)
    assert sizes.nbytes[g.index["eq"]] == (64 * 256,)
    h = next(b for b in simulate(g, 64).buffers if b.tensor == "h:0")
    assert "rep:0" in h.views


def test_zeros_like_of_a_first_row_keeps_the_whole_tensor():
    """``tf.scan``'s initial state ``zeros_like(xs[0])``: ``ZerosLikeOp`` writes into the
    row it reads, a view of ``xs``, so ``xs`` lives as long as the state (a scan RNN
    measured 0.831 of its simulation with the zeros in a buffer of their own). A list's
    zeros (``variant``) are a new list."""
    f = "float"
    i32 = "int32"

    def const(name, *value):
        return Op(name, "Const", outputs=t(i32, len(value)), attrs={"value": value})

    g = Graph((
        Op("x", "Placeholder", outputs=t(f, 16, 8, 64)),
        Op("xs", "Relu", inputs=("x:0",), outputs=t(f, 16, 8, 64)),
        const("b", 0), const("e", 1), const("s", 1),
        Op("row", "StridedSlice", inputs=("xs:0", "b:0", "e:0", "s:0"), outputs=t(f, 8, 64),
           attrs={"shrink_axis_mask": 1}),
        Op("h0", "ZerosLike", inputs=("row:0",), outputs=t(f, 8, 64)),
        Op("late", "Tanh", inputs=("h0:0",), outputs=t(f, 8, 64)),
        Op("ls", "EmptyTensorList", outputs=t("variant")),
        Op("z", "ZerosLike", inputs=("ls:0",), outputs=t("variant")),
    ))
    sim = simulate(g, 8)
    xs = next(b for b in sim.buffers if b.tensor == "xs:0")
    assert {"row:0", "h0:0"} <= set(xs.views)
    assert xs.bytes == 16 * 8 * 64 * 4 and g.ops[xs.readers[-1]].name == "late"
    assert not any("z:0" in b.views for b in sim.buffers)


def test_a_mirror_pad_gradient_holds_a_padded_temporary():
    """``MirrorPadGrad`` folds the padded gradient in a temporary of its input's shape
    (CPU and GPU kernels alike) before writing its output; none where nothing is padded.
    A REFLECT-padded generator measured 0.925 of the simulation without it."""
    f = "float"

    def step(pad: int) -> Graph:
        return Graph((
            Op("g", "Placeholder", outputs=t(f, -1, 32 + 2 * pad, 32 + 2 * pad, 8)),
            Op("pads", "Const", outputs=t("int32", 4, 2),
               attrs={"value": (0, 0, pad, pad, pad, pad, 0, 0)}),
            Op("fold", "MirrorPadGrad", inputs=("g:0", "pads:0"), outputs=t(f, -1, 32, 32, 8)),
            Op("out", "Tanh", inputs=("fold:0",), outputs=t(f, -1, 32, 32, 8)),
        ))

    padded = 4 * 36 * 36 * 8 * 4
    for workspace in ("accelerator", "eigen"):
        sim = simulate(step(2), 4, workspace=workspace)
        assert [b.bytes for b in sim.buffers if b.scratch] == [padded]
    assert not [b for b in simulate(step(2), 4, workspace="none").buffers if b.scratch]
    assert not [b for b in simulate(step(0), 4, workspace="eigen").buffers if b.scratch]


def test_image_transform_takes_its_size_from_the_images_shape():
    """Keras' RandomRotation: the output size is ``Shape(images)[1:-1]``, known at run time."""
    f = "float"
    ops = (
        Op("x", "Placeholder", outputs=t(f, -1, 48, 40, 3)),
        Op("shape", "Shape", inputs=("x:0",), outputs=t("int32", 4)),
        Op("b", "Const", outputs=t("int32", 1), attrs={"value": (1,)}),
        Op("e", "Const", outputs=t("int32", 1), attrs={"value": (-1,)}),
        Op("st", "Const", outputs=t("int32", 1), attrs={"value": (1,)}),
        Op("hw", "StridedSlice", inputs=("shape:0", "b:0", "e:0", "st:0"),
           outputs=t("int32", 2), attrs={"begin_mask": 0, "end_mask": 0,
                                          "shrink_axis_mask": 0, "ellipsis_mask": 0,
                                          "new_axis_mask": 0}),
        Op("m", "Placeholder", outputs=t(f, -1, 8)),
        Op("fill", "Const", outputs=t(f), attrs={"value": (0,)}),
        Op("rot", "ImageProjectiveTransformV3", inputs=("x:0", "m:0", "hw:0", "fill:0"),
           outputs=t(f, -1, -1, -1, 3)),
        Op("size", "Const", outputs=t("int32", 2), attrs={"value": (24, 20)}),
        Op("small", "ResizeBilinear", inputs=("rot:0", "size:0"), outputs=t(f, -1, -1, -1, 3)),
    )
    s = resolve(Graph(ops), 5)
    assert s.shapes[8] == ((5, 48, 40, 3),)
    assert s.shapes[10] == ((5, 24, 20, 3),)
    assert s.unknown == ()


def test_unknown_sizes_are_counted_not_sized_one():
    ops = (
        Op("x", "Placeholder", outputs=t("float", -1, 5, -1)),
        Op("v", "TensorListReserve", inputs=(), outputs=t("variant")),
        Op("y", "Relu", inputs=("x:0",), outputs=t("float", -1, 5, -1)),
    )
    s = resolve(Graph(ops), 2)
    assert set(s.unknown) == {"x:0", "v:0", "y:0"}
    sim = simulate(Graph(ops), 2)
    assert len(sim.unknown_size_tensors) == 3 and sim.peak_bytes == 0


def test_bad_batch_size():
    with pytest.raises(ConfigError, match="batch size"):
        resolve(tiny_step(), 0)


def test_cycle_is_reported_with_its_nodes():
    ops = (
        Op("a", "Placeholder", outputs=t("float", 2)),
        Op("b", "AddV2", inputs=("a:0", "c:0"), outputs=t("float", 2)),
        Op("c", "Relu", inputs=("b:0",), outputs=t("float", 2)),
    )
    with pytest.raises(GraphError, match=r"cycle.*(b -> c|c -> b)"):
        order(Graph(ops, "cyc.pb"))
    with pytest.raises(GraphError, match="cyc.pb"):
        lint(Graph(ops, "cyc.pb"))


def test_control_cycle_is_a_cycle():
    ops = (
        Op("a", "NoOp", control_inputs=("b",)),
        Op("b", "NoOp", control_inputs=("a",)),
    )
    with pytest.raises(GraphError, match="cycle"):
        lint(Graph(ops))


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ((Op("a", "Relu", inputs=("ghost:0",)),), "no node 'ghost'"),
        ((Op("p", "Placeholder", outputs=t("float", 1)), Op("a", "Relu", inputs=("p:3",))),
         "has 1 output"),
        ((Op("a", "NoOp", control_inputs=("ghost",)),), "control input from 'ghost'"),
        ((Op("a", "NoOp"), Op("a", "NoOp")), "duplicate node name 'a'"),
    ],
)
def test_lint_names_the_node(ops, message):
    with pytest.raises(GraphError, match=message):
        lint(Graph(ops, "bad.pb"))


def test_networkx_view_round_trip():
    g = tiny_step()
    nxg = g.to_networkx()
    assert nxg.number_of_nodes() == len(g.ops)
    data = [e for e in nxg.edges(data=True) if e[2]["kind"] == "data"]
    control = [e for e in nxg.edges(data=True) if e[2]["kind"] == "control"]
    assert len(data) == sum(len(op.inputs) for op in g.ops)
    assert control == [("apply", "out", {"kind": "control"})]


def test_public_api_exports():
    for name in lmscore.__all__:
        assert hasattr(lmscore, name), name


def test_hotspots_of_a_loop_step_at_every_level():
    """The LSTM sample's table at every level: what its loops run ahead is listed, refused.

    The results a gradient loop computes ahead of its incoming gradient are held memory
    but no tensor of the graph: they are shown, never offered for swapping.
    """
    from lmscore import samples

    g = lmscore.load(samples.sample_dir() / "lstm.pb")
    sim = simulate(g, 16)
    ahead = [row for level in range(len(sim.device_curve)) for row in hotspots(g, sim, level)
             if row.reason.startswith("results a loop computed ahead")]
    assert ahead
    assert all(not row.swappable and row.swap_tensor == "" for row in ahead)
    assert {row.tensor.rpartition("/")[0] for row in ahead} <= {
        op.name for op in g.ops if op.type in ("While", "StatelessWhile")}


def test_a_loop_runs_nothing_ahead_of_its_control_inputs():
    """A lowered loop's Enter nodes wait for its control inputs: nothing of it runs earlier.

    Unpinned, the LSTM sample's loops compute ahead of their last inputs; a pinned plan
    chains each loop right after the op before it, which leaves them nothing to run
    ahead of (a map_fn step's pinned plan was simulated at 1.098 of measured with them).
    """
    from dataclasses import replace

    from lmscore import samples
    from lmscore.plan import empty_plan
    from lmscore.rewrite import rewrite

    g = lmscore.load(samples.sample_dir() / "lstm.pb")
    assert any("/ahead" in b.tensor for b in simulate(g, 16).buffers)
    pinned = rewrite(g, replace(empty_plan(g), pin_schedule=True)).graph
    loops = [i for i, op in enumerate(pinned.ops) if op.type in ("While", "StatelessWhile")]
    assert all(pinned.adjacency.control_in[i] for i in loops)
    assert not any("/ahead" in b.tensor for b in simulate(pinned, 16).buffers)


def test_a_plan_s_simulation_reuses_the_loop_bodies_simulations():
    """A plan rewrites the step, not its loop bodies: their simulations are made once.

    The rewritten step simulates to the curve a fresh simulation of its bodies gives.
    """
    from lmscore import memory, samples
    from lmscore.plan import plan_from_params
    from lmscore.rewrite import rewrite

    g = lmscore.load(samples.sample_dir() / "lstm.pb")
    memory._function_simulation.cache_clear()
    simulate(g, 16)
    made = memory._function_simulation.cache_info().misses
    assert made > 0
    rw = rewrite(g, plan_from_params(g, 16, threshold=2, ahead=1))
    assert rw.swap_outs
    after = simulate(rw.graph, 16)
    assert memory._function_simulation.cache_info().misses == made
    memory._function_simulation.cache_clear()
    assert simulate(rw.graph, 16).device_curve == after.device_curve


@pytest.mark.parametrize("sample", ["mlp.pb", "lstm.pb", "unet3d.pb"])
def test_swappable_rows_are_the_candidates(sample):
    """One "swappable": a hotspot row offers a swap exactly when the planner would make one.

    At every level of each sample, the tensors the table marks swappable are candidates
    of ``lmscore.plan.candidates`` at threshold 1 (what a hand toggle swaps), and the
    candidates alive there are the rows marked swappable.
    """
    from lmscore import samples
    from lmscore.plan import candidates

    g = lmscore.load(samples.sample_dir() / sample)
    sim = simulate(g, 2)
    sizes = resolve(g, 2)
    cands = {c.tensor for c in candidates(g, sizes, 1, exact=False)}
    checked = 0
    for level in range(len(sim.device_curve)):
        for row in hotspots(g, sim, level, sizes=sizes):
            if row.swappable:
                assert row.swap_tensor in cands, (level, row)
                checked += 1
            elif row.swap_tensor:
                views = {row.tensor, row.swap_tensor}
                assert not views & cands, (level, row)
    assert checked > 0


def test_replaying_a_sessions_order_moves_the_peak_exactly():
    # Two independent branches: x -> ma -> sa and x -> mb -> sb, joined by out. The
    # simulator's order runs ma and mb before either reduction (both 1 KiB products alive
    # at once); a session that ran ma, sa, mb, sb holds one at a time.
    big, small = (TensorSpec("float", (-1, 256)),), (TensorSpec("float", (-1, 1)),)
    g = Graph((
        Op("x", "Placeholder", outputs=big),
        Op("ma", "Exp", inputs=("x:0",), outputs=big),
        Op("mb", "Exp", inputs=("x:0",), outputs=big),
        Op("w", "Placeholder", outputs=(TensorSpec("float", (256, 1)),)),
        Op("sa", "MatMul", inputs=("ma:0", "w:0"), outputs=small),
        Op("sb", "MatMul", inputs=("mb:0", "w:0"), outputs=small),
        Op("out", "AddV2", inputs=("sa:0", "sb:0"), outputs=small),
    ))
    fifo = simulate(g, 1)
    assert order(g).schedule == (0, 3, 1, 2, 4, 5, 6)
    assert fifo.transient_peak_bytes == 1024 + 1024 + 4
    session = ["x", "w", "ma", "sa", "mb", "sb", "out"]
    assert replayed(order(g), session).schedule == (0, 3, 1, 4, 2, 5, 6)
    replay = simulate(g, 1, executed=session)
    assert replay.transient_peak_bytes == 1024 + 4 + 4
    # Ops a session does not name (constants, ops fused into others) run when ready.
    assert replayed(order(g), ["mb", "sb"]).schedule == (0, 1, 3, 4, 2, 5, 6)
    # Levels and categories are the graph's, whatever the order.
    assert replay.device_curve[0] == fifo.device_curve[0]


def _popping_body(*, read_kernels: bool) -> LoopBody:
    """A gradient loop's body: pops a kernel slice and a state per iteration.

    The incoming gradient (loop variable 1) arrives last. The state is read with it; the
    kernel slice only by the gradient of the loop's input (``dx``), which the loop returns
    only if ``read_kernels`` (else nothing reads it and TensorFlow prunes it).
    """
    f, v, i = "float", "variant", "int32"
    ops = [
        Op("counter", "_LoopArg", outputs=(TensorSpec(i, ()),)),
        Op("grad", "_LoopArg", outputs=(TensorSpec(f, (-1, 32)),)),
        Op("kernels", "_LoopArg", outputs=(TensorSpec(v, ()),)),
        Op("states", "_LoopArg", outputs=(TensorSpec(v, ()),)),
        Op("dxs", "_LoopArg", outputs=(TensorSpec(f, (-1, 8)),)),
        Op("shape", "Const", outputs=(TensorSpec(i, (2,)),)),
        Op("pop_k", "TensorListPopBack", inputs=("kernels:0", "shape:0"),
           outputs=(TensorSpec(v, ()), TensorSpec(f, (8, 32)))),
        Op("pop_s", "TensorListPopBack", inputs=("states:0", "shape:0"),
           outputs=(TensorSpec(v, ()), TensorSpec(f, (-1, 32)))),
        Op("dx", "MatMul", inputs=("grad:0", "pop_k:1"), outputs=(TensorSpec(f, (-1, 8)),),
           attrs={"transpose_b": True}),
        Op("dh", "Mul", inputs=("grad:0", "pop_s:1"), outputs=(TensorSpec(f, (-1, 32)),)),
    ]
    returns = ("counter:0", "dh:0", "pop_k:0", "pop_s:0", "dx:0" if read_kernels else "dxs:0")
    kinds = ("pass", "carried", "consumed", "consumed",
             "carried" if read_kernels else "pass")
    return LoopBody(Graph(tuple(ops)), kinds, (-1,) * 5, returns)


@pytest.mark.parametrize("read_kernels", [False, True])
def test_a_gradient_loop_frees_what_it_pops_for_a_pruned_reader(read_kernels):
    """Popped elements no op that runs waits for are freed as the early part pops them.

    TensorFlow prunes a body's ops that lead to no loop variable's next value (the
    gradient of a fed input): the kernel slices the loop pops for it are then read by
    nothing, and the pops, which do not wait for the incoming gradient, run ahead and
    free them. Read by an op that runs (``dx`` returned), they wait for the gradient.
    """
    from lmscore import memory

    body = _popping_body(read_kernels=read_kernels)
    running = memory._running(body)
    assert ("dx" in running.graph.index) == read_kernels
    assert len(running.graph.ops) == len(body.graph.ops) - (not read_kernels)
    cost = memory._body_cost(body, 4, "accelerator", 0, (0, 10, 5, 5, 0))
    # the states are read with the gradient either way: they wait, in their list
    assert cost.released == (() if read_kernels else (2,))
    assert cost.ahead_from == (0 if read_kernels else 5)


def test_an_early_next_value_read_late_is_held_for_each_iteration_ahead():
    """A loop variable's next value computed early waits for the next iteration's late part.

    A masked recurrent layer's gradient loop makes the zeros for the next step's output
    gradient from a popped element (early), and adds them to the incoming gradient (late):
    each iteration run ahead holds one such buffer (a stacked masked BiLSTM measured 0.954
    of its simulated peak without it).
    """
    from dataclasses import replace

    from lmscore import memory

    f, v, i = "float", "variant", "int32"
    ops = (
        Op("counter", "_LoopArg", outputs=(TensorSpec(i, ()),)),
        Op("grad", "_LoopArg", outputs=(TensorSpec(f, (-1, 32)),)),
        Op("ys", "_LoopArg", outputs=(TensorSpec(f, (-1, 32)),)),
        Op("states", "_LoopArg", outputs=(TensorSpec(v, ()),)),
        Op("shape", "Const", outputs=(TensorSpec(i, (2,)),)),
        Op("pop_s", "TensorListPopBack", inputs=("states:0", "shape:0"),
           outputs=(TensorSpec(v, ()), TensorSpec(f, (-1, 32)))),
        Op("zeros", "ZerosLike", inputs=("pop_s:1",), outputs=(TensorSpec(f, (-1, 32)),)),
        Op("next_ys", "Identity", inputs=("zeros:0",), outputs=(TensorSpec(f, (-1, 32)),)),
        Op("ys_in", "Identity", inputs=("ys:0",), outputs=(TensorSpec(f, (-1, 32)),)),
        Op("total", "AddV2", inputs=("grad:0", "ys_in:0"), outputs=(TensorSpec(f, (-1, 32)),)),
        Op("dh", "Mul", inputs=("total:0", "pop_s:1"), outputs=(TensorSpec(f, (-1, 32)),)),
    )
    returns = ("counter:0", "dh:0", "next_ys:0", "pop_s:0")
    body = LoopBody(Graph(ops), ("pass", "carried", "carried", "consumed"), (-1,) * 4,
                    returns)
    cost = memory._body_cost(body, 4, "accelerator", 0, (0, 10, 5, 5))
    assert cost.ahead_bytes == 4 * 32 * 4  # the zeros, once per iteration ahead
    assert cost.ahead_from == 5  # from the popped list's arrival
    # read by an early op only, the next value is used up within the early part
    early_reader = tuple(replace(op, inputs=("pop_s:1", "ys_in:0")) if op.name == "dh"
                         else replace(op, inputs=("grad:0", "grad:0")) if op.name == "total"
                         else op for op in ops)
    body = LoopBody(Graph(early_reader), body.kinds, body.sources, returns)
    assert memory._body_cost(body, 4, "accelerator", 0, (0, 10, 5, 5)).ahead_bytes == 0


def test_a_forward_loop_s_duplicate_accumulator_names_the_lists_it_shares():
    """A state's previous value, pushed each iteration, is the new value another list holds.

    Popping one of the two lists frees nothing while the other still holds the element.
    """
    from lmscore import shapes

    f, v = "float", "variant"
    ops = (
        Op("h", "_LoopArg", outputs=(TensorSpec(f, (-1, 16)),)),
        Op("acc_new", "_LoopArg", outputs=(TensorSpec(v, ()),)),
        Op("acc_prev", "_LoopArg", outputs=(TensorSpec(v, ()),)),
        Op("acc_other", "_LoopArg", outputs=(TensorSpec(v, ()),)),
        Op("h_new", "Tanh", inputs=("h:0",), outputs=(TensorSpec(f, (-1, 16)),)),
        Op("s", "Sigmoid", inputs=("h:0",), outputs=(TensorSpec(f, (-1, 16)),)),
        Op("push_new", "TensorListPushBack", inputs=("acc_new:0", "h_new:0"),
           outputs=(TensorSpec(v, ()),)),
        Op("push_prev", "TensorListPushBack", inputs=("acc_prev:0", "h:0"),
           outputs=(TensorSpec(v, ()),)),
        Op("push_other", "TensorListPushBack", inputs=("acc_other:0", "s:0"),
           outputs=(TensorSpec(v, ()),)),
        Op("out", "Identity", inputs=("h_new:0",), outputs=(TensorSpec(f, (-1, 16)),)),
    )
    body = LoopBody(Graph(ops), ("carried", "filled", "duplicate", "filled"), (-1,) * 4,
                    ("out:0", "push_new:0", "push_prev:0", "push_other:0"))
    assert shapes.duplicated(body) == {2: (1,)}


@pytest.mark.parametrize("op_type", ["SparseSoftmaxCrossEntropyWithLogits",
                                     "SoftmaxCrossEntropyWithLogits"])
def test_a_cross_entropy_kernel_holds_a_value_per_row_while_it_runs(op_type):
    """The cross-entropy kernels allocate one value per row of the logits, on every device.

    Logits of 4 x 10 x 10 pixels x 3 classes (a segmentation head): 400 rows, 1,600 bytes
    beside the 400-row loss, while the op runs; its gradient is written into the logits.
    """
    from lmscore import memory

    f = "float"
    labels = (TensorSpec("int32", (4, 10, 10)) if op_type.startswith("Sparse")
              else TensorSpec(f, (400, 3)))
    ops = (
        Op("x", "Placeholder", outputs=(TensorSpec(f, (4, 10, 10, 3)),)),
        Op("y", "Placeholder", outputs=(labels,)),
        Op("shape", "Const", outputs=(TensorSpec("int32", (2,)),)),
        Op("logits", "Exp", inputs=("x:0",), outputs=(TensorSpec(f, (4, 10, 10, 3)),)),
        Op("flat", "Reshape", inputs=("logits:0", "shape:0"),
           outputs=(TensorSpec(f, (400, 3)),)),
        Op("xent", op_type, inputs=("flat:0", "y:0"),
           outputs=(TensorSpec(f, (400,)), TensorSpec(f, (400, 3)))),
        Op("loss", "Sum", inputs=("xent:0", "shape:0"), outputs=(TensorSpec(f, ()),)),
        Op("grad", "Neg", inputs=("xent:1",), outputs=(TensorSpec(f, (400, 3)),)),
    )
    g = Graph(ops)
    at = order(g).levels[g.index["xent"]]
    accel = simulate(g, 4)
    tensors = simulate(g, 4, workspace="none")
    scratch = [b for b in accel.buffers if b.scratch]
    assert [(b.tensor, b.bytes) for b in scratch] == [("xent/scratch", 400 * 4)]
    assert accel.device_curve[at] - tensors.device_curve[at] == 400 * 4
    assert memory.workspace_reason(scratch[0]) == "kernel workspace"
    assert simulate(g, 4, workspace="eigen").device_curve == accel.device_curve


def _frames(rows: int, width: int) -> Graph:
    """A sequence (batch x 3 frames x ``width``) transposed to frames first, framed by index."""
    f, i32 = "float", "int32"
    ops = [
        Op("x", "Placeholder", outputs=t(f, rows, 3, width)),
        Op("perm", "Const", outputs=t(i32, 3), attrs={"value": (1, 0, 2)}),
        Op("tr", "Transpose", inputs=("x:0", "perm:0"), outputs=t(f, 3, rows, width)),
        Op("one", "Const", outputs=t(i32, 1), attrs={"value": (1,)}),
    ]
    for k in range(3):
        ops += [
            Op(f"b{k}", "Const", outputs=t(i32, 1), attrs={"value": (k,)}),
            Op(f"e{k}", "Const", outputs=t(i32, 1), attrs={"value": (k + 1,)}),
            Op(f"frame{k}", "StridedSlice", inputs=("tr:0", f"b{k}:0", f"e{k}:0", "one:0"),
               outputs=t(f, rows, width), attrs={"begin_mask": 0, "end_mask": 0,
                                                  "shrink_axis_mask": 1, "ellipsis_mask": 0,
                                                  "new_axis_mask": 0}),
            Op(f"y{k}", "Tanh", inputs=(f"frame{k}:0",), outputs=t(f, rows, width)),
        ]
    ops.append(Op("out", "AddN", inputs=("y0:0", "y1:0", "y2:0"), outputs=t(f, rows, width),
                  attrs={"N": 3}))
    return Graph(tuple(ops))


def test_whole_aligned_rows_of_the_first_axis_are_views():
    """A frame of a transposed sequence (``x[t]``) shares the sequence's buffer when its rows
    are aligned (TensorFlow's ``IsDim0SliceAligned``): the sequence lives while any frame
    is read. Rows of 12 bytes are not aligned: each frame is a copy."""
    aligned = simulate(_frames(4, 16), 4)  # rows of 4 x 16 floats: 256 bytes
    (tr,) = [b for b in aligned.buffers if b.tensor == "tr:0"]
    assert {"frame0:0", "frame1:0", "frame2:0"} <= set(tr.views)
    assert not [b for b in aligned.buffers if b.tensor.startswith("frame")]
    copies = simulate(_frames(1, 3), 1)  # 12 bytes
    assert {b.tensor for b in copies.buffers if b.tensor.startswith("frame")} == {
        "frame0:0", "frame1:0", "frame2:0"}


def test_eigen_s_max_pool_gradient_writes_into_the_pooled_input():
    """Eigen's ``MaxPoolGrad`` writes its gradient into the pooling's input once nothing else
    holds it; the other kernels allocate it."""
    f = "float"
    ops = (
        Op("x", "Placeholder", outputs=t(f, 2, 8, 8, 4)),
        Op("a", "Relu", inputs=("x:0",), outputs=t(f, 2, 8, 8, 4)),
        Op("m", "MaxPool", inputs=("a:0",), outputs=t(f, 2, 4, 4, 4),
           attrs={"ksize": (1, 2, 2, 1)}),
        Op("dm", "Neg", inputs=("m:0",), outputs=t(f, 2, 4, 4, 4)),
        Op("da", "MaxPoolGrad", inputs=("a:0", "m:0", "dm:0"), outputs=t(f, 2, 8, 8, 4)),
        Op("loss", "Sum", inputs=("da:0", "x:0"), outputs=t(f)),
    )
    g = Graph(ops)
    eigen = {b.tensor: b for b in simulate(g, 2, workspace="eigen").buffers if not b.scratch}
    assert "da:0" in eigen["a:0"].views
    accel = {b.tensor: b for b in simulate(g, 2).buffers}
    assert "da:0" in accel and "da:0" not in accel["a:0"].views


#: (batch, m, k, n, a transposed, b transposed) -> the scratch TensorFlow 2.21 recorded
#: for a float32 ``BatchMatMulV2`` under oneDNN on 2 threads, one per rule.
ONEDNN_PRODUCTS = {
    (1, 256, 512, 64, True, False): 542208,    # one product, rows shared
    (1, 1000, 64, 64, True, False): 129536,    # 4 blocks of 250 rows
    (2, 64, 256, 64, True, False): 132608,     # a product per thread
    (3, 256, 512, 64, True, False): 542208,    # an odd batch: rows shared
    (1, 24, 512, 256, True, False): 102912,    # few rows, many columns: all rows each
    (1, 20, 128, 32, True, False): 17920,      # blocks of 16 rows
    (1, 256, 3000, 64, True, False): 1214080,  # split along k
    (1, 256, 1500, 64, False, True): 525824,   # transposed b, 1,024 columns
    (1, 256, 512, 64, True, True): 804480,     # both
    (8, 16, 16, 16, False, False): 1408,       # neither
}


@pytest.mark.parametrize("shape, recorded", list(ONEDNN_PRODUCTS.items()))
def test_onednn_product_scratch_as_recorded(shape, recorded) -> None:
    from lmscore.memory import onednn_matmul_scratch_bytes

    assert onednn_matmul_scratch_bytes(*shape, threads=2) == recorded


@pytest.mark.parametrize("equation, shapes, product", [
    # the weight gradient of tied logits reads its first operand transposed
    ("btv,btd->vd", [(8, 64, 256), (8, 64, 32)], (1, 256, 512, 32, True, False)),
    # the logits read the embedding transposed ([n, k])
    ("btd,vd->btv", [(8, 64, 32), (256, 32)], (1, 512, 32, 256, False, True)),
    ("btv,vd->btd", [(8, 64, 256), (256, 32)], (1, 512, 256, 32, False, False)),
    # attention scores: heads are batch labels, both operands copied to [b, h, q|k, d]
    ("bqhd,bkhd->bhqk", [(2, 8, 4, 16), (2, 10, 4, 16)], (8, 8, 16, 10, False, True)),
])
def test_einsum_product(equation, shapes, product) -> None:
    from lmscore.memory import einsum_product

    p = einsum_product(equation, shapes)
    assert (p.batch, p.m, p.k, p.n, p.a_transposed, p.b_transposed) == product


def test_the_ops_validation_cannot_run_are_named():
    from lmscore.ir import Graph, Op, unvalidatable_op

    def graph(*types: str) -> Graph:
        return Graph(tuple(Op(f"op{k}", t_) for k, t_ in enumerate(types)), "g")

    assert unvalidatable_op(graph("Placeholder", "MatMul")) == ""
    assert unvalidatable_op(graph("Placeholder", "LookupTableFindV2")) == "LookupTableFindV2"
    assert unvalidatable_op(graph("EagerPyFunc", "MatMul")) == "EagerPyFunc"
