"""Random hand-made plans on random graphs: refused with a one-line PlanError, or rewritten.

Plans from the TFLMS knobs only ever hold far consumers grouped by level and triggers found
by :func:`find_trigger`. Hand edits and plan files can hold anything, so these plans are
drawn by hand: any tensor that has readers, any subset and grouping of its readers, valid
and invalid triggers, and deliberate faults. :func:`refusal` restates the rules documented
by :func:`check_plan` independently (networkx paths, levels recomputed), so a check that
refuses too much or too little fails here, not only one that crashes. The ``tf`` test runs
random executable graphs before and after a random rewrite, exported for the two-CPU
emulation, and compares every value bit for bit.
"""

from __future__ import annotations

import dataclasses

import networkx as nx
import numpy as np
import pytest
from graphs import long_edge
from hypothesis import event, given, settings
from hypothesis import strategies as st
from test_properties import dags

from lmscore.errors import LmsError, PlanError
from lmscore.ir import Graph, lint, split_tensor
from lmscore.memory import simulate
from lmscore.order import order
from lmscore.plan import (
    PLAN_VERSION,
    Plan,
    Swap,
    SwapIn,
    add_swap,
    candidates,
    check_plan,
    empty_plan,
    find_trigger,
    fingerprint,
    move_trigger,
    plan_from_json,
    plan_from_params,
    reaches,
    regroup,
    remove_swap,
)
from lmscore.rewrite import rewrite
from lmscore.shapes import extend_sizes, resolve

BATCH = 2
GHOST = "ghost"  # no op has this name


def canonical(tensor: str) -> str:
    name, port = split_tensor(tensor)
    return f"{name}:{port}"


def readers_of(g: Graph, tensor: str) -> list[str]:
    """Ops reading ``tensor`` through a data edge, in graph order, each once."""
    return [op.name for op in g.ops if canonical(tensor) in op.inputs]


def far_readers(g: Graph, tensor: str, threshold: int) -> list[str]:
    """Readers more than ``threshold`` levels after the producer (none if it is unknown)."""
    name = split_tensor(tensor)[0]
    if name not in g.index:
        return []
    lv = order(g).levels
    return [c for c in readers_of(g, tensor) if lv[g.index[c]] - lv[g.index[name]] > threshold]


def tensors_with_readers(g: Graph) -> list[str]:
    tensors = {t for op in g.ops for t in op.inputs}
    return sorted(tensors, key=lambda t: (g.index[split_tensor(t)[0]], t))


# --- The documented rules, restated ------------------------------------------------------


def _levels(g: Graph) -> dict[str, int]:
    """Longest path from a source over data and control edges (the CTO level)."""
    dg = nx.DiGraph()
    dg.add_nodes_from(op.name for op in g.ops)
    for op in g.ops:
        dg.add_edges_from((split_tensor(t)[0], op.name) for t in op.inputs)
        dg.add_edges_from((c, op.name) for c in op.control_inputs)
    lv: dict[str, int] = {}
    for n in nx.topological_sort(dg):
        lv[n] = 1 + max((lv[p] for p in dg.predecessors(n)), default=-1)
    return lv


