"""Where a model comes from, checked before anything heavy is imported: the bundled models, a
checkpoint directory that cannot load, a name that is neither a directory nor a hub id.

Pure files and names, no torch: :func:`interp.models.loading.load_model` runs these checks before it
hands a source to TransformerLens, and the command line runs them before it imports the loader
(so a command naming a folder that does not exist fails in a tenth of a second).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "ModelLoadError",
    "BUNDLED_DIR",
    "bundled_models",
    "check_checkpoint_dir",
    "resolve_source",
    "SAFE_WEIGHTS",
]


BUNDLED_DIR = Path(__file__).parents[1] / "bundled"  # the models shipped with the package


# any one of these makes a directory's tokenizer loadable by transformers' AutoTokenizer
TOKENIZER_FILE_SETS: tuple[tuple[str, ...], ...] = (
    ("tokenizer.json",),
    ("vocab.json", "merges.txt"),
    ("tokenizer.model",),
    ("spiece.model",),
    ("vocab.txt",),
)


SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")  # weights loaded safely


PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


class ModelLoadError(RuntimeError):
    """The model could not be loaded; the message says why and what to do."""


def bundled_models() -> list[str]:
    """Short names of the models shipped inside the package."""
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "config.json").is_file())


def _missing_tokenizer(directory: Path) -> bool:
    return not any(all((directory / f).is_file() for f in files) for files in TOKENIZER_FILE_SETS)


def check_checkpoint_dir(directory: Path, *, allow_pickle: bool) -> None:
    """Refuse a directory that is not a complete, safely loadable checkpoint."""
    if not directory.is_dir():
        raise ModelLoadError(
            f"{directory} is not a directory; pass a checkpoint directory "
            "written by save_pretrained, a hub name, or a bundled model "
            f"({', '.join(bundled_models()) or 'none installed'})"
        )
    if not (directory / "config.json").is_file():
        raise ModelLoadError(
            f"{directory} is not a model checkpoint: it has no config.json. "
            "Write one with model.save_pretrained(directory)."
        )
    has_safe = any((directory / f).is_file() for f in SAFE_WEIGHTS)
    has_pickle = any((directory / f).is_file() for f in PICKLED_WEIGHTS)
    if not has_safe and not has_pickle:
        raise ModelLoadError(
            f"{directory} has a config.json but no weights (expected "
            f"{' or '.join(SAFE_WEIGHTS)}). Write them with "
            "model.save_pretrained(directory)."
        )
    if not has_safe and not allow_pickle:
        raise ModelLoadError(
            f"{directory} holds only pickled weights (pytorch_model.bin), and "
            "unpickling can run arbitrary code. Convert them with "
            "model.save_pretrained(directory, safe_serialization=True), or pass "
            "allow_pickle=True if you trust the file."
        )
    if has_safe:
        _check_safetensors(directory)
    if _missing_tokenizer(directory):
        raise ModelLoadError(
            f"{directory} has no tokenizer files (expected tokenizer.json, or "
            "vocab.json + merges.txt, or tokenizer.model). Save one there with "
            "tokenizer.save_pretrained(directory); TransformerLens would "
            "otherwise build a useless 1-token tokenizer."
        )


def _check_safetensors(directory: Path) -> None:
    """Each safetensors file of the checkpoint complete (its header against its size): one
    cut short is named now, not after seconds of loading with safetensors' nameless error."""
    import json

    from interp.foundation.safetensors_header import safetensors_problem

    index = directory / SAFE_WEIGHTS[1]
    if (directory / SAFE_WEIGHTS[0]).is_file():
        files = [directory / SAFE_WEIGHTS[0]]
    else:
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = [directory / name for name in sorted(set(weight_map.values()))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise ModelLoadError(
                f"{index} is not a readable weight index (JSON with a weight_map); write the "
                "checkpoint again with model.save_pretrained(directory)"
            ) from None
    for path in files:
        problem = "it is missing" if not path.is_file() else safetensors_problem(path)
        if problem is not None:
            raise ModelLoadError(
                f"{path} cannot be loaded: {problem}; copy or download the checkpoint again"
            )


def resolve_source(name_or_path: str | os.PathLike) -> tuple[str, str]:
    """Return ``(kind, location)`` with kind ``"bundled"``, ``"local"`` or ``"hub"``."""
    text = os.fspath(name_or_path)
    if not text.strip():
        raise ModelLoadError(
            "model name is empty; pass a hub name such as 'gpt2', a checkpoint "
            f"directory, or a bundled model ({', '.join(bundled_models())})"
        )
    if text in bundled_models():
        return "bundled", str(BUNDLED_DIR / text)
    path = Path(text).expanduser()
    if path.exists() or isinstance(name_or_path, os.PathLike):
        return "local", str(path)
    # hub ids are "name" or "org/name"; anything with more parts or a leading ./ ~ / is a path
    if text.startswith((".", "~", "/")) or text.count("/") > 1:
        raise ModelLoadError(f"no such directory: {text}")
    return "hub", text
