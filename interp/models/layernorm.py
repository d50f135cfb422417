"""Fold normalisation weights into the weights that read them, on a new model proven equal.

``fold_layernorm(model)`` returns a *copy* of a TransformerBridge whose pre-norms keep only their
normalisation: each norm's weight (and LayerNorm's bias) is folded into the linear maps that read
it (``W_Q/W_K/W_V``, ``W_in``, ``W_U``) and value biases are moved into ``b_O``.
TransformerLens's ``enable_compatibility_mode()`` does the arithmetic; for LayerNorm models it
also centres the weights that write to the residual stream (their mean over ``d_model``, which
the next LayerNorm removes anyway) and the unembedding over the vocabulary.

RMSNorm models (Llama, Qwen, Mistral, Gemma) are folded too, with only what is exact there:
RMSNorm does not centre, so nothing is centred; its weight (Gemma: ``1 + w``) is folded into the
maps that read it. Norms that nothing linear reads (Gemma 2's post-attention and post-MLP norms,
whose output is added to the residual stream) keep their weights; :class:`FoldInfo` lists them.

This module adds what TransformerLens does not promise:

- the input model is left untouched (TransformerLens rewrites a bridge in place, once);
- the result is *checked*: log-probabilities of the folded copy equal the original's on a probe
  prompt, or ``FoldError`` is raised (``verify=True``);
- what centring the unembedding removed is recorded in :class:`FoldInfo`, so that an exact
  decomposition of a single logit can name it (``mean_logit`` in ``interp.attribution``);
- models that cannot be folded this way are refused with the reason (see ``check_foldable``).

With a centred unembedding the folded logits equal the original ones minus, at each position,
their mean over the vocabulary; log-probabilities and logit differences are unchanged.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from interp.models.norms import effective_bias, effective_weight, soft_cap

__all__ = ["FoldError", "FoldInfo", "check_foldable", "fold_info", "fold_layernorm", "is_folded"]

logger = logging.getLogger(__name__)

# The attribute a folded copy carries; its presence is what "folded by interp" means.
FOLD_ATTR = "_interp_fold_info"
PROBE_TOKENS = 16  # enough positions for attention and every LayerNorm to matter
# A broken fold moves log-probs by ~0.1 or more; float32 rounding over a few dozen layers stays
# near 1e-5. Half precision folds (TransformerLens upcasts to float32) round at ~1e-2 per logit.
VERIFY_ATOL = {torch.float64: 1e-8, torch.float32: 1e-3, torch.bfloat16: 0.25, torch.float16: 0.1}


class FoldError(ValueError):
    """The model cannot be folded (or folding did not preserve its outputs); says why."""


@dataclass(frozen=True)
class FoldInfo:
    """What folding changed that an exact decomposition of a single logit needs.

    Centring the unembedding subtracts, at every position, the mean logit over the vocabulary:
    ``folded_logit[t] = original_logit[t] - (x_hat @ unembed_mean + unembed_bias_mean)`` where
    ``x_hat`` is the final norm's normalised input (LayerNorm: centred, divided by its scale;
    RMSNorm: divided by its scale). Both are zero when ``center_unembed`` is False.
    """

    center_unembed: bool
    unembed_mean: Float[Tensor, " d_model"]  # vocab mean of ln_final.w * W_U, float64, on cpu
    unembed_bias_mean: float  # vocab mean of b_U + ln_final.b @ W_U
    # norms whose weights the fold left in place (e.g. Gemma 2's post-norms): nothing linear
    # reads them, so they are applied as they are
    kept: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return (
            f"FoldInfo(center_unembed={self.center_unembed}, unembed_mean "
            f"{self.unembed_mean.dtype} {list(self.unembed_mean.shape)}, "
            f"unembed_bias_mean={self.unembed_bias_mean:.4g}, kept={self.kept})"
        )

    def mean_logit(self, x_hat: Float[Tensor, "*batch d_model"]) -> Float[Tensor, "*batch"]:
        """The per-position constant that centring removed from every logit."""
        return x_hat.double() @ self.unembed_mean.to(x_hat.device) + self.unembed_bias_mean


def is_folded(model) -> bool:
    """True for a model returned by :func:`fold_layernorm`."""
    return getattr(model, FOLD_ATTR, None) is not None


def fold_info(model) -> FoldInfo:
    """The :class:`FoldInfo` of a folded model; raises for any other model."""
    info = getattr(model, FOLD_ATTR, None)
    if info is None:
        raise FoldError(
            "this model was not folded by interp.fold_layernorm; fold it first: "
            "folded = fold_layernorm(model)"
        )
    return info


def check_foldable(model) -> None:
    """Raise :class:`FoldError` saying why ``model`` cannot be folded; return if it can.

    Refused: models already folded (by interp or by TransformerLens's ``enable_compatibility_mode``
    / ``process_weights``: their original basis is gone, folding twice cannot be checked), models
    without normalisation or whose norms have no weights (nothing to fold), and architectures
    whose adapter declares folding unsupported (post-LN models such as BERT).
    """
    if not hasattr(model, "enable_compatibility_mode") or not hasattr(model, "adapter"):
        raise FoldError(
            f"fold_layernorm needs a TransformerLens TransformerBridge (from "
            f"interp.load_model), got {type(model).__name__}"
        )
    device_map = getattr(getattr(model, "original_model", None), "hf_device_map", None) or {}
    if any(str(v).lower() in ("cpu", "disk") for v in device_map.values()):
        raise FoldError(
            "this model was loaded with a CPU/disk device_map, and TransformerLens "
            "4.3 cannot fold offloaded weights; load it with device= instead of "
            "device_map= to fold it (attribution needs the fold)"
        )
    if is_folded(model):
        raise FoldError(
            "this model is already folded (it came from fold_layernorm); use it as it is"
        )
    if getattr(model, "_weights_processed", False):
        raise FoldError(
            "this model's weights were already processed by TransformerLens "
            "(enable_compatibility_mode() or process_weights()), so its original "
            "norm weights are gone and a fold cannot be checked against them; "
            "load the model again and pass the unprocessed one"
        )
    norm = getattr(model.cfg, "normalization_type", None)
    if norm is None:
        raise FoldError("this model has no LayerNorm or RMSNorm, so there is nothing to fold")
    if norm in ("LNPre", "RMSPre"):
        kind = "LayerNorm" if norm == "LNPre" else "RMSNorm"
        raise FoldError(
            f"this model's {kind}s have no weights (normalization_type {norm!r}): "
            "it is already folded"
        )
    if norm not in ("LN", "RMS"):
        raise FoldError(
            f"unsupported normalization_type {norm!r}; only LayerNorm ('LN') and "
            "RMSNorm ('RMS') models can be folded"
        )
    adapter = model.adapter
    for flag, what in (
        ("supports_compatibility_mode", "compatibility mode"),
        ("supports_fold_ln", "LayerNorm folding"),
        ("supports_center_writing_weights", "centring writing weights"),
    ):
        if not getattr(adapter, flag, True):
            raise FoldError(
                f"TransformerLens's {type(adapter).__name__} does not support {what} "
                "(its LayerNorms sit where folding would change the output, e.g. "
                "post-LN); this model cannot be folded"
            )
    if not all(hasattr(model, name) for name in ("W_U", "ln_final")):
        raise FoldError("this model has no final norm and unembedding to fold into")


def _clone(model):
    """Deep-copy a bridge. Attention modules keep their last pattern as a non-leaf tensor,
    which ``copy.deepcopy`` refuses, so those are copied detached."""
    memo: dict[int, object] = {}
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, Tensor) and not value.is_leaf:
                memo[id(value)] = value.detach().clone()
    try:
        return copy.deepcopy(model, memo)
    except Exception as exc:  # noqa: BLE001 - re-raised with the remedy
        raise FoldError(
            f"could not copy the model to fold it ({type(exc).__name__}: {exc}); "
            "load a second copy with interp.load_model and fold that"
        ) from exc


def _unembed_means(model) -> tuple[Float[Tensor, " d_model"], float]:
    """Vocabulary means of the unembedding with ln_final's weight and bias folded in."""
    with torch.no_grad():
        W_U = model.W_U.detach().double().cpu()  # [d_model d_vocab]
        d_model = W_U.shape[0]
        weight = effective_weight(model.ln_final, d_model)
        bias = effective_bias(model.ln_final, d_model)
        b_U = getattr(model, "b_U", None)
        b_U_mean = 0.0 if b_U is None else float(b_U.detach().double().mean())
        column_mean = W_U.mean(dim=1)  # [d_model]
        return weight * column_mean, b_U_mean + float(bias @ column_mean)


