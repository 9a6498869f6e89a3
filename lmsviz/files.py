"""Uploads and downloads: the browser's size gate, upload decoding, plan and export files.

Nothing uploaded is executed: graph bytes go to :func:`lmsviz.state.accept_upload`, plan
bytes to :func:`lmscore.plan.plan_from_json`.
"""

from __future__ import annotations

import base64
import binascii
import io
import pathlib
import zipfile
from typing import Any

from lmscore.errors import GraphError
from lmscore.rewrite import rewrite
from lmscore.units import format_bytes

from .results import plan_label, plan_of
from .state import AppContext


def decode_upload(gate: dict[str, Any] | None, cap: int) -> tuple[str, bytes]:
    """Filename and bytes of an upload that passed the browser's size gate.

    Raises
    ------
    GraphError
        If the browser refused it as too large, or the contents are not base64 data.
    """
    if not gate:
        raise GraphError("nothing was uploaded")
    name = pathlib.Path(str(gate.get("filename") or "upload")).name
    if gate.get("refused") or int(gate.get("size") or 0) > cap:
        raise GraphError(f"{name} is {format_bytes(int(gate.get('size') or 0))}: over the upload "
                         f"limit of {format_bytes(cap)}")
    contents = str(gate.get("contents") or "")
    _, _, payload = contents.partition(",")
    if len(payload) * 3 // 4 > cap + 3:
        raise GraphError(f"{name}: over the upload limit of {format_bytes(cap)}")
    try:
        return name, base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise GraphError(f"{name}: the upload is not base64 data") from None



def _stem(name: str) -> str:
    stem = pathlib.Path(name).name
    for suffix in (".pbtxt", ".pb", ".zip", ".txt", ".prototxt", ".graphdef"):
        stem = stem.removesuffix(suffix)
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in stem) or "graph"


def export_bundle(app: AppContext, graph_ref: dict[str, Any], plan_data: dict[str, Any],
                  device: str = "/GPU:0", host: str = "/CPU:0") -> tuple[str, bytes]:
    """The rewritten graph and its plan, zipped.

    The GraphDef is exactly what ``lms rewrite FILE --plan PLAN --out X.pb --device DEVICE
    --host HOST`` writes for the session's plan, and the plan is what ``--plan-out`` writes
    (the applied plan, without swaps the rewrite had to skip).

    Returns
    -------
    filename : str
    data : bytes
        A zip holding ``<graph>.lms.pb`` and ``<graph>.plan.json``.
    """
    from lmscore.export import to_graphdef

    loaded = app.resolve(graph_ref)
    plan = plan_of(app, loaded, plan_data.get("json"))
    with app.slots.slot("export"):
        rw = rewrite(loaded.graph, plan)
        pb = to_graphdef(rw.graph, device=device or "/GPU:0", host=host or "/CPU:0")
    stem = _stem(loaded.name)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in ((f"{stem}.lms.pb", pb), (f"{stem}.plan.json", rw.plan.to_json())):
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return f"{stem}.lms.zip", buf.getvalue()


def plan_download(app: AppContext, graph_ref: dict[str, Any], plan_data: dict[str, Any]
                  ) -> tuple[str, str, str]:
    """The session's plan as a JSON file: its name, its text, and what it holds."""
    loaded = app.resolve(graph_ref)
    plan = plan_of(app, loaded, plan_data.get("json"))
    return f"{_stem(loaded.name)}.plan.json", plan.to_json(), plan_label(plan)



GATE_JS = """
function(contents, filename, cap) {
    var nu = window.dash_clientside.no_update;
    if (!contents) { return [nu, nu]; }
    var comma = contents.indexOf(',');
    var payload = contents.length - comma - 1;
    var pad = contents.endsWith('==') ? 2 : (contents.endsWith('=') ? 1 : 0);
    var size = Math.max(0, Math.floor(payload * 3 / 4) - pad);
    var nonce = Date.now();
    if (size > cap) {
        return [{filename: filename, size: size, refused: true, nonce: nonce}, null];
    }
    return [{filename: filename, size: size, contents: contents, nonce: nonce}, null];
}
"""
