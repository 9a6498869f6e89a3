"""3D U-Net input resolution on a 16 GiB V100: largest cubic volume without and with swapping.

    python bench/bench_unet_resolution.py [--quick] [--sizes 128 192 256 ...] [--link nvlink2]

The LMS papers report that large model support lets the 3D U-Net train at a 5.6x larger
image resolution on a 16 GiB GPU. This benchmark makes the same comparison on simulated
training steps of the ``unet3d`` sample (``sample_graphs/generate.py``: 4 levels, 16-32-64-128
filters, Adam, batch 1), traced at cubic input sizes that are multiples of 16 (the network
pools three times, so every level keeps an integer size):

(a) the largest size whose unswapped step fits: ``tune(g, 1, 16 GiB)`` (the default
    accelerator workspace model, as ``lms tune``) fits with a plan that changes nothing;
(b) the largest size that fits with the tuned rewrite (``result.fits``).

Both are found by doubling then bisection over the candidate sizes (fitting is monotone in
the size): the search starts at 64^3 (the sample's size), doubles while the step fits, then
bisects between the last size that fits and the first that does not. The search for (b)
starts from (a); every size is traced and tuned once, its result serves both searches.

Each size is traced in a fresh process by the sample generator's own worker (its model
builder, its seeds, ``lmscore.tfgraph``) with ``UNET3D_CONFIG["input_shape"]`` set to the
size, and cached as ``bench/out/unet3d_<size>.pb``. Tracing builds the graph only, it
allocates no activations, so its time and memory do not grow with the size. The 64^3 trace
is checked against ``sample_graphs/unet3d.pb`` (the generator's output is deterministic).

The ratio (b)/(a) is reported per axis and in voxels (cubed), with the range that the
16-voxel granularity of the search leaves, and the predicted overhead of the tuned plan at
the largest swapped size on NVLink 2.0 and PCIe 3.0.

Options: ``--sizes`` restricts the candidates to the given sizes (multiples of 16, e.g.
already cached ones); ``--quick`` searches multiples of 64 only; ``--link`` is the link the
search tunes for (default ``nvlink2``, the papers' POWER9 + V100 machines); ``--retrace``
ignores cached graphs. All figures are simulated (workspace "accelerator", the default).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
SAMPLE = ROOT / "sample_graphs" / "unet3d.pb"
sys.path.insert(0, str(ROOT))

import lmscore  # noqa: E402
from lmscore.tune import LINKS, TuneResult, tune  # noqa: E402
from lmscore.units import format_bytes  # noqa: E402

GIB = 2**30
DEVICE = "V100"
MEMORY = 16 * GIB
BATCH = 1
STEP = 16  # three 2x2x2 poolings: sizes must be multiples of 2**3; 16 keeps the deepest >= 2
START = 64  # the sample's size
PAPERS_RATIO = 5.6


# --- Tracing (worker process) --------------------------------------------------------------


def trace_worker(size: int, out_path: pathlib.Path) -> None:
    """Trace the unet3d sample at ``size``^3 with the generator's worker; print stats."""
    import resource

    sys.path.insert(0, str(ROOT / "sample_graphs"))
    import generate

    channels = generate.UNET3D_CONFIG["input_shape"][-1]
    generate.UNET3D_CONFIG["input_shape"] = (size, size, size, channels)
    with tempfile.TemporaryDirectory() as tmp:
        meta_path = pathlib.Path(tmp) / "meta.json"
        generate.run_worker("unet3d", out_path, meta_path)
        meta = json.loads(meta_path.read_text())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"nodes": meta["nodes"], "params": meta["params"], "rss_kib": rss}))


@dataclass
class Trace:
    size: int
    path: pathlib.Path
    seconds: float | None  # None when the graph came from the cache
    rss_bytes: int | None
    nodes: int | None


