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


def _sample_param(name):
    reason = KNOWN_GAPS.get(name)
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
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
