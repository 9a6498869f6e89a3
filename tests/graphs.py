"""Tiny hand-built graphs shared by the tests."""

from __future__ import annotations

from lmscore.ir import Graph, Op, TensorSpec


def t(dtype: str, *shape: int) -> tuple[TensorSpec, ...]:
    return (TensorSpec(dtype, tuple(shape)),)


def tiny_step(names: dict[str, str] | None = None) -> Graph:
    """A hand-written SGD training step: relu(x @ w) summed, one gradient, one update.

    ``names`` renames nodes (to check that nothing depends on names).
    """
    n = names or {}

    def nm(k: str) -> str:
        return n.get(k, k)

    def ins(*xs: str) -> tuple[str, ...]:
        return tuple(f"{nm(a)}:{p}" for a, p in (x.split(":") for x in xs))

    f = "float"
    ops = [
        Op(nm("x"), "Placeholder", outputs=t(f, -1, 4)),
        Op(nm("w"), "Placeholder", outputs=t("resource")),
        Op(nm("axes"), "Const", outputs=t("int32", 2), attrs={"value": (0, 1)}),
        Op(nm("ones"), "Const", outputs=t(f), attrs={"value": (1.0,)}),
        Op(nm("lr"), "Const", outputs=t(f), attrs={"value": (0.1,)}),
        Op(nm("r"), "ReadVariableOp", inputs=ins("w:0"), outputs=t(f, 4, 2)),
        Op(nm("mm"), "MatMul", inputs=ins("x:0", "r:0"), outputs=t(f, -1, 2)),
        Op(nm("act"), "Relu", inputs=ins("mm:0"), outputs=t(f, -1, 2)),
        Op(nm("loss"), "Sum", inputs=ins("act:0", "axes:0"), outputs=t(f)),
        Op(nm("shape_act"), "Shape", inputs=ins("act:0"), outputs=t("int32", 2)),
        Op(nm("g_tile"), "BroadcastTo", inputs=ins("ones:0", "shape_act:0"), outputs=t(f, -1, 2)),
        Op(nm("g_relu"), "ReluGrad", inputs=ins("g_tile:0", "act:0"), outputs=t(f, -1, 2)),
        Op(nm("g_w"), "MatMul", inputs=ins("x:0", "g_relu:0"), outputs=t(f, 4, 2),
           attrs={"transpose_a": True}),
        Op(nm("upd"), "Mul", inputs=ins("g_w:0", "lr:0"), outputs=t(f, 4, 2)),
        Op(nm("apply"), "AssignSubVariableOp", inputs=ins("w:0", "upd:0")),
        Op(nm("out"), "Identity", inputs=ins("loss:0"), control_inputs=(nm("apply"),),
           outputs=t(f)),
    ]
    return Graph(tuple(ops), "tiny_step")


TINY_LEVELS = {
    "x": 0, "w": 0, "axes": 0, "ones": 0, "lr": 0, "r": 1, "mm": 2, "act": 3, "loss": 4,
    "shape_act": 4, "g_tile": 5, "g_relu": 6, "g_w": 7, "upd": 8, "apply": 9, "out": 10,
}
TINY_CATEGORIES = {
    "x": "input", "w": "persistent", "axes": "persistent", "ones": "persistent",
    "lr": "persistent", "r": "persistent", "mm": "forward", "act": "forward",
    "loss": "forward", "shape_act": "backward", "g_tile": "backward", "g_relu": "backward",
    "g_w": "backward", "upd": "update", "apply": "update", "out": "forward",
}
# At batch 2: variable 32 B + consts (8 + 4 + 4) = 48 persistent, feed x 32 B; see
# tests/test_core.py for the buffer-by-buffer derivation.
TINY_CURVE_B2 = (80, 80, 96, 96, 108, 124, 116, 132, 116, 116, 84)


def long_edge(batch: int = 1) -> Graph:
    """x -> a(4000 B) -> b -> c(4000 B) -> d -> e -> f(e, a) -> g; a is read at 2 and 6.

    ``batch=-1`` gives every tensor an unknown batch dimension (4000 B per sample).
    """
    big, small = t("float", batch, 1000), t("float", batch, 8)
    return Graph((
        Op("x", "Placeholder", outputs=small),
        Op("a", "Conv2D", inputs=("x:0",), outputs=big),
        Op("b", "Conv2D", inputs=("a:0",), outputs=small),
        Op("c", "Conv2D", inputs=("b:0",), outputs=big),
        Op("d", "Conv2D", inputs=("c:0",), outputs=small),
        Op("e", "Conv2D", inputs=("d:0",), outputs=small),
        Op("f", "Conv2D", inputs=("e:0", "a:0"), outputs=small),
        Op("g", "Conv2D", inputs=("f:0",), outputs=small),
    ), "long_edge" if batch == 1 else "batched_long_edge")
