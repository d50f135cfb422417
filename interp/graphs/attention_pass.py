"""Frozen passes for the attention decompositions (head loadings, QK attribution): the local
replacement model of :mod:`interp.graphs.frozen` with each attention layer's value path under
this module's control, and the sources' output vectors to contract its gradients with.

:func:`attention_pass` runs the prompt over ``rows`` rows through the frozen model with, at
every attention layer ``l``:

- ``xs[l]``: the attention's input (``attn.hook_in``, the norm's output) as a graph tensor, where
  a backward pass can start from inside the model;
- ``deltas[l]``: a zero leaf added to the attention's output (``attn.hook_out``, before any
  post-norm), whose gradient is the target's gradient at that output;
- the value path (:class:`interp.graphs.value_path.ValuePath`, the same map the graph's own
  pass uses) open, or closed when ``open_attention`` is False: then no gradient crosses any
  attention layer and a backward pass follows only the paths that stay at one position;
- for QK attribution, ``qk_layer``: that layer's queries and keys left attached to ``xs[l]``
  (the bridge's own projections and rotary differentiate them), recorded in ``qk``.

The sources (:class:`interp.graphs.nodes.Sources`, every active feature, error and token) and
:func:`contract` turn the gradients at the MLP outputs and the embeddings into one value per
source; :func:`graph_columns` maps a graph's nodes onto those columns.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.engine import run_cached
from interp.graphs.frozen import FINAL_HOOK, frozen_hooks, run_frozen
from interp.graphs.nodes import Sources, read_sources
from interp.graphs.norm_path import norm_paths
from interp.graphs.rotary import QK_SITES, queries_keys
from interp.graphs.value_path import Scope, ValuePath, value_path_weights

__all__ = [
    "AttentionPass",
    "attention_pass",
    "contract",
    "graph_columns",
    "sources_of",
]


@dataclass
class AttentionPass:
    """The tensors of one pass (module docstring); ``inputs``, ``outputs``, ``embed``, ``final``
    as in :class:`interp.graphs.frozen.FrozenPass`, ``patterns[l]`` ``[head q_pos k_pos]``."""

    inputs: list[Tensor]
    outputs: list[Tensor]
    embed: Tensor
    final: Tensor
    xs: list[Tensor]
    deltas: list[Tensor]
    patterns: list[Tensor]
    paths: list[ValuePath]
    qk: dict = field(default_factory=dict)  # "q", "k": [rows pos head d_head] graph tensors


def _paths(model, n_layers: int) -> list[ValuePath]:
    paths = value_path_weights(model, n_layers)
    if paths is None:
        raise NotImplementedError(
            f"{type(model).__name__}: its attention weights (W_V, W_O) cannot be read per head, "
            "so an edge cannot be split over heads; no other way is implemented"
        )
    return paths


def attention_pass(
    model,
    tokens: Int[Tensor, " pos"],
    tc,
    rows: int,
    *,
    open_attention: bool = True,
    qk_layer: int | None = None,
) -> AttentionPass:
    """One frozen pass of ``tokens`` over ``rows`` rows (module docstring); call inside
    :func:`interp.graphs.frozen.no_param_grads`."""
    busy = {FINAL_HOOK}
    for layer in range(tc.n_layers):
        busy |= {tc.input_hook(layer), tc.output_hook(layer)}
    # the norms through their frozen maps, as the graph's own pass has them where they
    # reproduce the bridge (the same rounding); else the bridge's, their scales detached
    norms = norm_paths(model, busy)
    if norms:
        fp = _attention_pass(model, tokens, tc, rows, open_attention, qk_layer, norms)
        if all(path.check() for path in norms.values()):
            return fp
        del fp  # not held while the pass runs again
    return _attention_pass(model, tokens, tc, rows, open_attention, qk_layer, None)


def _attention_pass(model, tokens, tc, rows, open_attention, qk_layer, norms) -> AttentionPass:
    n_layers = tc.n_layers
    paths = _paths(model, n_layers)
    keep: dict = {}
    hooks = frozen_hooks(model, tc, keep, None, Scope(), norms)  # q, k, patterns detached
    if qk_layer is not None:
        attn = f"blocks.{qk_layer}.attn"
        # the bridge's own projections (and rotary) from the layer's input to its q and k
        hooks = [h for h in hooks if h[0] not in (f"{attn}.hook_q", f"{attn}.hook_k")]
    dtype = next(model.parameters()).dtype
    xs: list = [None] * n_layers
    # filled by hook_pattern, which some bridges fire after hook_out (OPT, GPT-J): the value
    # path's backward reads it from here, after the pass
    recorded: list[dict] = [{} for _ in range(n_layers)]
    shape = (rows, len(tokens), model.cfg.d_model)
    deltas = [
        torch.zeros(shape, dtype=dtype, device=tokens.device).requires_grad_(True)
        for _ in range(n_layers)
    ]
    qk: dict = {}
    for layer in range(n_layers):
        hooks += _layer_hooks(layer, xs, recorded[layer], deltas[layer], paths[layer],
                              open_attention, layer == qk_layer)  # fmt: skip
    if qk_layer is not None:
        for site in QK_SITES:
            name = f"blocks.{qk_layer}.attn.{site}"
            if name in model.hook_dict:
                hooks.append((name, functools.partial(_record, qk, site)))
    run_frozen(model, tokens[None].expand(rows, -1), hooks)  # to the final norm's output
    if qk_layer is not None:
        qk = queries_keys(model, qk_layer, qk)
    wrong = [
        layer
        for layer, seen in enumerate(recorded)
        if not paths[layer].check(seen["x"], seen["pattern"], seen["out"])
    ]
    if wrong:  # the graph's own pass falls back there; these decompositions have no fallback
        raise NotImplementedError(
            f"{type(model).__name__}: W_V and W_O do not reproduce the attention output of "
            f"layers {wrong}, so edges cannot be split over its heads"
        )
    patterns = [seen["pattern"][0] for seen in recorded]
    return AttentionPass(
        keep["inputs"], keep["outputs"], keep["embed"], keep["final"], xs, deltas, patterns,
        paths, qk,
    )  # fmt: skip


def _record(qk: dict, key: str, act: Tensor, hook) -> None:
    qk[key] = act


def _layer_hooks(
    layer: int, xs: list, seen: dict, delta: Tensor, path: ValuePath, open_: bool, qk: bool
) -> list:
    """Layer ``layer``'s attention: its input kept in ``xs`` (attached at the QK layer), its
    pattern, input and output's first row in ``seen`` (for :meth:`ValuePath.check`), ``delta``
    added to its output and the value path open there when ``open_``."""

    def enter(act: Tensor, hook) -> Tensor:
        xs[layer] = act
        return act if qk else act.detach()

    def pattern(act: Tensor, hook) -> Tensor:
        seen["pattern"] = act[:1].detach().clone()  # every row is the same prompt
        return act.detach()

    def leave(act: Tensor, hook) -> Tensor:
        seen["x"], seen["out"] = xs[layer][:1].detach().clone(), act[:1].detach().clone()
        out = path.apply(act, xs[layer], seen, Scope()) if open_ else act.detach()
        return out + delta.to(act.dtype)

    attn = f"blocks.{layer}.attn"
    return [(f"{attn}.hook_in", enter), (f"{attn}.hook_pattern", pattern),
            (f"{attn}.hook_out", leave)]  # fmt: skip


def sources_of(model, tc, tokens: Int[Tensor, " pos"], dtype: torch.dtype) -> Sources:
    """Every active feature, error and token of the prompt (what the graph's columns are)."""
    names = [tc.input_hook(lay) for lay in range(tc.n_layers)]
    names += [tc.output_hook(lay) for lay in range(tc.n_layers)] + ["hook_embed"]
    clean = run_cached(model, tokens[None], hooks=names)
    return read_sources(model, tc, clean, dtype)


def contract(
    src: Sources, outputs: list[Tensor | None], embed: Tensor | None
) -> Float[Tensor, "rows col"]:
    """Gradients at each MLP output (``outputs[j]`` ``[rows pos d_model]``, None: zero) and at
    the embeddings, contracted with every source's output vector: one value per source."""
    first = next(t for t in [*outputs, embed] if t is not None)
    rows, n_pos, _ = first.shape
    work = src.embed.dtype
    out = torch.zeros(rows, src.n_cols, dtype=work, device=first.device)
    for j, g in enumerate(outputs):
        if g is None:
            continue
        g = g.to(work)
        src.add_writer_scores(out, j, g)  # its writers' columns, block by block
        start = src.n_features + j * (n_pos - 1)
        out[:, start : start + n_pos - 1] = torch.einsum("bpd,pd->bp", g[:, 1:], src.errors[j])
    if embed is not None:
        out[:, src.token_start :] = torch.einsum("bpd,pd->bp", embed.to(work), src.embed)
    return out


def graph_columns(src: Sources, nodes, n_pos: int) -> Int[Tensor, " node"]:
    """Each graph node's column among ``src``'s (-1 for a logit, which is no source)."""
    cols = np.full(len(nodes), -1, dtype=np.int64)
    feats = {
        (int(a), int(b), int(c)): i
        for i, (a, b, c) in enumerate(
            zip(
                src.feat_layer.tolist(), src.feat_pos.tolist(), src.feat_index.tolist(), strict=True
            )
        )
    }
    kinds, layers = nodes["kind"].to_numpy(), nodes["layer"].to_numpy()
    pos, feature = nodes["pos"].to_numpy(), nodes["feature"].to_numpy()
    for i, kind in enumerate(kinds):
        if kind == "feature":
            key = (int(layers[i]), int(pos[i]), int(feature[i]))
            if key not in feats:
                raise ValueError(f"feature node {key} is not active in this prompt")
            cols[i] = feats[key]
        elif kind == "error":
            cols[i] = src.n_features + int(layers[i]) * (n_pos - 1) + int(pos[i]) - 1
        elif kind == "token":
            cols[i] = src.token_start + int(pos[i])
    return torch.from_numpy(cols)
