"""Concurrent sessions against the web app on 127.0.0.1: latency, errors, memory, leaks.

Starts ``python -m lmsviz`` in a subprocess (its own data directory), then runs rounds
of 1, 2 and 10 concurrent sessions (threads speaking Dash's HTTP protocol, as a browser
tab does; see ``tests/dash_client.py``). Session ``k`` picks its own sample graph, batch
size and threshold knob, applies the knobs, toggles a hotspot and selects a level; at the
end each session's stores are checked against what its own graph, batch and knobs give
(no leaks between sessions). Printed per round: wall time, requests, per-request latency
median and 95th percentile, refusals ("server busy"), HTTP errors, leaks, the server's
peak resident memory so far. ``--big N`` then uploads an N-op chain GraphDef (from
``bench_inspect``) to time and measure the largest graph the server accepts.

    python bench/bench_sessions.py [--rounds 1,2,10] [--graphs resnet50,bert,...] [--big 250000]
"""

from __future__ import annotations

import argparse
import base64
import pathlib
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the checkout, not an installed copy

from dash_client import HttpTransport, Server, Session  # noqa: E402

import lmscore  # noqa: E402
from lmscore import samples  # noqa: E402
from lmscore.plan import check_plan, plan_from_json, plan_from_params  # noqa: E402
from lmsviz.callbacks import SWAP_OFF  # noqa: E402

DEFAULT_GRAPHS = "resnet50,bert,unet3d,vgg16,mlp,lstm"


def session(url: str, k: int, graphs: list[str], out: dict[int, Any]) -> None:
    """Session ``k``: graph ``graphs[k % n]``, batch and threshold of its own."""
    name = graphs[k % len(graphs)]
    entry = next(s for s in samples.samples() if s["name"] == name)
    batch = max(1, int(entry.get("batch_size", 1)) - k % 2)
    threshold = 2 + k % 4
    r: dict[str, Any] = {"name": name, "batch": batch, "threshold": threshold, "errors": [],
                         "busy": 0}
    try:
        s = Session(HttpTransport(url, timeout=600))

        def act(component: str, prop: str, value: Any) -> None:
            status, _ = s.act(component, prop, value)
            if status != 200:
                r["errors"].append(f"{component}: HTTP {status}")
            elif "server is busy" in s.message():
                r["busy"] += 1

        act("graph-picker", "value", f"sample:{name}")
        act("batch", "value", batch)
        s.props["knob-threshold"]["value"] = threshold
        act("knobs-apply", "n_clicks", 1)
        r["knob_plan"] = (s.store("st-plan") or {}).get("json")
        free = [row["id"] for row in s.props.get("hotspots", {}).get("data") or []
                if row["swap"] == SWAP_OFF]
        r["toggled"] = free[:1]
        if free:
            act("hotspots", "active_cell",
                {"row": 0, "column": 0, "column_id": "swap", "row_id": free[0]})
            if not s.message().startswith(f"{free[0]} swapped"):
                r["errors"].append(f"toggle refused: {s.message()}")
        act("studio", "clickData", {"points": [{"curveNumber": 1, "x": 3, "y": 0}]})
        r["plan"] = (s.store("st-plan") or {}).get("json")
        r["graph"] = s.store("st-graph")
        r["summary"] = s.text("sum-graph")
        r["latencies"] = [t for _, t in s.latencies]
    except Exception as e:  # noqa: BLE001 - counted as an error of the round
        r["errors"].append(f"{type(e).__name__}: {e}")
        r.setdefault("latencies", [])
    out[k] = r


def leaks(results: dict[int, Any], graphs: dict[str, lmscore.Graph]) -> list[str]:
    """Sessions whose stores are not what their own graph, batch and knobs give."""
    bad = []
    for k, r in sorted(results.items()):
        if r["errors"] or r["busy"] or not r.get("knob_plan"):
            continue  # counted elsewhere
        g = graphs[r["name"]]
        expected = plan_from_params(g, r["batch"], threshold=r["threshold"], ahead=1,
                                    groupby=5, sync_mode=0)
        plan = plan_from_json(r["plan"])
        problems = []
        if r["graph"]["name"] != f"{r['name']}.pb" or not r["summary"].startswith(
                f"{r['name']}.pb") or f"batch {r['batch']}" not in r["summary"]:
            problems.append(f"shows {r['summary']!r}")
        if plan_from_json(r["knob_plan"]) != expected:
            problems.append("knob plan differs")
        try:
            check_plan(g, plan)
        except lmscore.LmsError as e:
            problems.append(f"plan does not fit its graph: {e}")
        if set(plan.swapped()) != set(expected.swapped()) | set(r["toggled"]):
            problems.append("swaps differ")
        if problems:
            bad.append(f"session {k} ({r['name']}): " + "; ".join(problems))
    return bad


