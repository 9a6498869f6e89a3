"""Byte sizes: human-readable formatting and parsing of user-given sizes."""

from __future__ import annotations

import re

from .errors import ConfigError

#: Bytes per unit, by lower-case suffix: SI units are decimal (``GB`` = 10**9), IEC units
#: and single letters binary (``GiB`` = ``G`` = 2**30, as most command lines read ``8G``).
_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
}
_SIZE = re.compile(r"^\s*([-+]?)\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")

#: How sizes are written, for help texts and error messages.
SIZE_SYNTAX = "bytes, or 8GB = 8e9 bytes, 8GiB = 8G = 2**33 bytes, and so for K, M, T"


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


def parse_bytes(text: str, name: str = "") -> int:
    """Parse a size as people write it: ``"16GiB"``, ``"16G"``, ``"15.5GB"``, ``"8 GiB"``.

    Decimal units (``KB``, ``MB``, ``GB``, ``TB``) are powers of 1000, binary ones (``KiB``...
    ``TiB``) and the single letters ``K``, ``M``, ``G``, ``T`` powers of 1024, in any case; a
    plain number is bytes. Fractions are exact: ``"0.3GB"`` is 300,000,000 bytes.

    Parameters
    ----------
    text : str
        The size.
    name : str, optional
        What the size is (``"--budget"``), put at the start of an error message.

    Returns
    -------
    int
        Bytes, rounded down to a whole byte.

    Raises
    ------
    ConfigError
        If the text is not a size with a known unit, or is not positive.

    Examples
    --------
    >>> parse_bytes("16GiB"), parse_bytes("16g"), parse_bytes("15.5GB"), parse_bytes("1024")
    (17179869184, 17179869184, 15500000000, 1024)
    >>> parse_bytes("8 GiB") == 2**33, parse_bytes("0.3GB")
    (True, 300000000)
    """
    where = f"{name}: " if name else ""
    m = _SIZE.match(str(text))
    if not m or m.group(3).lower() not in _UNITS:
        raise ConfigError(f"{where}not a size: {text!r}; use {SIZE_SYNTAX}")
    # imported here: fractions imports decimal, which commands without a size never need
    from fractions import Fraction

    value = int(Fraction(m.group(2)) * _UNITS[m.group(3).lower()])
    if m.group(1) == "-" or value <= 0:
        raise ConfigError(f"{where}size must be positive, got {text!r}")
    return value
