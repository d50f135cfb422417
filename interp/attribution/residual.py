"""The final residual stream at one position as the sum of what each component wrote.

::

    x = embed (+ pos_embed) + sum_layers( sum_heads P_attn(z_h @ W_O,h) + P_attn(b_O) + mlp_out )

``P_attn`` is the identity, except in models that normalise a sublayer's output before adding it
to the stream (Gemma 2's post-attention and post-MLP RMSNorms): there it is that norm with its
scale frozen at its value in the run, ``v / s * w``, which is linear, so per-head (and
per-neuron) writes still add up exactly. The sum does not depend on how blocks are wired:
sequential blocks and parallel ones (Pythia, GPT-J, Phi, where attention and MLP both read
``resid_pre``) write the same kinds of terms. Heads are query heads: with grouped-query attention
each query head's ``z @ W_O`` is its own row although it shares keys and values.

``residual_parts`` checks the sum against the model's own final residual stream and raises
:class:`AttributionError` if it does not hold, so no caller decomposes a stream it misreads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.engine import run_cached
from interp.models.norms import POST_NORMS, freeze, is_rms, param, post_norm, soft_cap

__all__ = [
    "AttributionError",
    "ResidualParts",
    "check_within",
    "final_hooks",
    "final_logits",
    "parts_hooks",
    "residual_parts",
]

# The components must add up to the final residual stream. float32 activations summed in float64
# agree with a float32 forward pass to ~1e-6 on values of order 1; rounding grows with their size.
RESID_ATOL = 1e-4
RESID_RTOL = 1e-5
# cap * tanh(pre / cap) recomputed in float64 against the model's float32 output
CAP_ATOL = 1e-4


class AttributionError(RuntimeError):
    """A decomposition failed its identity check; the numbers would be wrong, so none are given."""


def has_pos_embed(model) -> bool:
    return getattr(model.cfg, "positional_embedding_type", None) == "standard"


def check_within(error: float, scale: float, atol: float, rtol: float, refusal: str) -> float:
    """``error`` when it is within ``atol + rtol * scale`` (a NaN never is); else an
    :class:`AttributionError` saying ``refusal``, the error and the bound. Every identity of
    attribution (parts add up to a whole) is checked here, one way."""
    bound = atol + rtol * scale
    if not error <= bound:
        raise AttributionError(f"{refusal} (error {error:.3g} > allowed {bound:.3g})")
    return error


def check_sum(total: Tensor, reference: Tensor, what: str, against: str) -> None:
    check_within(
        float((total - reference).abs().max()),
        float(reference.abs().max()),
        RESID_ATOL,
        RESID_RTOL,
        f"{what} do not add up to {against}: this architecture's residual stream is not the "
        "sum interp decomposes, so no attribution is given",
    )


@dataclass(frozen=True)
class ResidualParts:
    """Labelled residual-stream writes at one position and what the final norm did there."""

    labels: list[tuple]  # (component, layer, head, neuron), None where they do not apply
    stack: Float[Tensor, "component d_model"]  # float64, adds up to ``x``
    x: Float[Tensor, " d_model"]  # the final residual stream (input of ln_final)
    scale: float  # ln_final's scale at this position, frozen
    logits: Float[Tensor, " d_vocab"]  # before any soft-cap: linear in ``x`` given ``scale``
    output: Float[Tensor, " d_vocab"]  # the model's output (after the soft-cap, if any)

    def __repr__(self) -> str:
        return (
            f"ResidualParts({len(self.labels)} components, stack "
            f"{list(self.stack.shape)}, scale={self.scale:.4g}, logits "
            f"{list(self.logits.shape)})"
        )


def _pre_cap(model, run, position: int, row: int = 0) -> Tensor:
    """Logits before the soft-cap (``unembed.hook_out``), checked against the capped output."""
    cap = soft_cap(model)
    output = run.logits[row, position].double().cpu()
    if cap is None:
        return output
    raw = run["unembed.hook_out"][row, position].double().cpu()
    error = float((cap * torch.tanh(raw / cap) - output).abs().max())
    if not error <= CAP_ATOL:
        raise AttributionError(
            f"the unembedding's output capped at {cap:g} differs from the "
            f"model's logits by {error:.3g}: this model's soft-capping is not "
            "cap * tanh(logits / cap), so its pre-cap logits cannot be read"
        )
    return raw


def final_logits(
    model, tokens: Int[Tensor, "batch pos"], position: int, *, run=None, row: int = 0
) -> tuple[Tensor, Tensor]:
    """``(pre_cap, output)`` logits of one forward pass at ``position`` (equal without a cap);
    ``run``: read row ``row`` of a run made with ``hooks=final_hooks(model)`` instead."""
    if run is None:
        run = run_cached(model, tokens, hooks=final_hooks(model))
    return _pre_cap(model, run, position, row), run.logits[row, position].double().cpu()


def final_hooks(model) -> list[str]:
    """The hooks :func:`final_logits` reads (the pre-cap logits of soft-capped models)."""
    return ["unembed.hook_out"] if soft_cap(model) is not None else []


def _post_scale_hooks(model, layer: int, has_mlp: bool) -> list[str]:
    names = []
    for sublayer, short in POST_NORMS.items():
        norm = post_norm(model, layer, sublayer)
        if norm is None or (sublayer == "mlp" and not has_mlp):
            continue
        if not is_rms(norm):
            raise AttributionError(
                f"layer {layer} normalises its {sublayer} output with a "
                "LayerNorm before adding it, which interp does not decompose "
                "(only RMSNorm post-norms, as in Gemma 2)"
            )
        names.append(f"blocks.{layer}.{short}.hook_scale")
    return names


def parts_hooks(model, *, neurons: bool) -> list[str]:
    """The hooks :func:`residual_parts` reads (with ``head_outputs=True``)."""
    cfg = model.cfg
    n_layers = int(cfg.n_layers)
    has_mlp = not getattr(cfg, "attn_only", False)
    hooks = ["hook_embed", "ln_final.hook_scale", f"blocks.{n_layers - 1}.hook_resid_post"]
    hooks += ["hook_pos_embed"] if has_pos_embed(model) else []
    hooks += ["unembed.hook_out"] if soft_cap(model) is not None else []
    for layer in range(n_layers):
        hooks += _post_scale_hooks(model, layer, has_mlp)
        if has_mlp:
            hooks.append(f"blocks.{layer}.hook_mlp_out")
            hooks += [f"blocks.{layer}.mlp.hook_post"] if neurons else []
    return hooks


def residual_parts(
    model,
    tokens: Int[Tensor, "batch pos"] | None,
    pos: int,
    *,
    neurons: bool,
    run=None,
    row: int = 0,
) -> ResidualParts:
    """Decompose the final residual stream of ``tokens`` (one prompt) at ``pos``; or, given
    ``run`` (made with ``head_outputs=True, hooks=parts_hooks(...)``), of its row ``row``."""
    cfg = model.cfg
    n_layers, n_heads = int(cfg.n_layers), int(cfg.n_heads)
    has_mlp = not getattr(cfg, "attn_only", False)
    if run is None:
        run = run_cached(
            model, tokens, head_outputs=True, hooks=parts_hooks(model, neurons=neurons)
        )

    def at(name: str) -> Tensor:
        return run[name][row, pos].double().cpu()

    def through(layer: int, sublayer: str, vectors: Tensor) -> Tensor:
        """What ``vectors`` (summands of a sublayer's output) add to the residual stream."""
        norm = post_norm(model, layer, sublayer)
        if norm is None:
            return vectors
        scale = at(f"blocks.{layer}.{POST_NORMS[sublayer]}.hook_scale")
        return freeze(norm, vectors, float(scale[0]))

    labels: list[tuple] = [("embed", None, None, None)]
    vectors: list[Tensor] = [at("hook_embed")[None]]  # Gemma's is already scaled by sqrt(d_model)
    if has_pos_embed(model):
        labels.append(("pos_embed", None, None, None))
        vectors.append(at("hook_pos_embed")[None])
    heads = run.head_outputs()[:, row, pos].double().cpu()  # [layer head d_model]
    b_O = param(model, "b_O")
    W_out, b_out = (param(model, "W_out"), param(model, "b_out")) if has_mlp else (None, None)
    for layer in range(n_layers):
        labels += [("head", layer, head, None) for head in range(n_heads)]
        vectors.append(through(layer, "attn", heads[layer]))
        if b_O is not None:
            labels.append(("attn_bias", layer, None, None))
            vectors.append(through(layer, "attn", b_O[layer][None]))
        if not has_mlp:
            continue
        mlp_out = at(f"blocks.{layer}.hook_mlp_out")
        if not neurons:
            labels.append(("mlp", layer, None, None))
            vectors.append(mlp_out[None])
            continue
        post = at(f"blocks.{layer}.mlp.hook_post")  # [d_mlp]
        per_neuron = through(layer, "mlp", post[:, None] * W_out[layer])  # [d_mlp d_model]
        labels += [("neuron", layer, None, n) for n in range(per_neuron.shape[0])]
        bias = [] if b_out is None else [through(layer, "mlp", b_out[layer][None])]
        labels += [] if b_out is None else [("mlp_bias", layer, None, None)]
        check_sum(
            torch.cat([per_neuron, *bias]).sum(0),
            mlp_out,
            f"layer {layer}'s neurons" + (" + b_out" if bias else ""),
            "its MLP output",
        )
        vectors += [per_neuron, *bias]
    stack = torch.cat(vectors)  # [component d_model]
    x = at(f"blocks.{n_layers - 1}.hook_resid_post")
    check_sum(stack.sum(0), x, "the components", "the final residual stream")
    return ResidualParts(
        labels=labels,
        stack=stack,
        x=x,
        scale=float(run["ln_final.hook_scale"][row, pos, 0]),
        logits=_pre_cap(model, run, pos, row),
        output=run.logits[row, pos].double().cpu(),
    )
