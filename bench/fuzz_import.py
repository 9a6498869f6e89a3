"""A bounded coverage-guided fuzzer of the import path: bytes -> GraphDef -> IR -> simulation.

Usage (from the repository root)::

    python bench/fuzz_import.py --seconds 180            # atheris (libFuzzer), if installed
    python bench/fuzz_import.py --seconds 60 --engine random
    python bench/fuzz_import.py --lmscore-root /path/to/other/checkout   # compare versions

Each input is run through ``lmscore.load.from_graphdef_bytes`` and then ``order``,
``simulate`` (CPU workspace model), ``hotspots`` and ``plan_from_params``. The only allowed
outcomes are success and :class:`lmscore.errors.LmsError`; any other exception, or a run
longer than ``--timeout`` seconds, is a crash. Crashes are deduplicated by exception type
and the innermost lmscore frame, and the first input of each is saved to
``bench/out/crashes/`` (``.bin`` input, ``.txt`` traceback).

The first byte of an input picks how the rest is read:

* 0: a binary protobuf, as is (seeded with ``mlp.pb`` and small graphs);
* 1: text-format protobuf;
* 2: decisions for a structured GraphDef builder (ops whose shapes and values the
  importer evaluates, random inputs, ports, dtypes, shapes, constants and attributes).

Graphs without ``_output_shapes`` need TensorFlow's shape inference; that step is
replaced by a GraphError unless ``--with-tf`` is given (TensorFlow's own parser is not the
target, and it is slow to start).

Engines: ``atheris`` runs libFuzzer with coverage of the lmscore modules; ``random``
(used when atheris is not installed) mutates the same seeds (bit flips, byte edits,
splices, truncations) and draws structured graphs at random, without coverage feedback.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import pathlib
import random
import resource
import signal
import sys
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"

RAW, TEXT, BUILD = 0, 1, 2

# --- the structured builder ---------------------------------------------------------------

OPS = (
    "Placeholder", "Const", "Identity", "IdentityN", "Relu", "ReluGrad", "AddV2", "Mul",
    "FloorDiv", "FloorMod", "Maximum", "MatMul", "BatchMatMulV2", "Reshape", "Squeeze",
    "ExpandDims", "Transpose", "ConcatV2", "Pack", "Fill", "Range", "StridedSlice", "Shape",
    "ShapeN", "Size", "Rank", "GatherV2", "Tile", "BroadcastTo", "Sum", "Prod", "Max",
    "Mean", "DynamicStitch", "BroadcastGradientArgs", "Cast", "ZerosLike", "OnesLike",
    "TensorListReserve", "EmptyTensorList", "TensorListFromTensor", "TensorListStack",
    "While", "StatelessWhile", "If", "PartitionedCall", "VarHandleOp", "VariableV2",
    "ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "ResourceApplyGradientDescent", "ResourceApplyAdam", "Conv2DBackpropFilter",
    "Conv3DBackpropInputV2", "Split", "SplitV", "Unpack", "AddN", "BiasAdd",
    "SparseSoftmaxCrossEntropyWithLogits", "Softmax", "NoOp", "StopGradient", "Slice",
    "FooBarBaz", "_Arg", "IteratorGetNext",
)
DTYPES = (1, 1, 3, 3, 9, 20, 21, 7, 10, 2, 19, 101, 999, -1, 0)
DIMS = (-1, -1, -1, 0, 1, 1, 2, 3, 4, 8, 16, -2, 2**31, 2**40)
VALUES = (-2, -1, 0, 0, 1, 1, 2, 3, 4, 5, 64, 2**31 - 1, -(2**31))
PORTS = ("", "", "", ":0", ":1", ":2", ":\u00b2", ":99999999999999999999", ":", ":-1")
SCALAR_ATTRS = ("transpose_a", "transpose_b", "adj_x", "adj_y", "keep_dims", "N", "axis",
                "num_split", "begin_mask", "end_mask", "shrink_axis_mask", "ellipsis_mask",
                "new_axis_mask")


class Chooser:
    """Decisions for the builder, drawn from a byte string (atheris) or a PRNG."""

    def __init__(self, data: bytes | None = None, rng: random.Random | None = None) -> None:
        self.data = data or b""
        self.pos = 0
        self.rng = rng

    def int(self, n: int) -> int:
        """A number in ``[0, n)``."""
        if n <= 1:
            return 0
        if self.rng is not None:
            return self.rng.randrange(n)
        if self.pos >= len(self.data):
            return 0
        if n <= 256:
            b = self.data[self.pos]
            self.pos += 1
            return b % n
        chunk = self.data[self.pos:self.pos + 4]
        self.pos += 4
        return int.from_bytes(chunk, "little") % n

    def pick(self, seq):
        return seq[self.int(len(seq))]

    def chance(self, k: int) -> bool:
        """True about once in ``k`` draws."""
        return self.int(k) == 0

    def bytes(self, n: int) -> bytes:
        return bytes(self.int(256) for _ in range(self.int(n + 1)))


def build_graphdef(c: Chooser) -> bytes:
    """Serialize a random, mostly well-formed GraphDef driven by ``c``."""
    from tensorboard.compat.proto import graph_pb2

    gd = graph_pb2.GraphDef()
    n = 1 + c.int(24)
    names = [f"n{k}" for k in range(n)]
    # At most one structural fault per graph, so that most graphs get to the simulator.
    fault = c.int(16)
    if fault == 0:
        names[c.int(n)] = c.pick(("", "n0", "a:0", "x\ny", "\u00e9"))
    odd = c.int(n) if fault in (1, 2, 3, 4, 5) else -1
    funcs = []
    for k in range(c.int(3)):
        f = gd.library.function.add()
        f.signature.name = f"fn{k}"
        funcs.append(f.signature.name)
        f.signature.input_arg.add(name="l", type=21)
        for j in range(c.int(3)):
            nd = f.node_def.add(name=f"b{j}", op=c.pick(("TensorListPushBack", "Identity",
                                                         "ReadVariableOp", "Relu")))
            nd.input.extend(c.pick((["l", f"b{j - 1}"], ["l"], [], ["ghost", "x:0"])))
    for k, name in enumerate(names):
        op = c.pick(OPS)
        node = gd.node.add(name=name, op=op if not (fault == 1 and k == odd) else "")
        for _ in range(c.int(5) if k else 0):
            target = names[c.int(k)]  # an earlier node: a DAG, unless this node is the fault
            if fault == 2 and k == odd:
                target = c.pick((names[c.int(n)], "ghost"))
            if c.chance(6):
                node.input.append("^" + target)
            else:
                node.input.append(target + (c.pick(PORTS) if fault == 3 and k == odd else ""))
        dt = c.pick(DTYPES)
        attr = node.attr
        for key in ("T", "dtype", "out_type", "Tidx", "element_dtype", "DstT"):
            if c.chance(2):
                attr[key].type = dt if not c.chance(4) else c.pick(DTYPES)
        if not (fault == 4 and k == odd):  # the TensorFlow path is stubbed unless --with-tf
            lst = attr["_output_shapes"].list
            lst.SetInParent()
            outputs = 0 if op in ("NoOp", "AssignVariableOp") else 1 + c.pick((0, 0, 0, 1, 2))
            for _ in range(outputs if fault != 6 else c.int(3)):
                sh = lst.shape.add()
                if c.chance(8):
                    sh.unknown_rank = True
                else:
                    dims = DIMS if fault == 5 and k == odd else DIMS[:11]
                    for _ in range(c.int(5)):
                        sh.dim.add(size=c.pick(dims))
        if op == "Const" or c.chance(20):
            t = attr["value"].tensor
            t.dtype = c.pick((3, 3, 9, 1, 2, 7, 999))
            t.tensor_shape.SetInParent()
            for _ in range(c.int(3)):
                t.tensor_shape.dim.add(size=c.pick(DIMS[:10]))
            count = c.int(6)
            if c.chance(4):
                t.tensor_content = c.bytes(24)
            elif t.dtype == 3:
                t.int_val.extend(c.pick(VALUES) for _ in range(count))
            elif t.dtype == 9:
                t.int64_val.extend(c.pick(VALUES + (2**40, -(2**62))) for _ in range(count))
            elif t.dtype == 1:
                t.float_val.extend(float(c.pick(VALUES)) for _ in range(count))
            elif t.dtype == 2:
                t.double_val.extend(float(c.pick(VALUES)) for _ in range(count))
            elif t.dtype == 7:
                t.string_val.extend(c.bytes(40) for _ in range(count))
        if op in ("VarHandleOp", "VariableV2", "Placeholder") and c.chance(2):
            attr["shape"].shape.SetInParent()
            for _ in range(c.int(4)):
                attr["shape"].shape.dim.add(size=c.pick(DIMS))
        for key in SCALAR_ATTRS:
            if c.chance(5):
                kind = c.int(4)
                if kind == 0:
                    attr[key].b = bool(c.int(2))
                elif kind == 1:
                    attr[key].i = c.pick(VALUES + (10**6, 10**12, 2**63 - 1))
                elif kind == 2:
                    attr[key].s = c.bytes(4)
                else:
                    attr[key].list.i.extend(c.pick(VALUES) for _ in range(c.int(4)))
        for key in ("body", "cond", "f", "then_branch", "else_branch"):
            if c.chance(4):
                if c.chance(3):
                    attr[key].list.func.add().name = c.pick(funcs + ["", "nope"])
                else:
                    attr[key].func.name = c.pick(funcs + ["", "nope"])
        if op in ("Split", "IdentityN", "ShapeN", "Unpack", "AddN") and c.chance(2):
            attr["num_split" if op == "Split" else "N"].i = c.pick((0, 1, 2, 3, 10**9, -1))
            if c.chance(2):
                attr["T"].list.type.extend(
                    c.pick(DTYPES) for _ in range(c.int(4)))
        if c.chance(12):
            attr["_lms_role"].s = c.pick((b"swap_out", b"swap_in", b"\xff\xfe", b""))
            attr["_lms_tensor"].s = c.bytes(6)
    return gd.SerializeToString()


# --- running one input ---------------------------------------------------------------------


class Timeout(BaseException):
    """One input ran longer than the time limit."""


def make_target(with_tf: bool, timeout: float):
    """The function run on each input; returns None or ``(signature, traceback text)``."""
    import importlib

    from lmscore.errors import GraphError, LmsError
    from lmscore.memory import hotspots, simulate
    from lmscore.order import order
    from lmscore.plan import plan_from_params
    from lmscore.shapes import resolve

    load_mod = importlib.import_module("lmscore.load")  # the package shadows it with load()
    if not with_tf:
        def no_tf(gd, source):
            raise GraphError(f"{source}: missing _output_shapes (TensorFlow not used here)")
        load_mod._add_shapes_with_tensorflow = no_tf

    def on_alarm(signum, frame):
        raise Timeout(f"no result after {timeout} s")

    signal.signal(signal.SIGALRM, on_alarm)

    def run(data: bytes) -> tuple[str, tuple[str, str] | None]:
        """``(outcome, crash)``: "ok", an LmsError name or "crash"; crash is (sig, tb)."""
        mode = data[0] % 3 if data else RAW
        payload = data[1:]
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            if mode == BUILD:
                payload = build_graphdef(Chooser(payload))
            graph = load_mod.from_graphdef_bytes(payload, source="<fuzz>",
                                                 text=True if mode == TEXT else None)
            batch = 1 + (len(data) % 4)
            order(graph)
            sizes = resolve(graph, batch)
            sim = simulate(graph, batch, sizes=sizes)
            hotspots(graph, sim, limit=5)
            plan_from_params(graph, batch, threshold=1, sizes=sizes)
        except LmsError as e:
            if "\n" in str(e) or "\r" in str(e):
                return "crash", ("multi-line message", f"{type(e).__name__}: {e!s}")
            return type(e).__name__, None
        except Timeout:
            return "crash", ("Timeout", traceback.format_exc())
        except BaseException as e:  # every other exception is a bug
            if isinstance(e, KeyboardInterrupt):
                raise
            return "crash", (signature(e), traceback.format_exc())
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return "ok", None

    return run


def signature(e: BaseException) -> str:
    """Exception type and the innermost lmscore frame (else the innermost frame)."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if "lmscore" in f.filename]
    f = (ours or frames or [None])[-1]
    where = f"{pathlib.Path(f.filename).name}:{f.lineno}:{f.name}" if f else "?"
    return f"{type(e).__name__} at {where}"


