"""Steps beyond one tape and a Keras optimizer, on hand-built graphs with exact answers.

- two gradient tapes (a GAN, SAM, micro-batches): one seed and one loss each;
- fused optimizer kernels (``tf.compat.v1.train``): the gradients go straight into
  ``ResourceApply*``, and optimizer slots are seen by those kernels only;
- sparse updates: TensorFlow keeps the variable in copy-on-read mode, each read copies it.
"""

from __future__ import annotations

from graphs import t

from lmscore.ir import Graph, Op
from lmscore.memory import simulate
from lmscore.order import order
from lmscore.shapes import resolve

F = "float"


def _by_name(graph: Graph, values) -> dict[str, object]:
    return {op.name: v for op, v in zip(graph.ops, values, strict=True)}


def _tape(k: int, layer_input: str, act: tuple[int, int], weight: tuple[int, int]) -> list[Op]:
    """Tape ``k``: seeded by the constant ``ones{k}``, the gradient of loss``k`` = sum(a``k``)
    for w``k``, through ``ReluGrad`` and the weight's ``MatMul``, applied by SGD."""
    return [
        Op(f"ones{k}", "Const", outputs=t(F), attrs={"value": (1.0,)}),
        Op(f"shape{k}", "Shape", inputs=(f"a{k}:0",), outputs=t("int32", 2)),
        Op(f"g_tile{k}", "BroadcastTo", inputs=(f"ones{k}:0", f"shape{k}:0"),
           outputs=t(F, *act)),
        Op(f"g_relu{k}", "ReluGrad", inputs=(f"g_tile{k}:0", f"a{k}:0"), outputs=t(F, *act)),
        Op(f"g_w{k}", "MatMul", inputs=(f"{layer_input}:0", f"g_relu{k}:0"),
           outputs=t(F, *weight), attrs={"transpose_a": True}),
        Op(f"upd{k}", "Mul", inputs=(f"g_w{k}:0", "lr:0"), outputs=t(F, *weight)),
        Op(f"apply{k}", "AssignSubVariableOp", inputs=(f"w{k}:0", f"upd{k}:0")),
    ]


def two_tape_step() -> Graph:
    """Model A: a1 = relu(x @ w1), loss1 = sum(a1); model B: a2 = relu(a1 @ w2), loss2.

    Tape 1 differentiates loss1 for w1, tape 2 loss2 for w2 only (a discriminator's loss
    on a generator's output); the step returns loss1.
    """
    ops = [
        Op("x", "Placeholder", outputs=t(F, 2, 4)),
        Op("w1", "Placeholder", outputs=t("resource")),
        Op("w2", "Placeholder", outputs=t("resource")),
        Op("axes", "Const", outputs=t("int32", 2), attrs={"value": (0, 1)}),
        Op("lr", "Const", outputs=t(F), attrs={"value": (0.1,)}),
        Op("r1", "ReadVariableOp", inputs=("w1:0",), outputs=t(F, 4, 4)),
        Op("r2", "ReadVariableOp", inputs=("w2:0",), outputs=t(F, 4, 2)),
        Op("mm1", "MatMul", inputs=("x:0", "r1:0"), outputs=t(F, 2, 4)),
        Op("a1", "Relu", inputs=("mm1:0",), outputs=t(F, 2, 4)),
        Op("loss1", "Sum", inputs=("a1:0", "axes:0"), outputs=t(F)),
        Op("mm2", "MatMul", inputs=("a1:0", "r2:0"), outputs=t(F, 2, 2)),
        Op("a2", "Relu", inputs=("mm2:0",), outputs=t(F, 2, 2)),
        Op("loss2", "Sum", inputs=("a2:0", "axes:0"), outputs=t(F)),
        *_tape(1, "x", (2, 4), (4, 4)),
        *_tape(2, "a1", (2, 2), (4, 2)),
        Op("out", "Identity", inputs=("loss1:0",), control_inputs=("apply1", "apply2"),
           outputs=t(F)),
    ]
    return Graph(tuple(ops), "two_tapes")


