"""Data-parallel steps: ``lmscore.swap`` of a step traced under ``tf.distribute.MirroredStrategy``.

The CPU is split into three logical devices before TensorFlow initializes (CPU:0 the host,
CPU:1 and CPU:2 the replicas), so each case runs in a subprocess: this process has
initialized TensorFlow already. The step is a custom loop (``strategy.run`` of a replica
step, ``strategy.reduce`` of its loss) over a distributed dataset; each replica's ops are
planned on their own device, and the rewritten step runs under the same strategy, next to
an unrewritten twin with the same initial weights.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.tf

ROOT = pathlib.Path(__file__).resolve().parent.parent

_BODY = r'''
import json, sys
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
import keras
import numpy as np

from lmscore import export
from lmscore.load import from_function
from lmscore.memory import simulate

MODE = sys.argv[1]
REPLICAS = ["/job:localhost/replica:0/task:0/device:CPU:1",
            "/job:localhost/replica:0/task:0/device:CPU:2"]
strategy = tf.distribute.MirroredStrategy(REPLICAS)
BATCH = 64


def make():
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((16, 16, 3))]
            + [keras.layers.Conv2D(8, 3, activation="relu", padding="same") for _ in range(6)]
            + [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(32, activation="relu"),
               keras.layers.Dense(5)])
        optimizer = keras.optimizers.Adam()
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) / BATCH
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(x, y):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x, y)), axis=None)

    return step, model.variables + optimizer.variables


rng = np.random.default_rng(0)
x = rng.standard_normal((BATCH, 16, 16, 3)).astype(np.float32)
y = rng.integers(0, 5, BATCH).astype(np.int32)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
xb, yb = next(iter(strategy.experimental_distribute_dataset(dataset)))
original, vars_a = make()
step, vars_b = make()
traced = step.get_concrete_function(xb, yb)
if MODE == "budget":
    # one replica's step: its device's ops (what swap plans per device)
    graph = from_function(traced)
    groups = export._device_groups(graph)
    replica, _ = export._device_step(graph, groups["CPU:2"], "CPU:2")
    base = simulate(replica, BATCH // 2)
    budget = int(base.persistent_bytes + base.input_bytes + 0.6 * base.transient_peak_bytes)
    swapped = export.swap(step, budget=budget)
else:
    swapped = export.swap(step, threshold=2)

gd = tf.compat.v1.GraphDef()
gd.ParseFromString(swapped.graphdef)
nodes = {n.name: n for n in gd.node}
swap_ins = {}
for n in gd.node:
    if n.attr["_lms_role"].s == b"swap_in":
        producer = n.attr["_lms_tensor"].s.decode().rsplit(":", 1)[0]
        swap_ins[n.name] = (n.device, nodes[producer].device)
swap_outs = sorted({n.device for n in gd.node if n.attr["_lms_role"].s == b"swap_out"})
losses = [[float(original(xb, yb)), float(swapped(xb, yb))] for _ in range(3)]
diffs = {}
for a, b in zip(vars_a, vars_b, strict=True):
    parts_a, parts_b = a.value.values, b.value.values
    diffs[a.path] = [float(np.max(np.abs(p.numpy() - q.numpy())))
                     for p, q in zip(parts_a, parts_b, strict=True)]
json.dump({"summary": swapped.summary, "swap_ins": swap_ins, "swap_outs": swap_outs,
           "host": swapped.host, "losses": losses, "diffs": diffs,
           "replicas": REPLICAS, "tuned": len(swapped.tuning),
           "components": sorted({len(v) for v in diffs.values()})}, sys.stdout)
'''


def _run(mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2",
           # oneDNN fuses a convolution's filter and bias gradients only where no control
           # edge reaches them, and a tuned plan pins its order by control edges (README,
           # "Numerics under the user's runtime"): with Eigen's kernels it is bit-identical
           "TF_ENABLE_ONEDNN_OPTS": "0"}
    proc = subprocess.run([sys.executable, "-c", _BODY, mode], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _check(out: dict) -> None:
    replicas = out["replicas"]
    assert out["components"] == [2]  # every variable is mirrored on both replicas
    by_device: dict[str, int] = {}
    for name, (device, producer_device) in out["swap_ins"].items():
        assert device == producer_device, name  # swap-ins back on the replica's device
        by_device[device] = by_device.get(device, 0) + 1
    assert sorted(by_device) == replicas, by_device  # at least one swap on each replica
    assert out["swap_outs"] == [out["host"]]
    assert "CPU:0" in out["host"]
    for original, swapped in out["losses"]:
        assert original == swapped
    assert out["losses"][0] != out["losses"][-1]  # the steps trained
    for name, diff in out["diffs"].items():
        assert diff == [0.0, 0.0], name


def test_budget_plans_each_replica_on_its_device():
    out = _run("budget")
    assert out["tuned"] == 3  # the host's step (the loss reduction) and the two replicas'
    assert out["summary"].count("hybrid plan") == 3
    _check(out)


def test_knob_plan_of_a_mirrored_step_trains_identically():
    out = _run("knobs")
    assert out["tuned"] == 0 and "knob plan (threshold 2" in out["summary"]
    _check(out)


def test_distributed_example_runs():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "distributed_loop.py")],
                          capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary, *losses = proc.stdout.strip().splitlines()
    assert "2 devices planned each" in summary
    assert summary.count("tensors swapped") == 2 and " 0 tensors swapped" not in summary
    assert len(losses) == 3 and np.isfinite([float(v) for v in losses]).all()
