"""Property tests over random DAGs: ordering and simulator invariants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lmscore.ir import Graph, Op, TensorSpec
from lmscore.memory import simulate
from lmscore.order import order

TYPES = ("Conv2D", "Relu", "AddV2", "Identity", "Tanh")  # Conv2D: no shape rule


@st.composite
def dags(draw, plain: bool = False, known: bool = False):
    n = draw(st.integers(2, 40))
    ops = [Op("n0", "Placeholder", outputs=(TensorSpec("float", (-1, 4)),))]
    for i in range(1, n):
        k = draw(st.integers(0, min(3, i)))
        ins = draw(st.lists(st.integers(0, i - 1), min_size=k, max_size=k))
        ctl = draw(st.lists(st.integers(0, i - 1), max_size=2 if i > 1 else 0, unique=True))
        typ = "Conv2D" if plain else draw(st.sampled_from(TYPES))
        if typ == "Identity" and not ins:
            typ = "Conv2D"
        rows = draw(st.sampled_from((2, 3) if known else (1, 2, 3)))
        if typ == "Identity":  # a view has its input's shape
            shape = ops[ins[0]].outputs[0].shape
            rows = 1 if shape[0] == -1 else shape[0]
        ops.append(Op(
            f"n{i}", typ,
            inputs=tuple(f"n{j}:0" for j in ins),
            control_inputs=tuple(f"n{j}" for j in ctl),
            outputs=(TensorSpec("float", (-1, 4) if rows == 1 else (rows, 4)),),
        ))
    perm = draw(st.permutations(range(n)))
    return Graph(tuple(ops[j] for j in perm), "random")


@settings(max_examples=150, deadline=None)
@given(dags())
def test_levels_respect_every_edge(g):
    o = order(g)
    lv = dict(zip((op.name for op in g.ops), o.levels, strict=True))
    for op in g.ops:
        preds = [t.split(":")[0] for t in op.inputs] + list(op.control_inputs)
        if not preds:
            assert lv[op.name] == 0
        else:
            assert lv[op.name] == 1 + max(lv[p] for p in preds)
    assert sorted(o.topo) == list(range(len(g.ops)))
    assert all(o.levels[a] <= o.levels[b] for a, b in zip(o.topo, o.topo[1:], strict=False))


@settings(max_examples=150, deadline=None)
@given(dags(), st.integers(1, 5))
def test_curve_is_the_sum_of_live_buffers(g, batch):
    sim = simulate(g, batch)
    o = order(g)
    base = sim.persistent_bytes + sim.input_bytes
    live = [
        base + sum(b.bytes for b in sim.buffers if b.first <= p <= b.last)
        for p in range(len(g.ops))
    ]
    assert all(v >= base >= 0 for v in live)
    for level, value in enumerate(sim.device_curve):
        at = [p for p, i in enumerate(o.schedule) if o.levels[i] == level]
        assert value == max(live[p] for p in at)
        assert sim.level_peak_position[level] in at
    assert sim.peak_bytes == max(live) == max(sim.device_curve)


@settings(max_examples=100, deadline=None)
@given(dags())
def test_schedule_runs_each_op_after_its_producers(g):
    o = order(g)
    pos = {g.ops[i].name: k for k, i in enumerate(o.schedule)}
    assert sorted(o.schedule) == list(range(len(g.ops)))
    for op in g.ops:
        for p in [t.split(":")[0] for t in op.inputs] + list(op.control_inputs):
            assert pos[p] < pos[op.name]


@settings(max_examples=150, deadline=None)
@given(dags(plain=True), st.integers(1, 5))
def test_peak_equals_brute_force_liveness(g, batch):
    """Without views or in-place ops every output is its own buffer: count by hand."""
    o = order(g)
    lv = dict(zip((op.name for op in g.ops), o.levels, strict=True))
    pos = {g.ops[i].name: k for k, i in enumerate(o.schedule)}
    last = dict(pos)
    for op in g.ops:
        for t in op.inputs:
            p = t.split(":")[0]
            last[p] = max(last[p], pos[op.name])
    # An unknown leading dimension is the batch when the tensor is computed from the feed;
    # otherwise its size is unknown and counts 0.
    from_feed = {}
    for op in sorted(g.ops, key=lambda op: pos[op.name]):
        from_feed[op.name] = op.type == "Placeholder" or any(
            from_feed[t.split(":")[0]] for t in op.inputs
        )
    size = {}
    for op in g.ops:
        rows = op.outputs[0].shape[0]
        if rows == -1:
            rows = batch if from_feed[op.name] else 0
        size[op.name] = rows * 4 * 4
    feed = sum(size[op.name] for op in g.ops if op.type == "Placeholder")
    at_pos = [
        feed + sum(
            size[op.name] for op in g.ops
            if op.type != "Placeholder" and pos[op.name] <= p <= last[op.name]
        )
        for p in range(len(g.ops))
    ]
    curve = [
        max(at_pos[pos[op.name]] for op in g.ops if lv[op.name] == level)
        for level in range(max(lv.values()) + 1)
    ]
    sim = simulate(g, batch)
    assert list(sim.device_curve) == curve
    assert sim.peak_bytes == max(at_pos)


@settings(max_examples=100, deadline=None)
@given(dags(known=True), st.integers(1, 4))
def test_views_and_in_place_never_raise_the_peak(g, batch):
    plain = Graph(tuple(
        Op(op.name, "Conv2D" if op.type != "Placeholder" else op.type, op.device, op.inputs,
           op.control_inputs, op.outputs)
        for op in g.ops
    ))
    assert simulate(g, batch).peak_bytes <= simulate(plain, batch).peak_bytes
