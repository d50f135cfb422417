"""The SAEs shipped inside the package, found by short name without importing torch.

A bundled SAE is a folder of ``interp/bundled/`` in SAELens's saved format: ``cfg.json`` and
``sae_weights.safetensors`` (a bundled *model* has ``config.json`` instead, so the two lists
never overlap). ``load_sae("tiny-induction-sae")`` loads one by this name.
"""

from __future__ import annotations

import json
from pathlib import Path

from interp.models.sources import BUNDLED_DIR

__all__ = ["SAE_FILES", "bundled_sae_info", "bundled_sae_path", "bundled_saes"]

SAE_FILES = ("cfg.json", "sae_weights.safetensors")  # what makes a folder an SAE


def bundled_saes() -> list[str]:
    """Short names of the SAEs shipped inside the package."""
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(
        p.name for p in BUNDLED_DIR.iterdir() if all((p / f).is_file() for f in SAE_FILES)
    )


def bundled_sae_path(name: str) -> Path | None:
    """The folder of the bundled SAE called ``name``, or None when there is none."""
    return BUNDLED_DIR / name if name in bundled_saes() else None


def bundled_sae_info(name: str) -> dict[str, str | int]:
    """What ``interp models`` shows of a bundled SAE: its model, hook, architecture and size,
    read from its ``cfg.json``."""
    path = bundled_sae_path(name)
    if path is None:
        known = ", ".join(bundled_saes()) or "none installed"
        raise ValueError(f"no bundled SAE called {name!r}; bundled SAEs: {known}")
    cfg = json.loads((path / "cfg.json").read_text(encoding="utf-8"))
    return {
        "name": name,
        "path": str(path),
        "model": str(cfg.get("model_name", "")),
        "hook": str(cfg.get("hook_name", "")),
        "architecture": str(cfg.get("architecture", "")),
        "d_in": int(cfg.get("d_in", 0)),
        "d_sae": int(cfg.get("d_sae", 0)),
    }
