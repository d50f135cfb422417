"""Load an SAE saved in SAELens's format: a bundled name, a local folder, or a hub name.

A saved SAE is a folder with ``cfg.json`` and ``sae_weights.safetensors`` (``W_enc``,
``b_enc``, ``W_dec``, ``b_dec``, and ``threshold`` for JumpReLU). From ``cfg.json`` interp
reads ``architecture`` (default ``"standard"``), ``d_in``, ``d_sae``, ``hook_name`` (top level,
or under ``metadata`` as SAELens 6 writes it), ``apply_b_dec_to_input`` (default False), ``k``
for TopK (or ``activation_fn_kwargs.k``, as older SAELens wrote it) and
``normalize_activations``, which must be ``"none"`` (or absent): interp does not rescale inputs.
Every other key is kept in ``sae.cfg``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from interp.saes.bundled import SAE_FILES, bundled_sae_path, bundled_saes
from interp.saes.sae import ARCHITECTURES, SAE

__all__ = ["SAEFitError", "SAELoadError", "check_sae_fits", "load_sae"]

WEIGHTS = ("W_enc", "b_enc", "W_dec", "b_dec")  # the tensors every architecture has


class SAELoadError(ValueError):
    """What is wrong with an SAE folder or name, in one line."""


class SAEFitError(ValueError):
    """An SAE whose hook or width does not fit the model, in one line."""


def load_sae(path_or_name: str | Path, *, device: str | torch.device | None = None) -> SAE:
    """An SAE from a bundled name (``"tiny-induction-sae"``), a local folder in SAELens's
    saved format, or a Hugging Face repository (``"owner/repo"`` or ``"owner/repo/subfolder"``).

    Raises:
        SAELoadError: a folder that is not an SAE (naming the missing file), an unknown
            architecture, missing tensors or shapes that disagree with ``cfg.json``, or a hub
            name that cannot be fetched (offline: what to download, and how).
    """
    folder = _folder(str(path_or_name))
    cfg = _read_cfg(folder)
    tensors = read_safetensors(folder / SAE_FILES[1])
    sae = _build(cfg, tensors, folder)
    return sae if device is None else sae.to(device)


def check_sae_fits(model, sae: SAE) -> None:
    """Refuse, in one line, an SAE whose hook the model lacks or whose ``d_in`` is not the
    width of the activation at that hook."""
    if sae.hook_name not in model.hook_dict:
        raise SAEFitError(
            f"this SAE reads {sae.hook_name!r}, which this model has no hook for; "
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


def _folder(name: str) -> Path:
    bundled = bundled_sae_path(name)
    if bundled is not None:
        return bundled
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise SAELoadError(
                f"{name} is a file; an SAE is a folder with {' and '.join(SAE_FILES)}"
            )
        missing = [f for f in SAE_FILES if not (path / f).is_file()]
        if missing:
            raise SAELoadError(
                f"{name} is not an SAE folder: it has no {' and no '.join(missing)} "
                "(SAELens's saved format)"
            )
        return path
    parts = name.strip("/").split("/")
    if len(parts) < 2 or name.startswith((".", "~")) or "\\" in name:
        known = ", ".join(bundled_saes()) or "none"
        raise SAELoadError(
            f"no SAE called {name!r}: not a bundled SAE ({known}), a folder, or a hub name "
            "'owner/repo[/subfolder]'"
        )
    return _from_hub("/".join(parts[:2]), "/".join(parts[2:]))


def _from_hub(repo: str, subfolder: str) -> Path:
    """Download (or find in the local cache) the two files of an SAE on the hub."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as err:  # pragma: no cover - transformers depends on it
        raise SAELoadError("loading an SAE by hub name needs huggingface_hub") from err
    paths = []
    for file in SAE_FILES:
        filename = f"{subfolder}/{file}" if subfolder else file
        try:
            paths.append(Path(hf_hub_download(repo, filename)))
        except Exception as err:  # offline, missing repo or file: one line saying what to do
            where = f"{repo}/{subfolder}" if subfolder else repo
            raise SAELoadError(
                f"could not get {filename} of the SAE {where} from the Hugging Face hub "
                f"({type(err).__name__}); online, run `huggingface-cli download {repo} "
                f"{filename}` or pass a local folder with {' and '.join(SAE_FILES)}"
            ) from None
    return paths[0].parent


def _read_cfg(folder: Path) -> dict:
    try:
        cfg = json.loads((folder / SAE_FILES[0]).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise SAELoadError(f"{folder / SAE_FILES[0]} is not valid JSON ({err.msg})") from None
    if not isinstance(cfg, dict):
        raise SAELoadError(f"{folder / SAE_FILES[0]} is not a JSON object")
    return cfg


def _build(cfg: dict, tensors: dict, folder: Path) -> SAE:
    architecture = cfg.get("architecture", "standard")
    if architecture not in ARCHITECTURES:
        raise SAELoadError(
            f"{folder.name}: architecture {architecture!r} is not one interp runs "
            f"({', '.join(ARCHITECTURES)})"
        )
    normalize = cfg.get("normalize_activations") or "none"
    if normalize != "none":
        raise SAELoadError(
            f"{folder.name}: normalize_activations={normalize!r} rescales the model's "
            "activations before encoding, which interp does not do; fold the scale into the "
            "weights or use an SAE saved with 'none'"
        )
    hook = cfg.get("hook_name") or (cfg.get("metadata") or {}).get("hook_name")
    if not hook:
        raise SAELoadError(f"{folder.name}: cfg.json names no hook_name (top level or metadata)")
    needed = WEIGHTS + (("threshold",) if architecture == "jumprelu" else ())
    missing = [name for name in needed if name not in tensors]
    if missing:
        raise SAELoadError(f"{folder.name}: sae_weights.safetensors lacks {', '.join(missing)}")
    d_in, d_sae = (int(d) for d in tensors["W_enc"].shape)
    for key, value in (("d_in", d_in), ("d_sae", d_sae)):
        if key in cfg and int(cfg[key]) != value:
            raise SAELoadError(
                f"{folder.name}: cfg.json says {key}={cfg[key]} but W_enc is {d_in}x{d_sae}"
            )
    k = cfg.get("k")
    k = (cfg.get("activation_fn_kwargs") or {}).get("k") if k is None else k
    try:
        return SAE(
            *(tensors[name] for name in WEIGHTS),
            architecture=architecture,
            hook_name=hook,
            threshold=tensors.get("threshold") if architecture == "jumprelu" else None,
            k=None if architecture != "topk" or k is None else int(k),
            apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", False)),
            cfg=cfg,
        )
    except ValueError as err:
        raise SAELoadError(f"{folder.name}: {err}") from None


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one ``.safetensors`` file; a file safetensors cannot read (corrupt,
    truncated, not safetensors at all) is refused in one line naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as err:
        reason = str(err).removeprefix("Error while deserializing header: ")
        raise SAELoadError(
            f"{path} is not a readable safetensors file ({reason}); save the SAE again, or "
            "download it afresh"
        ) from None