def refusal(g: Graph, plan: Plan) -> str | None:
    """Why ``check_plan`` must refuse ``plan`` (its docstring's list), or None."""
    if plan.version != PLAN_VERSION:
        return "version"
    if plan.graph != fingerprint(g):
        return "another graph"
    lv = _levels(g)
    reach = nx.DiGraph()
    reach.add_nodes_from(lv)
    for op in g.ops:
        preds = (split_tensor(t)[0] for t in (*op.inputs, *op.control_inputs))
        reach.add_edges_from((p, op.name) for p in preds)
    seen: set[str] = set()
    for s in plan.swaps:
        name, port = split_tensor(s.tensor)
        if s.tensor != canonical(s.tensor):
            return "not op:port"
        if name not in g.index or port >= len(g.op(name).outputs):
            return "unknown tensor"
        if s.tensor in seen:
            return "swapped twice"
        seen.add(s.tensor)
        if not s.swap_ins:
            return "no swap-in"
        readers = set(readers_of(g, s.tensor))
        served: set[str] = set()
        for grp in s.swap_ins:
            if not grp.consumers:
                return "empty group"
            for c in grp.consumers:
                if c not in readers:
                    return "not a reader"
                if c in served:
                    return "served twice"
                served.add(c)
            if grp.trigger is None:
                continue
            if grp.trigger not in g.index:
                return "unknown trigger"
            # The group's first consumer: lowest level, then graph order.
            first = min(grp.consumers, key=lambda c: (lv[c], g.index[c]))
            if lv[grp.trigger] <= lv[name]:
                return "trigger before the producer"
            if grp.trigger == first or not nx.has_path(reach, grp.trigger, first):
                return "trigger cannot reach the first consumer"
    n_levels = max(lv.values()) + 1
    if any(not 0 <= level < n_levels for level in plan.serialize):
        return "serialize level"
    return None


# --- Strategies ---------------------------------------------------------------------------


@st.composite
def triggers(draw, g: Graph, tensor: str, group: tuple[str, ...]):
    """A trigger check_plan must accept for ``group``.

    None, find_trigger's choice, or any op after the producer that reaches the group's
    first consumer.
    """
    lv = order(g).levels
    producer = g.index[split_tensor(tensor)[0]]
    first = min((g.index[c] for c in group), key=lambda c: (lv[c], c))
    valid = [
        op.name for i, op in enumerate(g.ops) if lv[i] > lv[producer] and reaches(g, i, first, lv)
    ]
    options = [st.none(), st.builds(
        lambda ahead, window: find_trigger(g, tensor, group, ahead, window),
        st.integers(1, 4), st.integers(0, 6),
    )]
    return draw(st.one_of([st.sampled_from(valid)] * 2 + options if valid else options))


@st.composite
def swaps(draw, g: Graph, tensor: str):
    """Some of the readers of ``tensor``, in random order and random groups.

    Readers two levels or more away are favoured: only their groups can have a trigger.
    """
    readers = st.sampled_from(readers_of(g, tensor))
    far = far_readers(g, tensor, 1)
    chosen = draw(st.lists(st.sampled_from(far) | readers if far else readers,
                           min_size=1, unique=True))
    n = len(chosen)
    labels = draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))
    groups = [
        tuple(c for c, lab in zip(chosen, labels, strict=True) if lab == k)
        for k in dict.fromkeys(labels)
    ]
    return Swap(tensor, tuple(SwapIn(grp, draw(triggers(g, tensor, grp))) for grp in groups))


@st.composite
def valid_plans(draw, g: Graph, min_swaps: int = 0):
    """A plan check_plan must accept; tensors come from ``candidates`` or have any reader."""
    pool = tensors_with_readers(g)
    cands = [c.tensor for c in candidates(g, resolve(g, BATCH), 1)]
    tensors = []
    if pool:
        pick = st.sampled_from(cands) | st.sampled_from(pool) if cands else st.sampled_from(pool)
        tensors = draw(st.lists(pick, min_size=min(min_swaps, len(pool)), max_size=4, unique=True))
    n_levels = order(g).num_levels
    return Plan(
        graph=fingerprint(g),
        swaps=tuple(draw(swaps(g, t)) for t in tensors),
        sync_mode=draw(st.integers(0, 3)),
        serialize=tuple(draw(st.lists(st.integers(0, n_levels - 1), max_size=2, unique=True))),
        params={"made": "by hand"},
    )


def _edit_group(plan: Plan, k: int, j: int, **change) -> Plan:
    s = plan.swaps[k]
    groups = list(s.swap_ins)
    groups[j] = dataclasses.replace(groups[j], **change)
    swaps_ = list(plan.swaps)
    swaps_[k] = Swap(s.tensor, tuple(groups))
    return dataclasses.replace(plan, swaps=tuple(swaps_))


