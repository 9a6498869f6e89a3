"""Device and link presets of the time model, importable without numpy (the CLI's help).

Planning before a device is at hand; ``lms profile`` measures the one you have.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class Device:
    """An accelerator preset (FP32 peak, HBM bandwidth, memory) and where it comes from."""

    name: str
    memory_bytes: int
    flops: float
    bandwidth: float
    launch_seconds: float = 4e-6
    source: str = ""


@dataclass(frozen=True)
class Link:
    """A host link preset: effective bandwidth per direction, and where it comes from."""

    name: str
    bandwidth: float
    source: str = ""


GIB = 2**30
#: Accelerator presets (vendor FP32 figures; memory of the common board).
#: Planning before a device is at hand; ``lms profile`` measures the one you have.
DEVICES: dict[str, Device] = {
    "P100": Device("P100", 16 * GIB, 9.3e12, 732e9,
                   source="NVIDIA Tesla P100 datasheet, PCIe 16 GB: 9.3 TFLOP/s FP32, "
                          "732 GB/s HBM2"),
    "V100": Device("V100", 16 * GIB, 15.7e12, 900e9,
                   source="NVIDIA Tesla V100 datasheet, SXM2 16 GB: 15.7 TFLOP/s FP32, "
                          "900 GB/s HBM2"),
    "A100": Device("A100", 40 * GIB, 19.5e12, 1555e9,
                   source="NVIDIA A100 datasheet, 40 GB: 19.5 TFLOP/s FP32, 1,555 GB/s HBM2"),
    "H100": Device("H100", 80 * GIB, 67e12, 3350e9,
                   source="NVIDIA H100 datasheet, SXM5 80 GB: 67 TFLOP/s FP32, "
                          "3.35 TB/s HBM3"),
}
#: Host link presets: effective bandwidths, one direction (what copies reach, not the
#: signalling rate).
LINKS: dict[str, Link] = {
    "pcie3": Link("PCIe 3.0 x16", 12e9,
                  source="15.75 GB/s signalling per direction; about 12 GB/s measured by "
                         "host-device copies of pinned memory"),
    "pcie4": Link("PCIe 4.0 x16", 24e9,
                  source="31.5 GB/s signalling per direction; about 24 GB/s measured by "
                         "host-device copies of pinned memory"),
    "nvlink2": Link("NVLink 2.0 (POWER9 to V100, 3 bricks)", 68e9,
                    source="3 bricks of 25 GB/s per direction between a POWER9 CPU and a "
                           "V100 (the LMS papers' machine, 75 GB/s); 68 GB/s effective"),
}


def preset(name: str, presets: dict[str, Device] | dict[str, Link], kind: str) -> str:
    """The key of ``presets`` (:data:`DEVICES` or :data:`LINKS`) that ``name`` names, any case.

    >>> preset("v100", DEVICES, "device"), preset("NVLink2", LINKS, "link")
    ('V100', 'nvlink2')

    Raises
    ------
    ConfigError
        If no preset has that name; the message lists them.
    """
    wanted = str(name).strip().lower()
    for key in presets:
        if key.lower() == wanted:
            return key
    raise ConfigError(f"unknown {kind} {name!r} (choose from {', '.join(presets)})")


__all__ = ["DEVICES", "GIB", "LINKS", "Device", "Link", "preset"]
