"""The simulator against TensorFlow's own allocation records on every bundled sample."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import lmscore
from lmscore.samples import sample_dir, samples
from lmscore.validate import validate

pytestmark = pytest.mark.tf

#: Measured on TF 2.21 CPU with oneDNN off and on (the simulation models the kernels
#: that ran): every convolutional and Transformer sample matches to 0.3%.
TOLERANCE = 0.05
#: Samples still outside the tolerance: measured ratio and the cause (none today; the
#: LSTM sample, 1.067 before loop bodies were simulated, is at 1.004 with oneDNN off and on).
KNOWN_GAPS: dict[str, str] = {}


#: Samples measured under ``-m slow`` only: VGG-16's step (18 s) leaves the default suite
#: a margin under 15 minutes on 2 cores (it measured 14:08-14:16 with it); ResNet-50 and the
#: zoo's CNNs (tests/test_zoo_memory.py) run by default.
SLOW = {"vgg16"}


def _sample_param(name):
    reason = KNOWN_GAPS.get(name)
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    if name in SLOW:
        marks.append(pytest.mark.slow)
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("sample", [_sample_param(s["name"]) for s in samples()])
def test_simulated_peak_matches_measured(sample):
    entry = next(s for s in samples() if s["name"] == sample)
    graph = lmscore.load(sample_dir() / entry["file"])
    v = validate(graph, entry["batch_size"])
    assert v.finite
    # Equal to the byte on every sample but the LSTM (100 B of constants inside its loop).
    assert v.kernel_library in ("eigen", "onednn")
    assert abs(v.measured_persistent_bytes - v.simulated_persistent_bytes) <= 128
    assert abs(v.transient_ratio - 1) <= TOLERANCE, v
    assert abs(v.ratio - 1) <= TOLERANCE, v
    assert abs(v.replayed_ratio - 1) <= TOLERANCE, v
    assert not v.diverged, v.divergence


def test_validate_cli_json_contract():
    out = subprocess.run(
        [sys.executable, "-m", "lmscore.cli", "validate", "mlp", "--json"],
        capture_output=True, text=True, check=True,
    ).stdout
    report = json.loads(out)
    for key in ("measured_peak_bytes", "simulated_peak_bytes", "ratio", "replayed_peak_bytes",
                "replayed_ratio"):
        assert key in report
    assert report["measured_peak_bytes"] > 0
    assert report["batch_size"] == 32
    assert report["diverged"] is False and report["divergence"] == ""
    assert report["unknown_size_tensors"] == [] and report["xla_functions"] == []


def test_a_step_that_blows_up_on_the_synthetic_data_is_reported(tmp_path, capsys):
    """A quadratic loss under gradient descent with a huge step: it grows every step,
    whatever values the synthetic data take (a zero weight matrix aside)."""
    import tensorflow as tf

    from lmscore import cli
    from lmscore.tfgraph import graphdef_from_concrete_function

    w = tf.Variable(tf.ones((8, 8)))

    def step(x):
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(tf.square(x @ w))
        w.assign_sub(50.0 * tape.gradient(value, w))
        return value

    cf = tf.function(step).get_concrete_function(tf.TensorSpec((None, 8)))
    path = tmp_path / "blows_up.pb"
    path.write_bytes(graphdef_from_concrete_function(cf))
    v = validate(lmscore.load(path), 4, steps=3)
    assert v.finite and v.diverged
    assert v.divergence.startswith("the loss grew from ")
    assert cli.main(["validate", str(path), "--batch-size", "4", "--steps", "3"]) == 0
    assert "the loss diverged on the synthetic data: the loss grew from" in \
        capsys.readouterr().out


def test_a_step_with_an_xla_compiled_function_says_the_ratio_is_no_check_of_it(
        tmp_path, capsys):
    """On the CPU, what an XLA-compiled function allocates is not in the allocation
    records (a grouped convolution, which Keras 3 compiles so, measured half of what its
    ops hold): validate names the functions and says so."""
    import tensorflow as tf

    from lmscore import cli
    from lmscore.tfgraph import graphdef_from_concrete_function

    w = tf.Variable(tf.ones((8, 8)) * 0.01)

    @tf.function(jit_compile=True)
    def block(x):
        return tf.nn.relu(x @ w) * 2.0

    def step(x):
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(tf.square(block(x)))
        w.assign_sub(0.1 * tape.gradient(value, w))
        return value

    cf = tf.function(step).get_concrete_function(tf.TensorSpec((None, 8)))
    path = tmp_path / "xla.pb"
    path.write_bytes(graphdef_from_concrete_function(cf))
    v = validate(lmscore.load(path), 4)
    assert v.xla_functions and all("block" in f for f in v.xla_functions)
    assert cli.main(["validate", str(path), "--batch-size", "4"]) == 0
    assert "XLA compiles" in capsys.readouterr().out
    plain = tmp_path / "plain.pb"
    plain.write_bytes(graphdef_from_concrete_function(
        tf.function(lambda x: tf.reduce_mean(x @ w)).get_concrete_function(
            tf.TensorSpec((None, 8)))))
    assert validate(lmscore.load(plain), 4).xla_functions == ()



def test_validate_names_what_the_ratio_does_not_check(monkeypatch, capsys):
    """Tensors of unknown size (counted as 0 bytes) and XLA-compiled functions each get a
    line under the ratios: the ratio alone would look like a check of them."""
    import lmscore.validate as v
    from lmscore import cli

    result = v.Validation(
        batch_size=4, simulated_peak_bytes=100, measured_peak_bytes=200, ratio=0.5,
        simulated_transient_peak_bytes=90, measured_transient_peak_bytes=190,
        transient_ratio=90 / 190, simulated_persistent_bytes=10,
        measured_persistent_bytes=10, simulated_peak_level=3, losses=(1.0, 0.9),
        finite=True, kernel_library="eigen", replayed_peak_bytes=100, replayed_ratio=0.5,
        unknown_size_tensors=("where:0", "gather:0"), xla_functions=("block",))
    monkeypatch.setattr(v, "validate", lambda *a, **k: result)
    assert cli.main(["validate", "mlp", "--batch-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "2 tensor(s) of unknown size counted as 0 bytes (where:0, gather:0)" in out
    assert "XLA compiles 1 function(s) of the step (block)" in out
    assert "another order" not in out  # the replay is as far off: not the order


def test_a_ragged_to_dense_step_within_5_percent():
    """``RaggedTensor.from_tensor(lengths=...).to_tensor()``: the dense tensor took its
    rows from the row splits (33 for 32), and its gradient's mask the 2,048 flat values'
    rows, so two gathers counted 128 MiB each: 20.5x the measured peak, and ``tune``
    refused every budget. ``RaggedTensorToTensor`` takes the rows of its row partition."""
    import tensorflow as tf
    import zoo

    from lmscore.load import from_graphdef_bytes
    from lmscore.tfgraph import graphdef_from_concrete_function

    w = tf.Variable(tf.random.normal((64, 256), seed=3) * 0.05, name="w")
    opt = zoo._keras().optimizers.SGD(0.1)
    opt.build([w])

    def step(x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(x @ w)
            lengths = tf.reduce_sum(tf.cast(tf.abs(x[..., 0]) > 0.2, tf.int32), 1)
            dense = tf.RaggedTensor.from_tensor(h, lengths=lengths).to_tensor(
                shape=[None, 64, 256])
            value = tf.reduce_mean(dense ** 2)
        opt.apply_gradients([(tape.gradient(value, w), w)])
        return value

    cf = tf.function(step).get_concrete_function(*zoo._specs(None, (64, 64), ()))
    g = from_graphdef_bytes(graphdef_from_concrete_function(cf), source="ragged", text=False)
    v = validate(g, 32)
    assert not v.unknown_size_tensors
    assert abs(v.ratio - 1) <= TOLERANCE, v
