"""The lms command line: the JSON contract, the readable summary, and bad input."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from tensorboard.compat.proto import graph_pb2

from lmscore.samples import sample_dir

ROOT = pathlib.Path(__file__).resolve().parent.parent


def lms(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, whatever the cwd
    return subprocess.run(
        [sys.executable, "-m", "lmscore.cli", *args], capture_output=True, text=True,
        cwd=cwd, timeout=120, env=env,
    )


def test_inspect_json_contract():
    r = lms("inspect", str(sample_dir() / "mlp.pb"), "--batch-size", "32", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in ("ops", "levels", "peak_bytes", "peak_level", "persistent_bytes",
                "unknown_size_tensors", "hotspots"):
        assert key in d
    assert d["ops"] == 307 and d["unknown_size_tensors"] == 0
    assert d["peak_bytes"] > d["persistent_bytes"] > 0
    h = d["hotspots"][0]
    assert set(h) >= {"tensor", "bytes", "producer_level", "last_use_level", "distance"}
    assert h["distance"] == h["last_use_level"] - h["producer_level"]
    assert [x["bytes"] for x in d["hotspots"]] == sorted(
        (x["bytes"] for x in d["hotspots"]), reverse=True
    )


def test_inspect_readable_summary_and_sample_names_from_anywhere(tmp_path):
    r = lms("inspect", "resnet50", "--batch-size", "4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "simulated peak" in r.stdout and "MiB" in r.stdout
    assert "tensors alive at the peak" in r.stdout


def test_inspect_does_not_import_tensorflow():
    code = (
        "import sys, lmscore.cli as c; c.main(['inspect', 'mlp', '--json']);"
        "print('TF' if 'tensorflow' in sys.modules else 'noTF', file=sys.stderr)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.strip().endswith("noTF"), r.stderr


def _write_graph(path, nodes):
    gd = graph_pb2.GraphDef()
    for name, op, inputs in nodes:
        n = gd.node.add(name=name, op=op)
        n.input.extend(inputs)
        n.attr["T"].type = 1
        n.attr["dtype"].type = 1
        n.attr["_output_shapes"].list.shape.add().dim.add(size=4)
    path.write_bytes(gd.SerializeToString())
    return path


def bad_inputs(tmp):
    mlp = (sample_dir() / "mlp.pb").read_bytes()
    cases = {
        "missing": (tmp / "nope.pb", "no such file"),
        "text": (tmp / "notes.pb", "not a GraphDef"),
        "truncated": (tmp / "trunc.pb", "not a GraphDef"),
        "empty": (tmp / "empty.pb", "no nodes"),
        "cycle": (tmp / "cycle.pb", "cycle"),
        "dangling": (tmp / "dangling.pb", "no node 'ghost' exists"),
        "bad_text": (tmp / "bad.pbtxt", "not a GraphDef"),
    }
    (tmp / "notes.pb").write_text("these are my notes, not a graph\n" * 20)
    (tmp / "trunc.pb").write_bytes(mlp[: len(mlp) // 2 + 7])
    (tmp / "empty.pb").write_bytes(b"")
    _write_graph(tmp / "cycle.pb", [("a", "Placeholder", []), ("b", "AddV2", ["a", "c"]),
                                    ("c", "Relu", ["b"])])
    _write_graph(tmp / "dangling.pb", [("a", "Placeholder", []), ("b", "Relu", ["ghost:0"])])
    (tmp / "bad.pbtxt").write_text('node { name: "a" op: "Const" attr { key: ')
    return cases


@pytest.mark.parametrize(
    "case", ["missing", "text", "truncated", "empty", "cycle", "dangling", "bad_text"]
)
def test_bad_input_is_one_line_exit_2(tmp_path, case):
    path, message = bad_inputs(tmp_path)[case]
    r = lms("inspect", str(path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("lms: error: ") and str(path) in lines[0]
    assert message in lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("args", [["--batch-size", "0"], ["--batch-size", "x"], ["--top", "-1"]])
def test_bad_options_exit_2(args):
    r = lms("inspect", "mlp", *args)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_rewrite_cli_contract_and_inspect_of_the_result(tmp_path):
    out, plan = tmp_path / "mlp_lms.pb", tmp_path / "plan.json"
    r = lms("rewrite", "mlp", "--threshold", "2", "--ahead", "1", "--out", str(out),
            "--plan-out", str(plan), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in ("baseline_peak_bytes", "predicted_peak_bytes", "predicted_host_peak_bytes",
                "swapped_tensors", "swap_bytes"):
        assert key in d
    assert d["swapped_tensors"] > 0 and d["swap_bytes"] > 0
    assert json.loads(plan.read_text())["version"] == 2
    r = lms("inspect", str(out), "--batch-size", "32", "--json")
    assert r.returncode == 0, r.stderr
    again = json.loads(r.stdout)
    assert again["swap_ops"] > 0
    assert again["peak_bytes"] == d["predicted_peak_bytes"]
    assert again["host_peak_bytes"] == d["predicted_host_peak_bytes"]
    # the same plan applied again gives the same graph
    out2 = tmp_path / "again.pb"
    r = lms("rewrite", "mlp", "--plan", str(plan), "--out", str(out2))
    assert r.returncode == 0, r.stderr
    assert out2.read_bytes() == out.read_bytes()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--threshold", "0"], "threshold"),
        (["--ahead", "-1"], "ahead"),
        (["--plan", "PLAN", "--threshold", "3"], "--plan replaces the knobs"),
        (["--plan", "OTHER"], "another graph"),
    ],
)
def test_rewrite_bad_input_writes_nothing(tmp_path, extra, message):
    lms("rewrite", "lstm", "--out", str(tmp_path / "l.pb"), "--plan-out",
        str(tmp_path / "other.json"))
    lms("rewrite", "mlp", "--out", str(tmp_path / "m.pb"), "--plan-out",
        str(tmp_path / "plan.json"))
    extra = [str(tmp_path / "plan.json") if x == "PLAN" else
             str(tmp_path / "other.json") if x == "OTHER" else x for x in extra]
    out = tmp_path / "out.pb"
    r = lms("rewrite", "mlp", "--out", str(out), *extra)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_rewrite_refuses_input_and_unwritable_destinations(tmp_path):
    src = tmp_path / "mlp.pb"
    src.write_bytes((sample_dir() / "mlp.pb").read_bytes())
    r = lms("rewrite", str(src), "--out", str(src))
    assert r.returncode == 2 and "refusing to overwrite" in r.stderr
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        r = lms("rewrite", str(src), "--out", str(ro / "x.pb"))
        if os.geteuid() != 0:  # root ignores directory permissions
            assert r.returncode == 2 and "cannot write" in r.stderr
            assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)
    r = lms("rewrite", str(src), "--out", str(tmp_path / "missing" / "x.pb"))
    assert r.returncode == 2 and "cannot write" in r.stderr
