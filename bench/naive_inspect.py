#!/usr/bin/env python
"""A naive single-pass memory simulation of a GraphDef: the yardstick for ``lms inspect``.

What anyone would write in an afternoon, written competently: parse the GraphDef (the
same compiled protos ``lmscore`` reads), Kahn levels over data and control edges, sizes
from ``_output_shapes`` (an unknown dimension is the batch size, dtype from ``T`` or
``dtype``, 4 bytes when neither says), and liveness: a tensor is alive from its producer's
level to its last consumer's level. Prints ops, levels and the peak of the per-level sum
(``--json`` for one object). No views, no in-place reuse, no categories, no shape
arithmetic: that is what ``lms inspect`` adds, and the bench weighs what it costs::

    python bench/naive_inspect.py bench/out/densenet121.pb --batch-size 32
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import deque

from tensorboard.compat.proto import graph_pb2, types_pb2

#: Bytes per element of the dtype enums a training step holds (4 for anything else).
_BYTES = {
    types_pb2.DT_FLOAT: 4, types_pb2.DT_DOUBLE: 8, types_pb2.DT_HALF: 2,
    types_pb2.DT_BFLOAT16: 2, types_pb2.DT_INT32: 4, types_pb2.DT_INT64: 8,
    types_pb2.DT_INT8: 1, types_pb2.DT_UINT8: 1, types_pb2.DT_BOOL: 1,
    types_pb2.DT_INT16: 2, types_pb2.DT_RESOURCE: 0,
}


def simulate(data: bytes, batch: int) -> dict:
    """Levels and the liveness peak of the serialized GraphDef ``data`` at ``batch``."""
    gd = graph_pb2.GraphDef()
    gd.ParseFromString(data)
    nodes = gd.node
    n = len(nodes)
    index = {node.name: i for i, node in enumerate(nodes)}

    # Edges: data inputs as (producer, port), control inputs as producers.
    preds: list[set[int]] = [set() for _ in range(n)]
    reads: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for i, node in enumerate(nodes):
        for t in node.input:
            if t.startswith("^"):
                preds[i].add(index[t[1:]])
                continue
            name, _, port = t.partition(":")
            p = index[name]
            preds[i].add(p)
            reads[i].append((p, int(port) if port else 0))
    succs: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)

    # Kahn levels.
    indeg = [len(ps) for ps in preds]
    level = [0] * n
    queue = deque(i for i in range(n) if indeg[i] == 0)
    done = 0
    while queue:
        i = queue.popleft()
        done += 1
        for s in succs[i]:
            if level[s] <= level[i]:
                level[s] = level[i] + 1
            indeg[s] -= 1
            if indeg[s] == 0:
                queue.append(s)
    if done != n:
        raise SystemExit("the graph has a cycle")
    n_levels = max(level) + 1

    # Last reader of every tensor.
    last: dict[tuple[int, int], int] = {}
    for i, rs in enumerate(reads):
        for key in rs:
            if last.get(key, -1) < level[i]:
                last[key] = level[i]

    # Sizes and liveness: +bytes at the producer's level, -bytes after the last reader's.
    delta = [0] * (n_levels + 1)
    for i, node in enumerate(nodes):
        attr = node.attr
        if "_output_shapes" not in attr:
            continue
        if "T" in attr:
            width = _BYTES.get(attr["T"].type, 4)
        elif "dtype" in attr:
            width = _BYTES.get(attr["dtype"].type, 4)
        else:
            width = 4
        for port, shape in enumerate(attr["_output_shapes"].list.shape):
            if shape.unknown_rank:
                continue
            size = width
            for d in shape.dim:
                size *= batch if d.size < 0 else d.size
            end = last.get((i, port), level[i])
            delta[level[i]] += size
            delta[end + 1] -= size

    live, peak, peak_level = 0, 0, 0
    for lvl in range(n_levels):
        live += delta[lvl]
        if live > peak:
            peak, peak_level = live, lvl
    return {"ops": n, "levels": n_levels, "peak_bytes": peak, "peak_level": peak_level}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with open(args.file, "rb") as f:
        r = simulate(f.read(), args.batch_size)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{args.file}: {r['ops']} ops, {r['levels']} levels, peak {r['peak_bytes']:,} "
              f"bytes at level {r['peak_level']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
