"""The measured time model: profile files, scaling by batch, the tuner with a profile."""

from __future__ import annotations

import json
import statistics
from types import MappingProxyType

import pytest

from lmscore.errors import ConfigError
from lmscore.ir import Graph, Op
from lmscore.plan import fingerprint
from lmscore.profile import Profile, load_profile, profiled_op_seconds, save_profile
from lmscore.shapes import resolve
from lmscore.tune import Device, tune
from tests.graphs import t, tiny_step


def _profile(graph: Graph, **kw) -> Profile:
    fields = dict(
        device="/device:CPU:0", batch_size=2,
        op_seconds=MappingProxyType({"r": 1e-6, "mm": 10e-6, "act": 4e-6, "g_w": 6e-6}),
        step_seconds=25e-6, host_to_device_bandwidth=8e9, device_to_host_bandwidth=2e9,
        fingerprint=fingerprint(graph), tensorflow_version="2.21.0", kernel_library="onednn",
        dispatch_seconds=5e-7, steps=3, op_kernels=MappingProxyType({"mm": 1, "act": 1}),
    )
    return Profile(**{**fields, **kw})


def test_round_trip(tmp_path):
    p = _profile(tiny_step())
    save_profile(p, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == p
    assert not list(tmp_path.glob("*.tmp*"))  # the temporary file was renamed
    # both copies of a swapped tensor: 2 bytes / harmonic mean = 1/8e9 + 1/2e9 per byte
    assert p.link_bandwidth == pytest.approx(3.2e9)
    assert p.modelled_step_seconds == pytest.approx(21e-6)


@pytest.mark.parametrize("edit, message", [
    (lambda d: "{", "not JSON"),
    (lambda d: json.dumps([1]), 'not a profile (no "format": "lms-profile")'),
    (lambda d: json.dumps({**d, "version": 7}),
     "field 'version': unsupported profile version 7 (this lms reads 1)"),
    (lambda d: json.dumps({k: v for k, v in d.items() if k != "fingerprint"}),
     "field 'fingerprint' is missing"),
    (lambda d: json.dumps({**d, "batch_size": "8"}), "field 'batch_size': expected int, got str"),
    (lambda d: json.dumps({**d, "steps": True}), "field 'steps': expected int, got bool"),
    (lambda d: json.dumps({**d, "host_to_device_bandwidth": 0}),
     "field 'host_to_device_bandwidth': must be positive, got 0"),
    (lambda d: json.dumps({**d, "op_seconds": {"mm": -1.0}}),
     "field 'op_seconds': op 'mm' has -1.0, not a time in seconds >= 0"),
    (lambda d: json.dumps({**d, "op_seconds": [1.0]}),
     "field 'op_seconds': expected dict, got list"),
    (lambda d: json.dumps({**d, "op_kernels": {"mm": 0}}),
     "field 'op_kernels': expected a count >= 1 per op"),
])
def test_bad_files_name_the_field(tmp_path, edit, message):
    good = tmp_path / "good.json"
    save_profile(_profile(tiny_step()), good)
    bad = tmp_path / "bad.json"
    bad.write_text(edit(json.loads(good.read_text())))
    with pytest.raises(ConfigError) as e:
        load_profile(bad)
    assert str(e.value) == f"{bad}: {message}"


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^.*nope\.json: no such profile file$"):
        load_profile(tmp_path / "nope.json")


# A roofline of 1 MFLOP/s, no bandwidth bound and 1 us per op: at batch b, MatMul x[b,4] @
# r[4,2] does 2 * 2b * 4 = 16b FLOPs, Relu 2b, the weight gradient x^T[4,b] @ g[b,2] 16b.
MODEL = Device("model", 0, 1e6, float("inf"), 1e-6)


def test_scaling_by_batch():
    g = tiny_step()
    p = _profile(g)
    at2 = dict(zip([o.name for o in g.ops], profiled_op_seconds(g, resolve(g, 2), p, MODEL),
                   strict=True))
    assert {k: v for k, v in at2.items() if v} == dict(p.op_seconds)  # the rest did not run
    at6 = dict(zip([o.name for o in g.ops], profiled_op_seconds(g, resolve(g, 6), p, MODEL),
                   strict=True))
    # 1 us of launch per kernel stays; the rest scales by the FLOPs: 96 / 32 and 12 / 4
    assert at6["mm"] == pytest.approx(1e-6 + 9e-6 * 96 / 32)
    assert at6["act"] == pytest.approx(1e-6 + 3e-6 * 12 / 4)
    assert at6["g_w"] == pytest.approx(1e-6 + 5e-6 * 96 / 32)  # one kernel when not counted
    assert at6["r"] == 1e-6  # a variable read: no modelled cost, not scaled
    assert at6["loss"] == 0.0  # absent from the profile of this graph: it did not run
    loop = _profile(g, op_kernels=MappingProxyType({"mm": 3}))  # a call running 3 kernels
    at6 = profiled_op_seconds(g, resolve(g, 6), loop, MODEL)
    assert at6[[o.name for o in g.ops].index("mm")] == pytest.approx(3e-6 + 7e-6 * 96 / 32)


def test_clones_and_new_ops():
    g = tiny_step()
    p = _profile(g)
    act = g.ops[g.index["act"]]
    clone = Op("lms/recompute_act_0/act", "Relu", inputs=act.inputs, outputs=t("float", -1, 2),
               attrs={"_lms_clone_of": "act"})
    swap = Op("lms/swapout_mm_0", "Identity", inputs=("mm:0",), outputs=t("float", -1, 2),
              attrs={"_lms_role": "swap_out"})
    h = Graph((*g.ops, clone, swap), "with clones")
    at6 = dict(zip([o.name for o in h.ops], profiled_op_seconds(h, resolve(h, 6), p, MODEL),
                   strict=True))
    assert at6["lms/recompute_act_0/act"] == at6["act"] == pytest.approx(1e-6 + 3e-6 * 3)
    assert at6["lms/swapout_mm_0"] == 0.0  # the link's time, not the device's
    assert at6["loss"] == pytest.approx(2e-6)  # another graph: the roofline (1 FLOP + 1 us)


def test_tune_uses_the_profile_and_refuses_another_graph():
    g = tiny_step()
    p = _profile(g)
    r = tune(g, 2, 1 << 30, profile=p)
    assert r.baseline_step_seconds == pytest.approx(21e-6)
    other = _profile(g, fingerprint="0123456789abcdef")
    with pytest.raises(ConfigError) as e:
        tune(g, 2, 1 << 30, profile=other)
    assert str(e.value) == (f"profile: made for another graph (fingerprint 0123456789abcdef, "
                            f"this graph's is {fingerprint(g)}); profile this one")


@pytest.mark.tf
@pytest.mark.slow
def test_profiled_mlp_predicts_its_step():
    """(a): the profile predicts the step, measured again one op at a time, within 10%.

    Slow-marked: on a shared 2-core machine the same step runs 10.0-13.0 ms from one
    session of a process to the next, which is the 10% itself; bench/bench_profile.py
    gives the figures over repeated profiles.
    """
    import lmscore
    from lmscore.measure import measure
    from lmscore.profile import profile

    g = lmscore.load("sample_graphs/mlp.pb")
    # a 10 ms step: at batch 256 (3-4 ms) the same step measured 3.4-6.4 ms from one
    # session of this process to the next, more than the model's error
    batch = 1024
    p = profile(g, batch, steps=10)
    assert set(p.op_seconds) <= {op.name for op in g.ops}
    predicted = sum(profiled_op_seconds(g, resolve(g, batch), p))
    runs = [statistics.median(measure(g.graphdef, batch, steps=12, trace_step=0)
                              .step_seconds[1:]) for _ in range(3)]
    measured = statistics.median(runs)
    assert abs(predicted / measured - 1) < 0.10, (predicted, runs)
    # the modelled step of a profile replaces the tuner's preset
    r = tune(g, batch, 1 << 30, profile=p)
    assert r.baseline_step_seconds == pytest.approx(predicted)


@pytest.mark.tf
def test_lms_profile_then_tune_with_it(tmp_path, capsys):
    from lmscore import cli, load, samples
    from lmscore.profile import profiled_op_seconds as seconds_of

    out = tmp_path / "mlp.json"
    assert cli.main(["profile", "mlp", "--batch-size", "256", "--steps", "3",
                     "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "step, measured" in printed and f"wrote {out}" in printed
    p = load_profile(out)
    g = load(samples.find("mlp"))
    assert p.batch_size == 256 and p.fingerprint == fingerprint(g) and p.op_kernels
    assert cli.main(["tune", "mlp", "--budget", "64MiB", "--batch-size", "1024",
                     "--profile", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["baseline_step_seconds"] == pytest.approx(
        sum(seconds_of(g, resolve(g, 1024), p)))
    assert cli.main(["tune", "bert", "--budget", "1GiB", "--profile", str(out)]) == 2
    assert "profile: made for another graph" in capsys.readouterr().err