def test_two_tapes_have_a_seed_and_a_loss_each():
    g = two_tape_step()
    o = order(g)
    assert o.loss == "loss1"  # the one the step returns
    assert o.losses == ("loss1", "loss2")
    cats = _by_name(g, o.categories)
    assert {k: cats[k] for k in ("mm1", "a1", "loss1", "mm2", "a2", "loss2")} == dict.fromkeys(
        ("mm1", "a1", "loss1", "mm2", "a2", "loss2"), "forward")
    backward = ("shape1", "g_tile1", "g_relu1", "g_w1", "shape2", "g_tile2", "g_relu2", "g_w2")
    assert {k: cats[k] for k in backward} == dict.fromkeys(backward, "backward")
    assert {k: cats[k] for k in ("upd1", "apply1", "upd2", "apply2")} == dict.fromkeys(
        ("upd1", "apply1", "upd2", "apply2"), "update")


def test_the_second_tape_alone_does_not_change_the_first():
    # Without tape 2 (its ops and its write), the step is a one-tape step: one loss.
    g = two_tape_step()
    keep = [op for op in g.ops if not op.name.endswith("2") or op.name in ("w2", "r2")]
    keep = [op if op.name != "out" else Op("out", "Identity", inputs=("loss1:0",),
                                            control_inputs=("apply1",), outputs=t(F))
            for op in keep]
    one = Graph(tuple(keep), "one_tape")
    assert order(one).losses == ("loss1",)


def fused_apply_step(dense_slot: bool = True) -> Graph:
    """A mean loss at a fixed batch of 2, its gradient applied by ``ResourceApplyMomentum``.

    The mean's gradient divides the constant 1 by the constant batch size: nothing in it
    depends on the data until ``ReluGrad``, and every use of it ends in the apply.
    """
    ops = [
        Op("x", "Placeholder", outputs=t(F, 2, 4)),
        Op("w", "Placeholder", outputs=t("resource")),
        Op("accum", "Placeholder", outputs=t("resource")),  # the momentum slot
        Op("axes", "Const", outputs=t("int32", 2), attrs={"value": (0, 1)}),
        Op("lr", "Const", outputs=t(F), attrs={"value": (0.1,)}),
        Op("momentum", "Const", outputs=t(F), attrs={"value": (0.9,)}),
        Op("n", "Const", outputs=t(F), attrs={"value": (4.0,)}),
        Op("shape", "Const", outputs=t("int32", 2), attrs={"value": (2, 2)}),
        Op("r", "ReadVariableOp", inputs=("w:0",), outputs=t(F, 4, 2)),
        Op("mm", "MatMul", inputs=("x:0", "r:0"), outputs=t(F, 2, 2)),
        Op("act", "Relu", inputs=("mm:0",), outputs=t(F, 2, 2)),
        Op("total", "Sum", inputs=("act:0", "axes:0"), outputs=t(F)),
        Op("loss", "RealDiv", inputs=("total:0", "n:0"), outputs=t(F)),
        Op("ones", "Const", outputs=t(F), attrs={"value": (1.0,)}),
        Op("g_mean", "RealDiv", inputs=("ones:0", "n:0"), outputs=t(F)),
        Op("g_tile", "BroadcastTo", inputs=("g_mean:0", "shape:0"), outputs=t(F, 2, 2)),
        Op("g_relu", "ReluGrad", inputs=("g_tile:0", "act:0"), outputs=t(F, 2, 2)),
        Op("g_w", "MatMul", inputs=("x:0", "g_relu:0"), outputs=t(F, 4, 2),
           attrs={"transpose_a": True}),
        Op("apply", "ResourceApplyMomentum",
           inputs=("w:0", "accum:0", "lr:0", "g_w:0", "momentum:0"), attrs={"T": F}),
        Op("out", "Identity", inputs=("loss:0",), control_inputs=("apply",), outputs=t(F)),
    ]
    return Graph(tuple(ops), "fused_apply")


def test_gradients_applied_by_a_fused_kernel_are_the_backward_pass():
    g = fused_apply_step()
    o = order(g)
    assert o.loss == "loss"
    cats = _by_name(g, o.categories)
    assert {k: cats[k] for k in ("mm", "act", "total", "loss")} == dict.fromkeys(
        ("mm", "act", "total", "loss"), "forward")
    # (g_mean and g_tile compute on constants only and lead only to the apply: without
    # the apply's gradient input they were taken for optimizer arithmetic)
    backward = ("g_mean", "g_tile", "g_relu", "g_w")
    assert {k: cats[k] for k in backward} == dict.fromkeys(backward, "backward")
    assert cats["apply"] == "update"


