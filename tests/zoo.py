"""A zoo of training steps built the way users build them, with what is known of each.

Every entry traces one TensorFlow 2 training step (forward pass, gradients, optimizer
update) from a Keras 3 model, and states what is known from how it was built:

* ``loss``: the name of the op that computes the loss value (``tf.identity(..., name=
  "zoo_loss")`` around the loss the step differentiates; the tool may name the op that
  the identity reads);
* forward ops: custom steps run the model and the loss under ``tf.name_scope("fwd")``;
  Keras' own ``train_step`` runs the model under the model's name scope. Gradient ops are
  named ``gradient_tape/...`` by TensorFlow. Names are ground truth only; the tool under
  test must never use them (tests rename every node before checking).

Sizes are small (images 32x32 to 64x64, batches 2 to 8) so that tracing and running each
step takes seconds on 2 cores; ``large=True`` entries are for slow runs.

Run as a script to write the zoo as GraphDefs::

    python tests/zoo.py OUT_DIR [NAME ...]
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One zoo model: how to build its step and what is known of it."""

    name: str
    build: Callable[[], Any]  # -> (concrete function, model scope prefix)
    batch: int  # batch size to run and simulate it at
    fixed_batch: bool  # traced with a known batch dimension
    large: bool = False
    notes: str = ""


@dataclasses.dataclass(frozen=True)
class Built:
    """A traced zoo step and its ground truth."""

    name: str
    graphdef: bytes
    batch: int
    loss: str  # op name of the loss identity
    forward_prefixes: tuple[str, ...]  # name scopes of the forward pass
    function: Any = dataclasses.field(default=None, compare=False, repr=False)
    inputs: tuple[Any, ...] = dataclasses.field(default=(), compare=False, repr=False)


def _keras():
    import keras

    return keras


def _custom_step(model, loss_fn, optimizer, x_spec, y_spec, *, clip: float | None = None):
    """A custom-loop step as users write it (tape, gradient, apply_gradients)."""
    import tensorflow as tf

    variables = None

    def step(x, y):
        nonlocal variables
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                pred = model(x, training=True)
                value = loss_fn(y, pred)
                if model.losses:
                    value = value + tf.add_n(model.losses)
                value = tf.identity(value, name="zoo_loss")
            scaled = optimizer.scale_loss(value) if hasattr(optimizer, "scale_loss") else value
        grads = tape.gradient(scaled, model.trainable_variables)
        if clip is not None:
            grads, _ = tf.clip_by_global_norm(grads, clip)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return value

    model(tf.zeros([1 if d is None else d for d in x_spec.shape], x_spec.dtype), training=False)
    optimizer.build(model.trainable_variables)
    cf = tf.function(step).get_concrete_function(x_spec, y_spec)
    cf.zoo_objects = (model, optimizer)  # the function holds its variables weakly
    return cf, ("fwd/",)


