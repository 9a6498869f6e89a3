"""Plans side by side, and a step's memory against its batch size.

:func:`compare_plans` evaluates several plans of one step at one batch size (the
unplanned step, the plan being edited, a saved one) with the one evaluation
(:func:`lmscore.evaluate.evaluate_plan`) and the tuner's time model
(:func:`lmscore.tune.plan_seconds`), so a plan made from the knobs or by hand gets a
predicted overhead too. :func:`batch_sweep` simulates the step over batch sizes and finds
the largest that fits a device (:func:`lmscore.memory.fits`) and the bound no plan can
pass (:func:`lmscore.tune.bound_batch`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .errors import ConfigError
from .evaluate import PlanEvaluation, evaluate_plan
from .ir import Graph, fixed_batch
from .memory import DEFAULT_SAFETY, Simulation, fit_margin, fits, host_memory_limit, simulate
from .plan import Plan
from .shapes import Sizes, resolve
from .tune import (
    DEVICES,
    _largest_by_margin,
    bound_batch,
    op_seconds,
    plan_seconds,
    preset,
    tune,
)


@dataclass(frozen=True)
class PlanSummary:
    """One plan of a comparison (:func:`compare_plans`).

    Attributes
    ----------
    name : str
        What the caller called it ("no plan", "current", a file name).
    peak_bytes, peak_level : int
        The rewritten step's device peak, and the original level it is drawn at.
    host_peak_bytes : int
    swapped_tensors, swap_bytes : int
        Tensors moved to host memory and their bytes.
    recomputed_tensors, cloned_ops, recompute_bytes : int
        Tensors recomputed, the ops cloned for them and the bytes those clones produce.
    base_seconds, step_seconds : float
        Predicted step time of the unplanned step and of this one (the tuner's model).
    overhead : float
        ``step_seconds / base_seconds - 1``, at least 0.
    fits : bool or None
        Whether it fits ``device_bytes`` (None when no device size was given).
    device_curve, host_curve : tuple of int
        Curves over the original graph's levels.
    skipped : int
        Swaps the rewrite could not place.
    """

    name: str
    peak_bytes: int
    peak_level: int
    host_peak_bytes: int
    swapped_tensors: int
    swap_bytes: int
    recomputed_tensors: int
    cloned_ops: int
    recompute_bytes: int
    base_seconds: float
    step_seconds: float
    overhead: float
    fits: bool | None
    device_curve: tuple[int, ...]
    host_curve: tuple[int, ...]
    skipped: int = 0


def summarize(name: str, ev: PlanEvaluation, seconds: tuple[float, float],
              device_bytes: int | None = None, safety: float = 1.0) -> PlanSummary:
    """A :class:`PlanSummary` of one evaluation and its ``(base, planned)`` step seconds."""
    clones = set(ev.rewrite.clones)
    graph = ev.rewrite.graph
    recompute_bytes = sum(b.bytes for b in ev.after.buffers
                          if not b.host and graph.ops[b.producer].name in clones)
    curve = ev.device_curve
    base, planned = seconds
    return PlanSummary(
        name=name, peak_bytes=ev.after.peak_bytes,
        peak_level=max(range(len(curve)), key=curve.__getitem__) if curve else 0,
        host_peak_bytes=ev.after.host_peak_bytes, swapped_tensors=len(ev.plan.swaps),
        swap_bytes=ev.swap_bytes, recomputed_tensors=len(ev.plan.recomputes),
        cloned_ops=len(ev.rewrite.clones), recompute_bytes=recompute_bytes,
        base_seconds=float(base), step_seconds=float(planned),
        overhead=float(max(0.0, planned / base - 1)) if base else 0.0,
        fits=None if device_bytes is None else ev.fits(device_bytes, safety,
                                                        host_memory_limit()),
        device_curve=curve, host_curve=ev.host_curve, skipped=len(ev.rewrite.skipped),
    )


def compare_plans(
    graph: Graph,
    plans: Mapping[str, Plan],
    batch_size: int,
    *,
    device: str = "V100",
    link: str = "pcie3",
    workspace: str = "accelerator",
    device_bytes: int | None = None,
    safety: float = DEFAULT_SAFETY,
    sizes: Sizes | None = None,
    before: Simulation | None = None,
) -> tuple[PlanSummary, ...]:
    """Evaluate each plan of ``graph`` at ``batch_size`` and predict its step time.

    Parameters
    ----------
    graph : Graph
    plans : mapping of str to Plan
        Names and plans, in the order wanted (an empty plan is the unplanned step).
    batch_size : int
    device, link : str
        Presets of the tuner's time model (:func:`lmscore.tune.plan_seconds`).
    workspace : str
        Kernel workspace model of the simulations.
    device_bytes : int, optional
        Device memory each plan is checked against (:func:`lmscore.memory.fits`, with
        TensorFlow's host memory limit, :func:`lmscore.memory.host_memory_limit`).
    safety : float
        Fraction of the free device memory the step may use (default the tuner's,
        :data:`lmscore.memory.DEFAULT_SAFETY`, so that "fits" here is ``tune``'s).
    sizes, before : optional
        The original step's sizes and simulation at this batch, if the caller has them.

    Returns
    -------
    tuple of PlanSummary
        In the order of ``plans``.

    Raises
    ------
    PlanError
        If a plan is not a plan of ``graph``.
    ConfigError
        For an unknown preset.
    """
    if sizes is None:
        sizes = resolve(graph, batch_size)
    if before is None:
        before = simulate(graph, batch_size, sizes=sizes, workspace=workspace)
    out = []
    for name, plan in plans.items():
        ev = evaluate_plan(graph, plan, batch_size, workspace=workspace, before=before,
                           sizes=sizes)
        secs = plan_seconds(graph, plan, batch_size, device=device, link=link,
                            workspace=workspace)
        out.append(summarize(name, ev, secs, device_bytes, safety))
    return tuple(out)


@dataclass(frozen=True)
class BatchSweep:
    """A step's peak memory and step time against its batch size (:func:`batch_sweep`).

    Attributes
    ----------
    batches : tuple of int
        Batch sizes, increasing.
    peak_bytes : tuple of int
        Simulated device peak of the unplanned step at each.
    step_seconds : tuple of float
        Its predicted step time (the tuner's model, ``device`` preset).
    plan_peak_bytes : tuple of int, optional
        Device peak with the given plan applied at each batch.
    device_bytes : int
        The device memory the step must fit.
    safety : float
    max_without : int
        Largest batch the unplanned step fits (0: not even batch 1).
    max_with_plan : int
        Largest batch of ``batches`` at which the plan fits (0 without a plan or none).
    bound : int
        Largest batch any plan could fit (:func:`lmscore.tune.bound_batch`; 0 when not
        asked for).
    bound_op : str
        The op whose working set sets that bound.
    plan_host_bytes : tuple of int, optional
        Host memory the plan's swapped tensors hold at once, at each batch.
    host_bytes : int
        Host memory swapped tensors may hold (TensorFlow's pinned host allocator limit,
        :func:`lmscore.memory.host_memory_limit`); a plan over it does not fit.
    next_batch : int
        The batch after the largest that fits (with the plan if one was given), where the
        tuner was asked whether any plan fits (0: not asked).
    next_limited_by : {"", "device", "host"}
        The tuner's answer there (:attr:`lmscore.tune.TuneResult.limited_by`): ``"host"``
        when its best plan fits the device but not host memory, ``""`` when it fits.
    next_message : str
        The tuner's one line about that batch.
    """

    batches: tuple[int, ...]
    peak_bytes: tuple[int, ...]
    step_seconds: tuple[float, ...]
    plan_peak_bytes: tuple[int, ...] | None
    device_bytes: int
    safety: float
    max_without: int
    max_with_plan: int = 0
    bound: int = 0
    bound_op: str = ""
    plan_host_bytes: tuple[int, ...] | None = None
    host_bytes: int = 0
    next_batch: int = 0
    next_limited_by: str = ""
    next_message: str = ""


def batch_grid(top: int, points: int = 10, extra: Sequence[int] = ()) -> tuple[int, ...]:
    """About ``points`` batch sizes from 1 to ``top``, spaced geometrically, plus ``extra``.

    >>> batch_grid(100, 5)
    (1, 3, 10, 32, 100)
    >>> batch_grid(8, 20, extra=(5,))
    (1, 2, 3, 4, 5, 6, 7, 8)
    """
    top = max(int(top), 1)
    n = max(points, 2)
    grid = {max(1, round(top ** (k / (n - 1)))) for k in range(n)}
    grid.update(int(b) for b in extra if 1 <= int(b) <= top)
    return tuple(sorted(grid))


def batch_sweep(
    graph: Graph,
    device_bytes: int,
    *,
    plan: Plan | None = None,
    batches: Sequence[int] | None = None,
    safety: float = DEFAULT_SAFETY,
    device: str = "V100",
    workspace: str = "accelerator",
    limit: int = 1 << 16,
    bound: bool = True,
    points: int = 10,
    host_bytes: int | None = None,
    ask_tuner: bool = False,
    link: str = "pcie3",
    strategy: str = "hybrid",
    progress: Callable[[float, str], None] | None = None,
) -> BatchSweep:
    """Simulate ``graph`` over batch sizes against a device of ``device_bytes``.

    Parameters
    ----------
    graph : Graph
    device_bytes : int
        Device memory (the budget line).
    plan : Plan, optional
        A plan of ``graph`` also evaluated at every batch (a plan names tensors, so it
        applies at any batch; where it swaps is what was chosen at its own batch).
    batches : sequence of int, optional
        Default: :func:`batch_grid` up to twice the largest batch that fits unplanned
        (and past the bound), with that batch and the next one included.
    safety : float
        Fraction of the free device memory the step may use (:func:`lmscore.memory.fits`;
        default the tuner's, :data:`lmscore.memory.DEFAULT_SAFETY`).
    device : str
        Preset of the time model.
    workspace : str
    limit : int
        Largest batch tried when searching.
    bound : bool
        Also find the batch no plan can pass (:func:`lmscore.tune.bound_batch`).
    points : int
        Batch sizes of the default grid.
    host_bytes : int, optional
        Host memory a plan may hold (default :func:`lmscore.memory.host_memory_limit`).
    ask_tuner : bool
        Also run the tuner (:func:`lmscore.tune.tune`, ``strategy``, ``link``) at the batch
        after the largest that fits, to say whether device or host memory stops a larger
        batch. It costs one tuning run.
    link, strategy : str
        Of that tuning run.
    progress : callable, optional
        ``progress(fraction, message)`` as the batch sizes are simulated.

    Returns
    -------
    BatchSweep

    Raises
    ------
    ConfigError
        If the graph's feeds fix its batch (every batch would be the same step).
    """
    fixed = fixed_batch(graph)
    if fixed is not None:
        raise ConfigError(f"the graph's batch dimension is fixed at {fixed}; trace the step "
                          "with an unknown batch (None) to see memory against batch size")
    dev = DEVICES[preset(device, DEVICES, "device")]
    host = host_memory_limit() if host_bytes is None else host_bytes
    memo: dict[int, tuple[Sizes, Simulation]] = {}
    report = progress or (lambda f, m: None)

    def at(b: int) -> tuple[Sizes, Simulation]:
        if b not in memo:
            # the searches go up and down by halves: the fraction done is only a hint
            report(min(0.9, 0.03 * len(memo)), f"simulating batch {b}")
            sizes = resolve(graph, b)
            memo[b] = sizes, simulate(graph, b, sizes=sizes, workspace=workspace)
        return memo[b]

    without = _largest_by_margin(lambda b: (fit_margin(at(b)[1], device_bytes, safety), None),
                                 limit)[0]
    bound_b, bound_op = (bound_batch(graph, device_bytes, device=device, safety=safety,
                                     workspace=workspace, limit=limit) if bound else (0, ""))
    bound_b = max(bound_b, without) if bound else 0  # the unplanned step is a plan too
    if batches is None:
        top = min(max(2 * without, 2, bound_b + bound_b // 4), limit)
        batches = batch_grid(top, points, (without, without + 1))
    grid = tuple(sorted({int(b) for b in batches if int(b) >= 1}))
    peaks = tuple(at(b)[1].peak_bytes for b in grid)
    seconds = tuple(float(sum(op_seconds(graph, at(b)[0], dev))) for b in grid)
    plan_peaks = plan_host = None
    best = 0
    if plan is not None:
        evs = []
        for k, b in enumerate(grid):
            report(0.9 * (k + 1) / len(grid), f"the plan at batch {b}")
            evs.append(evaluate_plan(graph, plan, b, workspace=workspace, before=at(b)[1],
                                     sizes=at(b)[0]))
        plan_peaks = tuple(ev.after.peak_bytes for ev in evs)
        plan_host = tuple(ev.after.host_peak_bytes for ev in evs)
        # a plan fits only where host memory holds what it swaps, as in lmscore.memory.fits
        best = max((b for b, ev in zip(grid, evs, strict=True)
                    if fits(ev.after, device_bytes, safety, host_bytes=host)), default=0)
    nxt, limited, said = 0, "", ""
    if ask_tuner:
        nxt = (best if plan is not None else without) + 1
        report(0.92, f"asking the tuner about batch {nxt}")
        res = tune(graph, nxt, device_bytes, device=device, link=link, safety=safety,
                   strategy=strategy, workspace=workspace, host_memory=host)
        limited, said = ("" if res.fits else res.limited_by or "device"), res.message
    report(1.0, "done")
    return BatchSweep(grid, peaks, seconds, plan_peaks, device_bytes, safety, without, best,
                      bound_b, bound_op, plan_host, host, nxt, limited, said)