@st.composite
def faulty(draw, g: Graph, plan: Plan):
    """``plan`` with up to three random faults (some of which happen to be harmless).

    """
    names = [op.name for op in g.ops]
    any_op = st.sampled_from([*names, GHOST])
    for _ in range(draw(st.integers(0, 3))):
        fault = draw(st.sampled_from((  # whole-plan faults are rarer: they mask the others
            "graph", "version", "serialize", "tensor", "port", "unread tensor", "twice",
            "no swap-in", "spelling", "empty group", *["consumer", "consumer twice"] * 2,
            *["trigger"] * 6,
        )))
        if fault == "graph":
            plan = dataclasses.replace(plan, graph="0" * 16)
        elif fault == "version":
            plan = dataclasses.replace(plan, version=PLAN_VERSION + 1)
        elif fault == "serialize":
            n_levels = order(g).num_levels
            level = draw(st.sampled_from((-1, n_levels)))
            plan = dataclasses.replace(plan, serialize=(*plan.serialize, level))
        elif fault in ("tensor", "port", "unread tensor"):
            op = g.op(draw(st.sampled_from(names)))
            tensor = {"tensor": f"{GHOST}:0", "port": f"{op.name}:{len(op.outputs)}",
                      "unread tensor": f"{op.name}:0"}[fault]
            consumers = tuple(draw(st.lists(any_op, min_size=1, max_size=3, unique=True)))
            swap = Swap(tensor, (SwapIn(consumers),))
            plan = dataclasses.replace(plan, swaps=(*plan.swaps, swap))
        elif not plan.swaps:
            continue
        else:
            k = draw(st.integers(0, len(plan.swaps) - 1))
            s = plan.swaps[k]
            j = draw(st.integers(0, len(s.swap_ins) - 1)) if s.swap_ins else None
            if fault == "twice":
                plan = dataclasses.replace(plan, swaps=(*plan.swaps, s))
            elif fault == "spelling":  # "a" or "a:00" for "a:0", alone or next to it
                name, port = split_tensor(s.tensor)
                spelled = Swap(draw(st.sampled_from((name, f"{name}:0{port}"))), s.swap_ins)
                keep = draw(st.booleans())
                swaps_ = (*plan.swaps[:k], *((s,) if keep else ()), spelled,
                          *plan.swaps[k + 1 :])
                plan = dataclasses.replace(plan, swaps=swaps_)
            elif fault == "no swap-in":
                swaps_ = (*plan.swaps[:k], Swap(s.tensor, ()), *plan.swaps[k + 1 :])
                plan = dataclasses.replace(plan, swaps=swaps_)
            elif j is None:
                continue
            elif fault == "empty group":
                plan = _edit_group(plan, k, j, consumers=())
            elif fault == "consumer":
                extra = draw(any_op)
                plan = _edit_group(plan, k, j, consumers=(*s.swap_ins[j].consumers, extra))
            elif fault == "consumer twice":
                served = [c for grp in s.swap_ins for c in grp.consumers]
                if not served:  # every group emptied by an earlier fault
                    continue
                c = draw(st.sampled_from(served))
                plan = _edit_group(plan, k, j, consumers=(*s.swap_ins[j].consumers, c))
            elif fault == "trigger":
                plan = _edit_group(plan, k, j, trigger=draw(any_op))
    return plan


# --- What an accepted plan must give ------------------------------------------------------


def one_line(e: LmsError) -> bool:
    text = str(e)
    return bool(text.strip()) and "\n" not in text and "\r" not in text