class Recorder:
    """Counts inputs, keeps the first input and traceback of each distinct crash."""

    def __init__(self, out: pathlib.Path) -> None:
        self.out = out
        self.tried = 0
        self.outcomes: dict[str, int] = collections.Counter()
        self.crashes: dict[str, int] = collections.Counter()
        self.first: dict[str, str] = {}

    def record(self, data: bytes, result: tuple[str, tuple[str, str] | None]) -> None:
        self.tried += 1
        outcome, crash = result
        self.outcomes[outcome] += 1
        if crash is None:
            return
        sig, tb = crash
        self.crashes[sig] += 1
        if sig in self.first:
            return
        digest = hashlib.sha1(data).hexdigest()[:12]
        stem = "".join(ch if ch.isalnum() else "_" for ch in sig)[:80] + "_" + digest
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{stem}.bin").write_bytes(data)
        (self.out / f"{stem}.txt").write_text(f"{sig}\n\n{tb}")
        self.first[sig] = stem
        print(f"\n[fuzz] new crash #{len(self.first)}: {sig} -> {stem}.bin", flush=True)

    def summary(self, seconds: float, engine: str) -> str:
        lines = [
            "",
            f"engine            {engine}",
            f"seconds           {seconds:.0f}",
            f"inputs tried      {self.tried}",
            "outcomes          " + ", ".join(f"{k} {v}" for k, v in self.outcomes.most_common()),
            f"unique crashes    {len(self.crashes)} (saved to {self.out})",
        ]
        for sig, count in self.crashes.most_common():
            lines.append(f"  {count:7d} x  {sig}")
        return "\n".join(lines)


