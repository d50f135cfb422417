"""Build a random Gemma-2-2B-shaped checkpoint with a per-layer ReLU transcoder on every layer,
offline (issue 38's GPU bench)::

    python benchmarks/make_gemma_bench.py OUT [--scale 1] [--device auto] [--seed 2025]

At ``--scale 1``: 26 layers, d_model 2,304, 8 query heads sharing 4 key/value heads, d_head
256, d_mlp 9,216, vocabulary 256,000, bf16 weights (2.6B parameters, ~5.2 GB), with Gemma 2's
config (attention logits softcapped at 50, final logits at 30, sliding window 4,096 on every
other layer, post-attention and post-MLP norms), written by transformers' ``Gemma2ForCausalLM``
with ``save_pretrained`` into OUT/model, with a 400-token byte-level BPE tokenizer
(tests/checkpoints.py's ``make_tokenizer``; BOS = EOS = id 0; ids past 400 are never produced by
the tokenizer but are real rows of the embedding). OUT/transcoders is a circuit-tracer folder
(config.yaml + layer_{l}.safetensors, W_enc/W_dec [16,384, 2,304], b_enc, b_dec; bf16, ~3.9 GB)
reading mlp.hook_in and writing mlp.hook_out.

``--scale s`` multiplies every size by s (layers, d_model, d_head, heads, d_mlp, vocabulary,
transcoder width; each with a small floor, heads keeping 2 queries per key/value head), so
``--scale 0.01`` builds in seconds on a CPU. Encoder rows are N(0, 1/d_model); b_enc[f] is
minus the 99th percentile of feature f's pre-activation over the MLP inputs of CAL_SEQS random
sequences (position 0 left out), as the GPT-2 bench in the shared gpu-graph-bench does, so each
feature fires on ~1% of positions. Decoders are N(0, DEC_STD^2), b_dec = 0. Draws are seeded
on the CPU (the same weights on any device; b_enc may differ in its last bits). Writes
OUT/build_stats.json (sizes, seconds, each layer's measured density).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
GEMMA_2_2B = {  # google/gemma-2-2b's config.json
    "n_layers": 26,
    "d_model": 2304,
    "n_heads": 8,
    "n_kv_heads": 4,
    "d_head": 256,
    "d_mlp": 9216,
    "d_vocab": 256000,
    "sliding_window": 4096,
}
D_TC = 16384
DENSITY = 0.01  # share of positions each feature fires on
CAL_SEQS, CAL_LEN = 32, 65
DEC_STD = 0.01
TOKENIZER_VOCAB = 400
TC_NAME = "gemma-bench-plt"

__all__ = ["sizes", "build"]


def sizes(scale: float) -> dict:
    """Every size of the bench at ``scale`` (1: Gemma-2-2B's)."""
    if not 0 < scale <= 1:
        raise ValueError(f"--scale must be in (0, 1], got {scale}")
    g = GEMMA_2_2B

    def s(n: int, floor: int, multiple: int = 1) -> int:
        return max(floor, multiple * round(n * scale / multiple))

    n_kv = s(g["n_kv_heads"], 1)
    return {
        "n_layers": s(g["n_layers"], 2),
        "d_model": s(g["d_model"], 16, multiple=8),  # a multiple of the heads (config check)
        "n_heads": 2 * n_kv,
        "n_kv_heads": n_kv,
        "d_head": s(g["d_head"], 4, multiple=2),  # rotary pairs: even
        "d_mlp": s(g["d_mlp"], 32),
        "d_vocab": s(g["d_vocab"], TOKENIZER_VOCAB),
        "sliding_window": s(g["sliding_window"], 8),
        "d_tc": s(D_TC, 64),
    }


def _model(sz: dict, n_ctx: int):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=sz["d_vocab"],
        hidden_size=sz["d_model"],
        intermediate_size=sz["d_mlp"],
        num_hidden_layers=sz["n_layers"],
        num_attention_heads=sz["n_heads"],
        num_key_value_heads=sz["n_kv_heads"],
        head_dim=sz["d_head"],
        query_pre_attn_scalar=sz["d_head"],
        max_position_embeddings=n_ctx,
        sliding_window=sz["sliding_window"],
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        hidden_activation="gelu_pytorch_tanh",
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
    )
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # 2.6B parameters: never a float32 copy
    try:
        return Gemma2ForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)


