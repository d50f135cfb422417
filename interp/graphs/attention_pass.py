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

from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.engine import run_cached
from interp.engine.plan import MemoryBudgetError
from interp.foundation.sizes import parse_size
from interp.graphs.frozen import FINAL_HOOK, frozen_hooks, run_frozen
from interp.graphs.nodes import Sources, read_sources
from interp.graphs.norm_path import norm_paths
from interp.graphs.value_path import Scope, ValuePath, value_path_weights

__all__ = [
    "AttentionPass",
    "attention_pass",
    "contract",
    "fit_rows",
    "graph_columns",
    "sources_of",
]

# recorded at the QK layer: the queries and keys before and after rotary, rotary's cos and sin
QK_SITES = ("hook_q", "hook_k", "hook_rot_q", "hook_rot_k", "hook_cos", "hook_sin")


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


def pass_bytes(model, n_pos: int, rows: int) -> int:
    """Bytes one frozen pass of ``rows`` rows retains (float32), counted as
    :func:`interp.graphs.attribute.estimate_graph_bytes` counts the graph's."""
    cfg = model.cfg
    per_row_layer = 10 * n_pos * cfg.d_model + 2 * cfg.n_heads * n_pos * n_pos
    return rows * 4 * (cfg.n_layers * per_row_layer + n_pos * cfg.d_vocab)


def fit_rows(
    model, n_pos: int, rows: int, *, passes: int, held: int, max_bytes: int | str | None, what: str
) -> int:
    """``rows`` halved until ``passes`` frozen passes and ``held`` bytes fit ``max_bytes``
    (None: no budget); a budget that one row per pass does not fit is refused, saying what
    it needs."""
    if max_bytes is None:
        return rows
    budget = parse_size(max_bytes)
    need = passes * pass_bytes(model, n_pos, 1) + held
    if need > budget:
        raise MemoryBudgetError(
            f"{what} needs at least {need} bytes ({passes} frozen pass(es) of one row over "
            f"{n_pos} positions and {held} bytes of results); raise max_bytes to {need}"
        )
    while rows > 1 and passes * pass_bytes(model, n_pos, rows) + held > budget:
        rows //= 2
    return rows


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
    return _attention_pass(model, tokens, tc, rows, open_attention, qk_layer, None)


