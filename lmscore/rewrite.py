"""Apply a swap plan: a new graph with swap-outs, swap-ins, rewired consumers and triggers.

For a swapped tensor ``t = p:0`` read near by ``a`` and far by ``c1``, ``c2``::

    before:   p --t--> a            after:   p --t--> a
              p --t--> c1                    p --t--> lms/swapout_p_0 (host)
              p --t--> c2                    lms/swapout_p_0 --> lms/swapin_p_0_0 (device)
                                             trigger ..ctl..> lms/swapin_p_0_0
                                             lms/swapin_p_0_0 --> c1, c2

Sync mode 1 adds ``swapout ..ctl..> s`` for every other successor ``s`` of ``p`` (compute
waits for the copy out); sync mode 2 adds ``swapin ..ctl..> s`` for every successor ``s`` of
the trigger (compute waits for the copy in); mode 3 both. Serialization chains the ops of
each chosen level: ``o1 ..ctl..> o2 ..ctl..> o3``.

Swap ops are ``Identity`` ops marked ``_lms_role`` (``swap_out``/``swap_in``); export turns
them into host/accelerator placements (or real copies on the emulated accelerator).

A recomputed tensor ``t = p:0``, made by ``q -> p`` from a kept ``x``, read near by ``a``
and far by ``c``::

    before:   x -> q -> p --t--> a         after:   x -> q -> p --t--> a
                        p --t--> c                  x -> lms/recompute_p_0/q
                                                          -> lms/recompute_p_0/p --> c
                                                    trigger ..ctl..> lms/recompute_p_0/q

Clones are copies of their originals (same type and attributes, marked ``_lms_clone_of``)
that read clones of the ops recomputed with them and the original tensors otherwise.

Names are deterministic. A swap whose edges would make a cycle is skipped and reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .errors import GraphError, PlanError
from .ir import Graph, Op, lint, shape_arithmetic, split_tensor
from .order import SHAPE_ONLY_OPS, order
from .plan import Plan, Swap, check_plan, control_safe, running_readers
from .schedule import chained_ops, scheduled

SWAP_OUT, SWAP_IN = "swap_out", "swap_in"
RECOMPUTE = "recompute"  # a role in the list of added ops only: clones are ordinary ops


@dataclass(frozen=True)
class Rewrite:
    """Result of :func:`rewrite`.

    Attributes
    ----------
    graph : Graph
        The rewritten graph (linted).
    plan : Plan
        The plan that was applied (without the skipped swaps).
    swap_outs, swap_ins : tuple of str
        Names of the added ops.
    synchronous : tuple of str
        Swap-ins without a trigger.
    clones : tuple of str
        Names of the recomputing ops added.
    skipped : tuple of (str, str)
        ``(tensor, reason)`` for swaps that could not be placed.
    """

    graph: Graph
    plan: Plan
    swap_outs: tuple[str, ...]
    swap_ins: tuple[str, ...]
    synchronous: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]
    clones: tuple[str, ...] = ()


def swap_names(tensor: str, groups: int) -> tuple[str, list[str]]:
    """Deterministic names of the swap-out and swap-ins of ``tensor``.

    >>> swap_names("block1/conv:0", 2)
    ('lms/swapout_block1/conv_0', ['lms/swapin_block1/conv_0_0', 'lms/swapin_block1/conv_0_1'])
    """
    base = _base(tensor)
    return f"lms/swapout_{base}", [f"lms/swapin_{base}_{k}" for k in range(groups)]


def recompute_names(tensor: str, ops: tuple[str, ...]) -> dict[str, str]:
    """Deterministic names of the clones that recompute ``tensor``, by original op.

    >>> recompute_names("block1/relu:0", ("block1/conv", "block1/relu"))["block1/conv"]
    'lms/recompute_block1/relu_0/block1/conv'
    """
    base = _base(tensor)
    return {op: f"lms/recompute_{base}/{op}" for op in ops}


def _base(tensor: str) -> str:
    return re.sub(r"[^A-Za-z0-9_./-]", "_", tensor.replace(":", "_"))


def rewrite(graph: Graph, plan: Plan) -> Rewrite:
    """Apply ``plan`` to ``graph`` and lint the result.

    Parameters
    ----------
    graph : Graph
        The original training step.
    plan : Plan
        Checked against the graph first (:func:`lmscore.plan.check_plan`).

    Returns
    -------
    Rewrite

    Raises
    ------
    PlanError
        If the plan does not fit the graph.
    """
    check_plan(graph, plan)
    if plan.schedule:
        graph = scheduled(graph, plan.schedule)
    try:
        new, added = _apply(graph, plan, plan.swaps)
        lint(new)
        skipped: list[tuple[str, str]] = []
        kept = plan.swaps
    except GraphError:
        # Some swap's sync edges close a cycle: add swaps one at a time, skip the culprits.
        kept_list: list[Swap] = []
        skipped = []
        for s in plan.swaps:
            try:
                lint(_apply(graph, plan, (*kept_list, s))[0])
                kept_list.append(s)
            except GraphError as e:
                skipped.append((s.tensor, str(e).split(": ", 1)[-1]))
        kept = tuple(kept_list)
        new, added = _apply(graph, plan, kept)
        lint(new)
    _check_rewired(new, plan, kept)
    outs = tuple(n for n, role in added if role == SWAP_OUT)
    ins = tuple(n for n, role in added if role == SWAP_IN)
    sync = tuple(
        name for s in kept
        for name, g in zip(swap_names(s.tensor, len(s.swap_ins))[1], s.swap_ins, strict=True)
        if g.trigger is None
    )
    clones = tuple(n for n, role in added if role == RECOMPUTE)
    return Rewrite(new, replace(plan, swaps=kept), outs, ins, sync, tuple(skipped), clones)


def _apply(
    graph: Graph, plan: Plan, swaps: tuple[Swap, ...]
) -> tuple[Graph, list[tuple[str, str]]]:
    ops = {op.name: op for op in graph.ops}
    order_names = [op.name for op in graph.ops]
    extra_ctl: dict[str, list[str]] = {}
    added: list[tuple[str, str]] = []
    releases: list[tuple[str, str]] = []  # (swap-out, tensor) without synchronous swap-outs
    adj = graph.adjacency
    for s in swaps:
        producer, port = split_tensor(s.tensor)
        spec = ops[producer].outputs[port]
        out_name, in_names = swap_names(s.tensor, len(s.swap_ins))
        out_name = _unique(out_name, ops)
        ops[out_name] = Op(
            out_name, "Identity", inputs=(s.tensor,), outputs=(spec,),
            attrs={"_lms_role": SWAP_OUT, "_lms_tensor": s.tensor},
        )
        order_names.append(out_name)
        added.append((out_name, SWAP_OUT))
        served: set[str] = set()
        for k, (name, g) in enumerate(zip(in_names, s.swap_ins, strict=True)):
            name = _unique(name, ops)
            ops[name] = Op(
                name, "Identity", inputs=(f"{out_name}:0",),
                control_inputs=(g.trigger,) if g.trigger else (),
                outputs=(spec,),
                attrs={"_lms_role": SWAP_IN, "_lms_tensor": s.tensor, "_lms_group": k},
            )
            order_names.append(name)
            added.append((name, SWAP_IN))
            for c in g.consumers:
                op = ops[c]
                ops[c] = replace(op, inputs=tuple(
                    f"{name}:0" if t == s.tensor else t for t in op.inputs
                ))
                served.add(c)
            if plan.sync_mode in (2, 3) and g.trigger:
                t_idx = graph.index[g.trigger]
                for succ in adj.succs[t_idx]:
                    extra_ctl.setdefault(graph.ops[succ].name, []).append(name)
        if plan.sync_mode in (1, 3):
            p_idx = graph.index[producer]
            for succ in adj.succs[p_idx]:
                succ_name = graph.ops[succ].name
                if succ_name not in served:
                    extra_ctl.setdefault(succ_name, []).append(out_name)
        else:
            releases.append((out_name, s.tensor))
    for r in plan.recomputes:
        names = recompute_names(r.tensor, r.ops)
        names = {o: _unique(n, ops) for o, n in names.items()}
        cloned = set(r.ops)
        for o in r.ops:
            src = graph.ops[graph.index[o]]  # the original, whatever was rewired since
            producers = [split_tensor(t) for t in src.inputs]
            inputs = tuple(f"{names[p]}:{port}" if p in cloned else t
                           for t, (p, port) in zip(src.inputs, producers, strict=True))
            roots = () if any(p in cloned for p, _ in producers) else (r.trigger,)
            ops[names[o]] = replace(
                src, name=names[o], inputs=inputs,
                control_inputs=tuple(dict.fromkeys((*src.control_inputs, *roots))),
                attrs={**src.attrs, "_lms_clone_of": o, "_lms_tensor": r.tensor},
            )
            order_names.append(names[o])
            added.append((names[o], RECOMPUTE))
        producer, port = split_tensor(r.tensor)
        for c in r.consumers:
            op = ops[c]
            ops[c] = replace(op, inputs=tuple(
                f"{names[producer]}:{port}" if t == r.tensor else t for t in op.inputs
            ))
    if plan.serialize:
        ordering = order(graph)
        for level in plan.serialize:
            chain = [graph.ops[i].name for i in ordering.by_level[level]]
            for a, b in zip(chain, chain[1:], strict=False):
                extra_ctl.setdefault(b, []).append(a)
    for name, ctl in extra_ctl.items():
        op = ops[name]
        ops[name] = replace(op, control_inputs=tuple(dict.fromkeys((*op.control_inputs, *ctl))))
    new = graph.derive(
        (ops[n] for n in order_names), source=f"{graph.source} (rewritten)"
    )
    if releases:
        new = _released(new, releases, exact=not plan.pin_schedule)
    if plan.pin_schedule:
        new = _pinned(new)
    return new, added


def _pinned(graph: Graph) -> Graph:
    """Chain the device ops of ``graph`` in its simulated (FIFO) order with control edges.

    The chain follows a topological order, so it closes no cycle, and it leaves the
    simulated order as it was: only the executor loses its freedom to run ready ops in
    another order or at once. Swap-outs run on the host and stay out; so do feeds,
    variables and constants (the executor has them before the step starts) and ops the
    step prunes. Every other op is chained, also ops whose control edges change what
    Grappler or oneDNN fuse (:func:`lmscore.plan.control_safe`): left out of the chain,
    they run out of order again (a GPT-like decoder's tuned plan measured 1.003 and 1.082
    of its budget in two runs), and the promise of a peak is worth more than the last
    bits a fusion changes (see the README)::

        before:  a -> b ;  a -> c        (b and c ready together, either may run first)
        after:   a -> b ;  a -> c ; b ->^ c
    """
    ordering = order(graph)
    chain = chained_ops(graph, ordering, ordering.schedule)
    return scheduled(graph, [graph.ops[i].name for i in chain])


def _released(graph: Graph, releases: list[tuple[str, str]], exact: bool) -> Graph:
    """Make the next op after each swapped tensor's last device reader wait for its swap-out.

    TensorFlow's executor runs an op as soon as its inputs are ready, and nothing needs a
    swap-out until a swap-in reads it: left alone, a swap-out can run long after its
    tensor's last device reader (on the emulated accelerator it ran only when the backward
    pass first needed a swap-in), and the device buffer stays allocated until it does.
    Making the next op wait for the copy frees the buffer where the simulation frees it.
    The op taken is the next one after the last reader in the rewritten step's own order
    that the step needs (TensorFlow prunes the others) and, with ``exact``, whose control
    input changes nothing Grappler does (:func:`lmscore.plan.control_safe`: a Shape may be
    folded, a Sigmoid not fused); without it (pinned plans, which promise a peak) the next
    op that allocates on the device, a swap-in included, but not one TensorFlow may merge
    with another (:attr:`lmscore.ir.Graph.siblings`): waiting for a swap-out, a bias
    gradient is left out of oneDNN's merge with its filter gradient and sums in another
    order (a tuned plan of a small CNN: one bias 2.3e-9 apart after 3 steps, Grappler on or
    off). It may come before the swap-out in that order (both were ready when ``p`` ended,
    and the executor took it first): the swap-out reads ``p`` alone, so no op after ``p``'s
    last reader is among its ancestors, and no release edge closes a cycle (each goes
    forward in the order that puts every swap-out right after its producer)::

        before:  p -> c (near) ;  p -> swapout -> swapin -> far
                 schedule ... p ... c, r ..., swapout
        after:   the same, plus  swapout ->^ r   (r: the op after c in the schedule)
    """
    ordering = order(graph)
    pos = ordering.position
    needed = ordering.needed
    schedule = ordering.schedule
    ops = list(graph.ops)
    merged = graph.siblings  # a control input keeps oneDNN from merging them
    for out_name, tensor in releases:
        producer, port = split_tensor(tensor)
        out = graph.index[out_name]
        p = graph.index[producer]
        # Readers the step prunes never run, so they hold nothing (a tape's gradient
        # nobody applies): waiting for them put the release after the backward pass.
        last = max((pos[c] for c in running_readers(ordering, p, port) if c != out),
                   default=pos[p])
        release = None
        # walked by position: a slice of the schedule would copy the rest of the step for
        # each swap, when the op sought is nearly always among the next few
        for k in range(last + 1, len(schedule)):
            i = schedule[k]
            if i == out:
                continue
            if exact:
                if needed[i] and control_safe(graph, i) and not shape_arithmetic(graph, i):
                    release = i
                    break
            elif (needed[i] and ops[i].outputs and ops[i].type not in SHAPE_ONLY_OPS
                  and ops[i].attrs.get("_lms_role") != SWAP_OUT and i not in merged
                  and not shape_arithmetic(graph, i)):
                # the next op that allocates on the device, a swap-in included: where
                # the simulation frees (a swap-in allowed to run first held its buffer
                # beside the swapped one: ResNet-50 at batch 1,232, 1.6 GiB over a plan
                # whose model fitted)
                release = i
                break
        if (release is not None and out_name not in ops[release].control_inputs
                and out_name not in ops[release].inputs):
            op = ops[release]
            ops[release] = replace(op, control_inputs=(*op.control_inputs, out_name))
    return graph.derive(ops, source=graph.source)



def _unique(name: str, ops: dict[str, Op]) -> str:
    if name not in ops:
        return name
    k = 1
    while f"{name}_{k}" in ops:
        k += 1
    return f"{name}_{k}"


def _check_rewired(graph: Graph, plan: Plan, swaps: tuple[Swap, ...]) -> None:
    """No consumer served from the host or by a clone still reads the original tensor."""
    for s in swaps:
        for g in s.swap_ins:
            for c in g.consumers:
                if s.tensor in graph.op(c).inputs:
                    raise PlanError(
                        f"rewrite left {c!r} reading {s.tensor!r} without its swap-in"
                    )
    for r in plan.recomputes:
        for c in r.consumers:
            if r.tensor in graph.op(c).inputs:
                raise PlanError(f"rewrite left {c!r} reading {r.tensor!r}, not its clone")
