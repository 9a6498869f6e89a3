"""What a viewer of a step needs beyond the simulation: its data edges and a name search.

The studio draws a window of levels op by op (:func:`lmsviz.figures.window_traces`) from
the edge table of :func:`data_edges`, built once per graph and batch, and finds an op or
a tensor by name over the whole graph with :func:`find`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .ir import Graph
from .shapes import Sizes


@dataclass(frozen=True)
class DataEdges:
    """Every data edge of a graph, as parallel arrays.

    Attributes
    ----------
    src, port, dst : ndarray of int64
        Producer op, its output port and the consumer op of each edge.
    nbytes : ndarray of int64
        Bytes of the tensor carried (0 when unknown).
    """

    src: np.ndarray
    port: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray

    def __len__(self) -> int:
        return len(self.src)


def data_edges(graph: Graph, sizes: Sizes | None = None) -> DataEdges:
    """The data edges of ``graph``, with tensor sizes from ``sizes`` when given.

    A consumer reading one tensor twice has one edge.

    Examples
    --------
    >>> from lmscore.ir import Graph, Op, TensorSpec
    >>> f = (TensorSpec("float", (2, 2)),)
    >>> g = Graph((Op("x", "Placeholder", outputs=f),
    ...            Op("a", "MatMul", inputs=("x:0", "x:0"), outputs=f),
    ...            Op("b", "Relu", inputs=("a:0",), outputs=f)))
    >>> e = data_edges(g)
    >>> e.src.tolist(), e.dst.tolist(), e.nbytes.tolist()
    ([0, 1], [1, 2], [0, 0])
    """
    src: list[int] = []
    port: list[int] = []
    dst: list[int] = []
    for j, ins in enumerate(graph.adjacency.data_in):
        for p, k in dict.fromkeys(ins):
            src.append(p)
            port.append(k)
            dst.append(j)
    s = np.asarray(src, dtype=np.int64)
    k = np.asarray(port, dtype=np.int64)
    if sizes is None:
        nb = np.zeros(len(s), dtype=np.int64)
    else:
        nb = np.asarray([max(sizes.nbytes[a][b], 0) for a, b in zip(src, port, strict=True)],
                        dtype=np.int64)
    return DataEdges(s, k, np.asarray(dst, dtype=np.int64), nb)


@dataclass(frozen=True)
class Match:
    """An op or tensor found by :func:`find`.

    Attributes
    ----------
    name : str
        The op's name, or the tensor's (``"op:port"``).
    op : int
        Index of the op (the tensor's producer).
    port : int or None
        The tensor's output port; None for an op.
    """

    name: str
    op: int
    port: int | None = None

    @property
    def is_tensor(self) -> bool:
        """Whether a tensor (not an op) was named."""
        return self.port is not None


def find(graph: Graph, query: str, limit: int = 20) -> tuple[Match, ...]:
    """Ops and tensors of ``graph`` whose names match ``query``, best first.

    An exact name (an op, or a tensor ``"op:port"``) comes first; then, ignoring case,
    names that start with it, names whose last scope component starts with it, and names
    that contain it, shorter names first within each.

    Parameters
    ----------
    graph : Graph
    query : str
        Surrounding blanks are ignored; an empty query finds nothing.
    limit : int
        At most this many matches.

    Returns
    -------
    tuple of Match

    Examples
    --------
    >>> from lmscore.ir import Graph, Op, TensorSpec
    >>> f = (TensorSpec("float", (2,)),)
    >>> g = Graph((Op("conv1/x", "Placeholder", outputs=f),
    ...            Op("block/conv1", "Relu", inputs=("conv1/x:0",), outputs=f),
    ...            Op("conv1", "Relu", inputs=("block/conv1:0",), outputs=f)))
    >>> [m.name for m in find(g, "conv1")]
    ['conv1', 'conv1/x', 'block/conv1']
    >>> find(g, "conv1:0")
    (Match(name='conv1:0', op=2, port=0),)
    """
    q = query.strip()
    if not q or limit <= 0:
        return ()
    name, sep, port = q.rpartition(":")
    if sep and port.isdigit() and name in graph.index:
        i = graph.index[name]
        if int(port) < len(graph.ops[i].outputs):
            return (Match(q, i, int(port)),)
    low = q.lower()
    ranked: list[tuple[int, int, int]] = []
    for i, op in enumerate(graph.ops):
        n = op.name
        if n == q:
            rank = 0
        else:
            nl = n.lower()
            if nl.startswith(low):
                rank = 1
            elif nl.rpartition("/")[2].startswith(low):
                rank = 2
            elif low in nl:
                rank = 3
            else:
                continue
        ranked.append((rank, len(n), i))
    ranked.sort()
    return tuple(Match(graph.ops[i].name, i) for _, _, i in ranked[:limit])
