"""The lms command line: the JSON contract, the readable summary, and bad input."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import pathlib
import re
import subprocess
import sys

import pytest
from tensorboard.compat.proto import graph_pb2

from lmscore import cli
from lmscore.errors import ConfigError
from lmscore.samples import sample_dir
from lmscore.units import parse_bytes

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


def _write_graph(path, nodes, dim=4):
    gd = graph_pb2.GraphDef()
    for name, op, inputs in nodes:
        n = gd.node.add(name=name, op=op)
        n.input.extend(inputs)
        n.attr["T"].type = 1
        n.attr["dtype"].type = 1
        n.attr["_output_shapes"].list.shape.add().dim.add(size=dim)
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
        "plan_renamed": (tmp / "plan.pb", "a plan (JSON), not a graph: load it as a plan"),
        "saved_model_pb": (tmp / "saved_model.pb", "load the SavedModel's directory"),
    }
    (tmp / "plan.pb").write_text('{"version": 1, "graph": "x", "sync_mode": 0, "swaps": []}')
    saved_model_pb2 = pytest.importorskip("tensorflow.core.protobuf.saved_model_pb2")
    sm = saved_model_pb2.SavedModel(saved_model_schema_version=1)
    sm.meta_graphs.add().graph_def.ParseFromString(mlp)
    (tmp / "saved_model.pb").write_bytes(sm.SerializeToString())
    (tmp / "notes.pb").write_text("these are my notes, not a graph\n" * 20)
    (tmp / "trunc.pb").write_bytes(mlp[: len(mlp) // 2 + 7])
    (tmp / "empty.pb").write_bytes(b"")
    _write_graph(tmp / "cycle.pb", [("a", "Placeholder", []), ("b", "AddV2", ["a", "c"]),
                                    ("c", "Relu", ["b"])])
    _write_graph(tmp / "dangling.pb", [("a", "Placeholder", []), ("b", "Relu", ["ghost:0"])])
    (tmp / "bad.pbtxt").write_text('node { name: "a" op: "Const" attr { key: ')
    return cases


@pytest.mark.parametrize(
    "case", ["missing", "text", "truncated", "empty", "cycle", "dangling", "bad_text",
             "plan_renamed", "saved_model_pb"]
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


# --- the command line as people expect it --------------------------------------------------

#: A line of TensorFlow's C++ logging (``I0000 00:00:17... port.cc:153] ...``) or absl's.
TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} |absl::InitializeLog|oneDNN custom operations",
                         re.MULTILINE)


@pytest.fixture(autouse=True)
def _restore_tf_logging(monkeypatch):
    """main() decides TensorFlow's logging for its process: undo it after each test."""
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    for name in ("tensorflow", "absl"):
        logger = logging.getLogger(name)
        monkeypatch.setattr(logger, "level", logger.level)


