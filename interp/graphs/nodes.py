"""The nodes of an attribution graph, read from the clean pass: active features with their
encoder rows and output vectors, error vectors, token embeddings, and the salient logits.

Columns of a computed row (before ``max_feature_nodes`` drops unvisited features): every
active feature (layer, position, feature order), then ``n_layers x (n_pos - 1)`` error nodes
(positions 1 onwards), then ``n_pos`` token nodes. Features and errors at position 0 are not
nodes (circuit-tracer zeroes them): the MLP output there is a constant of the frozen model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.engine import CachedRun

__all__ = ["Sources", "node_table", "read_sources", "salient_logits"]


@dataclass
class Sources:
    """What the backward passes inject and contract with (module docstring)."""

    feat_layer: Int[Tensor, " feature"]
    feat_pos: Int[Tensor, " feature"]
    feat_index: Int[Tensor, " feature"]
    activation: Float[Tensor, " feature"]
    encoders: Float[Tensor, "feature d_model"]  # targets' input vectors
    # per MLP output j: the vectors of the features writing there, by position
    # [pos slot d_model] (zero-padded), and their columns [pos slot] (-1 for padding)
    writers: list[tuple[Tensor, Tensor]]
    errors: Float[Tensor, "layer pos_1 d_model"]  # positions 1..n_pos-1
    embed: Float[Tensor, "pos d_model"]

    @property
    def n_features(self) -> int:
        return len(self.feat_layer)

    @property
    def token_start(self) -> int:
        return self.n_features + self.errors.shape[0] * self.errors.shape[1]

    @property
    def n_cols(self) -> int:
        return self.token_start + self.embed.shape[0]


def _by_position(columns: Tensor, pos: Tensor, vecs: Tensor, n_pos: int) -> tuple[Tensor, Tensor]:
    """Vectors grouped by position, ``[pos slot d_model]`` zero-padded, and their columns
    ``[pos slot]`` (-1 for padding): one batched matmul per layer contracts them all."""
    counts = torch.bincount(pos, minlength=n_pos)
    slots = max(int(counts.max()) if len(pos) else 0, 1)
    order = torch.argsort(pos, stable=True)
    pos, columns, vecs = pos[order], columns[order], vecs[order]
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(pos), device=pos.device) - starts[pos]
    padded = torch.zeros(n_pos, slots, vecs.shape[-1], dtype=vecs.dtype, device=vecs.device)
    cols = torch.full((n_pos, slots), -1, dtype=torch.long, device=pos.device)
    padded[pos, slot] = vecs
    cols[pos, slot] = columns
    return padded, cols


def read_sources(model, tc, clean: CachedRun, dtype: torch.dtype) -> Sources:
    """Active features (position 0 excluded), their vectors, errors and embeddings."""
    n_layers = tc.n_layers
    xs = [clean[tc.input_hook(lay)][0].to(dtype) for lay in range(n_layers)]
    acts = []
    for layer, x in enumerate(xs):
        a = tc.encode(x, layer)
        a[0] = 0
        acts.append(a)
    layer_ids, pos_ids, feat_ids, values = [], [], [], []
    for layer, a in enumerate(acts):
        pos, feat = torch.nonzero(a, as_tuple=True)
        layer_ids.append(torch.full_like(pos, layer))
        pos_ids.append(pos)
        feat_ids.append(feat)
        values.append(a[pos, feat])
    feat_layer, feat_pos = torch.cat(layer_ids), torch.cat(pos_ids)
    feat_index, activation = torch.cat(feat_ids), torch.cat(values)
    encoders = (
        torch.cat([tc.W_enc(lay)[f] for lay, f in enumerate(feat_ids)])
        if len(feat_index)
        else torch.zeros(0, tc.d_model, device=xs[0].device)
    )
    columns = torch.arange(len(feat_layer), device=feat_layer.device)
    writers = []
    for j in range(n_layers):
        sources = range(j, j + 1) if tc.kind == "per-layer" else range(j + 1)
        idx, pos, vecs = [], [], []
        for s in sources:
            mine = feat_layer == s
            rows = tc.decoder_rows(s, feat_index[mine], j)
            idx.append(columns[mine])
            pos.append(feat_pos[mine])
            vecs.append(activation[mine, None] * rows)
        writers.append(_by_position(torch.cat(idx), torch.cat(pos), torch.cat(vecs), len(xs[0])))
    errors = []
    for layer, x in enumerate(xs):
        decode_in = acts[layer] if tc.kind == "per-layer" else acts
        recon = tc.decode(decode_in, layer) + tc.skip(x, layer)
        y = clean[tc.output_hook(layer)][0].to(dtype)
        errors.append((y - recon)[1:])
    return Sources(
        feat_layer=feat_layer,
        feat_pos=feat_pos,
        feat_index=feat_index,
        activation=activation,
        encoders=encoders,
        writers=writers,
        errors=torch.stack(errors),
        embed=clean["hook_embed"][0].to(dtype),
    )


def salient_logits(
    model,
    logits: Float[Tensor, " d_vocab"],
    max_n_logits: int,
    desired_logit_prob: float,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor, Tensor]:
    """circuit-tracer's salient logits: the most probable tokens until their cumulative
    probability reaches ``desired_logit_prob`` (at most ``max_n_logits``), their
    probabilities, and their demeaned unembedding columns ``[k d_model]``."""
    probs = torch.softmax(logits.to(dtype), dim=-1)
    top_p, top_idx = torch.topk(probs, min(int(max_n_logits), probs.shape[-1]))
    cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), desired_logit_prob)) + 1
    top_p, top_idx = top_p[:cutoff], top_idx[:cutoff]
    W_U = model.W_U.detach().to(dtype)  # [d_model d_vocab]
    vecs = (W_U[:, top_idx] - W_U.mean(dim=-1, keepdim=True)).T
    return top_idx, top_p, vecs


def node_table(
    src: Sources,
    selected: Tensor,
    n_layers: int,
    tokens: Tensor,
    logit_ids: Tensor,
    logit_p: Tensor,
) -> pd.DataFrame:
    """The ``nodes`` DataFrame in adjacency order (see :mod:`interp.graphs.graph`)."""
    toks = tokens.cpu().numpy()
    n_pos = len(toks)
    sel = selected.cpu()
    f_pos = src.feat_pos.cpu()[sel].numpy()
    err_layer = np.repeat(np.arange(n_layers), n_pos - 1)
    err_pos = np.tile(np.arange(1, n_pos), n_layers)
    n_f, n_e, n_l = len(sel), len(err_layer), len(logit_ids)
    nan = np.full
    return pd.DataFrame(
        {
            "kind": ["feature"] * n_f + ["error"] * n_e + ["token"] * n_pos + ["logit"] * n_l,
            "layer": np.concatenate(
                [src.feat_layer.cpu()[sel].numpy(), err_layer, nan(n_pos, -1), nan(n_l, n_layers)]
            ).astype(np.int64),
            "pos": np.concatenate([f_pos, err_pos, np.arange(n_pos), nan(n_l, n_pos - 1)]).astype(
                np.int64
            ),
            "feature": np.concatenate(
                [src.feat_index.cpu()[sel].numpy(), nan(n_e + n_pos + n_l, -1)]
            ).astype(np.int64),
            "token_id": np.concatenate(
                [toks[f_pos], toks[err_pos], toks, logit_ids.cpu().numpy()]
            ).astype(np.int64),
            "activation": np.concatenate(
                [src.activation.detach().cpu()[sel].numpy(), nan(n_e + n_pos + n_l, np.nan)]
            ),
            "probability": np.concatenate(
                [nan(n_f + n_e + n_pos, np.nan), logit_p.detach().cpu().numpy()]
            ),
        }
    )
