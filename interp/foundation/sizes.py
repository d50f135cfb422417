"""Memory sizes as people write them: ``"500MB"``, ``"1GiB"``, ``1024``; and back to text.

Pure text, no torch: the command line checks ``--max-bytes`` with it before anything loads.
"""

from __future__ import annotations

import os
import re

__all__ = ["available_host_bytes", "parse_size", "format_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(size: int | str) -> int:
    """Bytes from ``1024``, ``"500MB"``, ``"1GiB"``, ``"1.5 GB"`` (KB/MB/GB are powers of 1000,
    KiB/MiB/GiB powers of 1024, as in accelerate's ``max_memory``)."""
    if isinstance(size, bool):
        raise ValueError(f"a memory size is a number of bytes or text like '1GiB', not {size!r}")
    if isinstance(size, int):
        value = size
    else:
        match = _SIZE.match(str(size))
        unit = match and match.group(2).lower()
        if not match or unit not in _UNITS:
            raise ValueError(
                f"cannot read {size!r} as a memory size; write a number of bytes or "
                "a number with a unit: 500MB, 1GiB, 2GB (units: B, KB, MB, GB, TB, "
                "KiB, MiB, GiB, TiB)"
            )
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"a memory size must be positive, got {size!r}")
    return value


def format_size(n_bytes: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n_bytes) < 1024 or unit == "GiB":
            return f"{n_bytes:.0f} B" if unit == "B" else f"{n_bytes:.2f} {unit}"
        n_bytes /= 1024
    return f"{n_bytes:.2f} GiB"  # pragma: no cover


def available_host_bytes() -> int | None:
    """The host memory available to a new allocation (Linux's ``MemAvailable``; elsewhere the
    free physical pages), or None where neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
