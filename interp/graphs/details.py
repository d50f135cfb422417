"""What a graph's page shows of each feature: the tokens it promotes and suppresses, and the
contexts where it fires most on a text.

Promoted and suppressed tokens are read off the weights: the feature's decoder (summed over
every layer it writes, for a cross-layer transcoder) times the unembedding less its mean column
(``W_U - mean_vocab W_U``), the direct effect of one unit of the feature on the demeaned
logits with the final norm's scale left out. Contexts are windows of the text around the
tokens where the feature's activation (the transcoder's own ``encode`` at its layer's input)
is largest.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from interp.dictionaries.data import TokenRows
from interp.engine import run_cached

__all__ = ["CONTEXT_TOKENS", "feature_details"]

CONTEXT_TOKENS = (12, 3)  # tokens shown before and after the top activation of a context


def _direction(tc, layer: int, feature: int) -> torch.Tensor:
    W = tc.W_dec(layer)[feature]
    return W.sum(0) if W.dim() == 2 else W  # a cross-layer row writes every later layer


def _contexts(model, tc, wanted: set, texts: Sequence[str], n_tokens: int, n_top: int, seed):
    """Up to ``n_top`` windows per (layer, feature) of ``wanted`` over ``texts``, around its
    largest activations, with the activations of the full row (not of the window alone)."""
    rows = TokenRows(model, texts, torch.Generator().manual_seed(seed), holdout=0.0)
    layers = sorted({layer for layer, _ in wanted})
    before, after = CONTEXT_TOKENS
    best: dict = {key: [] for key in wanted}
    for tokens in rows.draw(n_tokens):
        hooks = [tc.input_hook(layer) for layer in layers]
        run = run_cached(model, tokens, hooks=hooks, keep_logits=False, prepend_bos=False)
        for layer in layers:
            feats = [f for lay, f in sorted(wanted) if lay == layer]
            acts = tc.encode(run.activations[tc.input_hook(layer)].to(tc.dtype), layer)
            acts = acts[..., feats].cpu()  # [batch pos n]
            acts[:, 0] = 0  # position 0 holds no feature node in a graph either
            values, flat = acts.flatten(0, 1).topk(min(n_top, acts[..., 0].numel()), dim=0)
            for j, f in enumerate(feats):
                for v, i in zip(values[:, j].tolist(), flat[:, j].tolist(), strict=True):
                    if v <= 0:
                        continue
                    row, pos = divmod(i, tokens.shape[1])
                    lo, hi = max(0, pos - before), min(tokens.shape[1], pos + after + 1)
                    ids = tokens[row, lo:hi].tolist()
                    best[(layer, f)].append(
                        (v, {
                            "tokens": [model.tokenizer.decode([t]) for t in ids],
                            "acts": [round(float(a), 4) for a in acts[row, lo:hi, j]],
                            "mark": pos - lo,
                        })
                    )  # fmt: skip
    return {
        key: [c for _, c in sorted(found, key=lambda e: -e[0])[:n_top]]
        for key, found in best.items()
    }


@torch.no_grad()
def feature_details(
    model,
    tc,
    features: Sequence[tuple[int, int]],
    *,
    texts: Sequence[str] | None = None,
    n_tokens: int = 16384,
    top_tokens: int = 8,
    contexts: int = 5,
    seed: int = 0,
) -> dict[tuple[int, int], dict]:
    """For each ``(layer, feature)``: ``promoted`` and ``suppressed`` (``[token, effect]``
    pairs, ``top_tokens`` each), and, with ``texts``, ``contexts``: up to ``contexts``
    windows ``{"tokens": [...], "acts": [...], "mark": i}`` of about ``n_tokens`` drawn from
    ``texts`` (seeded), around the feature's largest activations."""
    wanted = sorted({(int(layer), int(f)) for layer, f in features})
    W_U = model.W_U.detach().to(tc.dtype)
    W_U = W_U - W_U.mean(dim=1, keepdim=True)
    out: dict = {}
    for layer, f in wanted:
        effect = _direction(tc, layer, f).to(W_U.device) @ W_U
        k = min(top_tokens, effect.numel())
        up, down = effect.topk(k), (-effect).topk(k)
        out[(layer, f)] = {
            "promoted": [
                [model.tokenizer.decode([int(i)]), float(v)]
                for v, i in zip(up.values, up.indices, strict=True)
            ],
            "suppressed": [
                [model.tokenizer.decode([int(i)]), -float(v)]
                for v, i in zip(down.values, down.indices, strict=True)
            ],
        }
    if texts is not None and wanted:
        for key, shown in _contexts(
            model, tc, set(wanted), texts, n_tokens, contexts, seed
        ).items():
            out[key]["contexts"] = shown
    return out