def _mlp_inputs(model, sz: dict, device: str, seed: int) -> list[torch.Tensor]:
    """Each layer's MLP input (after pre_feedforward_layernorm) on random sequences."""
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(1, sz["d_vocab"], (CAL_SEQS, CAL_LEN), generator=g)
    ids[:, 0] = 0
    got: list[list[torch.Tensor]] = [[] for _ in model.model.layers]

    def keep(n: int, x: torch.Tensor) -> None:
        got[n].append(x[:, 1:].reshape(-1, sz["d_model"]).float())

    hooks = [
        layer.mlp.register_forward_hook(lambda m, i, o, n=n: keep(n, i[0].detach()))
        for n, layer in enumerate(model.model.layers)
    ]
    try:
        with torch.no_grad():
            for chunk in ids.to(device).split(8):
                model.model(chunk)  # the body only: no [seq, vocab] logits
    finally:
        for h in hooks:
            h.remove()
    return [torch.cat(xs) for xs in got]


def build(out: Path, scale: float = 1.0, *, device: str = "auto", seed: int = 2025,
          n_ctx: int = 8192, density: float = DENSITY) -> dict:  # fmt: skip
    """Write the bench into ``out`` (model/ and transcoders/) and return its build stats;
    each feature fires on a ``density`` share of the calibration positions."""
    if not 0 < density < 1:
        raise ValueError(f"--density must be in (0, 1), got {density}")
    import yaml
    from safetensors.torch import save_file

    sys.path.insert(0, str(ROOT))
    from tests.checkpoints import make_tokenizer

    start = time.perf_counter()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    sz = sizes(scale)
    out = Path(out)
    model_dir, tc_dir = out / "model", out / "transcoders"
    model_dir.mkdir(parents=True, exist_ok=True)
    tc_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = _model(sz, n_ctx)
    make_tokenizer(TOKENIZER_VOCAB).save_pretrained(model_dir)
    model.save_pretrained(model_dir)
    n_params = sum(p.numel() for p in model.parameters())
    model.to(device)
    inputs = _mlp_inputs(model, sz, device, seed)
    del model
    gen = torch.Generator().manual_seed(seed + 2)
    d, f = sz["d_model"], sz["d_tc"]
    layers = []
    for layer, x in enumerate(inputs):
        W_enc = torch.randn(f, d, generator=gen) / math.sqrt(d)
        pre = x @ W_enc.to(device).T  # [cal positions, d_tc]
        b_enc = -torch.quantile(pre, 1 - density, dim=0)  # that share above 0
        density = float((pre + b_enc > 0).float().mean())
        W_dec = torch.randn(f, d, generator=gen) * DEC_STD
        tensors = {"W_enc": W_enc, "W_dec": W_dec, "b_enc": b_enc.cpu(), "b_dec": torch.zeros(d)}
        tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}
        save_file(tensors, str(tc_dir / f"layer_{layer}.safetensors"))
        layers.append({"layer": layer, "density": round(density, 5)})
        del pre
    config = {"model_kind": "transcoder_set", "feature_input_hook": "mlp.hook_in",
              "feature_output_hook": "mlp.hook_out", "scan": TC_NAME}  # fmt: skip
    (tc_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    stats = {"scale": scale, "density": density, "sizes": sz, "n_params": n_params,
             "device": device, "seed": seed,
             "seconds": round(time.perf_counter() - start, 1), "layers": layers}  # fmt: skip
    (out / "build_stats.json").write_text(json.dumps(stats, indent=1))
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--device", default="auto", help="where the calibration runs (auto: cuda)")
    ap.add_argument("--seed", type=int, default=2025)
    ap.add_argument("--n-ctx", type=int, default=8192, help="max_position_embeddings")
    ap.add_argument(
        "--density", type=float, default=DENSITY, help="share of positions a feature fires on"
    )
    a = ap.parse_args(argv)
    stats = build(a.out, a.scale, device=a.device, seed=a.seed, n_ctx=a.n_ctx, density=a.density)
    mean = sum(x["density"] for x in stats["layers"]) / len(stats["layers"])
    print(
        f"gemma bench ({stats['n_params'] / 1e9:.3f}B parameters, {stats['sizes']}) built on "
        f"{stats['device']} in {stats['seconds']} s; mean feature density {mean:.4f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