def check_rewrite(g: Graph, plan: Plan, rw) -> None:
    """``rw = rewrite(g, plan)`` is linted, wired as planned, simulates sanely."""
    new = rw.graph
    lint(new)
    assert fingerprint(new) == fingerprint(g)
    assert rw.plan == plan
    kept = plan.swapped()
    # Every added edge leads to a later level (and serialization follows source order), so
    # a checked plan cannot close a cycle and nothing is skipped.
    assert rw.skipped == ()
    roles = {op.name: op for op in new.ops if op.attrs.get("_lms_role")}
    assert len(new.ops) == len(g.ops) + len(roles)
    assert len(rw.swap_outs) == len(kept)
    assert len(rw.swap_ins) == sum(len(s.swap_ins) for s in rw.plan.swaps)
    assert set(roles) == set(rw.swap_outs) | set(rw.swap_ins)
    swap_in = {
        (op.attrs["_lms_tensor"], op.attrs["_lms_group"]): op
        for op in roles.values() if op.attrs["_lms_role"] == "swap_in"
    }
    rewired: dict[tuple[str, str], str] = {}
    for s in rw.plan.swaps:
        for k, grp in enumerate(s.swap_ins):
            sin = swap_in[(s.tensor, k)]
            (src,) = sin.inputs
            out = new.op(split_tensor(src)[0])
            assert out.attrs["_lms_role"] == "swap_out"
            assert tuple(map(canonical, out.inputs)) == (canonical(s.tensor),)
            assert sin.control_inputs == ((grp.trigger,) if grp.trigger else ())
            assert sin.outputs == out.outputs == (g.spec(s.tensor),)
            for c in grp.consumers:
                rewired[(c, canonical(s.tensor))] = f"{sin.name}:0"
    # Served consumers read their swap-in wherever they read the tensor; nothing else moves.
    for op in g.ops:
        now = new.op(op.name)
        assert now.inputs == tuple(rewired.get((op.name, t), t) for t in op.inputs), op.name
        assert set(op.control_inputs) <= set(now.control_inputs)
        assert (now.type, now.outputs) == (op.type, op.outputs)
    assert extend_sizes(resolve(g, BATCH), new) == resolve(new, BATCH)
    assert new.adjacency == Graph(new.ops, "fresh").adjacency  # patched == rebuilt
    sim = simulate(new, BATCH)
    assert min(sim.device_curve) >= sim.persistent_bytes + sim.input_bytes
    assert min(sim.host_curve) >= 0
    # Exactly the swap-outs allocate on the host, each the size of its tensor.
    sizes = resolve(g, BATCH)
    host = sorted((new.ops[b.producer].name, b.bytes) for b in sim.buffers if b.host)
    expected = []
    for s in rw.plan.swaps:
        name, port = split_tensor(s.tensor)
        out = next(o for o in roles.values() if o.attrs["_lms_role"] == "swap_out"
                   and o.attrs["_lms_tensor"] == s.tensor)
        expected.append((out.name, max(sizes.nbytes[g.index[name]][port], 0)))
    assert host == sorted(expected)
    assert sim.host_peak_bytes <= sum(b for _, b in host)


def refused_or_rewritten(g: Graph, plan: Plan):
    """The property every plan must have; returns the Rewrite, or None if refused."""
    try:
        check_plan(g, plan)
    except PlanError as e:
        assert one_line(e), str(e)
        with pytest.raises(PlanError):
            rewrite(g, plan)
        return None
    assert plan_from_json(plan.to_json()) == plan
    compact = plan.to_json(indent=None)
    assert plan_from_json(compact) == plan and compact.count("\n") == 1
    rw = rewrite(g, plan)
    check_rewrite(g, plan, rw)
    assert plan_from_json(rw.plan.to_json()) == rw.plan
    return rw


# --- Properties on the IR -----------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(dags(known=True), st.data())
def test_hand_made_plans_are_refused_exactly_when_invalid(g, data):
    plan = data.draw(valid_plans(g, min_swaps=1).flatmap(lambda p: faulty(g, p)), label="plan")
    why = refusal(g, plan)
    event(f"refused: {why}" if why else "accepted")
    rw = refused_or_rewritten(g, plan)
    assert (rw is None) == (why is not None), why
    if rw is not None:
        groups = [grp for s in plan.swaps for grp in s.swap_ins]
        event(f"accepted: {len(plan.swaps)} swaps, {len(groups)} swap-ins, "
              f"{sum(grp.trigger is not None for grp in groups)} triggered")


