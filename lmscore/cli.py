"""The ``lms`` command line: the same functions as the web app, for scripts and CI.

Every user error ends in one line on stderr (``lms: error: ...``) and exit status 2.
TensorFlow is imported only by the commands that run or export a graph.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from . import samples
from .errors import LmsError
from .units import format_bytes

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
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("validate", help="run on CPU under TensorFlow: measured vs simulated peak")
    p.add_argument("file")
    p.add_argument("--batch-size", type=_positive_int, default=None)
    p.add_argument("--function", default=None)
    p.add_argument("--steps", type=_positive_int, default=2, help="steps to run (last traced)")
    p.add_argument("--json", action="store_true")

    sub.add_parser("samples", help="list the bundled sample graphs")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lms`` console script; returns the exit status."""
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


def inspect_report(graph: Any, batch_size: int, top: int = 10) -> dict[str, Any]:
    """The ``lms inspect --json`` object for ``graph`` at ``batch_size``."""
    from .memory import hotspots, simulate
    from .order import CATEGORIES, order

    ordering = order(graph)
    sim = simulate(graph, batch_size)
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
            for h in hotspots(graph, sim, limit=top)
        ],
    }


def _cmd_inspect(args: argparse.Namespace) -> int:
    graph, batch = _load(args)
    report = inspect_report(graph, batch, args.top)
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

    graph, batch = _load(args)
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


_COMMANDS = {"inspect": _cmd_inspect, "validate": _cmd_validate, "samples": _cmd_samples}

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
