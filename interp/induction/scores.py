"""Per-head attention scores and losses from one forward pass over a repeated-token batch.

Patterns are reduced to per-head scores inside the hook, so the scan keeps ``[head]`` numbers
per layer instead of ``[batch head q_pos k_pos]`` patterns (see benchmarks/bench_induction.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from interp.engine import Intervention, Site, row_chunks, run_cached
from interp.foundation.formatting import summary_html, table_html, tensor_text
from interp.induction.batches import SCORE_TARGETS, RepeatedTokens

__all__ = [
    "HeadScan",
    "scan_heads",
    "scores_from_patterns",
    "next_token_loss",
    "ablated_repeated_loss",
]


@dataclass(frozen=True)
class HeadScan:
    """What one pass over a :class:`RepeatedTokens` batch measured."""

    scores: dict[str, Float[Tensor, "layer head"]]  # kind -> mean attention to the kind's target
    induction_by_len: dict[int, Float[Tensor, "layer head"]]  # repeat length -> induction score
    loss: Float[Tensor, "batch pos"]  # next-token loss; the last position is NaN
    z_mean: dict[int, Float[Tensor, "head d_head"]] | None = None  # layer -> mean z (if asked)

    def __repr__(self) -> str:
        kinds = ", ".join(f"{k} {tensor_text(v)}" for k, v in self.scores.items())
        z_mean = "" if self.z_mean is None else f"; z_mean for layers {list(self.z_mean)}"
        return (
            f"HeadScan(scores: {kinds}; induction_by_len for {list(self.induction_by_len)}; "
            f"loss {tensor_text(self.loss)}{z_mean})"
        )

    def _repr_html_(self) -> str:
        import pandas as pd

        some = next(iter(self.scores.values()))
        n_layers, n_heads = some.shape
        table = pd.DataFrame(
            {
                "layer": torch.arange(n_layers).repeat_interleave(n_heads),
                "head": torch.arange(n_heads).repeat(n_layers),
            }
        )
        for kind, values in self.scores.items():
            table[f"{kind}_score"] = values.flatten().tolist()
        first = next(iter(self.scores))
        table = table.sort_values(f"{first}_score", ascending=False, na_position="last")
        loss = self.loss[:, :-1]
        return summary_html(
            "Head scan",
            {
                "scores": ", ".join(self.scores),
                "heads": f"{n_layers} layers x {n_heads} heads",
                "repeat lengths": str(list(self.induction_by_len)),
                "loss": f"{list(self.loss.shape)}, mean {float(loss.nanmean()):.4g}",
            },
            table=table_html(table),
            table_title=f"heads by {first} score",
        )


def next_token_loss(
    logits: Float[Tensor, "batch pos d_vocab"], tokens: Tensor
) -> Float[Tensor, "batch pos"]:
    """Cross-entropy of predicting ``tokens[:, p + 1]`` at ``p``; NaN at the last position."""
    logits = logits.float()
    target = tokens[:, 1:, None].to(logits.device)
    picked = logits[:, :-1].gather(-1, target)[..., 0]
    loss = torch.logsumexp(logits[:, :-1], dim=-1) - picked
    pad = torch.full_like(loss[:, :1], float("nan"))
    return torch.cat([loss, pad], dim=1).cpu()


def _score_hook(index: tuple[Tensor, Tensor, Tensor], out: Tensor, layer: int) -> Callable:
    b, q, k, slot = index  # rows of this chunk, and where each target goes in ``out``

    def hook(pattern: Float[Tensor, "batch head q_pos k_pos"], hook) -> None:
        # pattern[b, :, q, k] for every target: [n_targets head]
        dev = pattern.device
        out[layer, slot] = pattern[b.to(dev), :, q.to(dev), k.to(dev)].float().cpu()

    return hook


def _z_sum_hook(out: dict, layer: int) -> Callable:
    def hook(z: Float[Tensor, "batch pos head d_head"], hook) -> None:
        total = z.detach().double().sum(dim=(0, 1)).cpu()  # float64: chunk sums add up exactly
        out[layer] = out[layer] + total if layer in out else total

    return hook


def held_bytes(model, batch: RepeatedTokens, *, scores: bool = True) -> int:
    """Bytes the scan keeps for the whole batch while it runs, whatever its chunks: the
    next-token losses and, with ``scores``, every target's gathered score (one number per layer
    and head) and its indices."""
    n_rows, n_pos = batch.tokens.shape
    held = n_rows * n_pos * 4
    if scores:
        per_target = int(model.cfg.n_layers) * int(model.cfg.n_heads) * 4 + 3 * 8
        held += per_target * sum(len(batch.targets(kind)[0]) for kind in SCORE_TARGETS)
    return held


def chunk_rows(
    model, batch: RepeatedTokens, max_bytes: int | str | None, *, scores: bool = True
) -> list[slice]:
    """Row slices of ``batch`` whose forward passes each fit ``max_bytes`` (one slice if None).

    What the scan keeps for the whole batch (:func:`held_bytes`) comes off the budget first;
    each pass then needs the forward pass's working memory
    (:func:`interp.engine.estimate_forward_bytes`), or after it the loss over the logits
    (:func:`interp.engine.estimate_loss_bytes`), per row.
    """
    n_rows, n_pos = batch.tokens.shape
    return row_chunks(
        model,
        n_rows,
        n_pos,
        max_bytes,
        kept_per_row=16 * n_pos,
        loss=True,
        held=0 if max_bytes is None else held_bytes(model, batch, scores=scores),
        what="the induction scan (scores and losses)",
    )


def scan_heads(
    model, batch: RepeatedTokens, *, max_bytes: int | str | None = None, z_mean: bool = False
) -> HeadScan:
    """Score every head on ``batch`` in one forward pass (no activation kept but the scores).

    ``max_bytes`` splits the batch into chunks of rows whose passes fit the budget; scores and
    losses equal one pass (they are gathered into the same places and reduced once).
    ``z_mean`` also records each head's mean ``z`` over the batch (for mean ablations).
    """
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    targets = {kind: batch.targets(kind) for kind in SCORE_TARGETS}
    gathered = {
        kind: torch.zeros(n_layers, len(targets[kind][0]), n_heads) for kind in SCORE_TARGETS
    }
    z_sums: dict[int, Tensor] = {}
    losses = []
    for rows in chunk_rows(model, batch, max_bytes):
        hooks = []
        for kind in SCORE_TARGETS:
            b, q, k = targets[kind]
            slot = ((b >= rows.start) & (b < rows.stop)).nonzero()[:, 0]
            if len(slot):
                index = (b[slot] - rows.start, q[slot], k[slot], slot)
                hooks += [
                    (f"blocks.{layer}.attn.hook_pattern", _score_hook(index, gathered[kind], layer))
                    for layer in range(n_layers)
                ]
        if z_mean:
            hooks += [
                (f"blocks.{layer}.attn.hook_z", _z_sum_hook(z_sums, layer))
                for layer in range(n_layers)
            ]
        run = run_cached(model, batch.tokens[rows], interventions=hooks)
        losses.append(next_token_loss(run.logits, batch.tokens[rows]))
        del run
    scores, by_len = {}, {}
    for kind in SCORE_TARGETS:
        if len(targets[kind][0]) == 0:  # e.g. no filler when every row has the same length
            scores[kind] = torch.full((n_layers, n_heads), float("nan"))
            continue
        per_target = gathered[kind]
        scores[kind] = per_target.mean(dim=1)  # [layer head]
        if kind == "induction":
            row_len = batch.seq_lens[targets[kind][0]]
            for seq_len in batch.seq_lens.unique().tolist():
                by_len[seq_len] = per_target[:, row_len == seq_len].mean(dim=1)
    n_tokens = batch.tokens.numel()
    means = {layer: (total / n_tokens).float() for layer, total in z_sums.items()} or None
    return HeadScan(scores=scores, induction_by_len=by_len, loss=torch.cat(losses), z_mean=means)


def scores_from_patterns(
    patterns: Float[Tensor, "layer batch head q_pos k_pos"],
    batch: RepeatedTokens,
) -> dict[str, Float[Tensor, "layer head"]]:
    """Dense reference for :func:`scan_heads`: masks over materialised patterns, no gathers."""
    n_pos = batch.tokens.shape[1]
    scores = {}
    for kind in SCORE_TARGETS:
        b, q, k = batch.targets(kind)
        mask = torch.zeros(len(batch.tokens), n_pos, n_pos)
        mask[b, q, k] = 1.0
        if mask.sum() == 0:
            scores[kind] = torch.full(patterns.shape[:1] + patterns.shape[2:3], float("nan"))
            continue
        weighted = torch.einsum("lbhqk,bqk->lh", patterns.float(), mask)
        scores[kind] = weighted / mask.sum()
    return scores


def ablated_repeated_loss(
    model,
    batch: RepeatedTokens,
    layer: int,
    head: int,
    *,
    z_mean: Float[Tensor, " d_head"] | None = None,
    max_bytes: int | str | None = None,
) -> float:
    """Mean repeated-half loss with one head mean-ablated.

    Mean ablation replaces the head's ``z`` by its mean over batch and positions: the head's
    average contribution stays, only what it moves from position to position is removed
    (zero ablation would also remove a constant bias the later layers rely on).

    ``z_mean``: that mean, if known (``scan_heads(..., z_mean=True)``); the ablation does not
    change it, since ``z`` at ``layer`` depends only on earlier layers. ``max_bytes`` splits the
    batch into chunks (the mean is then measured over the whole batch first).
    """
    chunks = chunk_rows(model, batch, max_bytes, scores=False)
    if z_mean is None and len(chunks) > 1:
        z_mean = scan_heads(model, batch, max_bytes=max_bytes, z_mean=True).z_mean[layer][head]
    site = Site("head", layer, head=head)
    if z_mean is None:  # one pass: the mean over this batch, measured in the hook
        ablation = Intervention(site, "mean")
    else:  # the whole batch's mean, known beforehand, written into every chunk
        n_pos, n_heads = batch.tokens.shape[1], int(model.cfg.n_heads)
        source = torch.zeros(1, n_pos, n_heads, z_mean.shape[-1], dtype=z_mean.dtype)
        source[:, :, head] = z_mean
        ablation = Intervention(site, "patch", source=source)

    losses = []
    for rows in chunks:
        run = run_cached(model, batch.tokens[rows], interventions=[ablation])
        losses.append(next_token_loss(run.logits, batch.tokens[rows]))
        del run
    loss = torch.cat(losses)
    return float(loss[batch.loss_positions("repeated")].mean())