def _v1_step(model, loss_fn, optimizer, x_spec, y_spec):
    """A custom-loop step applying a ``tf.compat.v1.train`` optimizer (fused apply kernels).

    Its gradients go straight into ``ResourceApply*`` kernels, with no optimizer arithmetic
    between, and its slots are variables that only those kernels use.
    """
    import tensorflow as tf

    model(tf.zeros([1 if d is None else d for d in x_spec.shape], x_spec.dtype), training=False)
    variables = [v.value for v in model.trainable_variables]  # the tf.Variables themselves

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                value = tf.identity(loss_fn(y, model(x, training=True)), name="zoo_loss")
        optimizer.apply_gradients(zip(tape.gradient(value, variables), variables, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(x_spec, y_spec)
    cf.zoo_objects = (model, optimizer)  # the function holds its variables weakly
    return cf, ("fwd/",)


def _variables_step(forward, variables, opt, specs):
    """A custom-loop step over plain variables: ``forward(x, y)``, the loss, under ``fwd/``.

    The step (tape, gradient, ``apply_gradients``) as users write it around their own
    forward pass, traced at ``specs``.
    """
    import tensorflow as tf

    opt.build(variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                value = tf.identity(forward(x, y), name="zoo_loss")
        opt.apply_gradients(zip(tape.gradient(value, variables), variables, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*specs)
    cf.zoo_objects = (variables, opt)  # the function holds its variables weakly
    return cf, ("fwd/",)


def _fit_step(model, x_spec, y_spec):
    """Keras' own ``train_step`` (what ``model.fit`` runs), metrics and all."""
    import tensorflow as tf

    original = model.compute_loss

    def compute_loss(*args, **kwargs):
        return tf.identity(original(*args, **kwargs), name="zoo_loss")

    model.compute_loss = compute_loss
    model(tf.zeros([1 if d is None else d for d in x_spec.shape], x_spec.dtype), training=False)
    model.optimizer.build(model.trainable_variables)
    cf = tf.function(model.train_step).get_concrete_function((x_spec, y_spec))
    cf.zoo_objects = (model,)  # the function holds its variables weakly
    # TensorFlow makes the scope unique ("fitcnn_1/"): take the one the ops really carry
    scopes = {op.name.split("/")[0] for op in cf.graph.get_operations() if "/" in op.name}
    own = sorted(x for x in scopes if re.fullmatch(re.escape(model.name) + r"(_\d+)?", x))
    return cf, tuple(f"{x}/" for x in own)


def _weights(seed: int, **shapes: tuple[int, ...]) -> list[Any]:
    """Variables of ``shapes`` (by name), normal draws x 0.1 seeded 1, 2, ... in order."""
    import tensorflow as tf

    _keras().utils.set_random_seed(seed)
    return [tf.Variable(tf.random.normal(shape, seed=k) * 0.1, name=name)
            for k, (name, shape) in enumerate(shapes.items(), start=1)]


def _specs(batch, x_shape, y_shape, x_dtype="float32", y_dtype="int32"):
    import tensorflow as tf

    return (tf.TensorSpec((batch, *x_shape), x_dtype, name="x"),
            tf.TensorSpec((batch, *y_shape), y_dtype, name="y"))


def _sparse_ce():
    return _keras().losses.SparseCategoricalCrossentropy(from_logits=True)


# -- the models -------------------------------------------------------------------------

def mlp_dropout(batch=None):
    k = _keras()
    k.utils.set_random_seed(1)
    m = k.Sequential([k.Input((32,)), k.layers.Dense(64, activation="relu"),
                      k.layers.Dropout(0.3), k.layers.Dense(64, activation="relu"),
                      k.layers.Dropout(0.3), k.layers.Dense(10)], name="mlp")
    return _custom_step(m, _sparse_ce(), k.optimizers.Adam(1e-3), *_specs(batch, (32,), ()))


def bn_cnn(batch=None):
    k = _keras()
    k.utils.set_random_seed(2)
    layers = [k.Input((32, 32, 3))]
    for f in (16, 32, 32):
        layers += [k.layers.Conv2D(f, 3, padding="same", use_bias=False),
                   k.layers.BatchNormalization(), k.layers.ReLU(), k.layers.MaxPooling2D()]
    layers += [k.layers.GlobalAveragePooling2D(), k.layers.Dense(10)]
    m = k.Sequential(layers, name="bncnn")
    opt = k.optimizers.SGD(0.01, momentum=0.9)
    return _custom_step(m, _sparse_ce(), opt, *_specs(batch, (32, 32, 3), ()))


def mobilenet_v2(batch=None):
    k = _keras()
    k.utils.set_random_seed(3)
    m = k.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None,
                                   classes=10, classifier_activation=None)
    opt = k.optimizers.SGD(0.01, momentum=0.9, nesterov=True)
    return _custom_step(m, _sparse_ce(), opt, *_specs(batch, (32, 32, 3), ()))


def mobilenet_v3_small(batch=None):
    k = _keras()
    k.utils.set_random_seed(4)
    m = k.applications.MobileNetV3Small(input_shape=(32, 32, 3), alpha=0.75, weights=None,
                                        classes=10, classifier_activation=None, dropout_rate=0.2)
    return _custom_step(m, _sparse_ce(), k.optimizers.Adam(1e-3), *_specs(batch, (32, 32, 3), ()))


def efficientnet_b0(batch=None):
    k = _keras()
    k.utils.set_random_seed(5)
    m = k.applications.EfficientNetB0(input_shape=(32, 32, 3), weights=None, classes=10,
                                        classifier_activation=None)
    opt = k.optimizers.RMSprop(1e-3, momentum=0.9)
    return _custom_step(m, _sparse_ce(), opt, *_specs(batch, (32, 32, 3), ()))


def densenet121(batch=None):
    k = _keras()
    k.utils.set_random_seed(6)
    m = k.applications.DenseNet121(input_shape=(32, 32, 3), weights=None, classes=10,
                                     classifier_activation=None)
    return _custom_step(m, _sparse_ce(), k.optimizers.Adam(1e-3), *_specs(batch, (32, 32, 3), ()))


def resnet50(batch=None):
    k = _keras()
    k.utils.set_random_seed(7)
    m = k.applications.ResNet50(input_shape=(32, 32, 3), weights=None, classes=10,
                                  classifier_activation=None)
    opt = k.optimizers.SGD(0.01, momentum=0.9)
    return _custom_step(m, _sparse_ce(), opt, *_specs(batch, (32, 32, 3), ()))


def _unet(k, dims, shape, base, depth):
    conv = k.layers.Conv2D if dims == 2 else k.layers.Conv3D
    up = k.layers.Conv2DTranspose if dims == 2 else k.layers.Conv3DTranspose
    pool = k.layers.MaxPooling2D if dims == 2 else k.layers.MaxPooling3D
    x = inp = k.Input(shape)
    skips = []
    for d in range(depth):
        for _ in range(2):
            x = conv(base * 2**d, 3, padding="same", use_bias=False)(x)
            x = k.layers.BatchNormalization()(x)
            x = k.layers.ReLU()(x)
        skips.append(x)
        x = pool()(x)
    x = conv(base * 2**depth, 3, padding="same", activation="relu")(x)
    for d in reversed(range(depth)):
        x = up(base * 2**d, 2, strides=2, padding="same")(x)
        x = k.layers.Concatenate()([x, skips[d]])
        x = conv(base * 2**d, 3, padding="same", activation="relu")(x)
    x = conv(2, 1)(x)
    return k.Model(inp, x, name=f"unet{dims}d")


def unet2d(batch=None):
    k = _keras()
    k.utils.set_random_seed(8)
    m = _unet(k, 2, (64, 64, 1), 8, 3)
    return _custom_step(m, _sparse_ce(), k.optimizers.Adam(1e-3),
                        *_specs(batch, (64, 64, 1), (64, 64)))


def unet3d(batch=None):
    k = _keras()
    k.utils.set_random_seed(9)
    m = _unet(k, 3, (16, 16, 16, 1), 4, 2)
    opt = k.optimizers.SGD(0.01, momentum=0.9)
    return _custom_step(m, _sparse_ce(), opt, *_specs(batch, (16, 16, 16, 1), (16, 16, 16)))


def _transformer_block(k, x, heads, dim, causal, rate):
    a = k.layers.MultiHeadAttention(heads, dim // heads, dropout=rate)(
        x, x, use_causal_mask=causal)
    x = k.layers.LayerNormalization()(x + k.layers.Dropout(rate)(a))
    f = k.layers.Dense(dim * 4, activation="gelu")(x)
    f = k.layers.Dropout(rate)(k.layers.Dense(dim)(f))
    return k.layers.LayerNormalization()(x + f)


def transformer_encoder(batch=None):
    k = _keras()
    k.utils.set_random_seed(10)
    inp = k.Input((32,), dtype="int32")
    x = k.layers.Embedding(500, 64)(inp)
    for _ in range(2):
        x = _transformer_block(k, x, 4, 64, False, 0.1)
    x = k.layers.Dense(3)(k.layers.GlobalAveragePooling1D()(x))
    m = k.Model(inp, x, name="encoder")
    opt = k.optimizers.AdamW(1e-3, weight_decay=0.01)
    return _custom_step(m, _sparse_ce(), opt, *_specs(batch, (32,), (), "int32"), clip=1.0)


def gpt_decoder(batch=None):
    k = _keras()
    k.utils.set_random_seed(11)
    inp = k.Input((64,), dtype="int32")
    x = k.layers.Embedding(1000, 64)(inp)
    for _ in range(2):
        x = _transformer_block(k, x, 4, 64, True, 0.1)
    x = k.layers.Dense(1000)(x)
    m = k.Model(inp, x, name="gpt")
    opt = k.optimizers.AdamW(3e-4, weight_decay=0.1)
    return _custom_step(m, _sparse_ce(), opt, *_specs(batch, (64,), (64,), "int32"))


def tied_lm(batch=None):
    """A next-token model whose output layer is its embedding, transposed.

    The logits are ``keras.ops.einsum("btd,vd->btv", h, embeddings)``, as users tie
    weights in Keras 3 (a layer reading another's variable), which Keras runs as batched
    matrix products; the embedding's gradient reads the logits' gradient transposed, which
    oneDNN's batched product copies into blocks of its own. Dropout, Adam.
    """
    k = _keras()
    k.utils.set_random_seed(12)

    class TiedLogits(k.layers.Layer):
        def __init__(self, embedding, **kwargs):
            super().__init__(**kwargs)
            self.embedding = embedding

        def call(self, x):
            return k.ops.einsum("btd,vd->btv", x, self.embedding.embeddings)

    inp = k.Input((64,), dtype="int32")
    emb = k.layers.Embedding(256, 64)
    x = k.layers.Dropout(0.1)(emb(inp))
    x = k.layers.LayerNormalization()(k.layers.Dense(64, activation="gelu")(x))
    m = k.Model(inp, TiedLogits(emb)(x), name="tied")
    return _custom_step(m, _sparse_ce(), k.optimizers.Adam(1e-3),
                        *_specs(batch, (64,), (64,), "int32"))


def gru_lstm(batch=None):
    k = _keras()
    k.utils.set_random_seed(12)
    m = k.Sequential([k.Input((20,), dtype="int32"), k.layers.Embedding(200, 32),
                      k.layers.GRU(48, return_sequences=True), k.layers.LSTM(48),
                      k.layers.Dense(5)], name="grulstm")
    return _custom_step(m, _sparse_ce(), k.optimizers.Adam(1e-3),
                        *_specs(batch, (20,), (), "int32"))


def bigru_rnn(batch=None):
    """Two loops side by side (a bidirectional GRU), then a SimpleRNN after a dense layer."""
    k = _keras()
    k.utils.set_random_seed(14)
    m = k.Sequential([k.Input((12, 6)),
                      k.layers.Bidirectional(k.layers.GRU(32, return_sequences=True)),
                      k.layers.Dense(16, activation="relu"), k.layers.SimpleRNN(24),
                      k.layers.Dense(3)], name="bigru")
    return _custom_step(m, _sparse_ce(), k.optimizers.RMSprop(1e-3), *_specs(batch, (12, 6), ()))


def stacked_lstm(batch=None):
    k = _keras()
    k.utils.set_random_seed(13)
    m = k.Sequential([k.Input((16, 8)), k.layers.LSTM(64, return_sequences=True),
                      k.layers.LSTM(64), k.layers.Dense(4)], name="lstm2")
    return _custom_step(m, _sparse_ce(), k.optimizers.RMSprop(1e-3), *_specs(batch, (16, 8), ()))


def masked_bilstm_tagger(batch=None):
    """A tagger over padded sequences: Embedding(mask_zero) -> two stacked bidirectional
    LSTMs -> TimeDistributed Dense, fit-style, Adam with norm clipping. The mask makes each
    gradient loop carry zeros for the next step's output gradient, made early."""
    k = _keras()
    k.utils.set_random_seed(21)
    m = k.Sequential([k.Input((20,), dtype="int32"), k.layers.Embedding(300, 16, mask_zero=True),
                      k.layers.Bidirectional(k.layers.LSTM(32, return_sequences=True)),
                      k.layers.Bidirectional(k.layers.LSTM(32, return_sequences=True)),
                      k.layers.TimeDistributed(k.layers.Dense(8))], name="tagger")
    m.compile(optimizer=k.optimizers.Adam(1e-3, clipnorm=1.0), loss=_sparse_ce())
    return _fit_step(m, *_specs(batch, (20,), (20,), "int32"))


def ctc_bigru(batch=None):
    """Speech-style: Conv1D, a bidirectional GRU over 48 frames, CTC loss with label lengths;
    Adam, custom loop, fixed batch. Each GRU's accumulator of its previous states outlives
    the output sequence it shares them with."""
    import tensorflow as tf

    k = _keras()
    k.utils.set_random_seed(22)
    frames, feats, classes, labels = 48, 16, 10, 8
    m = k.Sequential([k.Input((frames, feats)),
                      k.layers.Conv1D(24, 5, padding="same", activation="relu"),
                      k.layers.Bidirectional(k.layers.GRU(32, return_sequences=True)),
                      k.layers.Dense(classes)], name="ctc")
    opt = k.optimizers.Adam(1e-3)
    m(tf.zeros([1, frames, feats]))
    opt.build(m.trainable_variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                logits = m(x, training=True)
                n = tf.shape(x)[0]
                per = tf.nn.ctc_loss(labels=y + 1, logits=logits,  # 0 is the blank
                                     label_length=tf.fill([n], labels),
                                     logit_length=tf.fill([n], frames),
                                     logits_time_major=False, blank_index=0)
                value = tf.identity(tf.reduce_mean(per), name="zoo_loss")
        grads = tape.gradient(value, m.trainable_variables)
        opt.apply_gradients(zip(grads, m.trainable_variables, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(
        tf.TensorSpec((batch, frames, feats), "float32", name="x"),
        tf.TensorSpec((batch, labels), "int32", name="y"))
    cf.zoo_objects = (m, opt)  # the function holds them weakly
    return cf, ("fwd/",)


def recurrent_dropout_rnn(batch=None):
    """An LSTM then a GRU, both with recurrent dropout: their gradient loops run far ahead.

    The LSTM's gradient loop pops the kernel slices its forward loop kept for the
    gradient of the fed sequence, which nothing differentiates: the pops run ahead during
    the GRU's loops and free them (simulated 1.106 of measured before that was modelled).
    """
    k = _keras()
    k.utils.set_random_seed(27)
    m = k.Sequential([k.Input((20, 8)),
                      k.layers.LSTM(32, dropout=0.2, recurrent_dropout=0.2,
                                    return_sequences=True),
                      k.layers.GRU(16, recurrent_dropout=0.1), k.layers.Dense(4)],
                     name="recdrop")
    return _custom_step(m, _sparse_ce(), k.optimizers.RMSprop(1e-3), *_specs(batch, (20, 8), ()))


def dilated_conv1d(batch=None):
    """Causal dilated 1-D convolutions (WaveNet-like audio), spatial dropout, RMSprop.

    A dilated convolution runs as ``SpaceToBatchND -> Conv2D -> BatchToSpaceND``, whose
    tensors have ``batch * dilation`` rows.
    """
    k = _keras()
    k.utils.set_random_seed(18)
    x = inp = k.Input((2048, 1))
    x = k.layers.Conv1D(16, 3, padding="causal", activation="relu")(x)
    for d in (2, 4, 8):
        y = k.layers.Conv1D(16, 3, padding="causal", dilation_rate=d, activation="relu")(x)
        y = k.layers.SpatialDropout1D(0.1)(y)
        x = k.layers.Add()([x, y])
    x = k.layers.MaxPooling1D(4)(x)
    x = k.layers.GlobalAveragePooling1D()(x)
    m = k.Model(inp, k.layers.Dense(6)(x), name="dilated")
    return _custom_step(m, _sparse_ce(), k.optimizers.RMSprop(1e-3),
                        *_specs(batch, (2048, 1), ()))


def l2_clip_cnn(batch=None):
    """Convolutions with biases and L2 weight penalties, ``clip_by_global_norm``, Adamax.

    The global norm reads every bias gradient (``L2Loss``) while the filter gradient beside
    it, which oneDNN merges with it, may still wait for a swap-in.
    """
    k = _keras()
    k.utils.set_random_seed(19)
    reg = k.regularizers.L2(1e-4)
    layers = [k.Input((32, 32, 3))]
    for f in (16, 32, 32):
        layers += [k.layers.Conv2D(f, 3, padding="same", activation="relu",
                                   kernel_regularizer=reg),
                   k.layers.Conv2D(f, 3, padding="same", activation="relu",
                                   kernel_regularizer=reg),
                   k.layers.AveragePooling2D(2)]
    layers += [k.layers.Flatten(),
               k.layers.Dense(64, activation="relu", kernel_regularizer=reg),
               k.layers.Dense(10)]
    m = k.Sequential(layers, name="l2clip")
    return _custom_step(m, _sparse_ce(), k.optimizers.Adamax(1e-3),
                        *_specs(batch, (32, 32, 3), ()), clip=1.0)


def embedding_v1_adagrad(batch=None):
    """Token embeddings trained by ``tf.compat.v1.train.AdagradOptimizer``.

    The embedding's gradient is sparse (``ResourceSparseApplyAdagrad``): TensorFlow then
    keeps the table in copy-on-read mode, and each read of it copies the whole table.
    """
    k = _keras()
    import tensorflow as tf

    k.utils.set_random_seed(21)
    m = k.Sequential([k.Input((64,), dtype="int32"), k.layers.Embedding(20000, 32),
                      k.layers.GlobalAveragePooling1D(),
                      k.layers.Dense(32, activation="relu"), k.layers.Dense(4)],
                     name="embv1")
    return _v1_step(m, _sparse_ce(), tf.compat.v1.train.AdagradOptimizer(0.01),
                    *_specs(batch, (64,), (), "int32"))


def v1_momentum_cnn(batch=None):
    """A BatchNorm CNN trained by ``tf.compat.v1.train.MomentumOptimizer`` (Nesterov).

    Its slots are seen only by ``ResourceApplyMomentum``, whose gradient is not its last
    input.
    """
    k = _keras()
    import tensorflow as tf

    k.utils.set_random_seed(22)
    m = k.Sequential([k.Input((24, 24, 3)),
                      k.layers.Conv2D(16, 3, padding="same", use_bias=False),
                      k.layers.BatchNormalization(), k.layers.ReLU(),
                      k.layers.MaxPooling2D(),
                      k.layers.Conv2D(32, 3, padding="same", activation="relu"),
                      k.layers.GlobalAveragePooling2D(), k.layers.Dense(10)], name="v1mom")
    opt = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9, use_nesterov=True)
    return _v1_step(m, _sparse_ce(), opt, *_specs(batch, (24, 24, 3), ()))


def _small_cnn(k, name):
    return k.Sequential([k.Input((32, 32, 3)),
                         k.layers.Conv2D(16, 3, padding="same", activation="relu"),
                         k.layers.MaxPooling2D(),
                         k.layers.Conv2D(32, 3, padding="same", activation="relu"),
                         k.layers.MaxPooling2D(),
                         k.layers.Flatten(), k.layers.Dense(64, activation="relu"),
                         k.layers.Dense(10)], name=name)


def grad_accum_cnn(batch=None):
    """Gradients of two micro-batches (two tapes) summed into accumulators, then applied.

    The accumulators are reset with ``assign(zeros_like)``, which TensorFlow adopts as
    their buffers; ``tf.split`` hands out slices of the batch. The loss is micro-batch
    0's; the step returns the mean of both.
    """
    k = _keras()
    import tensorflow as tf

    k.utils.set_random_seed(23)
    m = _small_cnn(k, "gradacc")
    loss_fn = _sparse_ce()
    opt = k.optimizers.SGD(0.01)
    x_spec, y_spec = _specs(batch, (32, 32, 3), ())
    m(tf.zeros([1, 32, 32, 3]), training=False)
    opt.build(m.trainable_variables)
    accs = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="acc")
            for v in m.trainable_variables]

    def step(x, y):
        for a in accs:
            a.assign(tf.zeros_like(a))
        xs, ys = tf.split(x, 2), tf.split(y, 2)
        losses = []
        for i in range(2):
            with tf.GradientTape() as tape:
                with tf.name_scope("fwd"):
                    value = tf.identity(loss_fn(ys[i], m(xs[i], training=True)),
                                        name="zoo_loss" if i == 0 else "micro_loss")
            for a, g in zip(accs, tape.gradient(value, m.trainable_variables), strict=True):
                a.assign_add(g / 2)
            losses.append(value)
        opt.apply_gradients(zip([a.read_value() for a in accs], m.trainable_variables,
                                strict=True))
        return tf.add_n(losses) / 2

    cf = tf.function(step).get_concrete_function(x_spec, y_spec)
    cf.zoo_objects = (m, opt, accs)  # the function holds its variables weakly
    return cf, ("fwd/",)


def sam_cnn(batch=None):
    """Sharpness-aware minimization: a gradient, a step up it, a second gradient there.

    Two tapes over the same model; the step returns the first loss, Adam applies the
    second gradient.
    """
    k = _keras()
    import tensorflow as tf

    k.utils.set_random_seed(24)
    m = _small_cnn(k, "samcnn")
    loss_fn = _sparse_ce()
    opt = k.optimizers.Adam(1e-3)
    x_spec, y_spec = _specs(batch, (32, 32, 3), ())
    m(tf.zeros([1, 32, 32, 3]), training=False)
    opt.build(m.trainable_variables)

    def step(x, y):
        tv = m.trainable_variables
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                value = tf.identity(loss_fn(y, m(x, training=True)), name="zoo_loss")
        grads = tape.gradient(value, tv)
        scale = 0.05 / (tf.linalg.global_norm(grads) + 1e-12)
        eps = [g * scale for g in grads]
        for v, e in zip(tv, eps, strict=True):
            v.assign_add(e)
        with tf.GradientTape() as tape2:
            with tf.name_scope("fwd"):
                value2 = tf.identity(loss_fn(y, m(x, training=True)), name="sam_loss")
        grads2 = tape2.gradient(value2, tv)
        for v, e in zip(tv, eps, strict=True):
            v.assign_sub(e)
        opt.apply_gradients(zip(grads2, tv, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(x_spec, y_spec)
    cf.zoo_objects = (m, opt)  # the function holds its variables weakly
    return cf, ("fwd/",)


def gan(batch=None):
    """A GAN step: generator and discriminator, one tape and one Adam each.

    The two branches are independent enough that TensorFlow's executor order, drawn anew
    in each session, moves the measured peak (by up to 15% at this size).
    """
    k = _keras()
    import tensorflow as tf

    k.utils.set_random_seed(25)
    gen = k.Sequential([k.Input((32,)), k.layers.Dense(7 * 7 * 32, use_bias=False),
                        k.layers.BatchNormalization(), k.layers.LeakyReLU(0.2),
                        k.layers.Reshape((7, 7, 32)),
                        k.layers.Conv2DTranspose(16, 4, strides=2, padding="same",
                                                 use_bias=False),
                        k.layers.BatchNormalization(), k.layers.LeakyReLU(0.2),
                        k.layers.Conv2DTranspose(1, 4, strides=2, padding="same",
                                                 activation="tanh")], name="gen")
    disc = k.Sequential([k.Input((28, 28, 1)),
                         k.layers.Conv2D(16, 4, strides=2, padding="same"),
                         k.layers.LeakyReLU(0.2), k.layers.Dropout(0.3),
                         k.layers.Conv2D(32, 4, strides=2, padding="same"),
                         k.layers.LeakyReLU(0.2), k.layers.Dropout(0.3),
                         k.layers.Flatten(), k.layers.Dense(1)], name="disc")
    bce = k.losses.BinaryCrossentropy(from_logits=True)
    g_opt, d_opt = k.optimizers.Adam(2e-4, beta_1=0.5), k.optimizers.Adam(2e-4, beta_1=0.5)

    def step(x, z):
        with tf.GradientTape() as gtape, tf.GradientTape() as dtape:
            with tf.name_scope("fwd"):
                fake = gen(z, training=True)
                real_out = disc(x, training=True)
                fake_out = disc(fake, training=True)
                g_loss = tf.identity(bce(tf.ones_like(fake_out), fake_out), name="gen_loss")
                d_loss = (bce(tf.ones_like(real_out), real_out)
                          + bce(tf.zeros_like(fake_out), fake_out))
                d_loss = tf.identity(d_loss, name="zoo_loss")
        g_grads = gtape.gradient(g_loss, gen.trainable_variables)
        d_grads = dtape.gradient(d_loss, disc.trainable_variables)
        g_opt.apply_gradients(zip(g_grads, gen.trainable_variables, strict=True))
        d_opt.apply_gradients(zip(d_grads, disc.trainable_variables, strict=True))
        return d_loss

    x_spec = tf.TensorSpec((batch, 28, 28, 1), "float32", name="x")
    z_spec = tf.TensorSpec((batch, 32), "float32", name="z")
    gen(tf.zeros([1, 32]), training=False)
    disc(tf.zeros([1, 28, 28, 1]), training=False)
    g_opt.build(gen.trainable_variables)
    d_opt.build(disc.trainable_variables)
    cf = tf.function(step).get_concrete_function(x_spec, z_spec)
    cf.zoo_objects = (gen, disc, g_opt, d_opt)  # the function holds its variables weakly
    return cf, ("fwd/",)


def attention_unet(batch=None):
    """A 2-D U-Net with attention gates on its skips, a Dice loss and Adam."""
    k = _keras()
    import tensorflow as tf

    k.utils.set_random_seed(26)

    def conv(x, f):
        x = k.layers.Conv2D(f, 3, padding="same", activation="relu")(x)
        return k.layers.Conv2D(f, 3, padding="same", activation="relu")(x)

    def gate(skip, g, f):
        theta = k.layers.Conv2D(f, 1)(skip)
        phi = k.layers.Conv2D(f, 1)(g)
        a = k.layers.Activation("relu")(k.layers.Add()([theta, phi]))
        psi = k.layers.Conv2D(1, 1, activation="sigmoid")(a)
        psi = k.layers.Concatenate()([psi] * skip.shape[-1])  # broadcast over channels
        return k.layers.Multiply()([skip, psi])

    inp = k.Input((32, 32, 1))
    e1 = conv(inp, 8)
    e2 = conv(k.layers.MaxPooling2D()(e1), 16)
    b = conv(k.layers.MaxPooling2D()(e2), 32)
    u2 = k.layers.UpSampling2D()(b)
    d2 = conv(k.layers.Concatenate()([u2, gate(e2, u2, 8)]), 16)
    u1 = k.layers.UpSampling2D()(d2)
    d1 = conv(k.layers.Concatenate()([u1, gate(e1, u1, 4)]), 8)
    m = k.Model(inp, k.layers.Conv2D(1, 1, activation="sigmoid")(d1), name="attnunet")

    def dice_loss(y, p):
        inter = tf.reduce_sum(y * p, axis=[1, 2, 3])
        denom = tf.reduce_sum(y, axis=[1, 2, 3]) + tf.reduce_sum(p, axis=[1, 2, 3])
        return 1.0 - tf.reduce_mean((2.0 * inter + 1.0) / (denom + 1.0))

    return _custom_step(m, dice_loss, k.optimizers.Adam(1e-3),
                        *_specs(batch, (32, 32, 1), (32, 32, 1), y_dtype="float32"))


def seq2seq_attention(batch=None):
    """An encoder GRU, a decoder GRU started from its state, dot-product attention over the
    encoder's sequence (Adam). The encoder's gradient loop waits for the decoder's, while
    the part of it that only reads the forward pass's lists runs ahead."""
    k = _keras()
    k.utils.set_random_seed(104)
    s, t, f, h = 12, 10, 8, 48
    inp = k.Input((s + t, f))
    enc_seq, enc_state = k.layers.GRU(h, return_sequences=True, return_state=True)(
        inp[:, :s])
    dec = k.layers.GRU(h, return_sequences=True)(inp[:, s:], initial_state=enc_state)
    dec = k.layers.Concatenate()([dec, k.layers.Attention()([dec, enc_seq])])
    m = k.Model(inp, k.layers.Dense(5)(dec), name="s2s")
    ce = k.losses.SparseCategoricalCrossentropy(from_logits=True)
    return _custom_step(m, ce, k.optimizers.Adam(1e-3), *_specs(batch, (s + t, f), (t,)))


def graph_network(batch=None):
    """Message passing over a fixed random graph, a batch being one disjoint union of the
    graphs (edge indices offset per graph): three layers gather both ends of every edge
    (``tf.gather``: one row per edge, not per node) and sum the messages at the target
    (``unsorted_segment_sum``: one row per node), then a segment-mean readout (Adam)."""
    import numpy as np
    import tensorflow as tf

    k = _keras()
    k.utils.set_random_seed(207)
    nodes, edges, feat, hid = 64, 256, 16, 64
    rng = np.random.default_rng(7)
    src_np = rng.integers(0, nodes, edges).astype("int32")
    dst_np = rng.integers(0, nodes, edges).astype("int32")
    embed = k.layers.Dense(hid, activation="relu")
    msg = [k.layers.Dense(hid, activation="relu") for _ in range(3)]
    upd = [k.layers.Dense(hid, activation="relu") for _ in range(3)]
    head = k.layers.Dense(5)
    embed.build((None, feat))
    for layer in (*msg, *upd):
        layer.build((None, 2 * hid))
    head.build((None, hid))
    layers = [embed, *msg, *upd, head]
    variables = [v for layer in layers for v in layer.trainable_variables]
    opt = k.optimizers.Adam(1e-3)
    opt.build(variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                b = tf.shape(x)[0]
                offsets = tf.range(b)[:, None] * nodes
                src = tf.reshape(tf.constant(src_np)[None, :] + offsets, [-1])
                dst = tf.reshape(tf.constant(dst_np)[None, :] + offsets, [-1])
                h = embed(tf.reshape(x, [-1, feat]))
                for m_layer, u_layer in zip(msg, upd, strict=True):
                    m = m_layer(tf.concat([tf.gather(h, dst), tf.gather(h, src)], 1))
                    h = u_layer(tf.concat([h, tf.math.unsorted_segment_sum(m, dst, b * nodes)],
                                          1))
                pooled = tf.math.unsorted_segment_mean(h, tf.repeat(tf.range(b), nodes), b)
                value = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    y, head(pooled)))
                value = tf.identity(value, name="zoo_loss")
        opt.apply_gradients(zip(tape.gradient(value, variables), variables, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*_specs(batch, (nodes, feat), ()))
    cf.zoo_objects = (layers, opt)  # the function holds them weakly
    return cf, ("fwd/",)


def cond_mlp(batch=None):
    """Two layers, each choosing its activation with a differentiable ``tf.cond`` on the
    batch mean (SGD): the forward ``If`` returns, beside its result, the branch tensors its
    gradient reads, wrapped as optionals; the gradient ``If`` overwrites what it reads."""
    import tensorflow as tf

    k = _keras()
    k.utils.set_random_seed(211)
    w = tf.Variable(tf.random.normal((64, 256), seed=1) * 0.05)
    ws = [tf.Variable(tf.random.normal((256, 256), seed=2 + j) * 0.05) for j in range(2)]
    head = tf.Variable(tf.random.normal((256, 10), seed=5) * 0.05)
    variables = [w, *ws, head]
    opt = k.optimizers.SGD(0.01)
    opt.build(variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                h = x @ w
                for v in ws:
                    h = tf.cond(tf.reduce_mean(x) > 0.0,
                                lambda h=h, v=v: tf.tanh(tf.nn.relu(h) @ v) * 2.0,
                                lambda h=h, v=v: tf.sigmoid(tf.nn.elu(h) @ v))
                value = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    y, h @ head))
                value = tf.identity(value, name="zoo_loss")
        opt.apply_gradients(zip(tape.gradient(value, variables), variables, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*_specs(batch, (64,), ()))
    cf.zoo_objects = (variables, opt)  # the function holds them weakly
    return cf, ("fwd/",)


def convlstm_bidir(batch=None):
    """A bidirectional ConvLSTM1D and a second ConvLSTM1D (Adam): each step's input and
    state go through one ``ExpandDims`` per gate convolution into its own accumulator,
    references to one buffer (counted once per accumulator: 1.585 of measured)."""
    k = _keras()
    k.utils.set_random_seed(1014)
    layers = k.layers
    m = k.Sequential([
        k.Input((10, 32, 4)),
        layers.Bidirectional(layers.ConvLSTM1D(8, 3, padding="same", return_sequences=True)),
        layers.ConvLSTM1D(8, 3, padding="same"), layers.Flatten(), layers.Dense(6)],
        name="clstm1d")
    return _custom_step(m, _sparse_ce(), k.optimizers.Adam(1e-3), *_specs(batch, (10, 32, 4), ()))


def switch_activation(batch=None):
    """``tf.switch_case`` on a non-trainable variable choosing each layer's activation: the
    gradient of ``relu``, ``elu`` and ``tanh`` reads the branch's own result, so the optional
    the forward ``Case`` returns for its gradient holds the buffer of its other result."""
    import tensorflow as tf

    k = _keras()
    k.utils.set_random_seed(977)
    mode = tf.Variable(1, dtype=tf.int32, trainable=False)
    ws = [tf.Variable(tf.random.normal(s, seed=j) * 0.05)
          for j, s in enumerate([(128, 512), (512, 512), (512, 10)])]
    opt = k.optimizers.SGD(0.1)
    opt.build(ws)

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                h = x
                for v in ws[:2]:
                    h = h @ v
                    h = tf.switch_case(mode.read_value(), [
                        lambda h=h: tf.nn.relu(h), lambda h=h: tf.nn.elu(h),
                        lambda h=h: tf.tanh(h)])
                value = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    y, h @ ws[2]))
                value = tf.identity(value, name="zoo_loss")
        opt.apply_gradients(zip(tape.gradient(value, ws), ws, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*_specs(batch, (128,), ()))
    cf.zoo_objects = (ws, mode, opt)  # the function holds them weakly
    return cf, ("fwd/",)


def mixed_precision_cnn(batch=None):
    k = _keras()
    k.utils.set_random_seed(14)
    k.mixed_precision.set_global_policy("mixed_float16")
    try:
        m = k.Sequential([k.Input((32, 32, 3)),
                          k.layers.Conv2D(16, 3, padding="same", activation="relu"),
                          k.layers.Conv2D(32, 3, padding="same", activation="relu"),
                          k.layers.MaxPooling2D(),
                          k.layers.Conv2D(32, 3, padding="same", activation="relu"),
                          k.layers.GlobalAveragePooling2D(),
                          k.layers.Dense(10, dtype="float32")], name="mpcnn")
        opt = k.optimizers.LossScaleOptimizer(k.optimizers.Adam(1e-3))
        return _custom_step(m, _sparse_ce(), opt, *_specs(batch, (32, 32, 3), ()))
    finally:
        k.mixed_precision.set_global_policy("float32")


def mixed_precision_mlp(batch=None):
    """Wide layers, small batch: the loss-scale optimizer's update (momentum slots written
    inside the ``If`` that skips a step with non-finite gradients) is the step's peak."""
    k = _keras()
    k.utils.set_random_seed(31)
    k.mixed_precision.set_global_policy("mixed_float16")
    try:
        m = k.Sequential([k.Input((256,)),
                          k.layers.Dense(1024, activation="relu"),
                          k.layers.Dense(1024, activation="relu"),
                          k.layers.Dense(10, dtype="float32")], name="mpmlp")
        opt = k.optimizers.LossScaleOptimizer(k.optimizers.SGD(0.01, momentum=0.9))
        return _custom_step(m, _sparse_ce(), opt, *_specs(batch, (256,), ()))
    finally:
        k.mixed_precision.set_global_policy("float32")


def fit_cnn(batch=None):
    k = _keras()
    k.utils.set_random_seed(15)
    m = k.Sequential([k.Input((28, 28, 1)), k.layers.Conv2D(16, 3, activation="relu"),
                      k.layers.MaxPooling2D(), k.layers.Dropout(0.25), k.layers.Flatten(),
                      k.layers.Dense(32, activation="relu"), k.layers.Dense(10)], name="fitcnn")
    m.compile(optimizer=k.optimizers.Adam(1e-3), loss=_sparse_ce(), metrics=["accuracy"])
    return _fit_step(m, *_specs(batch, (28, 28, 1), ()))


def fit_two_heads(batch=None):
    """Keras ``fit`` of two outputs, weighted (classification and an MAE regression).

    The total loss sums the two; a loss weight of 1.0 is a constant 1 like the seed, and
    MAE's gradient (a sign) does not read the loss value.
    """
    import tensorflow as tf

    k = _keras()
    k.utils.set_random_seed(19)
    x = inp = k.Input((32, 32, 3))
    x = k.layers.Conv2D(16, 3, padding="same", activation="relu")(x)
    x = k.layers.Conv2D(32, 3, strides=2, padding="same", activation="relu")(x)
    x = k.layers.GlobalAveragePooling2D()(x)
    m = k.Model(inp, [k.layers.Dense(10)(x), k.layers.Dense(4)(x)], name="twoheads")
    m.compile(optimizer=k.optimizers.SGD(0.01, momentum=0.9),
              loss=[_sparse_ce(), k.losses.MeanAbsoluteError()], loss_weights=[1.0, 0.5])
    x_spec = tf.TensorSpec((batch, 32, 32, 3), "float32", name="x")
    y_spec = (tf.TensorSpec((batch,), "int32", name="y_cls"),
              tf.TensorSpec((batch, 4), "float32", name="y_box"))
    return _fit_step(m, x_spec, y_spec)


def fit_multi_io(batch=None):
    """Keras ``fit`` of a model with two named inputs and two named outputs (dicts).

    An image branch and a tabular branch meet in a shared trunk; the outputs are a
    classification and a one-unit regression (MAE), weighted 1.0 and 0.3. The seed reaches
    the regression bias's gradient, a one-element value returned through ``tf.identity``,
    while the loss weight of 1.0 reaches nothing the step returns (fit returns its metrics'
    variables).
    """
    import tensorflow as tf

    k = _keras()
    k.utils.set_random_seed(711)
    layers = k.layers
    img = k.Input((32, 32, 3), name="img")
    tab = k.Input((20,), name="tab")
    a = layers.Conv2D(16, 3, padding="same", activation="relu")(img)
    a = layers.MaxPooling2D()(a)
    a = layers.Conv2D(32, 3, padding="same", activation="relu")(a)
    a = layers.GlobalAveragePooling2D()(a)
    b = layers.Dense(32, activation="relu")(tab)
    h = layers.Dense(64, activation="relu")(layers.Concatenate()([a, b]))
    m = k.Model({"img": img, "tab": tab},
                {"cls": layers.Dense(10, name="cls")(h), "reg": layers.Dense(1, name="reg")(h)},
                name="multiio")
    m.compile(optimizer=k.optimizers.Adam(1e-3),
              loss={"cls": _sparse_ce(), "reg": k.losses.MeanAbsoluteError()},
              loss_weights={"cls": 1.0, "reg": 0.3}, metrics={"cls": ["accuracy"]})
    original = m.compute_loss

    def compute_loss(*args, **kwargs):
        return tf.identity(original(*args, **kwargs), name="zoo_loss")

    m.compute_loss = compute_loss
    m({"img": tf.zeros([1, 32, 32, 3]), "tab": tf.zeros([1, 20])}, training=False)
    m.optimizer.build(m.trainable_variables)
    xs = {"img": tf.TensorSpec((batch, 32, 32, 3), tf.float32, name="img"),
          "tab": tf.TensorSpec((batch, 20), tf.float32, name="tab")}
    ys = {"cls": tf.TensorSpec((batch,), tf.int32, name="ycls"),
          "reg": tf.TensorSpec((batch, 1), tf.float32, name="yreg")}
    cf = tf.function(m.train_step).get_concrete_function((xs, ys))
    cf.zoo_objects = (m,)
    scopes = {op.name.split("/")[0] for op in cf.graph.get_operations() if "/" in op.name}
    own = sorted(x for x in scopes if re.fullmatch(r"multiio(_\d+)?", x))
    return cf, tuple(f"{x}/" for x in own)


def huber_regression(batch=None):
    """A regression MLP with dropout, Huber loss and Lion.

    Huber's gradient reads the error, not the loss value, and its delta is a constant 1
    that reaches both the loss and the gradients.
    """
    k = _keras()
    k.utils.set_random_seed(20)
    m = k.Sequential([k.Input((64,)), k.layers.GaussianNoise(0.1),
                      k.layers.Dense(128, activation="relu"), k.layers.Dropout(0.2),
                      k.layers.Dense(128, activation="relu"), k.layers.Dropout(0.2),
                      k.layers.Dense(1)], name="huber")
    return _custom_step(m, k.losses.Huber(), k.optimizers.Lion(1e-4),
                        *_specs(batch, (64,), (1,), y_dtype="float32"))


def fit_mixed_transformer(batch=None):
    k = _keras()
    k.utils.set_random_seed(16)
    k.mixed_precision.set_global_policy("mixed_float16")
    try:
        inp = k.Input((32,), dtype="int32")
        x = k.layers.Embedding(300, 32)(inp)
        x = _transformer_block(k, x, 2, 32, False, 0.1)
        x = k.layers.Dense(4, dtype="float32")(k.layers.GlobalAveragePooling1D()(x))
        m = k.Model(inp, x, name="fitmp")
        m.compile(optimizer=k.optimizers.Adam(1e-3), loss=_sparse_ce())
        return _fit_step(m, *_specs(batch, (32,), (), "int32"))
    finally:
        k.mixed_precision.set_global_policy("float32")


def vae(batch=None):
    """A convolutional VAE: the KL term's ``1 + log_var``, a ``tf.random.normal``
    reparameterisation, a one-channel transposed convolution as the decoder's last layer.

    The step returns its loss, and the optimizer passes every gradient through
    ``tf.identity``: the gradient of the last layer's one-element bias is a result with
    every dimension 1, and the KL term's constant 1 reaches the loss and the gradients.
    """
    import tensorflow as tf

    k = _keras()
    k.utils.set_random_seed(811)
    layers = k.layers
    enc = k.Sequential([
        k.Input((32, 32, 1)), layers.Conv2D(16, 3, 2, "same", activation="relu"),
        layers.Conv2D(32, 3, 2, "same", activation="relu"), layers.Flatten(),
        layers.Dense(2 * 8)], name="enc")
    dec = k.Sequential([
        k.Input((8,)), layers.Dense(8 * 8 * 16, activation="relu"),
        layers.Reshape((8, 8, 16)),
        layers.Conv2DTranspose(16, 3, 2, "same", activation="relu"),
        layers.Conv2DTranspose(1, 3, 2, "same")], name="dec")
    opt = k.optimizers.Adam(1e-3)
    variables = enc.trainable_variables + dec.trainable_variables
    opt.build(variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                stats = enc(x, training=True)
                mu, log_var = stats[:, :8], stats[:, 8:]
                z = mu + tf.exp(0.5 * log_var) * tf.random.normal(tf.shape(mu), seed=5)
                logits = dec(z, training=True)
                rec = tf.reduce_mean(tf.reduce_sum(
                    tf.nn.sigmoid_cross_entropy_with_logits(x, logits), [1, 2, 3]))
                kl = -0.5 * tf.reduce_mean(tf.reduce_sum(
                    1 + log_var - mu ** 2 - tf.exp(log_var), 1))
                value = tf.identity(rec + kl, name="zoo_loss")
        opt.apply_gradients(zip(tape.gradient(value, variables), variables, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*_specs(batch, (32, 32, 1), ()))
    cf.zoo_objects = (enc, dec, opt)  # the function holds its variables weakly
    return cf, ("fwd/",)


def stochastic_depth_cnn(batch=None):
    """Residual blocks dropped at random per sample (stochastic depth, as EfficientNet)."""
    k = _keras()
    k.utils.set_random_seed(17)
    x = inp = k.Input((32, 32, 8))
    for _ in range(3):
        y = k.layers.Conv2D(8, 3, padding="same", activation="swish")(x)
        y = k.layers.BatchNormalization()(y)
        y = k.layers.Dropout(0.2, noise_shape=(None, 1, 1, 1))(y)
        x = k.layers.Add()([x, y])
    x = k.layers.Dense(10)(k.layers.GlobalAveragePooling2D()(x))
    m = k.Model(inp, x, name="sdcnn")
    opt = k.optimizers.SGD(0.05, momentum=0.9)
    return _custom_step(m, _sparse_ce(), opt, *_specs(batch, (32, 32, 8), ()))


def hand_loop_rnn(batch=None):
    """A recurrent cell written by hand: ``tf.while_loop`` with no ``maximum_iterations``.

    The loop's length is in its condition (``t < 25``) alone; its gradient needs every
    step's state and input slice, which ``while_v2`` accumulates in lists made without a
    count. RMSprop.
    """
    import tensorflow as tf

    variables = w, u, v = _weights(23, w=(16, 32), u=(32, 32), v=(32, 3))

    def forward(x, y):
        h0 = tf.zeros((tf.shape(x)[0], 32))

        def body(t, h):
            return t + 1, tf.tanh(x[:, t] @ w + h @ u)

        _, h = tf.while_loop(lambda t, h: t < 25, body, (0, h0))
        return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
            y, h @ v, from_logits=True))

    return _variables_step(forward, variables, _keras().optimizers.RMSprop(1e-3),
                           _specs(batch, (25, 16), ()))


def qrnn_pooling(batch=None):
    """QRNN f-pooling written by hand: gates from one projection of the whole sequence,
    then ``tf.while_loop`` over time steps, reading the time-major gate sequences whole.

    The gradient of each step's slice ``f[t]`` is a sequence-sized ``StridedSliceGrad``
    summed into the sequence's gradient, one per iteration: with a cheap carried gradient,
    iterations run ahead and their slice gradients wait to be summed. Adam.
    """
    import tensorflow as tf

    variables = wz, wf, v = _weights(29, wz=(16, 32), wf=(16, 32), v=(32, 3))

    def forward(x, y):
        z = tf.transpose(tf.tanh(tf.einsum("btd,dh->bth", x, wz)), [1, 0, 2])
        f = tf.transpose(tf.sigmoid(tf.einsum("btd,dh->bth", x, wf)), [1, 0, 2])

        def body(t, c):
            return t + 1, f[t] * c + (1 - f[t]) * z[t]

        _, c = tf.while_loop(lambda t, c: t < 24, body, (0, tf.zeros_like(z[0])))
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, c @ v))

    return _variables_step(forward, variables, _keras().optimizers.Adam(1e-3),
                           _specs(batch, (24, 16), ()))


def sparse_embedding(batch=None):
    """Bag-of-ids features: ``tf.nn.embedding_lookup_sparse`` (mean) over a 1,000-row table,
    8 ids an example, then a dense head; Adagrad updates the table sparsely.

    The lookup gathers the distinct ids (``Unique``): at most one row per row of the table,
    where the ids are many more; its mean has one row per example, not per id.
    """
    import tensorflow as tf

    variables = table, w, v = _weights(27, table=(1000, 32), w=(32, 64), v=(64, 5))
    opt = _keras().optimizers.Adagrad(0.05)
    opt.build(variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                ids = tf.sparse.from_dense(x)  # id 0 is padding
                h = tf.nn.embedding_lookup_sparse(table, ids, None, combiner="mean")
                logits = tf.nn.relu(h @ w) @ v
                value = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                    y, logits, from_logits=True))
                value = tf.identity(value, name="zoo_loss")
        opt.apply_gradients(zip(tape.gradient(value, variables), variables, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*_specs(batch, (8,), (), "int32"))
    cf.zoo_objects = (variables, opt)  # the function holds its variables weakly
    return cf, ("fwd/",)


def selective_scan(batch=None):
    """A Mamba-like selective scan: ``tf.scan`` over a stacked ``[time, 2, batch, d, n]``
    sequence of decays and inputs, ``h = e[0] * h + e[1]`` (SGD).

    The scan's gradient keeps ``e[0]`` of every step, rows of the element the forward
    loop read (a view, not a copy): the list of elements lives until the gradient loop.
    """
    import tensorflow as tf

    k = _keras()
    k.utils.set_random_seed(28)
    d, n = 16, 4
    emb = tf.Variable(tf.random.normal((100, d), seed=1) * 0.1, name="emb")
    a = tf.Variable(tf.ones((d, n)), name="a")
    bw = tf.Variable(tf.random.normal((d, n), seed=2) * 0.1, name="bw")
    cw = tf.Variable(tf.random.normal((d, n), seed=3) * 0.1, name="cw")
    out = tf.Variable(tf.random.normal((d, 100), seed=4) * 0.1, name="out")
    variables = [emb, a, bw, cw, out]
    opt = k.optimizers.SGD(0.01)
    opt.build(variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                u = tf.nn.embedding_lookup(emb, x)  # batch, time, d
                decay = tf.exp(-tf.exp(a))[None, None] * tf.ones_like(u)[..., None]
                inp = u[..., None] * (u @ bw)[:, :, None, :]
                seq = tf.transpose(tf.stack([decay, inp]), [2, 0, 1, 3, 4])
                hs = tf.scan(lambda h, e: e[0] * h + e[1], seq,
                             initializer=tf.zeros_like(inp[:, 0]))
                yv = tf.einsum("tbdn,btn->btd", hs, u @ cw)
                value = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                    y, yv @ out, from_logits=True))
                value = tf.identity(value, name="zoo_loss")
        opt.apply_gradients(zip(tape.gradient(value, variables), variables, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*_specs(batch, (16,), (16,), "int32"))
    cf.zoo_objects = (variables, opt)  # the function holds its variables weakly
    return cf, ("fwd/",)


def moe_topk(batch=None):
    """A mixture-of-experts layer with top-2 routing, written with tf ops (Adam).

    Each token's two experts' weights are gathered per token and applied with ``einsum``
    (``nd,ndf->nf``, ``nf,nfd->nd``); the outputs are summed back per token with
    ``unsorted_segment_sum``, plus a load-balancing loss. The token indices come from
    ``tf.range`` of a count computed from the shape (more than the batch), and the expert
    weights' gradient einsum (``nd,nf->nfd``) transposes its result.
    """
    import tensorflow as tf

    k = _keras()
    k.utils.set_random_seed(801)
    t, d, e, f, top = 16, 32, 4, 64, 2
    shapes = {"emb": (500, d), "gate": (d, e), "w1": (e, d, f), "w2": (e, f, d),
              "out": (d, 500)}
    w = {n: tf.Variable(tf.random.normal(s, seed=k0) * 0.05, name=n)
         for k0, (n, s) in enumerate(shapes.items())}
    variables = list(w.values())
    opt = k.optimizers.Adam(1e-3)
    opt.build(variables)

    def step(x, y):
        with tf.GradientTape() as tape:
            with tf.name_scope("fwd"):
                tok = tf.reshape(tf.gather(w["emb"], x), [-1, d])
                n = tf.shape(tok)[0]
                probs = tf.nn.softmax(tok @ w["gate"])
                topv, topi = tf.math.top_k(probs, top)
                topv = topv / tf.reduce_sum(topv, -1, keepdims=True)
                experts = tf.reshape(topi, [-1])
                tokens = tf.reshape(tf.tile(tf.range(n)[:, None], [1, top]), [-1])
                hid = tf.nn.gelu(tf.einsum("nd,ndf->nf", tf.gather(tok, tokens),
                                           tf.gather(w["w1"], experts)))
                out = tf.einsum("nf,nfd->nd", hid, tf.gather(w["w2"], experts))
                out = out * tf.reshape(topv, [-1])[:, None]
                h = tok + tf.math.unsorted_segment_sum(out, tokens, n)
                ce = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    tf.reshape(y, [-1]), h @ w["out"]))
                share = tf.reduce_mean(tf.one_hot(topi[:, 0], e), 0)
                value = tf.identity(ce + 0.01 * e * tf.reduce_sum(
                    share * tf.reduce_mean(probs, 0)), name="zoo_loss")
        opt.apply_gradients(zip(tape.gradient(value, variables), variables, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(
        *_specs(batch, (t,), (t,), x_dtype="int32"))
    cf.zoo_objects = (variables, opt)  # the function holds its variables weakly
    return cf, ("fwd/",)


def two_gradient_calls(batch=None):
    """One persistent tape, two ``tape.gradient`` calls on one loss, two optimizers.

    An embedding and two ``EinsumDense`` layers (Adam), then einsum attention, a masked
    mean whose denominator adds a constant 1 and a head (Adagrad). Each call seeds a
    gradient of its own, covering its own gradient kernels; the + 1 of the denominator
    reaches the kernels of both. The first layer's input gradient is a matrix product
    of a weight that only the embedding's update reads.
    """
    import tensorflow as tf

    k = _keras()
    k.utils.set_random_seed(107)
    t, v, d = 16, 300, 32
    emb = k.layers.Embedding(v, d)
    enc = k.Sequential([k.Input((t, d)),
                        k.layers.EinsumDense("btd,dh->bth", output_shape=(t, 64),
                                             bias_axes="h", activation="relu"),
                        k.layers.EinsumDense("bth,hd->btd", output_shape=(t, d))], name="enc")
    head = tf.Variable(tf.random.normal([d, 4], stddev=0.1, seed=4), name="head")
    proj = tf.Variable(tf.random.normal([d, d], stddev=0.1, seed=5), name="proj")
    emb(tf.zeros([1, t], "int32"))
    body = emb.trainable_variables + enc.trainable_variables
    tail = [head, proj]
    adam, adagrad = k.optimizers.Adam(1e-3), k.optimizers.Adagrad(0.05)
    adam.build(body)
    adagrad.build(tail)

    def step(x, y):
        with tf.GradientTape(persistent=True) as tape:
            with tf.name_scope("fwd"):
                h = enc(emb(x), training=True)
                att = tf.nn.softmax(tf.einsum("btd,bsd->bts", h,
                                              tf.einsum("btd,de->bte", h, proj)) / 5.0)
                ctx = tf.einsum("bts,bsd->btd", att, h)
                mask = tf.cast(x > 0, tf.float32)[..., None]
                pooled = tf.reduce_sum(ctx * mask, 1) / (tf.reduce_sum(mask, 1) + 1.0)
                logits = tf.einsum("bd,dc->bc", pooled, head)
                value = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    y, logits))
                value = tf.identity(value, name="zoo_loss")
        adam.apply_gradients(zip(tape.gradient(value, body), body, strict=True))
        adagrad.apply_gradients(zip(tape.gradient(value, tail), tail, strict=True))
        return value

    cf = tf.function(step).get_concrete_function(*_specs(batch, (t,), (), "int32"))
    cf.zoo_objects = (emb, enc, tail, adam, adagrad)  # the function holds them weakly
    return cf, ("fwd/",)

