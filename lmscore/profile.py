"""A time model measured on the user's own device (``lms profile``, ``lms tune --profile``).

:func:`profile` runs the training step on the device at hand and records, from
TensorFlow's own tracing (``RunMetadata`` step stats under ``FULL_TRACE``, read by
:func:`lmscore.measure.measure`), how long each op's kernels take, the step's wall time
and the copy bandwidth between host and device. :func:`profiled_op_seconds` turns a
:class:`Profile` into the per-op seconds of :mod:`lmscore.tune`'s time model, in place of
a device preset's roofline, and :attr:`Profile.link_bandwidth` replaces the link preset.

What "step time" means here
---------------------------
The tuner models a device that runs one op at a time, beside one copy queue per
direction. The step is therefore profiled the way that model assumes: on one device, with
TensorFlow's executor running every kernel in the calling thread, one after the other
(``inter_op_threads=-1``, :mod:`lmscore.measure`), each kernel free to use every core
(intra-op threads, as a GPU kernel uses the whole GPU). With a pool of inter-op threads
independent ops overlap, and the step takes less than the sum of its ops by an amount
that depends on the order the executor happens to pick, which no per-op model can say.

An op's profiled time is the median over the traced steps of its kernels' compute time
plus the executor's per-kernel cost (``dispatch_seconds``, once per kernel that ran for
it: a lowered loop runs many). That cost is fitted once per profile: the median wall time
of the untraced steps, less the median kernel time of the traced steps that follow them,
per kernel. A first session only warms up (a process's first session ran 1.2-1.5x slower
than the later ones), and no untraced step follows a traced one (it could run 1.6x slower
while the trace was collected). Tracing itself adds time inside small kernels, so the fit
can be negative (an LSTM's thousands of loop kernels); then each op's time is kept at
zero or more.

The copy bandwidth is that of the tuner's link: on this CPU, the emulated accelerator's
(:mod:`lmscore.validate`): a ``DeepCopy`` from the device ``CPU:0`` to the host ``CPU:1``
and back, what the swaps of ``lms validate --plan`` run.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from .errors import ConfigError, RunError
from .ir import Graph
from .plan import fingerprint, write_atomic
from .shapes import Sizes, resolve
from .tune import Device, op_seconds

#: Untraced steps before the profiled ones.
WARMUP_STEPS = 6

__all__ = [
    "DEFAULT_STEPS", "Profile", "fitted_device", "load_profile", "measure_plan_seconds",
    "profile", "profile_from_json", "profiled_op_seconds", "save_profile",
]

#: Traced steps (per-op times) and untraced steps (wall time) of a profile, each.
DEFAULT_STEPS = 10
#: Bytes copied each way to measure the link: large enough that the copy, not the
#: executor, takes the time (a ResNet-50 activation at batch 8 is 25 MiB).
COPY_BYTES = 64 * 2**20
_FORMAT = "lms-profile"
_VERSION = 1
_COPY_OUT, _COPY_IN = "to_host", "to_device"
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Profile:
    """Per-op times of one training step measured on one device.

    Attributes
    ----------
    device : str
        The device the step ran on, as TensorFlow names it (``/device:CPU:0``).
    batch_size : int
    op_seconds : Mapping[str, float]
        Per op that ran, by name: the median over the traced steps of its kernels'
        compute time plus ``dispatch_seconds`` per kernel. Ops absent did not run (the
        runtime prunes what no output or stateful op needs).
    step_seconds : float
        Median wall time of the untraced steps.
    host_to_device_bandwidth, device_to_host_bandwidth : float
        Measured copy bandwidths, bytes per second.
    fingerprint : str
        :func:`lmscore.plan.fingerprint` of the profiled graph.
    tensorflow_version : str
    kernel_library : str
        ``"onednn"`` or ``"eigen"`` on a CPU (:attr:`lmscore.measure.Measurement.
        kernel_library`).
    dispatch_seconds : float
        The executor's fitted cost per kernel (see the module's notes).
    steps : int
        Traced steps, and untraced steps, measured.
    op_kernels : Mapping[str, int]
        Per op in ``op_seconds``: the kernels it ran per step (median); more than one for
        a loop or a function call, whose fixed cost per kernel does not grow with the batch.
    """

    device: str
    batch_size: int
    op_seconds: Mapping[str, float]
    step_seconds: float
    host_to_device_bandwidth: float
    device_to_host_bandwidth: float
    fingerprint: str
    tensorflow_version: str
    kernel_library: str
    dispatch_seconds: float = 0.0
    steps: int = DEFAULT_STEPS
    op_kernels: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def link_bandwidth(self) -> float:
        """The one bandwidth of the tuner's link: the harmonic mean of the two directions.

        A swapped tensor crosses once each way, and ``2 x bytes / harmonic mean`` is
        exactly the time of both copies.
        """
        a, b = self.host_to_device_bandwidth, self.device_to_host_bandwidth
        return 2 * a * b / (a + b)

    @property
    def modelled_step_seconds(self) -> float:
        """The step time the profile models: its ops' times, one after the other."""
        return math.fsum(self.op_seconds.values())

    def as_dict(self) -> dict[str, Any]:
        """The JSON object :func:`save_profile` writes (without the format header)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["op_seconds"] = dict(sorted(self.op_seconds.items()))
        d["op_kernels"] = dict(sorted(self.op_kernels.items()))
        return d


# --- Measuring -----------------------------------------------------------------------------


def profile(
    graph_or_path: Graph | str | os.PathLike[str],
    batch_size: int,
    *,
    device: str | None = None,
    steps: int = DEFAULT_STEPS,
    progress: Progress | None = None,
) -> Profile:
    """Run the step on this machine's device and measure its ops and its copies.

    Parameters
    ----------
    graph_or_path : Graph or path
        A training step loaded with :func:`lmscore.load` (it keeps its GraphDef), or a
        path :func:`lmscore.load` reads.
    batch_size : int
    device : {"CPU", "GPU"}, optional
        Default: a GPU when TensorFlow sees one, else the CPU. Profiling a GPU is not
        supported yet and is refused.
    steps : int
        Traced steps (per-op times, their median) and untraced steps (wall time), each,
        after one warm-up step.
    progress : callable, optional
        ``progress(fraction, message)``.

    Returns
    -------
    Profile

    Raises
    ------
    ConfigError
        For a bad argument, or a GPU.
    GraphError, RunError
        If the graph cannot be loaded or run.
    """
    import tensorflow as tf

    from .load import load
    from .measure import measure

    for label, value in (("batch_size", batch_size), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{label}: must be an integer >= 1, got {value!r}")
    gpus = tf.config.list_physical_devices("GPU")
    kind = (device or ("GPU" if gpus else "CPU")).upper()
    if kind not in ("CPU", "GPU"):
        raise ConfigError(f"device: must be CPU or GPU, got {device!r}")
    if kind == "GPU":
        # measure() runs CPU sessions only; a GPU's kernel times are in its stream stats
        raise ConfigError("device: profiling a GPU is not supported yet; pass device='CPU' "
                          "(lms profile --device CPU) to profile this machine's CPU")
    graph = graph_or_path if isinstance(graph_or_path, Graph) else load(graph_or_path)
    if graph.graphdef is None:
        raise RunError(f"{graph.source}: no GraphDef to run (build the graph with lmscore.load)")
    report = progress or (lambda f, m: None)
    report(0.0, "running the step")
    # A session of its own to warm up first: the first session of a process ran the MLP's
    # steps 1.2-1.5x slower than every later one (12.8 against 10.3 ms with Eigen), warm-up
    # steps within it or not, and a profile of those predicted the later steps that much
    # too slow.
    measure(graph.graphdef, batch_size, steps=WARMUP_STEPS, trace_step=0)
    report(0.2, "running the step, untraced then traced")
    m = measure(graph.graphdef, batch_size, steps=WARMUP_STEPS + steps, trace_step=0,
                op_time_steps=steps)
    report(0.8, "measuring the copies")
    to_device, to_host = _copy_bandwidths(steps)
    names = {op.name for op in graph.ops}
    # The untraced steps before any traced one: an untraced step right after a traced one
    # ran up to 1.6x slower at times (the trace is collected while it runs).
    walls = m.step_seconds[-2 * steps:-steps]
    wall = statistics.median(walls)
    dispatch = (wall - statistics.median(math.fsum(t for t, _ in s.values())
                                         for s in m.op_times)) / max(1, statistics.median(
        sum(k for _, k in s.values()) for s in m.op_times))
    seconds, kernels = {}, {}
    for name in names:
        runs = [s[name] for s in m.op_times if name in s]
        if runs:
            kernels[name] = max(1, round(statistics.median(k for _, k in runs)))
            seconds[name] = max(0.0, statistics.median(t for t, _ in runs)
                                + dispatch * statistics.median(k for _, k in runs))
    report(1.0, "done")
    return Profile(
        device="/device:CPU:0", batch_size=batch_size,
        op_seconds=MappingProxyType(dict(sorted(seconds.items()))), step_seconds=wall,
        host_to_device_bandwidth=to_device, device_to_host_bandwidth=to_host,
        fingerprint=fingerprint(graph), tensorflow_version=tf.__version__,
        kernel_library=m.kernel_library, dispatch_seconds=dispatch, steps=steps,
        op_kernels=MappingProxyType(dict(sorted(kernels.items()))))


def _copy_bandwidths(steps: int) -> tuple[float, float]:
    """Bytes per second of the emulated accelerator's copies, to the device and back.

    A step of ``COPY_BYTES`` fed to ``CPU:0``, copied to ``CPU:1`` and back with
    ``DeepCopy`` (what ``to_graphdef(mode="emulate")`` makes of a swap), run by
    :func:`lmscore.measure.measure` on the two devices; the median copy kernel time.
    """
    import tensorflow as tf

    from .measure import measure

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        with tf.device("/device:CPU:1"):
            out = tf.raw_ops.DeepCopy(x=x, name=_COPY_OUT)
        with tf.device("/device:CPU:0"):
            back = tf.raw_ops.DeepCopy(x=out, name=_COPY_IN)
            tf.reduce_sum(back[:1], name="loss")
    gdef = graph.as_graph_def()
    m = measure(gdef, COPY_BYTES // 4, steps=2, devices=2, op_time_steps=steps)
    per = []
    for name in (_COPY_IN, _COPY_OUT):
        times = [s[name][0] for s in m.op_times if name in s]
        if not times or statistics.median(times) <= 0:
            raise RunError(f"copy {name!r}: no kernel time in the step stats")
        per.append(COPY_BYTES / statistics.median(times))
    return per[0], per[1]


def measure_plan_seconds(
    graph: Graph, plan: Any, batch_size: int, *, steps: int = DEFAULT_STEPS, seed: int = 0
) -> tuple[float, float]:
    """Median step time of the original and of the rewritten step, emulated accelerator.

    Both run as :func:`lmscore.validate.validate_plan` runs them (two CPU devices, its
    threads; the original pinned in its simulated order when the plan pins its own), untraced
    after one warm-up step.

    Returns
    -------
    (float, float)
        Original and rewritten seconds.
    """
    from dataclasses import replace

    from .export import to_graphdef
    from .measure import measure
    from .plan import empty_plan
    from .rewrite import rewrite
    from .validate import EMULATION_THREADS

    original = graph.graphdef
    if plan.pin_schedule:
        original = to_graphdef(rewrite(graph, replace(empty_plan(graph), pin_schedule=True))
                               .graph, mode="emulate")
    rewritten = to_graphdef(rewrite(graph, plan).graph, mode="emulate")
    out = []
    for data in (original, rewritten):
        m = measure(data, batch_size, steps=steps + 2, seed=seed, devices=2, trace_step=0,
                    inter_op_threads=EMULATION_THREADS)
        out.append(statistics.median(m.step_seconds[1:]))
    return out[0], out[1]


# --- The time model ------------------------------------------------------------------------


def _work(graph: Graph, sizes: Sizes) -> tuple[list[float], list[float]]:
    """FLOPs and bytes moved of every op, as :func:`lmscore.tune.op_seconds` counts them."""
    inf = float("inf")
    flops = op_seconds(graph, sizes, Device("flops", 0, 1.0, inf, 0.0))
    moved = op_seconds(graph, sizes, Device("bytes", 0, inf, 1.0, 0.0))
    return flops, moved


def fitted_device(profile: Profile, graph: Graph, sizes: Sizes | None = None) -> Device:
    """The roofline device that best matches the profile (peak FLOP/s, bandwidth, launch).

    The launch cost is the median time of the ops with the least work (the quarter of the
    profiled ops that move the fewest bytes); the bandwidth and the peak are the median
    rates, net of the launch, of the ops whose time the bytes bound (under 4 FLOPs per
    byte) and of those the FLOPs bound (16 or more per byte). A class with no such op
    takes the other's rate.

    Parameters
    ----------
    profile : Profile
    graph : Graph
        The profiled graph.
    sizes : Sizes, optional
        Its sizes at the profile's batch (resolved when not given).
    """
    sizes = sizes or resolve(graph, profile.batch_size)
    flops, moved = _work(graph, sizes)
    ran = [(profile.op_seconds[op.name], flops[i], moved[i]) for i, op in enumerate(graph.ops)
           if op.name in profile.op_seconds]
    if not ran:
        raise ConfigError("profile: no op of the graph has a time")
    small = sorted(ran, key=lambda r: r[2])[: max(1, len(ran) // 4)]
    launch = statistics.median(t for t, _, _ in small)
    busy = [(t - launch, f, b) for t, f, b in ran if t > 2 * launch and b > 0]
    bw = [b / t for t, f, b in busy if f < 4 * b]
    peak = [f / t for t, f, b in busy if f >= 16 * b]
    bandwidth = statistics.median(bw) if bw else None
    flops_rate = statistics.median(peak) if peak else None
    if bandwidth is None and flops_rate is None:
        bandwidth = flops_rate = 1e12  # nothing but tiny ops: the launch cost is the model
    bandwidth = bandwidth or flops_rate / 4
    flops_rate = flops_rate or bandwidth * 16
    return Device(profile.device, 0, flops_rate, bandwidth, launch,
                  source=f"fitted to a profile of {profile.device} ({profile.kernel_library})")


def profiled_op_seconds(
    graph: Graph, sizes: Sizes, profile: Profile, model: Device | None = None
) -> list[float]:
    """Per-op seconds of ``graph`` at ``sizes``' batch, from a profile.

    At the profiled batch an op takes its profiled time. At another batch the fixed part of
    that time (``model``'s launch cost per kernel the op ran: a loop runs its body's
    kernels once per iteration, whatever the batch) stays, and the rest is scaled by the
    op's modelled cost ratio: its roofline time on ``model`` at the two batches. An op the
    profile lacks takes its original's time if it is a recomputation's
    clone (``_lms_clone_of``); a swap op takes none (its copy is the link's); any other op
    takes none if the graph is the profiled one (it did not run), else its roofline time.

    Parameters
    ----------
    graph : Graph
    sizes : Sizes
        ``graph``'s sizes at the batch to predict.
    profile : Profile
    model : Device, optional
        The roofline of the ratios; default :func:`fitted_device`.

    Returns
    -------
    list of float
        One time per op of ``graph``, in its order.
    """
    base = sizes if sizes.batch_size == profile.batch_size else resolve(graph,
                                                                        profile.batch_size)
    same = fingerprint(graph) == profile.fingerprint
    model = model or fitted_device(profile, graph, base if same else None)
    now = op_seconds(graph, sizes, model)
    then = now if base is sizes else op_seconds(graph, base, model)
    times = profile.op_seconds
    out = []
    for i, op in enumerate(graph.ops):
        name = op.attrs.get("_lms_clone_of", op.name)
        if op.attrs.get("_lms_role"):
            out.append(0.0)
        elif name in times:
            j = graph.index.get(name, i)
            t, launch = times[name], model.launch_seconds
            if then[j] > launch and now is not then:
                # without the scaling of a loop's per-kernel cost, an LSTM profiled at
                # batch 16 predicted batch 32 at 1.5-2.5x its measured step
                fixed = min(t, profile.op_kernels.get(name, 1) * launch)
                t = fixed + (t - fixed) * (now[j] - launch) / (then[j] - launch)
            out.append(t)
        else:
            out.append(0.0 if same else now[i])
    return out


# --- Files ---------------------------------------------------------------------------------


def save_profile(profile: Profile, path: str | os.PathLike[str]) -> None:
    """Write ``profile`` as JSON, atomically (a temporary file renamed into place)."""
    doc = {"format": _FORMAT, "version": _VERSION, **profile.as_dict()}
    write_atomic(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")


_FIELDS: dict[str, tuple[type, ...]] = {
    "device": (str,), "batch_size": (int,), "op_seconds": (dict,), "step_seconds": (float, int),
    "host_to_device_bandwidth": (float, int), "device_to_host_bandwidth": (float, int),
    "fingerprint": (str,), "tensorflow_version": (str,), "kernel_library": (str,),
    "dispatch_seconds": (float, int), "steps": (int,),
}
_POSITIVE = ("batch_size", "host_to_device_bandwidth", "device_to_host_bandwidth", "steps")


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read a profile written by :func:`save_profile`.

    Raises
    ------
    ConfigError
        One line naming the file and the field that is wrong.
    """
    p = pathlib.Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such profile file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a profile") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the profile ({e.__class__.__name__})") from None
    return profile_from_json(text, str(path))


