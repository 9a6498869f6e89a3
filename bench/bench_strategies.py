"""Largest batch and predicted overhead of every tuning strategy, per device and host link.

    python bench/bench_strategies.py [--quick] [--graphs resnet50,bert,...] [--devices V100,A100]
        [--links nvlink2,pcie3] [--strategies hybrid,swap,...] [--repeats 3] [--markdown]

For every sample graph (``sample_graphs/samples.json``) and the 27k-op DenseNet training
step (``bench/common.py``), on each device preset and host link, one row:

- ``without``: the largest batch whose unrewritten step fits
  (``max_batch(..., rewrite_plans=False)``);
- ``bound``: the largest batch any plan can reach (``bound_batch``: the op with the largest
  working set must fit beside the persistent memory); that op is the last column;
- per strategy: the largest batch that fits with its plan, and its ratio to ``without``;
- ``sqrt(n)``, the baseline: Chen et al.'s checkpointing (:mod:`lmscore.checkpoint`), the
  largest batch where its plan fits (evaluated as every plan, by
  ``lmscore.evaluate.evaluate_plan``; it swaps nothing, so it is searched once per device);
- ``B``, the largest batch of ``tflms`` (where TFLMS's search stops; ``tflms`` is always
  searched): each strategy's predicted step-time overhead at ``B`` ("no fit" when its plan
  does not fit there), the baseline's too (``lmscore.tune.plan_seconds``, the tuner's time
  model), then the median wall time of one ``tune`` at ``B`` (graph loaded and ordered
  beforehand; ``--repeats`` calls).

``without`` and ``bound`` depend on the device only and are found once per device. The
largest batch of a strategy is searched per link (swap triggers are chosen with the link's
bandwidth), by doubling from ``without`` then bisection, never above ``bound``. Batches are
capped at 2**23; "+" marks a search that reached the cap (its ratio is then "-").

A block of the papers' figures beside ours follows the table. The 3-D U-Net's largest
input resolution is measured by ``bench/bench_unet_resolution.py`` (pointed to, not run).
Everything is simulated: the memory simulator with its accelerator workspace model and the
tuner's roofline time model, on the presets of :mod:`lmscore.tune` (safety 0.9).

``--quick`` runs mlp and resnet50 on a V100 over NVLink 2 (unless the options say
otherwise); ``--markdown`` prints both tables as Markdown. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from common import ROOT, densenet, median_time  # noqa: E402

sys.path.insert(0, str(ROOT))
from bench_unet_resolution import PAPERS_RATIO, largest  # noqa: E402

import lmscore  # noqa: E402
from lmscore.checkpoint import chen_plan  # noqa: E402
from lmscore.evaluate import evaluate_plan  # noqa: E402
from lmscore.tune import (  # noqa: E402
    DEVICES,
    LINKS,
    STRATEGY_NAMES,
    TuneResult,
    bound_batch,
    max_batch,
    plan_seconds,
    tune,
)

LIMIT = 1 << 23
SAFETY = 0.9  # tune's default, which every strategy's search uses
BASELINE = "sqrt(n)"
SAMPLES = [s["name"] for s in json.loads((ROOT / "sample_graphs" / "samples.json").read_text())]
GRAPHS = [*SAMPLES, "densenet121"]


@dataclass
class Row:
    graph: str
    ops: int
    device: str
    link: str
    without: int
    bound: int
    bound_op: str
    largest: dict[str, int]
    at: int  # B: the largest batch of tflms
    results: dict[str, TuneResult | None]  # None: tune raised (see errors)
    seconds: dict[str, float]
    errors: list[tuple[str, int, str]]  # (strategy, batch, exception) of a tune that raised
    chen: int = 0  # the largest batch of the sqrt(n) baseline
    chen_overhead: float | None = None  # its predicted overhead at B; None: no fit there

    def ratio(self, s: str) -> str:
        ok = 0 < self.without < LIMIT
        most = self.chen if s == BASELINE else self.largest[s]
        return f"{most / self.without:.2f}x" if ok else "-"

    def most(self, s: str) -> str:
        if s == BASELINE:
            return f"{batch(self.chen)} {self.ratio(s)}"
        failed = any(x == s and b > self.largest[s] for x, b, _ in self.errors)
        return f"{batch(self.largest[s])}{'!' if failed else ''} {self.ratio(s)}"

    def overhead(self, s: str) -> str:
        if s == BASELINE:
            return ("-" if not self.at else "no fit" if self.chen_overhead is None
                    else f"{self.chen_overhead:.1%}")
        if s not in self.results:
            return "-"
        r = self.results[s]
        return "error" if r is None else f"{r.predicted_overhead:.1%}" if r.fits else "no fit"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def batch(n: int) -> str:
    return f"{n}+" if n >= LIMIT else str(n)


def attempt(g, b: int, s: str, errors: list, **kw) -> TuneResult | None:
    """``tune``, or None when it raises: the error is recorded and the benchmark goes on."""
    try:
        return tune(g, b, strategy=s, **kw)
    except Exception as e:  # a planner's failure is a result here, not the end of the run
        errors.append((s, b, f"{type(e).__name__}: {e}"))
        log(f"  {s} at batch {b} raised {errors[-1][2]}")
        return None


def _largest_fitting(fits, without: int, bound: int, label: str) -> int:
    """Largest batch ``b`` with ``fits(b)``: doubling from ``without``, at most ``bound``."""
    def ok(b: int) -> bool:
        if b <= without:
            return True
        t = time.perf_counter()
        good = fits(b)
        log(f"  {label}: batch {b} {'fits' if good else 'no fit'} "
            f"({time.perf_counter() - t:.1f} s)")
        return good

    top = min(bound, LIMIT)
    if top < 1:
        return 0
    i, _ = largest(ok, range(1, top + 1), max(min(without, top) - 1, 0))
    return i + 1


def largest_batch(g, s: str, without: int, bound: int, errors: list, tag: str, **kw) -> int:
    """Largest batch that fits with strategy ``s``: doubling from ``without``, <= ``bound``."""
    def fits(b: int) -> bool:
        r = attempt(g, b, s, errors, **kw)
        return r is not None and r.fits

    return _largest_fitting(fits, without, bound, f"{tag} {s}")


def chen_fits(g, b: int, device: str) -> tuple[bool, object]:
    """Whether the sqrt(n) plan at batch ``b`` fits ``device`` as ``tune`` judges a fit."""
    plan = chen_plan(g, b)
    ev = evaluate_plan(g, plan, b)
    return ev.fits(DEVICES[device].memory_bytes, SAFETY), plan


def chen_largest(g, device: str, without: int, bound: int, tag: str) -> int:
    """Largest batch where the sqrt(n) plan fits: doubling from ``without``, <= ``bound``."""
    return _largest_fitting(lambda b: chen_fits(g, b, device)[0], without, bound,
                            f"{tag} {BASELINE}")


def chen_overhead(g, b: int, device: str, link: str) -> float | None:
    """The sqrt(n) plan's predicted overhead at batch ``b`` (tune's time model), if it fits."""
    fits, plan = chen_fits(g, b, device)
    if not fits:
        return None
    base, seconds = plan_seconds(g, plan, b, device=device, link=link)
    return max(0.0, seconds / base - 1) if base else 0.0


def measure(g, name: str, device: str, link: str, without: int, bound: tuple[int, str],
            strategies: list[str], repeats: int, chen: int) -> Row:
    tag, kw, errors = f"{name} {device} {link}", {"device": device, "link": link}, []
    best = {s: largest_batch(g, s, without, bound[0], errors, tag, **kw) for s in strategies}
    at, results, seconds = best["tflms"], {}, {}
    for s in strategies if at else []:
        seconds[s], results[s] = median_time(
            lambda s=s: attempt(g, at, s, errors, **kw), repeats)
        msg = "error" if results[s] is None else results[s].message
        log(f"  {tag} {s} at batch {at}: {seconds[s]:.2f} s, {msg}")
    overhead = chen_overhead(g, at, device, link) if at else None
    return Row(name, len(g.ops), device, link, without, bound[0], bound[1], best, at,
               results, seconds, errors, chen, overhead)


def columns(strategies: list[str]) -> list[tuple[str, int]]:
    """(header, text width) of every column."""
    return ([("graph", 11), ("ops", 6), ("device", 6), ("link", 7), ("without", 8),
             ("bound", 8)] + [(s, 15) for s in (*strategies, BASELINE)] + [("B", 8)]
            + [(f"{s} ovh", 9) for s in (*strategies, BASELINE)]
            + [(f"{s} s", 8) for s in strategies] + [("bound op", 0)])


def cells(row: Row, strategies: list[str]) -> list[str]:
    op = "/".join(row.bound_op.split("/")[-2:]) or "-"
    return ([row.graph, str(row.ops), row.device, row.link, batch(row.without), batch(row.bound)]
            + [row.most(s) for s in (*strategies, BASELINE)]
            + [batch(row.at) if row.at else "-"]
            + [row.overhead(s) for s in (*strategies, BASELINE)]
            + [f"{row.seconds[s]:.2f}" if s in row.seconds else "-" for s in strategies] + [op])


def line(values: list[str], cols: list[tuple[str, int]], markdown: bool) -> str:
    if markdown:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"
    return " ".join(v.rjust(w) if i else v.ljust(w) for i, (v, (_, w)) in
                    enumerate(zip(values, cols, strict=True))).rstrip()


def header(cols: list[tuple[str, int]], n: int, markdown: bool) -> list[str]:
    names = [h for h, _ in cols]
    if markdown:
        return [line(names, cols, True), "|" + "|".join(["---"] * len(cols)) + "|"]
    # (title, column width, columns): the baseline has a batch and an overhead, no plan time
    groups = [("largest batch, x without", 15, n + 1), ("overhead at B", 9, n + 1),
              ("plan s at B", 8, n)]
    top = " " * sum(w + 1 for _, w in cols[:6])
    top += " ".join(f"{g:-^{w * k + k - 1}}" + (" " * 9 if i == 0 else "")
                    for i, (g, w, k) in enumerate(groups))
    return [top.rstrip(), line([h.removesuffix(" ovh").removesuffix(" s") for h in names],
                               cols, False)]


def papers(rows: list[Row], strategies: list[str]) -> list[tuple[str, str, str]]:
    """(source, their figure, ours) rows; ours from the table."""
    def ours(graph: str) -> list[str]:
        out = [f"{r.device} {r.link}: " + ", ".join(f"{s} {r.ratio(s)}" for s in strategies)
               + f"; overhead at B={batch(r.at)}: "
               + ", ".join(f"{s} {r.overhead(s)}" for s in strategies)
               for r in rows if r.graph == graph]
        return out or [f"(not run: add {graph} to --graphs)"]

    s0 = strategies[0]
    pofo = [f"{d} {lk} {s0}: " + ", ".join(f"{r.graph} {r.ratio(s0)} / {r.overhead(s0)}"
                                           for r in rows if (r.device, r.link) == (d, lk))
            for d, lk in dict.fromkeys((r.device, r.link) for r in rows)]
    slow = []
    for s in strategies:
        timed = [(r.seconds[s], r) for r in rows if s in r.seconds]
        if timed:
            t, r = max(timed, key=lambda x: x[0])
            slow.append(f"{s}: at most {t:.2f} s ({r.graph}, {r.ops} ops, {r.device} {r.link}, "
                        f"batch {r.at})")
    out = []
    for source, figure, lines in (
        ("LMS / TFLMS", "ResNet-50: 4.7-4.9x the batch at 10-30% measured overhead, NVLink 2 "
         "(POWER9 + V100)", ours("resnet50")),
        ("Capuchin", "BERT: 7x the batch", ours("bert")),
        ("POFO", "4-6x the batch at under 20% overhead", pofo or ["(no rows)"]),
        ("Checkmate", "minutes to days of planning (MILP, Gurobi) on 51-353 layers",
         slow or ["(no plans timed)"]),
        ("Chen et al.", "sqrt(n) checkpointing: O(sqrt(n)) activations for about one extra "
         "forward pass", [f"{r.graph} {r.device} {r.link}: {BASELINE} {r.ratio(BASELINE)}, "
                          f"overhead at B={batch(r.at)} {r.overhead(BASELINE)}"
                          for r in rows] or ["(no rows)"]),
        ("LMS", f"3-D U-Net: {PAPERS_RATIO}x the input resolution on a 16 GiB GPU",
         ["python bench/bench_unet_resolution.py [--link nvlink2|pcie3] "
          "(default strategy, V100)"]),
    ):
        out += [(source, figure, lines[0])] + [("", "", x) for x in lines[1:]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="mlp and resnet50, V100, nvlink2")
    ap.add_argument("--graphs", help=f"comma-separated, of {','.join(GRAPHS)} (default: all)")
    ap.add_argument("--devices", help="comma-separated device presets (default: V100,A100)")
    ap.add_argument("--links", help="comma-separated link presets (default: nvlink2,pcie3)")
    ap.add_argument("--strategies", help=f"comma-separated (default: {','.join(STRATEGY_NAMES)})")
    ap.add_argument("--repeats", type=int, default=3, help="timed tune calls per strategy")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = ap.parse_args()
    quick = args.quick
    graphs = (args.graphs or ("mlp,resnet50" if quick else ",".join(GRAPHS))).split(",")
    devices = (args.devices or ("V100" if quick else "V100,A100")).split(",")
    links = (args.links or ("nvlink2" if quick else "nvlink2,pcie3")).split(",")
    strategies = (args.strategies or ",".join(STRATEGY_NAMES)).split(",")
    strategies += [] if "tflms" in strategies else ["tflms"]
    for kind, got, known in (("graph", graphs, GRAPHS), ("device", devices, DEVICES),
                             ("link", links, LINKS), ("strategy", strategies, STRATEGY_NAMES)):
        bad = [x for x in got if x not in known]
        if bad:
            ap.error(f"unknown {kind} {', '.join(bad)} (choose from {', '.join(known)})")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")

    t0 = time.perf_counter()
    md, cols = args.markdown, columns(strategies)
    mems = ", ".join(f"{d} {DEVICES[d].memory_bytes >> 30} GiB" for d in devices)
    print(f"Largest batch per strategy: {mems}; links {', '.join(links)}; simulated, safety "
          f"0.9. At B, tflms's largest batch: each strategy's predicted overhead ('no fit': "
          f"its plan does not fit there) and planning time (s, median of {args.repeats}).\n")
    print("\n".join(header(cols, len(strategies), md)), flush=True)
    rows: list[Row] = []
    for name in graphs:
        path = densenet() if name == "densenet121" else ROOT / "sample_graphs" / f"{name}.pb"
        g = lmscore.load(path)
        lmscore.order(g)
        for device in devices:
            log(f"{name} ({len(g.ops)} ops) on {device}: bound and batch without LMS")
            bound = bound_batch(g, device=device, limit=LIMIT)
            without = max_batch(g, device=device, rewrite_plans=False, limit=LIMIT)[0]
            chen = chen_largest(g, device, without, bound[0], f"{name} {device}")
            for link in links:
                rows.append(measure(g, name, device, link, without, bound, strategies,
                                    args.repeats, chen))
                print(line(cells(rows[-1], strategies), cols, md), flush=True)

    failed: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        for s, b, e in r.errors:
            failed.setdefault((f"{r.graph} {r.device} {r.link} {s}", e), []).append(b)
    if failed:
        print("\ntune raised (counted as no fit; '!' marks a largest batch it may have cut):")
    for (where, e), bs in failed.items():
        print(f"  {where}: {e} ({len(bs)} calls, batch {min(bs)}..{max(bs)})")

    print("\nThe papers' figures (measured on their machines) beside ours (simulated, above)\n")
    if md:
        print("| source | their figure | ours |\n|---|---|---|")
    for source, figure, ours in papers(rows, strategies):
        if md:
            print(line([source, figure, ours], [], True))
            continue
        if figure:
            print(f"  {source:12s} {figure}")
        print(f"  {'':12s} {'ours:' if figure else '':5s} {ours}")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