def _attention_pass(model, tokens, tc, rows, open_attention, qk_layer, norms) -> AttentionPass:
    n_layers = tc.n_layers
    paths = _paths(model, n_layers)
    keep: dict = {}
    # q, k and patterns detached: frozen
    hooks = frozen_hooks(model, tc, keep, None, Scope(), norms)
    if qk_layer is not None:
        attn = f"blocks.{qk_layer}.attn"
        # the bridge's own projections (and rotary) from the layer's input to its q and k
        hooks = [h for h in hooks if h[0] not in (f"{attn}.hook_q", f"{attn}.hook_k")]
    dtype = next(model.parameters()).dtype
    n_pos = len(tokens)
    xs: list = [None] * n_layers
    # filled by hook_pattern, which some bridges fire after hook_out (OPT, GPT-J): the value
    # path's backward reads it from here, after the pass
    recorded: list[dict] = [{} for _ in range(n_layers)]
    deltas = [
        torch.zeros(
            rows, n_pos, model.cfg.d_model, dtype=dtype, device=tokens.device
        ).requires_grad_(True)
        for _ in range(n_layers)
    ]
    qk: dict = {}

    def enter(layer: int):
        def hook(act: Tensor, hook) -> Tensor:
            xs[layer] = act
            return act if layer == qk_layer else act.detach()

        return hook

    def pattern(layer: int):
        def hook(act: Tensor, hook) -> Tensor:
            recorded[layer]["pattern"] = act[:1].detach()  # every row is the same prompt
            return act.detach()

        return hook

    def leave(layer: int):
        def hook(act: Tensor, hook) -> Tensor:
            recorded[layer]["x"], recorded[layer]["out"] = xs[layer][:1].detach(), act[:1].detach()
            out = act.detach()
            if open_attention:
                out = paths[layer].apply(act, xs[layer], recorded[layer], Scope())
            return out + deltas[layer].to(act.dtype)

        return hook

    def record(key: str):
        def hook(act: Tensor, hook) -> None:
            qk[key] = act

        return hook

    for layer in range(n_layers):
        attn = f"blocks.{layer}.attn"
        hooks += [
            (f"{attn}.hook_in", enter(layer)),
            (f"{attn}.hook_pattern", pattern(layer)),
            (f"{attn}.hook_out", leave(layer)),
        ]
    if qk_layer is not None:
        for site in QK_SITES:
            name = f"blocks.{qk_layer}.attn.{site}"
            if name in model.hook_dict:
                hooks.append((name, record(site)))
    batch = tokens[None].expand(rows, -1)
    run_frozen(model, batch, hooks)  # stops at the final norm's output (no logits)
    if qk_layer is not None:
        qk = _queries_keys(model, qk_layer, qk)
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


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _queries_keys(model, layer: int, seen: dict) -> dict:
    """``{"q", "k"}``: layer ``layer``'s queries and keys as the score multiplies them, after
    rotary where the model has it. Where the bridge runs no ``hook_rot_q`` (GPT-NeoX), rotary
    is applied here from its ``hook_cos`` and ``hook_sin`` (the first ``cos.shape[-1]``
    dimensions of each head, halves rotated: GPT-NeoX's layout); the pattern check in
    :mod:`interp.graphs.qk` refuses a model laid out otherwise."""
    rotary = getattr(model.cfg, "positional_embedding_type", "") == "rotary"
    if not rotary and {"hook_q", "hook_k"} <= seen.keys():
        return {"q": seen["hook_q"], "k": seen["hook_k"]}
    if {"hook_rot_q", "hook_rot_k"} <= seen.keys():
        return {"q": seen["hook_rot_q"], "k": seen["hook_rot_k"]}
    if rotary and {"hook_q", "hook_k", "hook_cos", "hook_sin"} <= seen.keys():
        cos, sin = seen["hook_cos"].detach(), seen["hook_sin"].detach()  # [1 pos rot]
        cos, sin = cos[:, :, None], sin[:, :, None]  # over heads
        n_rot = cos.shape[-1]
        out = {}
        for key in ("q", "k"):
            x = seen[f"hook_{key}"]  # [rows pos head d_head]
            turned = x[..., :n_rot] * cos.to(x.dtype) + _rotate_half(x[..., :n_rot]) * sin.to(
                x.dtype
            )
            out[key] = torch.cat([turned, x[..., n_rot:]], dim=-1)
        return out
    if (
        rotary
        and "GPTJ" in str(getattr(model.cfg, "architecture", ""))
        and {
            "hook_q",
            "hook_k",
        }
        <= seen.keys()
    ):
        return {key: _gptj_rotary(model, seen[f"hook_{key}"]) for key in ("q", "k")}
    raise NotImplementedError(
        f"{type(model).__name__}: its bridge ran none of {sorted(QK_SITES)} that give layer "
        f"{layer}'s queries and keys after rotary (it ran {sorted(seen)}); QK attribution is "
        "not implemented for this model"
    )


def _gptj_rotary(model, x: Tensor) -> Tensor:
    """GPT-J's rotary on ``x`` ``[rows pos head d_head]`` (TransformerLens 4.3's bridge runs no
    rotary hook there): the first ``rotary_dim`` dimensions turned in adjacent pairs by the
    angles ``pos / rotary_base ** (2i / rotary_dim)``, as transformers' GPT-J does."""
    n_rot, base = int(model.cfg.rotary_dim), float(getattr(model.cfg, "rotary_base", 10000))
    n_pos = x.shape[1]
    inv = 1.0 / base ** (torch.arange(0, n_rot, 2, dtype=torch.float64) / n_rot)
    angle = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv  # [pos rot/2]
    sin = angle.sin().repeat_interleave(2, -1)[None, :, None].to(x.dtype).to(x.device)
    cos = angle.cos().repeat_interleave(2, -1)[None, :, None].to(x.dtype).to(x.device)
    turn = x[..., :n_rot]
    pairs = torch.stack((-turn[..., 1::2], turn[..., ::2]), dim=-1).flatten(-2)
    return torch.cat([turn * cos + pairs * sin, x[..., n_rot:]], dim=-1)


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
        vecs, cols = src.writers[j]  # [pos slot d_model], [pos slot]
        if vecs.shape[1]:
            scores = torch.bmm(g.transpose(0, 1), vecs.transpose(1, 2))  # [pos rows slot]
            valid = cols >= 0
            out[:, cols[valid]] += scores.permute(1, 0, 2)[:, valid]
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
