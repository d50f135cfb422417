"""Direct logit attribution with SAE features in place of what they decompose.

An SAE at ``blocks.L.hook_resid_pre`` writes the residual stream there as
``x = sum_j f_j W_dec[j] + b_dec + error`` (``error = x - decode(f)``). That stream is the sum
of every component before layer ``L`` (the embeddings and layers ``0 .. L-1``), so in the
direct logit attribution of :func:`interp.logit_attribution` those rows can be replaced by one
row per active feature, one for ``b_dec`` and one for the error, each its vector through the
final norm (scale frozen) and the folded unembedding::

    contribution(v) = v · direction / s

with the same ``direction`` and ``s`` as every other row (:func:`interp.attribution.core.
logit_direction`). Rows of layer ``L`` and later are kept as they are, so the rows still add up
to the logit (difference); that is checked before the frame is returned, and the replaced rows'
sum is checked against the features' too. Features read the model's own (unfolded)
activations, so the model must not be folded already.
"""

from __future__ import annotations

import pandas as pd
import torch

from interp.attribution import logit_attribution
from interp.attribution.core import (
    IDENTITY_ATOL,
    IDENTITY_RTOL,
    _position,
    _single_prompt,
    _target,
    logit_direction,
)
from interp.attribution.residual import check_within, residual_parts
from interp.dictionaries.core import resid_pre_layer
from interp.engine import Prompt, run_cached
from interp.models.layernorm import fold_layernorm, is_folded

__all__ = ["feature_attribution"]

SAE_COMPONENTS = ("sae_feature", "sae_b_dec", "sae_error")  # the rows that replace layers < L


def feature_attribution(
    model,
    prompt: Prompt,
    sae,
    answer: str | int,
    *,
    wrong: str | int | None = None,
    pos: int = -1,
) -> pd.DataFrame:
    """:func:`interp.logit_attribution` of one prompt with the components before the SAE's
    layer replaced by the SAE's active features, its ``b_dec`` and its error (module docstring).

    Returns the same columns plus ``feature`` (nullable; set on ``sae_feature`` rows) and
    ``activation`` (the feature's ``f_j`` at ``pos``). Rows: ``sae_feature`` (one per feature
    active at ``pos``, by contribution), ``sae_b_dec``, ``sae_error``, then the rows of layer
    ``L`` and later, ``unembed_bias``, ``mean_logit`` where present, and ``total``.

    Raises:
        ValueError: the SAE is not at a ``blocks.L.hook_resid_pre`` hook, or the model is
            already folded (features read the model's own activations).
        AttributionError: the rows do not add up.
    """
    layer = _sae_layer(model, sae)
    tokens = _single_prompt(model, prompt)
    position = _position(pos, int(tokens.shape[1]))
    frame = logit_attribution(model, tokens, answer, wrong=wrong, pos=pos)
    folded = fold_layernorm(model)
    scale = residual_parts(folded, tokens, position, neurons=False).scale
    direction = logit_direction(folded, _target(model, answer, wrong))
    features, rest = _sae_rows(model, sae, tokens, position, layer, direction, scale)
    upstream = _before(frame, layer)
    replaced = float(frame.loc[upstream, "contribution"].sum())
    by_features = float(features["contribution"].sum() + rest["contribution"].sum())
    error = check_within(
        abs(replaced - by_features),
        abs(replaced),
        IDENTITY_ATOL,
        IDENTITY_RTOL,
        f"the SAE's rows add up to {by_features:.6g} but the components before layer {layer} "
        f"add up to {replaced:.6g}; refusing to return numbers that do not add up",
    )
    out = pd.concat([features, rest, frame[~upstream]], ignore_index=True)
    for column in ("layer", "head", "feature"):
        out[column] = out[column].astype("Int64")
    out = out[["component", "layer", "head", "feature", "activation", "contribution"]]
    total = float(out.loc[out["component"] != "total", "contribution"].sum())
    expected = float(frame.loc[frame["component"] == "total", "contribution"].iloc[0])
    check_within(
        abs(total - expected),
        abs(expected),
        IDENTITY_ATOL,
        IDENTITY_RTOL,
        f"the rows add up to {total:.6g}, not the total {expected:.6g}",
    )
    out.attrs.update(frame.attrs)
    out.attrs.update(sae=repr(sae), sae_identity_error=error)
    return out


def _sae_layer(model, sae) -> int:
    """The layer ``L`` of the SAE's ``blocks.L.hook_resid_pre``, after refusing an SAE or a
    model the attribution cannot split."""
    layer = resid_pre_layer(sae, "feature attributions")
    if is_folded(model):
        raise ValueError(
            "pass the unfolded model: the SAE reads the model's own activations, which folding "
            "changes; the attribution folds a copy itself"
        )
    return layer


def _sae_rows(model, sae, tokens, position: int, layer: int, direction, scale):
    """The rows replacing the components before ``layer``: one per feature active at
    ``position`` (by contribution), and ``b_dec`` and the error, each ``v · direction / s``."""
    with torch.no_grad():
        x = run_cached(model, tokens, hooks=[sae.hook_name])[sae.hook_name][0, position]
        acts = sae.encode(x)
        recon = sae.decode(acts)
    W_dec = sae.W_dec.detach().double().cpu()
    acts = acts.detach().double().cpu()
    active = torch.nonzero(acts > 0).flatten()

    def through(v: torch.Tensor) -> float:
        return float(v.detach().double().cpu() @ direction / scale)

    features = pd.DataFrame(
        {
            "component": "sae_feature",
            "layer": layer,
            "feature": active.numpy(),
            "activation": acts[active].numpy(),
            "contribution": (acts[active, None] * W_dec[active] @ direction / scale).numpy(),
        }
    ).sort_values("contribution", key=abs, ascending=False)
    rest = pd.DataFrame(
        {
            "component": ["sae_b_dec", "sae_error"],
            "layer": layer,
            "contribution": [through(sae.b_dec), through(x - recon)],
        }
    )
    return features, rest


def _before(frame: pd.DataFrame, layer: int) -> pd.Series:
    """Rows written into the stream before ``layer``: the embeddings and layers below it."""
    embeddings = frame["component"].isin(["embed", "pos_embed"])
    below = frame["layer"].notna() & (frame["layer"].fillna(layer) < layer)
    return embeddings | below
