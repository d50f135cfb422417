"""Load an SAE from a bundled name, a local folder, or a hub name, in any of four formats.

The folder's files say its format (:data:`FORMATS`), read by its module:
:mod:`interp.saes.saelens`, :mod:`interp.saes.sparsify`, :mod:`interp.saes.dictionary_learning`
or :mod:`interp.saes.gemmascope`. Each reader computes what its own library computes, or
refuses in one line naming what interp does not compute. Tensors are read straight into the
SAE's parameters (safetensors, memory-mapped ``torch.load``, ``np.load``), with no second copy
of the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from interp.saes.bundled import bundled_sae_path, bundled_saes
from interp.saes.published import FORMATS
from interp.saes.sae import SAE

__all__ = ["FORMATS", "SAEFitError", "SAELoadError", "check_sae_fits", "load_sae", "sae_format"]


class SAELoadError(ValueError):
    """What is wrong with an SAE folder or name, in one line."""


class SAEFitError(ValueError):
    """An SAE whose hook or width does not fit the model, in one line."""


def load_sae(
    path_or_name: str | Path,
    *,
    device: str | torch.device | None = None,
    hook_name: str | None = None,
    norm_scaling_factor: float | None = None,
) -> SAE:
    """An SAE from a bundled name (``"tiny-induction-sae"``), a local folder in one of
    :data:`FORMATS`, or a Hugging Face repository (``"owner/repo"`` or
    ``"owner/repo/subfolder"``). ``hook_name`` names the hook for a folder that does not
    say it (a Gemma Scope or dictionary_learning folder renamed), or overrides it.
    ``norm_scaling_factor`` is the factor of a SAELens ``expected_average_only_in`` SAE
    saved without ``activation_scaler.json`` (SAELens's ``pretrained_saes.yaml`` lists it
    for the releases it folds on ``from_pretrained``).

    Raises:
        SAELoadError: a folder that is not an SAE (naming the files each format needs), a
            key whose value interp does not compute (naming the key), missing tensors or
            shapes that disagree with the config, or a hub name that cannot be fetched
            (offline: what to download, and how).
    """
    folder, fmt = _folder(str(path_or_name))
    try:
        sae = _read(fmt, folder, hook_name, norm_scaling_factor)
    except (ValueError, KeyError, OSError) as err:
        if isinstance(err, SAELoadError):
            raise
        raise SAELoadError(f"{folder.name} ({fmt}): {err}") from None
    if hook_name is not None:
        sae.hook_name = hook_name
    return sae if device is None else sae.to(device)


def _read(fmt: str, folder: Path, hook_name: str | None, factor: float | None) -> SAE:
    if fmt == "saelens":
        from interp.dictionaries.files import read_tensors
        from interp.saes.saelens import read_saelens

        cfg = _read_json(folder / "cfg.json")
        meta = cfg.get("metadata") or {}
        named = cfg.get("hook_name") or cfg.get("hook_point") or meta.get("hook_name")
        if hook_name is not None and not named:
            cfg = {**cfg, "hook_name": hook_name}
        tensors = read_tensors(folder / FORMATS[fmt][1])
        return read_saelens(folder, cfg, tensors, norm_scaling_factor=factor)
    if fmt == "sparsify":
        from interp.saes.sparsify import read_sparsify

        return read_sparsify(folder, _read_json(folder / "cfg.json"), hook_name)
    if fmt == "dictionary_learning":
        from interp.saes.dictionary_learning import read_dictionary_learning

        return read_dictionary_learning(folder, _read_json(folder / "config.json"), hook_name)
    from interp.saes.gemmascope import read_gemmascope

    return read_gemmascope(folder, hook_name)


def sae_format(folder: str | Path) -> str | None:
    """The format whose files ``folder`` has (:data:`FORMATS`), or None."""
    folder = Path(folder)
    return next(
        (name for name, files in FORMATS.items() if all((folder / f).is_file() for f in files)),
        None,
    )


def check_sae_fits(model, sae: SAE) -> None:
    """Refuse, in one line, an SAE whose hook the model lacks or whose ``d_in`` is not the
    width of the activation at that hook."""
    hooks = [sae.hook_name] + ([sae.output_hook_name] if sae.output_hook_name else [])
    for hook in hooks:
        if hook not in model.hook_dict:
            raise SAEFitError(
                f"this SAE reads {hook!r}, which this model has no hook for; "
                "load an SAE trained on this model"
            )
    width = _hook_width(model, sae.hook_name)
    if width is not None and width != sae.d_in:
        raise SAEFitError(
            f"this SAE takes d_in={sae.d_in} at {sae.hook_name}, where this model's "
            f"activation has width {width}; load an SAE trained on this model"
        )


def _hook_width(model, hook: str) -> int | None:
    """The last dimension of ``hook``'s activation, for the residual-stream and MLP hooks."""
    cfg = model.cfg
    if "resid" in hook or hook.endswith(("hook_attn_out", "hook_mlp_out")):
        return int(cfg.d_model)
    if hook.endswith(("mlp.hook_post", "mlp.hook_pre")):
        return int(cfg.d_mlp)
    return None