def _unswappable(g, tensor: str) -> str:
    """Why ``tensor`` is not swappable (lmscore.plan.swap_refusal), "" if it is."""
    from lmscore.order import order
    from lmscore.plan import swap_refusal
    from lmscore.shapes import resolve

    name, _, port = tensor.rpartition(":")
    i = g.index.get(name)
    if i is None or int(port) >= len(g.ops[i].outputs):
        return "unknown tensor"
    return swap_refusal(g, order(g), resolve(g, 1), i, int(port))


@settings(max_examples=100, deadline=None)
@given(dags(known=True), st.data())
def test_hand_edits_keep_plans_valid(g, data):
    """Random add/remove/regroup/move edits: each refused cleanly or giving a valid plan."""
    names = [op.name for op in g.ops]
    pool = tensors_with_readers(g) + [f"{GHOST}:0", f"{names[-1]}:1"]
    plan = data.draw(valid_plans(g, min_swaps=1) | st.just(empty_plan(g)), label="start")
    for _ in range(data.draw(st.integers(1, 8), label="edits")):
        edit = data.draw(st.sampled_from(("move", "regroup", "add", "remove")), label="edit")
        # Mostly a swapped tensor for the edits of swaps, mostly another one for add_swap.
        rare = data.draw(st.integers(0, 3)) == 3
        own = bool(plan.swaps) and rare == (edit == "add")
        tensor = data.draw(st.sampled_from(plan.swapped() if own else pool), label="tensor")
        intended = None  # the plan the edit documents, when it is fully determined
        try:
            if edit == "add":
                threshold, ahead, groupby, window = data.draw(st.tuples(
                    st.integers(1, 3), st.integers(1, 3), st.integers(0, 3), st.integers(0, 6)
                ))
                new = add_swap(g, plan, tensor, threshold=threshold, ahead=ahead,
                               groupby=groupby, window=window)
                (s,) = [s for s in new.swaps if s.tensor == tensor]
                assert not _unswappable(g, tensor)
                served = sorted(c for grp in s.swap_ins for c in grp.consumers)
                assert served == sorted(far_readers(g, tensor, threshold))
                assert new.swaps[:-1] == plan.swaps
            elif edit == "remove":
                new = remove_swap(plan, tensor)
                assert new.swaps == tuple(s for s in plan.swaps if s.tensor != tensor)
            elif edit == "regroup":
                readers = readers_of(g, tensor) or [GHOST]
                chosen = data.draw(st.lists(st.sampled_from(readers), min_size=1, unique=True))
                if data.draw(st.integers(0, 4)) == 0:
                    chosen.append(names[0])  # a source op reads nothing
                cut = data.draw(st.integers(1, len(chosen)))
                groups = [chosen[:cut], chosen[cut:]] if cut < len(chosen) else [chosen]
                new = regroup(g, plan, tensor, groups)
                (s,) = [s for s in new.swaps if s.tensor == tensor]
                assert [list(grp.consumers) for grp in s.swap_ins] == groups
            else:
                old = next((s for s in plan.swaps if s.tensor == tensor), None)
                n = len(old.swap_ins) if old else 1
                group = data.draw(st.integers(0, n - 1) | st.sampled_from((-1, n)), label="group")
                trigger = st.sampled_from([None, GHOST, *names])
                if old is not None and 0 <= group < len(old.swap_ins):
                    trigger = triggers(g, tensor, old.swap_ins[group].consumers) | trigger
                trigger = data.draw(trigger, label="trigger")
                if old is not None and 0 <= group < len(old.swap_ins):
                    intended = _edit_group(plan, plan.swaps.index(old), group, trigger=trigger)
                new = move_trigger(g, plan, tensor, group, trigger)
        except LmsError as e:
            event(f"{edit}: refused")
            assert isinstance(e, PlanError) and one_line(e), repr(e)
            if edit == "add":  # find_trigger's triggers are always valid
                assert (tensor in plan.swapped() or not far_readers(g, tensor, threshold)
                        or _unswappable(g, tensor)), (tensor, e)
            if intended is not None:
                assert refusal(g, intended) is not None, (intended, e)
            continue
        event(f"{edit}: done")
        assert refusal(g, new) is None
        if intended is not None:
            assert new == intended
        plan = new
    refused_or_rewritten(g, plan)


