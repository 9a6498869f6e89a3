"""Categories and the loss on the zoo, against what is known from how each step was built.

Every node is renamed to a meaningless name first, so names cannot help the tool. Checked:
the loss is the op that computes the loss value (or an Identity of it); every op of the
forward pass that produces a floating-point tensor of rank >= 1 on the way to the loss is
``forward``; every such op TensorFlow's gradient tape created (named ``gradient_tape/``
before renaming) is ``backward``. Integer and shape bookkeeping (``Shape`` of a forward
tensor in the gradient's scope, the indices of a sparse gradient) is not checked: it
belongs to either side and holds no memory worth planning.
"""

from __future__ import annotations

import pytest
import zoo

from lmscore.ir import Graph, Op
from lmscore.order import BACKWARD, FORWARD, order

pytestmark = pytest.mark.tf

_FLOATS = {"float", "half", "bfloat16", "double"}


def renamed(g: Graph) -> tuple[Graph, dict[str, str]]:
    new = {op.name: f"n{i}" for i, op in enumerate(g.ops)}

    def ref(t: str) -> str:
        name, _, port = t.rpartition(":")
        return f"{new[name]}:{port}"

    ops = tuple(
        Op(new[op.name], op.type, op.device, tuple(ref(t) for t in op.inputs),
           tuple(new[c] for c in op.control_inputs), op.outputs, op.attrs)
        for op in g.ops
    )
    return Graph(ops, source=g.source, functions=g.functions), new


def _loss_chain(g: Graph, built_loss: str) -> set[str]:
    """The loss identity and the ops it reads through Identity chains."""
    i = g.index[built_loss]
    chain = {built_loss}
    adj = g.adjacency
    while g.ops[i].type == "Identity" and adj.data_in[i]:
        i = adj.data_in[i][0][0]
        chain.add(g.ops[i].name)
    return chain


def _ancestors(g: Graph, i: int) -> set[int]:
    seen, stack = {i}, [i]
    while stack:
        for p, _ in g.adjacency.data_in[stack.pop()]:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return seen


@pytest.mark.parametrize("name", zoo.SMALL)
def test_categories_and_loss_as_built(name: str) -> None:
    g = zoo.graph(name)
    built = zoo.build_info(name)
    loss_name = next(op.name for op in g.ops if op.name.rpartition("/")[2] == built["loss"])
    r, new = renamed(g)
    o = order(r)
    back = {v: k for k, v in new.items()}
    assert o.loss is not None, f"{name}: no loss found"
    assert back[o.loss] in _loss_chain(g, loss_name), f"{name}: loss {back[o.loss]}"
    on_path = _ancestors(g, g.index[loss_name])
    wrong = []
    for i, op in enumerate(g.ops):
        spec = op.outputs[0] if op.outputs else None
        if spec is None or spec.dtype not in _FLOATS or not spec.shape:
            continue
        cat = o.categories[i]
        if op.name.startswith("gradient_tape/") and cat != BACKWARD:
            wrong.append((op.name, op.type, cat))
        elif (i in on_path and op.name.startswith(built["forward_prefixes"])
              and cat != FORWARD and op.type not in ("ReadVariableOp", "Const")):
            wrong.append((op.name, op.type, cat))
    assert not wrong, f"{name}: {len(wrong)} ops: {wrong[:5]}"
