"""Measure the induction circuit of a saved checkpoint, loaded through TransformerBridge.

Run:  python experiments/measure_bundled_model.py [CHECKPOINT_DIR] [--seed 0]

Every figure comes from the checkpoint on disk (config, safetensors, tokenizer) as the
toolkit will see it, not from the training process's in-memory model:

- induction score per head and repeat length: mean attention from each position of the
  second copy of ``[BOS] + a + a`` to the token right after the earlier copy of its token;
- previous-token score per head: mean attention to position ``q_pos - 1``;
- loss on the repeated half against the first half, with and without ablating heads
  (zeroing their ``hook_z``, so only the output bias remains);
- K-composition scores of every layer-0 head into every layer-1 head, from the weights,
  against a baseline of random matrices of the same shapes.

The batch builder `repeated_random_tokens` (in `interp.dictionaries.data`) is shared with the
training script and with `interp.train_sae`, so the model is trained, judged and read by SAEs on the
same kind of sequence.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from statistics import fmean as mean

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from interp.dictionaries.data import repeated_random_tokens  # also what train_sae draws

DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[1] / "interp" / "bundled" / "tiny-induction"
REP_LENS = (10, 20, 30, 40, 50, 60)


def head_scores(
    pattern: Float[Tensor, "batch head q_pos k_pos"], rep_len: int, has_bos: bool
) -> tuple[Float[Tensor, " head"], Float[Tensor, " head"]]:
    """Induction and previous-token scores of one layer's heads."""
    start = int(has_bos) + rep_len  # first query position of the second copy
    # offset rep_len-1: the token after the earlier copy of the current token
    induction = pattern.diagonal(offset=-(rep_len - 1), dim1=-2, dim2=-1)
    induction = induction[..., start - (rep_len - 1) :].mean(dim=(0, -1))
    previous = pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, -1))
    return induction, previous


def half_losses(
    logits: Float[Tensor, "batch pos d_vocab"],
    tokens: Int[Tensor, "batch pos"],
    rep_len: int,
    has_bos: bool,
) -> tuple[float, float]:
    """Next-token loss on the first copy and on the repeated copy.

    Both halves score the same rep_len-1 predictions (a[0..L-2] -> a[1..L-1]), so the
    two numbers are comparable; only the second can be helped by induction.
    """
    log_probs = F.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]  # [batch pos-1]
    first = int(has_bos)
    second = first + rep_len
    return (
        nll[:, first : first + rep_len - 1].mean().item(),
        nll[:, second : second + rep_len - 1].mean().item(),
    )


