"""Two versions of the web app side by side: knob changes alternated between them.

    python bench/bench_ui_pair.py OLD_CHECKOUT NEW_CHECKOUT            # ResNet-50, 12 pairs
    python bench/bench_ui_pair.py OLD NEW --pairs 20 --graph densenet  # the 28k-op DenseNet

On a host whose speed drifts (one knob change of the same code measured 246-505 ms), two
runs of ``bench_ui.py`` differ more than two versions of the code do. Here both versions
run at once, each in its own server process (``python -m lmsviz GRAPH`` from its checkout,
``LMS_TIMING`` set) and its own tab of one headless Chromium; the same knob changes are
applied to A and B in turn (A B, B A, A B, ...), so a drift of the host touches both.
Printed: per version the medians of the visible time (from the click as the page receives
it to the redrawn figure), of the server's time (its requests' waits, Resource Timing) and
of each logged stage; then the median of the pair-by-pair ratios B / A.

A checkout is any directory holding ``lmscore`` and ``lmsviz`` (``git worktree add /tmp/old
REV`` makes one of an earlier revision).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import bench_ui as ui  # (bench/ is the script's own directory, first on sys.path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=pathlib.Path, help="checkout A (the baseline)")
    ap.add_argument("b", type=pathlib.Path, help="checkout B")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--graph", default="resnet50",
                    help="a bundled sample, or 'densenet' for bench/out/densenet121.pb")
    args = ap.parse_args()
    for c in (args.a, args.b):
        if not (c / "lmscore").is_dir() or not (c / "lmsviz").is_dir():
            raise SystemExit(f"{c}: not a checkout (no lmscore/ and lmsviz/ in it)")
    graph = str(ui.DENSENET) if args.graph == "densenet" else args.graph
    if args.graph == "densenet" and not ui.DENSENET.exists():
        raise SystemExit(f"{ui.DENSENET} is missing: run bench/bench_ui.py once to make it")
    data = [pathlib.Path(tempfile.mkdtemp(prefix="lms-pair-data-")) for _ in range(2)]
    servers = [ui.start(graph, None, d, c.resolve())
               for d, c in zip(data, (args.a, args.b), strict=True)]
    logs = [ui.ServerLog(d / "server.log") for d in data]
    driver = ui.browser()
    visible: list[list[float]] = [[], []]
    server: list[list[float]] = [[], []]
    stages: list[list[dict[str, float]]] = [[], []]
    try:
        tabs = []
        for k, (_, url) in enumerate(servers):
            if k:
                driver.switch_to.new_window("tab")
            driver.get(url)
            ui.poll(driver, ui.CURVE_DRAWN, ui.figures.T_BEFORE, timeout=300)
            tabs.append(driver.current_window_handle)
        for n in range(args.pairs + 1):  # the first pair warms both up and is not counted
            for k in ((0, 1) if n % 2 == 0 else (1, 0)):
                driver.switch_to.window(tabs[k])
                time.sleep(0.5)
                logs[k].take()
                s, v, _ = ui.knob_change(driver, ui.THRESHOLDS[n % len(ui.THRESHOLDS)])
                time.sleep(0.5)  # the last request's log line
                taken = logs[k].take()
                if n:
                    visible[k].append(v)
                    server[k].append(s)
                    stages[k].append(taken)
    finally:
        driver.quit()
        for proc, _ in servers:
            proc.terminate()
            proc.wait(timeout=20)
    print(f"{args.graph}: knob changes, {args.pairs} pairs alternated (A B, B A, ...)")
    for k, c in enumerate((args.a, args.b)):
        print(f"  {'AB'[k]} {c}")
        print(f"    visible {statistics.median(visible[k]):6.0f} ms  server "
              f"{statistics.median(server[k]):6.0f} ms  (visible: "
              + ", ".join(f"{x:.0f}" for x in visible[k]) + ")")
        print(f"    server stages: {ui.stages_line(stages[k])}")
    ratio_v = statistics.median(b / a for a, b in zip(*visible, strict=True))
    ratio_s = statistics.median(b / a for a, b in zip(*server, strict=True))
    print(f"  B / A, median of the pairs' ratios: visible {ratio_v:.3f}, server {ratio_s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