def test_a_slot_seen_only_by_its_apply_is_the_size_of_the_gradient():
    # ResourceApplyMomentum takes the gradient fourth, the momentum last (a scalar).
    sizes = resolve(fused_apply_step(), 2)
    assert sizes.variable_bytes == {"w": 32, "accum": 32}
    assert simulate(fused_apply_step(), 2).persistent_bytes == 2 * 32 + 8 + 4 * 4 + 8


def sparse_step(update: str) -> Graph:
    """An embedding table (100 x 8 float32, 3200 B) read whole, then updated.

    ``update`` is ``"sparse"`` (``ResourceSparseApplyAdagrad`` of 2 rows, its slot seen
    by it alone) or ``"dense"`` (``AssignAddVariableOp``).
    """
    ops = [
        Op("table", "Placeholder", outputs=t("resource")),
        Op("accum", "Placeholder", outputs=t("resource")),
        Op("idx", "Placeholder", outputs=t("int32", 2)),
        Op("lr", "Const", outputs=t(F), attrs={"value": (0.1,)}),
        Op("read", "ReadVariableOp", inputs=("table:0",), outputs=t(F, 100, 8)),
        Op("rows", "GatherV2", inputs=("read:0", "idx:0"), outputs=t(F, 2, 8)),
        Op("grad", "Neg", inputs=("rows:0",), outputs=t(F, 2, 8)),
    ]
    if update == "sparse":
        ops.append(Op("apply", "ResourceSparseApplyAdagrad",
                      inputs=("table:0", "accum:0", "lr:0", "grad:0", "idx:0"),
                      attrs={"T": F}))
    else:
        ops += [
            Op("full", "ScatterNd", inputs=("idx:0", "grad:0"), outputs=t(F, 100, 8)),
            Op("apply", "AssignAddVariableOp", inputs=("table:0", "full:0")),
        ]
    ops.append(Op("out", "Identity", inputs=("rows:0",), control_inputs=("apply",),
                  outputs=t(F, 2, 8)))
    return Graph(tuple(ops), f"{update}_update")


def test_a_sparsely_updated_variable_is_copied_by_each_read():
    sparse = simulate(sparse_step("sparse"), 1)
    assert sparse.persistent_bytes == 2 * 3200 + 4
    copies = {b.tensor: b.bytes for b in sparse.buffers if b.tensor == "read:0"}
    assert copies == {"read:0": 3200}
    # A dense update leaves the read a view of the variable's own buffer.
    dense = simulate(sparse_step("dense"), 1)
    assert not [b for b in dense.buffers if b.tensor == "read:0"]
    assert sparse_step("sparse").copy_on_read == frozenset({(0, 0)})
    assert sparse_step("dense").copy_on_read == frozenset()


