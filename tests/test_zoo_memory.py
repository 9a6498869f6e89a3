"""The simulator against TensorFlow's allocation records on the zoo's training steps.

Each step is traced in this process (``zoo.build``), run under TensorFlow and simulated
with the kernels TensorFlow really ran (oneDNN or Eigen, read from the records), so every
test holds with ``TF_ENABLE_ONEDNN_OPTS=0`` and ``=1`` alike. The device peak (persistent
memory + feeds + transient) of the unmodified step, simulated in the order the measured
session ran its ops, must be within 5% of the measured one; simulated in the simulator's
own order (the prediction), it must not be more than 5% below it. Where the executor's
order does not move the peak the two simulations are the same, so the prediction is then
within 5% too; where it does (the GAN), the executor draws its order anew in each session
and the simulator's order gave the highest peak of every session measured.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")
zoo = pytest.importorskip("zoo")

import lmscore  # noqa: E402
from lmscore.memory import cpu_kernel_library  # noqa: E402
from lmscore.validate import validate  # noqa: E402

pytestmark = pytest.mark.tf

TOLERANCE = 0.05

#: Models that cannot be brought within 5% yet: measured ratio and the exact cause.
#: (gpt_decoder's and transformer_encoder's copy-on-write variables, counted twice by the
#: records until lmscore.measure added the release of the old buffers, are now within 0.1%.)
KNOWN_GAPS: dict[str, str] = {}

#: Each traces and runs in seconds on 2 cores (all of them: about a minute).
SMALL = [name for name in zoo.SMALL if name not in ("efficientnet_b0", "mobilenet_v3_small")]
#: Thousands of ops each: tracing and importing take most of a minute.
LARGE = ["efficientnet_b0", "mobilenet_v3_small", *(e.name for e in zoo.ENTRIES if e.large)]


#: Sibling ops whose order oneDNN's layout pass draws anew in each session: it rebuilds the
#: nodes it rewrites (``Einsum`` into its own kernel) in a depth-first order over hash sets,
#: so two rewritten readers of one tensor run in either order (Eigen's kernels and a GPU
#: keep the graph's order, which the simulation follows). In moe_topk the expert layer's
#: input gradient frees its 2 MiB gathered weights; run second, they are held beside the
#: weight gradient (measured 1.278x the prediction in some sessions of a whole test run).
#: There the measured peak must be the simulated peak of the order with the pair swapped.
ONEDNN_SIBLINGS: dict[str, tuple[str, str]] = {
    "moe_topk": ("gradient_tape/fwd/einsum_1/Einsum", "gradient_tape/fwd/einsum_1/Einsum_1"),
}


def _check(name: str, batch: int | None = None) -> None:
    built = zoo.build(name)
    graph = lmscore.from_graphdef_bytes(built.graphdef, source=name)
    v = validate(graph, batch or built.batch)
    assert v.finite
    # The records tell which kernels ran; detection without running must agree.
    assert v.kernel_library == cpu_kernel_library()
    assert abs(v.replayed_ratio - 1) <= TOLERANCE, v
    if v.ratio < 1 - TOLERANCE and v.kernel_library == "onednn" and name in ONEDNN_SIBLINGS:
        assert abs(_swapped_peak(graph, v, ONEDNN_SIBLINGS[name]) / v.measured_peak_bytes
                   - 1) <= TOLERANCE, v
        return
    if v.ratio < 1 - TOLERANCE and abs(v.replayed_ratio - 1) <= 0.005:
        # exact in the order the executor took, which its two threads draw anew in each
        # session (sam_cnn: 0.932 in 2 sessions of a whole test run beside other work,
        # replayed 1.000): the median of three sessions
        ratios = sorted([v.ratio, *(validate(graph, batch or built.batch).ratio
                                    for _ in range(2))])
        assert ratios[1] >= 1 - TOLERANCE, (ratios, v)
        return
    assert v.ratio >= 1 - TOLERANCE, v


def _swapped_peak(graph, v, pair: tuple[str, str]) -> int:
    """The simulated peak with the two ops of ``pair`` run in each other's place."""
    from lmscore.memory import simulate
    from lmscore.order import order

    names = [graph.ops[i].name for i in order(graph).schedule]
    a, b = names.index(pair[0]), names.index(pair[1])
    names[a], names[b] = names[b], names[a]
    return simulate(graph, v.batch_size, workspace=v.kernel_library, executed=names).peak_bytes


