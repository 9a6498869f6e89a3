"""Rewrite benchmarks: plan + rewrite time, and CPU step time of rewritten vs original.

    python bench/bench_rewrite.py [--repeats 5] [--steps 6] [--batch 4]

Prints median times and ratios. The step-time comparison runs the original and the
rewritten ResNet-50 (exported for a GPU: plain Identity swap ops, soft placement onto the
CPU) one after the other in one process, alternating, so both see the same machine.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import densenet, median_time  # noqa: E402

import lmscore  # noqa: E402
from lmscore.plan import plan_from_params  # noqa: E402
from lmscore.rewrite import rewrite  # noqa: E402


def bench_rewrite_time(repeats: int) -> None:
    dense = densenet()
    print("[1] plan + rewrite time (threshold 40, ahead 3, groupby 5)")
    print(f"  {'graph':14s} {'ops':>7s} {'batch':>5s} {'swaps':>6s} {'plan s':>8s} "
          f"{'rewrite s':>9s} {'total s':>8s}")
    for name, path, batch in (("resnet50", ROOT / "sample_graphs" / "resnet50.pb", 64),
                              ("densenet121", dense, 32)):
        g = lmscore.load(path)
        lmscore.order(g)
        t_plan, plan = median_time(lambda g=g, b=batch: plan_from_params(
            g, b, threshold=40, ahead=3, groupby=5), repeats)
        t_rw, _ = median_time(lambda g=g, p=plan: rewrite(g, p), repeats)
        print(f"  {name:14s} {len(g.ops):7d} {batch:5d} {len(plan.swaps):6d} {t_plan:8.3f} "
              f"{t_rw:9.3f} {t_plan + t_rw:8.3f}")


def bench_step_time(batch: int, steps: int, rounds: int) -> None:
    from lmscore.export import to_graphdef
    from lmscore.measure import measure

    g = lmscore.load(ROOT / "sample_graphs" / "resnet50.pb")
    rw = rewrite(g, plan_from_params(g, batch, threshold=40, ahead=3, groupby=5))
    exported = to_graphdef(rw.graph, mode="gpu", device="/device:CPU:0", host="/device:CPU:0")
    print(f"\n[2] CPU step time, ResNet-50 batch {batch}: original vs rewritten "
          f"({len(rw.plan.swaps)} swaps, {len(rw.swap_ins)} swap-ins), {steps} steps x "
          f"{rounds} rounds, alternating")
    orig, new = [], []
    for _ in range(rounds):
        for graphdef, sink in ((g.graphdef, orig), (exported, new)):
            m = measure(graphdef, batch, steps=steps, trace_step=0)
            sink.extend(m.step_seconds[1:])  # the first untraced step warms up
    mo, mn = statistics.median(orig), statistics.median(new)
    print(f"  original  median {mo:.3f} s/step  (n={len(orig)})")
    print(f"  rewritten median {mn:.3f} s/step  (n={len(new)})")
    verdict = "PASS" if mn / mo <= 1.05 else "MISS"
    print(f"  ratio rewritten/original {mn / mo:.3f}  (target <= 1.05: {verdict})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    bench_rewrite_time(args.repeats)
    bench_step_time(args.batch, args.steps, args.rounds)


if __name__ == "__main__":
    main()
