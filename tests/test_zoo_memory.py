"""The simulator against TensorFlow's allocation records on the zoo's training steps.

Each step is traced in this process (``zoo.build``), run under TensorFlow and simulated
with the kernels TensorFlow really ran (oneDNN or Eigen, read from the records), so every
test holds with ``TF_ENABLE_ONEDNN_OPTS=0`` and ``=1`` alike. The device peak (persistent
memory + feeds + transient) must be within 5% of the measured one, unmodified step.
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")
zoo = pytest.importorskip("zoo")

import lmscore  # noqa: E402
from lmscore.memory import cpu_kernel_library  # noqa: E402
from lmscore.validate import validate  # noqa: E402

pytestmark = pytest.mark.tf

TOLERANCE = 0.05

#: Models that cannot be brought within 5% yet: measured ratio and the exact cause.
_COPY_ON_WRITE = (
    "AdamW's decoupled weight decay (AssignSubVariableOp) runs while the forward pass's "
    "reads of the variable are still referenced, so TensorFlow copies the variable; the "
    "records show the copy allocated and never freed, but not the release of the old "
    "buffer (allocated before the step) once its last reader has run, so the measured "
    "peak counts those variables twice; the simulator releases the old storage"
)
KNOWN_GAPS = {
    "gpt_decoder": "simulated/measured 0.947 to 0.972 (varies run to run): " + _COPY_ON_WRITE
                   + "; the rest of the gap is not attributed yet",
}

#: Each traces and runs in seconds on 2 cores (all of them: about a minute).
SMALL = [name for name in zoo.SMALL if name not in ("efficientnet_b0", "mobilenet_v3_small")]
#: Thousands of ops each: tracing and importing take most of a minute.
LARGE = ["efficientnet_b0", "mobilenet_v3_small", *(e.name for e in zoo.ENTRIES if e.large)]


def _check(name: str) -> None:
    built = zoo.build(name)
    graph = lmscore.from_graphdef_bytes(built.graphdef, source=name)
    v = validate(graph, built.batch)
    assert v.finite
    # The records tell which kernels ran; detection without running must agree.
    assert v.kernel_library == cpu_kernel_library()
    assert abs(v.ratio - 1) <= TOLERANCE, v


#: Gaps whose size depends on the executor's order of independent ops in the measured
#: run (which copies happen before which reads end): they may pass on some runs.
VARIABLE_GAPS = frozenset({"gpt_decoder"})


def _param(name: str):
    reason = KNOWN_GAPS.get(name)
    strict = name not in VARIABLE_GAPS
    marks = [pytest.mark.xfail(reason=reason, strict=strict)] if reason else []
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", [_param(n) for n in SMALL])
def test_small_zoo_peak_within_5_percent(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [_param(n) for n in LARGE])
def test_large_zoo_peak_within_5_percent(name):
    _check(name)
