"""The ``lms`` command line: the same functions as the web app, for scripts and CI.

Every user error ends in one line on stderr (``lms: error: ...``) and exit status 2.
TensorFlow is imported only by the commands that run or export a graph.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import logging
import math
import os
import pathlib
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import samples
from .errors import ConfigError, LmsError
from .ir import feed_batches, fixed_batch, unvalidatable_op
from .memory import DEFAULT_SAFETY
from .units import SIZE_SYNTAX, format_bytes, parse_bytes

if TYPE_CHECKING:  # the CLI imports TensorFlow-free modules lazily, per command
    from .evaluate import PlanEvaluation

EXIT_USAGE = 2


#: An option's value that starts with a minus and a digit (``-8GB``, ``-1``) is a value, not
#: an option, so that it is refused for what it is; Python 3.13's argparse reads it so too.
_NEGATIVE_VALUE = re.compile(r"^-\.?\d")


def allow_negative_values(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make ``parser`` take ``--budget -8GB`` as a (negative) value, not as an unknown option."""
    parser._negative_number_matcher = _NEGATIVE_VALUE  # type: ignore[attr-defined]
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in the same one-line form, exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        allow_negative_values(self)

    def error(self, message: str) -> None:  # type: ignore[override]
        message = message.removeprefix("argument ")  # "--budget: ...", as lmscore's errors
        # the command's own help, or the top level's where no command was understood
        words = self.prog.split()
        help_of = "lms -h" if len(words) < 2 else f"lms {words[-1]} -h"
        self.exit(EXIT_USAGE, f"lms: error: {message} (see '{help_of}')\n")


def quiet_tensorflow(verbose: bool = False) -> None:
    """Decide whether TensorFlow's log lines and warnings reach stderr; before it is imported.

    They describe this machine (no GPU, CPU instructions, oneDNN), not the graph, and would
    bury the one-line answers of ``lms``. Unless ``verbose``: TensorFlow's C++ log lines are
    hidden (``TF_CPP_MIN_LOG_LEVEL=3``, unless the environment sets it already), and so are
    its Python logger's and absl's messages under errors and the Python warnings of
    TensorFlow and Keras. ``verbose`` shows all of them (``TF_CPP_MIN_LOG_LEVEL=0``).
    TensorFlow's failures still come back as exceptions, and ``lms`` prints those.
    """
    loggers = [logging.getLogger(name) for name in ("tensorflow", "absl")]
    modules = r"(tensorflow|keras|absl|tf_keras)(\.|$)"
    if verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        for logger in loggers:
            logger.setLevel(logging.NOTSET)
        warnings.filterwarnings("default", module=modules)
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=modules)


#: Commands that run TensorFlow in this process (the others import it at most to read a graph,
#: and lmscore.load hides its lines then).
_RUNS_TENSORFLOW = frozenset({"validate", "profile"})


def _start_tensorflow() -> None:
    """Import TensorFlow now, for a command that runs it, as :func:`quiet_tensorflow` decided.

    TensorFlow writes its first lines (oneDNN, CUDA drivers) before its log level applies:
    unless that level lets everything through (``--verbose``), the import runs with
    descriptor 2 sent to a scratch file.
    """
    if "tensorflow" in sys.modules or os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") in ("", "0"):
        return
    from .load import native_output_silenced

    try:
        with native_output_silenced():
            import tensorflow  # noqa: F401
    except ImportError:
        pass  # the command says so when it imports TensorFlow itself


def _size_arg(text: str) -> int:
    """An option's size (``8GB``, ``8GiB``, ``8G``); argparse puts the option's name first."""
    try:
        return parse_bytes(text)
    except LmsError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _preset_arg(kind: str) -> Callable[[str], str]:
    """The type of ``--device``/``--link``: a preset's name in any case, as spelled in the table."""
    from .presets import DEVICES, LINKS, preset

    table = DEVICES if kind == "device" else LINKS

    def parse(text: str) -> str:
        try:
            return preset(text, table, kind)
        except LmsError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = kind  # argparse names the type in some messages
    return parse


