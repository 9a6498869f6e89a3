"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import gc
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent


def median_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time of ``fn`` over ``repeats`` calls (collected first), and its result."""
    times, out = [], None
    for _ in range(repeats):
        gc.collect()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def densenet() -> pathlib.Path:
    """The 27k-op DenseNet training step, generated on first use (not committed)."""
    path = ROOT / "bench" / "out" / "densenet121.pb"
    if not path.exists():
        subprocess.run([sys.executable, str(ROOT / "sample_graphs" / "generate.py"),
                        "--densenet-27k", str(path)], check=True)
    return path
