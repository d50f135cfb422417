"""The commands' model loading: the source checked first, without torch.

``interp.models.loading`` imports torch and TransformerLens (seconds) before it can look at the name
it was given, so a command line naming a folder that does not exist would wait for them only
to fail. :func:`load_model` here runs the loader's own source checks (:mod:`interp.models.sources`,
which imports no torch) first, and only then imports the loader. Hub names are left to the
loader: finding one needs ``huggingface_hub`` and, outside its cache, the network.
"""

from __future__ import annotations

import os
from pathlib import Path

from interp.cli.output import UsageError
from interp.models.sources import (
    BUNDLED_DIR,
    ModelLoadError,
    bundled_models,
    check_checkpoint_dir,
    resolve_source,
)

__all__ = ["BUNDLED_DIR", "ModelSourceError", "bundled_models", "check_source", "load_model"]

ModelSourceError = ModelLoadError  # the loader's own error (a hub name's): the command exits 1


def check_source(name: str | os.PathLike) -> None:
    """Refuse a bundled or local model that cannot load, as the loader would, without its
    imports: a ``UsageError`` (exit 2, before any work) naming the folder or file; a hub name
    passes (the loader checks it)."""
    try:
        kind, location = resolve_source(name)
        if kind != "hub":
            check_checkpoint_dir(Path(location), allow_pickle=False)
    except ModelLoadError as exc:
        raise UsageError(str(exc)) from None


def load_model(
    name: str | os.PathLike,
    *,
    device: str | None = None,
    device_map: str | None = None,
    max_memory: dict[str | int, str] | None = None,
):
    """:func:`check_source`, then ``interp.models.loading.load_model`` (looked up when called: tests
    replace it) with the keywords that were given."""
    check_source(name)
    import interp.models.loading as loading

    given = {"device": device, "device_map": device_map, "max_memory": max_memory}
    return loading.load_model(name, **{k: v for k, v in given.items() if v is not None})
