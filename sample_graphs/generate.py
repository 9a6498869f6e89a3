"""Regenerate the sample training-step GraphDefs shipped with lmscore.

Usage::

    python sample_graphs/generate.py [--out DIR] [--only NAME ...] [--densenet-27k OUT_PATH]

Each sample is the GraphDef of one full training step (forward pass, gradients, optimizer
update) traced through :mod:`lmscore.tfgraph` with an unknown (``None``) batch dimension and
``_output_shapes`` on every node. The weights are not in the graphs: variables are captured as
``DT_RESOURCE`` placeholders. ``samples.json`` describes them (one object per sample, see
:func:`describe`); for integer inputs ``labels_range`` maps the input name to ``[low, high)``,
the half-open range of valid values.

Every sample is traced in its own fresh Python process (with ``PYTHONHASHSEED=0``, fixed Keras
seeds and a cleared Keras session), so the bytes depend neither on the order in which samples
are generated nor on ``--only``: running the script twice gives byte-identical files.

``--densenet-27k OUT_PATH`` writes a DenseNet training step of about 27,000 nodes for
benchmarks (not part of the shipped samples); with it, the samples themselves are regenerated
only if ``--only`` is also given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SAMPLES_JSON = "samples.json"

# Samples in the order they are listed in samples.json.
SAMPLE_NAMES = ("mlp", "resnet50", "vgg16", "unet3d", "bert", "lstm")

MLP_CONFIG = {"input": 784, "hidden": (512, 512), "classes": 10}

UNET3D_CONFIG = {
    # 3D U-Net (Cicek et al. 2016) as used for brain tumour segmentation in the LMS papers.
    "input_shape": (64, 64, 64, 4),  # fixed spatial size 64^3, 4 input channels (MRI modalities)
    "classes": 3,  # output classes per voxel (final 1x1x1 convolution)
    "levels": 4,  # resolution levels: 64^3, 32^3, 16^3, 8^3 (three 2x2x2 max pools)
    "base_filters": 16,  # filters at the first level, doubling per level: 16, 32, 64, 128
    "convs_per_level": 2,  # 3x3x3 Conv3D + BatchNorm + ReLU, twice per level (same padding)
    # decoder: Conv3DTranspose(kernel 2, stride 2), concatenate the skip, two convolutions
}
"""Configuration of the ``unet3d`` sample."""

BERT_CONFIG = {
    "vocab": 8192,
    "seq_len": 128,
    "layers": 4,
    "hidden": 256,
    "heads": 4,
    "ffn": 1024,
    "activation": "gelu",
    "dropout": 0.0,
}
"""Configuration of the ``bert`` sample (BERT-like encoder with a masked-LM style head)."""

LSTM_CONFIG = {"seq_len": 20, "features": 16, "units": 64, "classes": 10}

# Training steps of keras.applications DenseNets (224x224x3, 1000 classes, Adam, sparse labels)
# traced by this script: DenseNet121 28,608 nodes, DenseNet169 39,912, DenseNet201 47,448.
# DenseNet121 is the closest to the ~27k nodes wanted for benchmarks (--densenet-27k).
DENSENET_27K = "DenseNet121"


@dataclass
class Sample:
    """What one sample needs: a model, its loss, optimizer and input specs, and a description."""

    name: str
    description: str
    batch_size: int
    model: Any
    loss: Any
    optimizer: Any
    optimizer_text: str
    x_spec: Any
    y_spec: Any
    int_ranges: dict[str, list[int]] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Model builders (run in the worker process only: they import TensorFlow and Keras).
# --------------------------------------------------------------------------------------------


def _sparse_ce(from_logits: bool) -> Any:
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)


def build_mlp() -> Sample:
    import keras
    import tensorflow as tf

    cfg = MLP_CONFIG
    inputs = keras.Input((cfg["input"],), name="images")
    x = inputs
    for units in cfg["hidden"]:
        x = keras.layers.Dense(units, activation="relu")(x)
    outputs = keras.layers.Dense(cfg["classes"])(x)
    model = keras.Model(inputs, outputs, name="mlp")
    return Sample(
        name="mlp",
        description="MLP 784-512-512-10 (ReLU) on flattened 28x28 images, logits with sparse "
        "categorical crossentropy",
        batch_size=32,
        model=model,
        loss=_sparse_ce(from_logits=True),
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        optimizer_text="Adam(learning_rate=0.001)",
        x_spec=tf.TensorSpec([None, cfg["input"]], tf.float32, name="images"),
        y_spec=tf.TensorSpec([None], tf.int32, name="labels"),
        int_ranges={"labels": [0, cfg["classes"]]},
    )


def _image_classifier(name: str, model: Any, description: str, batch_size: int) -> Sample:
    import keras
    import tensorflow as tf

    return Sample(
        name=name,
        description=description,
        batch_size=batch_size,
        model=model,
        # keras.applications models end with a softmax, so the loss takes probabilities.
        loss=_sparse_ce(from_logits=False),
        optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
        optimizer_text="SGD(learning_rate=0.01, momentum=0.9)",
        x_spec=tf.TensorSpec([None, 224, 224, 3], tf.float32, name="images"),
        y_spec=tf.TensorSpec([None], tf.int32, name="labels"),
        int_ranges={"labels": [0, 1000]},
    )


def build_resnet50() -> Sample:
    import keras

    model = keras.applications.ResNet50(weights=None, input_shape=(224, 224, 3), classes=1000)
    return _image_classifier(
        "resnet50",
        model,
        "keras.applications.ResNet50 (224x224x3, 1000 classes, softmax), sparse categorical "
        "crossentropy",
        batch_size=8,
    )


def build_vgg16() -> Sample:
    import keras

    model = keras.applications.VGG16(weights=None, input_shape=(224, 224, 3), classes=1000)
    return _image_classifier(
        "vgg16",
        model,
        "keras.applications.VGG16 (224x224x3, 1000 classes, softmax), sparse categorical "
        "crossentropy",
        batch_size=2,
    )


def build_unet3d() -> Sample:
    import keras
    import tensorflow as tf

    cfg = UNET3D_CONFIG
    layers = keras.layers

    def conv_block(x: Any, filters: int) -> Any:
        for _ in range(cfg["convs_per_level"]):
            x = layers.Conv3D(filters, 3, padding="same", use_bias=False)(x)
            x = layers.BatchNormalization()(x)
            x = layers.ReLU()(x)
        return x

    inputs = keras.Input(cfg["input_shape"], name="volumes")
    filters = [cfg["base_filters"] * 2**level for level in range(cfg["levels"])]
    skips = []
    x = inputs
    for level_filters in filters[:-1]:
        x = conv_block(x, level_filters)
        skips.append(x)
        x = layers.MaxPool3D(2)(x)
    x = conv_block(x, filters[-1])
    for level_filters, skip in zip(reversed(filters[:-1]), reversed(skips), strict=True):
        x = layers.Conv3DTranspose(level_filters, 2, strides=2)(x)
        x = layers.Concatenate()([skip, x])
        x = conv_block(x, level_filters)
    outputs = layers.Conv3D(cfg["classes"], 1)(x)
    model = keras.Model(inputs, outputs, name="unet3d")
    side = cfg["input_shape"][:3]
    return Sample(
        name="unet3d",
        description="3D U-Net (Cicek et al.) for brain tumour segmentation: 64^3 voxels x 4 "
        "channels, 4 levels, 16-32-64-128 filters, Conv3D+BatchNorm+ReLU x2 per level, "
        "per-voxel logits for 3 classes with sparse categorical crossentropy",
        batch_size=1,
        model=model,
        loss=_sparse_ce(from_logits=True),
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        optimizer_text="Adam(learning_rate=0.001)",
        x_spec=tf.TensorSpec([None, *cfg["input_shape"]], tf.float32, name="volumes"),
        y_spec=tf.TensorSpec([None, *side], tf.int32, name="labels"),
        int_ranges={"labels": [0, cfg["classes"]]},
    )


def build_bert() -> Sample:
    import keras
    import tensorflow as tf

    cfg = BERT_CONFIG
    layers = keras.layers

    class PositionEmbedding(layers.Layer):
        """Learned position embeddings for positions 0..seq_len-1, added to the input."""

        def __init__(self, seq_len: int, dim: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.seq_len = seq_len
            self.embedding = layers.Embedding(seq_len, dim)

        def build(self, input_shape: Any) -> None:
            self.embedding.build((self.seq_len,))

        def call(self, x: Any) -> Any:
            positions = keras.ops.arange(self.seq_len, dtype="int32")
            return x + self.embedding(positions)[None]

    tokens = keras.Input((cfg["seq_len"],), dtype="int32", name="token_ids")
    x = layers.Embedding(cfg["vocab"], cfg["hidden"])(tokens)
    x = PositionEmbedding(cfg["seq_len"], cfg["hidden"])(x)
    x = layers.LayerNormalization(epsilon=1e-12)(x)
    x = layers.Dropout(cfg["dropout"])(x)
    for _ in range(cfg["layers"]):
        attn = layers.MultiHeadAttention(
            num_heads=cfg["heads"],
            key_dim=cfg["hidden"] // cfg["heads"],
            dropout=cfg["dropout"],
        )(x, x)
        attn = layers.Dropout(cfg["dropout"])(attn)
        x = layers.LayerNormalization(epsilon=1e-12)(x + attn)
        ffn = layers.Dense(cfg["ffn"], activation=cfg["activation"])(x)
        ffn = layers.Dense(cfg["hidden"])(ffn)
        ffn = layers.Dropout(cfg["dropout"])(ffn)
        x = layers.LayerNormalization(epsilon=1e-12)(x + ffn)
    x = layers.Dense(cfg["hidden"], activation=cfg["activation"])(x)
    x = layers.LayerNormalization(epsilon=1e-12)(x)
    logits = layers.Dense(cfg["vocab"])(x)
    model = keras.Model(tokens, logits, name="bert")
    return Sample(
        name="bert",
        description="BERT-like encoder: token+position embeddings, 4 layers, hidden 256, 4 heads, "
        "FFN 1024 (GELU), LayerNorm, no dropout; masked-LM style head with logits "
        "[B,128,8192] and sparse categorical crossentropy over all 128 positions",
        batch_size=8,
        model=model,
        loss=_sparse_ce(from_logits=True),
        optimizer=keras.optimizers.Adam(learning_rate=1e-4),
        optimizer_text="Adam(learning_rate=0.0001)",
        x_spec=tf.TensorSpec([None, cfg["seq_len"]], tf.int32, name="token_ids"),
        y_spec=tf.TensorSpec([None, cfg["seq_len"]], tf.int32, name="labels"),
        int_ranges={"token_ids": [0, cfg["vocab"]], "labels": [0, cfg["vocab"]]},
    )


def build_lstm() -> Sample:
    import keras
    import tensorflow as tf

    cfg = LSTM_CONFIG
    inputs = keras.Input((cfg["seq_len"], cfg["features"]), name="sequences")
    x = keras.layers.LSTM(cfg["units"])(inputs)
    outputs = keras.layers.Dense(cfg["classes"])(x)
    model = keras.Model(inputs, outputs, name="lstm")
    return Sample(
        name="lstm",
        description="LSTM classifier: sequences of 20 steps x 16 features, LSTM 64 units, "
        "Dense 10 logits, sparse categorical crossentropy; the recurrence is a functional "
        "While loop (and its gradient) in the function library",
        batch_size=16,
        model=model,
        loss=_sparse_ce(from_logits=True),
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        optimizer_text="Adam(learning_rate=0.001)",
        x_spec=tf.TensorSpec([None, cfg["seq_len"], cfg["features"]], tf.float32, name="sequences"),
        y_spec=tf.TensorSpec([None], tf.int32, name="labels"),
        int_ranges={"labels": [0, cfg["classes"]]},
    )


def build_densenet() -> Sample:
    import keras
    import tensorflow as tf

    constructor = getattr(keras.applications, DENSENET_27K)
    model = constructor(weights=None, input_shape=(224, 224, 3), classes=1000)
    return Sample(
        name=model.name,
        description=f"keras.applications.{DENSENET_27K} (224x224x3, 1000 classes, softmax), "
        "sparse categorical crossentropy",
        batch_size=8,
        model=model,
        loss=_sparse_ce(from_logits=False),
        optimizer=keras.optimizers.Adam(learning_rate=1e-3),
        optimizer_text="Adam(learning_rate=0.001)",
        x_spec=tf.TensorSpec([None, 224, 224, 3], tf.float32, name="images"),
        y_spec=tf.TensorSpec([None], tf.int32, name="labels"),
        int_ranges={"labels": [0, 1000]},
    )


BUILDERS = {
    "mlp": build_mlp,
    "resnet50": build_resnet50,
    "vgg16": build_vgg16,
    "unet3d": build_unet3d,
    "bert": build_bert,
    "lstm": build_lstm,
}


# --------------------------------------------------------------------------------------------
# Worker: trace one sample in this (fresh) process.
# --------------------------------------------------------------------------------------------


def describe(sample: Sample, graph_def: Any, file_name: str) -> dict[str, Any]:
    """Build the samples.json entry of a traced sample, checking the graph on the way."""
    import numpy as np
    import tensorflow as tf

    placeholders = {n.name: n for n in graph_def.node if n.op == "Placeholder"}
    inputs = []
    for spec in tf.nest.flatten((sample.x_spec, sample.y_spec)):
        node = placeholders.get(spec.name)
        if node is None:
            raise SystemExit(f"{sample.name}: no placeholder named {spec.name!r} in the graph")
        dims = [d.size for d in node.attr["_output_shapes"].list.shape[0].dim]
        if not dims or dims[0] != -1:
            raise SystemExit(f"{sample.name}: input {spec.name!r} has a known batch dimension")
        inputs.append(
            {
                "name": spec.name,
                "dtype": tf.as_dtype(node.attr["dtype"].type).name,
                "shape": [None if d == -1 else d for d in dims],
            }
        )
    missing = [n.name for n in graph_def.node if "_output_shapes" not in n.attr]
    missing += [
        f"{f.signature.name}/{n.name}"
        for f in graph_def.library.function
        for n in f.node_def
        if "_output_shapes" not in n.attr
    ]
    if missing:
        raise SystemExit(f"{sample.name}: nodes without _output_shapes: {missing[:5]}")
    entry: dict[str, Any] = {
        "name": sample.name,
        "file": file_name,
        "description": sample.description,
        "batch_size": sample.batch_size,
        "inputs": inputs,
        "optimizer": sample.optimizer_text,
        "params": int(sum(int(np.prod(v.shape)) for v in sample.model.trainable_variables)),
        "nodes": len(graph_def.node),
        "functions": len(graph_def.library.function),
    }
    if sample.int_ranges:
        entry["labels_range"] = sample.int_ranges
    return entry


def run_worker(name: str, out_path: Path, meta_path: Path) -> None:
    """Trace the sample ``name`` (or ``densenet``), write its GraphDef and its description."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        from lmscore import tfgraph
    except ImportError:
        sys.path.insert(0, str(HERE.parent))
        from lmscore import tfgraph
    import keras
    import tensorflow as tf

    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    sample = build_densenet() if name == "densenet" else BUILDERS[name]()
    data = tfgraph.graphdef_from_keras(
        sample.model, sample.loss, sample.optimizer, sample.x_spec, sample.y_spec
    )
    graph_def = tf.compat.v1.GraphDef.FromString(data)
    entry = describe(sample, graph_def, out_path.name)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(data)
    meta_path.write_text(json.dumps(entry, sort_keys=True))


