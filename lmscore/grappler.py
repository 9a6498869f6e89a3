"""TensorFlow's own swapping as a baseline: Grappler's memory optimizer, run offline.

:func:`grappler_baseline` runs Grappler with ``RewriterConfig.memory_optimization =
SWAPPING_HEURISTICS`` on a training step, against a virtual cluster whose GPU has the
budget as its memory, turns what Grappler decided into a :class:`~lmscore.plan.Plan`, and
evaluates that plan with this project's simulator and time model, so that it can be put
next to :func:`lmscore.tune.tune` for the same budget.

Grappler needs a concrete graph, so the step is prepared in a few ways first:

- the feeds' unknown dimensions take the shapes :func:`lmscore.shapes.resolve` gives at
  the batch size (Grappler's item builder refuses placeholders of unknown shape);
- captured variables (``Placeholder`` nodes of dtype ``resource``) become ``VarHandleOp``
  nodes with the dtype and shape their reads and writes show: without them Grappler's
  shape inference knows no weight shape, every activation is one row wide in its
  memory estimate and nothing is large enough to swap;
- the small integer tensors of shape arithmetic that :func:`lmscore.shapes.resolve`
  evaluates (``Tensordot`` shapes and permutations, ``BroadcastGradientArgs`` axes) are
  given as constants (``fold_shapes``): Grappler's static shape inference loses them and
  then counts a transformer's activations as a few bytes each;
- every node goes on the virtual GPU (``/job:localhost/replica:0/task:0/device:GPU:0``)
  except nodes the graph already places on a CPU;
- the step's fetches are the loss ``Identity`` and the ``NoOp`` of the updates (the
  ``train_op`` collection of the MetaGraphDef), and the graph is pruned to their fanin
  as a session would: the optimizer drops any tensor read by a node that never runs.

The other Grappler optimizers are turned off by default (``other_optimizers=False``):
they rename, merge and remove nodes, and the decisions must name ops of the graph the
simulator sees. ``min_graph_nodes`` is -1 and ``meta_optimizer_iterations`` is ONE.

Grappler runs in a subprocess that sets ``TF_CPP_VMODULE=memory_optimizer=2`` and
``TF_CPP_MIN_LOG_LEVEL=0`` before TensorFlow is imported: the optimizer logs each decision
("Will swap fanout C:k of tensor P:j of size N") but reports nothing else. When Grappler
inserts swap nodes (``swap_out_*`` = ``_CopyFromGpuToHost``, ``swap_in_*`` =
``_CopyFromHostToGpu``) they are read back from the optimized GraphDef: the tensor, the
consumer that reads the swap-in, the control input that triggers the swap-in and the
reader that waits for the swap-out. When it logs decisions but inserts nothing, the logged
decisions become the plan, with swap-in triggers chosen the way Grappler chooses them
(``FindSwapInTrigger``) on this project's timeline.

What the memory optimizer does (``memory_optimizer.cc``), which explains its results:

- it estimates the peak of the GPU with its own static cost model and does nothing if
  that estimate fits ``memory_size``; the estimate ignores variables (a ``VarHandleOp``
  holds no bytes) but counts every ``ReadVariableOp`` as a new buffer;
- at the estimated peak it only considers tensors over 1 KiB that live more than 1 ms in
  its timeline (on a fast device, a small model's whole step takes less);
- it takes them by a fitness (far from the peak, few remaining readers) until the
  estimated excess is covered, one swap-out/swap-in pair per reader after the peak;
- a pair is only inserted if the tensor has another reader to hang the swap-out on
  (``FindSwapOutTrigger``) and if a fanin of the consumer finishes at least
  ``bytes / 16 GB/s`` before the consumer's inputs do (``FindSwapInTrigger``);
- ``SwappingPass`` never reports an update, so one pass runs, and its choices iterate an
  ``unordered_map`` keyed by pointers: which pairs get inserted can vary between runs.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError, RunError
from .evaluate import evaluate_plan
from .ir import Graph, split_tensor
from .order import order
from .plan import Plan, Swap, SwapIn, fingerprint, trigger_problem
from .shapes import Sizes, resolve
from .tune import DEVICES, LINKS, Device, _context, _evaluate, op_seconds, preset
from .units import format_bytes

__all__ = [
    "CPU_DEVICE",
    "GPU_DEVICE",
    "Decision",
    "GrapplerResult",
    "GrapplerRun",
    "device_properties",
    "grappler_baseline",
    "parse_decisions",
    "plan_from_decisions",
    "run_grappler",
]

#: The virtual accelerator every node is placed on.
GPU_DEVICE = "/job:localhost/replica:0/task:0/device:GPU:0"
#: The virtual host.
CPU_DEVICE = "/job:localhost/replica:0/task:0/device:CPU:0"
#: Transfer rate the memory optimizer assumes for a swap (bytes / 16 per nanosecond).
GRAPPLER_SWAP_BYTES_PER_SECOND = 16e9
#: Tensors living this long or less in Grappler's timeline are never swapped.
GRAPPLER_MIN_LIFETIME_SECONDS = 1e-3
#: Host memory of the virtual CPU device.
_HOST_MEMORY = 1 << 40
#: GPU memory of the cluster that measures Grappler's own peak estimate (never exceeded).
_UNBOUNDED = 1 << 50
#: Grappler optimizers turned off unless ``other_optimizers``.
_OTHER_OPTIMIZERS = (
    "constant_folding", "arithmetic_optimization", "dependency_optimization",
    "layout_optimizer", "remapping", "loop_optimization", "function_optimization",
    "shape_optimization", "debug_stripper", "pin_to_host_optimization",
    "implementation_selector", "common_subgraph_elimination",
)
_FRAME_OPS = frozenset({
    "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
    "NextIteration", "RefNextIteration",
})
_WILL_SWAP = re.compile(
    r"Will swap fanout (\S+):(\d+) of tensor (\S+):(\d+) of size (-?\d+)"
)
_NOT_ENOUGH_TIME = re.compile(r"Not enough time to swap: skipping (\S+)")
_FAILED = re.compile(r"(Failed to infer (?:memory usage|shapes): .*)$", re.MULTILINE)


@dataclass(frozen=True)
class Decision:
    """One swap decided by Grappler: a consumer's input read back from the host.

    Attributes
    ----------
    consumer : str
        The op that reads the tensor through the swap-in.
    port : int
        The consumer's input port that is swapped.
    tensor : str
        The swapped tensor, ``"op:port"``.
    bytes : int
        Its size in Grappler's estimate (0 when not logged).
    trigger : str or None
        The op whose completion starts the swap-in (inserted swaps only).
    out_trigger : str or None
        The reader of the tensor that waits for the swap-out (inserted swaps only).
    """

    consumer: str
    port: int
    tensor: str
    bytes: int = 0
    trigger: str | None = None
    out_trigger: str | None = None


@dataclass(frozen=True)
class GrapplerRun:
    """What one run of Grappler's memory optimizer did.

    Attributes
    ----------
    inserted : tuple of Decision
        Swap pairs found in the optimized graph, with their triggers.
    logged : tuple of Decision
        "Will swap" decisions of the log, in order, without duplicates.
    too_short_lived : int
        Tensors live at Grappler's peak that it skipped for living 1 ms or less.
    failures : tuple of str
        Analyses the optimizer logged as failed (then it swaps nothing).
    grappler_peak_bytes : int
        Grappler's own estimate of the GPU peak (-1 if unknown).
    optimized_peak_bytes : int
        With ``other_optimizers``, Grappler's estimate for the graph they returned, which
        is (but for any swap nodes) the one the memory optimizer saw; -1 otherwise.
    grappler_step_seconds : float
        Grappler's own estimate of the step time on the virtual cluster (-1 if unknown).
    nodes_before, nodes_after : int
        Nodes of the GraphDef given to Grappler and of the one it returned.
    unresolved_variables : tuple of str
        Resource placeholders left as placeholders (no read or write shows their shape).
    log : str
        The optimizer's stderr.
    """

    inserted: tuple[Decision, ...]
    logged: tuple[Decision, ...]
    too_short_lived: int
    failures: tuple[str, ...]
    grappler_peak_bytes: int
    grappler_step_seconds: float
    nodes_before: int
    nodes_after: int
    unresolved_variables: tuple[str, ...] = ()
    optimized_peak_bytes: int = -1
    log: str = field(default="", repr=False)


@dataclass(frozen=True)
class GrapplerResult:
    """Result of :func:`grappler_baseline`.

    Attributes
    ----------
    plan : Plan
        Grappler's decisions as a plan (empty if it decided nothing).
    inserted_swaps : int
        Swap-out/swap-in pairs Grappler inserted in the graph.
    logged_decisions : int
        Swaps Grappler logged as decided ("Will swap ...").
    source : {"rewrite", "log"}
        Whether the plan was read from the swap nodes Grappler inserted or, when it
        inserted none, from its logged decisions.
    predicted_peak_bytes, predicted_host_peak_bytes : int
        Device and host peaks of the rewritten graph in this project's simulator
        (``workspace="accelerator"``).
    swapped_tensors : int
    swap_bytes : int
        Bytes of the host buffers of the rewritten graph.
    predicted_overhead : float
        Step-time overhead predicted by :mod:`lmscore.tune`'s time model.
    note : str
        One line: what Grappler did, or why it did not swap.
    budget_bytes : int
        The GPU memory Grappler was given.
    baseline_peak_bytes : int
        Simulated device peak without swapping.
    grappler_peak_bytes : int
        Grappler's own estimate of the unswapped peak (-1 if unknown).
    fits : bool
        Whether the simulated step fits the budget (:func:`lmscore.memory.fits`).
    decisions : tuple of Decision
        The decisions the plan was made from.
    skipped : tuple of (str, str)
        ``(decision, reason)`` for decisions that could not be put in the plan.
    """

    plan: Plan
    inserted_swaps: int
    logged_decisions: int
    source: str
    predicted_peak_bytes: int
    predicted_host_peak_bytes: int
    swapped_tensors: int
    swap_bytes: int
    predicted_overhead: float
    note: str
    budget_bytes: int = 0
    baseline_peak_bytes: int = 0
    grappler_peak_bytes: int = -1
    fits: bool = False
    decisions: tuple[Decision, ...] = ()
    skipped: tuple[tuple[str, str], ...] = ()


# --- Reading Grappler's log ----------------------------------------------------------------


def parse_decisions(log: str) -> tuple[Decision, ...]:
    """The "Will swap" decisions of a memory-optimizer log, in order, without duplicates.

    >>> line = ("I0000 memory_optimizer.cc:1133] Will swap fanout g/ReluGrad:1 of tensor "
    ...         "f/Relu:0 of size 51380224")
    >>> parse_decisions(line)
    (Decision(consumer='g/ReluGrad', port=1, tensor='f/Relu:0', bytes=51380224, \
trigger=None, out_trigger=None),)
    """
    seen: dict[tuple[str, int, str], Decision] = {}
    for m in _WILL_SWAP.finditer(log):
        consumer, port, producer, out, size = m.groups()
        key = (consumer, int(port), f"{producer}:{out}")
        seen.setdefault(key, Decision(consumer, int(port), f"{producer}:{out}", int(size)))
    return tuple(seen.values())


# --- Running Grappler ----------------------------------------------------------------------


def device_properties(device: Device, memory_bytes: int) -> dict[str, Any]:
    """``DeviceProperties`` fields of a virtual GPU that Grappler's cost model sees as ``device``.

    Grappler's op cost estimator takes ``num_cores x frequency x 64 x 2`` FLOP/s for a GPU
    of compute capability 6 or more, and ``bandwidth`` in KB/s.

    >>> p = device_properties(DEVICES["V100"], 2**30)
    >>> p["frequency"], p["bandwidth"], p["memory_size"]
    (1533, 900000000, 1073741824)
    """
    cores = 80
    return {
        "type": "GPU",
        "vendor": "NVIDIA",
        "model": device.name,
        "frequency": round(device.flops / (cores * 64 * 2) / 1e6),
        "num_cores": cores,
        "environment": {"architecture": "7.0"},
        "num_registers": 65536,
        "l1_cache_size": 24576,
        "l2_cache_size": 6291456,
        "shared_memory_size_per_multiprocessor": 98304,
        "memory_size": int(memory_bytes),
        "bandwidth": round(device.bandwidth / 1e3),
    }


def run_grappler(
    graph: Graph,
    batch_size: int,
    budget_bytes: int,
    *,
    device: str = "V100",
    other_optimizers: bool = False,
    fold_shapes: bool = True,
    timeout: float = 600.0,
) -> GrapplerRun:
    """Run Grappler's memory optimizer (``SWAPPING_HEURISTICS``) on ``graph`` in a subprocess.

    Parameters
    ----------
    graph : Graph
        A graph loaded from a GraphDef (:attr:`Graph.graphdef` is what Grappler gets).
    batch_size : int
    budget_bytes : int
        Memory of the virtual GPU.
    device : str
        A key of :data:`lmscore.tune.DEVICES`: the speed of the virtual GPU.
    other_optimizers : bool
        Also run Grappler's default optimizers (they rename and remove nodes).
    fold_shapes : bool
        Give Grappler the small integer tensors this project evaluates at the batch size
        (shapes, permutations, reduction axes) as constants.
    timeout : float
        Seconds before the subprocess is stopped.

    Returns
    -------
    GrapplerRun

    Raises
    ------
    ConfigError
        For a bad batch size, budget or device.
    RunError
        If the graph has no GraphDef, a feed's shape stays unknown, or TensorFlow fails.
    """
    dev = _check(batch_size, budget_bytes, device)
    if graph.graphdef is None:
        raise RunError(f"{graph.source}: no GraphDef to give Grappler (load the graph from a "
                       "GraphDef or SavedModel)")
    sizes = resolve(graph, batch_size)
    spec = _spec(graph, sizes, budget_bytes, dev, other_optimizers)
    spec["folded"] = _folded(graph, sizes) if fold_shapes else []
    with tempfile.TemporaryDirectory(prefix="lms-grappler-") as tmp:
        root = pathlib.Path(tmp)
        (root / "graph.pb").write_bytes(graph.graphdef)
        (root / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ)
        env["TF_CPP_VMODULE"] = "memory_optimizer=2"
        env["TF_CPP_MIN_LOG_LEVEL"] = "0"
        env.pop("TF_CPP_MAX_VLOG_LEVEL", None)
        env["CUDA_VISIBLE_DEVICES"] = ""
        package_root = str(pathlib.Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "lmscore.grappler", tmp],
                capture_output=True, text=True, errors="replace", env=env, cwd=tmp,
                timeout=timeout, check=False,
            )
        except subprocess.TimeoutExpired:
            raise RunError(f"{graph.source}: Grappler did not finish within {timeout:g} s"
                           ) from None
        result_path = root / "result.json"
        if proc.returncode != 0 or not result_path.exists():
            raise RunError(f"{graph.source}: Grappler failed: {_last_error(proc.stderr)}")
        result = json.loads(result_path.read_text())
    if result.get("error"):
        raise RunError(f"{graph.source}: Grappler failed: {result['error']}")
    log = proc.stderr
    inserted = tuple(
        Decision(d["consumer"], d["port"], d["tensor"], 0, d["trigger"], d["out_trigger"])
        for d in result["inserted"]
    )
    return GrapplerRun(
        inserted=inserted,
        logged=parse_decisions(log),
        too_short_lived=len(_NOT_ENOUGH_TIME.findall(log)),
        failures=tuple(dict.fromkeys(m.strip() for m in _FAILED.findall(log))),
        grappler_peak_bytes=int(result["grappler_peak"]),
        grappler_step_seconds=float(result["step_seconds"]),
        nodes_before=int(result["nodes_before"]),
        nodes_after=int(result["nodes_after"]),
        unresolved_variables=tuple(result["unresolved"]),
        optimized_peak_bytes=int(result["optimized_peak"]),
        log=log,
    )


def _check(batch_size: int, budget_bytes: int, device: str) -> Device:
    device = preset(device, DEVICES, "device")
    if batch_size <= 0:
        raise ConfigError(f"batch size must be positive, got {batch_size}")
    if budget_bytes <= 0:
        raise ConfigError(f"budget must be positive, got {budget_bytes}")
    return DEVICES[device]


def _spec(
    graph: Graph, sizes: Sizes, budget: int, dev: Device, other_optimizers: bool
) -> dict[str, Any]:
    """What the subprocess needs besides the GraphDef: shapes, variables, fetches, devices."""
    feeds: dict[str, list[int]] = {}
    variables: dict[str, list[Any]] = {}
    for i, op in enumerate(graph.ops):
        if op.type != "Placeholder" or not op.outputs:
            continue
        if op.outputs[0].dtype == "resource":
            found = _variable_spec(graph, sizes, i)
            if found is not None:
                variables[op.name] = [found[0], list(found[1])]
            continue
        shape = sizes.shapes[i][0]
        if shape is None or -1 in shape:
            raise RunError(f"{graph.source}: feed {op.name!r} has no concrete shape at batch "
                           f"{sizes.batch_size} ({shape})")
        feeds[op.name] = list(shape)
    used = {split_tensor(t)[0] for op in graph.ops for t in op.inputs}
    used |= {c for op in graph.ops for c in op.control_inputs}
    sinks = [op for op in graph.ops if op.name not in used]
    outputs = [op for op in sinks if op.type == "Identity" and op.control_inputs]
    if outputs:
        fetch = [op.name for op in outputs]
        fetch += [c for op in outputs for c in op.control_inputs
                  if graph.op(c).type == "NoOp"]
    else:
        fetch = [op.name for op in sinks if op.type != "Const"]
    if not fetch:
        raise RunError(f"{graph.source}: no output to fetch")
    return {
        "feeds": feeds,
        "variables": variables,
        "resources": [op.name for op in graph.ops if op.type == "Placeholder" and op.outputs
                      and op.outputs[0].dtype == "resource"],
        "fetch": list(dict.fromkeys(fetch)),
        "gpu": device_properties(dev, budget),
        "other_optimizers": other_optimizers,
    }


def _variable_spec(
    graph: Graph, sizes: Sizes, i: int
) -> tuple[str, tuple[int, ...]] | None:
    """Dtype and shape of a captured variable, from a read or a whole-value write of it."""
    adj = graph.adjacency
    for c in adj.consumers.get((i, 0), ()):
        op = graph.ops[c]
        if op.type == "ReadVariableOp" and op.outputs:
            shape, dtype = sizes.shapes[c][0], op.outputs[0].dtype
        elif op.type in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp") and (
            len(adj.data_in[c]) >= 2
        ):
            p, port = adj.data_in[c][1]
            shape, dtype = sizes.shapes[p][port], graph.ops[p].outputs[port].dtype
        else:
            continue
        if shape is not None and -1 not in shape:
            return dtype, tuple(shape)
    return None


def _folded(graph: Graph, sizes: Sizes) -> list[list[Any]]:
    """``[tensor, dtype, shape, values]`` of the computed integer tensors with known values.

    Keras computes shapes at run time (``Shape -> GatherV2 -> Prod -> Pack -> Reshape``,
    ``ConcatV2`` permutations of ``Tensordot``, ``BroadcastGradientArgs`` reduction axes).
    Grappler's static shape inference loses such dimensions and then counts them as 1 (or
    a whole tensor as a scalar), so its memory estimate misses most of a transformer.
    """
    out: list[list[Any]] = []
    for (i, port), values in sizes.values.items():
        op = graph.ops[i]
        dtype = op.outputs[port].dtype
        if op.type == "Const" or dtype not in ("int32", "int64"):
            continue
        shape = sizes.shapes[i][port]
        if shape is not None and -1 not in shape and math.prod(shape) == len(values):
            pass
        elif shape is not None and len(shape) == 1:
            shape = (len(values),)
        else:
            continue
        out.append([f"{op.name}:{port}", dtype, list(shape), list(values)])
    return out


def _last_error(stderr: str) -> str:
    """The most telling line of a failed subprocess's stderr."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln):
            return ln[:300]
    return lines[-1][:300] if lines else "no output"