def _folder(name: str) -> tuple[Path, str]:
    bundled = bundled_sae_path(name)
    if bundled is not None:
        return bundled, "saelens"
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise SAELoadError(f"{name} is a file; an SAE is a folder ({_needs()})")
        fmt = sae_format(path)
        if fmt is None:
            inner = sorted(p.name for p in path.iterdir() if p.is_dir() and sae_format(p))
            if inner:
                raise SAELoadError(
                    f"{name} holds {len(inner)} SAEs ({', '.join(inner[:4])}"
                    f"{', ...' if len(inner) > 4 else ''}); pass one of its subfolders"
                )
            raise SAELoadError(f"{name} is not an SAE folder: it has none of {_needs()}")
        return path, fmt
    parts = name.strip("/").split("/")
    if len(parts) < 2 or name.startswith((".", "~")) or "\\" in name:
        known = ", ".join(bundled_saes()) or "none"
        raise SAELoadError(
            f"no SAE called {name!r}: not a bundled SAE ({known}), a folder, or a hub name "
            "'owner/repo[/subfolder]'"
        )
    return _from_hub("/".join(parts[:2]), "/".join(parts[2:]))


def _needs() -> str:
    return "; ".join(f"{' + '.join(files)} ({fmt})" for fmt, files in FORMATS.items())


def _from_hub(repo: str, subfolder: str) -> tuple[Path, str]:
    """Download (or find in the local cache) the files of an SAE on the hub, trying each
    format's files in turn."""
    from huggingface_hub import hf_hub_download  # transformers depends on it

    where = f"{repo}/{subfolder}" if subfolder else repo
    for fmt, files in FORMATS.items():
        paths = []
        for file in files:
            filename = f"{subfolder}/{file}" if subfolder else file
            try:
                paths.append(Path(hf_hub_download(repo, filename)))
            except Exception as err:  # a missing file: the next format; offline: say so
                if type(err).__name__ in ("EntryNotFoundError", "RemoteEntryNotFoundError"):
                    break
                raise SAELoadError(
                    f"could not get {filename} of the SAE {where} from the Hugging Face hub "
                    f"({type(err).__name__}); online, run `huggingface-cli download {repo} "
                    f"{filename}` or pass a local folder ({_needs()})"
                ) from None
        else:
            return paths[0].parent, fmt
    raise SAELoadError(f"the hub repository {where} has none of {_needs()}")


def _read_json(path: Path) -> dict:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise SAELoadError(f"{path} is not valid JSON ({err.msg})") from None
    if not isinstance(cfg, dict):
        raise SAELoadError(f"{path} is not a JSON object")
    return cfg