def split_step(columns: int, parts: int = 2) -> Graph:
    """x (4 x ``columns`` float32) split along its first axis into ``parts``, each summed."""
    ops = [
        Op("x", "Placeholder", outputs=t(F, 4, columns)),
        Op("axis", "Const", outputs=t("int32"), attrs={"value": (0,)}),
        Op("split", "Split", inputs=("axis:0", "x:0"),
           outputs=t(F, 4 // parts, columns) * parts, attrs={"num_split": parts}),
        *(Op(f"e{k}", "Exp", inputs=(f"split:{k}",), outputs=t(F, 4 // parts, columns))
          for k in range(parts)),
        Op("out", "AddN", inputs=tuple(f"e{k}:0" for k in range(parts)),
           outputs=t(F, 4 // parts, columns)),
    ]
    return Graph(tuple(ops), "split")


def test_a_split_of_aligned_rows_is_views_of_its_input():
    # Rows of 16 floats (64 B) keep TensorFlow's alignment: the parts are slices of x.
    aligned = {b.tensor for b in simulate(split_step(16), 1).buffers}
    assert not aligned & {"split:0", "split:1"}
    # Rows of 3 floats (12 B) do not: each part is a new buffer.
    copied = {b.tensor: b.bytes for b in simulate(split_step(3), 1).buffers}
    assert (copied["split:0"], copied["split:1"]) == (24, 24)
    # One part is the input itself.
    assert "split:0" not in {b.tensor for b in simulate(split_step(3, 1), 1).buffers}


def test_a_split_without_its_inputs_is_no_view():
    # A malformed GraphDef (a fuzzed one): a Split with its value but no axis.
    g = Graph((Op("x", "Placeholder", outputs=t(F, 4, 16)),
               Op("split", "Split", inputs=("x:0",), outputs=t(F, 4, 16))))
    assert {b.tensor: b.bytes for b in simulate(g, 1).buffers} == {"split:0": 256}


def test_a_loss_with_a_weight_penalty_is_the_sum_when_the_step_returns_a_metric():
    """loss = sum(relu(x @ w)) + 1e-4 * l2(w), recorded in a metric the step returns.

    The loss only feeds the tape and a write (the metric's total), so the finder walks
    back from it through values that only scale it for a write; the penalty, computed
    from the weight alone, is a term of the loss, not a scale: the loss is the sum (it
    was the cross-entropy's part, found by walking back into it).
    """
    ops = [
        Op("x", "Placeholder", outputs=t(F, 2, 4)),
        Op("w", "Placeholder", outputs=t("resource")),
        Op("total", "Placeholder", outputs=t("resource")),
        Op("axes", "Const", outputs=t("int32", 2), attrs={"value": (0, 1)}),
        Op("lr", "Const", outputs=t(F), attrs={"value": (0.1,)}),
        Op("decay", "Const", outputs=t(F), attrs={"value": (1e-4,)}),
        Op("r", "ReadVariableOp", inputs=("w:0",), outputs=t(F, 4, 4)),
        Op("mm", "MatMul", inputs=("x:0", "r:0"), outputs=t(F, 2, 4)),
        Op("a", "Relu", inputs=("mm:0",), outputs=t(F, 2, 4)),
        Op("ce", "Sum", inputs=("a:0", "axes:0"), outputs=t(F)),
        Op("l2", "L2Loss", inputs=("r:0",), outputs=t(F)),
        Op("pen", "Mul", inputs=("decay:0", "l2:0"), outputs=t(F)),
        Op("loss", "AddV2", inputs=("ce:0", "pen:0"), outputs=t(F)),
        Op("ones", "Const", outputs=t(F), attrs={"value": (1.0,)}),
        Op("shape", "Shape", inputs=("a:0",), outputs=t("int32", 2)),
        Op("g_tile", "BroadcastTo", inputs=("ones:0", "shape:0"), outputs=t(F, 2, 4)),
        Op("g_relu", "ReluGrad", inputs=("g_tile:0", "a:0"), outputs=t(F, 2, 4)),
        Op("g_mm", "MatMul", inputs=("x:0", "g_relu:0"), outputs=t(F, 4, 4),
           attrs={"transpose_a": True}),
        Op("g_pen", "Mul", inputs=("ones:0", "decay:0"), outputs=t(F)),
        Op("g_l2", "Mul", inputs=("r:0", "g_pen:0"), outputs=t(F, 4, 4)),
        Op("g_w", "AddN", inputs=("g_mm:0", "g_l2:0"), outputs=t(F, 4, 4)),
        Op("upd", "Mul", inputs=("g_w:0", "lr:0"), outputs=t(F, 4, 4)),
        Op("apply", "AssignSubVariableOp", inputs=("w:0", "upd:0")),
        Op("record", "AssignAddVariableOp", inputs=("total:0", "loss:0")),
        Op("metric", "ReadVariableOp", inputs=("total:0",), control_inputs=("record",),
           outputs=t(F)),
        Op("out", "Identity", inputs=("metric:0",), control_inputs=("apply",), outputs=t(F)),
    ]
    g = Graph(tuple(ops), "penalty")
    o = order(g)
    assert o.loss == "loss"
    cats = _by_name(g, o.categories)
    assert cats["ce"] == cats["loss"] == "forward"
    assert cats["g_relu"] == cats["g_mm"] == cats["g_w"] == "backward"
    # (the penalty and its gradient, computed from the weight alone, are taken for
    # optimizer arithmetic, as weight decay is: "update")
