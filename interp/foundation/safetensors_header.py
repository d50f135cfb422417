"""A ``.safetensors`` file checked from its header alone, without torch or safetensors.

The format: 8 bytes (little-endian length ``n``), ``n`` bytes of JSON naming each tensor's
``dtype``, ``shape`` and ``data_offsets`` (into the bytes after the header), then the data.
A file cut short (a download or copy stopped midway), a header that is not JSON, or offsets
past the end are found here in microseconds, before a model loads: safetensors itself says
only "incomplete metadata, file not fully covered", naming no file, and only when it reads it.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

__all__ = ["safetensors_problem"]

MAX_HEADER = 100_000_000  # safetensors' own limit on the header's size


def safetensors_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is not a complete safetensors file, in a few words, or None if its header
    and size agree. Reads the header only."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"it has {size} bytes, fewer than a safetensors header"
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                return f"its header says {n} bytes but the file has {size}: it is cut short"
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as exc:
        return exc.strerror or str(exc)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "its header is not safetensors' JSON (not a safetensors file, or damaged)"
    if not isinstance(header, dict):
        return "its header is not safetensors' JSON (not a safetensors file, or damaged)"
    ends = [
        entry["data_offsets"][1]
        for key, entry in header.items()
        if key != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry
    ]
    data = size - 8 - n
    end = max(ends, default=0)
    if end > data:
        return f"its tensors need {end + 8 + n} bytes but the file has {size}: it is cut short"
    if end < data:
        return f"it has {data - end} bytes after its last tensor (damaged, or not safetensors)"
    return None
