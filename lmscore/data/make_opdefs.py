"""Regenerate ``opdefs.json``: the output signature of every registered TensorFlow op.

The table lets the importer derive each output's dtype and the number of outputs of a node
without importing TensorFlow (which takes seconds). Run with TensorFlow installed::

    python lmscore/data/make_opdefs.py

Each entry maps an op type to ``{"out": [...], "in": [...], "stateful": bool}`` and, for
an optimizer's apply (``...Apply...`` with an input named ``grad`` or ``delta``),
``"grad"``: the position of the gradient it applies. An argument is written as

- ``"float"``: a fixed dtype;
- ``"@T"`` or ``"@T=int32"``: the dtype held by type attribute ``T`` (with its default);
- ``"*Tout"``: a list of outputs whose dtypes are the type-list attribute ``Tout``;
- ``"N*@T"`` / ``"N*float"``: ``N`` (a number attribute) outputs of that dtype.
"""

from __future__ import annotations

import json
import pathlib

from tensorflow.core.framework import op_def_pb2, types_pb2
from tensorflow.python.client import pywrap_tf_session as c_api


def _dtype(enum: int) -> str:
    return types_pb2.DataType.Name(enum)[3:].lower()


def _arg(arg, attrs) -> str:
    if arg.type_list_attr:
        return "*" + arg.type_list_attr
    if arg.type_attr:
        default = attrs.get(arg.type_attr)
        base = "@" + arg.type_attr + (f"={default}" if default else "")
    else:
        base = _dtype(arg.type)
    if arg.is_ref:
        base += "&"
    return f"{arg.number_attr}*{base}" if arg.number_attr else base


def main() -> None:
    """Write the table next to this script."""
    table = {}
    buf = c_api.TF_GetAllOpList()
    try:
        ops = op_def_pb2.OpList.FromString(c_api.TF_GetBuffer(buf)).op
    finally:
        c_api.TF_DeleteBuffer(buf)
    for op_def in sorted(ops, key=lambda o: o.name):
        name = op_def.name
        attrs = {
            a.name: _dtype(a.default_value.type)
            for a in op_def.attr
            if a.type == "type" and a.HasField("default_value")
        }
        table[name] = {
            "out": [_arg(a, attrs) for a in op_def.output_arg],
            "in": [_arg(a, attrs) for a in op_def.input_arg],
            "stateful": bool(op_def.is_stateful),
        }
        names = [a.name for a in op_def.input_arg]
        for wanted in ("grad", "delta"):  # the gradient an optimizer's apply applies
            if "Apply" in name and wanted in names:
                table[name]["grad"] = names.index(wanted)
                break
    path = pathlib.Path(__file__).with_name("opdefs.json")
    path.write_text(json.dumps(table, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"{len(table)} ops -> {path}")


if __name__ == "__main__":
    main()