# --- Decisions to a plan -----------------------------------------------------------------


def plan_from_decisions(
    graph: Graph,
    decisions: Iterable[Decision],
    batch_size: int,
    *,
    emulate_triggers: bool = False,
    device: str = "V100",
    params: dict[str, Any] | None = None,
) -> tuple[Plan, tuple[tuple[str, str], ...]]:
    """Turn Grappler's decisions into a plan: one swap per tensor, one swap-in per consumer.

    Grappler makes one swap-out per swapped consumer input; a plan has one swap-out per
    tensor and one swap-in per consumer, each with its trigger. A trigger that does not
    come after the producer (Grappler's timeline runs independent branches in parallel)
    leaves the swap-in synchronous: the swap-in then only waits for the swap-out, which
    is what Grappler's control edge amounts to.

    Parameters
    ----------
    graph : Graph
    decisions : iterable of Decision
    batch_size : int
    emulate_triggers : bool
        Choose each swap-in's trigger as Grappler does (``FindSwapInTrigger``): the
        latest-finishing fanin of the consumer that finishes ``bytes / 16 GB/s`` before the
        consumer's last input, on this project's timeline (schedule order, roofline op
        times of ``device``). Otherwise use the decisions' own triggers.
    device : str
        A key of :data:`lmscore.tune.DEVICES` for the timeline.
    params : dict, optional
        Stored in :attr:`Plan.params`.

    Returns
    -------
    plan : Plan
    skipped : tuple of (str, str)
        ``("consumer:port <- tensor", reason)`` for decisions left out.
    """
    decisions = tuple(decisions)
    idx = graph.index
    lv = order(graph).levels
    skipped: list[tuple[str, str]] = []
    kept: list[Decision] = []
    for d in decisions:
        label = f"{d.consumer}:{d.port} <- {d.tensor}"
        producer, port = split_tensor(d.tensor)
        if producer not in idx or port >= len(graph.ops[idx[producer]].outputs):
            skipped.append((label, "the tensor is not in the graph"))
        elif d.consumer not in idx:
            skipped.append((label, "the consumer is not in the graph"))
        elif d.tensor not in graph.ops[idx[d.consumer]].inputs:
            skipped.append((label, "the consumer does not read the tensor"))
        else:
            kept.append(d)
    triggers: dict[str, str | None] = {}
    if emulate_triggers:
        sizes = resolve(graph, batch_size)
        times = _timeline(graph, sizes, _check(batch_size, 1, device))
        by_consumer: dict[str, list[Decision]] = {}
        for d in kept:
            by_consumer.setdefault(d.consumer, []).append(d)
        for consumer, ds in by_consumer.items():
            nbytes = sum(max(d.bytes, 0) for d in ds)
            swapped = {split_tensor(d.tensor)[0] for d in ds}
            triggers[consumer] = _grappler_trigger(graph, times, consumer, swapped, nbytes)
    groups: dict[str, dict[str, str | None]] = {}
    synchronous = 0
    for d in kept:
        trigger = triggers.get(d.consumer) if emulate_triggers else d.trigger
        producer = idx[split_tensor(d.tensor)[0]]
        if trigger is not None and not (
            trigger in idx and _valid_trigger(graph, lv, idx[trigger], producer,
                                              idx[d.consumer])
        ):
            trigger = None
        consumers = groups.setdefault(d.tensor, {})
        if d.consumer not in consumers:
            consumers[d.consumer] = trigger
            synchronous += trigger is None
    swaps = tuple(
        Swap(tensor, tuple(
            SwapIn((c,), trg)
            for c, trg in sorted(consumers.items(), key=lambda kv: (lv[idx[kv[0]]], kv[0]))
        ))
        for tensor, consumers in groups.items()
    )
    info = {"source": "grappler", "synchronous_swap_ins": synchronous, **(params or {})}
    return Plan(fingerprint(graph), swaps, 0, (), info), tuple(skipped)