def profile_from_json(text: str, source: str = "<profile>") -> Profile:
    """Parse a profile's JSON; a wrong field raises :class:`ConfigError` naming it."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise ConfigError(f"{source}: not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise ConfigError(f"{source}: not a profile (no \"format\": \"{_FORMAT}\")")
    if doc.get("version") != _VERSION:
        raise ConfigError(f"{source}: field 'version': unsupported profile version "
                          f"{doc.get('version')!r} (this lms reads {_VERSION})")
    for key, types in _FIELDS.items():
        value = doc.get(key)
        if value is None:
            raise ConfigError(f"{source}: field {key!r} is missing")
        if isinstance(value, bool) or not isinstance(value, types):
            raise ConfigError(f"{source}: field {key!r}: expected {types[0].__name__}, "
                              f"got {type(value).__name__}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{source}: field {key!r}: not a finite number")
        if key in _POSITIVE and value <= 0:
            raise ConfigError(f"{source}: field {key!r}: must be positive, got {value}")
    kernels = doc.get("op_kernels", {})
    if not isinstance(kernels, dict) or any(
            isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in kernels.values()):
        raise ConfigError(f"{source}: field 'op_kernels': expected a count >= 1 per op")
    for name, seconds in doc["op_seconds"].items():
        if (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                or not math.isfinite(seconds) or seconds < 0):
            raise ConfigError(f"{source}: field 'op_seconds': op {name!r} has "
                              f"{seconds!r}, not a time in seconds >= 0")
    return Profile(
        device=doc["device"], batch_size=doc["batch_size"],
        op_seconds=MappingProxyType({k: float(v) for k, v in doc["op_seconds"].items()}),
        step_seconds=float(doc["step_seconds"]),
        host_to_device_bandwidth=float(doc["host_to_device_bandwidth"]),
        device_to_host_bandwidth=float(doc["device_to_host_bandwidth"]),
        fingerprint=doc["fingerprint"], tensorflow_version=doc["tensorflow_version"],
        kernel_library=doc["kernel_library"], dispatch_seconds=float(doc["dispatch_seconds"]),
        steps=doc["steps"], op_kernels=MappingProxyType(kernels))