#: Gaps whose size depends on the executor's order of independent ops in the measured
#: run: they may pass on some runs, so their xfail is not strict.
VARIABLE_GAPS: frozenset[str] = frozenset()


def _param(name: str):
    reason = KNOWN_GAPS.get(name)
    strict = name not in VARIABLE_GAPS
    marks = [pytest.mark.xfail(reason=reason, strict=strict)] if reason else []
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_param(n) for n in SMALL])
def test_small_zoo_peak_within_5_percent(name):
    _check(name)


def test_dropout_at_a_large_batch():
    """Batch 512 (not 8): the dropout gradients' SelectV2 write into the incoming gradient.

    Simulated 12% high until the simulator let ``Select``/``SelectV2`` forward their
    ``t``/``e`` inputs, as their kernels do; at batch 8 the buffers are too small to
    set the peak.
    """
    _check("mlp_dropout", 512)


@pytest.mark.parametrize("name,batch", [("gru_lstm", 512), ("bigru_rnn", 256)])
def test_recurrent_steps_at_a_large_batch(name, batch):
    """Loop iterations the executor runs ahead: what waits for the incoming gradient.

    A gradient loop's pops and the zeros of its list-write gradients do not wait for the
    gradient; the executor runs them ``parallel_iterations`` ahead as soon as the forward
    loop is done, and holds what they compute. The GRU+LSTM's GRU gradient waits for the
    whole LSTM, so all 20 of its iterations run ahead (simulated 0.936 of measured at
    batch 512 before they were modelled); the bidirectional GRU's two loops run side by
    side and get barely ahead of each other.
    """
    _check(name, batch)


def test_run_ahead_of_the_gru_lstm_gradient_loops():
    """Which part of each gradient loop runs ahead, and how far (no TensorFlow run).

    Every gradient loop waits for the gradient of its sequence output (loop variable 3)
    and, through it, for its carried gradients; what runs ahead per iteration is the
    batch x 48 float32 zeros of a ``TensorListSetItem`` gradient and a few shape vectors.
    The GRU's gradient loop waits for the whole LSTM (forward and gradient: 20 x its
    body's ops dispatched meanwhile), so all 20 iterations run ahead; the LSTM's gradient
    loop waits only for the dense layer's gradient, a couple of iterations.
    """
    from lmscore import memory
    from lmscore.order import order
    from lmscore.shapes import loop_body, resolve, trip_count

    graph, batch = zoo.graph("gru_lstm"), 512
    sizes, ordering = resolve(graph, batch), order(graph)
    windows = {}
    for i, op in enumerate(graph.ops):
        if not op.name.endswith("while_grad"):
            continue
        ins = graph.adjacency.data_in[i]
        body = loop_body(graph, i, tuple(sizes.shapes[p][q] for p, q in ins))
        arrivals = tuple(ordering.position[p] for p, _ in ins[: len(body.kinds)])
        assert max(arrivals) == arrivals[3]
        cost = memory._body_cost(body, batch, "accelerator", 0, arrivals)
        assert batch * 48 * 4 <= cost.ahead_bytes < batch * 48 * 4 + 20_000
        assert trip_count(graph, i, body, sizes.values.get) == 20
        windows[op.name.split("/")[3]] = memory._ahead_iterations(
            graph, ordering, sizes, cost, 20, max(arrivals))
    assert windows["gru_1"] == 20
    assert 1 <= windows["lstm_1"] <= 3


@pytest.mark.slow
@pytest.mark.parametrize("name", [_param(n) for n in LARGE])
def test_large_zoo_peak_within_5_percent(name):
    _check(name)


@pytest.mark.parametrize("name", ["gru_lstm", "bigru_rnn", "recurrent_dropout_rnn"])
def test_every_tensor_of_a_recurrent_step_has_a_size(name):
    """A loop's output sequence, stacked from the list it filled ([time, batch, units]),
    and its gradient's transpose by a computed permutation were counted as 0 bytes."""
    from lmscore.shapes import resolve

    e = zoo.BY_NAME[name]
    g = zoo.graph(name)
    sizes = resolve(g, e.batch)
    assert sizes.unknown == ()
    stacks = [i for i, op in enumerate(g.ops) if op.type == "TensorListStack"]
    assert stacks
    for i in stacks:
        shape = sizes.shapes[i][0]
        assert shape[1] == e.batch
        assert sizes.nbytes[i][0] == 4 * shape[0] * shape[1] * shape[2]