def _timeline(graph: Graph, sizes: Sizes, dev: Device) -> list[float]:
    """Completion time of every op when the schedule runs one op at a time."""
    seconds = op_seconds(graph, sizes, dev)
    done = [0.0] * len(graph.ops)
    now = 0.0
    for i in order(graph).schedule:
        now += seconds[i]
        done[i] = now
    return done


def _grappler_trigger(
    graph: Graph, times: Sequence[float], consumer: str, swapped: set[str], nbytes: int
) -> str | None:
    """The swap-in trigger ``FindSwapInTrigger`` would pick, on ``times``."""
    idx = graph.index
    adj = graph.adjacency
    c = idx[consumer]

    def fanin(i: int) -> list[int]:
        return [p for p, _ in adj.data_in[i]] + list(adj.control_in[i])

    inputs = fanin(c)
    if not inputs:
        return None
    latest = max(times[p] for p in inputs) - nbytes / GRAPPLER_SWAP_BYTES_PER_SECOND
    heap = sorted({graph.ops[p].name for p in inputs} - swapped)
    if not heap:
        return None
    processed: set[str] = set()
    candidates: dict[float, str] = {}
    while heap:
        name = heapq.heappop(heap)
        if name in processed:
            continue
        processed.add(name)
        i = idx[name]
        if graph.ops[i].type in _FRAME_OPS:
            continue
        if times[i] < latest:
            candidates[times[i]] = name
        else:
            for p in fanin(i):
                if graph.ops[p].name not in processed:
                    heapq.heappush(heap, graph.ops[p].name)
    return candidates[max(candidates)] if candidates else None


