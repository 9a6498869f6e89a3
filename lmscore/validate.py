"""Validation: the simulator's prediction next to what TensorFlow really allocates.

:func:`validate` runs the graph on the CPU (:func:`lmscore.measure.measure`, TensorFlow's
allocation records of one traced step) and simulates it at the same batch size. Two
figures are compared:

- the *step* peak: feeds plus the transient allocations of the step (activations,
  gradients, temporaries), i.e. what the simulator has to predict;
- the *device* peak: the step peak plus persistent memory (variables, optimizer state,
  constants), i.e. what must fit in the accelerator.

The simulation models the kernels TensorFlow really ran on this CPU: oneDNN or Eigen, as
the allocator named in the records says (:attr:`lmscore.measure.Measurement.
kernel_library`, else :func:`lmscore.memory.cpu_kernel_library`). Their workspace is not
an accelerator's, which is why predictions use ``workspace="accelerator"`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, RunError
from .ir import Graph
from .memory import cpu_kernel_library, simulate
from .shapes import extend_sizes, resolve
from .timeline import Timeline, compare

if TYPE_CHECKING:
    from .tune import Progress


@dataclass(frozen=True)
class Validation:
    """Measured and simulated peaks of one graph at one batch size.

    Attributes
    ----------
    batch_size : int
    simulated_peak_bytes, measured_peak_bytes : int
        Device peak (persistent + feeds + transient).
    ratio : float
        ``simulated_peak_bytes / measured_peak_bytes``.
    simulated_transient_peak_bytes, measured_transient_peak_bytes : int
        Step peak (feeds + transient), without persistent memory.
    transient_ratio : float
        Their ratio: the accuracy of the liveness model itself.
    simulated_persistent_bytes, measured_persistent_bytes : int
    simulated_peak_level : int
    losses : tuple of float
        The loss after each step.
    finite : bool
        Whether losses and variables stayed finite (a NaN run proves nothing).
    kernel_library : str
        The CPU kernels that ran and were simulated: ``"onednn"`` or ``"eigen"``.
    replayed_peak_bytes : int
        Device peak simulated in the order the measured session ran its ops
        (:func:`lmscore.order.replayed`). TensorFlow's executor draws that order anew in
        each session, and where independent branches overlap the peak follows it;
        ``simulated_peak_bytes`` is the simulator's own order, which predictions use.
    replayed_ratio : float
        ``replayed_peak_bytes / measured_peak_bytes``: the memory model's accuracy with
        the session's order taken out.
    divergence : str
        Empty when the losses behave; otherwise why they do not (:func:`divergence`): the
        synthetic data make training blow up, which the peaks do not show.
    unknown_size_tensors : tuple of str
        Tensors whose size the simulation could not tell (counted as 0 bytes): where there
        are any, the simulated peak may fall short for want of them.
    xla_functions : tuple of str
        Functions of the step that XLA compiles (``jit_compile=True``; Keras 3 compiles a
        grouped convolution so). On the CPU their buffers are not in TensorFlow's
        allocation records, so the measured peak leaves them out, and the simulation
        counts their ops as TensorFlow would run them, where XLA fuses them: the ratio is
        no check of them (a grouped convolution's step simulated at 2.0 of measured).
    at_most_size_tensors : tuple of str
        Tensors whose size the data's values decide (``Where``, ``Unique``), simulated at
        the most they can be: on the synthetic data they may be smaller, and the ratio
        above 1 by their difference.
    """

    batch_size: int
    simulated_peak_bytes: int
    measured_peak_bytes: int
    ratio: float
    simulated_transient_peak_bytes: int
    measured_transient_peak_bytes: int
    transient_ratio: float
    simulated_persistent_bytes: int
    measured_persistent_bytes: int
    simulated_peak_level: int
    losses: tuple[float, ...]
    finite: bool
    kernel_library: str = ""
    replayed_peak_bytes: int = 0
    replayed_ratio: float = math.nan
    divergence: str = ""
    xla_functions: tuple[str, ...] = ()
    unknown_size_tensors: tuple[str, ...] = ()
    at_most_size_tensors: tuple[str, ...] = ()

    @property
    def diverged(self) -> bool:
        """Whether the synthetic data made the loss diverge (:attr:`divergence`)."""
        return bool(self.divergence)

    def as_dict(self) -> dict[str, Any]:
        """The ``lms validate --json`` object."""
        d = asdict(self)
        d["losses"] = list(self.losses)
        d["diverged"] = self.diverged
        d["xla_functions"] = list(self.xla_functions)
        d["unknown_size_tensors"] = list(self.unknown_size_tensors)
        d["at_most_size_tensors"] = list(self.at_most_size_tensors)
        return d


def xla_functions(graphdef: bytes) -> tuple[str, ...]:
    """Names of the functions of ``graphdef``'s library that XLA must compile.

    Examples
    --------
    >>> from tensorboard.compat.proto import graph_pb2
    >>> gd = graph_pb2.GraphDef()
    >>> f = gd.library.function.add()
    >>> f.signature.name = "block"
    >>> f.attr["_XlaMustCompile"].b = True
    >>> xla_functions(gd.SerializeToString())
    ('block',)
    """
    from tensorboard.compat.proto import graph_pb2

    gd = graph_pb2.GraphDef()
    gd.ParseFromString(graphdef)
    return tuple(sorted(
        f.signature.name for f in gd.library.function
        if "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b))


def validate(graph: Graph, batch_size: int, *, steps: int = 2, seed: int = 0,
             progress: Progress | None = None) -> Validation:
    """Run ``graph`` under TensorFlow and compare its measured peak with the simulation.

    Parameters
    ----------
    graph : Graph
        An imported training step (it keeps the GraphDef it came from).
    batch_size : int
    steps : int
        Steps to run; the last one is traced (the first warms up constants).
    seed : int
        Seed of the synthetic inputs and variable values.
    progress : callable, optional
        ``progress(fraction, message)`` as the run goes (as :func:`lmscore.tune.tune`).

    Returns
    -------
    Validation

    Raises
    ------
    RunError
        If TensorFlow cannot run the graph; the message says why.
    """
    if graph.graphdef is None:
        raise RunError(f"{graph.source}: no GraphDef to run (build the graph with lmscore.load)")
    report = progress or (lambda f, m: None)
    report(0.0, "starting TensorFlow")
    from .measure import measure

    report(0.3, f"running {max(steps, 2)} steps on the CPU")
    m = measure(graph.graphdef, batch_size, steps=max(steps, 2), seed=seed)
    report(0.9, "simulating")
    library = m.kernel_library or cpu_kernel_library()
    sizes = resolve(graph, batch_size)  # one resolution for both orders
    sim = simulate(graph, batch_size, sizes=sizes, workspace=library)
    replay = simulate(graph, batch_size, sizes=sizes, workspace=library, executed=m.executed)
    device = "CPU:0"
    measured_step = int(m.peak_bytes.get(device, 0))
    measured_persistent = int(m.persistent_bytes.get(device, 0))
    sim_step = sim.peak_bytes - sim.persistent_bytes
    measured_total = measured_step + measured_persistent
    return Validation(
        batch_size=batch_size,
        simulated_peak_bytes=sim.peak_bytes,
        measured_peak_bytes=measured_total,
        ratio=sim.peak_bytes / measured_total if measured_total else float("inf"),
        simulated_transient_peak_bytes=sim_step,
        measured_transient_peak_bytes=measured_step,
        transient_ratio=sim_step / measured_step if measured_step else float("inf"),
        simulated_persistent_bytes=sim.persistent_bytes,
        measured_persistent_bytes=measured_persistent,
        simulated_peak_level=sim.peak_level,
        losses=tuple(m.losses),
        finite=m.finite,
        kernel_library=library,
        replayed_peak_bytes=replay.peak_bytes,
        replayed_ratio=replay.peak_bytes / measured_total if measured_total else float("inf"),
        divergence=divergence(m.losses, m.finite),
        xla_functions=xla_functions(graph.graphdef),
        unknown_size_tensors=tuple(sizes.unknown),
        at_most_size_tensors=tuple(sizes.at_most),
    )


@dataclass(frozen=True)
class PlanValidation:
    """A rewrite checked on the emulated accelerator (CPU:0 device, CPU:1 host).

    Attributes
    ----------
    batch_size : int
    measured_device_peak_bytes, simulated_device_peak_bytes : dict
        ``{"original": ..., "rewritten": ...}``: device peak including persistent memory.
    measured_host_peak_bytes, simulated_host_peak_bytes : int
        Peak of the swapped tensors in host memory (rewritten graph).
    saving_ratio : float
        Measured device saving over simulated device saving (target >= 0.9), from the
        largest of the rewritten runs; NaN when the simulated saving is under 1% of the
        original peak (a ratio of two small differences says nothing).
    host_ratio : float
        Simulated over measured host peak (target within 10%).
    max_abs_diff : float
        Largest difference between the original and rewritten runs over the losses and
        every variable after all steps (0.0 = bit-identical), with Grappler off: the graph
        as given, as the simulator models it.
    losses : dict
        ``{"original": [...], "rewritten": [...]}``.
    finite : bool
    swapped_tensors : int
    recomputed_tensors : int
    rewritten_runs : tuple of int
        Measured device peak of each run of the rewritten step; ``measured_device_peak_bytes
        ["rewritten"]`` is the largest.
    timeline : Timeline or None
        That largest run against the simulation on one time axis
        (:func:`lmscore.timeline.compare`): what the device held at its peak that the
        simulation had freed, and when each swap really ran.
    max_abs_diff_grappler : float
        The same difference with both steps run under TensorFlow's default Grappler, as
        :func:`lmscore.swap` runs them (NaN when not measured): fused kernels and rewritten
        arithmetic, which an edge of the rewrite can change.
    losses_grappler : dict
        ``{"original": [...], "rewritten": [...]}`` under default Grappler.
    grappler_own_diff : float
        The original step with Grappler against without it (NaN when not measured): how
        far Grappler's own rewrites move the numbers, the yardstick of
        :attr:`max_abs_diff_grappler` (a chaotic model, a SIREN, moves by 0.4 in 3 steps).
    divergence : str
        Empty when the losses of the original step behave; otherwise why they do not
        (non-finite values, or the loss growing by orders of magnitude over the steps, see
        :func:`divergence`): the synthetic data make training blow up, and a difference
        of 0.0 between two blown-up runs says little.
    replayed_runs : tuple of int
        Device peak of the rewritten step simulated in the order each measured run started
        its device kernels (:func:`lmscore.order.replayed`; host ops as soon as they are
        ready), one per entry of ``rewritten_runs``: the memory model with the executor's
        order taken out.
    replayed_original_bytes : int
        The same for the original step's run (0 when not replayed).
    tuned_device_bytes, tuned_workspace : int, str
        The device memory and workspace model (:data:`lmscore.memory.WORKSPACES`) the plan
        was tuned for, from its parameters (0 and "" when it records none for this batch
        size): :attr:`within_tuned_device` measures the claim that it fits.
    kernel_library : str
        The CPU kernels the emulated accelerator ran (``"onednn"`` or ``"eigen"``), with
        a tuned plan.
    """

    batch_size: int
    measured_device_peak_bytes: dict[str, int]
    simulated_device_peak_bytes: dict[str, int]
    measured_host_peak_bytes: int
    simulated_host_peak_bytes: int
    saving_ratio: float
    host_ratio: float
    max_abs_diff: float
    losses: dict[str, list[float]]
    finite: bool
    swapped_tensors: int
    rewritten_runs: tuple[int, ...] = ()
    timeline: Timeline | None = None
    max_abs_diff_grappler: float = float("nan")
    losses_grappler: dict[str, list[float]] | None = None
    grappler_own_diff: float = float("nan")
    divergence: str = ""
    replayed_runs: tuple[int, ...] = ()
    replayed_original_bytes: int = 0
    recomputed_tensors: int = 0
    tuned_device_bytes: int = 0
    tuned_workspace: str = ""
    kernel_library: str = ""

    @property
    def within_tuned_device(self) -> bool | None:
        """Whether every measured run of the rewritten step stayed in the tuned-for device.

        None when the plan records no device memory for this batch size.
        """
        if not self.tuned_device_bytes:
            return None
        # (the rewritten step's measured peak is the largest of its runs)
        return self.measured_device_peak_bytes["rewritten"] <= self.tuned_device_bytes

    @property
    def diverged(self) -> bool:
        """Whether the synthetic data made the loss diverge (:attr:`divergence`)."""
        return bool(self.divergence)

    def as_dict(self) -> dict[str, Any]:
        """The ``lms validate --plan --json`` object (an undefined number is ``null``)."""
        d = asdict(self)
        d["diverged"] = self.diverged
        d["within_tuned_device"] = self.within_tuned_device
        for key in ("saving_ratio", "host_ratio", "max_abs_diff_grappler", "grappler_own_diff"):
            if math.isnan(d[key]):
                d[key] = None
        d["rewritten_runs"] = list(self.rewritten_runs)
        d["replayed_runs"] = list(self.replayed_runs)
        d["timeline"] = self.timeline.as_dict() if self.timeline is not None else None
        return d


#: Inter-op threads of the emulated accelerator's session. With TensorFlow's default for
#: a measurement (-1: kernels run in the calling thread) the host device's executor only
#: runs when the device's has nothing ready, so swap-outs, and every op that waits for one,
#: run late: a U-Net's plan measured 0.33, 0.86 and 1.07 of its predicted saving in three
#: runs. A GPU's copies and host ops run beside its kernels; two threads do the same here
#: (0.97-1.05 over three runs).
EMULATION_THREADS = 2


#: How many times its first value the loss may reach before a run counts as diverged:
#: two orders of magnitude. Training on the synthetic data of a few steps moves the loss by
#: percents (the zoo: under 10%); a blown-up step went from 1.1 to 2e15.
DIVERGENCE_FACTOR = 100.0


def divergence(losses: Sequence[float], finite: bool = True) -> str:
    """Why a run's losses show the step diverging, or ``""`` when they do not.

    Parameters
    ----------
    losses : sequence of float
        The loss after each step.
    finite : bool
        Whether the run's variables stayed finite too.

    Returns
    -------
    str
        One sentence, e.g. ``"the loss grew from 1.1 to 2e+15 in 3 steps"``.

    Examples
    --------
    >>> divergence([1.1, 3e7, 2e15])
    'the loss grew from 1.1 to 2e+15 in 3 steps (more than 100x)'
    >>> divergence([2.3, 2.2, 2.25])
    ''
    """
    values = list(losses)
    if not finite or not all(math.isfinite(x) for x in values):
        return "a loss or a variable became NaN or infinite"
    if len(values) < 2:
        return ""
    first, worst = abs(values[0]), max(abs(x) for x in values)
    if worst > DIVERGENCE_FACTOR * max(first, 1e-30):
        return (f"the loss grew from {values[0]:.3g} to {max(values, key=abs):.3g} in "
                f"{len(values)} steps (more than {DIVERGENCE_FACTOR:g}x)")
    return ""


def max_abs_diff(a: Any, b: Any) -> float:
    """Largest difference between two measurements' losses and final variables.

    Parameters
    ----------
    a, b : Measurement
        Runs of the same step (original and rewritten) with the same inputs.

    Returns
    -------
    float
        0.0 when they are bit-identical; NaN where one is NaN and the other is not.

    Raises
    ------
    RunError
        If a variable is missing from ``b`` or has another shape.
    """
    import numpy as np

    diffs = [abs(x - y) for x, y in zip(a.losses, b.losses, strict=True)]
    for name, value in a.variables.items():
        other = b.variables.get(name)
        if other is None or other.shape != value.shape:
            raise RunError(f"variable {name!r} differs in shape between the two runs")
        if value.size:
            diffs.append(float(np.max(np.abs(value.astype(np.float64) - other))))
    # max() drops NaN depending on its position: report it wherever it is
    if any(math.isnan(d) for d in diffs):
        return float("nan")
    return float(max(diffs, default=0.0))


def validate_plan(
    graph: Graph, plan: Any, batch_size: int, *, steps: int = 3, seed: int = 0, runs: int = 3,
    grappler: bool = True, progress: Progress | None = None,
) -> PlanValidation:
    """Run the original and the rewritten step on the emulated accelerator and compare.

    Both run on two CPU devices: the original entirely on CPU:0, the rewrite exported with
    real copies (swap-outs on CPU:1 as the host, swap-ins on CPU:0). Both get the same
    synthetic inputs and variables, so their losses and variables must be identical. Two
    executors sharing a thread pool do not order kernels the same way twice, so the
    rewritten step is measured ``runs`` times and judged by its largest peak.

    Parameters
    ----------
    graph : Graph
    plan : Plan
    batch_size : int
    steps : int
        Training steps to compare (the last one is traced).
    seed : int
    runs : int
        Measured runs of the rewritten step (at least 1).
    grappler : bool
        Also run both steps once more under TensorFlow's default Grappler, as
        :func:`lmscore.swap` does, and compare those numerics
        (:attr:`PlanValidation.max_abs_diff_grappler`); the Grappler-off runs measure
        memory, since the simulator models the graph as given.
    progress : callable, optional
        ``progress(fraction, message)`` before each run (as :func:`lmscore.tune.tune`).

    Returns
    -------
    PlanValidation
    """
    report = progress or (lambda f, m: None)
    report(0.0, "starting TensorFlow")
    from .evaluate import PlanEvaluation, evaluate_plan
    from .export import to_graphdef
    from .measure import measure
    from .plan import empty_plan
    from .rewrite import rewrite

    if graph.graphdef is None:
        raise RunError(f"{graph.source}: no GraphDef to run (build the graph with lmscore.load)")
    # Both on the same two-device runtime, so that its scheduling affects both alike.
    if runs < 1:
        raise ConfigError(f"runs must be at least 1, got {runs}")
    original, original_data = graph, graph.graphdef
    if plan.pin_schedule:
        # The same discipline for both: a pinned plan's original runs in its simulated
        # order too, or the saving compares one fixed order with whichever the executor
        # took. The numerics under default Grappler still compare with the step as given.
        original = rewrite(graph, replace(empty_plan(graph), pin_schedule=True)).graph
        original_data = to_graphdef(original, mode="emulate")

    # Resolved once: the pinned original and the rewritten step extend the graph's sizes.
    sizes = resolve(graph, batch_size)
    original_sizes = extend_sizes(sizes, original)

    def evaluate(library: str) -> PlanEvaluation:
        before = simulate(original, batch_size, sizes=original_sizes, workspace=library)
        return evaluate_plan(graph, plan, batch_size, workspace=library, before=before,
                             sizes=sizes)

    ev = evaluate(cpu_kernel_library())
    rw = ev.rewrite
    total = 1 + runs + (2 if grappler else 0)  # measured runs, each about as long
    report(0.05, "running the original step")
    m0 = measure(original_data, batch_size, steps=steps, seed=seed, devices=2,
                 inter_op_threads=EMULATION_THREADS)
    exported = to_graphdef(rw.graph, mode="emulate")
    dev = "CPU:0"
    rewritten = []
    for k in range(runs):
        report((1 + k) / total, f"running the rewritten step ({k + 1} of {runs})")
        rewritten.append(measure(exported, batch_size, steps=steps, seed=seed, devices=2,
                                 inter_op_threads=EMULATION_THREADS))
    peaks = [int(m.peak_bytes.get(dev, 0) + m.persistent_bytes.get(dev, 0)) for m in rewritten]
    m1 = rewritten[peaks.index(max(peaks))]
    library = m0.kernel_library or cpu_kernel_library()  # the CPU kernels that ran
    if library != cpu_kernel_library():
        ev = evaluate(library)
    sim0, sim1 = ev.before, ev.after
    rewritten_sizes = extend_sizes(sizes, rw.graph)
    replayed_runs = tuple(
        simulate(rw.graph, batch_size, sizes=rewritten_sizes, workspace=library,
                 executed=m.executed).peak_bytes
        for m in rewritten)
    replayed_original = simulate(original, batch_size, sizes=original_sizes,
                                 workspace=library, executed=m0.executed).peak_bytes
    measured = {
        "original": int(m0.peak_bytes.get(dev, 0) + m0.persistent_bytes.get(dev, 0)),
        "rewritten": int(m1.peak_bytes.get(dev, 0) + m1.persistent_bytes.get(dev, 0)),
    }
    simulated = {"original": sim0.peak_bytes, "rewritten": sim1.peak_bytes}
    host = int(m1.peak_bytes.get("CPU:1", 0))
    diff_grappler, losses_grappler, own = float("nan"), None, float("nan")
    if grappler:
        report((1 + runs) / total, "both steps again under default Grappler")
        g0, g1 = (
            measure(data, batch_size, steps=steps, seed=seed, devices=2,
                    inter_op_threads=EMULATION_THREADS, grappler=True)
            for data in (graph.graphdef, exported)
        )
        diff_grappler = max_abs_diff(g0, g1)
        own = max_abs_diff(m0, g0)
        losses_grappler = {"original": list(g0.losses), "rewritten": list(g1.losses)}
    sim_saving = simulated["original"] - simulated["rewritten"]
    meas_saving = measured["original"] - measured["rewritten"]
    return PlanValidation(
        batch_size=batch_size,
        measured_device_peak_bytes=measured,
        simulated_device_peak_bytes=simulated,
        measured_host_peak_bytes=host,
        simulated_host_peak_bytes=sim1.host_peak_bytes,
        saving_ratio=(meas_saving / sim_saving if sim_saving > 0.01 * simulated["original"]
                      else float("nan")),
        host_ratio=sim1.host_peak_bytes / host if host else float("nan"),
        max_abs_diff=max_abs_diff(m0, m1),
        losses={"original": list(m0.losses), "rewritten": list(m1.losses)},
        finite=m0.finite and m1.finite,
        swapped_tensors=len(rw.plan.swaps),
        recomputed_tensors=len(rw.plan.recomputes),
        rewritten_runs=tuple(peaks),
        timeline=compare(rw.graph, sim1, m1, dev),
        max_abs_diff_grappler=diff_grappler,
        losses_grappler=losses_grappler, grappler_own_diff=own,
        divergence=divergence(m0.losses, m0.finite),
        replayed_runs=replayed_runs,
        replayed_original_bytes=replayed_original,
        **_tuned_for(plan, batch_size),
    )


def _tuned_for(plan: Any, batch_size: int) -> dict[str, Any]:
    """The device memory and workspace model :func:`lmscore.tune.tune` made ``plan`` for.

    Empty unless the plan records them (a tuned plan does) for this batch size: at another
    batch the step is another step.
    """
    params = plan.params or {}
    device, workspace = params.get("device_bytes"), params.get("workspace")
    if (not isinstance(device, int) or device <= 0 or not isinstance(workspace, str)
            or params.get("batch_size", batch_size) != batch_size):
        return {}
    return {"tuned_device_bytes": device, "tuned_workspace": workspace,
            "kernel_library": cpu_kernel_library()}
