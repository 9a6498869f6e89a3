"""The bundled sample graphs: `sample_graphs/` in a checkout, package data when installed."""

from __future__ import annotations

import json
import pathlib
from typing import Any


def sample_dir() -> pathlib.Path:
    """Directory holding the bundled sample GraphDefs and ``samples.json``."""
    here = pathlib.Path(__file__).resolve().parent
    installed = here / "data" / "sample_graphs"  # where ``pip install .`` puts them
    if (installed / "samples.json").exists():
        return installed
    return here.parent / "sample_graphs"


def samples() -> list[dict[str, Any]]:
    """The sample table (``samples.json``): name, file, description, batch size..."""
    path = sample_dir() / "samples.json"
    if not path.exists():
        return []
    return json.loads(path.read_text())


def find(path: str) -> pathlib.Path:
    """Resolve a user path, falling back to a bundled sample of that name.

    ``resnet50``, ``resnet50.pb`` and ``sample_graphs/resnet50.pb`` all name the bundled
    ResNet-50 when no such file exists in the current directory, so the command line
    works from any directory.
    """
    p = pathlib.Path(path)
    if p.exists():
        return p
    name = p.name
    for s in samples():
        if name in (s["name"], s["file"]):
            candidate = sample_dir() / s["file"]
            if candidate.exists():
                return candidate
    return p
