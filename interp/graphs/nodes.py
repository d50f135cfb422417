"""The nodes of an attribution graph, read from the clean pass: active features (layer,
position, index, activation), error vectors, token embeddings, and the salient logits.

Columns of a computed row (before ``max_feature_nodes`` drops unvisited features): every
active feature (layer, position, feature order), then ``n_layers x (n_pos - 1)`` error nodes
(positions 1 onwards), then ``n_pos`` token nodes. Features and errors at position 0 are not
nodes (circuit-tracer zeroes them): the MLP output there is a constant of the frozen model.

The sources hold no ``[feature d_model]`` vector (at Gemma-2-2B's size, 1,024 positions, those
would be ~40 GB of encoder rows and as much of decoder vectors): a target's encoder row is read
from the transcoder's weights when its batch is computed (:meth:`Sources.encoder_rows`), and a
layer's writers' output vectors (activation times decoder row) for a block of positions when a
row step contracts a gradient with them (:meth:`Sources.writer_block`,
:meth:`Sources.add_writer_scores`), block by block, each at most ``chunk_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.engine import CachedRun

__all__ = ["CHUNK_BYTES", "Sources", "node_table", "read_sources", "salient_logits"]

# a writer block's output vectors at most (its positions chosen so, one at least): a row step
# holds one block and one source layer's decoder rows gathered into it besides its gradients.
# Large enough that a block's matmul is not launch-bound on a GPU (at Gemma-2-2B's size ~35
# positions of ~205 writers), small beside the gradients a row step holds there
CHUNK_BYTES = 256 * 2**20


@dataclass
class Sources:
    """What the backward passes inject and contract with (module docstring)."""

    feat_layer: Int[Tensor, " feature"]
    feat_pos: Int[Tensor, " feature"]
    feat_index: Int[Tensor, " feature"]
    activation: Float[Tensor, " feature"]
    # per MLP output j: the columns of the features writing there, by position, [pos slot]
    # (-1 for padding): a writer block's layout, one batched matmul per block
    layout: list[Int[Tensor, "pos slot"]]
    errors: Float[Tensor, "layer pos_1 d_model"]  # positions 1..n_pos-1
    embed: Float[Tensor, "pos d_model"]
    tc: object  # the transcoders (work dtype), whose weights give every vector
    chunk_bytes: int = CHUNK_BYTES

    @property
    def n_features(self) -> int:
        return len(self.feat_layer)

    @property
    def token_start(self) -> int:
        return self.n_features + self.errors.shape[0] * self.errors.shape[1]

    @property
    def n_cols(self) -> int:
        return self.token_start + self.embed.shape[0]

    @property
    def held_bytes(self) -> int:
        """Bytes the sources hold (no vector per feature: module docstring)."""
        tensors = [self.feat_layer, self.feat_pos, self.feat_index, self.activation]
        tensors += [self.errors, self.embed, *self.layout]
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def block_bytes(self) -> int:
        """Bytes a row step's contraction adds at most: the largest writer block and the
        decoder rows of one source layer gathered into it (its share of that layer's active
        features)."""
        item = torch.promote_types(self.activation.dtype, self.tc.dtype).itemsize
        widest = max(range(len(self.layout)), key=lambda j: self.layout[j].numel())
        cols = self.layout[widest]
        vecs = min(self.chunk(widest), len(cols)) * cols.shape[1] * self.embed.shape[1] * item
        one_layer = int(torch.bincount(self.feat_layer).max()) if self.n_features else 0
        return int(vecs * (1 + one_layer / cols.numel()))

    def chunk(self, layer: int) -> int:
        """Positions per writer block of MLP output ``layer`` (at most ``chunk_bytes``)."""
        slots, d = self.layout[layer].shape[1], self.embed.shape[1]
        item = torch.promote_types(self.activation.dtype, self.tc.dtype).itemsize
        return max(1, self.chunk_bytes // max(1, slots * d * item))

    def encoder_rows(self, features: Int[Tensor, " batch"]) -> Float[Tensor, "batch d_model"]:
        """The encoder rows (targets' input vectors) of ``features`` (columns), from the
        transcoder's weights."""
        features = features.to(self.feat_layer.device)
        layers, index = self.feat_layer[features], self.feat_index[features]
        W = self.tc.W_enc(0)
        out = torch.empty(len(features), W.shape[1], dtype=W.dtype, device=W.device)
        for layer in layers.unique().tolist():
            mine = layers == layer
            out[mine] = self.tc.W_enc(layer)[index[mine]]
        return out

    def writer_block(
        self, layer: int, start: int, stop: int
    ) -> tuple[Float[Tensor, "pos slot d_model"], Int[Tensor, "pos slot"]]:
        """The output vectors (activation times decoder row into MLP output ``layer``) of the
        features writing there at positions ``start:stop``, zero-padded, and their columns
        (-1 for padding)."""
        cols = self.layout[layer][start:stop]
        pos, slot = torch.nonzero(cols >= 0, as_tuple=True)
        feats = cols[pos, slot]
        dtype = torch.promote_types(self.activation.dtype, self.tc.dtype)
        shape = (*cols.shape, self.embed.shape[1])
        vecs = torch.zeros(shape, dtype=dtype, device=cols.device)
        sources = [layer] if self.tc.kind == "per-layer" else range(layer + 1)
        src_layer = self.feat_layer[feats]
        for s in sources:
            mine = slice(None) if self.tc.kind == "per-layer" else src_layer == s
            f = feats[mine]
            rows = self.tc.decoder_rows(s, self.feat_index[f], layer).to(dtype)
            # in place (decoder_rows indexes the weights: a new tensor): the same product as
            # activation * rows, one [n d_model] tensor fewer
            vecs[pos[mine], slot[mine]] = rows.mul_(self.activation[f, None])
        return vecs, cols

    def add_writer_scores(
        self, out: Float[Tensor, "batch col"], layer: int, g: Float[Tensor, "batch pos d_model"]
    ) -> None:
        """Adds into ``out``'s columns of the features writing into MLP output ``layer`` the
        gradient ``g`` there (positions ``0:g.shape[1]``) contracted with their output vectors:
        per block of positions (:meth:`chunk`), one batched matmul."""
        step = self.chunk(layer)
        for start in range(0, g.shape[1], step):
            stop = min(start + step, g.shape[1])
            vecs, cols = self.writer_block(layer, start, stop)  # [pos slot d_model], [pos slot]
            if not vecs.shape[1]:
                continue
            scores = torch.bmm(g[:, start:stop].transpose(0, 1), vecs.transpose(1, 2))
            del vecs  # [pos batch slot]: the block goes before the scatter
            valid = cols >= 0
            out[:, cols[valid]] += scores.permute(1, 0, 2)[:, valid]


def _by_position(columns: Tensor, pos: Tensor, n_pos: int) -> Tensor:
    """Columns grouped by position, ``[pos slot]`` (-1 for padding): a writer block's layout."""
    counts = torch.bincount(pos, minlength=n_pos)
    slots = max(int(counts.max()) if len(pos) else 0, 1)
    order = torch.argsort(pos, stable=True)
    pos, columns = pos[order], columns[order]
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(pos), device=pos.device) - starts[pos]
    cols = torch.full((n_pos, slots), -1, dtype=torch.long, device=pos.device)
    cols[pos, slot] = columns
    return cols