def _valid_trigger(graph: Graph, lv: Sequence[int], t: int, producer: int, consumer: int) -> bool:
    """Whether op ``t`` may trigger a swap-in for ``consumer`` (as plans require)."""
    group = SwapIn((graph.ops[consumer].name,), graph.ops[t].name)
    return not trigger_problem(graph, lv, producer, group)


# --- The baseline ----------------------------------------------------------------------------


def grappler_baseline(
    graph: Graph,
    batch_size: int,
    budget_bytes: int,
    *,
    device: str = "V100",
    link: str = "pcie3",
    other_optimizers: bool = False,
    fold_shapes: bool = True,
    timeout: float = 600.0,
    safety: float = 1.0,
) -> GrapplerResult:
    """Grappler's swapping for ``budget_bytes`` of GPU memory, evaluated by this project.

    Runs :func:`run_grappler`, makes a plan of the swaps Grappler inserted (or, if it
    inserted none, of the swaps it logged as decided), rewrites the graph with it
    (:func:`lmscore.rewrite.rewrite`), simulates it (``workspace="accelerator"``) and predicts the
    step time with :mod:`lmscore.tune`'s time model on ``device`` and ``link``.

    Parameters
    ----------
    graph : Graph
    batch_size : int
    budget_bytes : int
        GPU memory (what :func:`lmscore.tune.tune` takes as ``budget_bytes``).
    device : str
        A key of :data:`lmscore.tune.DEVICES`: the virtual GPU's speed and the time model's.
    link : str
        A key of :data:`lmscore.tune.LINKS` for the time model.
    other_optimizers : bool
        Let Grappler's default optimizers run too (see :func:`run_grappler`).
    fold_shapes : bool
        Give Grappler the evaluated shape arithmetic as constants (see :func:`run_grappler`).
    timeout : float
        Seconds Grappler may take.
    safety : float
        Fraction of the free memory the step may use, for ``fits`` (as in
        :func:`lmscore.tune.tune`).

    Returns
    -------
    GrapplerResult

    Raises
    ------
    ConfigError
        For a bad batch size, budget, device or link.
    RunError
        If Grappler cannot be run on the graph.
    """
    dev = _check(batch_size, budget_bytes, device)
    device, link = dev.name, preset(link, LINKS, "link")
    run = run_grappler(graph, batch_size, budget_bytes, device=device,
                       other_optimizers=other_optimizers, fold_shapes=fold_shapes,
                       timeout=timeout)
    source = "rewrite" if run.inserted else "log"
    decisions = run.inserted or run.logged
    params: dict[str, Any] = {
        "mode": source, "batch_size": batch_size, "budget_bytes": budget_bytes,
        "device": device, "other_optimizers": other_optimizers, "fold_shapes": fold_shapes,
    }
    if run.inserted:
        outs: dict[str, list[str]] = {}
        for d in run.inserted:
            if d.out_trigger:
                outs.setdefault(d.tensor, []).append(d.out_trigger)
        params["swap_out_waiters"] = outs
    plan, skipped = plan_from_decisions(
        graph, decisions, batch_size, emulate_triggers=not run.inserted, device=device,
        params=params,
    )
    sizes = resolve(graph, batch_size)
    ev = evaluate_plan(graph, plan, batch_size, workspace="accelerator", sizes=sizes)
    base, rw, sim = ev.before, ev.rewrite, ev.after
    ctx = _context(graph, sizes, base, op_seconds(graph, sizes, dev), LINKS[link].bandwidth)
    base_seconds = sum(ctx.seconds)
    seconds = _evaluate(ctx, rw.plan.swaps, rw.plan.sync_mode).seconds
    overhead = max(0.0, seconds / base_seconds - 1) if base_seconds else 0.0
    swap_bytes = ev.swap_bytes
    note = _note(run, graph, skipped, budget_bytes, base_seconds, dev)
    return GrapplerResult(
        plan=rw.plan,
        inserted_swaps=len(run.inserted),
        logged_decisions=len(run.logged),
        source=source,
        predicted_peak_bytes=sim.peak_bytes,
        predicted_host_peak_bytes=sim.host_peak_bytes,
        swapped_tensors=len(rw.plan.swaps),
        swap_bytes=swap_bytes,
        predicted_overhead=overhead,
        note=note,
        budget_bytes=budget_bytes,
        baseline_peak_bytes=base.peak_bytes,
        grappler_peak_bytes=run.grappler_peak_bytes,
        fits=ev.fits(budget_bytes, safety),
        decisions=decisions,
        skipped=skipped,
    )


