"""A QK layer's queries and keys as its score multiplies them: after rotary where the model has
it. TransformerLens 4.3's bridges run ``hook_rot_q``/``hook_rot_k`` on most rotary models, none
on GPT-NeoX (rotary applied here from its ``hook_cos`` and ``hook_sin``) and GPT-J (applied
here from its definition)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["QK_SITES", "queries_keys"]

# recorded at the QK layer: the queries and keys before and after rotary, rotary's cos and sin
QK_SITES = ("hook_q", "hook_k", "hook_rot_q", "hook_rot_k", "hook_cos", "hook_sin")


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def queries_keys(model, layer: int, seen: dict) -> dict:
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
    gptj = "GPTJ" in str(getattr(model.cfg, "architecture", ""))
    if rotary and gptj and {"hook_q", "hook_k"} <= seen.keys():
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
