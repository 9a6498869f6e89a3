"""The web app under faults and concurrent sessions, over HTTP as the browser speaks it.

The callbacks are fired as Dash's renderer fires them (:mod:`dash_client`), either
through Flask's test client or against ``python -m lmsviz`` on a free port of 127.0.0.1.
Faults: a callback that raises, a busy server, uploads cut off mid-way, oversized or of
the wrong type, requests cut off at the socket, the server killed (SIGKILL) and restarted
in the middle of editing a plan. Load: 2 and 10 concurrent sessions with different graphs
and plans, checked for leaks between them (``bench/bench_sessions.py`` measures more).
"""

from __future__ import annotations

import base64
import json
import logging
import multiprocessing
import os
import pathlib
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from dash_client import FlaskTransport, HttpTransport, Server, Session

import lmscore
from lmscore import samples
from lmscore.plan import check_plan, plan_from_json, plan_from_params
from lmsviz import edits, rendering, state
from lmsviz.app import create_app

LSTM = samples.sample_dir() / "lstm.pb"


def gate(name: str, data: bytes, *, cut: int | None = None) -> dict[str, Any]:
    """What the browser's upload gate hands the server (``contents`` may be cut short)."""
    contents = "data:application/octet-stream;base64," + base64.b64encode(data).decode()
    if cut is not None:
        contents = contents[:cut]
    return {"filename": name, "size": len(data), "contents": contents, "nonce": time.time()}


@pytest.fixture
def client(tmp_path: pathlib.Path) -> Iterator[Session]:
    app = create_app("mlp", data_dir=tmp_path / "data", upload_cap_bytes=2**20)
    yield Session(FlaskTransport(app.server.test_client()))


# --- a callback that raises -------------------------------------------------------------


def test_a_failing_callback_answers_one_line_and_the_app_goes_on(
        client: Session, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(edits, "apply_knobs", boom)
    with caplog.at_level(logging.ERROR, logger="lmsviz"):
        status, response = client.act("knobs-apply", "n_clicks", 1)
    assert status == 200
    assert client.message() == ("internal error in knobs-apply: RuntimeError: boom (the server "
                                "keeps running; the traceback is in its log)")
    assert "st-plan" not in response  # the session's stores are untouched
    assert any(r.exc_info and "boom" in str(r.exc_info[1]) for r in caplog.records)

    monkeypatch.setattr(rendering, "render", boom)
    status, _ = client.act("batch", "value", 8)
    assert status == 200 and client.message().startswith("internal error in drawing: ")
    assert client.store("st-settings")["batch"] == 8  # the control callback still ran

    monkeypatch.undo()
    status, _ = client.act("knobs-apply", "n_clicks", 2)
    assert status == 200 and client.message().startswith("knobs applied: ")
    assert "batch 8" in client.text("sum-graph")


# --- a busy server -----------------------------------------------------------------------


def _hold_slots(paths: list[str], ready: Any) -> None:  # pragma: no cover - child process
    import fcntl

    fds = [os.open(p, os.O_RDWR | os.O_CREAT) for p in paths]
    for fd in fds:
        fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    time.sleep(600)


def test_work_slots_bound_threads_and_processes_and_a_killed_holder_frees_its_slot(
        tmp_path: pathlib.Path) -> None:
    slots = state.WorkSlots(tmp_path, 2, wait_seconds=0.2)
    inside, peak = [0], [0]
    lock = threading.Lock()

    def work() -> None:
        with slots.slot():
            with slots.slot():  # nested heavy calls take no second slot
                with lock:
                    inside[0] += 1
                    peak[0] = max(peak[0], inside[0])
                time.sleep(0.05)
                with lock:
                    inside[0] -= 1

    slots.wait_seconds = 30
    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 2 and slots.busy() == 0

    ready = multiprocessing.get_context("fork").Event()
    child = multiprocessing.get_context("fork").Process(
        target=_hold_slots, args=([str(p) for p in slots.paths], ready))
    child.start()
    try:
        assert ready.wait(30)
        assert slots.busy() == 2
        slots.wait_seconds = 0.2
        with pytest.raises(state.ServerBusy, match=r"busy \(2 heavy jobs running\); the "
                                                   r"export waited 0.2 s: try again"):
            with slots.slot("the export"):
                pass
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    with slots.slot():
        assert slots.busy() == 1


@pytest.mark.parametrize(("n", "wait", "words"), [
    (0, 1.0, "concurrent jobs must be positive, got 0"),
    (2, -1.0, "must be 0 to 86400 s, got -1.0"),
    (2, float("nan"), "must be 0 to 86400 s, got nan"),
])
def test_work_slot_settings_are_checked(tmp_path: pathlib.Path, n: int, wait: float,
                                        words: str) -> None:
    with pytest.raises(state.ConfigError, match=words):
        state.WorkSlots(tmp_path, n, wait)


def _sleep() -> None:  # pragma: no cover - child process
    time.sleep(600)


def test_a_forked_job_does_not_keep_the_slots_its_parent_held(tmp_path: pathlib.Path) -> None:
    slots = state.WorkSlots(tmp_path, 1, wait_seconds=0.2)
    fork = multiprocessing.get_context("fork")
    with slots.slot():
        child = fork.Process(target=_sleep)
        child.start()
    try:
        # released by the parent and not held on by the child's copy of the descriptor
        # (which the child closes right after the fork)
        deadline = time.monotonic() + 10
        while slots.busy() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert slots.busy() == 0 and child.is_alive()
        with slots.slot():
            pass
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)