# --- seeds -----------------------------------------------------------------------------------


def seeds() -> list[bytes]:
    """The inputs fuzzing starts from: real graphs, small graphs, structured decisions."""
    from tensorboard.compat.proto import graph_pb2

    from lmscore.samples import sample_dir

    out = [bytes([RAW]) + (sample_dir() / "mlp.pb").read_bytes()]

    def g(*nodes):
        gd = graph_pb2.GraphDef()
        for name, op, inputs, shapes, dtype in nodes:
            n = gd.node.add(name=name, op=op)
            n.input.extend(inputs)
            n.attr["T"].type = dtype
            n.attr["dtype"].type = dtype
            lst = n.attr["_output_shapes"].list
            lst.SetInParent()
            for s in shapes:
                sh = lst.shape.add()
                for d in s:
                    sh.dim.add(size=d)
        return gd

    step = g(("x", "Placeholder", [], [(-1, 4)], 1), ("v", "Placeholder", [], [()], 20),
             ("r", "ReadVariableOp", ["v"], [(4, 2)], 1),
             ("m", "MatMul", ["x", "r"], [(-1, 2)], 1), ("a", "Relu", ["m"], [(-1, 2)], 1),
             ("s", "Shape", ["a"], [(2,)], 3), ("t", "Transpose", ["a", "s"], [(-1, -1)], 1),
             ("u", "AssignVariableOp", ["v", "r"], [], 1))
    out.append(bytes([RAW]) + step.SerializeToString())
    from google.protobuf import text_format

    out.append(bytes([TEXT]) + text_format.MessageToString(step).encode())
    rng = random.Random(0)
    for _ in range(16):
        out.append(bytes([BUILD]) + rng.randbytes(rng.randint(16, 600)))
    return out


