""""Fits" checked by TensorFlow's own allocator under a hard cap.

The allocation records say what the kernels asked for; TensorFlow's BFC allocator, which a
GPU runs with, rounds every request to 256 bytes and can fragment. On the CPU it runs with
``TF_CPU_ALLOCATOR_USE_BFC=1`` and a cap (``TF_CPU_BFC_MEM_LIMIT_IN_MB``), with real
out-of-memory errors, but only if both are set before TensorFlow starts: each run here is a
fresh process.

For zoo steps at batches where the activations make the peak, the smallest device (whole
MiB) on which ``tune`` says the step fits without swapping is given to the allocator as its
cap: the step must run, and the allocator's own peak must stay within it. The same step
capped at 80% of its measured peak must run out of memory, so the cap is known to bite.
One process runs on one CPU device; the emulated accelerator's two devices would share
the one CPU allocator, so the rewritten steps are checked by the records
(``test_zoo_fits``).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")
zoo = pytest.importorskip("zoo")

from lmscore.memory import simulate  # noqa: E402
from lmscore.tune import tune  # noqa: E402

pytestmark = pytest.mark.tf

MIB = 1 << 20
HERE = pathlib.Path(__file__).resolve().parent

#: (zoo step, batch): peaks of 100-135 MiB, so that whole MiB and the allocator's first
#: 2 MiB region are fine enough for a cap. Not here: the 2-D U-Net (with oneDNN on,
#: TensorFlow 2.21 crashed with SIGSEGV under the CPU allocator capped at 136 MiB) and the
#: GRU+LSTM at batch 2048: out of memory at 80% of the records, TensorFlow crashed with
#: SIGSEGV in 3 runs of 9 instead of reporting it.
CASES = [
    pytest.param("mlp_dropout", 65536, id="mlp_dropout-b65536"),
    # 30 s: under -m slow, so that the default suite keeps a margin under 15 minutes on
    # 2 cores (it measured 12:28-14:18 with it); the MLP's case runs by default
    pytest.param("transformer_encoder", 256, id="transformer_encoder-b256",
                 marks=pytest.mark.slow),
]

_RUN = """
import json, sys
sys.path[:0] = {paths!r}
import tensorflow as tf
# A GPU's allocator reserves its memory as one region when TensorFlow starts; the CPU's
# grows region by region (2 MiB first, then doubling), and a buffer never spans two. One
# tensor of the rest of the cap, freed at once, leaves it two regions: the first 2 MiB
# and all the rest.
with tf.device("/CPU:0"):
    whole = tf.zeros([(({cap} - 2) << 20) // 4], tf.float32)
del whole
from lmscore.errors import RunError
from lmscore.measure import measure
data = open({path!r}, "rb").read()
try:
    m = measure(data, {batch}, steps=2)
except RunError as exc:
    print(json.dumps({{"error": str(exc)}}))
else:
    print(json.dumps({{"records": m.peak_bytes["CPU:0"] + m.persistent_bytes["CPU:0"],
                      "allocator": m.allocator_peak_bytes}}))
"""


def _run(graphdef: str, batch: int, cap_mib: int) -> dict:
    """Measure the step in ``graphdef`` (a file) in a fresh process capped at ``cap_mib``."""
    env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC="1", TF_CPU_BFC_MEM_LIMIT_IN_MB=str(cap_mib),
               TF_CPP_MIN_LOG_LEVEL="2")
    code = _RUN.format(paths=[str(HERE.parent)], path=graphdef, batch=batch, cap=cap_mib)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("name", "batch"), CASES)
def test_fits_under_the_allocators_cap(name, batch, tmp_path):
    g = zoo.graph(name)
    path = str(tmp_path / "step.pb")
    pathlib.Path(path).write_bytes(g.graphdef)
    sim = simulate(g, batch, workspace="cpu")
    # Smallest whole-MiB device on which tune says "fits without swapping".
    persistent = sim.persistent_bytes
    need = persistent + (sim.worst_peak_bytes - persistent) / 0.9
    cap = math.ceil(need / MIB)
    r = tune(g, batch, cap * MIB, workspace="cpu")
    assert r.fits and not r.plan.swaps, r.message
    ran = _run(path, batch, cap)
    assert "error" not in ran, ran["error"]
    assert ran["allocator"] is not None and ran["allocator"] <= cap * MIB, ran
    # The allocator's chunks and fragmentation against the records: within the 10% the
    # default safety leaves.
    assert ran["allocator"] <= ran["records"] / 0.9, ran

    tight = math.floor(0.8 * ran["records"] / MIB)
    short = _run(path, batch, tight)
    assert "error" in short and "OOM" in short["error"], short
