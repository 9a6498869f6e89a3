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

#: Measured on TF 2.21 CPU: every convolutional and Transformer sample matches to 0.1%;
#: the LSTM is 7-9% high (memory inside loop bodies is not modelled). 10% is the target.
TOLERANCE = 0.10


@pytest.mark.parametrize("sample", [s["name"] for s in samples()])
def test_simulated_peak_matches_measured(sample):
    entry = next(s for s in samples() if s["name"] == sample)
    graph = lmscore.load(sample_dir() / entry["file"])
    v = validate(graph, entry["batch_size"])
    assert v.finite
    # Equal to the byte on every sample but the LSTM (100 B of constants inside its loop).
    assert abs(v.measured_persistent_bytes - v.simulated_persistent_bytes) <= 128
    assert abs(v.transient_ratio - 1) <= TOLERANCE, v
    assert abs(v.ratio - 1) <= TOLERANCE, v


def test_validate_cli_json_contract():
    out = subprocess.run(
        [sys.executable, "-m", "lmscore.cli", "validate", "mlp", "--json"],
        capture_output=True, text=True, check=True,
    ).stdout
    report = json.loads(out)
    for key in ("measured_peak_bytes", "simulated_peak_bytes", "ratio"):
        assert key in report
    assert report["measured_peak_bytes"] > 0
    assert report["batch_size"] == 32
