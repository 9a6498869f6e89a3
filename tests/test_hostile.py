"""Hostile inputs: every one ends in success or one documented error line, in bounded time.

The corpus (``tests/hostile/make_corpus.py``) is generated into a temporary directory:
truncated and bit-flipped copies of ``mlp.pb``, protobufs of other message types, text,
empty files, cycles, dangling inputs, duplicate names, unknown ops and dtypes, absurd
shapes, huge attributes, deep function libraries, damaged SavedModels and zips, and bad
plan files. Each case goes through the Python API (``lmscore.load`` then
``lmscore.simulate(graph, 4)``, or ``load_plan`` + ``check_plan`` + ``rewrite``) and through
the CLI (``lms inspect FILE``, ``lms rewrite GRAPH --plan PLAN``):

* the outcome is the expected one: success, or an :class:`lmscore.errors.LmsError`
  subclass with a one-line message (never another exception);
* the CLI exits 0 or 2, and on error prints exactly one stderr line ``lms: error: ...``
  and no traceback;
* each case finishes within :data:`TIME_LIMIT` seconds;
* nothing is written (the corpus and the working directory are unchanged).

The default run samples 30 truncations and 30 bit flips; ``-m slow`` adds 300 of each.
TensorFlow is needed only by the cases marked ``tf`` (SavedModels, a graph without shapes);
all of them go through the API, a sample through the CLI (all of them under ``-m slow``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent / "hostile"))

import make_corpus  # noqa: E402

import lmscore  # noqa: E402
from lmscore import samples  # noqa: E402
from lmscore.errors import LmsError  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
TIME_LIMIT = 20  # seconds per case, in process and per CLI run
TF_TIME_LIMIT = 90  # cases that import TensorFlow in a fresh process
CLASSES = (
    "truncated", "bitflip", "other_message", "text", "empty", "zero_nodes", "cycle",
    "dangling", "duplicate", "names", "unknown_op", "unknown_dtype", "absurd_shape",
    "huge_attr", "deep_library", "semantic", "special_file", "zip", "saved_model", "plan",
)
#: Places a path-traversal zip would write to if the importer extracted it blindly.
ESCAPES = (pathlib.Path("/evil"), pathlib.Path("/tmp/lms_evil"), pathlib.Path("/tmp/evil"),
           pathlib.Path("/tmp/evil.pb"))

#: Cases that still fail (none now); each would be run by test_known_issues, which expects
#: the failure (strict: it flags the fix).
KNOWN_ISSUES: dict[str, str] = {}

TRIED: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def _report_counts(request):
    yield
    if not TRIED:
        return
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    lines = ["", "hostile inputs tried per class (api: in process, cli: lms subprocesses):"]
    lines += [f"  {k:34s} {v}" for k, v in sorted(TRIED.items())]
    lines.append(f"  {'total':34s} {sum(TRIED.values())}")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        for line in lines:
            if reporter is not None:
                reporter.write_line(line)
            else:  # pragma: no cover
                print(line)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    return root, make_corpus.generate(root, truncations=30, bitflips=30)


@pytest.fixture(scope="session")
def big_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile_big")
    cases = make_corpus.generate(root, truncations=300, bitflips=300)
    return root, [c for c in cases if c.cls in ("truncated", "bitflip")]


@pytest.fixture(scope="session")
def tf_corpus(tmp_path_factory):
    pytest.importorskip("tensorflow")
    root = tmp_path_factory.mktemp("hostile_tf")
    return root, [c for c in make_corpus.generate(root, truncations=0, bitflips=0,
                                                  with_tf=True) if c.tf]


# --- helpers --------------------------------------------------------------------------------


class _Timeout(BaseException):
    """Raised by the alarm when a case runs past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float):
    def on_alarm(signum, frame):
        raise _Timeout(f"no result after {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def snapshot(*dirs: pathlib.Path) -> set[tuple[str, int, int]]:
    """Every entry under ``dirs`` (not following links) with its size and mtime."""
    out = set()
    for d in dirs:
        for base, subdirs, files in os.walk(d):
            for name in subdirs + files:
                p = os.path.join(base, name)
                st = os.lstat(p)
                out.add((p, st.st_size, st.st_mtime_ns))
    for p in ESCAPES:
        if p.exists():
            out.add((str(p), -1, -1))
    return out


def run_api(root: pathlib.Path, case: make_corpus.Case, limit: float) -> tuple[str, str]:
    """Outcome (``"ok"``, an LmsError class name, or ``"CRASH ..."``) and the message."""
    path = root / case.path
    try:
        with time_limit(limit):
            if case.kind == "plan":
                from lmscore.plan import check_plan, load_plan
                from lmscore.rewrite import rewrite

                graph = lmscore.load(case.graph)
                plan = load_plan(path)
                check_plan(graph, plan)
                rewrite(graph, plan)
            else:
                graph = lmscore.load(path)
                lmscore.simulate(graph, 4)
    except LmsError as e:
        return type(e).__name__, str(e)
    except _Timeout as e:
        return "CRASH timeout", str(e)
    except BaseException as e:  # anything else is a bug, whatever it is
        return f"CRASH {type(e).__name__}", str(e)[:300]
    return "ok", ""


def check_api(root: pathlib.Path, case: make_corpus.Case, limit: float) -> str | None:
    """None if the case behaves, else a description of what went wrong."""
    before = snapshot(root)
    outcome, msg = run_api(root, case, limit)
    problems = []
    if outcome not in case.expect:
        problems.append(f"got {outcome}: {msg[:300]!r}, expected {'/'.join(case.expect)}")
    if outcome != "ok" and not outcome.startswith("CRASH"):
        if "\n" in msg or "\r" in msg or not msg.strip():
            problems.append(f"message is not one line: {msg[:300]!r}")
        if case.message and case.message not in msg:
            problems.append(f"message lacks {case.message!r}: {msg[:300]!r}")
        if case.kind == "graph" and pathlib.Path(case.path).name not in msg:
            problems.append(f"message does not name the file: {msg[:300]!r}")
    if snapshot(root) != before:
        problems.append("files were written")
    return "; ".join(problems) or None


def lms(args: list[str], cwd: pathlib.Path, limit: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "lmscore.cli", *args], capture_output=True,
                          text=True, errors="replace", cwd=cwd, timeout=limit, env=env)