def test_a_conditional_branch_is_a_workspace_of_the_if():
    """The loss-scale optimizer's update runs in an ``If``: at the step's peak the branch's
    buffer (each momentum slot's new value) is listed with what it is, beside the gradients
    the ``If`` reads."""
    from lmscore.memory import live_tensor, simulate
    from lmscore.shapes import resolve

    g = zoo.graph("mixed_precision_mlp")
    sim = simulate(g, 8)
    at_peak = [b for b in sim.buffers if b.first <= sim.peak_position <= b.last]
    branch = [b for b in at_peak if b.tensor.endswith("/branch")]
    assert len(branch) == 1 and g.ops[branch[0].producer].type in ("If", "StatelessIf")
    # the slots' new values: as large as the float32 gradients the If holds
    grads = sum(b.bytes for b in at_peak if b.readers and branch[0].producer in b.readers)
    assert branch[0].bytes >= 0.99 * grads > 0
    row = live_tensor(g, branch[0], sizes=resolve(g, 8))
    assert row.reason == "what a conditional's branch allocates" and not row.swappable
    # what the web app's table says of it in a rewritten step (lmscore.evaluate.resident)
    from lmscore.evaluate import WORKSPACE, resident

    r = resident(g, branch[0])
    assert r.kind == WORKSPACE and r.held == row.reason


def test_loop_bodies_are_read():
    """The stacked LSTM's loops, as the simulator reads their bodies (no TensorFlow run).

    Each forward loop fills its gradient accumulators, passes the input sequence's list
    on, references that list's elements (one accumulator) and pushes each step's hidden
    state twice (as the cell's output and as the next step's input: one list duplicates
    the other); each gradient loop pops every accumulator.
    """
    from lmscore.shapes import loop_body, resolve

    graph = zoo.graph("stacked_lstm")
    sizes = resolve(graph, zoo.BY_NAME["stacked_lstm"].batch)
    loops = {}
    for i, op in enumerate(graph.ops):
        if op.type in ("While", "StatelessWhile"):
            ins = graph.adjacency.data_in[i]
            loops[op.name] = loop_body(graph, i, tuple(sizes.shapes[p][q] for p, q in ins))
    forward = [b for name, b in loops.items() if not name.startswith("gradient_tape")]
    backward = [b for name, b in loops.items() if name.startswith("gradient_tape")]
    assert len(forward) == len(backward) == 2
    for body in forward:
        assert body is not None
        assert body.kinds.count("refs") == 1 and body.kinds.count("duplicate") == 1
        refs = body.kinds.index("refs")
        assert body.kinds[body.sources[refs]] == "pass"
        assert body.kinds.count("filled") >= 8
    for body in backward:
        assert body is not None
        assert body.kinds.count("consumed") >= 10
        assert "filled" in body.kinds and "carried" in body.kinds


def test_fits_counts_the_loops_race():
    """"Fits" holds the expected peak plus what a loop running its whole window adds.

    The GRU+LSTM at batch 512: the LSTM's gradient loop is expected a couple of
    iterations ahead when it starts, but may run all 20 ahead while it runs. A device that
    holds only the expected peak (with the default 10% safety) does not fit; one that also
    holds the race does, without swapping.
    """
    import math

    from lmscore.memory import fits, simulate
    from lmscore.tune import tune

    graph, batch = zoo.graph("gru_lstm"), 512
    sim = simulate(graph, batch)
    assert sim.race_bytes > 0
    assert sim.worst_peak_bytes == sim.peak_bytes + sim.race_bytes

    def device(peak: int) -> int:
        return math.ceil(sim.persistent_bytes + (peak - sim.persistent_bytes) / 0.9)

    assert not fits(sim, device(sim.peak_bytes), 0.9)
    assert fits(sim, device(sim.worst_peak_bytes), 0.9)
    r = tune(graph, batch, device(sim.worst_peak_bytes))
    assert r.fits and not r.plan.swaps, r.message