def _cores() -> int:
    """Cores this process may run on, at most 4 (each search worker holds the graph)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        n = os.cpu_count() or 1
    return max(1, min(4, n))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _graph_args(p: argparse.ArgumentParser) -> None:
    """The graph a command reads: FILE, --batch-size, --function."""
    p.add_argument("file", metavar="FILE",
                   help="a GraphDef (.pb binary or .pbtxt text), a SavedModel directory or .zip, "
                        "or the name of a bundled sample (see lms samples)")
    p.add_argument("--batch-size", type=_positive_int, default=None, metavar="N",
                   help="fills the graph's unknown batch dimension (default: a bundled "
                        "sample's batch size, else 1); a graph with a fixed batch keeps its own")
    p.add_argument("--function", default=None, metavar="NAME",
                   help="SavedModels only: the function or signature to load (default: "
                        "train_step if there is one, else the only signature)")


def _workspace_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workspace", choices=("accelerator", "cpu", "eigen", "onednn"), default="accelerator",
        help="kernel workspace the simulation counts: accelerator (default: none; cuDNN falls "
             "back to workspace-free algorithms, so predictions never depend on this machine), "
             "cpu (TensorFlow's kernels on this CPU, as lms validate measures), or one CPU "
             "kernel library by name")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lms`` (one sub-command per job)."""
    parser = _Parser(prog="lms", description=__doc__.splitlines()[0].replace("``", ""))
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("inspect", help="ops, levels, simulated peak and hotspots of a graph")
    _graph_args(p)
    p.add_argument("--top", type=_positive_int, default=10, metavar="N",
                   help="how many of the largest tensors alive at the peak to list (default 10)")
    _workspace_arg(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the summary")

    p = sub.add_parser("validate", help="run on CPU under TensorFlow: measured vs simulated peak")
    _graph_args(p)
    p.add_argument("--steps", type=_positive_int, default=None, metavar="N",
                   help="training steps to run, the last one traced (default 2; 3 with --plan)")
    p.add_argument("--plan", default=None, metavar="PLAN.json",
                   help="a plan (from --plan-out of rewrite or tune): run the original and the "
                        "rewritten step on the emulated accelerator (CPU:0 the device, CPU:1 "
                        "the host) and compare their memory and numerics")
    p.add_argument("--timeline", default=None, metavar="OUT.html|OUT.json",
                   help="with --plan: write the measured and simulated device curves of the "
                        "rewritten step on one time axis, what the device held at its "
                        "measured peak that the simulation had freed, and when each swap ran")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the summary")

    p = sub.add_parser("rewrite", help="swap tensors to host memory: a plan, a new graph")
    _graph_args(p)
    knobs = p.add_argument_group("knobs (TFLMS v2), or --plan")
    knobs.add_argument("--threshold", type=int, default=None, metavar="LEVELS",
                       help="consumers more than this many levels after a tensor's producer "
                            "read it back from host memory (default 5)")
    knobs.add_argument("--ahead", type=int, default=None, metavar="LEVELS",
                       help="start each swap-in about this many levels before its first "
                            "consumer (default 1)")
    knobs.add_argument("--groupby", type=int, default=None, metavar="LEVELS",
                       help="far consumers within this many levels of each other share one "
                            "swap-in (default 5)")
    knobs.add_argument("--sync-mode", type=int, default=None, metavar="0-3",
                       help="which swaps the step waits for: 0 none, 1 swap-outs, 2 swap-ins, "
                            "3 both (default 0)")
    knobs.add_argument("--serialize", default=None, metavar="LEVELS",
                       help="levels whose ops run one at a time, comma-separated: 3,7,12 "
                            "(default none)")
    knobs.add_argument("--serialize-min", default=None, type=_size_arg, metavar="SIZE",
                       help="also serialize every level whose simulated device memory is above "
                            f"this size: {SIZE_SYNTAX} (default: none)")
    knobs.add_argument("--include-scope", action="append", default=[], metavar="PREFIX",
                       help="swap only tensors whose producer's name starts with this "
                            "(repeatable; default: all)")
    knobs.add_argument("--exclude-scope", action="append", default=[], metavar="PREFIX",
                       help="never swap tensors whose producer's name starts with this "
                            "(repeatable)")
    knobs.add_argument("--include-type", action="append", default=[], metavar="OP",
                       help="swap only outputs of ops of this type, e.g. Conv2D (repeatable; "
                            "default: all)")
    knobs.add_argument("--exclude-type", action="append", default=[], metavar="OP",
                       help="never swap outputs of ops of this type (repeatable)")
    p.add_argument("--plan", default=None, metavar="PLAN.json",
                   help="apply this plan (from --plan-out) instead of the knobs")
    p.add_argument("--out", required=True, metavar="OUT.pb",
                   help="where to write the rewritten GraphDef (.pb binary or .pbtxt text)")
    p.add_argument("--plan-out", default=None, metavar="PLAN.json",
                   help="also write the applied plan (JSON)")
    p.add_argument("--device", default="/GPU:0",
                   help="device string of the accelerator in the written graph (default /GPU:0)")
    p.add_argument("--host", default="/CPU:0",
                   help="device string of the host memory swapped tensors go to "
                        "(default /CPU:0)")
    _workspace_arg(p)
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the summary")

    from .presets import DEVICES, LINKS

    p = sub.add_parser("tune", help="the fastest plan that fits a memory budget")
    _graph_args(p)
    p.add_argument("--budget", required=True, type=_size_arg, metavar="SIZE",
                   help=f"device memory: {SIZE_SYNTAX}; e.g. 16GiB (16G) or 15.5GB")
    p.add_argument("--device", default="V100", type=_preset_arg("device"),
                   help=f"accelerator preset, any case: {', '.join(DEVICES)}; its speed and "
                        "bandwidth price the plans (default V100)")
    p.add_argument("--link", default="pcie3", type=_preset_arg("link"),
                   help=f"host link preset, any case: {', '.join(LINKS)}; its bandwidth prices "
                        "the swaps (default pcie3)")
    p.add_argument("--profile", default=None, metavar="PROFILE.json",
                   help="price the plans with times measured on your device (lms profile) "
                        "instead of the device and link presets' speeds")
    p.add_argument("--safety", type=float, default=DEFAULT_SAFETY, metavar="FRACTION",
                   help="fraction of the device memory left after persistent memory that the "
                        "step may use, in (0, 1] (default 0.9)")
    p.add_argument("--host-memory", default=None, type=_size_arg, metavar="SIZE",
                   help="host memory the swapped tensors may hold at once: "
                        f"{SIZE_SYNTAX} (default: TensorFlow's pinned host allocator limit, "
                        "TF_GPU_HOST_MEM_LIMIT_IN_MB, else 128GiB)")
    p.add_argument("--strategy", choices=("hybrid", "swap", "recompute", "knobs", "tflms",
                                          "default"), default="hybrid",
                   help="hybrid (the default, also 'default'): swap or recompute per tensor and "
                        "keep the fastest of its plans; swap, recompute: per tensor, one kind "
                        "only; knobs: TFLMS's knobs scored by a time model; tflms: TFLMS v2's "
                        "own search, on memory only")
    _workspace_arg(p)
    p.add_argument("--max-batch", action="store_true",
                   help="also find the largest batch that fits without and with the tuned "
                        "rewrite, and the batch no plan can pass (tunes many times)")
    p.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                   help="with --max-batch: batches tried at once, each in a process of its "
                        "own (default: the cores this process may use, at most 4)")
    p.add_argument("--compare-grappler", action="store_true",
                   help="also run TensorFlow's Grappler swapping and TFLMS v2 search")
    p.add_argument("--plot", default=None, metavar="OUT.html",
                   help="write the device and host memory curves before and after, with the "
                        "budget (.html; .png where a static image exporter is installed)")
    p.add_argument("--out", default=None, metavar="OUT.pb",
                   help="write the rewritten GraphDef (.pb or .pbtxt); the step unchanged "
                        "when nothing needs swapping")
    p.add_argument("--plan-out", default=None, metavar="PLAN.json",
                   help="write the plan (JSON), for rewrite --plan and validate --plan")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the summary (exit status 1 when "
                        "nothing fits, as without --json)")

    p = sub.add_parser("profile", help="measure the step's op times and copy bandwidth on "
                                       "this machine: a time model for lms tune --profile")
    _graph_args(p)
    p.add_argument("--steps", type=_positive_int, default=None, metavar="N",
                   help="traced steps (per-op medians) and untraced steps (wall time), each "
                        "(default 10)")
    p.add_argument("--device", default=None, choices=("CPU", "GPU", "cpu", "gpu"),
                   help="the device to profile (default: a GPU if TensorFlow sees one, else "
                        "the CPU)")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="write the profile")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the summary")

    sub.add_parser("samples", help="list the bundled sample graphs")
    sub.add_parser("serve", help="the web app (lms serve [FILE] [--port 8050] ...; -h for more)",
                   add_help=False)
    # --verbose before the command (lms --verbose tune) or after it (lms tune --verbose)
    verbose_help = "show TensorFlow's log lines and warnings (hidden otherwise)"
    parser.add_argument("-v", "--verbose", action="store_true", help=verbose_help)
    for name, p in sub.choices.items():
        if name != "serve":  # the web app parses its own options, --verbose too
            p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                           help=verbose_help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lms`` console script; returns the exit status."""
    ends_process = argv is None  # the process is ``lms`` itself and ends with the command
    if ends_process:
        # What the command leaves alive (a loaded graph: an object or more per op) is
        # freed as the interpreter exits; moved out of the collector's sight first, it is
        # not walked by its final passes (a tenth of the time of ``lms inspect``).
        atexit.register(gc.freeze)
    argv = list(sys.argv[1:] if argv is None else argv)
    lead = 0  # global options before the command
    while argv[lead:lead + 1] in (["-v"], ["--verbose"]):
        lead += 1
    if argv[lead:lead + 1] == ["serve"]:  # the web app has its own options
        from lmsviz.app import main as serve

        return serve(argv[lead + 1:] + (["--verbose"] if lead else []))
    args = build_parser().parse_args(argv)
    args.notes = []  # choices made for the user, said once the command succeeded
    args.ends_process = ends_process
    quiet_tensorflow(args.verbose)
    try:
        status = _COMMANDS[args.command](args)
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
    for note in args.notes:  # after the output: an error stays the one line on stderr
        print(f"lms: {note}", file=sys.stderr)
    return status


def _batch_size(graph: Any, path: str, given: int | None, notes: list[str]) -> int:
    """The batch size to use; a note in ``notes`` when it is not the one given or asked for.

    A graph whose feeds all have a fixed batch keeps it; otherwise ``--batch-size``, else a
    bundled sample's batch size, else 1.
    """
    dims = feed_batches(graph)
    if dims and -1 not in dims and dims[0] > 0:  # (a feed of 0 rows has no batch to keep)
        if given is not None and given != dims[0]:
            notes.append(f"--batch-size {given} ignored: the graph's batch dimension is fixed "
                         f"at {dims[0]}")
        return dims[0]
    if given is not None:
        return given
    name = os.path.basename(path)
    for s in samples.samples():
        if name in (s["name"], s["file"]):
            return int(s["batch_size"])
    if -1 in dims:
        notes.append("batch size not given; using 1 (the graph's batch dimension is unknown)")
    return 1


def _load(args: argparse.Namespace) -> tuple[Any, int]:
    import zipfile

    from .load import load

    path = samples.find(args.file)
    if args.function is not None and path.is_file() and not zipfile.is_zipfile(path):
        raise ConfigError(f"--function applies to SavedModels (a directory or .zip) only; "
                          f"{path} is a GraphDef")
    graph = load(path, function=args.function)
    if args.command in _RUNS_TENSORFLOW:  # once the graph is known to be good
        _start_tensorflow()
    return graph, _batch_size(graph, str(path), args.batch_size, vars(args).setdefault(
        "notes", []))


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
    counts = {c: ordering.categories.count(c) for c in CATEGORIES}
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
        "swap_ops": sum(1 for op in graph.ops if op.attrs and op.attrs.get("_lms_role")),
        **_unknown_report(unknown),
        "at_most_size_tensors": list(sim.at_most_size_tensors),
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
    from .ir import gc_paused

    # Each step pauses the collector while it builds records (they hold no cycles); paused
    # throughout, it walks them once at the end, not after each step, and not at all when
    # the process ends with the command.
    with gc_paused():
        graph, batch = _load(args)
        report = inspect_report(graph, batch, args.top, args.workspace)
        if getattr(args, "ends_process", False):
            gc.freeze()
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
        print(_unknown_line(report["unknown_size_tensors"], report["unknown_size_examples"],
                            "the peak leaves them out"))
    if report["at_most_size_tensors"]:
        print(_at_most_line(report["at_most_size_tensors"],
                            "on real data the peak may be lower"))
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
    with _Progress("validating") as bar:
        result = validate(graph, batch, steps=args.steps, progress=bar)
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
            ["  in the session's order", format_bytes(report["replayed_peak_bytes"]),
             format_bytes(report["measured_peak_bytes"]), f"{report['replayed_ratio']:.3f}"],
        ],
    ))
    if (abs(report["replayed_ratio"] - report["ratio"]) > 0.005
            and abs(report["replayed_ratio"] - 1) <= 0.05):
        # (where the replay is off too, the order is not what the ratio is about)
        print("  TensorFlow's executor ran independent ops in another order than the "
              "simulator's; that order is drawn anew in each session")
    if result.unknown_size_tensors:
        print(_unknown_line(len(result.unknown_size_tensors), result.unknown_size_tensors,
                            "the simulation leaves them out"))
    if result.at_most_size_tensors:
        print(_at_most_line(result.at_most_size_tensors,
                            "on these data they may be smaller"
                            + (", which a ratio above 1 may show" if report["ratio"] > 1.05
                               else "")))
    if result.xla_functions:
        print(f"  XLA compiles {len(result.xla_functions)} function(s) of the step "
              f"({', '.join(result.xla_functions[:3])}): on the CPU their buffers are not in "
              "TensorFlow's allocation records, and XLA fuses what the simulation counts op "
              "by op, so the ratio is no check of them")
    print(f"  losses {', '.join(f'{v:.6g}' for v in report['losses'])}; "
          f"finite: {'yes' if report['finite'] else 'NO'}")
    if result.diverged:
        print(f"  the loss diverged on the synthetic data: {result.divergence}")
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
            serialize_min_bytes=args.serialize_min,
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
    with _Progress("validating the plan") as bar:
        v = validate_plan(graph, plan, batch, steps=args.steps or 3, progress=bar)
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
    recomputed = f", {v.recomputed_tensors} recomputed" if v.recomputed_tensors else ""
    print(f"{graph.source}  (batch size {batch}, {v.swapped_tensors} swapped tensors"
          f"{recomputed}, emulated accelerator: CPU:0 device, CPU:1 host)")
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
    if v.replayed_runs and all(v.rewritten_runs) and md["original"]:
        # the memory model alone: each run's executor order replayed in the simulation
        each = ", ".join(f"{r / m:.3f}" for r, m in zip(v.replayed_runs, v.rewritten_runs,
                                                         strict=True))
        print(f"  simulated in each run's own order / measured: {each} "
              f"(original {v.replayed_original_bytes / md['original']:.3f})")
    print(f"  measured saving / simulated saving: {saving}; "
          f"host simulated / measured: {v.host_ratio:.3f}")
    if v.timeline is not None and v.timeline.missed:
        top = ", ".join(f"{h.node} ({format_bytes(h.bytes)})" for h in v.timeline.missed[:3])
        print(f"  held at the measured peak but freed in the simulation: {top}")
    if args.timeline:
        print(f"  wrote {args.timeline}")
    _print_tuned_verdict(v)
    same = "bit-identical" if v.max_abs_diff == 0 else f"max |diff| {v.max_abs_diff:.3g}"
    print(f"  losses and variables after {len(v.losses['original'])} steps: {same}")
    if not math.isnan(v.max_abs_diff_grappler):
        own = ("" if math.isnan(v.grappler_own_diff) else
               f" (Grappler alone moves the original step by {v.grappler_own_diff:.3g})")
        print("  under default Grappler (as lmscore.swap runs it): max |diff| "
              f"{v.max_abs_diff_grappler:.3g}{own}")
    if v.diverged:
        print(f"  the loss diverged on the synthetic data: {v.divergence}")
    return 0


def _print_tuned_verdict(v: Any) -> None:
    """Whether the rewritten step measured within the device memory the plan was tuned for."""
    within = v.within_tuned_device
    if within is None:
        return
    peak = v.measured_device_peak_bytes["rewritten"]  # the largest of the runs
    device = v.tuned_device_bytes
    if within:
        print(f"  fits: every run within the {format_bytes(device)} device the plan was "
              f"tuned for (largest {format_bytes(peak)}, {peak / device:.3f})")
        return
    why = ""
    if v.tuned_workspace not in ("cpu", v.kernel_library):
        # the prediction for a GPU leaves out what this CPU's kernels allocate beside the
        # tensors (Eigen's im2col buffers of convolution gradients, for one)
        why = (f"; it was tuned with workspace {v.tuned_workspace!r}, which leaves out the "
               f"workspaces of this CPU's {v.kernel_library} kernels: tune with "
               "--workspace cpu to plan for the emulated accelerator")
    print(f"  DOES NOT FIT: measured {format_bytes(peak)}, {peak / device:.3f} of the "
          f"{format_bytes(device)} device the plan was tuned for{why}")


#: Plotly's page options for the HTML files lms writes: self-contained (plotly.js inlined,
#: nothing fetched) and without the buttons that send a chart to an online service. Only
#: the options this plotly knows: it warns on the user's terminal about any other.
_HTML_CONFIG = {"displaylogo": False, "showSendToCloud": False}


def _write_timeline(path: str, t: Any, title: str) -> None:
    from .plan import write_atomic
    from .timeline import figure

    if path.endswith(".json"):
        write_atomic(path, json.dumps(t.as_dict(), indent=1))
    else:
        write_atomic(path, figure(t, title).to_html(
            include_plotlyjs=True, full_html=True, config=_HTML_CONFIG))


class _Progress:
    """A progress bar on stderr while it is a terminal; silent otherwise (pipes, logs, CI).

    Called as ``progress(fraction, message)``, the interface of :func:`lmscore.tune.tune`
    and :func:`lmscore.validate.validate`; a fraction of None means "not known": the bar
    pulses. The elapsed time and a spinner show that a long step is still running. Use it
    as a context manager, or call :meth:`close`: the bar disappears, the output stays.

    Parameters
    ----------
    title : str
        What the command is doing ("tuning").
    stream : file, optional
        Where to draw (default ``sys.stderr``), if it is a terminal.
    """

    def __init__(self, title: str = "", stream: Any = None) -> None:
        stream = sys.stderr if stream is None else stream
        self._bar: Any = None
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):  # a closed or odd stream
            tty = False
        if not tty:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self._bar = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
            TaskProgressColumn(), TimeElapsedColumn(), TextColumn("{task.fields[message]}"),
            console=Console(file=stream), transient=True,
            redirect_stdout=False,  # stdout may be a pipe (--json): never move it to stderr
        )
        self._task = self._bar.add_task(title, total=1.0, message="")
        self._bar.start()

    def __call__(self, fraction: float | None, message: str) -> None:
        if self._bar is None:
            return
        if fraction is None:  # update() reads total=None as "unchanged"
            next(t for t in self._bar.tasks if t.id == self._task).total = None
            self._bar.update(self._task, message=message)
        else:
            self._bar.update(self._task, total=1.0, completed=min(max(fraction, 0.0), 1.0),
                             message=message)

    def span(self, start: float, stop: float, prefix: str = "") -> Callable[[float, str], None]:
        """``progress(fraction, message)`` of one part of the work, drawn from start to stop."""
        return lambda f, m: self(start + (stop - start) * f, prefix + m)

    def close(self) -> None:
        """Take the bar off the terminal."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
        "host_limit_bytes": result.host_limit_bytes,
        "limited_by": result.limited_by,
        "strategy": result.strategy,
        "knobs": result.knobs,
        "evaluations": result.evaluations,
        "min_peak_bytes": result.min_peak_bytes,
        "bound_op": result.bound_op,
        "message": result.message,
        **_unknown_report(result.unknown_size_tensors),
    }