@settings(max_examples=60, deadline=None)
@given(dags(known=True), st.integers(1, 4), st.integers(1, 3), st.integers(0, 3), st.data())
def test_plans_from_params_then_hand_moved_triggers(g, threshold, ahead, groupby, data):
    """Knob plans with random triggers moved by hand stay within the same property."""
    plan = plan_from_params(g, BATCH, threshold=threshold, ahead=ahead, groupby=groupby,
                            sync_mode=data.draw(st.integers(0, 3)))
    assert refusal(g, plan) is None
    names = [op.name for op in g.ops]
    for i, s in enumerate(plan.swaps):
        for k in range(len(s.swap_ins)):
            if data.draw(st.booleans()):
                moved = _edit_group(plan, i, k, trigger=data.draw(st.sampled_from(names)))
                if refusal(g, moved) is None:
                    plan = moved
    refused_or_rewritten(g, plan)


# --- Defects these properties found (regressions) -----------------------------------------


@pytest.mark.parametrize("spelling", ["a", "a:00"])
def test_a_tensor_not_named_op_port_is_refused(spelling):
    g = long_edge()
    plan = Plan(fingerprint(g), (Swap(spelling, (SwapIn(("f",), "d"),)),))
    with pytest.raises(PlanError, match=rf"swap of '{spelling}': name the tensor as op:port "
                                        r"\('a:0'\)"):
        check_plan(g, plan)
    assert refused_or_rewritten(g, plan) is None


@pytest.mark.parametrize("trigger", [None, "d"])
def test_an_empty_consumer_group_is_refused(trigger):
    g = long_edge()
    plan = Plan(fingerprint(g), (Swap("a:0", (SwapIn(("f",)), SwapIn((), trigger))),))
    with pytest.raises(PlanError, match="swap of 'a:0': swap-in 1 has no consumers"):
        check_plan(g, plan)
    assert refused_or_rewritten(g, plan) is None
    with pytest.raises(PlanError, match="swap-in 1 has no consumers"):
        regroup(g, add_swap(g, empty_plan(g), "a:0", threshold=3, ahead=2), "a:0", [["f"], []])


def test_regroup_keeps_only_triggers_that_still_fit():
    g = long_edge()
    plan = add_swap(g, empty_plan(g), "a:0", threshold=3, ahead=2)  # f, triggered by d
    assert plan.swaps[0].swap_ins == (SwapIn(("f",), "d"),)
    for groups in (["f", "b"], ["b", "f"]):  # b (level 2) comes before d (level 4)
        new = regroup(g, plan, "a:0", [groups])
        assert new.swaps[0].swap_ins == (SwapIn(tuple(groups), None),)
    assert regroup(g, plan, "a:0", [["f"]]) == plan


# --- Executable graphs ---------------------------------------------------------------------

SHAPE = (4, 8)
UNARY = {"Tanh": "x", "Neg": "x", "Relu": "features", "Identity": "input"}
BINARY = ("AddV2", "Sub", "Mul")


@st.composite
def tf_specs(draw):
    """A random DAG as ``(kind, inputs, control inputs)`` per node, all of shape (4, 8).

    MatMul multiplies by a shared (8, 8) constant ``w``. Node 1 computes, so some tensor
    always has a reader. Inputs lean towards the previous node: deep graphs have room for
    triggers.
    """
    compute = st.sampled_from((*UNARY, *BINARY, "MatMul"))
    spec = [("Placeholder", (), ())]
    for k in range(1, draw(st.integers(4, 14))):
        kind = draw(compute if k == 1 else compute | st.sampled_from(("Placeholder", "Const")))
        arity = 2 if kind in BINARY else 0 if kind in ("Placeholder", "Const") else 1
        ins = tuple(k - 1 - draw(st.integers(0, k - 1)) for _ in range(arity))
        ctl = tuple(draw(st.lists(st.integers(0, k - 1), max_size=1))) if arity else ()
        spec.append((kind, ins, ctl))
    return spec