def _note(
    run: GrapplerRun,
    graph: Graph,
    skipped: Sequence[tuple[str, str]],
    budget: int,
    base_seconds: float,
    dev: Device,
) -> str:
    """One line: what Grappler did, or what stopped it."""
    estimate = (f"its peak estimate {format_bytes(run.grappler_peak_bytes)}"
                if run.grappler_peak_bytes >= 0 else "its peak estimate (unknown)")
    left = f"; {_count(len(skipped), 'decision')} left out of the plan" if skipped else ""
    if run.inserted:
        missing = _not_inserted(graph, run)
        why = ", ".join(f"{n} {reason}" for reason, n in missing.items())
        over = ">" if run.grappler_peak_bytes > budget else "vs"
        return (f"Grappler inserted {_count(len(run.inserted), 'swap pair')} for "
                f"{_count(len(run.logged), 'logged decision')} ({estimate} {over} budget "
                f"{format_bytes(budget)})"
                + (f"; not inserted: {why}" if why else "") + left)
    if run.logged:
        missing = _not_inserted(graph, run)
        why = ", ".join(f"{n} {reason}" for reason, n in missing.items())
        return (f"Grappler logged {_count(len(run.logged), 'decision')} but inserted no swap "
                f"node ({why}); the plan is its logged decisions with triggers chosen as it "
                "would" + left)
    if run.failures:
        return f"Grappler swapped nothing: {run.failures[0]}"
    if 0 <= run.optimized_peak_bytes <= budget:
        return (f"Grappler swapped nothing: after its other optimizers its peak estimate is "
                f"{format_bytes(run.optimized_peak_bytes)}, within the "
                f"{format_bytes(budget)} budget (before them: "
                f"{format_bytes(run.grappler_peak_bytes)})")
    if 0 <= run.grappler_peak_bytes <= budget:
        return (f"Grappler swapped nothing: {estimate} fits the {format_bytes(budget)} "
                "budget (it counts no variable memory)")
    step = (f"{run.grappler_step_seconds * 1e3:.3g} ms" if run.grappler_step_seconds >= 0
            else f"{base_seconds * 1e3:.3g} ms by this project's time model")
    if run.too_short_lived:
        return (f"Grappler swapped nothing: {estimate} exceeds the {format_bytes(budget)} "
                f"budget but none of the {run.too_short_lived} tensors live at its peak "
                f"lives over {GRAPPLER_MIN_LIFETIME_SECONDS * 1e3:g} ms (the whole step takes "
                f"{step} on the virtual {dev.name})")
    return (f"Grappler swapped nothing: {estimate} exceeds the {format_bytes(budget)} budget "
            "but no tensor live at its peak is swappable and read after it")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _not_inserted(graph: Graph, run: GrapplerRun) -> dict[str, int]:
    """Why logged decisions got no swap pair, from the graph's structure.

    ``FindSwapOutTrigger`` needs another reader of the tensor; ``FindSwapInTrigger`` needs
    another input of the consumer, and one of its fanins to finish early enough (timing:
    what remains is put down to that).
    """
    done = {(d.consumer, d.port) for d in run.inserted}
    idx = graph.index
    adj = graph.adjacency
    reasons: dict[str, int] = {}
    for d in run.logged:
        if (d.consumer, d.port) in done:
            continue
        producer, port = split_tensor(d.tensor)
        if producer not in idx or d.consumer not in idx:
            reason = "naming ops not in the graph"
        else:
            c = idx[d.consumer]
            others = [r for r in adj.consumers.get((idx[producer], port), ()) if r != c]
            inputs = {graph.ops[p].name for p, _ in adj.data_in[c]}
            inputs |= set(graph.ops[c].control_inputs)
            inputs.discard(producer)
            if not others:
                reason = "with no other reader to trigger the swap-out"
            elif not inputs:
                reason = "whose consumer has no other input to trigger the swap-in"
            else:
                reason = "with no fanin of the consumer finishing early enough for the swap-in"
        reasons[reason] = reasons.get(reason, 0) + 1
    return reasons