def one_round(server: Server, n: int, names: list[str], graphs: dict[str, lmscore.Graph]
              ) -> dict[str, Any]:
    results: dict[int, Any] = {}
    threads = [threading.Thread(target=session, args=(server.url, k, names, results))
               for k in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(x for r in results.values() for x in r["latencies"])
    p95 = lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else float("nan")
    return {
        "n": n, "wall": wall, "requests": len(lat),
        "median": statistics.median(lat) if lat else float("nan"), "p95": p95,
        "max": lat[-1] if lat else float("nan"),
        "busy": sum(r["busy"] for r in results.values()),
        "errors": [e for r in results.values() for e in r["errors"]],
        "leaks": leaks(results, graphs), "rss": server.rss_peak_kib(),
        "alive": server.alive(),
    }


def big_upload(server: Server, n_ops: int) -> None:
    from bench_inspect import chain_file

    path = chain_file(n_ops)
    data = path.read_bytes()
    s = Session(HttpTransport(server.url, timeout=1800))
    gate = {"filename": path.name, "size": len(data), "nonce": 1,
            "contents": "data:application/octet-stream;base64," + base64.b64encode(data).decode()}
    t0 = time.perf_counter()
    status, _ = s.act("graph-gate", "data", gate)
    took = time.perf_counter() - t0
    print(f"\nupload of {path.name} ({n_ops:,} ops, {len(data) / 1e6:.1f} MB): HTTP {status} "
          f"in {took:.1f} s (upload, parse, order, simulate, draw); message: {s.message()!r}; "
          f"server peak RSS {server.rss_peak_kib() / 2**20:.2f} GiB; alive {server.alive()}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", default="1,2,10", help="concurrent sessions per round (1,2,10)")
    p.add_argument("--graphs", default=DEFAULT_GRAPHS, help=f"samples ({DEFAULT_GRAPHS})")
    p.add_argument("--max-jobs", type=int, default=2, help="the server's --max-jobs (2)")
    p.add_argument("--big", type=int, default=0, help="then upload an N-op chain (0: no)")
    args = p.parse_args(argv)
    names = args.graphs.split(",")
    graphs = {n: lmscore.load(samples.sample_dir() / f"{n}.pb") for n in names}
    with tempfile.TemporaryDirectory(prefix="lms-bench-") as tmp:
        server = Server(pathlib.Path(tmp), "mlp", "--max-jobs", str(args.max_jobs),
                        "--upload-cap", "1GiB").start()
        try:
            print(f"server: 127.0.0.1:{server.port}, --max-jobs {args.max_jobs}; "
                  f"graphs {', '.join(names)}; startup RSS {server.rss_peak_kib() / 1024:.0f} "
                  "MiB")
            print(f"{'sessions':>8} {'wall s':>7} {'requests':>8} {'median s':>8} "
                  f"{'p95 s':>6} {'max s':>6} {'busy':>4} {'errors':>6} {'leaks':>5} "
                  f"{'peak RSS':>9} alive")
            for n in (int(x) for x in args.rounds.split(",")):
                r = one_round(server, n, names, graphs)
                print(f"{r['n']:>8} {r['wall']:>7.1f} {r['requests']:>8} {r['median']:>8.3f} "
                      f"{r['p95']:>6.2f} {r['max']:>6.2f} {r['busy']:>4} {len(r['errors']):>6} "
                      f"{len(r['leaks']):>5} {r['rss'] / 2**20:>7.2f}Gi {r['alive']}",
                      flush=True)
                for line in r["errors"][:5] + r["leaks"][:5]:
                    print(f"    {line}")
            if args.big:
                big_upload(server, args.big)
            tracebacks = server.log().count("Traceback")
            print(f"tracebacks in the server log: {tracebacks}")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
