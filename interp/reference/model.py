"""A from-scratch GPT-2, one small module per piece, written the way the seed notes derive it.

Read it top to bottom: LayerNorm, the two embeddings, attention, the MLP, the unembedding, a
block (the residual stream), the whole model. Every tensor carries its shape, every einsum
is a named string, and ``run_with_cache`` records the same activations TransformerLens does,
under the same names (``blocks.0.attn.hook_pattern`` ...), so the reference can check the
hooked model and the toolkit's caching, and a learner can check the reference.

Shapes: ``batch pos d_model`` for the residual stream, ``batch pos head d_head`` for queries,
keys, values and ``z``, ``batch head q_pos k_pos`` for scores and patterns.
"""

from __future__ import annotations

import math
from pathlib import Path

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp.reference.config import ReferenceConfig
from interp.reference.weights import hooked_weights, pretrained_dir_weights

__all__ = [
    "Attention",
    "Block",
    "Embed",
    "GPT2",
    "LayerNorm",
    "MLP",
    "PosEmbed",
    "Unembed",
    "gelu_new",
]

Cache = dict[str, Tensor]

# the seed notes' einsums, with this project's dimension names
QKV_EINSUM = "batch pos d_model, head d_model d_head -> batch pos head d_head"
SCORES_EINSUM = "batch q_pos head d_head, batch k_pos head d_head -> batch head q_pos k_pos"
Z_EINSUM = "batch head q_pos k_pos, batch k_pos head d_head -> batch q_pos head d_head"
OUT_EINSUM = "batch pos head d_head, head d_head d_model -> batch pos d_model"
RESULT_EINSUM = "batch pos head d_head, head d_head d_model -> batch pos head d_model"
MLP_IN_EINSUM = "batch pos d_model, d_model d_mlp -> batch pos d_mlp"
MLP_OUT_EINSUM = "batch pos d_mlp, d_mlp d_model -> batch pos d_model"
UNEMBED_EINSUM = "batch pos d_model, d_model d_vocab -> batch pos d_vocab"

INIT_STD = 0.02  # GPT-2's initialiser range, for a model built without loading weights


def _save(cache: Cache | None, name: str, value: Tensor) -> Tensor:
    if cache is not None:
        cache[name] = value.detach()
    return value


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's GELU, tanh approximation: ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


