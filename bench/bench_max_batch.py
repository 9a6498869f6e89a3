"""`lms tune --max-batch`, whole process: one worker against two, side by side.

    python bench/bench_max_batch.py [--repeats 3] [--link nvlink2] [--quick]

For each step (the samples, and the 27k-op DenseNet unless --quick), runs
``lms tune FILE --budget 16GiB --link LINK --max-batch --workers W`` for W = 1 and 2 in
turns, and prints the median wall time of each, their ratio, the answers (which must be the
same) and whether the two-worker median is under the 30 s target.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from common import densenet  # noqa: E402

TARGET = 30.0


def run(path: str, link: str, workers: int) -> tuple[float, str]:
    """Wall seconds of one whole `lms tune --max-batch` process, and its answer line."""
    cmd = [sys.executable, "-m", "lmscore.cli", "tune", path, "--budget", "16GiB", "--link",
           link, "--max-batch", "--workers", str(workers)]
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t
    line = next((ln.strip() for ln in out.stdout.splitlines() if "largest batch" in ln),
                f"exit {out.returncode}: {out.stderr.strip()[-200:]}")
    return took, line.split("; no plan")[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--link", default="nvlink2")
    ap.add_argument("--quick", action="store_true", help="the samples only")
    args = ap.parse_args()
    steps = ["resnet50", "bert", "unet3d", "vgg16"]
    if not args.quick:
        steps.append(str(densenet()))
    print(f"lms tune FILE --budget 16GiB --link {args.link} --max-batch, whole process, "
          f"median of {args.repeats}")
    print(f"  {'step':16s} {'1 worker':>9s} {'2 workers':>9s} {'ratio':>6s}  answer")
    for step in steps:
        times: dict[int, list[float]] = {1: [], 2: []}
        answers: dict[int, set[str]] = {1: set(), 2: set()}
        for _ in range(args.repeats):
            for w in (1, 2):
                t, answer = run(step, args.link, w)
                times[w].append(t)
                answers[w].add(answer)
        one, two = (statistics.median(times[w]) for w in (1, 2))
        same = "same" if answers[1] == answers[2] and len(answers[1]) == 1 else "DIFFER"
        verdict = "PASS" if two < TARGET else "MISS"
        print(f"  {pathlib.Path(step).stem:16s} {one:8.1f}s {two:8.1f}s {two / one:6.2f}  "
              f"{same}: {sorted(answers[2])[0]}  (target < {TARGET:.0f} s: {verdict})")


if __name__ == "__main__":
    main()
