"""Tuning benchmarks: tuning time, the papers' figures, and the baselines side by side.

    python bench/bench_tune.py [--repeats 3] [--quick] [--grappler]

[1] tuning time (median) on ResNet-50 and a 27k-op DenseNet (targets: < 1 s, < 5 s);
[2] ResNet-50 largest batch on a 16 GiB V100 without and with the tuned rewrite, and the
    predicted overhead there (the LMS papers: 4.7-4.9x, 10-30% slower on NVLink);
[3] ours vs the TFLMS v2 search (and Grappler with --grappler) on every sample.
All figures are simulated (workspace "accelerator", the default of ``lms tune``).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import densenet, median_time  # noqa: E402

import lmscore  # noqa: E402
from lmscore.tune import max_batch, tune  # noqa: E402
from lmscore.units import format_bytes  # noqa: E402

GIB = 2**30


def tuning_time(repeats: int) -> None:
    dense = densenet()
    print("[1] tuning time (graph loaded and ordered beforehand; V100, PCIe 3)")
    for name, path, batch, budget, target in (
        ("resnet50", ROOT / "sample_graphs" / "resnet50.pb", 512, 16 * GIB, 1.0),
        ("densenet121", dense, 256, 16 * GIB, 5.0),
    ):
        g = lmscore.load(path)
        lmscore.order(g)
        t, r = median_time(lambda g=g, b=batch, bu=budget: tune(g, b, bu), repeats)
        verdict = "PASS" if t < target else "MISS"
        print(f"  {name:12s} {len(g.ops):6d} ops  batch {batch:4d}  {t:6.2f} s  "
              f"({r.evaluations} plans scored, fits={r.fits})  target < {target:.0f} s: {verdict}")


def papers(link: str) -> None:
    g = lmscore.load(ROOT / "sample_graphs" / "resnet50.pb")
    print(f"\n[2] ResNet-50 on a 16 GiB V100 ({link}), simulated")
    without, with_rw = max_batch(g, 16 * GIB, link=link)
    r = tune(g, with_rw, 16 * GIB, link=link)
    print(f"  largest batch: {without} without rewriting, {with_rw} with the tuned rewrite: "
          f"{with_rw / without:.2f}x (papers: 4.7-4.9x)")
    print(f"  at batch {with_rw}: predicted overhead {r.predicted_overhead:.1%}, "
          f"{r.swapped_tensors} tensors, {format_bytes(r.swap_bytes)} swapped")


def baselines(grappler: bool) -> None:
    print("\n[3] ours (each strategy) vs TFLMS v2 search" + (" vs Grappler" if grappler else "")
          + ", V100 PCIe 3, budget = 60% of the unswapped device peak")
    cases = (("mlp", 4096), ("resnet50", 128), ("vgg16", 64), ("unet3d", 4), ("bert", 128))
    header = f"  {'graph':9s} {'batch':>5s} {'budget':>10s} {'strategy':9s} {'fits':4s} " \
             f"{'peak':>10s} {'swapped':>10s} {'overhead':>8s}"
    print(header)
    for name, batch in cases:
        g = lmscore.load(ROOT / "sample_graphs" / f"{name}.pb")
        base = lmscore.simulate(g, batch, workspace="accelerator")
        budget = int(0.6 * base.peak_bytes)
        rows = [(s, tune(g, batch, budget, strategy=s))
                for s in ("hybrid", "swap", "recompute", "knobs", "tflms")]
        for label, r in rows:
            print(f"  {name:9s} {batch:5d} {format_bytes(budget):>10s} {label:9s} "
                  f"{'yes' if r.fits else 'no':4s} {format_bytes(r.predicted_peak_bytes):>10s} "
                  f"{format_bytes(r.swap_bytes):>10s} {r.predicted_overhead:8.1%}")
        if grappler:
            from lmscore.grappler import grappler_baseline

            gr = grappler_baseline(g, batch, budget)
            print(f"  {name:9s} {batch:5d} {format_bytes(budget):>10s} {'grappler':9s} "
                  f"{'':4s} {format_bytes(gr.predicted_peak_bytes):>10s} "
                  f"{format_bytes(gr.swap_bytes):>10s} {gr.predicted_overhead:8.1%}  {gr.note}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="skip the largest-batch search")
    ap.add_argument("--grappler", action="store_true")
    args = ap.parse_args()
    tuning_time(args.repeats)
    if not args.quick:
        papers("nvlink2")
        papers("pcie3")
    baselines(args.grappler)


if __name__ == "__main__":
    main()