def check_cli(root: pathlib.Path, case: make_corpus.Case, work: pathlib.Path,
              limit: float) -> str | None:
    path = root / case.path
    cwd = work / case.name.replace("/", "_")
    cwd.mkdir(parents=True)
    out = work / (case.name.replace("/", "_") + "_out")
    out.mkdir()
    if case.kind == "plan":
        args = ["rewrite", case.graph, "--plan", str(path), "--out", str(out / "new.pb")]
    else:
        args = ["inspect", str(path)]
    before = snapshot(root, cwd)
    start = time.monotonic()
    try:
        r = lms(args, cwd, limit)
    except subprocess.TimeoutExpired:
        return f"CLI did not finish within {limit} s"
    took = time.monotonic() - start
    problems = []
    lines = r.stderr.splitlines()
    ok = r.returncode == 0
    if ok and "ok" not in case.expect:
        problems.append(f"exit 0, expected {'/'.join(case.expect)}")
    if not ok:
        if r.returncode != 2:
            problems.append(f"exit {r.returncode}")
        if len(lines) != 1 or not lines[0].startswith("lms: error: "):
            problems.append(f"stderr is not one 'lms: error:' line: {r.stderr[-600:]!r}")
        if "ok" in case.expect and len(case.expect) == 1:
            problems.append(f"expected success: {r.stderr[-300:]!r}")
        if r.stdout:
            problems.append(f"stdout on error: {r.stdout[:200]!r}")
    if "Traceback" in r.stderr:
        problems.append("traceback on stderr")
    if snapshot(root, cwd) != before:
        problems.append("files were written")
    written = sorted(p.name for p in out.iterdir())
    if written != (["new.pb"] if ok and case.kind == "plan" else []):
        problems.append(f"output directory holds {written}")
    if problems:
        return f"({took:.1f} s) " + "; ".join(problems)
    return None


def run_cases(cases, check) -> dict[str, str]:
    """Run ``check`` on every case, two at a time; return the failures by case name."""
    failures = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for case, problem in zip(cases, pool.map(check, cases), strict=True):
            if problem:
                failures[case.name] = problem
    return failures


def report(failures: dict[str, str]) -> str:
    return "\n".join(f"{name}: {why}" for name, why in sorted(failures.items()))