# --- The subprocess ------------------------------------------------------------------------


def _child(workdir: str) -> None:
    """Prepare the GraphDef, run Grappler and write ``result.json`` (run by run_grappler)."""
    from tensorflow.core.framework import graph_pb2, types_pb2
    from tensorflow.core.protobuf import (
        config_pb2,
        device_properties_pb2,
        meta_graph_pb2,
        rewriter_config_pb2,
    )
    from tensorflow.python.grappler import cluster as gcluster
    from tensorflow.python.grappler import item as gitem
    from tensorflow.python.grappler import tf_optimizer

    root = pathlib.Path(workdir)
    spec = json.loads((root / "spec.json").read_text())
    gd = graph_pb2.GraphDef()
    gd.ParseFromString((root / "graph.pb").read_bytes())
    feeds, variables = spec["feeds"], spec["variables"]
    for node in gd.node:
        node.device = CPU_DEVICE if "CPU" in node.device.upper() else GPU_DEVICE
        if node.name in feeds:
            shape = node.attr["shape"].shape
            shape.Clear()
            for d in feeds[node.name]:
                shape.dim.add(size=d)
            if "_output_shapes" in node.attr:
                shapes = node.attr["_output_shapes"].list.shape
                del shapes[:]
                shapes.add().CopyFrom(shape)
        elif node.name in variables:
            dtype, dims = variables[node.name]
            saved = (node.attr["_output_shapes"].SerializeToString()
                     if "_output_shapes" in node.attr else None)
            node.op = "VarHandleOp"
            node.attr.clear()
            node.attr["dtype"].type = types_pb2.DataType.Value(f"DT_{dtype.upper()}")
            for d in dims:
                node.attr["shape"].shape.dim.add(size=d)
            node.attr["shape"].shape.SetInParent()
            node.attr["container"].s = b""
            node.attr["shared_name"].s = node.name.encode()
            node.attr["allowed_devices"].list.SetInParent()
            if saved is not None:
                node.attr["_output_shapes"].ParseFromString(saved)
    _fold(gd, spec["folded"], types_pb2)
    _prune(gd, spec["fetch"])
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(gd)
    meta.collection_def["train_op"].node_list.value.extend(spec["fetch"])

    config = config_pb2.ConfigProto()
    rw = config.graph_options.rewrite_options
    rw.memory_optimization = rewriter_config_pb2.RewriterConfig.SWAPPING_HEURISTICS
    rw.min_graph_nodes = -1
    rw.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    if not spec["other_optimizers"]:
        for name in _OTHER_OPTIMIZERS:
            setattr(rw, name, rewriter_config_pb2.RewriterConfig.OFF)
        rw.disable_model_pruning = True

    def devices(gpu_memory: int) -> list[Any]:
        gpu = dict(spec["gpu"], memory_size=gpu_memory)
        cpu = {"type": "CPU", "frequency": 2000, "num_cores": 2, "memory_size": _HOST_MEMORY,
               "bandwidth": 20_000_000}
        return [
            device_properties_pb2.NamedDevice(
                name=GPU_DEVICE, properties=device_properties_pb2.DeviceProperties(**gpu)),
            device_properties_pb2.NamedDevice(
                name=CPU_DEVICE, properties=device_properties_pb2.DeviceProperties(**cpu)),
        ]

    result: dict[str, Any] = {
        "error": None, "inserted": [], "grappler_peak": -1, "optimized_peak": -1,
        "step_seconds": -1.0,
        "nodes_before": len(meta.graph_def.node), "nodes_after": len(meta.graph_def.node),
        "unresolved": [n for n in spec["resources"] if n not in variables],
    }
    cluster = gcluster.Cluster(devices=devices(spec["gpu"]["memory_size"]))
    try:
        out = tf_optimizer.OptimizeGraph(config, meta, verbose=True, cluster=cluster)
    except Exception as e:  # any TensorFlow failure is reported as one line
        result["error"] = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        out = None
    finally:
        cluster.Shutdown()
    if out is not None:
        result["nodes_after"] = len(out.node)
        result["inserted"] = _inserted_swaps(out)
        optimized = meta_graph_pb2.MetaGraphDef()
        optimized.graph_def.CopyFrom(out)
        optimized.collection_def["train_op"].CopyFrom(meta.collection_def["train_op"])
        measure = gcluster.Cluster(devices=devices(_UNBOUNDED))
        try:
            item = gitem.Item(meta)
            peak = measure.DeterminePeakMemoryUsage(item)
            result["grappler_peak"] = int(peak.get(GPU_DEVICE, (-1,))[0])
            result["step_seconds"] = float(measure.MeasureCosts(item)[1])
            if spec["other_optimizers"]:
                peak = measure.DeterminePeakMemoryUsage(gitem.Item(optimized))
                result["optimized_peak"] = int(peak.get(GPU_DEVICE, (-1,))[0])
        except Exception as e:  # the estimates are optional
            print(f"lmscore: Grappler estimates failed: {e}", file=sys.stderr)
        finally:
            measure.Shutdown()
    (root / "result.json").write_text(json.dumps(result))