def trace(size: int, retrace: bool) -> Trace:
    """The training step at ``size``^3, from the cache or traced in a fresh process."""
    path = OUT / f"unet3d_{size}.pb"
    if path.exists() and not retrace:
        return Trace(size, path, None, None, None)
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()),
           "--trace-worker", str(size), "--worker-out", str(tmp)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t
    if proc.returncode != 0 or not tmp.exists():
        tmp.unlink(missing_ok=True)
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise SystemExit(f"tracing unet3d at {size}^3 failed (exit {proc.returncode}):\n{tail}")
    tmp.replace(path)
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    return Trace(size, path, seconds, stats["rss_kib"] * 1024, stats["nodes"])


# --- Probes --------------------------------------------------------------------------------


@dataclass
class Probe:
    size: int
    phase: str
    trace: Trace
    load_seconds: float
    tune_seconds: float
    result: TuneResult

    @property
    def plain(self) -> bool:
        return self.result.fits and self.result.plan.changes_nothing()

    @property
    def tuned(self) -> bool:
        return self.result.fits


HEADER = (f"  {'#':>2s} {'search':6s} {'size':>5s} {'Mvoxel':>7s} {'trace':>7s} "
          f"{'tracer RSS':>10s} {'load':>5s} {'tune':>6s} {'unswapped peak':>14s} "
          f"{'tuned peak':>10s} {'lower bound':>11s}  verdict")


def verdict(r: TuneResult) -> str:
    if r.fits and r.plan.changes_nothing():
        return "fits unswapped"
    if r.fits:
        return (f"fits with {r.swapped_tensors} swaps ({format_bytes(r.swap_bytes)}), "
                f"{r.recomputed_tensors} recomputations")
    if r.min_peak_bytes - r.persistent_bytes > r.budget_bytes:
        return f"no fit: lower bound over the budget (op {r.bound_op.rsplit('/', 1)[-1]})"
    return "no fit: the search found no plan under the budget"


class Prober:
    """Trace, load and tune each size once; print one table row per new size."""

    def __init__(self, link: str, retrace: bool) -> None:
        self.link = link
        self.retrace = retrace
        self.probes: dict[int, Probe] = {}
        self.sample_check: bool | None = None

    def __call__(self, size: int, phase: str) -> Probe:
        if size in self.probes:
            return self.probes[size]
        tr = trace(size, self.retrace)
        if size == START and SAMPLE.exists():
            self.sample_check = tr.path.read_bytes() == SAMPLE.read_bytes()
        t = time.perf_counter()
        g = lmscore.load(tr.path)
        lmscore.order(g)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        r = tune(g, BATCH, MEMORY, device=DEVICE, link=self.link)
        tune_s = time.perf_counter() - t
        p = Probe(size, phase, tr, load_s, tune_s, r)
        self.probes[size] = p
        traced = "cached" if tr.seconds is None else f"{tr.seconds:6.1f}s"
        rss = "" if tr.rss_bytes is None else format_bytes(tr.rss_bytes)
        # the rewritten step's peak, also when the best plan found does not fit
        tuned = "-" if r.plan.changes_nothing() else format_bytes(r.predicted_peak_bytes)
        print(f"  {len(self.probes):2d} {phase:6s} {size:5d} {size**3 / 1e6:7.2f} {traced:>7s} "
              f"{rss:>10s} {load_s:4.1f}s {tune_s:5.2f}s "
              f"{format_bytes(r.baseline_peak_bytes):>14s} {tuned:>10s} "
              f"{format_bytes(r.min_peak_bytes):>11s}  {verdict(r)}", flush=True)
        return p