def test_a_hand_written_loop_is_counted_from_its_condition():
    """``tf.while_loop(lambda t, h: t < 25, ...)``: no ``maximum_iterations``, so the lists
    that keep each step's state and input slice for the gradient are made without a count;
    the loop's condition and its counter's step give 25 iterations (no TensorFlow run)."""
    from lmscore.order import order
    from lmscore.shapes import loop_body, resolve, trip_count

    graph, batch = zoo.graph("hand_loop_rnn"), 16
    sizes = resolve(graph, batch)
    (i,) = [k for k, op in enumerate(graph.ops) if op.type in ("While", "StatelessWhile")
            and not op.name.endswith("while_grad") and order(graph).needed[k]]
    ins = graph.adjacency.data_in[i]
    body = loop_body(graph, i, tuple(sizes.shapes[p][q] for p, q in ins))
    assert trip_count(graph, i, body, sizes.values.get) == 25
    lists = {graph.ops[ins[k][0]].name.split("/")[-2]: sizes.nbytes[i][k]
             for k in range(len(ins)) if graph.ops[i].outputs[k].dtype == "variant"}
    assert lists["Tanh_0"] == 25 * batch * 32 * 4  # the state, each step
    assert lists["strided_slice_0"] == 25 * batch * 16 * 4  # x[:, t], each step