# --------------------------------------------------------------------------------------------
# Driver: one fresh process per sample.
# --------------------------------------------------------------------------------------------


def _spawn(name: str, out_path: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    with tempfile.TemporaryDirectory() as tmp:
        meta = Path(tmp) / "meta.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name]
        cmd += ["--worker-out", str(out_path), "--worker-meta", str(meta)]
        proc = subprocess.run(cmd, env=env, check=False)
        if proc.returncode != 0 or not meta.exists():
            raise SystemExit(f"generating {name} failed (exit status {proc.returncode})")
        return json.loads(meta.read_text())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_samples_json(out_dir: Path, entries: dict[str, dict[str, Any]]) -> None:
    path = out_dir / SAMPLES_JSON
    if path.exists():
        old = {e["name"]: e for e in json.loads(path.read_text())}
        entries = {**old, **entries}
    ordered = [entries[n] for n in SAMPLE_NAMES if n in entries]
    ordered += [entries[n] for n in sorted(entries) if n not in SAMPLE_NAMES]
    path.write_text(json.dumps(ordered, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="output directory")
    parser.add_argument(
        "--only", nargs="+", choices=SAMPLE_NAMES, metavar="NAME", help="samples to regenerate"
    )
    parser.add_argument(
        "--densenet-27k", type=Path, metavar="OUT_PATH", help="write a ~27k-node DenseNet step"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--worker-meta", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        run_worker(args.worker, args.worker_out, args.worker_meta)
        return 0

    names = list(args.only or ([] if args.densenet_27k else SAMPLE_NAMES))
    entries = {}
    for name in names:
        path = args.out / f"{name}.pb"
        entries[name] = entry = _spawn(name, path)
        size_mb = path.stat().st_size / 2**20
        print(
            f"{name:9s} nodes={entry['nodes']:6d} functions={entry['functions']:3d} "
            f"size={size_mb:7.2f} MiB params={entry['params']:10d} sha256={_sha256(path)}",
            flush=True,
        )
    if entries:
        _write_samples_json(args.out, entries)
    if args.densenet_27k:
        entry = _spawn("densenet", args.densenet_27k)
        print(
            f"{entry['name']} nodes={entry['nodes']} functions={entry['functions']} "
            f"-> {args.densenet_27k} sha256={_sha256(args.densenet_27k)}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