NORM_NAMES = ("ln1", "ln2", "ln1_post", "ln2_post")


def _kept_norms(model) -> tuple[str, ...]:
    """Names of the norms whose effective weight or bias is not the identity."""
    named = [
        (f"blocks.{layer}.{name}", getattr(block, name, None))
        for layer, block in enumerate(model.blocks)
        for name in NORM_NAMES
    ]
    kept = []
    for name, norm in named + [("ln_final", model.ln_final)]:
        if norm is None or getattr(norm, "weight", None) is None:
            continue
        d_model = int(norm.weight.shape[-1])
        weight, bias = effective_weight(norm, d_model), effective_bias(norm, d_model)
        if not (torch.equal(weight, torch.ones_like(weight)) and not bias.any()):
            kept.append(name)
    return tuple(kept)


def _probe_tokens(model) -> Tensor:
    generator = torch.Generator().manual_seed(0)
    n = min(PROBE_TOKENS, int(model.cfg.n_ctx))
    return torch.randint(0, int(model.cfg.d_vocab), (1, n), generator=generator)


def _verify(original, folded) -> float:
    tokens = _probe_tokens(original).to(original.cfg.device)
    with torch.inference_mode():
        before = original(tokens, return_type="logits").double().log_softmax(-1)
        after = folded(tokens.to(folded.cfg.device), return_type="logits").double().log_softmax(-1)
    return float((before - after.to(before.device)).abs().max())