def test_a_loop_over_a_sequence_it_reads_row_by_row():
    """QRNN's f-pooling: ``c = f[t] * c + (1 - f[t]) * z[t]`` over time-major sequences the
    loop reads and passes on unchanged. Its gradient keeps ``f[t]`` and ``z[t]`` for each
    step, rows of those sequences (their lists hold the sequences' memory, so the
    gradient's ``zeros_like`` of them is a buffer of its own), and each step's
    ``StridedSliceGrad`` makes a sequence-sized gradient, whose batch dimension was left
    unknown (0.76 of measured)."""
    import tensorflow as tf

    from lmscore.load import from_graphdef_bytes
    from lmscore.tfgraph import graphdef_from_concrete_function

    steps, width = 24, 32
    wz, wf = zoo._weights(29, wz=(width, width), wf=(width, width))
    opt = zoo._keras().optimizers.SGD(0.01)
    opt.build([wz, wf])

    def step(x, y):
        with tf.GradientTape() as tape:
            z = tf.transpose(tf.tanh(tf.einsum("bth,hk->btk", x, wz)), [1, 0, 2])
            f = tf.transpose(tf.sigmoid(tf.einsum("bth,hk->btk", x, wf)), [1, 0, 2])

            def body(t, c):
                return t + 1, f[t] * c + (1 - f[t]) * z[t]

            _, c = tf.while_loop(lambda t, c: t < steps, body, (0, tf.zeros_like(z[0])))
            value = tf.reduce_mean(tf.square(c))
        opt.apply_gradients(zip(tape.gradient(value, [wz, wf]), [wz, wf], strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*zoo._specs(None, (steps, width), ()))
    graph = from_graphdef_bytes(graphdef_from_concrete_function(cf), source="qrnn")
    v = validate(graph, 64)
    assert v.unknown_size_tensors == ()
    assert abs(v.replayed_ratio - 1) <= TOLERANCE, v


#: Steps with batched products: tied logits, einsum attention, ``EinsumDense``, Keras'
#: multi-head attention.
PRODUCT_STEPS = ["tied_lm", "two_gradient_calls", "gpt_decoder"]


@pytest.mark.parametrize("name", PRODUCT_STEPS)
def test_batched_products_allocate_what_is_simulated(name: str) -> None:
    """Each ``Einsum`` and ``BatchMatMul`` kernel's buffers, output and scratch, to the byte.

    The scratch of oneDNN's blocked product is fitted on two threads
    (:func:`lmscore.memory.onednn_matmul_scratch_bytes`); Eigen's einsum copies hold on any.
    """
    from collections import Counter

    from lmscore.measure import measure
    from lmscore.memory import _cpu_threads, simulate

    library = cpu_kernel_library()
    if library == "onednn" and _cpu_threads() != 2:
        pytest.skip("oneDNN's product scratch is fitted on 2 threads")
    built = zoo.build(name)
    graph = lmscore.from_graphdef_bytes(built.graphdef, source=name)
    recorded: Counter[str] = Counter()
    for a in measure(built.graphdef, built.batch).allocations:
        if a.bytes > 0:
            recorded[a.node] += a.bytes
    simulated: Counter[str] = Counter()
    for b in simulate(graph, built.batch, workspace=library).buffers:
        simulated[graph.ops[b.producer].name] += b.bytes
    # (a product whose result nothing needs is pruned: it runs nowhere)
    products = [op.name for op in graph.ops
                if op.type in ("Einsum", "BatchMatMulV2", "BatchMatMulV3") and recorded[op.name]]
    assert len(products) >= 3, products
    wrong = {n: (recorded[n], simulated[n]) for n in products if recorded[n] != simulated[n]}
    assert not wrong, wrong


#: Steps with loops whose iterations race on the emulated accelerator.
LOOP_STEPS = [
    "qrnn_pooling", "stacked_lstm", "gru_lstm", "hand_loop_rnn",
    # Open: the scan's gradient loop starts popping and computing its early part while
    # the gradient of the projection before it (two 0.4 MB buffers) is still alive: three
    # runs measured 2.32, 2.13 and 2.92 MB (up to 1.069 of the worst peak, 2.77 MB)
    pytest.param("selective_scan", marks=pytest.mark.xfail(
        strict=False, reason="a loop's early part overlapping the ops before it")),
]


@pytest.mark.parametrize("name", LOOP_STEPS)
def test_loops_racing_stay_within_the_worst_peak(name: str) -> None:
    """The unmodified step on the emulated accelerator, three runs, within the worst peak.

    A plan fits when the simulation's worst peak (:attr:`lmscore.memory.Simulation.
    worst_peak_bytes`) is within the budget. With two devices and two threads the
    executor runs a loop's iterations as soon as their inputs exist: a gradient loop's
    carried gradient runs ahead and the partials its accumulators sum (a recurrent
    weight gradient per step, a sequence's slice gradient) wait, iterations of them. The
    stacked LSTM measured 1.63 to 2.08 MB (transient) against a worst peak of 1.25 MB
    when only the expected course was counted.
    """
    from lmscore.measure import measure
    from lmscore.memory import simulate
    from lmscore.validate import EMULATION_THREADS

    built = zoo.build(name)
    graph = lmscore.from_graphdef_bytes(built.graphdef, source=name)
    worst = simulate(graph, built.batch, workspace=cpu_kernel_library()).worst_peak_bytes
    for _ in range(3):
        m = measure(built.graphdef, built.batch, devices=2, inter_op_threads=EMULATION_THREADS)
        measured = m.peak_bytes["CPU:0"] + m.persistent_bytes.get("CPU:0", 0)
        assert measured <= worst, (measured, worst)


@pytest.mark.parametrize("method", ["bilinear", "lanczos3"])
def test_antialiased_resize_holds_one_direction_resized(method: str) -> None:
    """``tf.image.resize(antialias=True)`` (``ScaleAndTranslate`` and its gradient).

    The CPU kernels resize one direction at a time through a float32 temporary: the
    step below simulated at 0.830 of measured without the gradient's (1 MiB at batch 8).
    """
    import tensorflow as tf

    from lmscore.tfgraph import graphdef_from_concrete_function

    w = tf.Variable(tf.random.normal([1, 1, 3, 16], stddev=0.1, seed=1))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = tf.nn.conv2d(x, w, 1, "SAME")
            loss = tf.reduce_mean(tf.square(tf.image.resize(
                h, [32, 24], method=method, antialias=True)))
        w.assign_sub(0.01 * tape.gradient(loss, w))
        return loss

    cf = step.get_concrete_function(tf.TensorSpec([None, 64, 48, 3]))
    graph = lmscore.from_graphdef_bytes(graphdef_from_concrete_function(cf), source=method)
    v = validate(graph, 8)
    # (the kernels' span tables, a few KB, are not counted)
    assert abs(v.replayed_ratio - 1) <= 0.005 and abs(v.ratio - 1) <= 0.005, v


def test_an_assign_keeps_the_value_it_assigns_as_the_variable():
    """A history shifted by ``S.assign(tf.concat([S[1:], d[None]], 0))`` (L-BFGS) while a
    row read before is still to be used: ``AssignVariableOp`` takes the concatenation's
    buffer over, and the old one lives until that reader. Counting a copy beside the value
    simulated 1.276 of measured."""
    import tensorflow as tf

    from lmscore.memory import simulate
    from lmscore.tfgraph import graphdef_from_concrete_function

    w = tf.Variable(tf.random.normal([64, 128], stddev=0.1, seed=1))
    s = tf.Variable(tf.random.normal([5, 64 * 128], stddev=1e-3, seed=3), trainable=False)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        g = tf.reshape(tape.gradient(loss, w), [-1])
        last = s[4]  # read before the assign, used after it
        s.assign(tf.concat([s[1:], g[None]], 0))
        w.assign_sub(0.01 * tf.reshape(g + 1e-3 * tf.reduce_sum(last * g) * last, [64, 128]))
        return loss

    cf = step.get_concrete_function(tf.TensorSpec([None, 64]), tf.TensorSpec([None, 128]))
    graph = lmscore.from_graphdef_bytes(graphdef_from_concrete_function(cf), source="shift")
    v = validate(graph, 64)
    assert abs(v.replayed_ratio - 1) <= 0.005 and abs(v.ratio - 1) <= 0.005, v
    # the old buffer is held beside the value: counted from the op after the assign
    sim = simulate(graph, 64, workspace=v.kernel_library)
    assert [b.bytes for b in sim.buffers if b.tensor.endswith("/copy")] == [5 * 64 * 128 * 4]


def _accumulation_step() -> bytes:
    """Gradients of 4 micro-batches summed in a ``tf.while_loop``, the tape in its body."""
    import tensorflow as tf

    from lmscore.tfgraph import graphdef_from_concrete_function

    w1, w2 = zoo._weights(41, w1=(64, 128), w2=(128, 10))
    opt = zoo._keras().optimizers.SGD(0.01)
    opt.build([w1, w2])

    def step(x, y):
        m = tf.shape(x)[0] // 4

        def body(i, total, a1, a2):
            with tf.GradientTape() as tape:
                h = tf.nn.relu(tf.matmul(x[i * m:(i + 1) * m], w1))
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    y[i * m:(i + 1) * m], tf.matmul(h, w2)))
            g1, g2 = tape.gradient(loss, [w1, w2])
            return i + 1, total + loss, a1 + g1, a2 + g2

        _, total, a1, a2 = tf.while_loop(lambda i, *_: i < 4, body, (
            0, 0.0, tf.zeros_like(w1), tf.zeros_like(w2)))
        opt.apply_gradients(zip([a1 / 4, a2 / 4], [w1, w2], strict=True))
        return total / 4

    cf = tf.function(step).get_concrete_function(
        tf.TensorSpec([None, 64]), tf.TensorSpec([None], tf.int32))
    return graphdef_from_concrete_function(cf)