class LayerNorm(nn.Module):
    """Centre, normalise, scale, translate, over ``d_model`` at each position.

    ``y1 = x - mean(x)``; ``scale = sqrt(mean(y1^2) + eps)`` (eps inside the root);
    ``y2 = y1 / scale``; ``out = y2 * w + b``. ``[batch pos d_model] -> [batch pos d_model]``.
    Records ``hook_scale [batch pos 1]``, ``hook_normalized`` (``y2``, before ``w`` and ``b``,
    as TransformerBridge records it) and ``hook_out``.
    """

    def __init__(self, cfg: ReferenceConfig, *, name: str):
        super().__init__()
        self.cfg, self.name = cfg, name
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(
        self, x: Float[Tensor, "batch pos d_model"], cache: Cache | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        centred = x - x.mean(dim=-1, keepdim=True)
        variance = centred.pow(2).mean(dim=-1, keepdim=True)  # biased: divide by d_model
        scale = _save(cache, f"{self.name}.hook_scale", (variance + self.cfg.eps).sqrt())
        normalized = _save(cache, f"{self.name}.hook_normalized", centred / scale)
        return _save(cache, f"{self.name}.hook_out", normalized * self.w + self.b)


class Embed(nn.Module):
    """Token embedding, a lookup table: ``embed[b, p] = W_E[tokens[b, p]]``.

    ``W_E [d_vocab d_model]``; ``[batch pos] -> [batch pos d_model]``. Records ``hook_embed``.
    """

    def __init__(self, cfg: ReferenceConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.randn(cfg.d_vocab, cfg.d_model) * INIT_STD)

    def forward(
        self, tokens: Int[Tensor, "batch pos"], cache: Cache | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        return _save(cache, "hook_embed", self.W_E[tokens])


class PosEmbed(nn.Module):
    """Learned absolute positional embedding: ``pos_embed[b, p] = W_pos[p]``, for every batch row.

    ``W_pos [n_ctx d_model]``; ``[batch pos] -> [batch pos d_model]``. Added to (not
    concatenated with) the token embedding. Records ``hook_pos_embed``.
    """

    def __init__(self, cfg: ReferenceConfig):
        super().__init__()
        self.W_pos = nn.Parameter(torch.randn(cfg.n_ctx, cfg.d_model) * INIT_STD)

    def forward(
        self, tokens: Int[Tensor, "batch pos"], cache: Cache | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        batch, pos = tokens.shape
        pos_embed = einops.repeat(self.W_pos[:pos], "pos d_model -> batch pos d_model", batch=batch)
        return _save(cache, "hook_pos_embed", pos_embed)


class Attention(nn.Module):
    """Causal multi-head attention, in five einsum steps.

    1. ``q = x W_Q + b_Q`` (and ``k``, ``v``): ``[batch pos d_model] -> [batch pos head d_head]``
    2. ``scores = q . k / sqrt(d_head)``: ``[batch head q_pos k_pos]``
    3. mask keys after the query with ``-inf``, then ``pattern = softmax(scores)`` over ``k_pos``
    4. ``z = pattern @ v``, a weighted average of values: ``[batch pos head d_head]``
    5. ``out = sum over heads of z W_O + b_O``: ``[batch pos d_model]``

    Weights per head: ``W_Q/W_K/W_V [head d_model d_head]``, ``W_O [head d_head d_model]``.
    Records ``attn.hook_q|k|v``, ``hook_attn_scores`` (masked entries ``-inf``),
    ``hook_pattern``, ``hook_z`` and ``hook_result`` (each head's ``z W_O``, no ``b_O``).
    """

    def __init__(self, cfg: ReferenceConfig, *, name: str):
        super().__init__()
        self.cfg, self.name = cfg, name
        h, d, dh = cfg.n_heads, cfg.d_model, cfg.d_head
        for qkv in "QKV":
            setattr(self, f"W_{qkv}", nn.Parameter(torch.randn(h, d, dh) * INIT_STD))
            setattr(self, f"b_{qkv}", nn.Parameter(torch.zeros(h, dh)))
        self.W_O = nn.Parameter(torch.randn(h, dh, d) * INIT_STD)
        self.b_O = nn.Parameter(torch.zeros(d))

    def forward(
        self, x: Float[Tensor, "batch pos d_model"], cache: Cache | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        n = self.name
        q = _save(cache, f"{n}.hook_q", einops.einsum(x, self.W_Q, QKV_EINSUM) + self.b_Q)
        k = _save(cache, f"{n}.hook_k", einops.einsum(x, self.W_K, QKV_EINSUM) + self.b_K)
        v = _save(cache, f"{n}.hook_v", einops.einsum(x, self.W_V, QKV_EINSUM) + self.b_V)
        scores = einops.einsum(q, k, SCORES_EINSUM) / math.sqrt(self.cfg.d_head)
        pos = x.shape[1]
        # True above the diagonal: the key comes after the query, which may not look ahead
        future = torch.triu(torch.ones(pos, pos, dtype=torch.bool, device=x.device), diagonal=1)
        scores = _save(cache, f"{n}.hook_attn_scores", scores.masked_fill(future, float("-inf")))
        # every row keeps its diagonal, so no row is all -inf and softmax never gives NaN
        pattern = _save(cache, f"{n}.hook_pattern", scores.softmax(dim=-1))
        z = _save(cache, f"{n}.hook_z", einops.einsum(pattern, v, Z_EINSUM))
        if cache is not None:  # per-head writes, kept only when asked: [batch pos head d_model]
            _save(cache, f"{n}.hook_result", einops.einsum(z, self.W_O, RESULT_EINSUM))
        return einops.einsum(z, self.W_O, OUT_EINSUM) + self.b_O


class MLP(nn.Module):
    """``out = gelu_new(x W_in + b_in) W_out + b_out``: ``[batch pos d_model] -> same``.

    ``W_in [d_model d_mlp]``, ``W_out [d_mlp d_model]``; each hidden unit (neuron) reads one
    direction and writes one. Records ``mlp.hook_pre`` and ``mlp.hook_post`` ``[batch pos d_mlp]``.
    """

    def __init__(self, cfg: ReferenceConfig, *, name: str):
        super().__init__()
        self.name = name
        self.W_in = nn.Parameter(torch.randn(cfg.d_model, cfg.d_mlp) * INIT_STD)
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.randn(cfg.d_mlp, cfg.d_model) * INIT_STD)
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(
        self, x: Float[Tensor, "batch pos d_model"], cache: Cache | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        pre = _save(
            cache, f"{self.name}.hook_pre", einops.einsum(x, self.W_in, MLP_IN_EINSUM) + self.b_in
        )
        post = _save(cache, f"{self.name}.hook_post", gelu_new(pre))
        return einops.einsum(post, self.W_out, MLP_OUT_EINSUM) + self.b_out


class Unembed(nn.Module):
    """Logits from the final residual stream: ``x W_U + b_U``.

    ``W_U [d_model d_vocab]``; ``[batch pos d_model] -> [batch pos d_vocab]``. GPT-2 ties
    ``W_U = W_E^T`` and has ``b_U = 0``; both are kept general here.
    """

    def __init__(self, cfg: ReferenceConfig):
        super().__init__()
        self.W_U = nn.Parameter(torch.randn(cfg.d_model, cfg.d_vocab) * INIT_STD)
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab))

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        return einops.einsum(x, self.W_U, UNEMBED_EINSUM) + self.b_U


class Block(nn.Module):
    """One layer: each sublayer reads a LayerNorm of the residual stream and adds its output.

    ``resid_mid = resid_pre + attn(ln1(resid_pre))``;
    ``resid_post = resid_mid + mlp(ln2(resid_mid))``. All ``[batch pos d_model]``.
    Records ``blocks.L.hook_resid_pre|mid|post`` and ``hook_attn_out|mlp_out``.
    """

    def __init__(self, cfg: ReferenceConfig, *, layer: int):
        super().__init__()
        self.name = name = f"blocks.{layer}"
        self.ln1 = LayerNorm(cfg, name=f"{name}.ln1")
        self.attn = Attention(cfg, name=f"{name}.attn")
        self.ln2 = LayerNorm(cfg, name=f"{name}.ln2")
        self.mlp = MLP(cfg, name=f"{name}.mlp")

    def forward(
        self, resid_pre: Float[Tensor, "batch pos d_model"], cache: Cache | None = None
    ) -> Float[Tensor, "batch pos d_model"]:
        n = self.name
        _save(cache, f"{n}.hook_resid_pre", resid_pre)
        attn_out = _save(cache, f"{n}.hook_attn_out", self.attn(self.ln1(resid_pre, cache), cache))
        resid_mid = _save(cache, f"{n}.hook_resid_mid", resid_pre + attn_out)
        mlp_out = _save(cache, f"{n}.hook_mlp_out", self.mlp(self.ln2(resid_mid, cache), cache))
        return _save(cache, f"{n}.hook_resid_post", resid_mid + mlp_out)


class GPT2(nn.Module):
    """GPT-2: tokens -> embeddings + positions -> blocks -> LayerNorm -> logits.

    ``[batch pos]`` token ids -> ``[batch pos d_vocab]`` logits; ``logits[:, p]`` predicts the
    token after position ``p`` from positions ``0..p`` only. Build with random weights
    (``GPT2(cfg)``), or load them: :meth:`from_hooked`, :meth:`from_pretrained_dir`.
    """

    def __init__(self, cfg: ReferenceConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.pos_embed = PosEmbed(cfg)
        self.blocks = nn.ModuleList([Block(cfg, layer=layer) for layer in range(cfg.n_layers)])
        self.ln_final = LayerNorm(cfg, name="ln_final")
        self.unembed = Unembed(cfg)

    # ---- loading -------------------------------------------------------------------------
    @classmethod
    def from_hooked(cls, bridge, *, dtype: torch.dtype = torch.float32) -> GPT2:
        """Copy the weights of a GPT-2 ``TransformerBridge`` (refuses other architectures).

        A folded bridge works too: its LayerNorm weights read as (1, 0) and the folded
        weights are copied as they are, so the reference reproduces the folded model.
        """
        cfg, weights = hooked_weights(bridge)
        model = cls(cfg).to(dtype=dtype, device=weights["embed.W_E"].device)
        return model.load_weights(weights).eval()

    @classmethod
    def from_pretrained_dir(cls, path: str | Path, *, dtype: torch.dtype = torch.float32) -> GPT2:
        """Read ``config.json`` and safetensors weights of a transformers GPT-2 checkpoint."""
        cfg, weights = pretrained_dir_weights(path)
        return cls(cfg).to(dtype=dtype).load_weights(weights).eval()

    def load_weights(self, weights: dict[str, Tensor]) -> GPT2:
        """Copy ``weights`` (the reference's parameter names) in place, checking every shape."""
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(weights))
        unexpected = sorted(set(weights) - set(params))
        if missing or unexpected:
            raise KeyError(
                f"weights do not fit the reference: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        with torch.no_grad():
            for name, param in params.items():
                source = weights[name]
                if source.shape != param.shape:
                    raise ValueError(
                        f"{name}: the source has shape {tuple(source.shape)}, the "
                        f"reference expects {tuple(param.shape)} ({self.cfg})"
                    )
                param.copy_(source)
        return self

    # ---- running -------------------------------------------------------------------------
    def check_tokens(self, tokens: Tensor) -> Int[Tensor, "batch pos"]:
        """``[pos]`` or ``[batch pos]`` integer ids that fit the vocabulary and the context."""
        if not isinstance(tokens, Tensor):
            tokens = torch.as_tensor(tokens)
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}")
        if tokens.ndim == 1:
            tokens = tokens[None]
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise ValueError(
                f"tokens must be [pos] or [batch, pos] with pos >= 1, got shape "
                f"{tuple(tokens.shape)}"
            )
        if tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(
                f"{tokens.shape[1]} tokens but the context is {self.cfg.n_ctx} "
                "(W_pos has one row per position); pass a shorter prompt"
            )
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= self.cfg.d_vocab:
            raise ValueError(
                f"token ids must lie in [0, {self.cfg.d_vocab - 1}], got values from {lo} to {hi}"
            )
        return tokens.long().to(self.embed.W_E.device)

    def _run(self, tokens: Tensor, cache: Cache | None) -> Float[Tensor, "batch pos d_vocab"]:
        tokens = self.check_tokens(tokens)
        residual = self.embed(tokens, cache) + self.pos_embed(tokens, cache)
        for block in self.blocks:
            residual = block(residual, cache)
        return self.unembed(self.ln_final(residual, cache))

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_vocab"]:
        return self._run(tokens, cache=None)

    @torch.inference_mode()
    def run_with_cache(
        self, tokens: Int[Tensor, "batch pos"]
    ) -> tuple[Float[Tensor, "batch pos d_vocab"], dict[str, Tensor]]:
        """Logits and every recorded activation, under TransformerLens's hook names."""
        cache: Cache = {}
        logits = self._run(tokens, cache)
        return logits, cache

    @torch.inference_mode()
    def generate_greedy(
        self, tokens: Int[Tensor, "batch pos"], n: int
    ) -> Int[Tensor, "batch pos_plus_n"]:
        """Append ``n`` tokens, each the argmax of the last position's logits (no sampling)."""
        tokens = self.check_tokens(tokens)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if tokens.shape[1] + n > self.cfg.n_ctx:
            raise ValueError(
                f"{tokens.shape[1]} tokens + {n} new ones exceed the context of "
                f"{self.cfg.n_ctx}; generate fewer tokens"
            )
        for _ in range(n):
            next_token = self(tokens)[:, -1].argmax(dim=-1)  # [batch]
            tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        return tokens
