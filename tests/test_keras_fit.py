"""``model.fit`` with the rewritten step (lmscore.swap_fit), and Keras names in from_keras.

Every comparison trains two models built alike (same seed, so the same initial weights and
dropout seeds), one with plain ``fit`` and one after :func:`lmscore.swap_fit`, on this CPU
under TensorFlow's default Grappler: the weights must be bit-identical (``np.array_equal``)
and the histories equal. 70 samples in batches of 16 end with a partial batch of 6, so
Keras traces its step for batches of unknown size.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
zoo = pytest.importorskip("zoo")
import tensorflow as tf  # noqa: E402

import lmscore  # noqa: E402
from lmscore.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.tf

REPO = pathlib.Path(__file__).resolve().parents[1]
BATCH = 16
KNOBS = {"batch_size": BATCH, "threshold": 2}  # swaps 10 tensors of the CNN below


def _data(seed: int, n: int):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, 12, 12, 1)).astype("float32"),
            rng.integers(0, 4, n).astype("int32"))


X, Y = _data(0, 70)
VAL = _data(1, 20)
WEIGHTS = np.random.default_rng(2).uniform(0.5, 1.5, 70).astype("float32")


def _cnn(*, optimizer=None, mixed: bool = False, **compile_kwargs):
    """Conv + Dropout + Dense, compiled; the same weights and seeds on every call."""
    keras.utils.set_random_seed(3)
    if mixed:
        keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([
            keras.Input((12, 12, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Dropout(0.25), keras.layers.Flatten(),
            keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4, dtype="float32"),
        ], name="cnn")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.compile(
        optimizer=optimizer or keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"], **compile_kwargs,
    )
    return model


class _Record(keras.callbacks.Callback):
    """Counts batches and keeps the logs of every epoch end."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0
        self.epochs: list[dict[str, float]] = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs or {}))


def _fit(model, **kwargs):
    record = _Record()
    keras.utils.set_random_seed(7)  # the shuffle of fit
    history = model.fit(X, Y, batch_size=BATCH, validation_data=VAL, verbose=0,
                        callbacks=[record], **{"epochs": 2, **kwargs})
    return history.history, record


def _assert_same_weights(a, b) -> None:
    wa, wb = a.get_weights(), b.get_weights()
    assert len(wa) == len(wb)
    worst = [float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in zip(wa, wb, strict=True)
             if not np.array_equal(x, y)]
    assert not worst, worst


def _train_function_nodes(model) -> set[str]:
    """Names of the nodes in the functions Keras' train function calls."""
    found, seen, todo = set(), set(), [model.train_function]
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if isinstance(f, tf.types.experimental.PolymorphicFunction):
            for cf in f._list_all_concrete_functions():
                for fdef in cf.graph.as_graph_def().library.function:
                    found.update(n.name for n in fdef.node_def)
            f = f.python_function
        todo.extend(c.cell_contents for c in getattr(f, "__closure__", None) or ()
                    if callable(c.cell_contents))
    return found


def _swap_nodes(model) -> set[str]:
    return {n for n in _train_function_nodes(model) if "lms/swap" in n}


def test_fit_with_the_rewritten_step_is_bit_identical():
    plain = _cnn()
    history, record = _fit(plain)
    model = _cnn()
    fit = lmscore.swap_fit(model, **KNOBS)
    swapped_history, swapped_record = _fit(model)
    assert len(fit.steps) == 1  # the partial last batch runs the same graph
    assert len(fit.steps[0].plan.swaps) >= 1
    assert _swap_nodes(model)  # Keras' train function calls the rewritten graph
    assert not _swap_nodes(plain)
    assert swapped_history == history
    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert swapped_record.epochs == record.epochs and len(record.epochs) == 2
    assert swapped_record.batches == record.batches == 2 * 5  # callbacks run per batch
    _assert_same_weights(model, plain)