def _fold(gd: Any, folded: list[list[Any]], types_pb2: Any) -> None:
    """Make every reader of a folded tensor read a new ``Const`` holding its value."""
    values = {t: (dtype, shape, vals) for t, dtype, shape, vals in folded}
    names = {n.name for n in gd.node}
    made: dict[str, str] = {}
    for node in list(gd.node):
        for k, name in enumerate(node.input):
            if name.startswith("^"):
                break
            tensor = name if ":" in name else f"{name}:0"
            if tensor not in values:
                continue
            if tensor not in made:
                dtype, shape, vals = values[tensor]
                base = tensor.replace(":", "/lms_value_")
                const_name, k2 = base, 1
                while const_name in names:
                    const_name, k2 = f"{base}_{k2}", k2 + 1
                names.add(const_name)
                const = gd.node.add()
                const.name, const.op, const.device = const_name, "Const", node.device
                enum = types_pb2.DataType.Value(f"DT_{dtype.upper()}")
                const.attr["dtype"].type = enum
                proto = const.attr["value"].tensor
                proto.dtype = enum
                proto.tensor_shape.SetInParent()
                for d in shape:
                    proto.tensor_shape.dim.add(size=d)
                (proto.int_val if dtype == "int32" else proto.int64_val).extend(vals)
                shapes = const.attr["_output_shapes"].list.shape.add()
                for d in shape:
                    shapes.dim.add(size=d)
                made[tensor] = const_name
            node.input[k] = made[tensor]