def test_a_busy_server_refuses_heavy_work_with_a_clear_message(tmp_path: pathlib.Path) -> None:
    ctx = state.new_context("mlp", None, upload_cap_bytes=2**20, data_dir=tmp_path,
                            max_jobs=1, job_wait=0.2)
    session = state.new_session(ctx)
    with ctx.slots.slot():  # held by this thread; the request below runs in another
        done: dict[str, Any] = {}

        def other_request() -> None:
            done["upload"] = edits.upload_graph(
                ctx, gate("lstm.pb", LSTM.read_bytes()), session["settings"])
            done["knobs"] = edits.apply_knobs(
                ctx, session["graph"], {**session["settings"], "batch": 3},
                dict(state.DEFAULT_KNOBS))

        t = threading.Thread(target=other_request)
        t.start()
        t.join(30)
    for what in ("upload", "knobs"):
        up = done[what]
        assert up.error and "the server is busy (1 heavy jobs running)" in up.message, up.message
    # once the slot is free the same requests go through
    assert not edits.upload_graph(ctx, gate("lstm.pb", LSTM.read_bytes()),
                                      session["settings"]).error


# --- uploads ----------------------------------------------------------------------------

MLP_BYTES = (samples.sample_dir() / "mlp.pb").read_bytes()


@pytest.mark.parametrize(("name", "upload", "words"), [
    ("cut base64", gate("mlp.pb", MLP_BYTES, cut=5003), "not base64 data"),
    ("cut protobuf", gate("mlp.pb", MLP_BYTES[: len(MLP_BYTES) // 2]), "not a GraphDef"),
    ("cut zip", gate("model.zip", b"PK\x03\x04" + MLP_BYTES[:999]), "unreadable zip"),
    ("empty", gate("mlp.pb", b""), "the file is empty"),
    ("oversized", {**gate("big.pb", b"x" * 10), "size": 2**21}, "over the upload limit"),
    ("refused by the browser", {"filename": "big.pb", "size": 2**21, "refused": True},
     "over the upload limit of 1.00 MiB"),
    ("a size that lies", {**gate("big.pb", bytes(2**21)), "size": 10}, "over the upload limit"),
    ("wrong type", gate("photo.png", b"\x89PNG\r\n\x1a\n" + bytes(100)), "not a graph file"),
    ("text that is not a graph", gate("notes.txt", b"hello world\n"), "not a GraphDef"),
    ("a plan as a graph", gate("plan.pb", b'{"version": 1}'), "not a GraphDef"),
])
def test_bad_uploads_over_the_wire_are_refused_and_the_session_is_unchanged(
        client: Session, name: str, upload: dict[str, Any], words: str) -> None:
    before = {s: client.store(s) for s in ("st-graph", "st-plan", "st-settings")}
    status, response = client.act("graph-gate", "data", upload)
    assert status == 200, name
    assert client.message().startswith("upload refused: ") and words in client.message(), (
        client.message())
    assert "\n" not in client.message() and "Traceback" not in client.message()
    assert not set(response) & {"st-graph", "st-plan", "st-settings"}
    assert {s: client.store(s) for s in before} == before
    status, _ = client.act("graph-gate", "data", gate("lstm.pb", LSTM.read_bytes()))
    assert status == 200 and "lstm.pb" in client.text("sum-graph")


def test_a_plan_upload_cut_mid_way_is_refused(client: Session) -> None:
    client.act("knobs-apply", "n_clicks", 1)
    plan_json = client.store("st-plan")["json"]
    status, _ = client.act("plan-gate", "data", gate("p.json", plan_json.encode(),
                                                       cut=len(plan_json) // 2))
    assert status == 200 and client.message().startswith("plan refused: ")
    assert client.store("st-plan")["json"] == plan_json


# --- a real server: cut connections, oversized bodies, a kill in the middle of editing ------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("lms-data"), "mlp", "--upload-cap", "1MiB").start()
    yield srv
    srv.stop()


def _raw(port: int, head: bytes, body: bytes = b"", *, read: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head + body)
        if not read:
            return b""
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_requests_cut_at_the_socket_or_too_large_leave_the_server_up(server: Server) -> None:
    port = server.port
    # a callback request whose body stops a third of the way, the connection then dropped
    body = json.dumps({"output": "x", "inputs": [{"id": "a", "value": "y" * 300_000}]}).encode()
    head = (b"POST /_dash-update-component HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\n\r\n")
    for _ in range(5):
        _raw(port, head, body[: len(body) // 3], read=False)
    # a header that never ends, left open while the server serves others
    hung = socket.create_connection(("127.0.0.1", port), timeout=30)
    hung.sendall(b"POST /_dash-update-component HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    try:
        assert server.alive()
        # over the server's request cap (the upload cap and base64's 4/3 plus 16 MiB)
        big = (b"POST /_dash-update-component HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Type: application/json\r\nContent-Length: 400000000\r\n\r\n")
        assert _raw(port, big).split(b"\r\n", 1)[0].split()[1] == b"413"
        # not JSON, JSON of the wrong shape, an unknown callback: errors, not a crash
        for junk in (b"{not json", b"[1, 2, 3]", b'{"output": "nope.data", "inputs": []}'):
            reply = _raw(port, b"POST /_dash-update-component HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: "
                         + str(len(junk)).encode() + b"\r\n\r\n", junk)
            assert reply.split()[1][:1] in (b"4", b"5"), reply[:200]
        session = Session(HttpTransport(server.url))
        status, _ = session.act("knobs-apply", "n_clicks", 1)
        assert status == 200 and session.message().startswith("knobs applied")
    finally:
        hung.close()
    assert server.alive()


def _toggle(session: Session, tensor: str) -> tuple[int, dict[str, Any]]:
    return session.act("hotspots", "active_cell",
                       {"row": 0, "column": 0, "column_id": "swap", "row_id": tensor})


def test_the_server_killed_while_editing_comes_back_with_the_edits(tmp_path: pathlib.Path
                                                                   ) -> None:
    srv = Server(tmp_path, "mlp").start()
    try:
        tab = Session(HttpTransport(srv.url))
        tab.act("graph-gate", "data", gate("lstm.pb", LSTM.read_bytes()))
        tab.act("batch", "value", 8)
        tab.act("knobs-apply", "n_clicks", 1)
        rows = tab.props["hotspots"]["data"]
        free = next(r["id"] for r in rows if r["swap"] == rendering.SWAP_OFF)
        status, _ = _toggle(tab, free)
        assert status == 200 and tab.message().startswith(f"{free} swapped")
        plan = plan_from_json(tab.store("st-plan")["json"])
        swapped = tab.text("sum-swapped")
        srv.kill()  # SIGKILL between two edits

        # an edit sent while the server is down fails at the connection, as in the browser
        with pytest.raises(OSError):
            tab.act("knobs-apply", "n_clicks", 2)
        srv.start()
        # the tab reloads: the browser still has its session stores, the server has the
        # upload and the plan on disk
        reloaded = Session(HttpTransport(srv.url))
        for s in ("st-graph", "st-settings", "st-plan", "st-view", "st-history", "st-tab"):
            reloaded.props[s]["data"] = tab.store(s)
        reloaded.fire("studio.figure", [f"{s}.data" for s in ("st-graph", "st-settings",
                                                              "st-plan", "st-view")])
        assert "lstm.pb" in reloaded.text("sum-graph") and "batch 8" in reloaded.text("sum-graph")
        assert reloaded.text("sum-swapped") == swapped
        assert plan_from_json(reloaded.store("st-plan")["json"]) == plan
        loaded = lmscore.load(LSTM)
        saved = (tmp_path / "plans" / tab.store("st-tab")
                 / f"{lmscore.plan.fingerprint(loaded)}.json")
        assert plan_from_json(saved.read_text()) == plan  # written at the last edit
        # and editing goes on
        status, _ = _toggle(reloaded, free)
        assert status == 200 and reloaded.message().startswith(f"{free} no longer swapped")
        assert "Traceback" not in srv.log()
    finally:
        srv.stop()


# --- concurrent sessions -----------------------------------------------------------------

GRAPHS = ("mlp", "lstm", "vgg16")


def run_session(url: str, k: int, results: dict[int, Any]) -> None:
    """Session ``k``: its own graph, batch and knobs, then a hand toggle."""
    try:
        name = GRAPHS[k % len(GRAPHS)]
        s = Session(HttpTransport(url))
        statuses = [s.act("graph-picker", "value", f"sample:{name}")[0]]
        batch = 2 + k
        statuses.append(s.act("batch", "value", batch)[0])
        s.props["knob-threshold"]["value"] = 2 + k % 4
        statuses.append(s.act("knobs-apply", "n_clicks", 1)[0])
        knob_plan = s.store("st-plan")["json"]
        rows = s.props["hotspots"]["data"]
        free = [r["id"] for r in rows if r["swap"] == rendering.SWAP_OFF]
        toggle_message = ""
        if free:
            statuses.append(_toggle(s, free[0])[0])
            toggle_message = s.message()
        results[k] = {"name": name, "batch": batch, "threshold": 2 + k % 4, "statuses":
                      statuses, "graph": s.store("st-graph"), "knob_plan": knob_plan,
                      "plan": s.store("st-plan")["json"], "toggled": free[:1],
                      "toggle_message": toggle_message, "summary": s.text("sum-graph"),
                      "latencies": s.latencies}
    except Exception as e:  # noqa: BLE001 - reported by the test
        results[k] = {"error": f"{type(e).__name__}: {e}"}


@pytest.mark.parametrize("n", [2, 10])
def test_concurrent_sessions_do_not_leak_into_each_other(server: Server, n: int) -> None:
    results: dict[int, Any] = {}
    threads = [threading.Thread(target=run_session, args=(server.url, k, results))
               for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    graphs = {g: lmscore.load(samples.sample_dir() / f"{g}.pb") for g in GRAPHS}
    for k in range(n):
        r = results[k]
        assert "error" not in r, r
        assert r["statuses"] and set(r["statuses"]) == {200}, r["statuses"]
        g = graphs[r["name"]]
        assert r["graph"]["name"] == f"{r['name']}.pb"
        assert r["summary"].startswith(f"{r['name']}.pb") and f"batch {r['batch']}" in r[
            "summary"]
        # the knobs' plan is exactly what this session's graph, batch and knobs give
        expected = plan_from_params(g, r["batch"], threshold=r["threshold"], ahead=1,
                                    groupby=5, sync_mode=0)
        assert plan_from_json(r["knob_plan"]) == expected
        if r["toggled"]:
            assert r["toggle_message"].startswith(f"{r['toggled'][0]} swapped"), r
        plan = plan_from_json(r["plan"])
        check_plan(g, plan)
        assert set(plan.swapped()) == set(expected.swapped()) | set(r["toggled"])
    assert server.alive() and "Traceback" not in server.log()


# --- the hostile corpus as uploads -------------------------------------------------------


def test_the_hostile_corpus_uploaded_gets_one_line_answers(tmp_path: pathlib.Path) -> None:
    """Every graph file of ``tests/hostile`` through the upload path, bounded in time."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).parent / "hostile"))
    import make_corpus

    root = tmp_path / "corpus"
    cases = [c for c in make_corpus.generate(root, truncations=10, bitflips=10)
             if c.kind == "graph" and not c.tf and (root / c.path).is_file()
             and not (root / c.path).is_symlink()]
    ctx = state.new_context("mlp", None, upload_cap_bytes=64 * 2**20, data_dir=tmp_path / "d")
    settings = state.new_session(ctx)["settings"]

    def alarm(*_a: Any) -> None:
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, alarm)
    outcomes: dict[str, int] = {"loaded": 0, "refused": 0}
    problems = []
    try:
        for case in cases:
            suffix = pathlib.Path(case.path).suffix.lower()
            name = f"case{suffix if suffix in state.GRAPH_SUFFIXES else '.pb'}"
            signal.alarm(20)
            try:
                up = edits.upload_graph(ctx, gate(name, (root / case.path).read_bytes()),
                                            settings)
            except TimeoutError:
                problems.append(f"{case.name}: over 20 s")
                continue
            except Exception as e:  # noqa: BLE001 - the failure being tested for
                problems.append(f"{case.name}: {type(e).__name__}: {e}")
                continue
            finally:
                signal.alarm(0)
            if up.error:
                outcomes["refused"] += 1
                if not up.message.startswith("upload refused: ") or "\n" in up.message:
                    problems.append(f"{case.name}: {up.message!r}")
                if case.expect == ("ok",):
                    problems.append(f"{case.name}: refused a valid graph: {up.message}")
            else:
                outcomes["loaded"] += 1
                if "ok" not in case.expect:
                    problems.append(f"{case.name}: loaded, expected {case.expect}")
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not problems, "\n".join(problems)
    assert outcomes["refused"] and outcomes["loaded"], outcomes


def test_bad_server_options_are_one_line_errors(tmp_path: pathlib.Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from lmsviz.app import main

    with pytest.raises(SystemExit) as e:
        main(["mlp", "--port", "99999", "--data-dir", str(tmp_path)])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "lms serve: error: argument --port: must be 1 to 65535, got 99999")
    for args, words in ((["--job-wait", "nan"], "the wait for a job slot must be 0 to 86400"),
                        (["--max-ops", "0"], "the op limit must be positive, got 0"),
                        (["--upload-cap", "12XB"], "not a size: '12XB'")):
        assert main(["mlp", "--data-dir", str(tmp_path), *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("lms: error: ") and words in err and err.count("\n") == 1, err
