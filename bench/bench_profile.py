"""The measured time model against measured steps: ``lms profile`` on the samples.

For each sample: how long ``lmscore.profile.profile`` takes; (a) the profiled model's step
time against the step measured again one op at a time (the profiled batch and twice it,
which the model scales by each op's roofline ratio); (b) for a few plans, the relative cost
(rewritten / original step time) the tuner predicts with the profile against the one
measured on the emulated accelerator. Measured figures are medians of ``--runs`` runs (each
the median of its untraced steps). Prints the ratio errors (predicted / measured - 1).

    python bench/bench_profile.py                       # mlp, lstm, bert, resnet50 (small batch)
    python bench/bench_profile.py --graphs mlp:256 --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace

from common import ROOT

sys.path.insert(0, str(ROOT))

import lmscore  # noqa: E402
from lmscore.measure import measure  # noqa: E402
from lmscore.memory import simulate  # noqa: E402
from lmscore.profile import measure_plan_seconds, profile, profiled_op_seconds  # noqa: E402
from lmscore.shapes import resolve  # noqa: E402
from lmscore.tune import plan_seconds, tune  # noqa: E402

GRAPHS = "mlp:1024,lstm:16,bert:8,resnet50:4"


def step_seconds(graph: lmscore.Graph, batch: int, runs: int, steps: int) -> float:
    """Median over runs of the median untraced step, one op at a time (as profiled)."""
    return statistics.median(
        statistics.median(measure(graph.graphdef, batch, steps=steps + 2, trace_step=0)
                          .step_seconds[1:]) for _ in range(runs))


def plans(graph: lmscore.Graph, batch: int, prof) -> list[tuple[str, lmscore.Plan]]:
    """Knob plans (pinned, so the device runs one op at a time as modelled) and a tuned one."""
    out = []
    for threshold in (5, 20):
        plan = lmscore.plan_from_params(graph, batch, threshold=threshold)
        if plan.swaps:
            out.append((f"knobs t={threshold}", replace(plan, pin_schedule=True)))
    sim = simulate(graph, batch, workspace="cpu")
    budget = sim.persistent_bytes + int(0.6 * (sim.peak_bytes - sim.persistent_bytes) / 0.9)
    r = tune(graph, batch, budget, workspace="cpu", profile=prof)
    if r.fits and not r.plan.changes_nothing():
        out.append(("tune 60%", r.plan))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default=GRAPHS, help=f"name:batch,... (default {GRAPHS})")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="untraced steps per measured run")
    args = ap.parse_args()
    for item in args.graphs.split(","):
        name, batch = item.split(":")
        batch = int(batch)
        graph = lmscore.load(ROOT / "sample_graphs" / f"{name}.pb")
        started = time.perf_counter()
        prof = profile(graph, batch)
        took = time.perf_counter() - started
        ms, gbs = 1e3, 1e9
        print(f"{name} b{batch}: profile {took:.1f} s, {len(prof.op_seconds)} ops, step "
              f"{prof.step_seconds * ms:.2f} ms (modelled {prof.modelled_step_seconds * ms:.2f}), "
              f"dispatch {prof.dispatch_seconds * 1e6:.2f} us, copies "
              f"{prof.host_to_device_bandwidth / gbs:.1f} / "
              f"{prof.device_to_host_bandwidth / gbs:.1f} GB/s", flush=True)
        for b in (batch, 2 * batch):
            predicted = sum(profiled_op_seconds(graph, resolve(graph, b), prof))
            measured = step_seconds(graph, b, args.runs, args.steps)
            print(f"  (a) b{b}: predicted {predicted * 1e3:.2f} ms, measured {measured * 1e3:.2f}"
                  f" ms, error {predicted / measured - 1:+.1%}", flush=True)
        for label, plan in plans(graph, batch, prof):
            base, with_plan = plan_seconds(graph, plan, batch, workspace="cpu", profile=prof)
            runs = [measure_plan_seconds(graph, plan, batch, steps=args.steps)
                    for _ in range(args.runs)]
            measured = statistics.median(r / o for o, r in runs)
            predicted = with_plan / base
            print(f"  (b) {label}: {len(plan.swaps)} swaps, {len(plan.recomputes)} recomputed; "
                  f"relative cost predicted {predicted:.3f}, measured {measured:.3f} "
                  f"(runs {', '.join(f'{r / o:.3f}' for o, r in runs)}), error "
                  f"{predicted / measured - 1:+.1%}", flush=True)


if __name__ == "__main__":
    main()
