"""The ``lms`` command line: the same functions as the web app, for scripts and CI.

Every user error ends in one line on stderr (``lms: error: ...``) and exit status 2.
TensorFlow is imported only by the commands that run or export a graph.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import samples
from .errors import ConfigError, LmsError
from .units import format_bytes

if TYPE_CHECKING:  # the CLI imports TensorFlow-free modules lazily, per command
    from .evaluate import PlanEvaluation

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in the same one-line form, exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"lms: error: {message} (see 'lms {self.prog.split()[-1]} -h')\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _workspace_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workspace", choices=("accelerator", "cpu", "eigen", "onednn"), default="accelerator",
        help="kernel workspace the simulation counts: accelerator (default: none; cuDNN falls "
             "back to workspace-free algorithms, so predictions never depend on this machine), "
             "cpu (TensorFlow's kernels on this CPU, as lms validate measures), or one CPU "
             "kernel library by name")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lms`` (one sub-command per job)."""
    parser = _Parser(prog="lms", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("inspect", help="ops, levels, simulated peak and hotspots of a graph")
    p.add_argument("file", help="GraphDef (.pb/.pbtxt), SavedModel dir/zip, or a sample name")
    p.add_argument("--batch-size", type=_positive_int, default=None,
                   help="fills unknown batch dimensions (default: the sample's, else 1)")
    p.add_argument("--function", default=None, help="SavedModel function or signature")
    p.add_argument("--top", type=_positive_int, default=10, help="hotspots to list")
    _workspace_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("validate", help="run on CPU under TensorFlow: measured vs simulated peak")
    p.add_argument("file")
    p.add_argument("--batch-size", type=_positive_int, default=None)
    p.add_argument("--function", default=None)
    p.add_argument("--steps", type=_positive_int, default=None,
                   help="steps to run, the last one traced (2; 3 with --plan)")
    p.add_argument("--plan", default=None,
                   help="also run this rewrite on the emulated accelerator and compare")
    p.add_argument("--timeline", default=None, metavar="OUT.html|OUT.json",
                   help="with --plan: write the measured and simulated device curves of the "
                        "rewritten step on one time axis, what the device held at its "
                        "measured peak that the simulation had freed, and when each swap ran")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("rewrite", help="swap tensors to host memory: a plan, a new graph")
    p.add_argument("file")
    p.add_argument("--batch-size", type=_positive_int, default=None)
    p.add_argument("--function", default=None)
    knobs = p.add_argument_group("knobs (TFLMS v2), or --plan")
    knobs.add_argument("--threshold", type=int, default=None,
                       help="consumers more than this many levels away read from host (5)")
    knobs.add_argument("--ahead", type=int, default=None,
                       help="trigger swap-ins about this many levels early (1)")
    knobs.add_argument("--groupby", type=int, default=None,
                       help="consumers within this many levels share a swap-in (5)")
    knobs.add_argument("--sync-mode", type=int, default=None, help="0-3 (0)")
    knobs.add_argument("--serialize", default=None, help="levels to serialize: 3,7,12")
    knobs.add_argument("--serialize-min", default=None,
                       help="serialize levels above this device memory (e.g. 2GiB)")
    knobs.add_argument("--include-scope", action="append", default=[])
    knobs.add_argument("--exclude-scope", action="append", default=[])
    knobs.add_argument("--include-type", action="append", default=[])
    knobs.add_argument("--exclude-type", action="append", default=[])
    p.add_argument("--plan", default=None, help="apply this plan instead of the knobs")
    p.add_argument("--out", required=True, help="rewritten GraphDef (.pb or .pbtxt)")
    p.add_argument("--plan-out", default=None, help="write the applied plan (JSON)")
    p.add_argument("--device", default="/GPU:0", help="accelerator device string")
    p.add_argument("--host", default="/CPU:0", help="host device string")
    _workspace_arg(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("tune", help="the fastest plan that fits a memory budget")
    p.add_argument("file")
    p.add_argument("--budget", required=True, help="device memory: bytes or 16GiB, 15.5GB...")
    p.add_argument("--batch-size", type=_positive_int, default=None)
    p.add_argument("--function", default=None)
    p.add_argument("--device", default="V100", help="device preset: P100, V100, A100, H100")
    p.add_argument("--link", default="pcie3", help="host link preset: pcie3, pcie4, nvlink2")
    p.add_argument("--safety", type=float, default=0.9, help="usable fraction (0.9)")
    p.add_argument("--strategy", choices=("hybrid", "swap", "recompute", "knobs", "tflms",
                                          "default"), default="hybrid")
    _workspace_arg(p)
    p.add_argument("--max-batch", action="store_true",
                   help="largest batch that fits without and with the tuned rewrite")
    p.add_argument("--compare-grappler", action="store_true",
                   help="also run TensorFlow's Grappler swapping and TFLMS v2 search")
    p.add_argument("--plot", default=None, help="write the memory curves (.html)")
    p.add_argument("--out", default=None, help="write the rewritten GraphDef")
    p.add_argument("--plan-out", default=None, help="write the plan (JSON)")
    p.add_argument("--json", action="store_true")

    sub.add_parser("samples", help="list the bundled sample graphs")
    sub.add_parser("serve", help="the web app (lms serve [FILE] [--port 8050] ...; -h for more)",
                   add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lms`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:  # the web app has its own options
        from lmsviz.app import main as serve

        return serve(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except LmsError as e:
        print(f"lms: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("lms: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except MemoryError:
        print("lms: error: out of memory", file=sys.stderr)
        return 1


def _default_batch(path: str, given: int | None) -> int:
    if given is not None:
        return given
    name = os.path.basename(path)
    for s in samples.samples():
        if name in (s["name"], s["file"]):
            return int(s["batch_size"])
    return 1


def _load(args: argparse.Namespace) -> tuple[Any, int]:
    from .load import load

    path = samples.find(args.file)
    graph = load(path, function=args.function)
    return graph, _default_batch(str(path), args.batch_size)


def inspect_report(
    graph: Any, batch_size: int, top: int = 10, workspace: str = "accelerator"
) -> dict[str, Any]:
    """The ``lms inspect --json`` object for ``graph`` at ``batch_size``."""
    from .memory import hotspots, simulate
    from .order import CATEGORIES, order
    from .shapes import resolve

    ordering = order(graph)
    sizes = resolve(graph, batch_size)
    sim = simulate(graph, batch_size, sizes=sizes, workspace=workspace)
    counts = {c: 0 for c in CATEGORIES}
    for c in ordering.categories:
        counts[c] += 1
    unknown = sim.unknown_size_tensors
    return {
        "file": graph.source,
        "batch_size": batch_size,
        "ops": len(graph.ops),
        "levels": ordering.num_levels,
        "categories": counts,
        "loss": ordering.loss,
        "peak_bytes": sim.peak_bytes,
        "peak_level": sim.peak_level,
        "persistent_bytes": sim.persistent_bytes,
        "input_bytes": sim.input_bytes,
        "transient_peak_bytes": sim.transient_peak_bytes,
        "host_peak_bytes": sim.host_peak_bytes,
        "swap_ops": sum(1 for op in graph.ops if op.attrs.get("_lms_role")),
        "unknown_size_tensors": len(unknown),
        "unknown_size_examples": list(unknown[:10]),
        "hotspots": [
            {
                "tensor": h.tensor,
                "bytes": h.bytes,
                "producer_level": h.producer_level,
                "last_use_level": h.last_use_level,
                "distance": h.distance,
                "category": h.category,
                "swappable": h.swappable,
                "reason": h.reason,
            }
            for h in hotspots(graph, sim, limit=top, sizes=sizes)
        ],
    }


def _cmd_inspect(args: argparse.Namespace) -> int:
    graph, batch = _load(args)
    report = inspect_report(graph, batch, args.top, args.workspace)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    cats = ", ".join(f"{v} {k}" for k, v in report["categories"].items())
    print(f"{report['file']}  (batch size {batch})")
    print(f"  ops {report['ops']} ({cats}), levels {report['levels']}, loss {report['loss']}")
    print(f"  simulated peak   {format_bytes(report['peak_bytes'])} at level "
          f"{report['peak_level']}")
    print(f"  persistent       {format_bytes(report['persistent_bytes'])} "
          "(variables, optimizer state, constants)")
    print(f"  feeds            {format_bytes(report['input_bytes'])}")
    print(f"  transient peak   {format_bytes(report['transient_peak_bytes'])}")
    if report["swap_ops"]:
        print(f"  host peak        {format_bytes(report['host_peak_bytes'])} "
              f"({report['swap_ops']} swap ops)")
    if report["unknown_size_tensors"]:
        ex = ", ".join(report["unknown_size_examples"][:3])
        print(f"  unknown sizes    {report['unknown_size_tensors']} tensors counted as 0 "
              f"bytes (e.g. {ex})")
    print(f"\n  tensors alive at the peak (largest {len(report['hotspots'])}):")
    print(_table(
        ["tensor", "size", "from", "to", "dist", "category", "swap"],
        [
            [h["tensor"], format_bytes(h["bytes"]), h["producer_level"], h["last_use_level"],
             h["distance"], h["category"], "yes" if h["swappable"] else h["reason"]]
            for h in report["hotspots"]
        ],
    ))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from .validate import validate

    if args.timeline and not args.plan:
        raise ConfigError("--timeline needs --plan (it shows a rewritten step)")
    if args.timeline and not args.timeline.endswith((".html", ".json")):
        raise ConfigError(f"{args.timeline}: --timeline writes .html or .json")
    graph, batch = _load(args)
    if args.plan:
        return _validate_plan(args, graph, batch)
    args.steps = args.steps or 2
    result = validate(graph, batch, steps=args.steps)
    report = result.as_dict()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{graph.source}  (batch size {batch}, {args.steps} steps on CPU, last traced)")
    print(_table(
        ["", "simulated", "measured", "ratio"],
        [
            ["transient peak", format_bytes(report["simulated_transient_peak_bytes"]),
             format_bytes(report["measured_transient_peak_bytes"]),
             f"{report['transient_ratio']:.3f}"],
            ["device peak", format_bytes(report["simulated_peak_bytes"]),
             format_bytes(report["measured_peak_bytes"]), f"{report['ratio']:.3f}"],
        ],
    ))
    print(f"  losses {', '.join(f'{v:.6g}' for v in report['losses'])}; "
          f"finite: {'yes' if report['finite'] else 'NO'}")
    return 0


def _levels_arg(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--serialize takes levels like 3,7,12, got {text!r}") from None


def rewrite_report(ev: PlanEvaluation) -> dict[str, Any]:
    """The ``lms rewrite --json`` object: predictions before and after the rewrite.

    ``ev`` is the plan's :class:`lmscore.evaluate.PlanEvaluation`.
    """
    rw = ev.rewrite
    return {
        "batch_size": ev.after.batch_size,
        "baseline_peak_bytes": ev.before.peak_bytes,
        "predicted_peak_bytes": ev.after.peak_bytes,
        "predicted_host_peak_bytes": ev.after.host_peak_bytes,
        "swapped_tensors": len(rw.plan.swaps),
        "swap_bytes": ev.swap_bytes,
        "swap_ins": len(rw.swap_ins),
        "synchronous_swap_ins": len(rw.synchronous),
        "skipped": [{"tensor": t, "reason": r} for t, r in rw.skipped],
        "sync_mode": rw.plan.sync_mode,
        "serialized_levels": list(rw.plan.serialize),
    }


def _cmd_rewrite(args: argparse.Namespace) -> int:
    from .evaluate import evaluate_plan
    from .export import write_graphdef
    from .plan import check_plan, load_plan, plan_from_params, save_plan
    from .units import parse_bytes

    graph, batch = _load(args)
    source = samples.find(args.file).resolve()
    out = pathlib.Path(args.out)
    for dest in filter(None, (args.out, args.plan_out)):
        d = pathlib.Path(dest)
        if d.resolve() == source:
            raise ConfigError(f"{dest}: refusing to overwrite the input graph")
        if d.is_dir():
            raise ConfigError(f"{dest}: is a directory")
        if not os.access(d.parent.resolve() if str(d.parent) else ".", os.W_OK):
            raise ConfigError(f"{dest}: cannot write to {d.parent or '.'}")
    if args.plan_out and pathlib.Path(args.plan_out).resolve() == out.resolve():
        raise ConfigError(f"{args.plan_out}: the plan and the graph would be the same file")
    knobs = {
        "threshold": args.threshold, "ahead": args.ahead, "groupby": args.groupby,
        "sync_mode": args.sync_mode,
    }
    if args.plan:
        given = [f"--{k.replace('_', '-')}" for k, v in knobs.items() if v is not None]
        if given:
            raise ConfigError(f"--plan replaces the knobs; drop {', '.join(given)}")
        plan = load_plan(args.plan)
        check_plan(graph, plan)
    else:
        defaults = {"threshold": 5, "ahead": 1, "groupby": 5, "sync_mode": 0}
        plan = plan_from_params(
            graph, batch,
            **{k: (defaults[k] if v is None else v) for k, v in knobs.items()},
            serialize=_levels_arg(args.serialize),
            serialize_min_bytes=parse_bytes(args.serialize_min) if args.serialize_min else None,
            include_scopes=args.include_scope, exclude_scopes=args.exclude_scope,
            include_types=args.include_type, exclude_types=args.exclude_type,
        )
    ev = evaluate_plan(graph, plan, batch, workspace=args.workspace)
    rw = ev.rewrite
    report = rewrite_report(ev)
    write_graphdef(rw.graph, out, device=args.device, host=args.host)
    if args.plan_out:
        save_plan(rw.plan, args.plan_out)
    report["out"] = str(out)
    report["plan_out"] = args.plan_out
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{graph.source}  (batch size {batch})")
    print(f"  swapped tensors  {report['swapped_tensors']} ({format_bytes(report['swap_bytes'])}"
          f"), {report['swap_ins']} swap-ins, {report['synchronous_swap_ins']} synchronous")
    print(f"  device peak      {format_bytes(report['baseline_peak_bytes'])} -> "
          f"{format_bytes(report['predicted_peak_bytes'])} (simulated)")
    print(f"  host peak        {format_bytes(report['predicted_host_peak_bytes'])}")
    for sk in report["skipped"]:
        print(f"  skipped {sk['tensor']}: {sk['reason']}")
    print(f"  wrote {out}" + (f" and {args.plan_out}" if args.plan_out else ""))
    return 0


def _validate_plan(args: argparse.Namespace, graph: Any, batch: int) -> int:
    from .plan import check_plan, load_plan
    from .validate import validate_plan

    plan = load_plan(args.plan)
    check_plan(graph, plan)
    v = validate_plan(graph, plan, batch, steps=args.steps or 3)
    if args.timeline and v.timeline is not None:
        _write_timeline(args.timeline, v.timeline, f"{pathlib.Path(graph.source).name}, "
                        f"batch {batch}, {v.swapped_tensors} swapped tensors")
    report = v.as_dict()
    if not args.timeline:
        report.pop("timeline", None)  # long; asked for with --timeline
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    md, sd = v.measured_device_peak_bytes, v.simulated_device_peak_bytes
    print(f"{graph.source}  (batch size {batch}, {v.swapped_tensors} swapped tensors, "
          "emulated accelerator: CPU:0 device, CPU:1 host)")
    print(_table(
        ["", "simulated", "measured"],
        [
            ["device peak, original", format_bytes(sd["original"]), format_bytes(md["original"])],
            ["device peak, rewritten", format_bytes(sd["rewritten"]),
             format_bytes(md["rewritten"])],
            ["host peak", format_bytes(v.simulated_host_peak_bytes),
             format_bytes(v.measured_host_peak_bytes)],
        ],
    ))
    saving = ("n/a (predicted saving under 1% of the peak)" if math.isnan(v.saving_ratio)
              else f"{v.saving_ratio:.3f}")
    runs = ", ".join(format_bytes(b) for b in v.rewritten_runs)
    print(f"  rewritten step measured {len(v.rewritten_runs)} times ({runs}): the largest is shown")
    print(f"  measured saving / simulated saving: {saving}; "
          f"host simulated / measured: {v.host_ratio:.3f}")
    if v.timeline is not None and v.timeline.missed:
        top = ", ".join(f"{h.node} ({format_bytes(h.bytes)})" for h in v.timeline.missed[:3])
        print(f"  held at the measured peak but freed in the simulation: {top}")
    if args.timeline:
        print(f"  wrote {args.timeline}")
    same = "bit-identical" if v.max_abs_diff == 0 else f"max |diff| {v.max_abs_diff:.3g}"
    print(f"  losses and variables after {len(v.losses['original'])} steps: {same}")
    if not math.isnan(v.max_abs_diff_grappler):
        print("  under default Grappler (as lmscore.swap runs it): max |diff| "
              f"{v.max_abs_diff_grappler:.3g}")
    if v.diverged:
        print(f"  the loss diverged on the synthetic data: {v.divergence}")
    return 0


def _write_timeline(path: str, t: Any, title: str) -> None:
    from .plan import write_atomic
    from .timeline import figure

    if path.endswith(".json"):
        write_atomic(path, json.dumps(t.as_dict(), indent=1))
    else:
        write_atomic(path, figure(t, title).to_html(
            include_plotlyjs=True, full_html=True,  # self-contained: nothing fetched
            config={"displaylogo": False, "showLink": False, "showSendToCloud": False}))


class _Progress:
    """A progress bar on stderr when it is a terminal; silent otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.shown = False

    def __call__(self, fraction: float, message: str) -> None:
        if not self.tty:
            return
        width = 30
        done = int(width * min(max(fraction, 0.0), 1.0))
        sys.stderr.write(f"\r  [{'#' * done}{'.' * (width - done)}] {fraction:4.0%} "
                         f"{message[:50]:50s}")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


def tune_report(result: Any) -> dict[str, Any]:
    """The ``lms tune --json`` object of a :class:`lmscore.tune.TuneResult`."""
    return {
        "fits": result.fits,
        "budget_bytes": result.budget_bytes,
        "device_memory_bytes": result.device_memory_bytes,
        "persistent_bytes": result.persistent_bytes,
        "baseline_peak_bytes": result.baseline_peak_bytes,
        "predicted_peak_bytes": result.predicted_peak_bytes,
        "predicted_host_peak_bytes": result.predicted_host_peak_bytes,
        "predicted_overhead": result.predicted_overhead,
        "baseline_step_seconds": result.baseline_step_seconds,
        "predicted_step_seconds": result.predicted_step_seconds,
        "swapped_tensors": result.swapped_tensors,
        "swap_bytes": result.swap_bytes,
        "recomputed_tensors": result.recomputed_tensors,
        "strategy": result.strategy,
        "knobs": result.knobs,
        "evaluations": result.evaluations,
        "min_peak_bytes": result.min_peak_bytes,
        "bound_op": result.bound_op,
        "message": result.message,
    }


def _cmd_tune(args: argparse.Namespace) -> int:
    from .plan import save_plan
    from .rewrite import rewrite
    from .tune import bound_batch, max_batch, tune
    from .units import parse_bytes

    budget = parse_bytes(args.budget)
    graph, batch = _load(args)
    source = samples.find(args.file).resolve()
    for dest in filter(None, (args.out, args.plan_out, args.plot)):
        if pathlib.Path(dest).resolve() == source:
            raise ConfigError(f"{dest}: refusing to overwrite the input graph")
    opts = {"device": args.device, "link": args.link, "safety": args.safety,
            "workspace": args.workspace}
    bar = _Progress()
    try:
        result = tune(graph, batch, budget, strategy=args.strategy, progress=bar, **opts)
        report = tune_report(result)
        report["batch_size"] = batch
        if args.max_batch:
            bar(0.95, "largest batch sizes")
            without, with_rw = max_batch(graph, budget, strategy=args.strategy, **opts)
            report["max_batch_without"] = without
            report["max_batch_with"] = with_rw
            report["max_batch_bound"], report["max_batch_bound_op"] = bound_batch(
                graph, budget, device=args.device, safety=args.safety,
                workspace=args.workspace)
        if args.compare_grappler:
            report["comparison"] = _compare(graph, batch, budget, opts, result, bar)
    finally:
        bar.close()
    if args.plot:
        _plot(graph, batch, result, args.plot, args.workspace)
    if args.out and not result.plan.changes_nothing():
        from .export import write_graphdef

        write_graphdef(rewrite(graph, result.plan).graph, args.out)
    if args.plan_out:
        save_plan(result.plan, args.plan_out)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if result.fits else 1
    print(f"{graph.source}  (batch size {batch}, {args.device} {format_bytes(budget)}, "
          f"{args.link}, safety {args.safety})")
    print(f"  {result.message}")
    print(f"  budget for the step  {format_bytes(result.budget_bytes)} "
          f"(after {format_bytes(result.persistent_bytes)} persistent)")
    if not result.plan.changes_nothing():
        print(f"  {result.strategy}: {result.knobs}, {result.evaluations} plans scored")
        print(f"  predicted step time  {result.baseline_step_seconds * 1e3:.1f} ms -> "
              f"{result.predicted_step_seconds * 1e3:.1f} ms "
              f"(+{result.predicted_overhead:.1%})")
    if args.max_batch:
        print(f"  largest batch: {report['max_batch_without']} without rewriting, "
              f"{report['max_batch_with']} with the tuned rewrite; no plan goes past "
              f"{report['max_batch_bound']} (op {report['max_batch_bound_op']!r} alone)")
    if args.compare_grappler:
        rows = [[name, "yes" if r["fits"] else "no", format_bytes(r["predicted_peak_bytes"]),
                 format_bytes(r["swap_bytes"]), f"{r['predicted_overhead']:.1%}", r["note"]]
                for name, r in report["comparison"].items()]
        print(_table(["strategy", "fits", "peak", "swapped", "overhead", "note"], rows))
    for label, path in (("plan", args.plan_out), ("graph", args.out), ("plot", args.plot)):
        if path and (label != "graph" or not result.plan.changes_nothing()):
            print(f"  wrote {label} {path}")
    return 0 if result.fits else 1


def _compare(graph: Any, batch: int, budget: int, opts: dict, ours: Any, bar: Any) -> dict:
    """Ours next to the TFLMS v2 search and TensorFlow's Grappler swapping heuristic."""
    from .tune import tune

    out = {ours.strategy: {**tune_report(ours), "note": "time-model search"}}
    bar(0.96, "TFLMS v2 search")
    tflms = tune(graph, batch, budget, strategy="tflms", **opts)
    out["tflms"] = {**tune_report(tflms), "note": "greedy, memory only"}
    bar(0.98, "Grappler swapping heuristic")
    from .grappler import grappler_baseline

    g = grappler_baseline(graph, batch, budget, safety=opts["safety"])
    out["grappler"] = {
        "fits": g.fits,
        "predicted_peak_bytes": g.predicted_peak_bytes,
        "swap_bytes": g.swap_bytes,
        "swapped_tensors": g.swapped_tensors,
        "predicted_overhead": g.predicted_overhead,
        "note": g.note,
    }
    return out


def _plot(graph: Any, batch: int, result: Any, path: str, workspace: str) -> None:
    """Device curves before and after, host curve and budget line, as plotly HTML."""
    import plotly.graph_objects as go

    from .evaluate import evaluate_plan
    from .plan import write_atomic

    ev = evaluate_plan(graph, result.plan, batch, workspace=workspace)
    before, after = ev.before, ev.after
    gib = 2**30
    fig = go.Figure()
    fig.add_scatter(y=[v / gib for v in before.device_curve], name="device, before",
                    line={"color": "#9aa5b1"})
    fig.add_scatter(y=[v / gib for v in after.device_curve], name="device, after",
                    line={"color": "#1f6feb"})
    fig.add_scatter(y=[v / gib for v in after.host_curve], name="host", line={"color": "#e3a008"})
    limit = (result.budget_bytes + result.persistent_bytes) / gib
    fig.add_hline(y=limit, line_dash="dash", line_color="#d1242f",
                  annotation_text=f"budget {limit:.2f} GiB")
    name = pathlib.Path(graph.source).name
    fig.update_layout(title=f"{name}, batch {batch}<br><sup>{result.message}</sup>",
                      xaxis_title="level (categorized topological order)", yaxis_title="GiB",
                      template="plotly_white")
    if path.endswith(".png"):
        try:
            data = fig.to_image(format="png")
        except (ValueError, RuntimeError, ImportError) as e:
            raise ConfigError(f"{path}: static image export is not available here ({e}); "
                              "write .html instead") from None
        write_atomic(path, data)
        return
    write_atomic(path, fig.to_html(include_plotlyjs=True, full_html=True))


def _cmd_samples(args: argparse.Namespace) -> int:
    rows = [[s["name"], s["file"], s.get("batch_size", ""), s.get("description", "")]
            for s in samples.samples()]
    print(_table(["name", "file", "batch", "description"], rows))
    print(f"\n  in {samples.sample_dir()}")
    return 0


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for k, r in enumerate(cells):
        lines.append("  " + "  ".join(
            c.ljust(w) if i == 0 or not c[:1].isdigit() else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip())
        if k == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


_COMMANDS = {
    "inspect": _cmd_inspect, "validate": _cmd_validate, "rewrite": _cmd_rewrite,
    "tune": _cmd_tune, "samples": _cmd_samples,
}

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