def expect_api(root: pathlib.Path, chosen: list, label: str) -> None:
    """Every case through the API, counted under ``label``; fail listing the failures."""
    failures = {}
    for case in chosen:  # in the main thread: the alarm bounds each case
        problem = check_api(root, case, TIME_LIMIT)
        if problem:
            failures[case.name] = problem
    TRIED[label] += len(chosen)
    assert not failures, f"{len(failures)}/{len(chosen)} cases failed:\n{report(failures)}"


def expect_cli(root: pathlib.Path, chosen: list, label: str, work: pathlib.Path) -> None:
    """Every case through the CLI, two at a time, counted under ``label``."""
    failures = run_cases(chosen, lambda c: check_cli(root, c, work, TIME_LIMIT))
    TRIED[label] += len(chosen)
    assert not failures, f"{len(failures)}/{len(chosen)} cases failed:\n{report(failures)}"


def _select(cases, cls):
    return [c for c in cases if c.cls == cls and not c.tf and c.name not in KNOWN_ISSUES]


# --- the tests ------------------------------------------------------------------------------


def test_corpus_is_deterministic(tmp_path):
    a = make_corpus.generate(tmp_path / "a", truncations=5, bitflips=5)
    b = make_corpus.generate(tmp_path / "b", truncations=5, bitflips=5)
    assert a == b and {c.cls for c in a} == set(CLASSES)
    for case in a:
        pa, pb = tmp_path / "a" / case.path, tmp_path / "b" / case.path
        if pa.is_file() and not pa.is_symlink():
            assert pa.read_bytes() == pb.read_bytes(), case.name


@pytest.mark.parametrize("cls", CLASSES)
def test_api(corpus, cls):
    root, cases = corpus
    expect_api(root, _select(cases, cls), f"{cls} (api)")


@pytest.mark.parametrize("cls", CLASSES)
def test_cli(corpus, cls, tmp_path):
    root, cases = corpus
    expect_cli(root, _select(cases, cls), f"{cls} (cli)", tmp_path)


@pytest.mark.parametrize("name", sorted(KNOWN_ISSUES))
def test_known_issues(corpus, name, tmp_path):
    root, cases = corpus
    (case,) = [c for c in cases if c.name == name]
    problem = check_api(root, case, 5) or check_cli(root, case, tmp_path, 10)
    TRIED["known issues (api, cli)"] += 1
    if problem:
        pytest.xfail(f"{KNOWN_ISSUES[name]}: {problem}")
    pytest.fail(f"{name} passes now: remove it from KNOWN_ISSUES")


@pytest.mark.slow
@pytest.mark.parametrize("cls", ["truncated", "bitflip"])
def test_api_many(big_corpus, cls):
    root, cases = big_corpus
    expect_api(root, _select(cases, cls), f"{cls} x300 (api)")


@pytest.mark.slow
@pytest.mark.parametrize("cls", ["truncated", "bitflip"])
def test_cli_many(big_corpus, cls, tmp_path):
    root, cases = big_corpus
    expect_cli(root, _select(cases, cls), f"{cls} x300 (cli)", tmp_path)


@pytest.mark.tf
def test_tf_cases_api(tf_corpus):
    root, cases = tf_corpus
    failures = {}
    for case in cases:
        problem = check_api(root, case, TF_TIME_LIMIT)
        if problem:
            failures[case.name] = problem
    for case in cases:
        TRIED[f"{case.cls} with TF (api)"] += 1
    assert not failures, f"{len(failures)}/{len(cases)} cases failed:\n{report(failures)}"


#: The TensorFlow cases the default run also sends through the CLI (each run starts
#: TensorFlow, several seconds); ``-m slow`` sends all of them.
TF_CLI_SAMPLE = ("saved_model/garbage_pb", "saved_model/missing_variables",
                 "zip/garbage_saved_model", "unknown_op/without_shapes")


def _tf_cli(tf_corpus, tmp_path, chosen) -> None:
    root, cases = tf_corpus
    cases = [c for c in cases if chosen(c)]
    failures = run_cases(cases, lambda c: check_cli(root, c, tmp_path, TF_TIME_LIMIT))
    for case in cases:
        TRIED[f"{case.cls} with TF (cli)"] += 1
    assert not failures, f"{len(failures)}/{len(cases)} cases failed:\n{report(failures)}"


