"""Transcoder feature interventions, constrained to chosen layers or propagating: what an
attribution graph's edges predict, run forwards. circuit-tracer 0.5's
``ReplacementModel.feature_intervention(..., constrained_layers=, freeze_attention=)``.

:func:`feature_intervention` runs one prompt with transcoder features edited
(:class:`interp.engine.FeatureEdit`: set or scale a feature at a position). An edit adds its
change of the feature times the feature's decoder row where the feature writes. Layers are of
two kinds:

- *constrained* (``constrained_layers``): the MLP output is held at its clean value
  (``skip(x) + clean output - clean skip``, the skip term following the input) plus the edits'
  change, computed from the *clean* activations: effects pass only directly through these
  layers. A cross-layer feature writes only into constrained layers. Edits must be in them;
- *unconstrained* (every other layer): the MLP runs, and an edit's change is computed from the
  feature's activation *in this run* (as ``run_cached(..., transcoders=tc,
  feature_edits=...)``): effects propagate.

Attention patterns (their q and k too) are held at their clean values in every layer when
``freeze_attention`` or any layer is constrained; norm scales (every LayerNorm and RMSNorm
denominator, the final one included) only when every layer is. So ``constrained_layers=range(
n_layers)`` is the frozen replacement model of the graph (:func:`frozen_feature_run`): zeroing
feature ``s`` moves each feature's pre-activation and each demeaned raw logit by exactly
``-A[:, s]`` (tests/graphs/test_graph_interventions.py). ``constrained_layers=None`` with
``freeze_attention=False`` is the propagating run.

One difference from circuit-tracer, on purpose: circuit-tracer zeroes position 0's activations
before an edit reads them (so an edit there adds ``value * W_dec`` whatever the feature was);
interp edits them as they are, as ``run_cached`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.engine import FeatureEdit, forward, run_cached, to_tokens
from interp.graphs.frozen import FINAL_HOOK

__all__ = ["FeatureRun", "FrozenRun", "feature_intervention", "frozen_feature_run"]

_ATTENTION = ("attn.hook_pattern", "attn.hook_q", "attn.hook_k")  # frozen: the pattern
_NORMS = (".hook_scale",)  # frozen when every layer is constrained


@dataclass(frozen=True)
class FeatureRun:
    """A run with feature edits: each layer's feature activations and pre-activations, read
    from the run's own transcoder inputs (edits not applied), and the model's logits."""

    activations: Float[Tensor, "layer pos d_tc"]
    pre_activations: Float[Tensor, "layer pos d_tc"]
    logits: Float[Tensor, "pos d_vocab"]


@dataclass(frozen=True)
class FrozenRun:
    """Each layer's feature pre-activations ``[layer pos d_tc]`` and the raw logits at the
    last position ``[d_vocab]`` (before soft-capping, no ``b_U``) of a frozen run."""

    pre_activations: Float[Tensor, "layer pos d_tc"]
    logits: Float[Tensor, " d_vocab"]


def _tokens(model, tokens_or_text) -> Int[Tensor, " pos"]:
    """One prompt's ids ``[pos]`` from text (BOS as the model adds it, as
    :func:`interp.graphs.attribute.attribution_graph` takes it) or ids ``[pos]`` / ``[1 pos]``."""
    if isinstance(tokens_or_text, Tensor) and tokens_or_text.ndim == 1:
        return tokens_or_text
    tokens = to_tokens(model, tokens_or_text)
    if tokens.shape[0] != 1:
        raise ValueError(f"a feature intervention is of one prompt, got {tokens.shape[0]} rows")
    return tokens[0]


def _positions(edits: Sequence[FeatureEdit], n_pos: int) -> None:
    for edit in edits:
        if edit.pos is not None and not -n_pos <= edit.pos < n_pos:
            raise ValueError(
                f"{edit} edits position {edit.pos}, but the prompt has {n_pos} tokens (positions "
                f"0 to {n_pos - 1}, or -{n_pos} to -1 from the end)"
            )


def _layers(constrained: Iterable[int] | None, tc, edits: Sequence[FeatureEdit]) -> set[int]:
    layers = set() if constrained is None else {int(layer) for layer in constrained}
    bad = sorted(layer for layer in layers if not 0 <= layer < tc.n_layers)
    if bad:
        raise ValueError(
            f"constrained_layers has layer {bad[0]}; the transcoders have layers 0 to "
            f"{tc.n_layers - 1}"
        )
    for edit in edits:
        if not 0 <= edit.layer < tc.n_layers or not 0 <= edit.feature < tc.d_tc:
            raise ValueError(
                f"{edit} is outside the transcoders ({tc.n_layers} layers, {tc.d_tc} features)"
            )
        if layers and edit.layer not in layers:
            raise ValueError(
                f"{edit} edits layer {edit.layer}, outside constrained_layers "
                f"{sorted(layers)}; constrain its layer too or leave constrained_layers out"
            )
    return layers


def _change(tc, edits, acts: dict[int, Tensor], out_layer: int, n_pos: int) -> Tensor:
    """``[pos d_model]``: what ``edits`` add to ``out_layer``'s MLP output, each edit's change
    taken from ``acts[edit.layer]`` ``[pos d_tc]``."""
    change = torch.zeros(n_pos, tc.d_model, dtype=tc.dtype, device=tc.device)
    for edit in edits:
        writes = edit.layer == out_layer if tc.kind == "per-layer" else edit.layer <= out_layer
        if not writes:
            continue
        old = acts[edit.layer][:, edit.feature]  # [pos]
        new = old.clone()
        where = slice(None) if edit.pos is None else edit.pos
        new[where] = edit.target(old[None])[0, where]  # FeatureEdit's own rule (value or scale)
        row = tc.decoder_rows(edit.layer, torch.tensor([edit.feature]), out_layer)  # [1 d_model]
        change += (new - old)[:, None] * row
    return change


def _run(model, tokens, tc, edits, layers: set[int], freeze_attention: bool):
    """The pass (module docstring): the pre-activations, the final norm's output ``[pos
    d_model]`` and the logits ``[pos d_vocab]``."""
    tokens = tokens.to(model.cfg.device)
    frozen = _ATTENTION if freeze_attention or layers else ()
    frozen += _NORMS if len(layers) == tc.n_layers else ()
    names = [n for n in model.hook_dict if n.endswith(frozen)] if frozen else []
    inputs = [tc.input_hook(layer) for layer in range(tc.n_layers)]
    outputs = [tc.output_hook(layer) for layer in sorted(layers)]
    clean = run_cached(model, tokens[None], hooks=list(dict.fromkeys(names + inputs + outputs)))
    dtype = clean[inputs[0]].dtype
    tc = tc.to(device=model.cfg.device, dtype=dtype)
    n_pos = len(tokens)
    clean_x = {layer: clean[inputs[layer]][0] for layer in layers}
    clean_acts = {layer: tc.encode(x, layer) for layer, x in clean_x.items()}
    got: dict = {"x": {}, "acts": {}}

    def freeze(name):
        value = clean[name]
        return lambda act, hook: value.reshape(act.shape)

    def read(layer):
        def hook(act, hook):
            got["x"][layer] = act
            got["acts"][layer] = tc.encode(act[0], layer)

        return hook

    def write(layer):
        def hook(act, hook):
            x = got["x"][layer]
            if layer in layers:
                const = clean[tc.output_hook(layer)] - tc.skip(clean_x[layer][None], layer)
                change = _change(tc, edits, clean_acts, layer, n_pos)
                # .to: a norm's inside (ln2.hook_normalized) is float32 in a half-precision model
                return (tc.skip(x, layer) + const + change).to(act.dtype)
            if layers:  # with some layers constrained, edits write only into those
                return act
            return act + _change(tc, edits, got["acts"], layer, n_pos).to(act.dtype)

        return hook

    def final(act, hook):
        got["final"] = act[0]

    hooks = [(name, freeze(name)) for name in dict.fromkeys(names)]
    for layer in range(tc.n_layers):
        hooks += [(tc.input_hook(layer), read(layer)), (tc.output_hook(layer), write(layer))]
    hooks.append((FINAL_HOOK, final))
    logits = forward(model, tokens[None], hooks)[0]
    pre = torch.stack([tc.pre_activations(got["x"][lay][0], lay) for lay in range(tc.n_layers)])
    return tc, pre, got["final"], logits


def feature_intervention(
    model,
    tokens: Int[Tensor, " pos"] | str,
    tc,
    edits: Sequence[FeatureEdit] = (),
    *,
    constrained_layers: Iterable[int] | None = None,
    freeze_attention: bool = False,
) -> FeatureRun:
    """``tokens`` with ``edits``, effects passing only directly through ``constrained_layers``
    and propagating through the others (module docstring).

    ``tokens``: ids ``[pos]``, or text (tokenised as the model does, BOS included).

    Raises:
        ValueError: a constrained layer or an edit outside the transcoders, an edit's position
            outside the prompt, or an edit outside ``constrained_layers`` when some are given
            (circuit-tracer drops those silently).
    """
    tokens = _tokens(model, tokens)
    _positions(edits, len(tokens))
    layers = _layers(constrained_layers, tc, edits)
    tc, pre, _, logits = _run(model, tokens, tc, edits, layers, freeze_attention)
    acts = torch.stack([tc.activate(pre[layer], layer) for layer in range(tc.n_layers)])
    return FeatureRun(activations=acts, pre_activations=pre, logits=logits)


def frozen_feature_run(
    model, tokens: Int[Tensor, " pos"] | str, tc, edits: Sequence[FeatureEdit] = ()
) -> FrozenRun:
    """The frozen replacement model of ``tokens`` (ids or text) with ``edits``:
    :func:`feature_intervention` with every layer constrained, read as the graph's targets (raw
    last-position logits)."""
    tokens = _tokens(model, tokens)
    _positions(edits, len(tokens))
    layers = _layers(range(tc.n_layers), tc, edits)
    tc, pre, final, _ = _run(model, tokens, tc, edits, layers, True)
    W_U = model.W_U.detach().to(final.dtype)
    return FrozenRun(pre_activations=pre, logits=final[-1] @ W_U)