class _TTY(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _one_error_line(capsys, code) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lms: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _run(argv) -> int:
    """main(argv), with argparse's exit status as the return value."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return int(e.code)


@pytest.mark.tf
def test_tensorflow_log_lines_hidden_unless_verbose():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)
    runs = {}
    for name, extra in (("quiet", []), ("verbose", ["--verbose"])):
        runs[name] = subprocess.run(
            [sys.executable, "-m", "lmscore.cli", "validate", "sample_graphs/mlp.pb", *extra],
            capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)
        assert runs[name].returncode == 0, runs[name].stderr
        assert "device peak" in runs[name].stdout
    assert runs["quiet"].stderr == ""
    assert TF_LOG_LINE.search(runs["verbose"].stderr), runs["verbose"].stderr


def test_quiet_tensorflow_decides_the_log_level():
    cli.quiet_tensorflow(False)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "3"
    assert logging.getLogger("tensorflow").level == logging.ERROR
    assert logging.getLogger("absl").level == logging.ERROR
    cli.quiet_tensorflow(True)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert logging.getLogger("tensorflow").level == logging.NOTSET
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"  # the user's own choice stands without --verbose
    cli.quiet_tensorflow(False)
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "1"


@pytest.mark.parametrize("argv", [["--verbose", "inspect", "mlp"], ["inspect", "mlp", "-v"],
                                  ["inspect", "--verbose", "mlp"], ["-v", "inspect", "mlp"]])
def test_verbose_before_or_after_the_command(argv, capsys):
    assert cli.build_parser().parse_args(argv).verbose is True
    assert cli.build_parser().parse_args(["inspect", "mlp"]).verbose is False
    assert cli.main([*argv, "--top", "1"]) == 0
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    assert "simulated peak" in capsys.readouterr().out


def test_verbose_before_serve_reaches_the_web_app(capsys):
    assert _run(["--verbose", "serve", "-h"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lms serve") and "--verbose" in out


def _options_without_help(text: str) -> list[str]:
    """Option lines of an argparse help text that have no description."""
    lines = text.split("options:", 1)[1].splitlines()
    bare = []
    for i, line in enumerate(lines):
        if not line.startswith("  -"):
            continue
        inline = re.match(r"^  \S.*?\S {2,}\S", line)
        below = i + 1 < len(lines) and lines[i + 1].startswith(" " * 8)
        if not (inline or below):
            bare.append(line.strip())
    return bare


def test_every_option_of_every_command_is_described():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) >= {"inspect", "validate", "rewrite", "tune", "samples", "serve"}
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.help == argparse.SUPPRESS:
                continue
            assert action.help, f"lms {name} {action.option_strings or action.dest}: no help"
            default = action.default
            if default not in (None, False, [], argparse.SUPPRESS):
                assert str(default) in action.help, (name, action.option_strings, default)
        if name != "serve":
            assert _options_without_help(p.format_help()) == [], name
    budget = " ".join(sub.choices["tune"].format_help().split())
    assert "8GB = 8e9" in budget and "8GiB = 8G = 2**33" in budget
    assert "P100, V100, A100, H100" in budget and "pcie3, pcie4, nvlink2" in budget


def test_serve_help_describes_every_option(capsys):
    assert _run(["serve", "-h"]) == 0
    out = capsys.readouterr().out
    assert _options_without_help(out) == []
    assert "--upload-cap SIZE" in out and "8GiB = 8G = 2**33" in " ".join(out.split())


def test_help_check_finds_an_option_without_help():
    p = argparse.ArgumentParser()
    p.add_argument("--described", help="something")
    p.add_argument("--bare")
    assert _options_without_help(p.format_help()) == ["--bare BARE"]


@pytest.mark.parametrize(("text", "value"), [
    ("8GB", 8 * 10**9), ("8GiB", 2**33), ("8g", 2**33), ("8G", 2**33), ("8 GiB", 2**33),
    ("8gib", 2**33), ("15.5GB", 15_500_000_000), ("0.3GB", 300_000_000), ("800MiB", 800 * 2**20),
    ("800M", 800 * 2**20), ("2k", 2048), ("2KB", 2000), ("1024", 1024), (" 1.5 TiB ", 3 * 2**39),
])
def test_sizes_as_people_write_them(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize(("text", "message"), [
    ("-8GB", "size must be positive, got '-8GB'"), ("0", "size must be positive, got '0'"),
    ("0GiB", "size must be positive"), ("0.1", "size must be positive"),
    ("- 1G", "size must be positive"), ("8XB", "not a size: '8XB'"), ("lots", "not a size"),
    ("", "not a size"), ("1e9", "not a size"),
])
def test_bad_sizes_say_what_is_wrong(text, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        parse_bytes(text, "--budget")
    assert str(e.value).startswith("--budget: ")


@pytest.mark.parametrize("argv", [
    ["tune", "mlp", "--budget", "-8GB"], ["tune", "mlp", "--budget=-8GB"],
    ["tune", "mlp", "--budget", "0"],
    ["rewrite", "mlp", "--out", "OUT", "--serialize-min", "-2GiB"],
    ["serve", "mlp", "--upload-cap", "-5MB"], ["serve", "mlp", "--upload-cap", "0"],
])
def test_negative_or_zero_sizes_refused_naming_the_option(argv, capsys, tmp_path):
    argv = [str(tmp_path / "out.pb") if a == "OUT" else a for a in argv]
    if argv[0] == "serve":
        argv += ["--data-dir", str(tmp_path)]
    line = _one_error_line(capsys, _run(argv))
    flag = next(a for a in argv if a.startswith("--") and a.split("=")[0] in (
        "--budget", "--serialize-min", "--upload-cap")).split("=")[0]
    assert f"lms: error: {flag}: size must be positive, got '" in line
    assert not (tmp_path / "out.pb").exists()


@pytest.mark.parametrize(("budget", "value"), [("8GB", 8 * 10**9), ("8 GiB", 2**33),
                                               ("8g", 2**33)])
def test_budget_sizes_reach_the_tuner(budget, value, capsys):
    assert cli.main(["tune", "mlp", "--budget", budget, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["device_memory_bytes"] == value


def test_presets_any_case_in_the_cli_and_the_api(capsys):
    assert cli.main(["tune", "mlp", "--budget", "1G", "--device", "v100",
                     "--link", "NVLink2"]) == 0
    assert "(batch size 32, V100 1.00 GiB, nvlink2," in capsys.readouterr().out
    from lmscore.load import load
    from lmscore.tune import DEVICES, LINKS, bound_batch, max_batch, preset, tune

    assert preset(" h100", DEVICES, "device") == "H100" and preset("PCIE4", LINKS, "link") == \
        "pcie4"
    graph = load(sample_dir() / "mlp.pb")
    a = tune(graph, 32, 2**30, device="a100", link="NVLINK2")
    b = tune(graph, 32, 2**30, device="A100", link="nvlink2")
    assert a.predicted_step_seconds == b.predicted_step_seconds
    assert a.baseline_step_seconds != tune(graph, 32, 2**30).baseline_step_seconds
    assert bound_batch(graph, 2**26, device="p100") == bound_batch(graph, 2**26, device="P100")
    assert max_batch(graph, 2**25, device="v100", rewrite_plans=False)[0] > 0
    with pytest.raises(ConfigError, match=r"unknown device 'tpu' \(choose from P100, V100"):
        tune(graph, 32, device="tpu")
    with pytest.raises(ConfigError, match="unknown link 'wifi'"):
        max_batch(graph, 2**25, link="wifi")
    with pytest.raises(ConfigError, match="unknown device"):
        bound_batch(graph, 2**25, device="K80")


@pytest.mark.parametrize(("flag", "value", "listed"), [
    ("--device", "tpu", "(choose from P100, V100, A100, H100)"),
    ("--link", "wifi", "(choose from pcie3, pcie4, nvlink2)"),
])
def test_unknown_presets_refused_listing_them(flag, value, listed, capsys):
    line = _one_error_line(capsys, _run(["tune", "mlp", "--budget", "1G", flag, value]))
    assert line.startswith(f"lms: error: {flag}: unknown {flag[2:]} '{value}' {listed}")


def test_unknown_batch_dimension_says_which_batch(tmp_path, capsys):
    mine = tmp_path / "mine.pb"  # not a bundled sample: no batch size to fall back on
    mine.write_bytes((sample_dir() / "mlp.pb").read_bytes())
    assert cli.main(["inspect", str(mine), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["batch_size"] == 1
    assert err == ("lms: batch size not given; using 1 (the graph's batch dimension is "
                   "unknown)\n")
    assert cli.main(["inspect", str(mine), "--batch-size", "8", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["batch_size"] == 8 and err == ""
    assert cli.main(["inspect", "mlp", "--json"]) == 0  # a sample: its own batch size
    out, err = capsys.readouterr()
    assert json.loads(out)["batch_size"] == 32 and err == ""


def test_fixed_batch_dimension_ignores_another_batch_size(tmp_path, capsys):
    fixed = _write_graph(tmp_path / "fixed.pb", [("x", "Placeholder", []),
                                                 ("y", "Relu", ["x:0"])])  # x: [4]
    assert cli.main(["inspect", str(fixed), "--batch-size", "64", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["batch_size"] == 4
    assert err == "lms: --batch-size 64 ignored: the graph's batch dimension is fixed at 4\n"
    for extra in ([], ["--batch-size", "4"]):
        assert cli.main(["inspect", str(fixed), "--json", *extra]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["batch_size"] == 4 and err == ""
    empty = _write_graph(tmp_path / "empty_feed.pb", [("x", "Placeholder", []),
                                                      ("y", "Relu", ["x:0"])], dim=0)
    assert cli.main(["inspect", str(empty), "--batch-size", "3", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["batch_size"] == 3 and err == ""  # no batch to keep: as given


def test_max_batch_of_a_fixed_batch_graph_says_so(tmp_path, capsys):
    """Every batch of a graph with a fixed batch is the same step: --max-batch would answer
    its search's limit (65,536 on a CTC model traced at batch 8)."""
    fixed = _write_graph(tmp_path / "fixed.pb", [("x", "Placeholder", []),
                                                 ("y", "Relu", ["x:0"])])
    line = _one_error_line(capsys, cli.main(["tune", str(fixed), "--budget", "1MiB",
                                             "--max-batch"]))
    assert line == (f"lms: error: --max-batch: {fixed}: the graph's batch dimension is fixed "
                    "at 4; trace the step with an unknown batch (None) to search it")


def test_batch_note_gives_way_to_an_error(tmp_path, capsys):
    mine = tmp_path / "mine.pb"
    mine.write_bytes((sample_dir() / "mlp.pb").read_bytes())
    line = _one_error_line(capsys, cli.main(["rewrite", str(mine), "--out", str(tmp_path)]))
    assert line == f"lms: error: {tmp_path}: is a directory"


@pytest.mark.parametrize("command", [["inspect"], ["validate"], ["tune", "--budget", "1G"],
                                     ["rewrite", "--out", "OUT"]])
def test_function_on_a_graphdef_refused(command, tmp_path, capsys):
    argv = [command[0], "mlp", *command[1:], "--function", "train_step"]
    argv = [str(tmp_path / "o.pb") if a == "OUT" else a for a in argv]
    line = _one_error_line(capsys, _run(argv))
    assert "--function applies to SavedModels (a directory or .zip) only" in line
    assert "mlp.pb is a GraphDef" in line
    assert not (tmp_path / "o.pb").exists()


def test_tune_out_writes_the_unchanged_step_when_nothing_needs_swapping(tmp_path, capsys):
    from lmscore.load import load

    out, plan = tmp_path / "t.pb", tmp_path / "t.json"
    assert cli.main(["tune", "mlp", "--budget", "1GB", "--out", str(out),
                     "--plan-out", str(plan)]) == 0
    text = capsys.readouterr().out
    assert f"wrote graph {out} (the step unchanged: it fits without swapping)" in text
    written, original = load(out), load(sample_dir() / "mlp.pb")
    assert [op.name for op in written.ops] == [op.name for op in original.ops]
    assert not any(op.attrs.get("_lms_role") for op in written.ops)
    assert json.loads(plan.read_text())["swaps"] == []
    # and a rewrite that swaps is written as before, without the note
    assert cli.main(["tune", "resnet50", "--budget", "0.8GiB", "--strategy", "knobs",
                     "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"wrote graph {out}\n" in text
    assert any(op.attrs.get("_lms_role") for op in load(out).ops)


def test_tune_names_the_tensors_it_could_not_size(monkeypatch, capsys):
    """A plan fits only as far as the sizes go: tensors of unknown size (counted 0 bytes)
    are named beside the verdict, and counted in the JSON report."""
    import dataclasses
    import importlib

    tuning = importlib.import_module("lmscore.tune")  # (the package exports tune itself)
    assert cli.main(["tune", "mlp", "--budget", "1GB"]) == 0
    assert "unknown size" not in capsys.readouterr().out
    real = tuning.resolve
    monkeypatch.setattr(tuning, "resolve", lambda g, b: dataclasses.replace(
        real(g, b), unknown=("frame:0", "gather:0")))
    assert cli.main(["tune", "mlp", "--budget", "1GB"]) == 0
    assert ("2 tensor(s) of unknown size counted as 0 bytes (frame:0, gather:0): the plan's "
            "peak leaves them out") in capsys.readouterr().out
    assert cli.main(["tune", "mlp", "--budget", "1GB", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["unknown_size_tensors"] == 2
    assert report["unknown_size_examples"] == ["frame:0", "gather:0"]


def test_tune_writes_nothing_when_no_plan_fits(tmp_path, capsys):
    """A refusal leaves --out and --plan-out as they were: a file from an earlier fit stays."""
    out, plan = tmp_path / "t.pb", tmp_path / "t.json"
    out.write_bytes(b"earlier graph")
    plan.write_text("earlier plan")
    assert cli.main(["tune", "mlp", "--budget", "1KB", "--out", str(out),
                     "--plan-out", str(plan)]) == 1
    text = capsys.readouterr().out
    assert out.read_bytes() == b"earlier graph" and plan.read_text() == "earlier plan"
    assert f"wrote no graph: no plan fits ({out} left as it was)" in text
    assert f"wrote no plan: no plan fits ({plan} left as it was)" in text
    fresh = tmp_path / "new.pb"
    assert cli.main(["tune", "mlp", "--budget", "1KB", "--out", str(fresh), "--json"]) == 1
    capsys.readouterr()
    assert not fresh.exists()


class _Recorder(cli._Progress):
    """The CLI's progress bar, recording what it is told."""

    calls: list = []

    def __call__(self, fraction, message):
        type(self).calls.append((fraction, message))
        super().__call__(fraction, message)


def test_progress_bar_only_on_a_terminal():
    quiet = io.StringIO()
    with cli._Progress("tuning", quiet) as bar:
        bar(0.5, "half way")
    assert quiet.getvalue() == ""
    tty = _TTY()
    with cli._Progress("tuning", tty) as bar:
        bar(0.25, "a quarter")
        bar.span(0.5, 1.0, "part two: ")(0.5, "half of it")
    shown = tty.getvalue()
    assert "tuning" in shown and "75%" in shown and "part two: half of it" in shown
    tty = _TTY()
    with cli._Progress("tuning", tty) as bar:
        bar(0.5, "known")
        bar(None, "largest batch")  # unknown length: no percentage
    frames = [f for f in tty.getvalue().split("\x1b[2K") if "largest batch" in f]
    assert frames and all("%" not in f for f in frames)


def test_tune_draws_progress_on_a_terminal_only(monkeypatch, capsys):
    assert cli.main(["tune", "resnet50", "--budget", "3GiB"]) == 0
    assert capsys.readouterr().err == ""  # not a terminal
    tty = _TTY()
    monkeypatch.setattr(sys, "stderr", tty)
    assert cli.main(["tune", "resnet50", "--budget", "3GiB"]) == 0
    assert "tuning" in tty.getvalue() and "%" in tty.getvalue()


def test_tune_max_batch_reports_progress(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_Progress", _Recorder)
    _Recorder.calls = []
    assert cli.main(["tune", "mlp", "--budget", "24MiB", "--max-batch", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_batch_with"] > 0
    known = [f for f, _ in _Recorder.calls if f is not None]
    assert known and all(0.0 <= f <= 0.8 for f in known)  # tuning itself, then max-batch
    batch = [m for f, m in _Recorder.calls if f is None]
    # the bound first: the search for the largest batch never tries past it
    assert batch[0] == "the batch no plan can pass"
    assert batch[1:] and all(m.startswith("largest batch: ") for m in batch[1:])


@pytest.mark.tf
def test_validate_reports_progress(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_Progress", _Recorder)
    _Recorder.calls = []
    assert cli.main(["validate", "mlp", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["finite"] is True
    fractions = [f for f, _ in _Recorder.calls]
    assert fractions == sorted(fractions) and fractions[0] == 0.0
    assert "running 2 steps on the CPU" in [m for _, m in _Recorder.calls]


@pytest.mark.tf
def test_validate_plan_reports_progress(monkeypatch, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert cli.main(["rewrite", "mlp", "--threshold", "2", "--out", str(tmp_path / "m.pb"),
                     "--plan-out", str(plan)]) == 0
    capsys.readouterr()
    monkeypatch.setattr(cli, "_Progress", _Recorder)
    _Recorder.calls = []
    assert cli.main(["validate", "mlp", "--plan", str(plan), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["swapped_tensors"] > 0
    fractions = [f for f, _ in _Recorder.calls]
    assert fractions == sorted(fractions) and fractions[-1] < 1
    messages = [m for _, m in _Recorder.calls]
    assert "running the original step" in messages
    assert [m for m in messages if m.startswith("running the rewritten step")] == [
        f"running the rewritten step ({k} of 3)" for k in (1, 2, 3)]


def test_tune_says_when_host_memory_stops_a_larger_batch(capsys):
    argv = ["tune", "bert", "--budget", "1GiB", "--strategy", "swap"]
    assert cli.main([*argv, "--batch-size", "54", "--host-memory", "200MiB", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["fits"] and report["limited_by"] == "host"
    assert report["host_limit_bytes"] == 200 * 2**20
    assert cli.main([*argv, "--batch-size", "54", "--json"]) == 0  # 128 GiB by default
    assert json.loads(capsys.readouterr().out)["predicted_host_peak_bytes"] > 200 * 2**20
    assert cli.main([*argv, "--host-memory", "200MiB", "--max-batch"]) == 0
    out = capsys.readouterr().out
    largest = int(re.search(r"(\d+) with the tuned rewrite", out).group(1))
    assert 0 < largest < 54
    assert (f"host memory stops batch {largest + 1}: its plan fits the device but not the "
            "host") in out


@pytest.mark.tf
def test_validate_plan_measures_the_device_it_was_tuned_for(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert cli.main(["tune", "mlp", "--budget", "12MiB", "--plan-out", str(plan)]) == 0
    doc = json.loads(plan.read_text())
    assert doc["params"]["device_bytes"] == 12 * 2**20
    assert doc["params"]["workspace"] == "accelerator"
    capsys.readouterr()
    assert cli.main(["validate", "mlp", "--plan", str(plan), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tuned_device_bytes"] == 12 * 2**20
    assert report["within_tuned_device"] is (max(report["rewritten_runs"]) <= 12 * 2**20)
    assert report["within_tuned_device"]
    # the same plan said to be for a device smaller than its measured peak
    doc["params"]["device_bytes"] = 10 * 2**20
    small = tmp_path / "small.json"
    small.write_text(json.dumps(doc))
    assert cli.main(["validate", "mlp", "--plan", str(small)]) == 0
    out = capsys.readouterr().out
    ratio = max(report["rewritten_runs"]) / (10 * 2**20)
    assert f"DOES NOT FIT: measured 11.29 MiB, {ratio:.3f} of the 10.00 MiB device" in out
    assert "tune with --workspace cpu" in out
    # at another batch the plan claims nothing
    assert cli.main(["validate", "mlp", "--batch-size", "16", "--plan", str(plan),
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["within_tuned_device"] is None


def test_a_usage_error_points_at_the_right_help(capsys):
    """An unknown command points at the top level's help, a command's error at its own."""
    line = _one_error_line(capsys, _run(["swap", "mlp"]))
    assert "invalid choice: 'swap'" in line and line.endswith("(see 'lms -h')")
    line = _one_error_line(capsys, _run(["tune", "mlp"]))
    assert "--budget" in line and line.endswith("(see 'lms tune -h')")


def test_inspect_names_the_sizes_only_the_data_decide(tmp_path):
    """``Where``'s coordinates, one row per true element, are counted for every element:
    the report says so in one line (and in the JSON), as a bound, not a measurement."""
    gd = graph_pb2.GraphDef()
    for name, op, inputs, shape in (("x", "Placeholder", [], [-1, 20]),
                                    ("mask", "IsFinite", ["x"], [-1, 20]),
                                    ("where", "Where", ["mask"], [-1, 2])):
        n = gd.node.add(name=name, op=op)
        n.input.extend(inputs)
        n.attr["T"].type = 10 if op == "Where" else 1  # bool, float
        n.attr["dtype"].type = 1
        s = n.attr["_output_shapes"].list.shape.add()
        for d in shape:
            s.dim.add(size=d)
    path = tmp_path / "mask.pb"
    path.write_bytes(gd.SerializeToString())
    r = lms("inspect", str(path), "--batch-size", "4")
    assert r.returncode == 0, r.stderr
    assert "1 tensor(s) whose size the data decide counted at their most (where:0)" in r.stdout
    r = lms("inspect", str(path), "--batch-size", "4", "--json")
    assert json.loads(r.stdout)["at_most_size_tensors"] == ["where:0"]
