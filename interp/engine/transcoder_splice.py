"""Transcoders spliced into a run: every MLP's output replaced by its reconstruction.

A transcoder set here is anything with ``n_layers``, ``kind``, ``input_hook(l)``,
``output_hook(l)``, ``encode(x, l)``, ``decode(acts, l)`` and ``skip(x, l)``
(:class:`interp.transcoders.TranscoderSet`; the engine does not import the analyses). At layer
``l`` the features ``f_l = encode(x_l, l)`` are taken from the MLP's input ``x_l``, and the MLP's
output ``y_l`` becomes ``r_l + (y_l - r_l)`` with ``r_l = decode(f, l) + skip(x_l, l)`` (a
cross-layer set decodes every layer's features up to ``l``): the model's own run
(``use_error_term=True``) or ``r_l`` alone, the replacement model's run. ``f_l`` is kept under
``blocks.{l}.hook_transcoder_acts`` ``[batch pos d_tc]``.

:class:`~interp.engine.feature_edit.FeatureEdit` (of a layer) sets or scales one feature (at one
position or all) before it is decoded; the error term is the one of the unedited features, so an
edit moves the output by exactly the change of the reconstruction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from jaxtyping import Float
from torch import Tensor

from interp.engine.passes import HookFn, hook_shape

if TYPE_CHECKING:
    from interp.engine.feature_edit import FeatureEdit

__all__ = [
    "TRANSCODER_ACTS",
    "check_transcoders",
    "transcoder_acts_name",
    "transcoder_hooks",
]

TRANSCODER_ACTS = "hook_transcoder_acts"  # the suffix feature activations are cached under


def transcoder_acts_name(layer: int) -> str:
    """The cache key of layer ``layer``'s transcoder features."""
    return f"blocks.{layer}.{TRANSCODER_ACTS}"


def check_transcoders(model, tc) -> None:
    """Refuse, before any run, transcoders that do not cover the model's layers, width or
    hooks (the analyses' ``check_transcoders_fit`` says more)."""
    if tc.n_layers != model.cfg.n_layers or tc.d_model != model.cfg.d_model:
        raise ValueError(
            f"transcoders of {tc.n_layers} layers x d_model {tc.d_model} do not fit a model of "
            f"{model.cfg.n_layers} layers x d_model {model.cfg.d_model}; load transcoders "
            "trained on this model"
        )
    for layer in range(tc.n_layers):
        for name in (tc.input_hook(layer), tc.output_hook(layer)):
            if name not in model.hook_dict:
                raise ValueError(f"transcoders use {name}, which this model has no hook for")
    if tc.input_hook(0).endswith(".hook_normalized"):  # a norm's inside: some bridges flatten it
        shape = hook_shape(model, tc.input_hook(0))
        if len(shape) != 3:
            raise ValueError(
                f"transcoders read {tc.input_hook(0)}, which this model flattens (shape "
                f"{list(shape)} for one row of 2 tokens, not [batch pos d_model]); interp splices "
                "a norm's inside only where it keeps batch and position apart"
            )


def _check_edits(tc, edits: Sequence[FeatureEdit]) -> None:
    for edit in edits:
        if edit.layer is None:
            raise ValueError(
                f"{edit} edits an SAE: pass it as run_cached(interventions=[...]), not as a "
                "transcoder's feature_edits"
            )
        if not 0 <= edit.layer < tc.n_layers or not 0 <= edit.feature < tc.d_tc:
            raise ValueError(
                f"{edit} is outside the transcoders ({tc.n_layers} layers, {tc.d_tc} features)"
            )


def transcoder_hooks(
    tc,
    store: dict,
    *,
    use_error_term: bool = True,
    edits: Sequence[FeatureEdit] = (),
) -> list[tuple[str, HookFn]]:
    """Forward hooks splicing ``tc`` into every layer and keeping its features in ``store``."""
    _check_edits(tc, edits)
    state: dict = {"x": {}, "acts": {}, "clean": {}}

    def read(layer: int) -> HookFn:
        def hook(x: Float[Tensor, "batch pos d_model"], hook) -> None:
            acts = tc.encode(x, layer)
            state["x"][layer] = x
            state["clean"][layer] = acts
            mine = [e for e in edits if e.layer == layer]
            if mine:
                acts = acts.clone()
                for edit in mine:
                    edit.apply(acts)
            state["acts"][layer] = acts
            store[transcoder_acts_name(layer)] = acts.detach()

        return hook

    def decode(which: str, layer: int) -> Tensor:
        acts = state[which]
        return tc.decode(acts[layer] if tc.kind == "per-layer" else acts, layer)

    def write(layer: int) -> HookFn:
        def hook(y: Float[Tensor, "batch pos d_model"], hook) -> Tensor:
            if layer not in state["x"]:
                raise RuntimeError(f"{tc.output_hook(layer)} ran before {tc.input_hook(layer)}")
            skip = tc.skip(state["x"][layer], layer)
            recon = (decode("acts", layer) + skip).to(y.dtype)
            if not use_error_term:
                return recon
            clean = recon if not edits else (decode("clean", layer) + skip).to(y.dtype)
            return recon + (y - clean)

        return hook

    hooks = []
    for layer in range(tc.n_layers):
        hooks.append((tc.input_hook(layer), read(layer)))
        hooks.append((tc.output_hook(layer), write(layer)))
    return hooks
