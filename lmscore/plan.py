"""Plans: the explicit list of rewrite decisions, as versioned JSON.

A :class:`Plan` makes one decision per tensor it names; a tensor it does not name is kept.
A swapped tensor (:class:`Swap`) is read back from the host by its far consumers, in
groups (one swap-in per group), each swap-in started by a trigger op (or synchronous). A
recomputed tensor (:class:`Recompute`) is computed a second time for its far consumers,
by clones of the ops that made it, which start after a trigger op. The plan also holds
the sync mode and the serialized levels. Plans come from the TFLMS knobs
(:func:`plan_from_params`), from the planners of :mod:`lmscore.tune`, or from hand edits
(:func:`add_swap`, :func:`remove_swap`, :func:`regroup`, :func:`move_trigger`,
:func:`add_recompute`, :func:`remove_recompute`); :func:`lmscore.rewrite.rewrite` applies
any of them, so every path is one path. Version 1 plans (swaps only) still load.

Candidate selection is a conjunction of small predicates (accelerator op, not state or
feed, rank >= 2, known size, a consumer beyond the threshold, scope and type filters).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import pathlib
import tempfile
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import ConfigError, PlanError
from .ir import Graph, op_signatures, reaches, shape_arithmetic, split_tensor
from .order import BACKWARD, FORWARD, Ordering, order
from .shapes import Sizes, resolve
from .swappable import (  # noqa: F401 - re-exported: plans are where they are used
    DEFAULT_PREDICATES,
    Predicate,
    known_size,
    on_accelerator,
    owns_memory,
    rank_at_least_2,
    running_readers,
    swap_refusal,
)

PLAN_VERSION = 2
#: Plan versions :func:`plan_from_json` reads (version 1 has no recomputes).
PLAN_VERSIONS = (1, 2)
SYNC_MODES = {0: "none", 1: "swap-outs", 2: "swap-ins", 3: "both"}
#: Levels searched around ``first consumer - ahead`` for a trigger.
DEFAULT_TRIGGER_WINDOW = 10
_FLOATS = frozenset({"float", "double", "half", "bfloat16"})


@dataclass(frozen=True)
class SwapIn:
    """One swap-in: the consumers it serves and the op that triggers it.

    Attributes
    ----------
    consumers : tuple of str
        Names of the ops that read the tensor through this swap-in.
    trigger : str or None
        Op after which the swap-in may start (a control edge); None = synchronous
        (it runs as soon as the swap-out is done).
    """

    consumers: tuple[str, ...]
    trigger: str | None = None


@dataclass(frozen=True)
class Swap:
    """A swapped tensor: one swap-out, one or more swap-ins.

    Attributes
    ----------
    tensor : str
        ``"op:port"``.
    swap_ins : tuple of SwapIn
    """

    tensor: str
    swap_ins: tuple[SwapIn, ...]


@dataclass(frozen=True)
class Recompute:
    """A recomputed tensor: clones of the ops that made it serve its far consumers.

    Attributes
    ----------
    tensor : str
        ``"op:port"``.
    ops : tuple of str
        The ops cloned, in a topological order: the tensor's producer and those of its
        ancestors whose outputs are recomputed too. Inputs from outside ``ops`` are read
        from the original tensors, which stay alive until the clones have run.
    consumers : tuple of str
        The ops that read the recomputed tensor instead of the original.
    trigger : str
        Op after which the clones may run (a control edge into every clone that reads no
        other clone): TensorFlow runs an op as soon as its inputs are ready, and without
        it the clones would run next to the originals.
    """

    tensor: str
    ops: tuple[str, ...]
    consumers: tuple[str, ...]
    trigger: str


@dataclass(frozen=True)
class Plan:
    """The decisions of a rewrite.

    Attributes
    ----------
    graph : str
        Fingerprint of the graph the plan was made for (:func:`fingerprint`).
    swaps : tuple of Swap
    recomputes : tuple of Recompute
    sync_mode : int
        0 none, 1 swap-outs synchronous, 2 swap-ins synchronous, 3 both.
    serialize : tuple of int
        Levels whose ops are chained by control edges.
    params : dict
        How the plan was made (knobs, tuner settings); informational.
    version : int
    pin_schedule : bool
        Chain the device ops of the rewritten step in the simulated order with control
        edges, so that the device runs them in that order and its peak is the simulated
        one. TensorFlow runs ready ops concurrently and in no fixed order: on the emulated
        accelerator one tuned U-Net plan measured 0.82 to 1.28 of its budget over runs
        unpinned, 0.886 three times pinned (simulated 0.885).
    schedule : tuple of str
        Device ops in the order they must run (version 2): each waits for the previous one
        by a control edge, before the swaps and recomputations are applied
        (:func:`lmscore.schedule.memory_schedule` makes one). Empty: the executor's order.
    """

    graph: str
    swaps: tuple[Swap, ...] = ()
    sync_mode: int = 0
    serialize: tuple[int, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    version: int = PLAN_VERSION
    pin_schedule: bool = False
    recomputes: tuple[Recompute, ...] = ()
    schedule: tuple[str, ...] = ()

    def swapped(self) -> tuple[str, ...]:
        """Names of the swapped tensors."""
        return tuple(s.tensor for s in self.swaps)

    def recomputed(self) -> tuple[str, ...]:
        """Names of the recomputed tensors."""
        return tuple(r.tensor for r in self.recomputes)

    def changes_nothing(self) -> bool:
        """Whether the rewrite of this plan is the step itself."""
        return not (self.swaps or self.recomputes or self.serialize or self.pin_schedule
                    or self.schedule)

    def to_json(self, indent: int | None = 2) -> str:
        """Serialize to the versioned JSON format (stable key order).

        Parameters
        ----------
        indent : int, optional
            Indentation of the text; None for the compact form (one line, no spaces),
            which is what the web app keeps in the page and sends with every edit.
        """
        doc = {
            "version": self.version,
            "graph": self.graph,
            "sync_mode": self.sync_mode,
            "serialize": list(self.serialize),
            "params": self.params,
            "swaps": [
                {
                    "tensor": s.tensor,
                    "swap_ins": [
                        {"consumers": list(g.consumers), "trigger": g.trigger}
                        for g in s.swap_ins
                    ],
                }
                for s in self.swaps
            ],
        }
        if self.pin_schedule:  # written only when set: older plans keep their bytes
            doc["pin_schedule"] = True
        if self.version >= 2:
            doc["recomputes"] = [
                {"tensor": r.tensor, "ops": list(r.ops), "consumers": list(r.consumers),
                 "trigger": r.trigger}
                for r in self.recomputes
            ]
        if self.schedule:
            doc["schedule"] = list(self.schedule)
        if indent is None:
            return json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n"
        return json.dumps(doc, indent=indent, sort_keys=True) + "\n"


_FINGERPRINTS: weakref.WeakKeyDictionary[Graph, str] = weakref.WeakKeyDictionary()


def fingerprint(graph: Graph) -> str:
    """A short digest of the graph's op names and types: plans name graphs by it."""
    fp = _FINGERPRINTS.get(graph)  # graphs are immutable; checking a plan asks often
    if fp is None:
        fp = _FINGERPRINTS[graph] = _digest(graph)
    return fp


