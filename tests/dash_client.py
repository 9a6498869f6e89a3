"""A minimal HTTP client of the web app: what the browser's Dash renderer sends, by hand.

Used by the fault and concurrency tests and by ``bench/bench_sessions.py`` to drive many
sessions without a browser. A :class:`Session` holds what one browser tab holds (the
component properties of its layout, including the session stores) and fires the app's
server-side callbacks the way the renderer does: the control callback for a user action,
then the render callback on the stores it changed.
"""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

STORES = ("st-graph", "st-settings", "st-plan", "st-view")
REPO = pathlib.Path(__file__).resolve().parent.parent


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every component of a serialized layout."""
    if isinstance(node, dict):
        if "props" in node and "type" in node:
            yield node
            yield from _walk(node["props"].get("children"))
        else:
            for v in node.values():
                yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _outputs(spec: str) -> list[dict[str, str]]:
    """``{"id", "property"}`` of each output of a callback's output string."""
    parts = spec.strip(".").split("...") if spec.startswith("..") else [spec]
    out = []
    for part in parts:
        cid, _, prop = part.rpartition(".")
        out.append({"id": cid, "property": prop.split("@")[0], "full": prop})
    return out


class HttpTransport:
    """POST/GET against a server at ``base`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, base: str, timeout: float = 120.0) -> None:
        self.base = base.rstrip("/")
        self.timeout = timeout

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=self.timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        req = urllib.request.Request(self.base + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


class FlaskTransport:
    """The same calls through a Flask test client (no socket)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def get(self, path: str) -> tuple[int, bytes]:
        r = self.client.get(path)
        return r.status_code, r.data

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        r = self.client.post(path, data=body, content_type="application/json")
        return r.status_code, r.data


class Session:
    """One browser tab: its layout's properties and the callbacks it can fire."""

    def __init__(self, transport: Any) -> None:
        self.t = transport
        status, body = self.t.get("/_dash-dependencies")
        assert status == 200, status
        self.deps = [d for d in json.loads(body) if not d.get("clientside_function")]
        status, body = self.t.get("/_dash-layout")
        assert status == 200, status
        self.props: dict[str, dict[str, Any]] = {}
        for comp in _walk(json.loads(body)):
            cid = comp["props"].get("id")
            if isinstance(cid, str):
                self.props[cid] = dict(comp["props"])
        self.latencies: list[tuple[str, float]] = []

    def _dep(self, first_output: str) -> dict[str, Any]:
        for d in self.deps:
            if _outputs(d["output"])[0]["id"] + "." + _outputs(d["output"])[0]["property"] \
                    == first_output:
                return d
        raise KeyError(first_output)

    def fire(self, first_output: str, changed: list[str]) -> tuple[int, dict[str, Any]]:
        """Fire the callback whose first output is ``first_output``; apply its response.

        Returns the HTTP status and the response's ``{id: {prop: value}}``.
        """
        d = self._dep(first_output)

        def val(spec: dict[str, str]) -> dict[str, Any]:
            v = self.props.get(spec["id"], {}).get(spec["property"])
            return {"id": spec["id"], "property": spec["property"], "value": v}

        outs = _outputs(d["output"])
        body = {
            "output": d["output"],
            "outputs": [{"id": o["id"], "property": o["full"]} for o in outs]
            if len(outs) > 1 else {"id": outs[0]["id"], "property": outs[0]["full"]},
            "inputs": [val(s) for s in d["inputs"]],
            "state": [val(s) for s in d["state"]],
            "changedPropIds": changed,
        }
        t0 = time.perf_counter()
        status, raw = self.t.post("/_dash-update-component", json.dumps(body).encode())
        self.latencies.append((first_output, time.perf_counter() - t0))
        if status != 200:
            return status, {}
        response = json.loads(raw)["response"] if raw else {}
        for cid, props in response.items():
            for prop, value in props.items():
                self.props.setdefault(cid, {})[prop] = value
        return status, response

    def act(self, component: str, prop: str, value: Any) -> tuple[int, dict[str, Any]]:
        """A user action on ``component.prop``: the control callback, then a render."""
        self.props.setdefault(component, {})[prop] = value
        status, response = self.fire("st-graph.data", [f"{component}.{prop}"])
        if status == 200:
            changed = [f"{s}.data" for s in STORES if s in response]
            if changed:
                r_status, _ = self.fire("studio.figure", changed)
                status = r_status if r_status != 200 else status
        return status, response

    def message(self, area: str | None = None) -> str:
        """The text of message area ``area``, or the one that shows something (both
        areas never do: an answer clears the other)."""
        areas = (area,) if area else ("edit-message", "message")
        return next((t for a in areas if (t := str(self.props.get(a, {}).get("children")
                                                   or ""))), "")

    def text(self, cid: str) -> str:
        """The text of component ``cid`` wherever it is nested (e.g. the summary's items)."""
        for props in self.props.values():
            for comp in _walk(props.get("children")):
                if comp["props"].get("id") == cid:
                    return str(comp["props"].get("children") or "")
        return ""

    def store(self, name: str) -> Any:
        return self.props.get(name, {}).get("data")


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``cond`` until true, else fail naming ``what``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    """A free TCP port of 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m lmsviz`` in a subprocess on 127.0.0.1, logging to ``data/server.log``."""

    def __init__(self, data: pathlib.Path, *args: str, port: int | None = None) -> None:
        self.data, self.args = data, args
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90) -> Server:
        """Start the server and wait until it answers."""
        log = open(self.data / "server.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lmsviz", *self.args, "--port", str(self.port),
             "--data-dir", str(self.data)],
            cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.url + "/", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"the app did not start: {self.log()[-2000:]}")
            time.sleep(0.3)

    def alive(self) -> bool:
        """Whether the process runs and answers a page request."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(self.url + "/", timeout=10) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, as in a crash or an OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def rss_peak_kib(self) -> int | None:
        """The server's peak resident memory so far (``VmHWM``), in KiB."""
        try:
            status = pathlib.Path(f"/proc/{self.proc.pid}/status").read_text()  # type: ignore[union-attr]
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return None

    def log(self) -> str:
        """The server's output so far."""
        try:
            return (self.data / "server.log").read_text(errors="replace")
        except OSError:
            return ""
