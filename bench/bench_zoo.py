"""The zoo table: simulation against TensorFlow, unmodified and tuned, on every zoo step.

For each zoo model (``tests/zoo.py``) at a batch size: the simulated over measured device
peak of the unmodified step (``lmscore.validate``); then, for budgets of 60% and 40% of
the transient peak (device = fixed memory + that share), the tuned plan (``lmscore.tune``,
default safety, this CPU's kernel workspace) run on the emulated accelerator three times
(``lmscore.validate_plan``): simulated over measured rewritten peak, the largest measured
peak over the device size B, measured over predicted saving, and the largest difference
of losses and variables after three steps, with Grappler off (the graph as given) and
with its default configuration (as ``lmscore.swap`` runs the step). Prints a markdown
table; the kernel library is whatever TensorFlow runs here (``TF_ENABLE_ONEDNN_OPTS``).

    python bench/bench_zoo.py [NAME[:BATCH] ...]
"""

from __future__ import annotations

import math
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import zoo  # noqa: E402

from lmscore.memory import cpu_kernel_library, simulate  # noqa: E402
from lmscore.tune import tune  # noqa: E402
from lmscore.validate import validate, validate_plan  # noqa: E402

#: Batches at which the activations, not the CPU kernels' fixed workspace, make the peak.
BATCHES = {"transformer_encoder": 32, "mobilenet_v2": 64, "stochastic_depth_cnn": 16,
           "mlp_dropout": 512, "mixed_precision_cnn": 32, "fit_cnn": 64, "gru_lstm": 32}


def main(argv: list[str]) -> None:
    chosen = argv or list(zoo.SMALL)
    print(f"kernel library: {cpu_kernel_library()}")
    print("| model | ops | batch | unmodified sim/meas (session's order) | budget | fits | "
          "rewritten sim/meas | measured / B | saving meas/pred | "
          "numerics (Grappler off / default) | tune s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for item in chosen:
        name, _, b = item.partition(":")
        e = zoo.BY_NAME[name]
        batch = int(b) if b else (e.batch if e.fixed_batch else BATCHES.get(name, e.batch))
        g = zoo.graph(name)
        v0 = validate(g, batch)
        base = simulate(g, batch, workspace="cpu")
        fixed = base.persistent_bytes + base.input_bytes
        for frac in (0.6, 0.4):
            device = int(fixed + frac * base.transient_peak_bytes)
            t0 = time.perf_counter()
            r = tune(g, batch, device, workspace="cpu")
            seconds = time.perf_counter() - t0
            head = (f"| {name} | {len(g.ops)} | {batch} | {v0.ratio:.3f} "
                    f"({v0.replayed_ratio:.3f}) | {frac:.0%} |")
            if not r.fits:
                print(f"{head} no: {r.message[:70]} | | | | | {seconds:.2f} |", flush=True)
                continue
            v = validate_plan(g, r.plan, batch, runs=3, grappler=True)
            meas = v.measured_device_peak_bytes["rewritten"]
            sim = v.simulated_device_peak_bytes["rewritten"]
            saving = "n/a" if math.isnan(v.saving_ratio) else f"{v.saving_ratio:.3f}"
            same = " / ".join("identical" if d == 0 else f"{d:.2g}"
                              for d in (v.max_abs_diff, v.max_abs_diff_grappler))
            print(f"{head} yes | {sim / meas:.3f} | {meas / device:.3f} | {saving} | {same} | "
                  f"{seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