def load_bridge(checkpoint: str | Path):
    """The checkpoint through the same path the toolkit uses, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(str(checkpoint), device="cpu")


def _z_ablation_hooks(heads: list[tuple[int, int]]):
    def make(head: int):
        def hook(z: Float[Tensor, "batch pos head d_head"], hook):
            z = z.clone()
            z[:, :, head] = 0.0
            return z

        return hook

    return [(f"blocks.{layer}.attn.hook_z", make(head)) for layer, head in heads]


@torch.no_grad()
def run_repeated(bridge, tokens, rep_len: int, has_bos: bool, ablate: list[tuple[int, int]] = ()):
    """Scores [layer head] and half losses on one batch, optionally with heads ablated."""
    n_layers = bridge.cfg.n_layers
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers)]
    store: dict[str, Tensor] = {}

    def save(pattern, hook):
        store[hook.name] = pattern.detach()

    hooks = _z_ablation_hooks(list(ablate)) + [(name, save) for name in names]
    logits = bridge.run_with_hooks(tokens, fwd_hooks=hooks, return_type="logits")
    ind, prev = zip(*(head_scores(store[name], rep_len, has_bos) for name in names), strict=True)
    first, second = half_losses(logits, tokens, rep_len, has_bos)
    return torch.stack(ind), torch.stack(prev), first, second


def rotary_matrix(delta: int, d_head: int, base: float) -> Float[Tensor, "d_head d_head"]:
    """R with q_rot . k_rot = q R(q_pos - k_pos) k for HF NeoX rotary (rotate-half pairs)."""
    angle = delta / base ** (torch.arange(0, d_head, 2).float() / d_head)
    cos, sin = torch.cat([angle.cos()] * 2), torch.cat([angle.sin()] * 2)
    eye = torch.eye(d_head)
    half = d_head // 2
    rotate_half = torch.cat([-eye[:, half:], eye[:, :half]], dim=1)
    return eye * cos + rotate_half * sin


def folded_weights(bridge) -> dict[str, Tensor]:
    """W_Q, W_K, W_V [layer head d_model d_head] with ln1's weight and centring folded in.

    The per-token 1/std scale cannot be folded into weights and is ignored, as in
    TransformerLens's composition scores; biases do not enter the score.
    """
    d_model = bridge.cfg.d_model
    centre = torch.eye(d_model) - 1.0 / d_model  # LayerNorm removes the mean first
    layers = bridge.original_model.gpt_neox.layers
    ln = torch.stack([layer.input_layernorm.weight.detach() for layer in layers])  # [layer d_model]
    fold = centre[None] * ln[:, None, :]  # [layer d_model d_model]: x -> centre(x) * w
    return {
        name: torch.einsum("lab,lhbe->lhae", fold, getattr(bridge, name).detach())
        for name in ("W_Q", "W_K", "W_V")
    }


def _comp(qk: Tensor, ov: Tensor) -> Float[Tensor, "src dst"]:
    """||W_QK_dst W_OV_src^T||_F / (||W_QK_dst||_F ||W_OV_src||_F) for all pairs."""
    prod = torch.einsum("dab,scb->sdac", qk, ov)  # [src dst d_model d_model]
    return prod.norm(dim=(-2, -1)) / (
        ov.norm(dim=(-2, -1))[:, None] * qk.norm(dim=(-2, -1))[None, :]
    )


def composition_scores(bridge, rep_lens=REP_LENS) -> dict[str, Tensor | float]:
    """K-composition of each layer-0 head (source) into each layer-1 head (destination).

    "plain": TransformerLens's score with W_QK = W_Q W_K^T (LayerNorm weight folded in).
    Rotary rotates q and k before their dot product, so the real bilinear form between a
    query and a key (q_pos - k_pos) apart is W_Q R(q_pos - k_pos) W_K^T; "rotary" averages
    the score over the offsets an induction head uses (rep_len - 1). Both are weight-level
    approximations; the causal ablations in `measure` are the primary evidence.
    "baseline": the same statistic for Gaussian matrices of the same ranks (mean of 50).
    """
    w = folded_weights(bridge)
    ov = w["W_V"][0] @ bridge.W_O[0].detach()  # [head d_model d_model]
    qk_plain = w["W_Q"][1] @ w["W_K"][1].transpose(-1, -2)
    d_model, d_head = w["W_Q"].shape[2], w["W_Q"].shape[3]
    base = float(getattr(bridge.cfg, "rotary_base", 10000))
    rotated = [
        _comp(w["W_Q"][1] @ rotary_matrix(L - 1, d_head, base) @ w["W_K"][1].transpose(-1, -2), ov)
        for L in rep_lens
    ]
    gen = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(50):
        a, b = (
            torch.randn(d_model, d_head, generator=gen)
            @ torch.randn(d_head, d_model, generator=gen)
            for _ in "ab"
        )
        samples.append(((a @ b.T).norm() / (a.norm() * b.norm())).item())
    return {
        "plain": _comp(qk_plain, ov),
        "rotary": torch.stack(rotated).mean(0),
        "baseline": sum(samples) / len(samples),
    }


def measure(checkpoint: str | Path, *, seed: int = 0, batch: int = 32, rep_lens=REP_LENS) -> dict:
    """All the figures for one checkpoint, as plain data (JSON-ready)."""
    bridge = load_bridge(checkpoint)
    d_vocab = bridge.cfg.d_vocab
    bos = bridge.tokenizer.bos_token_id
    gen = torch.Generator().manual_seed(seed)
    batches = {L: repeated_random_tokens(d_vocab, L, batch, gen, bos_id=bos) for L in rep_lens}

    ind, prevs, firsts, seconds = {}, [], {}, {}
    for L, tokens in batches.items():
        i, p, f, s = run_repeated(bridge, tokens, L, True)
        ind[L], firsts[L], seconds[L] = i, f, s
        prevs.append(p)
    prev = torch.stack(prevs).mean(0)  # [layer head]
    mean_ind = torch.stack(list(ind.values())).mean(0)  # [layer head]
    best = divmod(int(mean_ind.argmax()), mean_ind.shape[1])
    prev_head = (0, int(prev[0].argmax()))
    induction_heads = [(1, h) for h in range(mean_ind.shape[1]) if mean_ind[1, h] >= 0.3] or [best]

    def losses_with(ablate):
        return {L: run_repeated(bridge, t, L, True, ablate) for L, t in batches.items()}

    abl_ind = losses_with(induction_heads)
    abl_prev = losses_with([prev_head])
    n_layers, n_heads = mean_ind.shape
    # every head alone: the induction and previous-token heads against the rest as controls
    single = {
        f"{layer}.{head}": mean(r[3] for r in losses_with([(layer, head)]).values())
        for layer in range(n_layers)
        for head in range(n_heads)
    }
    comp = composition_scores(bridge)

    no_bos = {}
    for L in rep_lens:
        tokens = repeated_random_tokens(d_vocab, L, batch, gen, bos_id=None)
        no_bos[L] = run_repeated(bridge, tokens, L, False)[0][best].item()

    return {
        "induction_score_by_head": mean_ind.tolist(),
        "previous_token_score_by_head": prev.tolist(),
        "best_induction_head": list(best),
        "best_induction_score_by_rep_len": {L: ind[L][best].item() for L in rep_lens},
        "best_induction_score_by_rep_len_no_bos": no_bos,
        "induction_heads_ablated": [list(h) for h in induction_heads],
        "previous_token_head": list(prev_head),
        "previous_token_score": prev[prev_head].item(),
        "loss_first_half": mean(firsts.values()),
        "loss_repeated_half": mean(seconds.values()),
        "loss_ratio_repeated_over_first": mean(seconds.values()) / mean(firsts.values()),
        "loss_repeated_half_induction_ablated": mean([r[3] for r in abl_ind.values()]),
        "loss_repeated_half_prev_token_ablated": mean([r[3] for r in abl_prev.values()]),
        "loss_repeated_half_single_head_ablated": single,
        "best_induction_score_prev_token_ablated": mean(
            r[0][best].item() for r in abl_prev.values()
        ),
        "k_composition_src_l0_dst_l1": comp["plain"].tolist(),
        "k_composition_rotary_src_l0_dst_l1": comp["rotary"].tolist(),
        "k_composition_random_baseline": comp["baseline"],
    }


def format_report(m: dict) -> str:
    """A human-readable table of `measure`'s figures."""
    b = tuple(m["best_induction_head"])
    p = tuple(m["previous_token_head"])
    lines = ["induction score [layer][head] (mean over repeat lengths):"]
    lines += [
        f"  L{layer}: " + "  ".join(f"{s:.3f}" for s in row)
        for layer, row in enumerate(m["induction_score_by_head"])
    ]
    lines += ["previous-token score [layer][head]:"]
    lines += [
        f"  L{layer}: " + "  ".join(f"{s:.3f}" for s in row)
        for layer, row in enumerate(m["previous_token_score_by_head"])
    ]
    lines.append(f"best induction head {b[0]}.{b[1]} by repeat length (with BOS / without):")
    for L, s in m["best_induction_score_by_rep_len"].items():
        lines.append(f"  L={L:3d}: {s:.3f} / {m['best_induction_score_by_rep_len_no_bos'][L]:.3f}")
    lines.append(f"previous-token head {p[0]}.{p[1]}: {m['previous_token_score']:.3f}")
    lines.append(
        f"loss first half {m['loss_first_half']:.3f}, repeated half {m['loss_repeated_half']:.3f}"
        f" (ratio {m['loss_ratio_repeated_over_first']:.3f})"
    )
    lines.append(
        f"repeated-half loss with induction head(s) {m['induction_heads_ablated']} ablated:"
        f" {m['loss_repeated_half_induction_ablated']:.3f}"
    )
    lines.append(
        f"with previous-token head {p[0]}.{p[1]} ablated: repeated-half loss"
        f" {m['loss_repeated_half_prev_token_ablated']:.3f}, best induction score"
        f" {m['best_induction_score_prev_token_ablated']:.3f}"
    )
    lines.append("repeated-half loss with one head ablated:")
    single = m["loss_repeated_half_single_head_ablated"]
    for layer in range(len(m["induction_score_by_head"])):
        row = [f"{name}: {loss:.3f}" for name, loss in single.items() if name[0] == str(layer)]
        lines.append("  " + "  ".join(row))
    for key, what in [
        ("k_composition_src_l0_dst_l1", "W_Q W_K^T"),
        ("k_composition_rotary_src_l0_dst_l1", "W_Q R W_K^T"),
    ]:
        lines.append(f"K-composition ({what}) [src layer-0 head][dst layer-1 head]:")
        lines += ["  " + "  ".join(f"{s:.3f}" for s in row) for row in m[key]]
    lines.append(f"  random baseline {m['k_composition_random_baseline']:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", default=str(DEFAULT_CHECKPOINT))
    parser.add_argument("--seed", type=int, default=0, help="seed of the random-token batches")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    m = measure(args.checkpoint, seed=args.seed)
    print(json.dumps(m, indent=2) if args.json else format_report(m))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
