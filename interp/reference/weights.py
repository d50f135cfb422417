"""Read GPT-2 weights, from a hooked model or a checkpoint directory, in the reference's layout.

Both readers return ``(config, weights)`` where ``weights`` maps the reference's own parameter
names (``blocks.0.attn.W_Q`` ...) to tensors already in the reference's shapes; the model's
``load_weights`` then checks every shape as it copies.

Layouts. The reference (like TransformerLens) keeps one matrix per head:
``W_Q/W_K/W_V [head d_model d_head]``, ``W_O [head d_head d_model]``. A transformers GPT-2
checkpoint stores ``Conv1D`` weights as ``[in, out]`` and fuses the three input projections
into ``c_attn.weight [d_model, 3 * d_model]``: columns ``[0, d_model)`` are the queries of
all heads, head ``h`` in columns ``[h * d_head, (h + 1) * d_head)``, then the keys, then the
values.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import einops
import torch
from torch import Tensor

from interp.reference.config import (
    GELU_TANH_NAMES,
    ReferenceConfig,
    UnsupportedArchitectureError,
    refusal_message,
)

__all__ = ["check_hooked_is_gpt2", "hooked_weights", "pretrained_dir_weights"]

# causal-mask buffers some older GPT-2 checkpoints saved beside the weights; not parameters
_MASK_BUFFER = re.compile(r"h\.\d+\.attn\.(masked_)?bias")


def check_hooked_is_gpt2(bridge) -> None:
    """Raise :class:`UnsupportedArchitectureError` unless ``bridge`` is a GPT-2."""
    cfg = bridge.cfg
    arch = getattr(cfg, "architecture", None) or getattr(cfg, "original_architecture", None)
    problems = []
    pos = getattr(cfg, "positional_embedding_type", None)
    if pos != "standard":
        problems.append(f"its positions are {pos!r}, not learned absolute embeddings ('standard')")
    if getattr(cfg, "normalization_type", None) not in ("LN", "LNPre"):
        problems.append(f"its normalisation is {cfg.normalization_type!r}, not LayerNorm")
    if getattr(cfg, "act_fn", None) not in GELU_TANH_NAMES:
        problems.append(f"its MLP activation is {cfg.act_fn!r}, not GPT-2's 'gelu_new'")
    if getattr(cfg, "attn_only", False):
        problems.append("it has no MLPs (attention-only)")
    if getattr(cfg, "parallel_attn_mlp", False):
        problems.append("it runs attention and MLP in parallel")
    if not getattr(cfg, "use_attn_scale", True):
        problems.append("it does not scale attention scores by 1/sqrt(d_head)")
    if arch != "GPT2LMHeadModel":
        problems.append(f"its architecture is {arch!r}, not 'GPT2LMHeadModel'")
    if problems:
        raise UnsupportedArchitectureError(refusal_message(f"this model ({arch})", problems))
    hf_config = getattr(getattr(bridge, "original_model", None), "config", None)
    if hf_config is not None:  # settings the bridge's cfg does not carry (layer-wise scaling)
        ReferenceConfig.from_hf_config(hf_config.to_dict(), what=f"this model ({arch})")


def _ln_weights(ln, d_model: int) -> tuple[Tensor, Tensor]:
    # a LayerNorm folded into the next layer (LNPre) has no weight or bias: it is (1, 0)
    weight = getattr(ln, "weight", None)
    bias = getattr(ln, "bias", None)
    weight = torch.ones(d_model) if weight is None else weight
    bias = torch.zeros(d_model) if bias is None else bias
    return weight, bias


def hooked_weights(bridge) -> tuple[ReferenceConfig, dict[str, Tensor]]:
    """The config and weights of a GPT-2 ``TransformerBridge``, detached copies."""
    check_hooked_is_gpt2(bridge)
    c = bridge.cfg
    config = ReferenceConfig(
        d_model=c.d_model,
        n_heads=c.n_heads,
        d_head=c.d_head,
        d_mlp=c.d_mlp,
        n_layers=c.n_layers,
        n_ctx=c.n_ctx,
        d_vocab=c.d_vocab,
        eps=float(c.eps),
    )
    # the bridge stacks per-layer weights on first access; read each stack once
    stacked = {
        name: getattr(bridge, name)
        for name in (
            "W_Q",
            "W_K",
            "W_V",
            "W_O",
            "b_Q",
            "b_K",
            "b_V",
            "b_O",
            "W_in",
            "b_in",
            "W_out",
            "b_out",
        )
    }
    weights = {
        "embed.W_E": bridge.W_E,
        "pos_embed.W_pos": bridge.W_pos,
        "unembed.W_U": bridge.W_U,
        "unembed.b_U": bridge.b_U,
    }
    for layer in range(config.n_layers):
        block = bridge.blocks[layer]
        for ln in ("ln1", "ln2"):
            w, b = _ln_weights(getattr(block, ln), config.d_model)
            weights[f"blocks.{layer}.{ln}.w"], weights[f"blocks.{layer}.{ln}.b"] = w, b
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            weights[f"blocks.{layer}.attn.{name}"] = stacked[name][layer]
        for name in ("W_in", "b_in", "W_out", "b_out"):
            weights[f"blocks.{layer}.mlp.{name}"] = stacked[name][layer]
    weights["ln_final.w"], weights["ln_final.b"] = _ln_weights(bridge.ln_final, config.d_model)
    return config, {name: t.detach().clone() for name, t in weights.items()}


def _read_safetensors(directory: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    single = directory / "model.safetensors"
    if single.is_file():
        return load_file(single)
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(load_file(directory / shard))
        return state
    raise FileNotFoundError(
        f"{directory} has no model.safetensors (or sharded index); the "
        "reference reads safetensors only. Write them with "
        "model.save_pretrained(directory, safe_serialization=True)."
    )


def pretrained_dir_weights(path: str | Path) -> tuple[ReferenceConfig, dict[str, Tensor]]:
    """The config and weights of a transformers GPT-2 checkpoint directory (no model built)."""
    directory = Path(path)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"{directory} has no config.json; pass a directory written by save_pretrained"
        )
    hf_config = json.loads(config_file.read_text())
    config = ReferenceConfig.from_hf_config(hf_config, what=f"the checkpoint in {directory}")
    # GPT2LMHeadModel saves under 'transformer.'; a bare GPT2Model (the hub's gpt2) does not
    state = {k.removeprefix("transformer."): v for k, v in _read_safetensors(directory).items()}
    state = {k: v for k, v in state.items() if not _MASK_BUFFER.fullmatch(k)}
    used: set[str] = set()

    def take(key: str) -> Tensor:
        if key not in state:
            raise KeyError(
                f"the checkpoint in {directory} has no weight {key!r}; is it a "
                "complete GPT-2 checkpoint?"
            )
        used.add(key)
        return state[key]

    d_model, n_heads = config.d_model, config.n_heads
    weights = {"embed.W_E": take("wte.weight"), "pos_embed.W_pos": take("wpe.weight")}
    for layer in range(config.n_layers):
        h, out = f"h.{layer}.", f"blocks.{layer}."
        for hf_ln, ln in (("ln_1", "ln1"), ("ln_2", "ln2")):
            weights[out + ln + ".w"] = take(h + hf_ln + ".weight")
            weights[out + ln + ".b"] = take(h + hf_ln + ".bias")
        qkv_w = take(h + "attn.c_attn.weight").split(d_model, dim=1)  # 3 x [d_model, d_model]
        qkv_b = take(h + "attn.c_attn.bias").split(d_model, dim=0)  # 3 x [d_model]
        for name, w, b in zip("QKV", qkv_w, qkv_b, strict=True):
            weights[out + f"attn.W_{name}"] = einops.rearrange(
                w, "d_model (head d_head) -> head d_model d_head", head=n_heads
            )
            weights[out + f"attn.b_{name}"] = einops.rearrange(
                b, "(head d_head) -> head d_head", head=n_heads
            )
        weights[out + "attn.W_O"] = einops.rearrange(
            take(h + "attn.c_proj.weight"),
            "(head d_head) d_model -> head d_head d_model",
            head=n_heads,
        )
        weights[out + "attn.b_O"] = take(h + "attn.c_proj.bias")
        weights[out + "mlp.W_in"] = take(h + "mlp.c_fc.weight")  # Conv1D [in, out] already
        weights[out + "mlp.b_in"] = take(h + "mlp.c_fc.bias")
        weights[out + "mlp.W_out"] = take(h + "mlp.c_proj.weight")
        weights[out + "mlp.b_out"] = take(h + "mlp.c_proj.bias")
    weights["ln_final.w"], weights["ln_final.b"] = take("ln_f.weight"), take("ln_f.bias")
    if hf_config.get("tie_word_embeddings", True):
        weights["unembed.W_U"] = weights["embed.W_E"].T  # GPT-2 unembeds with W_E itself
        used.add("lm_head.weight")  # a saved copy of the tied matrix, if present
    else:
        weights["unembed.W_U"] = take("lm_head.weight").T  # nn.Linear [out, in]
    weights["unembed.b_U"] = torch.zeros(config.d_vocab)  # GPT-2's unembedding has no bias
    unexpected = sorted(set(state) - used)
    if unexpected:
        raise UnsupportedArchitectureError(
            refusal_message(
                f"the checkpoint in {directory}",
                [f"it has weights a GPT-2 language model does not: {', '.join(unexpected[:5])}"],
            )
        )
    return config, {name: t.detach().clone() for name, t in weights.items()}
