"""What a tensor must be for a swap to be offered: the one definition of "swappable".

The predicates of :func:`lmscore.plan.candidates` by default and :func:`swap_refusal`,
which says why a tensor is refused; apart from :mod:`lmscore.plan` so that the hotspot
table of ``lms inspect`` (:func:`lmscore.memory.live_tensor`) asks without importing plans.
"""

from __future__ import annotations

from collections.abc import Callable

from .ir import Graph
from .order import BACKWARD, FORWARD, Ordering
from .shapes import Sizes

_FLOATS = frozenset({"float", "double", "half", "bfloat16"})

Predicate = Callable[[Graph, Ordering, Sizes, int, int], bool]


def on_accelerator(graph: Graph, ordering: Ordering, sizes: Sizes, i: int, port: int) -> bool:
    """The producer computes on the accelerator: a forward or backward op."""
    return ordering.categories[i] in (FORWARD, BACKWARD) and not graph.ops[i].attrs.get(
        "_lms_role"
    )


def rank_at_least_2(graph: Graph, ordering: Ordering, sizes: Sizes, i: int, port: int) -> bool:
    """The tensor is a matrix or more (activations, not scalars or shape vectors)."""
    shape = sizes.shapes[i][port]
    return shape is not None and len(shape) >= 2 and graph.ops[i].outputs[port].dtype in _FLOATS


def known_size(graph: Graph, ordering: Ordering, sizes: Sizes, i: int, port: int) -> bool:
    """Its size is known (unknown sizes cannot be accounted for)."""
    return sizes.nbytes[i][port] > 0


def owns_memory(graph: Graph, ordering: Ordering, sizes: Sizes, i: int, port: int) -> bool:
    """The tensor is not a view of a variable, constant or feed (those stay resident)."""
    from .memory import ALIAS_OPS

    adj = graph.adjacency
    seen = 0
    while graph.ops[i].type in ALIAS_OPS and adj.data_in[i] and seen < 64:
        i, port = adj.data_in[i][port if graph.ops[i].type == "IdentityN" else 0]
        seen += 1
    return ordering.categories[i] not in ("persistent", "input")


def running_readers(ordering: Ordering, i: int, port: int) -> tuple[int, ...]:
    """The distinct ops that read output ``port`` of op ``i`` and that the step runs.

    A reader the step prunes (:attr:`lmscore.order.Ordering.needed`) never runs: a swap-in
    or a recomputation for it would move or compute bytes for nothing, so no swap, hand
    edit or hotspot row counts it.
    """
    needed = ordering.needed
    readers = ordering.graph.adjacency.consumers.get((i, port), ())
    return tuple([c for c in dict.fromkeys(readers) if needed[c]])


def _refusal_of_placement(graph: Graph, ordering: Ordering, i: int) -> str:
    role = graph.ops[i].attrs.get("_lms_role")
    return f"a {role.replace('_', '-')} op" if role else f"{ordering.categories[i]} tensor"


def _refusal_of_shape(graph: Graph, sizes: Sizes, i: int, port: int) -> str:
    shape = sizes.shapes[i][port]
    return "rank < 2" if shape is None or len(shape) < 2 else "not floating-point"


#: What a tensor must be for a swap to be offered, and why it is not when it is not: the
#: one definition of "swappable" (:func:`swap_refusal`), whose predicates
#: :func:`lmscore.plan.candidates` applies by default.
_SWAPPABLE: tuple[tuple[Predicate, Callable[..., str]], ...] = (
    (on_accelerator, lambda g, o, s, i, p: _refusal_of_placement(g, o, i)),
    (rank_at_least_2, lambda g, o, s, i, p: _refusal_of_shape(g, s, i, p)),
    (known_size, lambda g, o, s, i, p: "unknown size"),
    (owns_memory, lambda g, o, s, i, p: "view of a variable, constant or feed"),
)

DEFAULT_PREDICATES: tuple[Predicate, ...] = tuple(pred for pred, _ in _SWAPPABLE)


def swap_refusal(graph: Graph, ordering: Ordering, sizes: Sizes, i: int, port: int) -> str:
    """Why output ``port`` of op ``i`` is never offered for swapping ("" if it may be).

    The tensor must also have a consumer more than ``threshold`` levels later to be a
    candidate (:func:`lmscore.plan.candidates`); this is what holds whatever the threshold.
    """
    for pred, reason in _SWAPPABLE:
        if not pred(graph, ordering, sizes, i, port):
            return reason(graph, ordering, sizes, i, port)
    return ""