def _centre_unembedding(model, requested: bool | None) -> bool:
    norm = getattr(model.cfg, "normalization_type", None)
    cap = soft_cap(model)
    if requested and cap is not None:
        raise FoldError(
            f"this model soft-caps its logits (cap * tanh(logit / cap), cap = {cap:g}),"
            " which is not translation invariant: centring the unembedding would "
            "change its output; pass center_unembed=False (the default here)"
        )
    if requested is None:  # centring is LayerNorm's habit; RMSNorm centres nothing
        return norm == "LN" and cap is None
    return bool(requested)


def fold_layernorm(model, *, center_unembed: bool | None = None, verify: bool = True):
    """Return a new model with every norm's weight (and bias) folded into what reads it.

    LayerNorm models: also centres the weights writing to the residual stream, folds value
    biases into ``b_O`` and (``center_unembed``) centres the unembedding. RMSNorm models: folds
    the weights (Gemma's ``1 + w``) of the norms that linear maps read and the value biases;
    centres nothing. ``model`` itself is not changed. The copy holds its own weights (memory
    doubles while both are alive).

    Args:
        model: a TransformerBridge with LayerNorm or RMSNorm (``interp.load_model``), not yet
            processed.
        center_unembed: centre ``W_U``/``b_U`` over the vocabulary. Default (None): for
            LayerNorm models (TransformerLens's default), not for RMSNorm or soft-capped models;
            True on a soft-capped model is refused. Logits then lose their per-position mean;
            log-probs and logit differences do not change. The removed mean is kept in
            :func:`fold_info` for exact attribution.
        verify: run both models on a fixed random probe prompt and raise :class:`FoldError` if
            their log-probabilities differ by more than ``VERIFY_ATOL`` for the model's dtype.

    Raises:
        FoldError: the model cannot be folded (see :func:`check_foldable`), centring was asked
            for on a soft-capped model, or the folded copy does not reproduce the original's
            log-probabilities.
    """
    check_foldable(model)
    center_unembed = _centre_unembedding(model, center_unembed)
    unembed_mean, unembed_bias_mean = _unembed_means(model)
    folded = _clone(model)
    folded.enable_compatibility_mode(
        disable_warnings=True,
        fold_ln=True,
        center_writing_weights=True,
        center_unembed=center_unembed,
        fold_value_biases=True,
    )
    folded.eval()
    if not center_unembed:
        unembed_mean, unembed_bias_mean = torch.zeros_like(unembed_mean), 0.0
    info = FoldInfo(
        center_unembed=center_unembed,
        unembed_mean=unembed_mean,
        unembed_bias_mean=unembed_bias_mean,
        kept=_kept_norms(folded),
    )
    object.__setattr__(folded, FOLD_ATTR, info)  # plain attribute, not a registered buffer
    if verify:
        dtype = next(model.parameters()).dtype
        atol = VERIFY_ATOL.get(dtype, 1e-3)
        error = _verify(model, folded)
        logger.info("fold_layernorm: max |log-prob difference| on the probe = %.3g", error)
        if not error <= atol:
            raise FoldError(
                f"folding changed the model's log-probabilities by {error:.3g} (more "
                f"than {atol:g}) on a probe prompt; this architecture does not fold "
                "correctly in TransformerLens. Use the unfolded model."
            )
    return folded