def _digest(graph: Graph) -> str:
    h = hashlib.sha256()
    for op in graph.ops:
        if op.attrs.get("_lms_role"):
            continue  # a rewritten graph keeps the fingerprint of its original
        h.update(op.name.encode())
        h.update(b"\0")
        h.update(op.type.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def plan_from_json(text: str, source: str = "<plan>") -> Plan:
    """Parse a plan; every malformed field raises :class:`PlanError` naming it."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PlanError(f"{source}: not JSON ({e.msg if hasattr(e, 'msg') else e})") from None
    except RecursionError:
        raise PlanError(f"{source}: not a plan (JSON nested too deeply)") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise PlanError(f"{source}: not a plan ({' '.join(str(e).split())})") from None
    if not isinstance(doc, dict):
        raise PlanError(f"{source}: a plan is a JSON object")
    version = doc.get("version")
    if type(version) is not int or version not in PLAN_VERSIONS:
        raise PlanError(f"{source}: plan version {_short(version)} is not supported (expected "
                        f"{' or '.join(map(str, PLAN_VERSIONS))})")
    graph = _field(doc, "graph", str, source)
    sync = doc.get("sync_mode", 0)
    if not isinstance(sync, int) or sync not in SYNC_MODES:  # lists and dicts are unhashable
        raise PlanError(f"{source}: sync_mode must be 0-3, got {_short(sync)}")
    serialize = doc.get("serialize", [])
    if not isinstance(serialize, list) or not all(isinstance(x, int) for x in serialize):
        raise PlanError(f"{source}: serialize must be a list of levels")
    params = doc.get("params", {})
    if not isinstance(params, dict):
        raise PlanError(f"{source}: params must be an object")
    pin = doc.get("pin_schedule", False)
    if not isinstance(pin, bool):
        raise PlanError(f"{source}: pin_schedule must be true or false, got {_short(pin)}")
    swaps = []
    for k, s in enumerate(_field(doc, "swaps", list, source)):
        where = f"{source}: swaps[{k}]"
        if not isinstance(s, dict):
            raise PlanError(f"{where} must be an object")
        tensor = _field(s, "tensor", str, where)
        groups = []
        for j, g in enumerate(_field(s, "swap_ins", list, where)):
            gw = f"{where}.swap_ins[{j}]"
            if not isinstance(g, dict):
                raise PlanError(f"{gw} must be an object")
            consumers = _field(g, "consumers", list, gw)
            if not consumers or not all(isinstance(c, str) for c in consumers):
                raise PlanError(f"{gw}.consumers must be a non-empty list of op names")
            trigger = g.get("trigger")
            if trigger is not None and not isinstance(trigger, str):
                raise PlanError(f"{gw}.trigger must be an op name or null")
            groups.append(SwapIn(tuple(consumers), trigger))
        swaps.append(Swap(tensor, tuple(groups)))
    if version < 2 and "recomputes" in doc:
        raise PlanError(f"{source}: recomputes need plan version 2")
    recomputes = []
    listed = doc.get("recomputes", [])
    if not isinstance(listed, list):
        raise PlanError(f"{source}: field 'recomputes' must be a list")
    for k, r in enumerate(listed):
        where = f"{source}: recomputes[{k}]"
        if not isinstance(r, dict):
            raise PlanError(f"{where} must be an object")
        tensor = _field(r, "tensor", str, where)
        names = {}
        for key in ("ops", "consumers"):
            value = _field(r, key, list, where)
            if not value or not all(isinstance(c, str) for c in value):
                raise PlanError(f"{where}.{key} must be a non-empty list of op names")
            names[key] = tuple(value)
        trigger = _field(r, "trigger", str, where)
        recomputes.append(Recompute(tensor, names["ops"], names["consumers"], trigger))
    schedule = doc.get("schedule", [])
    if schedule and version < 2:
        raise PlanError(f"{source}: a schedule needs plan version 2")
    if not isinstance(schedule, list) or not all(isinstance(c, str) for c in schedule):
        raise PlanError(f"{source}: schedule must be a list of op names")
    return Plan(graph, tuple(swaps), sync, tuple(serialize), params, version, pin,
                tuple(recomputes), tuple(schedule))


def _short(value: Any) -> str:
    """``repr(value)`` cut to a length that fits in a one-line message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field(doc: dict, key: str, typ: type, where: str) -> Any:
    if key not in doc:
        raise PlanError(f"{where}: missing field {key!r}")
    if not isinstance(doc[key], typ):
        raise PlanError(f"{where}: field {key!r} must be a {typ.__name__}")
    return doc[key]


def load_plan(path: str | os.PathLike[str]) -> Plan:
    """Read a plan file (see :func:`plan_from_json`)."""
    p = pathlib.Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise PlanError(f"{p}: no such plan file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PlanError(f"{p}: cannot read the plan ({e})") from None
    return plan_from_json(text, str(p))


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place.

    Raises
    ------
    ConfigError
        If the destination cannot be written (missing directory, read-only...).
    """
    write_atomic_many([(path, data)])


def write_atomic_many(items: Sequence[tuple[str | os.PathLike[str], bytes | str]]) -> None:
    """Write several files all or nothing: every temporary file first, then the renames.

    Raises
    ------
    ConfigError
        If any destination cannot be written; then none is.
    """
    umask = os.umask(0)
    os.umask(umask)
    staged: list[tuple[str, pathlib.Path]] = []
    try:
        for path, data in items:
            p = pathlib.Path(path)
            blob = data.encode() if isinstance(data, str) else data
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp",
                                           dir=str(p.parent) or ".")
            except OSError as e:
                raise ConfigError(f"{p}: cannot write ({e.strerror})") from None
            staged.append((tmp, p))
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(blob)
                os.chmod(tmp, 0o666 & ~umask)
            except OSError as e:
                raise ConfigError(f"{p}: cannot write ({e.strerror})") from None
        for tmp, p in staged:
            try:
                os.replace(tmp, p)
            except OSError as e:
                raise ConfigError(f"{p}: cannot write ({e.strerror})") from None
    finally:
        for tmp, _ in staged:
            pathlib.Path(tmp).unlink(missing_ok=True)


def save_plan(plan: Plan, path: str | os.PathLike[str]) -> None:
    """Write ``plan`` as JSON, atomically."""
    write_atomic(path, plan.to_json())


# --- Candidates -------------------------------------------------------------------------

def in_scopes(scopes: Sequence[str]) -> Predicate:
    """The producer's name is in one of ``scopes`` (prefixes)."""
    def pred(graph: Graph, ordering: Ordering, sizes: Sizes, i: int, port: int) -> bool:
        return any(graph.ops[i].name.startswith(s) for s in scopes)
    return pred


def of_types(types: Iterable[str]) -> Predicate:
    """The producer's op type is one of ``types``."""
    wanted = frozenset(types)

    def pred(graph: Graph, ordering: Ordering, sizes: Sizes, i: int, port: int) -> bool:
        return graph.ops[i].type in wanted
    return pred


def negate(p: Predicate) -> Predicate:
    """Logical not of a predicate."""
    return lambda *a: not p(*a)


# --- What Grappler makes of the step --------------------------------------------------------
#
# The user's runtime (a ``tf.function``) runs Grappler's default optimizers, and oneDNN's
# layout pass on x86 CPUs, on the rewritten step. Both decide by the graph's structure, so
# an edge the rewrite adds or moves can change which kernels run, and so the last bits of
# every result, though the rewrite itself moves values only. Three causes were found on the
# zoo (tests/test_zoo_numerics.py), each ruled out below, in one place.

#: Op types a swap's control edge may start from (trigger) or end at (release). A control
#: input or output on an op can stop Grappler from fusing or rewriting it with its
#: neighbours, and so change the kernels that run: on the zoo, edges on every ``Sigmoid``
#: blocked oneDNN's ``x * Sigmoid(x)`` -> ``_MklSwish`` fusion (stochastic_depth_cnn), and
#: edges on a ``Mul`` made the arithmetic optimizer reassociate a GELU gradient's ``Mul``
#: chain otherwise (transformers: 7e-9, mixed precision: 6e-4 apart after 3 steps). Control
#: edges into and out of every op of the types below left losses and variables of 12 zoo
#: steps bit-identical under default Grappler, oneDNN on and off. Element-wise arithmetic,
#: activations, normalization pieces and reductions stay out even where they measured
#: harmless here: they are the inner nodes of Grappler's fusion patterns and of its
#: arithmetic rewrites. So do the ops oneDNN's layout pass merges with a neighbour:
#: ``Conv2DBackpropFilter`` + ``BiasAddGrad`` -> ``_MklNativeConv2DBackpropFilterWithBias``
#: is not merged when the ``BiasAddGrad`` waits for a swap-out (unet2d: 7e-9 apart, even
#: with Grappler off), and ``Pad`` + ``Conv2D``. Types not listed are never used (unknown
#: is not safe).
CONTROL_SAFE_OPS = frozenset({
    # contractions (the first node of a fusion, whose inputs the fused node keeps)
    "Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul", "BatchMatMulV2",
    # gradient kernels
    "Conv2DBackpropInput", "Conv3DBackpropInputV2",
    "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter", "MaxPoolGrad", "MaxPool3DGrad", "ReluGrad",
    "Relu6Grad", "SigmoidGrad", "RsqrtGrad", "StridedSliceGrad",
    "UnsortedSegmentSum",
    # pooling, the loss, gathers
    "MaxPool", "MaxPool3D", "SparseSoftmaxCrossEntropyWithLogits", "GatherV2",
    # data movement: whatever Grappler does to them, values do not change
    "Reshape", "Transpose", "Squeeze", "ExpandDims", "ConcatV2", "Pack", "Slice",
    "StridedSlice", "Tile", "BroadcastTo", "DynamicStitch", "TensorListStack",
    "TensorListFromTensor",
})


def control_safe(graph: Graph, i: int) -> bool:
    """Whether a swap's control edge may start or end at op ``i``.

    Used for triggers (:func:`find_trigger`) and release ops
    (:func:`lmscore.rewrite.rewrite`) alike: an op of :data:`CONTROL_SAFE_OPS` that is not
    itself a swap op.
    """
    op = graph.ops[i]
    return op.type in CONTROL_SAFE_OPS and not op.attrs.get("_lms_role")


#: Pooling gradients and the input through which oneDNN's layout pass finds the forward
#: op whose workspace they read: with oneDNN on, ``MaxPool3DGrad`` reading the pool's
#: output through a swap-in is not rewritten to the oneDNN kernel at all and routes the
#: gradient of tied maxima elsewhere (unet3d: loss 0.109 apart after 3 steps, even with
#: Grappler off).
_WORKSPACE_PAIRS = {
    "MaxPoolGrad": (frozenset({"MaxPool"}), 1),
    "MaxPoolGradV2": (frozenset({"MaxPoolV2"}), 1),
    "MaxPool3DGrad": (frozenset({"MaxPool3D"}), 1),
    "LRNGrad": (frozenset({"LRN"}), 2),
}
#: Sums whose result depends on the order of their inputs (three or more).
_AGGREGATES = frozenset({"AddN", "AccumulateNV2"})
#: Commutative, associative binary ops and the ops the arithmetic optimizer chains them
#: with (``MinimizeBroadcasts`` reassociates ``Mul`` and ``Add`` chains, ``AddOpsRewrite``
#: folds ``Add`` trees into one ``AddN``), in the order of their (sorted) inputs.
_CHAINS = {
    "Mul": frozenset({"Mul"}),
    "AddV2": frozenset({"AddV2", "Add", "AddN", "AccumulateNV2"}),
    "Add": frozenset({"AddV2", "Add", "AddN", "AccumulateNV2"}),
}


def keeps_tensor(
    graph: Graph, consumer: int, producer: int, port: int, exact: bool = True
) -> bool:
    """Whether ``consumer`` must read ``producer:port`` itself, never through a swap-in.

    Grappler's common-subgraph elimination sorts the inputs of commutative ops by name
    before the arithmetic optimizer runs, so a swap-in, named ``lms/swapin_...``, can move
    to another place among the inputs: an ``AddN`` then sums in another order (transformer
    gradients: 7e-9 apart), a ``Mul`` or ``AddV2`` chain is reassociated otherwise (GELU
    gradients under mixed precision: 6e-4). Such a consumer keeps the tensor when its
    sorted inputs would change order, and so does a pooling gradient that oneDNN pairs
    with its forward op (:data:`_WORKSPACE_PAIRS`). Candidates leave these consumers near.

    Parameters
    ----------
    graph : Graph
    consumer, producer : int
        Op indices; ``consumer`` reads output ``port`` of ``producer``.
    port : int
    exact : bool
        False keeps only the pooling pairs, whose loss another kernel changes outright,
        and lets a swap-in reorder a sum (the last bits of the results): what tuned plans
        do, which promise a peak rather than Grappler's summation order.

    Returns
    -------
    bool
    """
    op = graph.ops[consumer]
    adj = graph.adjacency
    data = adj.data_in[consumer]
    pair = _WORKSPACE_PAIRS.get(op.type)
    if pair is not None:
        types, k = pair
        if k < len(data) and data[k] == (producer, port) and graph.ops[producer].type in types:
            return True
    if not exact:
        return False
    if _swish_reads(graph, consumer, (producer, port)):
        return True
    if op.type in _AGGREGATES:
        if len(data) < 3:
            return False
    elif op.type in _CHAINS:
        family = _CHAINS[op.type]
        linked = any(graph.ops[p].type in family for p, _ in data) or any(
            graph.ops[s].type in family for s in adj.succs[consumer]
        )
        if not linked:
            return False
    else:
        return False
    return _reorders(graph, data, (producer, port))


def _swish_reads(graph: Graph, consumer: int, tensor: tuple[int, int]) -> bool:
    """Whether ``consumer`` is the ``Mul`` of a swish of ``tensor``.

    A swish is ``x * sigmoid(x)``, or ``x * sigmoid(beta * x)`` as Keras writes it.

    oneDNN's remapper fuses a convolution, its bias and a swish into one kernel only when
    the swish reads the convolution's output itself; through a swap-in they run apart and
    round otherwise (a BatchNorm CNN with swish trained with ``fit``: weights 3e-4 apart).
    """
    adj = graph.adjacency
    data = adj.data_in[consumer]
    if graph.ops[consumer].type != "Mul" or tensor not in data:
        return False

    def of_x(p: int) -> bool:  # x itself, or beta * x
        ins = tuple(adj.data_in[p])
        return ins[:1] == (tensor,) or (graph.ops[p].type == "Mul" and tensor in ins)

    return any(graph.ops[p].type == "Sigmoid" and adj.data_in[p]
               and (adj.data_in[p][0] == tensor or of_x(adj.data_in[p][0][0]))
               for p, _ in data)


def _spelled(graph: Graph, tensor: tuple[int, int]) -> str:
    """A data input as a NodeDef spells it (and Grappler sorts it): ``name`` or ``name:k``."""
    name = graph.ops[tensor[0]].name
    return name if tensor[1] == 0 else f"{name}:{tensor[1]}"


def _reorders(graph: Graph, data: Sequence[tuple[int, int]], tensor: tuple[int, int]) -> bool:
    """Whether naming ``tensor``'s swap-in instead moves it among the sorted ``data``.

    Any other input may be swapped too, so both its names are compared.
    """
    from .rewrite import swap_names  # rewrite imports this module

    def swap_in(t: tuple[int, int]) -> str:
        return swap_names(f"{graph.ops[t[0]].name}:{t[1]}", 1)[1][0]

    before, after = _spelled(graph, tensor), swap_in(tensor)
    for other in data:
        if other == tensor:
            continue
        for name in (_spelled(graph, other), swap_in(other)):
            if (before < name) != (after < name):
                return True
    return False


@dataclass(frozen=True)
class Candidate:
    """A tensor that may be swapped, with its far consumers.

    Attributes
    ----------
    tensor : str
    bytes : int
    producer_level : int
    far : tuple of str
        Consumers beyond the threshold, by level.
    near : tuple of str
        Consumers that keep reading the original tensor: those within the threshold and
        those that must (:func:`keeps_tensor`).
    """

    tensor: str
    bytes: int
    producer_level: int
    far: tuple[str, ...]
    near: tuple[str, ...]


def candidates(
    graph: Graph,
    sizes: Sizes,
    threshold: int,
    predicates: Sequence[Predicate] = DEFAULT_PREDICATES,
    exact: bool = True,
) -> tuple[Candidate, ...]:
    """Tensors with at least one consumer more than ``threshold`` levels after them.

    Consumers that must read the tensor itself (:func:`keeps_tensor`, with ``exact``) are
    never far. Only ops the step runs count (:attr:`lmscore.order.Ordering.needed`): a
    swap-in for a reader the step prunes would move bytes for nothing.
    """
    ordering = order(graph)
    lv = ordering.levels
    # the distance first, over every reader (those the step prunes only add): it rules out
    # most tensors at once (Ordering.reach is sorted by it), before any predicate
    reach = ordering.reach
    far_enough = bisect.bisect_left(reach, -threshold, key=lambda t: -t[0])
    out = []
    for _, i, port in sorted(reach[:far_enough], key=lambda t: (t[1], t[2])):
        op = graph.ops[i]
        if not all(p(graph, ordering, sizes, i, port) for p in predicates):
            continue
        readers = running_readers(ordering, i, port)
        if not readers or max([lv[c] for c in readers]) - lv[i] <= threshold:
            continue
        far = sorted(
            {c for c in readers
             if lv[c] - lv[i] > threshold
             and not keeps_tensor(graph, c, i, port, exact)},
            key=lambda c: (lv[c], c),
        )
        if not far:
            continue
        near = sorted(set(readers) - set(far))
        out.append(Candidate(
            tensor=f"{op.name}:{port}",
            bytes=sizes.nbytes[i][port],
            producer_level=lv[i],
            far=tuple(graph.ops[c].name for c in far),
            near=tuple(graph.ops[c].name for c in near),
        ))
    return tuple(out)


# --- Plans from parameters --------------------------------------------------------------


def plan_from_params(
    graph: Graph,
    batch_size: int,
    *,
    threshold: int = 5,
    ahead: int = 1,
    groupby: int = 5,
    sync_mode: int = 0,
    serialize: Sequence[int] = (),
    serialize_min_bytes: int | None = None,
    include_scopes: Sequence[str] = (),
    exclude_scopes: Sequence[str] = (),
    include_types: Sequence[str] = (),
    exclude_types: Sequence[str] = (),
    trigger_window: int = DEFAULT_TRIGGER_WINDOW,
    sizes: Sizes | None = None,
) -> Plan:
    """Make a plan from the TFLMS v2 knobs.

    Parameters
    ----------
    graph : Graph
    batch_size : int
    threshold : int
        Consumers more than ``threshold`` levels after the producer read from the host.
    ahead : int
        Swap-ins are triggered about ``ahead`` levels before their first consumer.
    groupby : int
        Far consumers within ``groupby`` levels of the group's first share one swap-in.
    sync_mode : int
        0-3, see :data:`SYNC_MODES`.
    serialize : sequence of int
        Levels whose ops are chained.
    serialize_min_bytes : int, optional
        Also serialize every level whose simulated device memory exceeds this.
    include_scopes, exclude_scopes, include_types, exclude_types : sequence of str
        Restrict candidates by producer name prefix and op type.
    trigger_window : int
        How many levels around ``ahead`` are searched for a trigger.
    sizes : Sizes, optional

    Returns
    -------
    Plan

    Raises
    ------
    ConfigError
        If a knob is out of range.
    """
    _check_knobs(threshold, ahead, groupby, sync_mode, trigger_window)
    sizes = sizes or resolve(graph, batch_size)
    preds = list(DEFAULT_PREDICATES)
    if include_scopes:
        preds.append(in_scopes(include_scopes))
    if exclude_scopes:
        preds.append(negate(in_scopes(exclude_scopes)))
    if include_types:
        preds.append(of_types(include_types))
    if exclude_types:
        preds.append(negate(of_types(exclude_types)))
    ordering = order(graph)
    swaps = []
    for cand in candidates(graph, sizes, threshold, preds):
        groups = group_consumers(graph, cand.far, groupby)
        swap_ins = tuple(
            SwapIn(g, find_trigger(graph, cand.tensor, g, ahead, trigger_window))
            for g in groups
        )
        swaps.append(Swap(cand.tensor, swap_ins))
    levels = set(serialize)
    if serialize_min_bytes is not None:
        from .memory import simulate

        sim = simulate(graph, batch_size, sizes=sizes)
        levels |= {k for k, v in enumerate(sim.device_curve) if v > serialize_min_bytes}
    for level in levels:
        if not 0 <= level < ordering.num_levels:
            raise ConfigError(f"serialize: level {level} is outside 0..{ordering.num_levels - 1}")
    return Plan(
        graph=fingerprint(graph),
        swaps=tuple(swaps),
        sync_mode=sync_mode,
        serialize=tuple(sorted(levels)),
        params={
            "batch_size": batch_size, "threshold": threshold, "ahead": ahead,
            "groupby": groupby, "sync_mode": sync_mode,
        },
    )


def _check_knobs(threshold: int, ahead: int, groupby: int, sync_mode: int, window: int) -> None:
    for name, value, low in (("threshold", threshold, 1), ("ahead", ahead, 1),
                             ("groupby", groupby, 0), ("trigger window", window, 0)):
        if not isinstance(value, int) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")
    if sync_mode not in SYNC_MODES:
        raise ConfigError(f"sync mode must be 0, 1, 2 or 3, got {sync_mode!r}")


def group_consumers(graph: Graph, consumers: Sequence[str], groupby: int) -> list[tuple[str, ...]]:
    """Group consumers (sorted by level): each group spans at most ``groupby`` levels."""
    lv = order(graph).levels
    idx = graph.index
    ordered = sorted(consumers, key=lambda c: (lv[idx[c]], idx[c]))
    groups: list[list[str]] = []
    for c in ordered:
        if groups and lv[idx[c]] - lv[idx[groups[-1][0]]] <= groupby:
            groups[-1].append(c)
        else:
            groups.append([c])
    return [tuple(g) for g in groups]


def find_trigger(
    graph: Graph, tensor: str, consumers: Sequence[str], ahead: int, window: int,
    exact: bool = True,
) -> str | None:
    """The op that should start a swap-in, or None when none fits (synchronous).

    The trigger lies about ``ahead`` levels before the group's first consumer, after the
    tensor's producer, on the accelerator (a forward or backward op), and must reach the
    first consumer, so the control edge cannot make a cycle, and must not wait for an op
    TensorFlow may merge with a consumer (:attr:`lmscore.ir.Graph.siblings`), nor be it,
    or the merged kernel would wait for itself. An op whose control output
    changes nothing Grappler does (:func:`control_safe`) is preferred anywhere in the
    window; without one, the swap-in is synchronous. Without ``exact`` (tuned plans, which
    promise a peak rather than Grappler's choices) the op nearest ``first - ahead`` is
    taken, a control-safe one among those of one level: a control edge into an op Grappler
    would fuse changes the last bits of the results, while a trigger far from its level
    brings the tensor back too early or too late. Levels are searched from
    ``first - ahead`` outwards (nearer first) within ``window`` levels.
    """
    ordering = order(graph)
    lv = ordering.levels
    idx = graph.index
    producer = idx[split_tensor(tensor)[0]]
    first = min((idx[c] for c in consumers), key=lambda c: (lv[c], c))
    target = lv[first] - ahead
    lowest = max(lv[producer] + 1, target - window)
    if lowest >= lv[first]:
        return None
    excluded = _after_siblings(graph, [idx[c] for c in consumers], lv[first], lv)
    order_of_levels = sorted(
        range(lowest, lv[first]), key=lambda level: (abs(level - target), level < target)
    )
    # The ancestors of the first consumer, found level by level, nearest first: the answer
    # is nearly always at the first level or two, and the whole walk back can hold
    # thousands of ops (DenseNet's backward pass). Every edge climbs a level, so the
    # ancestors at a level are all found once every ancestor above it is expanded.
    preds = graph.adjacency.preds
    seen = {first}
    waiting = [first]  # found, their predecessors not yet looked at
    at_level: dict[int, list[int]] = {}
    cats = ordering.categories
    for level in order_of_levels:
        stack = [i for i in waiting if lv[i] > level]
        if stack:
            waiting = [i for i in waiting if lv[i] <= level]
        while stack:
            for p in preds[stack.pop()]:
                if p not in seen and lv[p] >= lowest:
                    seen.add(p)
                    at_level.setdefault(lv[p], []).append(p)
                    (stack if lv[p] > level else waiting).append(p)
        ops = [i for i in at_level.get(level, ())
               if cats[i] in (FORWARD, BACKWARD) and i not in excluded
               and not shape_arithmetic(graph, i)]
        at = [i for i in ops if control_safe(graph, i)] or (None if exact else ops)
        if at:
            return graph.ops[min(at)].name
    return None


# --- Validation and hand edits -----------------------------------------------------------


def check_plan(graph: Graph, plan: Plan) -> None:
    """Check that ``plan`` fits ``graph``.

    Raises
    ------
    PlanError
        Naming the first problem: another graph, an unknown tensor, consumer or trigger,
        a consumer that does not read the tensor, a consumer served twice, a trigger that
        cannot reach its first consumer or runs before the producer, a level out of range.
    """
    if plan.version not in PLAN_VERSIONS:
        raise PlanError(f"plan version {plan.version} is not supported")
    if plan.version < 2 and plan.recomputes:
        raise PlanError("recomputes need plan version 2")
    if plan.graph != fingerprint(graph):
        raise PlanError(f"the plan was made for another graph (fingerprint {plan.graph}, "
                        f"{graph.source} has {fingerprint(graph)})")
    if plan.version < 2 and plan.schedule:
        raise PlanError("a schedule needs plan version 2")
    if plan.schedule:
        from .schedule import scheduled

        _check_schedule(graph, plan.schedule)
        graph = scheduled(graph, plan.schedule)  # swaps and recomputes apply to it
    ordering = order(graph)
    lv = ordering.levels
    idx = graph.index
    adj = graph.adjacency
    seen_tensors: set[str] = set()
    for s in plan.swaps:
        op_name, port = split_tensor(s.tensor)
        if s.tensor != f"{op_name}:{port}":  # "a" or "a:00" would rewire nothing
            raise PlanError(f"swap of {s.tensor!r}: name the tensor as op:port "
                            f"({op_name + ':' + str(port)!r})")
        if op_name not in idx or port >= len(graph.ops[idx[op_name]].outputs):
            raise PlanError(f"swap of unknown tensor {s.tensor!r}")
        if s.tensor in seen_tensors:
            raise PlanError(f"tensor {s.tensor!r} is swapped twice")
        seen_tensors.add(s.tensor)
        if not s.swap_ins:
            raise PlanError(f"swap of {s.tensor!r} has no swap-in")
        producer = idx[op_name]
        readers = set(adj.consumers.get((producer, port), ()))
        served: set[str] = set()
        for k, g in enumerate(s.swap_ins):
            if not g.consumers:
                raise PlanError(f"swap of {s.tensor!r}: swap-in {k} has no consumers")
            for c in g.consumers:
                if c not in idx:
                    raise PlanError(f"swap of {s.tensor!r}: unknown consumer {c!r}")
                if idx[c] not in readers:
                    raise PlanError(f"swap of {s.tensor!r}: {c!r} does not read it")
                if c in served:
                    raise PlanError(f"swap of {s.tensor!r}: consumer {c!r} is in two groups")
                served.add(c)
            if g.trigger is not None:
                if g.trigger not in idx:
                    raise PlanError(f"swap of {s.tensor!r}: unknown trigger {g.trigger!r}")
                problem = trigger_problem(graph, lv, producer, g)
                if problem:
                    raise PlanError(f"swap of {s.tensor!r}: {problem}")
    for r in plan.recomputes:
        _check_recompute(graph, ordering, r, seen_tensors)
    for level in plan.serialize:
        if not 0 <= level < ordering.num_levels:
            raise PlanError(f"serialize: level {level} is outside 0..{ordering.num_levels - 1}")


def _check_schedule(graph: Graph, names: Sequence[str]) -> None:
    """Raise :class:`PlanError` unless ``names`` is an order ``graph`` can run its ops in.

    Chaining each op after the previous closes a cycle exactly when a listed op depends
    on one listed after it: ``latest[i]``, the last list position among the listed
    ancestors of op ``i``, finds one in a single sweep in topological order.
    """
    idx = graph.index
    at: dict[int, int] = {}
    for k, name in enumerate(names):
        if name not in idx:
            raise PlanError(f"schedule: unknown op {name!r}")
        if idx[name] in at:
            raise PlanError(f"schedule: op {name!r} is listed twice")
        at[idx[name]] = k
    preds = graph.adjacency.preds
    latest: dict[int, int] = {}
    for i in order(graph).schedule:
        m = max((max(latest.get(p, -1), at.get(p, -1)) for p in preds[i]), default=-1)
        latest[i] = m
        if i in at and m > at[i]:
            raise PlanError(f"schedule: op {graph.ops[i].name!r} is listed before "
                            f"{names[m]!r}, which it depends on")


def _check_recompute(graph: Graph, ordering: Ordering, r: Recompute, seen: set[str]) -> None:
    """Raise :class:`PlanError` naming what makes ``r`` impossible (see :func:`check_plan`)."""
    idx = graph.index
    op_name, port = split_tensor(r.tensor)
    what = f"recompute of {r.tensor!r}"
    if r.tensor != f"{op_name}:{port}":
        raise PlanError(f"{what}: name the tensor as op:port ({op_name + ':' + str(port)!r})")
    if op_name not in idx or port >= len(graph.ops[idx[op_name]].outputs):
        raise PlanError(f"recompute of unknown tensor {r.tensor!r}")
    if r.tensor in seen:
        raise PlanError(f"tensor {r.tensor!r} is swapped or recomputed twice")
    seen.add(r.tensor)
    if op_name not in r.ops:
        raise PlanError(f"{what}: its producer {op_name!r} is not among the ops recomputed")
    if len(set(r.ops)) != len(r.ops):
        raise PlanError(f"{what}: an op is listed twice")
    for name in r.ops:
        if name not in idx:
            raise PlanError(f"{what}: unknown op {name!r}")
        reason = recompute_refusal(graph, ordering, idx[name])
        if reason:
            raise PlanError(f"{what}: op {name!r} cannot be recomputed: {reason}")
    adj = graph.adjacency
    members = {idx[n] for n in r.ops}
    position = {idx[n]: k for k, n in enumerate(r.ops)}
    reached = {idx[op_name]}
    stack = [idx[op_name]]
    while stack:
        i = stack.pop()
        for p, _ in adj.data_in[i]:
            if p in members:
                if position[p] > position[i]:
                    raise PlanError(f"{what}: {graph.ops[p].name!r} is listed after "
                                    f"{graph.ops[i].name!r}, which reads it")
                if p not in reached:
                    reached.add(p)
                    stack.append(p)
    stray = [graph.ops[i].name for i in members - reached]
    if stray:
        raise PlanError(f"{what}: {stray[0]!r} does not lead to the tensor")
    readers = set(adj.consumers.get((idx[op_name], port), ()))
    if len(set(r.consumers)) != len(r.consumers):
        raise PlanError(f"{what}: a consumer is listed twice")
    for c in r.consumers:
        if c not in idx:
            raise PlanError(f"{what}: unknown consumer {c!r}")
        if idx[c] not in readers:
            raise PlanError(f"{what}: {c!r} does not read it")
    if r.trigger not in idx:
        raise PlanError(f"{what}: unknown trigger {r.trigger!r}")
    problem = trigger_problem(graph, ordering.levels, idx[op_name],
                               SwapIn(r.consumers, r.trigger))
    if problem:
        raise PlanError(f"{what}: {problem}")


def trigger_problem(graph: Graph, lv: Sequence[int], producer: int, group: SwapIn) -> str:
    """Why ``group``'s (known) trigger cannot start its swap-in; empty if it can.

    The trigger must come after the producer, reach the group's first consumer (so its
    control edge closes no cycle) and not wait for an op TensorFlow may merge with one of
    the consumers (:attr:`lmscore.ir.Graph.siblings`).
    """
    idx = graph.index
    t = idx[group.trigger]  # type: ignore[index]
    consumers = [idx[c] for c in group.consumers]
    first = min(consumers, key=lambda c: (lv[c], c))
    if lv[t] <= lv[producer]:
        return (f"trigger {group.trigger!r} (level {lv[t]}) does not come after the producer "
                f"(level {lv[producer]})")
    if not reaches(graph, t, first, lv):
        return f"trigger {group.trigger!r} cannot reach consumer {graph.ops[first].name!r}"
    sib = graph.siblings
    for c in consumers:
        for b in sib.get(c, ()):
            if b == t or reaches(graph, b, t, lv):
                return (f"trigger {group.trigger!r} waits for {graph.ops[b].name!r}, which "
                        f"TensorFlow may merge with consumer {graph.ops[c].name!r} into one "
                        "kernel (oneDNN): that kernel would wait for itself")
    return ""


def _after_siblings(graph: Graph, consumers: Sequence[int], below: int,
                    lv: Sequence[int]) -> set[int]:
    """The ops below level ``below`` that are, or wait for, a sibling of a consumer.

    A swap-in triggered by one of them would make the consumer wait for the op TensorFlow
    may merge it with (:attr:`lmscore.ir.Graph.siblings`).
    """
    sib = graph.siblings
    out = {b for c in consumers for b in sib.get(c, ()) if lv[b] < below}
    succs = graph.adjacency.succs
    stack = list(out)
    while stack:
        for s in succs[stack.pop()]:
            if s not in out and lv[s] < below:
                out.add(s)
                stack.append(s)
    return out


def _far_readers(
    graph: Graph, plan: Plan, tensor: str, threshold: int, verb: str, done: str,
    refusal: Callable[[Ordering, int, int], str],
) -> tuple[str, ...]:
    """The checks a hand edit makes before it decides ``tensor``; its far readers.

    The tensor must exist, have no decision yet, not be refused (``refusal`` of its
    producer and port: why it cannot be ``done``) and have readers more than ``threshold``
    levels after it (else there is nothing to ``verb``).
    """
    for decided, already in ((plan.swapped(), "swapped"), (plan.recomputed(), "recomputed")):
        if tensor in decided:
            raise PlanError(f"tensor {tensor!r} is already {already}")
    op_name, port = split_tensor(tensor)
    if op_name not in graph.index or port >= len(graph.ops[graph.index[op_name]].outputs):
        raise PlanError(f"unknown tensor {tensor!r}")
    i = graph.index[op_name]
    ordering = order(graph)
    reason = refusal(ordering, i, port)
    if reason:
        raise PlanError(f"tensor {tensor!r} cannot be {done}: {reason}")
    lv = ordering.levels
    far = tuple(graph.ops[c].name for c in running_readers(ordering, i, port)
                if lv[c] - lv[i] > threshold)
    if not far:
        raise PlanError(f"tensor {tensor!r} has no consumer more than {threshold} level(s) "
                        f"after it: nothing to {verb}")
    return far


def remove_swap(plan: Plan, tensor: str) -> Plan:
    """The plan without the swap of ``tensor``."""
    if tensor not in plan.swapped():
        raise PlanError(f"tensor {tensor!r} is not swapped by this plan")
    return replace(plan, swaps=tuple(s for s in plan.swaps if s.tensor != tensor))


def add_swap(
    graph: Graph,
    plan: Plan,
    tensor: str,
    *,
    threshold: int = 1,
    ahead: int = 1,
    groupby: int = 5,
    window: int = DEFAULT_TRIGGER_WINDOW,
    sizes: Sizes | None = None,
) -> Plan:
    """The plan with ``tensor`` swapped for its consumers beyond ``threshold`` levels.

    The tensor must be swappable (:func:`swap_refusal`, the test the planners and the
    hotspot table apply), judged on ``sizes`` if the caller has them resolved, else at
    batch size 1 (the batch size decides no verdict).
    """
    far = _far_readers(graph, plan, tensor, threshold, "swap", "swapped",
                       lambda o, i, port: swap_refusal(graph, o, sizes or resolve(graph, 1), i,
                                                       port))
    groups = group_consumers(graph, far, groupby)
    swap = Swap(tensor, tuple(
        SwapIn(g, find_trigger(graph, tensor, g, ahead, window)) for g in groups
    ))
    new = replace(plan, swaps=plan.swaps + (swap,))
    check_plan(graph, new)
    return new


def regroup(graph: Graph, plan: Plan, tensor: str, groups: Sequence[Sequence[str]]) -> Plan:
    """Replace the consumer groups of ``tensor``; each new group gets its own trigger.

    A new group holding an old group's first consumer keeps that group's trigger if it can
    still start it (it runs after the producer and reaches the new group's first
    consumer). Any other group is triggered as far ahead of its own first consumer as the
    old group it shares a consumer with was (:func:`find_trigger`), or synchronously if
    that group was: an old trigger kept for a later group would bring the tensor back long
    before it is read. A group no old one shares a consumer with is synchronous.
    """
    old = _swap_of(plan, tensor)
    lv = order(graph).levels
    idx = graph.index
    producer = idx.get(split_tensor(tensor)[0])
    # consumer -> (the old group's trigger, its lead in levels, whether it was the first)
    was: dict[str, tuple[str | None, int, bool]] = {}
    for g in old.swap_ins:
        known = [c for c in g.consumers if c in idx]
        if not known:
            continue
        first = min(known, key=lambda c: (lv[idx[c]], idx[c]))
        lead = (lv[idx[first]] - lv[idx[g.trigger]]
                if g.trigger is not None and g.trigger in idx else 0)
        for c in known:
            was.setdefault(c, (g.trigger, lead, c == first))

    def trigger_for(consumers: tuple[str, ...]) -> str | None:
        if producer is None or not consumers or any(c not in idx for c in consumers):
            return None  # check_plan names the problem
        for c in consumers:  # an old group's first consumer: its trigger stays
            t, _, first = was.get(c, (None, 0, False))
            if first and t is not None and t in idx and not trigger_problem(
                    graph, lv, producer, SwapIn(consumers, t)):
                return t
        shared = next((was[c] for c in consumers if c in was), None)
        if shared is None or shared[0] is None:
            return None
        return find_trigger(graph, tensor, consumers, max(shared[1], 1),
                            DEFAULT_TRIGGER_WINDOW)

    swap = Swap(tensor, tuple(SwapIn(tuple(g), trigger_for(tuple(g))) for g in groups))
    new = replace(plan, swaps=tuple(swap if s.tensor == tensor else s for s in plan.swaps))
    check_plan(graph, new)
    return new


def move_trigger(
    graph: Graph, plan: Plan, tensor: str, group: int, trigger: str | None
) -> Plan:
    """Set the trigger of swap-in ``group`` of ``tensor`` (None = synchronous)."""
    old = _swap_of(plan, tensor)
    if not 0 <= group < len(old.swap_ins):
        raise PlanError(f"tensor {tensor!r} has no swap-in group {group}")
    groups = list(old.swap_ins)
    groups[group] = SwapIn(groups[group].consumers, trigger)
    swap = Swap(tensor, tuple(groups))
    new = replace(plan, swaps=tuple(swap if s.tensor == tensor else s for s in plan.swaps))
    check_plan(graph, new)
    return new


def _swap_of(plan: Plan, tensor: str) -> Swap:
    for s in plan.swaps:
        if s.tensor == tensor:
            return s
    raise PlanError(f"tensor {tensor!r} is not swapped by this plan")


#: Ops that call functions (loops, conditionals, calls): their clones would run the whole
#: function again, and the simulator sizes a function's body once, where it was called.
_CALLS = frozenset({
    "While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
    "PartitionedCall", "StatefulPartitionedCall",
})
_HANDLES = frozenset({"resource", "variant"})


def recompute_refusal(graph: Graph, ordering: Ordering, i: int) -> str:
    """Why op ``i`` is never recomputed ("" if it may be): the one definition.

    Only forward ops are recomputed (a clone among the gradient's ``Mul`` and ``AddN``
    chains changes how Grappler's arithmetic optimizer orders them: a transformer's
    variables came out 7e-9 apart), and only those whose clone provably computes the same
    values: no stateful op (a variable read may see a newer
    value, a stateful random op draws new numbers; a stateless random op such as Keras'
    ``Dropout`` mask reads its seed as a tensor, so its clone, reading the same seed, draws
    the same mask), no function call, nothing that reads or makes a resource or a variant
    (tensor lists).
    """
    op = graph.ops[i]
    if op.attrs.get("_lms_role"):
        return f"a {str(op.attrs['_lms_role']).replace('_', '-')} op"
    if ordering.categories[i] != FORWARD:
        return f"{ordering.categories[i]} op"
    if op.type in _CALLS:
        return "a loop or function call"
    sig = op_signatures().get(op.type)
    if sig is None:
        return f"unknown op type {op.type}"
    if sig["stateful"]:
        return "stateful (its clone would not reproduce its values)"
    dtypes = [graph.ops[p].outputs[q].dtype for p, q in graph.adjacency.data_in[i]]
    if any(d.removesuffix("_ref") in _HANDLES for d in dtypes) or any(
            o.dtype.removesuffix("_ref") in _HANDLES for o in op.outputs):
        return "reads or makes a resource or variant"
    return ""


def remove_recompute(plan: Plan, tensor: str) -> Plan:
    """The plan without the recomputation of ``tensor``."""
    if tensor not in plan.recomputed():
        raise PlanError(f"tensor {tensor!r} is not recomputed by this plan")
    return replace(plan, recomputes=tuple(r for r in plan.recomputes if r.tensor != tensor))


def add_recompute(
    graph: Graph,
    plan: Plan,
    tensor: str,
    *,
    threshold: int = 1,
    ahead: int = 1,
    window: int = DEFAULT_TRIGGER_WINDOW,
) -> Plan:
    """The plan with ``tensor`` recomputed by a clone of its producer for its far readers.

    The far readers are those more than ``threshold`` levels after the producer; the clone
    reads the producer's own inputs and starts after a trigger about ``ahead`` levels
    before the first of them (:func:`find_trigger`).
    """
    far = _far_readers(graph, plan, tensor, threshold, "recompute", "recomputed",
                       lambda o, i, port: recompute_refusal(graph, o, i))
    trigger = find_trigger(graph, tensor, far, ahead, window)
    if trigger is None:
        raise PlanError(f"tensor {tensor!r}: no op within {window} levels before its first far "
                        "consumer can start its recomputation")
    producer = split_tensor(tensor)[0]
    new = replace(plan, version=max(plan.version, 2),
                  recomputes=plan.recomputes + (Recompute(tensor, (producer,), far, trigger),))
    check_plan(graph, new)
    return new


def recompute_refused(graph: Graph, tensor: str, *, threshold: int = 1, ahead: int = 1) -> str:
    """Why :func:`add_recompute` would refuse ``tensor`` on a plan that decides nothing yet.

    "" if it would recompute it: the verdict of the hotspot table's recompute cell, so that
    the table offers exactly the edits a plan accepts.
    """
    try:
        add_recompute(graph, empty_plan(graph), tensor, threshold=threshold, ahead=ahead)
    except PlanError as e:
        return str(e)
    return ""


def empty_plan(graph: Graph) -> Plan:
    """A plan that swaps nothing."""
    return Plan(graph=fingerprint(graph))