def read_sources(
    model, tc, clean: CachedRun, dtype: torch.dtype, chunk_bytes: int | None = None
) -> Sources:
    """Active features (position 0 excluded), the writers' layout, errors and embeddings;
    ``chunk_bytes``: a writer block's vectors at most (None: ``CHUNK_BYTES``)."""
    n_layers = tc.n_layers
    # layer by layer, a per-layer set's dense activations [pos d_tc] one layer at a time (a
    # cross-layer set's reconstruction of layer j reads every layer's up to j)
    acts, errors = [], []
    layer_ids, pos_ids, feat_ids, values = [], [], [], []
    for layer in range(n_layers):
        x = clean[tc.input_hook(layer)][0].to(dtype)
        a = tc.encode(x, layer)
        a[0] = 0
        pos, feat = torch.nonzero(a, as_tuple=True)
        layer_ids.append(torch.full_like(pos, layer))
        pos_ids.append(pos)
        feat_ids.append(feat)
        values.append(a[pos, feat])
        if tc.kind != "per-layer":
            acts.append(a)
        recon = tc.decode(a if tc.kind == "per-layer" else acts, layer) + tc.skip(x, layer)
        y = clean[tc.output_hook(layer)][0].to(dtype)
        errors.append((y - recon)[1:])
        del a, x, y, recon
    n_pos = clean["hook_embed"].shape[1]
    feat_layer, feat_pos = torch.cat(layer_ids), torch.cat(pos_ids)
    feat_index, activation = torch.cat(feat_ids), torch.cat(values)
    columns = torch.arange(len(feat_layer), device=feat_layer.device)
    layout = []
    for j in range(n_layers):
        # a cross-layer feature writes into every layer from its own (columns: source layer
        # by layer, so a position's slots are too)
        mine = feat_layer == j if tc.kind == "per-layer" else feat_layer <= j
        layout.append(_by_position(columns[mine], feat_pos[mine], n_pos))
    return Sources(
        feat_layer=feat_layer,
        feat_pos=feat_pos,
        feat_index=feat_index,
        activation=activation,
        layout=layout,
        errors=torch.stack(errors),
        embed=clean["hook_embed"][0].to(dtype),
        tc=tc,
        chunk_bytes=CHUNK_BYTES if chunk_bytes is None else int(chunk_bytes),
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