def _prune(gd: Any, fetch: Sequence[str]) -> None:
    """Keep only the fetches' transitive fanin, as a session or a function does.

    The memory optimizer drops every tensor with a reader it has no completion time for,
    and a reader outside the fetches' fanin never runs: a dangling ``Shape`` of an
    activation would keep that activation from being swapped.
    """
    nodes = {n.name: n for n in gd.node}
    keep = set()
    stack = [f for f in fetch if f in nodes]
    while stack:
        name = stack.pop()
        if name in keep:
            continue
        keep.add(name)
        for i in nodes[name].input:
            src = i.lstrip("^").split(":")[0]
            if src in nodes and src not in keep:
                stack.append(src)
    kept = [n for n in gd.node if n.name in keep]
    del gd.node[:]
    gd.node.extend(kept)


def _inserted_swaps(gd: Any) -> list[dict[str, Any]]:
    """The swap pairs of an optimized GraphDef, as decision records."""
    nodes = {n.name: n for n in gd.node}
    waiters: dict[str, list[str]] = {}
    for n in gd.node:
        for i in n.input:
            if i.startswith("^"):
                waiters.setdefault(i[1:], []).append(n.name)
    found = []
    for n in gd.node:
        for port, name in enumerate(n.input):
            if name.startswith("^"):
                break
            swap_in = nodes.get(name.split(":")[0])
            if swap_in is None or swap_in.op != "_CopyFromHostToGpu":
                continue
            data = [i for i in swap_in.input if not i.startswith("^")]
            control = [i[1:] for i in swap_in.input if i.startswith("^")]
            swap_out = nodes.get(data[0].split(":")[0]) if data else None
            if swap_out is None or swap_out.op != "_CopyFromGpuToHost":
                continue
            src = next(i for i in swap_out.input if not i.startswith("^"))
            tensor = src if ":" in src else f"{src}:0"
            found.append({
                "consumer": n.name, "port": port, "tensor": tensor,
                "trigger": control[0] if control else None,
                "out_trigger": (waiters.get(swap_out.name) or [None])[0],
            })
    return found


if __name__ == "__main__":
    _child(sys.argv[1])
