#!/usr/bin/env python
"""Benchmark of ``lms inspect``: parse, load, order, resolve+simulate and full inspect.

Run from anywhere (the checkout is put on ``sys.path``)::

    python bench/bench_inspect.py              # full run: samples, DenseNet, chains to 1M
    python bench/bench_inspect.py --quick      # 2 repeats, chains up to 100k ops
    python bench/bench_inspect.py --profile    # cProfile of load+inspect (27k graph, largest chain)

Every figure is the median of ``--repeats`` runs (``gc.collect()`` before each timed step).
A case stops repeating early when one more repeat would take it past ``--budget`` seconds
(at least one repeat always runs); the ``n`` column shows how many repeats the median is over.

Per repeat, on one file:

* ``parse``    ``graph_pb2.GraphDef().ParseFromString(data)`` (bytes already in memory)
* ``load``     ``lmscore.load(path)`` (read, parse, build the IR)
* ``inspect``  ``lmscore.cli.inspect_report(graph, batch)`` on the graph just loaded
* ``order``    ``lmscore.order`` on a fresh copy of the graph (``graph.replace(graph.ops)``,
  so nothing cached on the graph object is reused; includes building the adjacency)
* ``res+sim``  ``resolve`` then ``simulate(..., sizes=...)`` on that copy, after ``order``
  (as inside ``inspect``)
* ``naive``    the naive single-pass simulation (``bench/naive_inspect.py``'s ``simulate``)
  on the same bytes, in the same process: the yardstick for the growth per op

"Linear up to 1M ops" is judged against that yardstick. The naive simulation is linear by
construction (one parse, one Kahn pass, one liveness pass), yet its time per op grows from
10k to 1M ops as hash tables and records outgrow the CPU's caches; ``lms inspect`` must
grow no faster than it (within ``TARGET_GROWTH_VS_NAIVE``). The bare growth is printed too.

Whole processes run with ``lmscore`` compiled to bytecode once (in ``bench/out/pycache``),
as an installed package has it. ``ratio`` is (load + inspect) / parse. Generated files go
to ``bench/out/`` (not committed): ``densenet121.pb`` is made by
``sample_graphs/generate.py --densenet-27k`` when missing and ``chain_N.pb`` by this script.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tensorboard.compat.proto import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2  # noqa: E402

import lmscore  # noqa: E402
from lmscore.cli import inspect_report  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
import naive_inspect  # noqa: E402

SAMPLES = ROOT / "sample_graphs"
OUT = ROOT / "bench" / "out"
DENSENET = OUT / "densenet121.pb"
DENSENET_BATCH = 32
CHAIN_SIZES = (10_000, 100_000, 1_000_000)
QUICK_CHAIN_SIZES = (10_000, 100_000)
CHAIN_WIDTH = 256
CHAIN_BATCH = 32

TARGET_INPROCESS_S = 0.5
#: Whole ``lms inspect`` process at most this times the naive simulation's (bench/naive_inspect.py).
TARGET_NAIVE_RATIO = 2.0
#: Time per op of the largest chain at most this times the smallest's (linear growth).
TARGET_PER_OP_RATIO = 1.25
#: ...and its growth at most this times the naive simulation's growth on the same chains.
TARGET_GROWTH_VS_NAIVE = 1.10
NAIVE = ROOT / "bench" / "naive_inspect.py"

STAGES = ("parse", "load", "order", "ressim", "inspect", "naive")


# --------------------------------------------------------------------------- chain graphs


def _shape_list(*shapes: tuple[int, ...]) -> attr_value_pb2.AttrValue:
    a = attr_value_pb2.AttrValue()
    for shape in shapes:
        s = a.list.shape.add()
        for d in shape:
            s.dim.add().size = d
    return a


def _chain_templates() -> dict[str, node_def_pb2.NodeDef]:
    """One NodeDef per op type, with every attribute lmscore needs (no TensorFlow)."""
    act = (-1, CHAIN_WIDTH)
    t_float = attr_value_pb2.AttrValue(type=types_pb2.DT_FLOAT)
    tpl: dict[str, node_def_pb2.NodeDef] = {}

    n = node_def_pb2.NodeDef(op="Placeholder")
    n.attr["dtype"].CopyFrom(t_float)
    n.attr["shape"].shape.dim.add().size = -1
    n.attr["shape"].shape.dim.add().size = CHAIN_WIDTH
    n.attr["_output_shapes"].CopyFrom(_shape_list(act))
    tpl["Placeholder"] = n

    # The weight: shape only, no values (nothing here evaluates it).
    n = node_def_pb2.NodeDef(op="Const")
    n.attr["dtype"].CopyFrom(t_float)
    n.attr["value"].tensor.dtype = types_pb2.DT_FLOAT
    n.attr["value"].tensor.tensor_shape.dim.add().size = CHAIN_WIDTH
    n.attr["value"].tensor.tensor_shape.dim.add().size = CHAIN_WIDTH
    n.attr["_output_shapes"].CopyFrom(_shape_list((CHAIN_WIDTH, CHAIN_WIDTH)))
    tpl["Const"] = n

    n = node_def_pb2.NodeDef(op="MatMul")
    n.attr["T"].CopyFrom(t_float)
    n.attr["transpose_a"].b = False
    n.attr["transpose_b"].b = False
    n.attr["_output_shapes"].CopyFrom(_shape_list(act))
    tpl["MatMul"] = n

    for op in ("Relu", "AddV2"):
        n = node_def_pb2.NodeDef(op=op)
        n.attr["T"].CopyFrom(t_float)
        n.attr["_output_shapes"].CopyFrom(_shape_list(act))
        tpl[op] = n
    return tpl


def build_chain(n_ops: int) -> graph_pb2.GraphDef:
    """A GraphDef of exactly ``n_ops`` nodes: a float [-1, 256] Placeholder, then residual
    blocks ``w = Const; m = MatMul(x, w); r = Relu(m); x = AddV2(r, x)`` (a skip
    connection every three compute ops), padded with Relu ops to the exact count."""
    tpl = _chain_templates()
    gd = graph_pb2.GraphDef()
    gd.versions.producer = 1882

    def add(op: str, name: str, *inputs: str) -> None:
        n = gd.node.add()
        n.CopyFrom(tpl[op])
        n.name = name
        n.input.extend(inputs)

    add("Placeholder", "x")
    x = "x"
    blocks = (n_ops - 1) // 4
    for k in range(blocks):
        p = f"block{k}/"
        add("Const", p + "w")
        add("MatMul", p + "MatMul", x, p + "w")
        add("Relu", p + "Relu", p + "MatMul")
        add("AddV2", p + "add", p + "Relu", x)
        x = p + "add"
    for k in range(n_ops - 1 - 4 * blocks):
        add("Relu", f"tail/Relu_{k}", x)
        x = f"tail/Relu_{k}"
    assert len(gd.node) == n_ops
    return gd


def chain_file(n_ops: int) -> Path:
    """``bench/out/chain_N.pb``, built once and reused."""
    path = OUT / f"chain_{n_ops}.pb"
    if not path.exists():
        t0 = time.perf_counter()
        data = build_chain(n_ops).SerializeToString()
        OUT.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".pb.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        print(f"  (built {path.relative_to(ROOT)}: {len(data) / 1e6:.1f} MB in "
              f"{time.perf_counter() - t0:.1f} s)", flush=True)
    return path


def densenet_file() -> Path | None:
    if not DENSENET.exists():
        print(f"  ({DENSENET.relative_to(ROOT)} missing: generating it with "
              "sample_graphs/generate.py --densenet-27k, takes a minute or two)", flush=True)
        OUT.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(SAMPLES / "generate.py"), "--densenet-27k", str(DENSENET)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        if proc.returncode != 0 or not DENSENET.exists():
            print(f"  generate.py failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}")
            return None
        print(f"  (generated in {time.perf_counter() - t0:.0f} s)", flush=True)
    return DENSENET


# --------------------------------------------------------------------------- timing


def _clear_caches() -> None:
    clear = getattr(lmscore.order, "cache_clear", None)  # order() is lru-cached per graph
    if clear is not None:
        clear()


def _timed(fn, *args, **kwargs):
    gc.collect()
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - t0


def _parse(data: bytes) -> graph_pb2.GraphDef:
    gd = graph_pb2.GraphDef()
    gd.ParseFromString(data)
    return gd


def _res_sim(graph, batch: int):
    sizes = lmscore.resolve(graph, batch)
    return lmscore.simulate(graph, batch, sizes=sizes)


def bench_file(path: Path, batch: int, repeats: int, budget: float) -> dict:
    """Time the stages on ``path``; returns medians (seconds), ops, levels and repeats."""
    data = path.read_bytes()
    times: dict[str, list[float]] = {k: [] for k in STAGES}
    totals: list[float] = []
    report = None
    start = time.perf_counter()
    for _ in range(repeats):
        gd, t = _timed(_parse, data)
        times["parse"].append(t)
        del gd

        _clear_caches()
        graph, t_load = _timed(lmscore.load, path)
        report, t_insp = _timed(inspect_report, graph, batch)
        times["load"].append(t_load)
        times["inspect"].append(t_insp)
        totals.append(t_load + t_insp)

        fresh = graph.replace(graph.ops)
        _clear_caches()
        _, t = _timed(lmscore.order, fresh)
        times["order"].append(t)
        _, t = _timed(_res_sim, fresh, batch)
        times["ressim"].append(t)
        del graph, fresh
        _, t = _timed(naive_inspect.simulate, data, batch)
        times["naive"].append(t)
        _clear_caches()
        elapsed = time.perf_counter() - start
        if elapsed * (len(totals) + 1) / len(totals) > budget:  # the next one would overrun
            break
    gc.collect()
    med = {k: statistics.median(v) for k, v in times.items()}
    med["total"] = statistics.median(totals)
    return {
        "ops": report["ops"],
        "levels": report["levels"],
        "n": len(totals),
        "bytes": len(data),
        **med,
    }


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}" if s < 10 else f"{s * 1e3:.0f}"


HEADER = (
    f"  {'graph':<16}{'ops':>9}{'levels':>9}{'n':>3}"
    f"{'parse':>10}{'load':>10}{'order':>10}{'res+sim':>10}{'inspect':>10}"
    f"{'ld+insp':>10}{'ratio':>8}{'us/op':>8}{'naive':>10}"
)


def print_header() -> None:
    print(HEADER)
    print("  " + "-" * (len(HEADER) - 2) + "   (times in ms)")


def print_row(name: str, r: dict) -> None:
    print(
        f"  {name:<16}{r['ops']:>9}{r['levels']:>9}{r['n']:>3}"
        + "".join(f"{_ms(r[k]):>10}" for k in ("parse", "load", "order", "ressim", "inspect"))
        + f"{_ms(r['total']):>10}{r['total'] / r['parse']:>7.1f}x"
        + f"{r['total'] / r['ops'] * 1e6:>8.1f}{_ms(r['naive']):>10}",
        flush=True,
    )


def run_case(name: str, path: Path, batch: int, args) -> dict | None:
    try:
        r = bench_file(path, batch, args.repeats, args.budget)
    except Exception as e:  # keep going: report the failure, count it as a miss
        print(f"  {name:<16}ERROR {type(e).__name__}: {e}", flush=True)
        if args.verbose:
            traceback.print_exc()
        return None
    print_row(name, r)
    return r


def process_env() -> dict[str, str]:
    """The environment of the timed processes, with ``lmscore`` compiled to bytecode once.

    An installed package carries its bytecode (pip compiles it); a checkout run where
    ``PYTHONDONTWRITEBYTECODE`` is set would compile every module in every process (about
    35 ms of a 0.4 s ``lms inspect``), which no user pays. The bytecode goes to
    ``bench/out/pycache``, not into the checkout.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPYCACHEPREFIX=str(OUT / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "lmscore"], cwd=ROOT, env=env,
                   stdout=subprocess.DEVNULL, check=True)
    return env


