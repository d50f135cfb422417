"""Reading an SAE's ``.safetensors`` file: one that safetensors cannot read is refused in one
line naming it (safetensors itself says only "header too large", naming no file)."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

__all__ = ["read_safetensors"]


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """The tensors of ``path`` (memory-mapped, as ``safetensors.torch.load_file`` reads them).

    Raises:
        ValueError: the file is corrupt, truncated or not safetensors at all (naming it, and
            what to do); :func:`interp.saes.load_sae` reports it as an ``SAELoadError``.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as err:
        reason = str(err).removeprefix("Error while deserializing header: ")
        raise ValueError(
            f"{path} is not a readable safetensors file ({reason}); save the SAE again, or "
            "download it afresh"
        ) from None