def _unknown_report(unknown: Sequence[str]) -> dict[str, Any]:
    """The JSON keys of the tensors a simulation counted as 0 bytes: a count, examples."""
    return {"unknown_size_tensors": len(unknown), "unknown_size_examples": list(unknown[:10])}


def _unknown_line(count: int, examples: Sequence[str], consequence: str) -> str:
    """The line that names the tensors of unknown size, and what they leave out."""
    return (f"  {count} tensor(s) of unknown size counted as 0 bytes "
            f"({', '.join(examples[:3])}): {consequence}")


def _at_most_line(tensors: Sequence[str], consequence: str) -> str:
    """The line that names the tensors whose size the data's values decide."""
    return (f"  {len(tensors)} tensor(s) whose size the data decide counted at their most "
            f"({', '.join(tensors[:3])}): {consequence}")


def _cmd_tune(args: argparse.Namespace) -> int:
    from .plan import save_plan
    from .rewrite import rewrite
    from .tune import bound_batch, bound_words, max_batch, tune

    budget = args.budget
    graph, batch = _load(args)
    source = samples.find(args.file).resolve()
    for dest in filter(None, (args.out, args.plan_out, args.plot)):
        if pathlib.Path(dest).resolve() == source:
            raise ConfigError(f"{dest}: refusing to overwrite the input graph")
    if args.max_batch and (fixed := fixed_batch(graph)) is not None:
        # every batch would be the same step: the answer would be the search's limit
        raise ConfigError(f"--max-batch: {args.file}: the graph's batch dimension is fixed at "
                          f"{fixed}; trace the step with an unknown batch (None) to search it")
    opts = {"device": args.device, "link": args.link, "safety": args.safety,
            "workspace": args.workspace, "host_memory": args.host_memory}
    if args.profile:
        from .profile import load_profile

        opts["profile"] = load_profile(args.profile)
    bar = _Progress("tuning")
    try:
        more = args.max_batch or args.compare_grappler
        result = tune(graph, batch, budget, strategy=args.strategy,
                      progress=bar.span(0.0, 0.8 if more else 1.0), **opts)
        report = tune_report(result)
        report["batch_size"] = batch
        if args.max_batch:  # how many batches it tries is not known: the bar pulses
            tried: dict = {}
            bar(None, "the batch no plan can pass")
            workers = args.workers or _cores()
            report["max_batch_bound"], report["max_batch_bound_op"] = bound_batch(
                graph, budget, device=args.device, safety=args.safety,
                workspace=args.workspace)
            without, with_rw = max_batch(graph, budget, strategy=args.strategy,
                                         progress=lambda f, m: bar(None, f"largest batch: {m}"),
                                         tuned=tried, bound=report["max_batch_bound"],
                                         workers=workers, **opts)
            report["max_batch_without"] = without
            report["max_batch_with"] = with_rw
            # what stops the next batch: the device, or the host memory the swaps need
            nxt = tried.get(with_rw + 1) or (
                None if with_rw >= report["max_batch_bound"]
                else tune(graph, with_rw + 1, budget, strategy=args.strategy, **opts))
            report["max_batch_limited_by"] = nxt.limited_by if nxt else "bound"
        if args.compare_grappler:
            report["comparison"] = _compare(graph, batch, budget, opts, result,
                                            bar.span(0.8, 1.0))
    finally:
        bar.close()
    if args.plot:
        _plot(graph, batch, result, args.plot, args.workspace)
    # the step unchanged when nothing needs swapping; when no plan fits, nothing is written
    # (a file left from an earlier run that did fit stays as it was)
    if args.out and result.fits:
        from .export import write_graphdef

        write_graphdef(rewrite(graph, result.plan).graph, args.out)
    if args.plan_out and result.fits:
        save_plan(result.plan, args.plan_out)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if result.fits else 1
    print(f"{graph.source}  (batch size {batch}, {args.device} {format_bytes(budget)}, "
          f"{args.link}, safety {args.safety})")
    print(f"  {result.message}")
    if result.budget_bytes > 0:
        print(f"  budget for the step  {format_bytes(result.budget_bytes)} "
              f"(after {format_bytes(result.persistent_bytes)} persistent)")
    else:
        print(f"  budget for the step  none: the {format_bytes(result.persistent_bytes)} of "
              "persistent memory (variables, constants) alone exceed the usable device")
    if report["unknown_size_tensors"]:
        # a plan that fits here may not fit there: those tensors are not in the sums
        odd = unvalidatable_op(graph)  # validation refuses to run it: not the advice
        print(_unknown_line(report["unknown_size_tensors"], report["unknown_size_examples"],
                            "the plan's peak leaves them out; run `lms validate` with the "
                            "plan to measure it" if not odd else
                            f"the plan's peak leaves them out, and `lms validate` cannot "
                            f"measure this step (it has a {odd})"))
    if not result.plan.changes_nothing():
        print(f"  {result.strategy}: {result.knobs}, {result.evaluations} plans scored")
        print(f"  predicted step time  {result.baseline_step_seconds * 1e3:.1f} ms -> "
              f"{result.predicted_step_seconds * 1e3:.1f} ms "
              f"(+{result.predicted_overhead:.1%})")
    if args.max_batch:
        print(f"  largest batch: {report['max_batch_without']} without rewriting, "
              f"{report['max_batch_with']} with the tuned rewrite; no plan goes past "
              f"{report['max_batch_bound']} ({bound_words(report['max_batch_bound_op'])})")
        if report["max_batch_limited_by"] == "host":
            print(f"  host memory stops batch {report['max_batch_with'] + 1}: its plan fits "
                  "the device but not the host memory limit (--host-memory)")
    if args.compare_grappler:
        rows = [[name, "yes" if r["fits"] else "no", format_bytes(r["predicted_peak_bytes"]),
                 format_bytes(r["swap_bytes"]), f"{r['predicted_overhead']:.1%}", r["note"]]
                for name, r in report["comparison"].items()]
        print(_table(["strategy", "fits", "peak", "swapped", "overhead", "note"], rows))
    unchanged = ("" if not result.plan.changes_nothing() else
                 " (the step unchanged: it fits without swapping)")
    for label, path in (("plan", args.plan_out), ("graph", args.out), ("plot", args.plot)):
        if path and (result.fits or label == "plot"):
            print(f"  wrote {label} {path}{unchanged if label == 'graph' else ''}")
        elif path:
            print(f"  wrote no {label}: no plan fits ({path} left as it was)")
    return 0 if result.fits else 1