def mutate(data: bytes, rng: random.Random, pool: list[bytes]) -> bytes:
    """One random edit: bit flips, byte runs, deletions, splices or a truncation."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(6)
        if not b:
            b.extend(rng.randbytes(8))
        pos = rng.randrange(len(b))
        if kind == 0:
            b[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:
            b[pos:pos + 1] = rng.randbytes(rng.randint(1, 8))
        elif kind == 2:
            del b[pos:pos + rng.randint(1, 16)]
        elif kind == 3:
            other = rng.choice(pool)
            k = rng.randrange(len(other)) if other else 0
            b[pos:pos] = other[k:k + rng.randint(1, 64)]
        elif kind == 4:
            del b[pos:]
        else:
            b[pos] = rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x1A, 0x2A))
    return bytes(b[: 1 << 16])


# --- engines --------------------------------------------------------------------------------


def run_random(run, rec: Recorder, seconds: float, seed: int) -> None:
    rng = random.Random(seed)
    pool = seeds()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        roll = rng.random()
        if roll < 0.3:
            data = bytes([BUILD]) + rng.randbytes(rng.randint(8, 800))
        else:
            data = mutate(rng.choice(pool), rng, pool)
            if rng.random() < 0.5:
                data = bytes([rng.choice((RAW, TEXT, BUILD))]) + data[1:]
        rec.record(data, run(data))


def run_atheris(run, rec: Recorder, seconds: float, seed: int, t0: float, engine: str) -> None:
    import atheris

    seed_dir = OUT / "fuzz_seeds"
    work_dir = OUT / "fuzz_corpus"
    for d in (seed_dir, work_dir, rec.out):
        d.mkdir(parents=True, exist_ok=True)
    for k, s in enumerate(seeds()):
        (seed_dir / f"seed_{k:03d}").write_bytes(s)
    end = t0 + seconds

    def one_input(data: bytes) -> None:
        rec.record(data, run(data))
        if time.monotonic() > end:
            print(rec.summary(time.monotonic() - t0, engine), flush=True)
            os._exit(0)

    args = [sys.argv[0], str(work_dir), str(seed_dir), f"-seed={seed}",
            f"-max_total_time={int(seconds) + 60}", "-max_len=65536", "-rss_limit_mb=0",
            f"-artifact_prefix={rec.out}{os.sep}"]  # time limits: our SIGALRM, per input
    atheris.Setup(args, one_input)
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=180, help="how long to fuzz (180)")
    ap.add_argument("--engine", choices=("atheris", "random"), default=None,
                    help="default: atheris when it is installed, else random")
    ap.add_argument("--timeout", type=float, default=10, help="seconds per input (10)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--with-tf", action="store_true",
                    help="let graphs without shapes go through TensorFlow")
    ap.add_argument("--memory-mb", type=int, default=6144,
                    help="address-space limit, so a runaway allocation is a MemoryError")
    ap.add_argument("--lmscore-root", default=str(ROOT),
                    help="checkout whose lmscore is fuzzed (default: this one)")
    ap.add_argument("--out", default=str(OUT / "crashes"), help="where crashers go")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(pathlib.Path(args.lmscore_root).resolve()))
    if args.memory_mb and not args.with_tf:
        limit = args.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    engine = args.engine
    if engine is None:
        try:
            import atheris  # noqa: F401
            engine = "atheris"
        except ImportError:
            engine = "random"
            print("[fuzz] atheris is not installed: random mutation engine", flush=True)
    if engine == "atheris":
        import atheris

        with atheris.instrument_imports(include=["lmscore"]):
            import lmscore.load  # noqa: F401
            import lmscore.memory  # noqa: F401
            import lmscore.order  # noqa: F401
            import lmscore.plan  # noqa: F401
            import lmscore.shapes  # noqa: F401
    import lmscore

    print(f"[fuzz] lmscore from {pathlib.Path(lmscore.__file__).parent}", flush=True)
    rec = Recorder(pathlib.Path(args.out))
    run = make_target(args.with_tf, args.timeout)
    t0 = time.monotonic()
    if engine == "atheris":
        run_atheris(run, rec, args.seconds, args.seed, t0, engine)
    else:
        run_random(run, rec, args.seconds, args.seed)
    print(rec.summary(time.monotonic() - t0, engine), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
