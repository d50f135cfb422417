"""Feature interventions on the frozen replacement model: what an attribution graph's edges
predict, run forwards.

:func:`frozen_feature_run` runs one prompt through the local replacement model of its clean
run (attention q, k and patterns and every norm scale held at their clean values, every MLP
output ``skip(x) + (clean output - clean skip)``), with transcoder features edited
(:class:`interp.engine.FeatureEdit`: set or scale a feature at a position) and their decoder
rows' change added where they write: only direct effects move, so zeroing feature ``s`` moves
each feature's pre-activation and each demeaned logit by exactly ``-A[:, s]`` of the graph
(tests/graphs/test_graph_interventions.py). The propagating counterpart, where every feature is
recomputed from the edited run, is ``run_cached(..., transcoders=tc, feature_edits=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.engine import FeatureEdit, forward, run_cached

__all__ = ["FrozenRun", "frozen_feature_run"]

_FROZEN = (".hook_scale", "attn.hook_pattern", "attn.hook_q", "attn.hook_k")


@dataclass(frozen=True)
class FrozenRun:
    """Each layer's feature pre-activations ``[layer pos d_tc]`` and the raw logits at the
    last position ``[d_vocab]`` (before soft-capping) of a frozen run."""

    pre_activations: Float[Tensor, "layer pos d_tc"]
    logits: Float[Tensor, " d_vocab"]


def _decoder_change(tc, edits, acts, n_pos: int) -> Tensor:
    """``[layer pos d_model]``: what the edits add to each MLP output."""
    change = torch.zeros(tc.n_layers, n_pos, tc.d_model, dtype=tc.dtype, device=tc.device)
    for edit in edits:
        old = acts[edit.layer][:, edit.feature]  # [pos]
        new = old.clone()
        where = slice(None) if edit.pos is None else edit.pos
        new[where] = edit.value if edit.value is not None else new[where] * edit.scale
        delta = new - old
        outs = [edit.layer] if tc.kind == "per-layer" else range(edit.layer, tc.n_layers)
        for j in outs:
            change[j] += delta[:, None] * tc.decoder_rows(
                edit.layer, torch.tensor([edit.feature]), j
            )
    return change


def frozen_feature_run(
    model, tokens: Int[Tensor, " pos"], tc, edits: Sequence[FeatureEdit] = ()
) -> FrozenRun:
    """The frozen replacement model of ``tokens`` with ``edits`` (module docstring)."""
    tokens = tokens.to(model.cfg.device)
    names = [n for n in model.hook_dict if n.endswith(_FROZEN)]
    names += [tc.input_hook(lay) for lay in range(tc.n_layers)]
    names += [tc.output_hook(lay) for lay in range(tc.n_layers)]
    clean = run_cached(model, tokens[None], hooks=list(dict.fromkeys(names)))
    dtype = clean[tc.input_hook(0)].dtype
    tc = tc.to(device=model.cfg.device, dtype=dtype)
    xs = [clean[tc.input_hook(lay)][0] for lay in range(tc.n_layers)]
    acts = [tc.encode(x, lay) for lay, x in enumerate(xs)]
    change = _decoder_change(tc, edits, acts, len(tokens))
    got: dict = {}

    def frozen(name):
        value = clean[name]
        return lambda act, hook: value.reshape(act.shape)

    def read(layer):
        def hook(act, hook):
            got[layer] = act

        return hook

    def write(layer):
        def hook(act, hook):
            const = clean[tc.output_hook(layer)] - tc.skip(xs[layer], layer)
            return tc.skip(got[layer], layer) + const + change[layer]

        return hook

    def final(act, hook):
        got["final"] = act

    hooks = [(n, frozen(n)) for n in dict.fromkeys(names) if n.endswith(_FROZEN)]
    for layer in range(tc.n_layers):
        hooks += [(tc.input_hook(layer), read(layer)), (tc.output_hook(layer), write(layer))]
    hooks.append(("unembed.hook_in", final))
    forward(model, tokens[None], hooks)
    pre = torch.stack([tc.pre_activations(got[lay][0], lay) for lay in range(tc.n_layers)])
    W_U = model.W_U.detach().to(dtype)
    return FrozenRun(pre_activations=pre, logits=got["final"][0, -1] @ W_U)