ENTRIES: tuple[Entry, ...] = (
    Entry("mlp_dropout", mlp_dropout, 8, False),
    Entry("bn_cnn", bn_cnn, 8, True),
    Entry("mobilenet_v2", mobilenet_v2, 4, False),
    Entry("mobilenet_v3_small", mobilenet_v3_small, 4, True),
    Entry("efficientnet_b0", efficientnet_b0, 2, False),
    Entry("unet2d", unet2d, 2, False),
    Entry("unet3d", unet3d, 1, True),
    Entry("transformer_encoder", transformer_encoder, 4, False),
    Entry("gpt_decoder", gpt_decoder, 4, True),
    Entry("tied_lm", tied_lm, 8, False),
    Entry("gru_lstm", gru_lstm, 4, False),
    Entry("stacked_lstm", stacked_lstm, 4, True),
    Entry("bigru_rnn", bigru_rnn, 8, False),
    Entry("masked_bilstm_tagger", masked_bilstm_tagger, 32, False),
    Entry("ctc_bigru", ctc_bigru, 8, True),
    Entry("recurrent_dropout_rnn", recurrent_dropout_rnn, 16, False),
    Entry("hand_loop_rnn", hand_loop_rnn, 16, False),
    Entry("qrnn_pooling", qrnn_pooling, 64, False),
    Entry("seq2seq_attention", seq2seq_attention, 16, False),
    Entry("graph_network", graph_network, 8, False),
    Entry("cond_mlp", cond_mlp, 256, False),
    Entry("switch_activation", switch_activation, 256, False),
    Entry("convlstm_bidir", convlstm_bidir, 8, False),
    Entry("two_gradient_calls", two_gradient_calls, 8, False),
    Entry("dilated_conv1d", dilated_conv1d, 8, False),
    Entry("l2_clip_cnn", l2_clip_cnn, 16, True),
    Entry("embedding_v1_adagrad", embedding_v1_adagrad, 64, False),
    Entry("v1_momentum_cnn", v1_momentum_cnn, 8, False),
    Entry("grad_accum_cnn", grad_accum_cnn, 16, True),
    Entry("sam_cnn", sam_cnn, 8, True),
    Entry("gan", gan, 16, False),
    Entry("attention_unet", attention_unet, 8, True),
    Entry("fit_two_heads", fit_two_heads, 8, False),
    Entry("fit_multi_io", fit_multi_io, 16, False),
    Entry("moe_topk", moe_topk, 8, False),
    Entry("sparse_embedding", sparse_embedding, 1024, False),
    Entry("selective_scan", selective_scan, 64, False),
    Entry("huber_regression", huber_regression, 8, False),
    Entry("mixed_precision_cnn", mixed_precision_cnn, 4, False),
    Entry("mixed_precision_mlp", mixed_precision_mlp, 8, False),
    Entry("fit_cnn", fit_cnn, 8, False),
    Entry("fit_mixed_transformer", fit_mixed_transformer, 4, True),
    Entry("stochastic_depth_cnn", stochastic_depth_cnn, 4, False),
    Entry("vae", vae, 8, False),
    Entry("densenet121", densenet121, 2, False, large=True),
    Entry("resnet50", resnet50, 2, True, large=True),
)
BY_NAME = {e.name: e for e in ENTRIES}
SMALL = tuple(e.name for e in ENTRIES if not e.large)