@pytest.mark.tf
def test_tf_cases_cli(tf_corpus, tmp_path):
    assert set(TF_CLI_SAMPLE) <= {c.name for c in tf_corpus[1]}
    _tf_cli(tf_corpus, tmp_path, lambda c: c.name in TF_CLI_SAMPLE)


@pytest.mark.tf
@pytest.mark.slow
def test_tf_cases_cli_rest(tf_corpus, tmp_path):
    _tf_cli(tf_corpus, tmp_path, lambda c: c.name not in TF_CLI_SAMPLE)


# --- resource limits ------------------------------------------------------------------------


def test_op_and_size_limits_refuse_before_building(tmp_path, monkeypatch):
    import importlib

    from lmscore.errors import ConfigError, GraphError

    mlp = samples.sample_dir() / "mlp.pb"
    assert len(lmscore.load(mlp, max_ops=307).ops) == 307
    with pytest.raises(GraphError, match=r"mlp.pb: 307 ops \(nodes and function bodies\) is "
                                         r"over the limit of 306 \(set LMS_MAX_OPS"):
        lmscore.load(mlp, max_ops=306)
    monkeypatch.setenv("LMS_MAX_OPS", "100")
    with pytest.raises(GraphError, match="over the limit of 100"):
        lmscore.from_graphdef_bytes(mlp.read_bytes())
    monkeypatch.setenv("LMS_MAX_OPS", "lots")
    with pytest.raises(ConfigError, match="LMS_MAX_OPS must be a positive integer"):
        lmscore.load(mlp)
    monkeypatch.delenv("LMS_MAX_OPS")
    # text GraphDefs: the limit is checked on the file's size, before it is read
    text = tmp_path / "g.pbtxt"
    text.write_text('node { name: "x" op: "Placeholder" }\n' * 40)
    load_mod = importlib.import_module("lmscore.load")  # the module, not lmscore.load()
    monkeypatch.setattr(load_mod, "MAX_TEXT_BYTES", 1000)
    with pytest.raises(GraphError, match=r"g.pbtxt: 1,480 bytes is over the limit of 1,000 for "
                                         r"a text GraphDef \(save it as binary .pb\)"):
        lmscore.load(text)
    monkeypatch.setattr(load_mod, "MAX_FILE_BYTES", 1000)
    with pytest.raises(GraphError, match="over the limit of 1,000 for a GraphDef$"):
        lmscore.load(mlp)


def test_the_cli_names_the_op_limit(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LMS_MAX_OPS": "50"}
    r = subprocess.run([sys.executable, "-m", "lmscore.cli", "inspect", "mlp"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60, env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"lms: error: {samples.sample_dir() / 'mlp.pb'}: 307 ops (nodes and function "
        "bodies) is over the limit of 50 (set LMS_MAX_OPS to raise it)"]


# --- no code execution ----------------------------------------------------------------------


@pytest.mark.tf
def test_code_stored_in_a_model_never_runs(tmp_path):
    """A Keras file with a Lambda layer and a SavedModel calling Python: nothing runs."""
    keras = pytest.importorskip("keras")
    tf = pytest.importorskip("tensorflow")
    from lmscore.errors import GraphError, RunError
    from lmscore.validate import validate

    marker = tmp_path / "ran.txt"

    def side_effect(x):
        marker.write_text("ran")
        return x

    model = keras.Sequential([keras.Input((4,)),
                              keras.layers.Lambda(lambda x: x * 2.0), keras.layers.Dense(2)])
    model.save(tmp_path / "lambda.keras")
    with pytest.raises(GraphError, match="lambda.keras: the zip archive holds no SavedModel"):
        lmscore.load(tmp_path / "lambda.keras")

    w = tf.Variable(tf.ones([4, 2]))

    class Step(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
        def train_step(self, x):
            y = tf.py_function(side_effect, [x], tf.float32)
            y.set_shape([None, 4])
            return tf.reduce_sum(tf.matmul(y, w))

    module = Step()
    module.w = w
    tf.saved_model.save(module, str(tmp_path / "sm"))
    assert not marker.exists()  # tracing does not call the Python function
    graph = lmscore.load(tmp_path / "sm")
    assert any(op.type == "EagerPyFunc" for op in graph.ops)
    lmscore.simulate(graph, 2)
    with pytest.raises(RunError, match="is a EagerPyFunc, which reads or writes outside"):
        validate(graph, 2)
    assert not marker.exists()