def test_gradient_accumulation_in_a_while_loop_sizes_one_micro_batch() -> None:
    """A tape inside a ``tf.while_loop`` body over micro-batches ``x[i * m:(i + 1) * m]``:
    the body's slice was sized as the whole batch, every iteration (1.95 of measured at
    batch 256 over 4 micro-batches; the same step as a Python loop is exact). The loop's
    counter and micro-batch size are known at its first and last iteration, and the slice
    is a view of the batch."""
    graph = lmscore.from_graphdef_bytes(_accumulation_step(), source="accumulation")
    v = validate(graph, 256)
    assert abs(v.replayed_ratio - 1) <= 0.01, v


@pytest.mark.xfail(reason="iterations overlapping on two devices: up to 1.078 of the worst "
                          "peak in a whole-suite run", strict=False)
def test_gradient_accumulation_racing_stays_within_the_worst_peak() -> None:
    """The next iterations' forward passes run beside this one's on the emulated
    accelerator: three runs within the worst peak (in two whole-suite runs one measured
    1.078 and 1.070 of it; alone, none over)."""
    from lmscore.measure import measure
    from lmscore.memory import simulate
    from lmscore.validate import EMULATION_THREADS

    data = _accumulation_step()
    graph = lmscore.from_graphdef_bytes(data, source="accumulation")
    worst = simulate(graph, 256, workspace=cpu_kernel_library()).worst_peak_bytes
    for _ in range(3):
        m = measure(data, 256, devices=2, inter_op_threads=EMULATION_THREADS)
        assert m.peak_bytes["CPU:0"] + m.persistent_bytes.get("CPU:0", 0) <= worst