def time_process(cmd: list[str], repeats: int) -> tuple[float | None, int, str]:
    """Median wall time of a subprocess (stdout/stderr discarded)."""
    env = process_env()
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            return None, len(times), (proc.stderr.strip().splitlines() or ["?"])[-1]
    return statistics.median(times), len(times), ""


def time_side_by_side(cases: list[tuple[str, list[str]]], repeats: int) -> dict | None:
    """Median wall time of each command, run in turns (a, b, a, b...) so load hits both."""
    env = process_env()
    times: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(repeats):
        for name, cmd in cases:
            gc.collect()
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - t0)
            if proc.returncode != 0:
                print(f"  {name} failed (exit {proc.returncode}): {' '.join(cmd)}")
                return None
    return {"n": repeats, **{name: statistics.median(v) for name, v in times.items()}}


def process_imports_tensorflow(cmd_args: list[str]) -> bool | None:
    """Whether the ``lms`` process imports tensorflow (from ``python -X importtime``)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *cmd_args], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        return None
    return any(line.rsplit("|", 1)[-1].strip() == "tensorflow"
               for line in proc.stderr.splitlines())


def _peak_rss() -> str:
    try:
        import resource
    except ImportError:  # not on this platform
        return "n/a"
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return f"{kib / 2**20:.2f} GiB"


# --------------------------------------------------------------------------- profile


def profile(path: Path, batch: int, top: int) -> None:
    _clear_caches()
    gc.collect()
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    graph = lmscore.load(path)
    inspect_report(graph, batch)
    prof.disable()
    wall = time.perf_counter() - t0
    print(f"\n== cProfile of load + inspect_report: {path.relative_to(ROOT)} "
          f"({len(graph.ops)} ops, batch {batch}; {wall:.2f} s under the profiler)")
    del graph
    _clear_caches()
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.strip_dirs().sort_stats(key).print_stats(top)
        text = out.getvalue()
        body = text[text.find("   ncalls"):] if "   ncalls" in text else text
        print(f"-- top {top} by {key}")
        print(body.rstrip())


# --------------------------------------------------------------------------- main


def _worst_ratio(target: str, ratios: list[tuple[str, float | None]], limit: float
                 ) -> tuple[str, str, bool]:
    """A summary row: the worst of ``ratios`` (step, ratio; None where a case failed)."""
    measured = [r for _, r in ratios if r is not None]
    worst = max(measured, default=None)
    ok = worst is not None and len(measured) == len(ratios) and worst <= limit
    detail = ", ".join(f"{s}: {r:.2f}x" if r is not None else f"{s}: n/a" for s, r in ratios)
    return target, f"worst {worst:.2f}x ({detail})" if worst is not None else "not measured", ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None,
                   help="repeats per figure, median reported (default 5; 2 with --quick)")
    p.add_argument("--quick", action="store_true",
                   help="reduced run: 2 repeats, chains up to 100k ops")
    p.add_argument("--budget", type=float, default=45.0,
                   help="seconds per case before repeats are cut short (default 45)")
    p.add_argument("--profile", action="store_true",
                   help="only print cProfile of load+inspect (DenseNet, largest chain)")
    p.add_argument("--top", type=int, default=15, help="profile entries (default 15)")
    p.add_argument("--verbose", action="store_true", help="tracebacks of failures")
    args = p.parse_args(argv)
    if args.repeats is None:
        args.repeats = 2 if args.quick else 5
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    chain_sizes = QUICK_CHAIN_SIZES if args.quick else CHAIN_SIZES

    if args.profile:
        dense = densenet_file()
        if dense is not None:
            profile(dense, DENSENET_BATCH, args.top)
        profile(chain_file(chain_sizes[-1]), CHAIN_BATCH, args.top)
        return 0

    run_start = time.perf_counter()
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"bench_inspect: python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {load1:.2f}, repeats {args.repeats}, budget {args.budget:.0f} s/case"
          f"{', quick' if args.quick else ''}")

    # 1. the bundled samples
    print("\n[1] bundled samples (sample_graphs/samples.json, each at its batch_size)")
    print_header()
    for s in json.loads((SAMPLES / "samples.json").read_text()):
        run_case(f"{s['name']} b{s['batch_size']}", SAMPLES / s["file"], int(s["batch_size"]),
                 args)

    # 2. DenseNet-121 training step (~27k ops)
    print(f"\n[2] DenseNet-121 training step (~27k ops), batch {DENSENET_BATCH}")
    dense = densenet_file()
    dense_r = None
    if dense is not None:
        print_header()
        dense_r = run_case(f"densenet121 b{DENSENET_BATCH}", dense, DENSENET_BATCH, args)

    # 3. generated chains
    print(f"\n[3] generated residual chains (Placeholder [-1, {CHAIN_WIDTH}]; Const/MatMul/Relu/"
          f"AddV2 blocks), batch {CHAIN_BATCH}")
    chains: dict[int, dict | None] = {}
    paths = {n: chain_file(n) for n in chain_sizes}
    print_header()
    for n in chain_sizes:
        chains[n] = run_case(f"chain_{n}", paths[n], CHAIN_BATCH, args)
    print(f"\n  time per op against the {chain_sizes[0] // 1000}k chain (target for "
          f"load+inspect: <= {TARGET_PER_OP_RATIO}x)")
    print(f"  {'chain':<22}{'parse':>8}{'load':>8}{'order':>8}{'res+sim':>9}{'inspect':>9}"
          f"{'ld+insp':>9}{'naive':>9}{'vs naive':>10}")
    per_op: list[tuple[str, float | None]] = []
    vs_naive: list[tuple[str, float | None]] = []
    small = chains.get(chain_sizes[0])
    for n in chain_sizes[1:]:
        step = f"{n // 1000}k / {chain_sizes[0] // 1000}k"
        rb = chains.get(n)
        if small is None or rb is None:
            print(f"  {step:<22}(missing: a case failed)")
            per_op.append((step, None))
            vs_naive.append((step, None))
            continue
        ratios = [(rb[k] / rb["ops"]) / (small[k] / small["ops"])
                  for k in ("parse", "load", "order", "ressim", "inspect", "total", "naive")]
        print(f"  {step:<22}" + "".join(f"{x:>{w}.2f}x" for x, w in
                                         zip(ratios, (7, 7, 7, 8, 8, 8, 8), strict=True))
              + f"{ratios[-2] / ratios[-1]:>9.2f}x")
        per_op.append((step, ratios[-2]))
        vs_naive.append((step, ratios[-2] / ratios[-1]))

    # 4. whole processes
    proc_repeats = args.repeats
    print(f"\n[4] whole-process wall time (subprocess, median of {proc_repeats})")
    lms_args = ["-m", "lmscore.cli", "inspect", str(DENSENET.relative_to(ROOT)),
                "--batch-size", str(DENSENET_BATCH)]
    commands = [
        ("python -m lmscore.cli inspect bench/out/densenet121.pb --batch-size 32",
         [sys.executable, *lms_args]),
        ('python -c "import lmscore, lmscore.cli, lmscore.load"',
         [sys.executable, "-c", "import lmscore, lmscore.cli, lmscore.load"]),
        ('python -c "pass"', [sys.executable, "-c", "pass"]),
        ('python -c "import tensorflow"', [sys.executable, "-c", "import tensorflow"]),
    ]
    proc_times: dict[str, float | None] = {}
    for label, cmd in commands:
        if dense is None and "densenet" in label:
            print(f"  {'(no DenseNet file)':>9}  {label}")
            proc_times[label] = None
            continue
        t, n, err = time_process(cmd, proc_repeats)
        proc_times[label] = t
        shown = f"{t:8.3f} s" if t is not None else f"FAILED ({err})"
        print(f"  {shown:>10}  {label}" + (f"  [n={n}]" if n != proc_repeats else ""),
              flush=True)
    naive_cmd = [sys.executable, str(NAIVE.relative_to(ROOT)), str(DENSENET.relative_to(ROOT)),
                 "--batch-size", str(DENSENET_BATCH)]
    side = (time_side_by_side([("lms", [sys.executable, *lms_args]), ("naive", naive_cmd)],
                              max(proc_repeats, 5)) if dense is not None else None)
    if side is not None:
        print(f"  side by side, alternating, median of {side['n']}: lms inspect "
              f"{side['lms']:.3f} s, naive {side['naive']:.3f} s "
              f"(python {NAIVE.relative_to(ROOT)}), ratio {side['lms'] / side['naive']:.2f}x")
    tf_in_child = process_imports_tensorflow(lms_args) if dense is not None else None
    tf_in_process = "tensorflow" in sys.modules
    print(f"  tensorflow in sys.modules after in-process inspect: "
          f"{'yes' if tf_in_process else 'no'}")
    print(f"  tensorflow imported by the lms inspect process (-X importtime): "
          f"{ {True: 'yes', False: 'no', None: 'unknown (run failed)'}[tf_in_child] }")

    # 5. summary
    print("\n[5] summary")
    results = []

    def verdict(ok: bool | None) -> str:
        return "PASS" if ok else "MISS"

    if dense_r is not None:
        v = dense_r["total"]
        results.append((f"{dense_r['ops']}-op DenseNet inspected in-process (load+inspect) "
                        f"< {TARGET_INPROCESS_S} s",
                        f"{v:.3f} s (load {dense_r['load']:.3f} + inspect "
                        f"{dense_r['inspect']:.3f})", v < TARGET_INPROCESS_S))
    else:
        results.append((f"27k-op graph inspected in-process < {TARGET_INPROCESS_S} s",
                        "not measured (failed)", False))
    if side is not None:
        ratio = side["lms"] / side["naive"]
        results.append((f"whole 'lms inspect' process on it <= {TARGET_NAIVE_RATIO}x the naive "
                        "simulation's", f"{ratio:.2f}x ({side['lms']:.3f} s vs "
                        f"{side['naive']:.3f} s)", ratio <= TARGET_NAIVE_RATIO))
    else:
        results.append((f"whole 'lms inspect' process <= {TARGET_NAIVE_RATIO}x naive",
                        "not measured (failed)", False))
    results.append(_worst_ratio(
        f"bare growth: time per op <= {TARGET_PER_OP_RATIO}x the smallest chain's "
        "(load+inspect)", per_op, TARGET_PER_OP_RATIO))
    results.append(_worst_ratio(
        f"linear growth: that growth <= {TARGET_GROWTH_VS_NAIVE}x the naive simulation's on "
        "the same chains", vs_naive, TARGET_GROWTH_VS_NAIVE))
    results.append(("tensorflow not imported (in-process and lms process)",
                    f"in-process {'yes' if tf_in_process else 'no'}, "
                    f"process {'yes' if tf_in_child else 'no' if tf_in_child is False else '?'}",
                    not tf_in_process and tf_in_child is False))
    width = max(len(t) for t, _, _ in results)
    for target, value, good in results:
        print(f"  {verdict(good)}  {target:<{width}}  {value}")
    misses = sum(1 for *_, good in results if not good)
    print(f"  {len(results) - misses}/{len(results)} targets met; "
          f"{misses} MISS" + ("" if misses == 1 else "ES") +
          f"; bench wall time {time.perf_counter() - run_start:.0f} s, peak RSS {_peak_rss()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
