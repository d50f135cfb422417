"""A dictionary's tensor files, read; one that cannot be read is refused in one line naming it.

``.safetensors`` files are memory-mapped after their header is checked (torch-free,
:func:`interp.foundation.safetensors_header.safetensors_problem`: safetensors itself names no
file, and finds a file cut short only when it reads it); ``.npz`` files (Gemma Scope's) are read
with numpy. SAE folders and transcoder folders read their weights here alike; the SAE formats
check the names they hold with :func:`check_names`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from interp.foundation.safetensors_header import safetensors_problem

__all__ = ["check_names", "read_tensors"]


def read_tensors(path: str | Path) -> dict[str, Tensor]:
    """The tensors of ``path`` (``.safetensors`` or ``.npz``) by name.

    Raises:
        ValueError: the file is missing, cut short, or not a safetensors / npz file at all
            (naming it, and what to do).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} is missing")
    if path.suffix == ".npz":
        import zipfile

        import numpy as np

        try:
            with np.load(path) as data:
                return {k: torch.from_numpy(data[k]) for k in data.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise ValueError(f"{path} is not a readable .npz file ({err})") from None
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    problem = safetensors_problem(path)
    if problem is None:
        try:
            return load_file(str(path))
        except SafetensorError as err:
            problem = str(err).removeprefix("Error while deserializing header: ")
    raise ValueError(
        f"{path} is not a readable safetensors file: {problem}; save it again, or download it "
        "afresh"
    )


def check_names(
    names: Iterable[str], needed: Iterable[str], what: str, *, known: Iterable[str] = (),
    unknown: str = "",
) -> None:  # fmt: skip
    """A ValueError, ``"{what} lacks A, B; has C{unknown}"``, unless ``names`` holds every one
    of ``needed`` and nothing beyond them and ``known``."""
    names, needed = set(names), set(needed)
    missing, extra = sorted(needed - names), sorted(names - needed - set(known))
    found = [f"lacks {', '.join(missing)}"] * bool(missing)
    found += [f"has {', '.join(extra)}{unknown}"] * bool(extra)
    if found:
        raise ValueError(f"{what} {'; '.join(found)}")