def _compare(graph: Any, batch: int, budget: int, opts: dict, ours: Any, bar: Any) -> dict:
    """Ours next to the TFLMS v2 search and TensorFlow's Grappler swapping heuristic."""
    from .tune import tune

    out = {ours.strategy: {**tune_report(ours), "note": "time-model search"}}
    bar(0.0, "TFLMS v2 search")
    tflms = tune(graph, batch, budget, strategy="tflms", **opts)
    out["tflms"] = {**tune_report(tflms), "note": "greedy, memory only"}
    bar(0.5, "Grappler swapping heuristic")
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
    write_atomic(path, fig.to_html(include_plotlyjs=True, full_html=True, config=_HTML_CONFIG))


def _cmd_profile(args: argparse.Namespace) -> int:
    from .profile import DEFAULT_STEPS, profile, save_profile

    graph, batch = _load(args)
    out = pathlib.Path(args.out)
    if out.resolve() == samples.find(args.file).resolve():
        raise ConfigError(f"{args.out}: refusing to overwrite the input graph")
    if out.is_dir():
        raise ConfigError(f"{args.out}: is a directory")
    bar = _Progress()
    try:
        prof = profile(graph, batch, device=args.device, steps=args.steps or DEFAULT_STEPS,
                       progress=bar)
    finally:
        bar.close()
    save_profile(prof, out)
    modelled = prof.modelled_step_seconds
    report = {
        "device": prof.device, "batch_size": batch, "kernel_library": prof.kernel_library,
        "tensorflow_version": prof.tensorflow_version, "ops": len(prof.op_seconds),
        "step_seconds": prof.step_seconds, "modelled_step_seconds": modelled,
        "ratio": modelled / prof.step_seconds, "dispatch_seconds": prof.dispatch_seconds,
        "host_to_device_bandwidth": prof.host_to_device_bandwidth,
        "device_to_host_bandwidth": prof.device_to_host_bandwidth, "out": str(out),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{graph.source}  (batch size {batch}, {prof.steps} traced and {prof.steps} "
          f"untraced steps)")
    print(f"  device           {prof.device} ({prof.kernel_library or 'unknown'} kernels, "
          f"TensorFlow {prof.tensorflow_version}), {len(prof.op_seconds)} ops timed")
    print(f"  step, measured   {prof.step_seconds * 1e3:.2f} ms (median, one op at a time)")
    print(f"  step, modelled   {modelled * 1e3:.2f} ms (the ops' times in sequence), ratio "
          f"{report['ratio']:.3f}")
    print(f"  copies           to the device {prof.host_to_device_bandwidth / 1e9:.2f} GB/s, "
          f"to the host {prof.device_to_host_bandwidth / 1e9:.2f} GB/s")
    print(f"  wrote {out}")
    return 0


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
    "tune": _cmd_tune, "profile": _cmd_profile, "samples": _cmd_samples,
}

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