def _bn_swish_cnn():
    """Convolutions with BatchNorm and swish, which oneDNN fuses with their bias."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([
        keras.Input((12, 12, 1)), keras.layers.Conv2D(8, 3), keras.layers.BatchNormalization(),
        keras.layers.Activation("swish"), keras.layers.Conv2D(8, 3, activation="swish"),
        keras.layers.Flatten(), keras.layers.Dense(4),
    ], name="bnswish")
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_swish_keeps_its_fusion():
    # the swap-in of a convolution's output once fed its swish's Mul: oneDNN then ran the
    # convolution, bias and swish apart and the weights ended 3e-4 apart (plan.keeps_tensor)
    plain = _bn_swish_cnn()
    _fit(plain)
    model = _bn_swish_cnn()
    fit = lmscore.swap_fit(model, **KNOBS)
    _fit(model)
    assert len(fit.steps[0].plan.swaps) >= 10
    _assert_same_weights(model, plain)


def test_sample_weights_and_steps_per_execution():
    plain = _cnn(steps_per_execution=3)
    history, record = _fit(plain, sample_weight=WEIGHTS)
    model = _cnn(steps_per_execution=3)
    fit = lmscore.swap_fit(model, **KNOBS)
    assert _fit(model, sample_weight=WEIGHTS)[0] == history
    assert len(fit.steps) == 1 and len(fit.steps[0].plan.swaps) >= 1
    assert len(fit.steps[0].function.input_signature) == 3  # x, y and the sample weights
    _assert_same_weights(model, plain)


def test_mixed_precision_with_loss_scaling():
    def scaled():
        return keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))

    plain = _cnn(optimizer=scaled(), mixed=True)
    history, _ = _fit(plain)
    model = _cnn(optimizer=scaled(), mixed=True)
    fit = lmscore.swap_fit(model, **KNOBS)
    assert _fit(model)[0] == history
    swapped = fit.steps[0].plan.swaps
    assert swapped and {fit.steps[0].graph.spec(s.tensor).dtype for s in swapped} >= {"half"}
    _assert_same_weights(model, plain)


def _transformer():
    keras.utils.set_random_seed(16)
    inp = keras.Input((32,), dtype="int32")
    h = zoo._transformer_block(keras, keras.layers.Embedding(300, 32)(inp), 2, 32, False, 0.1)
    model = keras.Model(inp, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(h)))
    model.compile(optimizer="adam", metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_transformer_with_a_known_batch_size():
    # 40 samples in batches of 8: Keras traces its step for a batch dimension of 8, and
    # Grappler folds constants with it; a step traced for an unknown batch size left the
    # weights 1e-6 apart after 2 epochs.
    rng = np.random.default_rng(6)
    x, y = rng.integers(0, 300, (40, 32)).astype("int32"), rng.integers(0, 4, 40)
    runs = []
    for swapped in (False, True):
        model = _transformer()
        fit = lmscore.swap_fit(model, batch_size=8, threshold=3) if swapped else None
        keras.utils.set_random_seed(7)
        runs.append((model, model.fit(x, y, batch_size=8, epochs=2, verbose=0).history))
    (plain, history), (model, swapped_history) = runs
    assert len(fit.steps) == 1 and len(fit.steps[0].plan.swaps) >= 1
    assert fit.steps[0].function.input_signature[0].shape == (8, 32)
    assert swapped_history == history
    _assert_same_weights(model, plain)


def test_compile_again_rewrites_for_the_new_optimizer_and_restore_undoes():
    plain = _cnn()
    first = _fit(plain, epochs=1)[0]
    plain.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    second = _fit(plain, epochs=1)[0]

    model = _cnn()
    fit = lmscore.swap_fit(model, **KNOBS)
    assert _fit(model, epochs=1)[0] == first
    adam_step = fit.steps[0]
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    assert _fit(model, epochs=1)[0] == second
    assert len(fit.steps) == 1 and fit.steps[0] is not adam_step
    assert set(map(id, fit.steps[0].variables)) != set(map(id, adam_step.variables))
    _assert_same_weights(model, plain)

    fit.restore()
    assert not fit.installed and fit.steps == ()
    assert "train_step" not in vars(model) and "make_train_function" not in vars(model)
    _fit(model, epochs=1)
    _fit(plain, epochs=1)
    assert _train_function_nodes(model) and not _swap_nodes(model)
    _assert_same_weights(model, plain)
    fit.restore()  # idempotent


def test_context_manager_train_on_batch_and_a_second_install():
    plain, model = _cnn(), _cnn()
    with lmscore.swap_fit(model, **KNOBS) as fit:
        assert fit.installed
        again = lmscore.swap_fit(model, **KNOBS)  # replaces the first
        assert not fit.installed and again.installed
        model.train_on_batch(X[:BATCH], Y[:BATCH])
        assert len(again.steps) == 1
    assert again.installed  # leaving the first's block leaves the second in place
    again.restore()
    plain.train_on_batch(X[:BATCH], Y[:BATCH])
    _assert_same_weights(model, plain)


def test_jit_compile_is_off_for_the_rewritten_step_only():
    plain = _cnn(jit_compile=False)
    history, _ = _fit(plain, epochs=1)
    model = _cnn(jit_compile=True)
    lmscore.swap_fit(model, **KNOBS)
    with pytest.warns(UserWarning, match="jit_compile: the rewritten train step runs without XLA"):
        swapped, _ = _fit(model, epochs=1)
    assert model.jit_compile  # evaluation keeps XLA
    assert {k: swapped[k] for k in ("loss", "accuracy")} == {
        k: history[k] for k in ("loss", "accuracy")}
    _assert_same_weights(model, plain)


def test_bad_arguments_are_one_line_config_errors():
    model = _cnn()
    with pytest.raises(ConfigError, match=r"^batch_size: pass the batch size given to fit"):
        lmscore.swap_fit(model, threshold=2)
    with pytest.raises(ConfigError, match=r"^batch_size: must be a positive integer, got 0$"):
        lmscore.swap_fit(model, batch_size=0)
    with pytest.raises(ConfigError, match=r"^model: expected a keras.Model, got str$"):
        lmscore.swap_fit("cnn", batch_size=BATCH)
    fresh = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="raw")
    with pytest.raises(ConfigError, match=r"^model: 'raw' is not compiled"):
        lmscore.swap_fit(fresh, batch_size=BATCH)
    lmscore.swap_fit(model, batch_size=BATCH, bogus=1)
    with pytest.raises(ConfigError, match=r"^bogus: not a planning knob") as info:
        model.fit(X, Y, batch_size=BATCH, epochs=1, verbose=0)
    assert "\n" not in str(info.value)


# --- Keras names in from_keras ----------------------------------------------------------


def _dense():
    keras.utils.set_random_seed(4)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="softmax")])


def test_from_keras_resolves_names_as_compile_does():
    from lmscore import tfgraph

    specs = (tf.TensorSpec((None, 6), name="x"), tf.TensorSpec((None,), tf.int32, name="y"))
    x = np.random.default_rng(5).normal(size=(8, 6)).astype("float32")
    y = np.arange(8, dtype="int32") % 5
    by_name, by_object, compiled = _dense(), _dense(), _dense()
    step = tfgraph.train_step_function(
        by_name, "sparse_categorical_crossentropy", "adam", specs)
    reference = tfgraph.train_step_function(
        by_object, keras.losses.SparseCategoricalCrossentropy(), keras.optimizers.Adam(), specs)
    compiled.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    expected = compiled.compute_loss(x, y, compiled(x))
    loss = step(x, y)
    assert loss.shape == () and np.array_equal(loss, expected)
    assert np.array_equal(loss, reference(x, y))
    _assert_same_weights(by_name, by_object)

    graph = lmscore.from_keras(_dense(), "mse", "rmsprop", specs[0], tf.TensorSpec((None, 5)))
    assert any(op.type == "Sqrt" for op in graph.ops)  # RMSprop's update


@pytest.mark.parametrize(("loss", "optimizer", "message"), [
    ("no_such_loss", "adam", "loss: Keras knows no loss named 'no_such_loss'"),
    ("mse", "no_such_optimizer", "optimizer: Keras knows no optimizer named 'no_such_optimizer'"),
])
def test_from_keras_refuses_unknown_names(loss, optimizer, message):
    specs = (tf.TensorSpec((None, 6)), tf.TensorSpec((None, 5)))
    with pytest.raises(ConfigError) as info:
        lmscore.from_keras(_dense(), loss, optimizer, *specs)
    assert str(info.value) == message


# --- the example --------------------------------------------------------------------------


def test_example_runs_as_is():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    run = subprocess.run([sys.executable, str(REPO / "examples" / "fit_keras.py")],
                         cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "val_accuracy" in run.stdout
    swapped = [line for line in run.stdout.splitlines() if line.startswith("swapped")]
    assert swapped and int(swapped[0].split()[1]) >= 1, run.stdout[-2000:]