def build_graphdef(tf, spec) -> tuple[bytes, dict[str, np.ndarray]]:
    """The GraphDef of ``spec`` (with ``_output_shapes``) and fixed seeded feeds."""
    rng = np.random.default_rng(0)
    feeds = {}
    graph = tf.Graph()
    with graph.as_default():
        w = tf.constant(rng.standard_normal((8, 8)).astype(np.float32) / 3, name="w")
        out = []
        for k, (kind, ins, ctl) in enumerate(spec):
            name = f"n{k}"
            value = rng.standard_normal(SHAPE).astype(np.float32)
            with tf.control_dependencies([out[j].op for j in ctl]):
                if kind == "Placeholder":
                    t = tf.compat.v1.placeholder(tf.float32, SHAPE, name=name)
                    feeds[name] = value
                elif kind == "Const":
                    t = tf.constant(value, name=name)
                elif kind == "MatMul":
                    t = tf.raw_ops.MatMul(a=out[ins[0]], b=w, name=name)
                elif kind in UNARY:
                    t = getattr(tf.raw_ops, kind)(**{UNARY[kind]: out[ins[0]]}, name=name)
                else:
                    t = getattr(tf.raw_ops, kind)(x=out[ins[0]], y=out[ins[1]], name=name)
            out.append(t)
    return graph.as_graph_def(add_shapes=True).SerializeToString(), feeds


def run_graphdef(tf, data: bytes, fetches: list[str], feeds: dict[str, np.ndarray]) -> list:
    """Run a GraphDef once in a session with the emulation's two CPUs and no optimizer."""
    from lmscore.measure import _session_config

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(tf.compat.v1.GraphDef.FromString(data), name="")
    config = _session_config(devices=2, inter_op_threads=-1, intra_op_threads=0)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        return sess.run(fetches, {f"{k}:0": v for k, v in feeds.items()})


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check_emulated_values(tf, g: Graph, rw, exported: bytes, feeds: dict[str, np.ndarray]) -> None:
    """Every tensor of ``g`` and every swap-in has the value of the original run, bit for bit."""
    tensors = [f"{op.name}:{p}" for op in g.ops for p in range(len(op.outputs))]
    before = run_graphdef(tf, g.graphdef, tensors, feeds)
    swap_ins = [op for op in rw.graph.ops if op.attrs.get("_lms_role") == "swap_in"]
    after = run_graphdef(tf, exported, tensors + [f"{op.name}:0" for op in swap_ins], feeds)
    value = dict(zip(tensors, before, strict=True))
    for t, a, b in zip(tensors, before, after[: len(tensors)], strict=True):
        assert same_bits(a, b), t
    for op, b in zip(swap_ins, after[len(tensors) :], strict=True):
        assert same_bits(value[canonical(op.attrs["_lms_tensor"])], b), op.name


@pytest.fixture(scope="module")
def tf():
    # Imported outside the examples: TensorFlow's import raises the recursion limit.
    return pytest.importorskip("tensorflow")


@pytest.mark.tf
@settings(max_examples=40, deadline=None)
@given(tf_specs(), st.data())
def test_emulated_rewrite_of_random_graphs_is_bit_identical(tf, spec, data):
    from lmscore.export import to_graphdef
    from lmscore.load import from_graphdef_bytes

    gd, feeds = build_graphdef(tf, spec)
    g = from_graphdef_bytes(gd, source="random")
    plan = data.draw(valid_plans(g, min_swaps=1), label="plan")
    rw = refused_or_rewritten(g, plan)
    assert rw is not None and rw.swap_ins
    event(f"{len(rw.swap_ins)} swap-ins, {len(rw.synchronous)} synchronous")
    exported = to_graphdef(rw.graph, mode="emulate")
    check_emulated_values(tf, g, rw, exported, feeds)
