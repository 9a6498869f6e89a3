"""The simulator against TensorFlow's own allocation records on every bundled sample."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import lmscore
from lmscore.samples import sample_dir, samples
from lmscore.validate import validate

pytestmark = pytest.mark.tf

#: Measured on TF 2.21 CPU with oneDNN off and on (the simulation models the kernels
#: that ran): every convolutional and Transformer sample matches to 0.3%.
TOLERANCE = 0.05
#: Samples still outside the tolerance: measured ratio and the cause (none today; the
#: LSTM sample, 1.067 before loop bodies were simulated, is at 1.004 with oneDNN off and on).
KNOWN_GAPS: dict[str, str] = {}


def _sample_param(name):
    reason = KNOWN_GAPS.get(name)
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("sample", [_sample_param(s["name"]) for s in samples()])
def test_simulated_peak_matches_measured(sample):
    entry = next(s for s in samples() if s["name"] == sample)
    graph = lmscore.load(sample_dir() / entry["file"])
    v = validate(graph, entry["batch_size"])
    assert v.finite
    # Equal to the byte on every sample but the LSTM (100 B of constants inside its loop).
    assert v.kernel_library in ("eigen", "onednn")
    assert abs(v.measured_persistent_bytes - v.simulated_persistent_bytes) <= 128
    assert abs(v.transient_ratio - 1) <= TOLERANCE, v
    assert abs(v.ratio - 1) <= TOLERANCE, v
    assert abs(v.replayed_ratio - 1) <= TOLERANCE, v


def test_validate_cli_json_contract():
    out = subprocess.run(
        [sys.executable, "-m", "lmscore.cli", "validate", "mlp", "--json"],
        capture_output=True, text=True, check=True,
    ).stdout
    report = json.loads(out)
    for key in ("measured_peak_bytes", "simulated_peak_bytes", "ratio", "replayed_peak_bytes",
                "replayed_ratio"):
        assert key in report
    assert report["measured_peak_bytes"] > 0
    assert report["batch_size"] == 32