def largest(ok, cands: list[int], start: int) -> tuple[int, bool]:
    """Index of the largest candidate where ``ok`` holds, by doubling then bisection.

    ``ok(cands[start])`` is probed first; if it holds, the size is doubled (the largest
    candidate at most twice the size, at least the next one) while ``ok`` holds, then the
    interval is bisected. Returns ``(index, capped)``: -1 if no candidate fits, and
    ``capped`` when even the largest candidate fits (the real limit may lie beyond).
    """
    if ok(cands[start]):
        lo = start
        while True:
            nxt = max(lo + 1, max(i for i, s in enumerate(cands) if s <= 2 * cands[lo]))
            if nxt >= len(cands):
                hi = len(cands)
                break
            if ok(cands[nxt]):
                lo = nxt
            else:
                hi = nxt
                break
    else:
        lo, hi = -1, start
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(cands[mid]):
            lo = mid
        else:
            hi = mid
    return lo, hi == len(cands)


# --- Report --------------------------------------------------------------------------------


def ratio_range(a: int, b: int, above_a: int | None, above_b: int | None) -> tuple[float, float]:
    """Per-axis ratio bounds: the real limits lie in [a, above_a) and [b, above_b)."""
    return b / (above_a or a), (above_b or b) / a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", metavar="N",
                    help="candidate cubic sizes (multiples of 16); default: all up to --max-size")
    ap.add_argument("--quick", action="store_true",
                    help="search multiples of 64 only (fewer traces)")
    ap.add_argument("--max-size", type=int, default=1024, help="largest candidate size")
    ap.add_argument("--link", choices=sorted(LINKS), default="nvlink2",
                    help="host link the search tunes for (default nvlink2)")
    ap.add_argument("--retrace", action="store_true", help="ignore cached graphs")
    ap.add_argument("--trace-worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=pathlib.Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.trace_worker:
        trace_worker(args.trace_worker, args.worker_out)
        return

    if args.sizes:
        bad = [s for s in args.sizes if s <= 0 or s % STEP]
        if bad:
            ap.error(f"sizes must be positive multiples of {STEP}: {bad}")
        cands = sorted(set(args.sizes))
    else:
        step = 64 if args.quick else STEP
        cands = list(range(step, args.max_size + 1, step))
    start = min((i for i, s in enumerate(cands) if s >= START), default=len(cands) - 1)

    t0 = time.perf_counter()
    print(f"3D U-Net (sample_graphs/generate.py unet3d) training step, batch {BATCH}, "
          f"{DEVICE} {format_bytes(MEMORY)}, workspace 'accelerator', search tuned for {args.link}")
    print(f"candidates: {len(cands)} sizes {cands[0]}..{cands[-1]}"
          f"{' (--quick: multiples of 64)' if args.quick and not args.sizes else ''}; "
          f"graphs cached in {OUT.relative_to(ROOT)}/")
    print("\n[1] search: doubling from the start size, then bisection "
          "(peaks include persistent memory)")
    print(HEADER, flush=True)
    probe = Prober(args.link, args.retrace)
    ia, capped_a = largest(lambda s: probe(s, "plain").plain, cands, start)
    if ia >= 0:
        # the tuned search starts where the plain one ended: that size fits unswapped
        known = {cands[ia]}

        def ok_tuned(s: int) -> bool:
            return s in known or probe(s, "tuned").tuned

        ib, capped_b = largest(ok_tuned, cands, ia)
    else:
        ib, capped_b = largest(lambda s: probe(s, "tuned").tuned, cands, 0)
    search_s = time.perf_counter() - t0

    a = cands[ia] if ia >= 0 else None
    b = cands[ib] if ib >= 0 else None
    capped = " (the largest candidate: the limit was not reached)"
    print(f"\n  (a) largest size that fits unswapped:        "
          f"{f'{a}^3' if a else 'none'}{capped if capped_a else ''}")
    print(f"  (b) largest size that fits with the rewrite: "
          f"{f'{b}^3' if b else 'none'}{capped if capped_b else ''}")
    nxt = {s: cands[cands.index(s) + 1] for s in (a, b)
           if s is not None and cands.index(s) + 1 < len(cands)}
    if a in nxt and nxt[a] in probe.probes:
        r = probe.probes[nxt[a]].result
        print(f"      at {nxt[a]}^3 the unswapped step needs "
              f"{format_bytes(r.baseline_peak_bytes - r.persistent_bytes)} (+ "
              f"{format_bytes(r.persistent_bytes)} persistent), over the "
              f"{format_bytes(r.budget_bytes)} budget (90% of the free memory)")
    if b in nxt and nxt[b] in probe.probes:
        print(f"      at {nxt[b]}^3: {probe.probes[nxt[b]].result.message}")
    if probe.sample_check is not None:
        print(f"  {START}^3 trace identical to sample_graphs/unet3d.pb: "
              f"{'yes' if probe.sample_check else 'NO'}")

    if a and b:
        nxt_a = cands[ia + 1] if ia + 1 < len(cands) else None
        nxt_b = cands[ib + 1] if ib + 1 < len(cands) else None
        lo, hi = ratio_range(a, b, nxt_a, nxt_b)
        axis, vox = b / a, (b / a) ** 3
        print(f"\n[2] resolution gain (b)/(a) = {b}^3 / {a}^3")
        if capped_a or capped_b:
            print("  (a limit was not reached: widen --sizes or --max-size for the real ratio)")
        print(f"  per axis:  {axis:5.2f}x   (granularity range {lo:.2f}x..{hi:.2f}x)")
        print(f"  voxels:    {vox:5.2f}x   (granularity range {lo**3:.2f}x..{hi**3:.2f}x)")
        closer = "voxels" if abs(vox - PAPERS_RATIO) < abs(axis - PAPERS_RATIO) else "per axis"
        print(f"  papers: {PAPERS_RATIO}x; the closer interpretation here: {closer} "
              f"({vox if closer == 'voxels' else axis:.2f}x)")

    if b and not probe.probes[b].result.plan.changes_nothing():
        print(f"\n[3] tuned plan at {b}^3 (largest swapped size), predicted on {DEVICE}")
        print(f"  {'link':8s} {'fits':4s} {'swaps':>5s} {'swapped':>10s} {'recomp':>6s} "
              f"{'peak':>10s} {'step unswapped':>14s} {'step tuned':>10s} {'overhead':>8s} "
              f"{'tune':>6s}")
        g = lmscore.load(OUT / f"unet3d_{b}.pb")
        for link in ("nvlink2", "pcie3"):
            t = time.perf_counter()
            r = tune(g, BATCH, MEMORY, device=DEVICE, link=link)
            dt = time.perf_counter() - t
            print(f"  {link:8s} {'yes' if r.fits else 'no':4s} {r.swapped_tensors:5d} "
                  f"{format_bytes(r.swap_bytes):>10s} {r.recomputed_tensors:6d} "
                  f"{format_bytes(r.predicted_peak_bytes):>10s} "
                  f"{r.baseline_step_seconds * 1e3:11.1f} ms "
                  f"{r.predicted_step_seconds * 1e3:7.1f} ms "
                  f"{r.predicted_overhead:8.1%} {dt:5.2f}s")
    elif b:
        print(f"\n[3] {b}^3 fits without swapping: no overhead to predict")

    traces = [p.trace for p in probe.probes.values() if p.trace.seconds is not None]
    print("\n[4] wall-clock")
    if traces:
        ts = [t.seconds for t in traces]
        rss = max(t.rss_bytes for t in traces)
        print(f"  traces: {len(traces)} new, {sum(ts):.1f} s total, {min(ts):.1f}-{max(ts):.1f} s "
              f"each; tracer peak RSS {format_bytes(rss)}; "
              f"{len(probe.probes) - len(traces)} from the cache")
    else:
        print(f"  traces: none new, {len(probe.probes)} from the cache")
    tunes = [p.tune_seconds for p in probe.probes.values()]
    print(f"  tuning: {len(tunes)} sizes, {sum(tunes):.1f} s total, max {max(tunes):.2f} s")
    print(f"  search {search_s:.1f} s; total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