def build(name: str) -> Built:
    """Trace the step of zoo entry ``name`` in this process."""

    from lmscore.tfgraph import graphdef_from_concrete_function

    e = BY_NAME[name]
    _keras().backend.clear_session()
    cf, prefixes = e.build(e.batch if e.fixed_batch else None)
    data = graphdef_from_concrete_function(cf)
    return Built(
        name=name,
        graphdef=data,
        batch=e.batch,
        loss="zoo_loss",
        forward_prefixes=prefixes,
        function=cf,
    )


@functools.cache
def build_info(name: str) -> dict[str, Any]:
    """Ground truth of ``name``: ``loss`` (last name component) and ``forward_prefixes``."""
    b = _built(name)
    return {"loss": b.loss, "forward_prefixes": b.forward_prefixes}


@functools.cache
def _built(name: str) -> Built:
    return build(name)


def graphdef(name: str) -> bytes:
    """The serialized GraphDef of zoo entry ``name``, traced once per process."""
    return _built(name).graphdef


@functools.cache
def graph(name: str) -> Any:
    """The IR of zoo entry ``name``, traced once per process."""
    import lmscore

    return lmscore.from_graphdef_bytes(_built(name).graphdef, source=name, text=False)


def write(out: pathlib.Path, names: list[str]) -> dict[str, Any]:
    """Write ``NAME.pb`` and ``manifest.json`` (batch, loss, forward scopes) for ``names``."""
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {}
    for name in names:
        b = build(name)
        (out / f"{name}.pb").write_bytes(b.graphdef)
        manifest[name] = {"batch": b.batch, "loss": b.loss,
                          "forward_prefixes": list(b.forward_prefixes)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    target = pathlib.Path(sys.argv[1])
    chosen = sys.argv[2:] or list(SMALL)
    print(json.dumps(write(target, chosen), indent=1))
