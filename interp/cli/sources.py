"""Where a model comes from, checked without importing torch: the bundled models, and a
checkpoint directory that cannot load.

``interp.loading`` imports torch and TransformerLens (seconds) before it looks at the name it
was given, so a command line naming a folder that does not exist would wait for them only to
fail. :func:`load_model` here checks the bundled and local sources first, with the loader's
own rules and messages (``interp.loading.resolve_source`` and ``check_checkpoint_dir``; a test
keeps the two in step), and only then imports the loader. Hub names are left to the loader:
finding one needs ``huggingface_hub`` and, outside its cache, the network.
"""

from __future__ import annotations

import os
from pathlib import Path

import interp

__all__ = ["BUNDLED_DIR", "ModelSourceError", "bundled_models", "check_source", "load_model"]

BUNDLED_DIR = Path(interp.__file__).parent / "bundled"  # interp.loading.BUNDLED_DIR: shipped models

# as in interp.loading: any one set makes a tokenizer loadable; the weights it accepts
TOKENIZER_FILE_SETS: tuple[tuple[str, ...], ...] = (
    ("tokenizer.json",),
    ("vocab.json", "merges.txt"),
    ("tokenizer.model",),
    ("spiece.model",),
    ("vocab.txt",),
)
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


class ModelSourceError(RuntimeError):
    """The model cannot load (exit code 1, as ``interp.loading.ModelLoadError``)."""


def bundled_models() -> list[str]:
    """Short names of the models shipped inside the package (``interp.loading``'s list)."""
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file())


def _check_directory(directory: Path) -> None:
    """``interp.loading.check_checkpoint_dir`` with ``allow_pickle=False`` (the commands')."""
    if not directory.is_dir():
        raise ModelSourceError(
            f"{directory} is not a directory; pass a checkpoint directory "
            "written by save_pretrained, a hub name, or a bundled model "
            f"({', '.join(bundled_models()) or 'none installed'})"
        )
    if not (directory / "config.json").is_file():
        raise ModelSourceError(
            f"{directory} is not a model checkpoint: it has no config.json. "
            "Write one with model.save_pretrained(directory)."
        )
    has_safe = any((directory / f).is_file() for f in SAFE_WEIGHTS)
    has_pickle = any((directory / f).is_file() for f in PICKLED_WEIGHTS)
    if not has_safe and not has_pickle:
        raise ModelSourceError(
            f"{directory} has a config.json but no weights (expected "
            f"{' or '.join(SAFE_WEIGHTS)}). Write them with "
            "model.save_pretrained(directory)."
        )
    if not has_safe:
        raise ModelSourceError(
            f"{directory} holds only pickled weights (pytorch_model.bin), "
            "and unpickling can run arbitrary code. Convert them with "
            "model.save_pretrained(directory, safe_serialization=True), or "
            "pass allow_pickle=True if you trust the file."
        )
    if not any(all((directory / f).is_file() for f in files) for files in TOKENIZER_FILE_SETS):
        raise ModelSourceError(
            f"{directory} has no tokenizer files (expected tokenizer.json, "
            "or vocab.json + merges.txt, or tokenizer.model). Save one there "
            "with tokenizer.save_pretrained(directory); TransformerLens would "
            "otherwise build a useless 1-token tokenizer."
        )


def check_source(name: str | os.PathLike) -> None:
    """Refuse a bundled or local model that cannot load, as the loader would, without its
    imports; a hub name passes (the loader checks it). Raises :class:`ModelSourceError`."""
    text = os.fspath(name)
    if text in bundled_models():
        _check_directory(BUNDLED_DIR / text)
        return
    path = Path(text).expanduser()
    if path.exists() or isinstance(name, os.PathLike):
        _check_directory(path)
    # hub ids are "name" or "org/name"; anything with more parts or a leading ./ ~ / is a path
    elif text.startswith((".", "~", "/")) or text.count("/") > 1:
        raise ModelSourceError(f"no such directory: {text}")


def load_model(
    name: str | os.PathLike,
    *,
    device: str | None = None,
    device_map: str | None = None,
    max_memory: dict[str | int, str] | None = None,
):
    """:func:`check_source`, then ``interp.loading.load_model`` (looked up when called: tests
    replace it) with the keywords that were given."""
    check_source(name)
    import interp.loading as loading

    given = {"device": device, "device_map": device_map, "max_memory": max_memory}
    return loading.load_model(name, **{k: v for k, v in given.items() if v is not None})
