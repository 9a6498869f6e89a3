"""Byte sizes: human-readable formatting and parsing of user-given sizes."""

from __future__ import annotations

import re

from .errors import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def format_bytes(n: int | float) -> str:
    """Format a byte count with a binary unit.

    >>> format_bytes(512), format_bytes(3 * 2**20), format_bytes(16 * 2**30)
    ('512 B', '3.00 MiB', '16.00 GiB')
    """
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}"
    raise AssertionError("unreachable")


def parse_bytes(text: str) -> int:
    """Parse ``"16GiB"``, ``"15.5GB"``, ``"800MiB"`` or a plain byte count.

    >>> parse_bytes("16GiB"), parse_bytes("15.5GB"), parse_bytes("1024")
    (17179869184, 15500000000, 1024)

    Raises
    ------
    ConfigError
        If the text is not a positive size with a known unit.
    """
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"not a size: {text!r} (use bytes or a unit: 16GiB, 15.5GB, 800MiB)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ConfigError(f"size must be positive: {text!r}")
    return value
