"""The measured-against-simulated timeline of a rewritten step (``lms validate --timeline``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from types import SimpleNamespace as NS

import pytest
from graphs import t

from lmscore.ir import Graph, Op
from lmscore.memory import simulate
from lmscore.plan import Plan, Swap, SwapIn, fingerprint
from lmscore.rewrite import rewrite
from lmscore.timeline import compare


def chain() -> Graph:
    """x -> a (4 KB) -> b -> c (4 KB) -> d(c, a): a is read early and late."""
    big, small = t("float", 1, 1000), t("float", 1, 8)
    return Graph((
        Op("x", "Placeholder", outputs=small),
        Op("a", "Exp", inputs=("x:0",), outputs=big),
        Op("b", "Sum", inputs=("a:0",), outputs=small),
        Op("c", "Conv2D", inputs=("b:0",), outputs=big),
        Op("d", "Conv2D", inputs=("c:0", "a:0"), outputs=small),
    ), "chain")


def rec(node, nbytes, start, end, device="CPU:0"):
    return NS(node=node, device=device, bytes=nbytes, alloc_us=start, free_us=end)


def test_buffers_held_at_the_measured_peak_that_the_simulation_freed():
    g = chain()
    plan = Plan(fingerprint(g), swaps=(Swap("a:0", (SwapIn(("d",), "c"),)),))
    rw = rewrite(g, plan).graph
    sim = simulate(rw, 1)
    # The run held a's device buffer until the end (a swap-out that never released it),
    # while the simulation freed it after b and the swap-out.
    m = NS(allocations=[
        rec("a", 4000, 10, 90),
        rec("lms/swapout_a_0", 4000, 15, 80, device="CPU:1"),
        rec("b", 32, 20, 40),
        rec("c", 4000, 40, 95),
        rec("lms/swapin_a_0_0", 4000, 60, 95),
        rec("d", 32, 91, None),
    ])
    tl = compare(rw, sim, m)
    # one event a record, allocations first within a microsecond (as measure's peaks)
    assert tl.measured == ((10, 4000), (20, 4032), (40, 8032), (40, 8000), (60, 12000),
                           (90, 8000), (91, 8032), (95, 4032), (95, 32))
    assert tl.peak_us == 60 and tl.peak_op == "lms/swapin_a_0_0"
    assert tl.measured_peak_bytes == 12000
    assert tl.simulated_peak_bytes == sim.peak_bytes - sim.persistent_bytes
    states = {h.node: h.simulated for h in tl.held}
    assert states == {"a": "freed", "c": "alive", "lms/swapin_a_0_0": "alive"}
    assert [h.node for h in tl.missed] == ["a"]
    runs = {s.node: (s.role, s.measured_us) for s in tl.swaps}
    assert runs == {"lms/swapout_a_0": ("swap_out", 15), "lms/swapin_a_0_0": ("swap_in", 60)}
    # the simulated curve is on the same axis: never decreasing in time, ends where ops ran
    times = [x for x, _ in tl.simulated]
    assert times == sorted(times) and times[0] == 10 and times[-1] == 91
    assert json.loads(json.dumps(tl.as_dict()))["missed"][0]["node"] == "a"


@pytest.mark.tf
def test_cli_writes_the_timeline_of_a_plan(tmp_path):
    plan = tmp_path / "plan.json"
    out = tmp_path / "t.json"
    html = tmp_path / "t.html"
    run = [sys.executable, "-m", "lmscore.cli"]
    subprocess.run([*run, "rewrite", "mlp", "--threshold", "2", "--out", str(tmp_path / "r.pb"),
                    "--plan-out", str(plan)], check=True, capture_output=True)
    r = subprocess.run([*run, "validate", "mlp", "--plan", str(plan), "--timeline", str(out),
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert set(doc) >= {"measured", "simulated", "peak_us", "held", "missed", "swaps"}
    assert doc["swaps"] and all(s["measured_us"] is not None for s in doc["swaps"])
    report = json.loads(r.stdout)
    assert report["timeline"]["peak_us"] == doc["peak_us"]
    # each run replayed in its own executor order (how close: tests/test_zoo_fits.py, on
    # pinned plans; this knob plan leaves the emulation's two threads free to run two
    # device kernels at once, which no sequential order replays)
    assert len(report["replayed_runs"]) == len(report["rewritten_runs"]) == 3
    assert all(b > 0 for b in report["replayed_runs"]) and report["replayed_original_bytes"] > 0
    r = subprocess.run([*run, "validate", "mlp", "--plan", str(plan), "--timeline", str(html)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "wrote" in r.stdout
    each = re.search(r"simulated in each run's own order / measured: ([\d., ]+) \(original "
                     r"([\d.]+)\)", r.stdout)
    assert each, r.stdout
    assert len(each[1].split(", ")) == 3, r.stdout
    # only page options this plotly knows: it warns on the terminal about any other
    assert "Unrecognized config options" not in r.stderr, r.stderr
    page = html.read_text()
    # self-contained: plotly.js inlined, no script fetched from anywhere
    assert "measured" in page and not re.search(r"<script[^>]*src=", page)


@pytest.mark.parametrize("args, message", [
    (["--timeline", "t.json"], "--timeline needs --plan"),
    (["--plan", "p.json", "--timeline", "t.txt"], "writes .html or .json"),
])
def test_timeline_bad_options_are_one_line(tmp_path, args, message):
    r = subprocess.run([sys.executable, "-m", "lmscore.cli", "validate", "mlp", *args],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
