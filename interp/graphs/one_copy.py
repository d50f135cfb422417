"""The frozen model's transpose, carried by hand from one copy of the prompt's patterns and
norm scales (:class:`OneCopy`, recorded by :func:`interp.graphs.vjp.record`).

A batch of gradient rows ``[batch pos d_model]`` goes down the residual stream:

- the residual is the identity; an MLP's output is a constant (no gradient through the MLP),
  its transcoder's skip term ``x M`` passes ``g M^T`` into its input;
- a post-norm (Gemma 2's ``ln2_post`` after the MLP, where the transcoders write before it)
  is a frozen norm between the sublayer and the residual; ``ln1_post``, after the attention,
  is folded into the attention's map (:func:`fold_post`);
- a frozen norm ``centre(x) / scale * w + b`` passes ``centre(g * w / scale)`` (RMSNorm: no
  centring; Gemma: ``1 + w`` for ``w``; a transcoder reading ``ln2.hook_normalized``: no ``w``);
- an attention passes ``W_V^T (pattern^T (g W_O^T))`` per head (grouped key/value heads summed
  back; rotary acts on q and k only, so not on this path);

reading on the way what the batched step (:func:`interp.graphs.attribute._rows`) reads: the
gradient at each MLP output (contracted with its writers' decoder vectors and its error
vectors) and at the embeddings (tokens). A target enters as one vector at one position, through
the norm between the residual and where it is read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.graphs.value_path import ValuePath, _dense, _one_position

__all__ = ["FrozenNorm", "OneCopy", "fold_post"]


@dataclass
class FrozenNorm:
    """A frozen norm's transpose: ``centre(g * weight / scale)``."""

    weight: Tensor | None  # [d_model]; None: 1
    scale: Tensor  # [pos 1]
    centre: bool

    def back(self, g: Float[Tensor, "batch pos d_model"], weighted: bool = True) -> Tensor:
        """The transpose on ``g`` (``weighted=False``: ``centre(g / scale)``, the map into
        ``hook_normalized``); a new tensor."""
        g = g / self.scale[: g.shape[1]].to(g.dtype)
        if weighted and self.weight is not None:
            g.mul_(self.weight.to(g.dtype))
        return g.sub_(g.mean(-1, keepdim=True)) if self.centre else g


def _inject(g: Tensor, norm: FrozenNorm | None, rows, positions, vectors, mine, weighted) -> None:
    """Adds into ``g`` (the residual's gradient) the rows ``mine``'s target vectors, each at
    its position, through the frozen ``norm`` between the residual and where they are read
    (None: read on the residual): ``[m d_model]`` vectors, not a ``[batch pos d_model]`` pass."""
    if not bool(mine.any()):
        return
    r, q, v = rows[mine], positions[mine], vectors[mine]
    if norm is not None:
        v = _back_at(norm, v, q, weighted)
    g.index_put_((r, q), v, accumulate=True)


def _back_at(norm: FrozenNorm, v: Tensor, q: Tensor, weighted: bool) -> Tensor:
    """The frozen norm's transpose on vectors ``v [m d_model]`` at positions ``q [m]``."""
    v = v / norm.scale[q].to(v.dtype)  # [m d_model] / [m 1]
    if weighted and norm.weight is not None:
        v = v * norm.weight.to(v.dtype)
    return v - v.mean(-1, keepdim=True) if norm.centre else v


def fold_post(
    path: ValuePath, pattern: Float[Tensor, "head q_pos k_pos"], post: FrozenNorm
) -> ValuePath:
    """An RMSNorm between the attention's output and the residual (Gemma 2's ``ln1_post``,
    frozen: ``g * w / scale``) folded into the attention's transpose, so that it needs no
    ``[batch pos d_model]`` step of its own: ``w`` into ``W_O`` (a new :class:`ValuePath`),
    ``1 / scale[q]`` into each query row ``q`` of ``pattern`` (in place: ``pattern`` is the
    recording's own)."""
    if post.centre:
        raise ValueError("only a post-norm without centring (RMSNorm) folds into the attention")
    with torch.inference_mode():  # the recording pass's own tensor (an inference tensor)
        pattern.div_(post.scale[None])  # [head q_pos k_pos] / [1 q_pos 1]
    if post.weight is None:
        return path
    W_O = (path.W_O.to(post.weight.dtype) * post.weight).to(path.W_O.dtype)
    return ValuePath(path.W_V, W_O, path.b_V, path.b_O)


@dataclass
class OneCopy:
    """What one pass of the prompt recorded for the frozen model's transpose (module
    docstring), per layer; ``mlp_norm`` names the norm a transcoder's input hangs off (``ln2``,
    or ``ln1`` where attention and MLP share one)."""

    paths: list[ValuePath]
    patterns: list[Float[Tensor, "head q_pos k_pos"]]  # the model's dtype, upcast per layer
    ln1: list[FrozenNorm]
    mlp_norm: list[FrozenNorm | None]  # None: the transcoder reads the residual itself
    final: FrozenNorm
    skips: list[Tensor] | None  # [d_model d_model]: M with skip(x) = x M (W_skip^T)
    site: str  # "norm", "normalized" or "resid" (interp.graphs.relations.SITES)
    parallel: bool
    shared_norm: bool  # parallel blocks whose attention and MLP read one norm (GPT-J, Phi)
    mlp_post: list[FrozenNorm] | None = None  # ln2_post, where the transcoders write before it

    @property
    def n_layers(self) -> int:
        return len(self.paths)

    def _attention(self, layer: int, g: Tensor) -> Tensor:
        pattern = self.patterns[layer]
        gx = _one_position(self.paths[layer], pattern, g)
        return _dense(self.paths[layer], pattern, g) if gx is None else gx

    @torch.no_grad()
    def rows(
        self,
        src,
        layers: Int[Tensor, " batch"],
        positions: Int[Tensor, " batch"],
        vectors: Float[Tensor, "batch d_model"],
    ) -> Float[Tensor, "batch n_cols"]:
        """Attribution rows ``[batch n_cols]`` (every feature, error, token) for targets at
        ``layers`` (``n_layers``: a logit at the final norm's output) and ``positions``, as
        :func:`interp.graphs.attribute._rows` computes them from a batched frozen pass."""
        work = src.embed.dtype  # float32 at least (a half-precision model's rows in float32)
        n, b, d = self.n_layers, len(layers), src.embed.shape[1]
        p = int(positions.max()) + 1  # the model is causal: later positions get no gradient
        out = torch.zeros(b, src.n_cols, dtype=work, device=vectors.device)
        rows = torch.arange(b, device=vectors.device)
        vectors = vectors.to(work)
        top = min(int(layers.max()), n)
        g = torch.zeros(b, p, d, dtype=work, device=vectors.device)  # at the residual
        _inject(g, self.final, rows, positions, vectors, layers == n, True)
        for layer in range(min(top, n - 1), -1, -1):
            at_out = g  # the gradient at this layer's MLP output (the transcoders' output hook)
            if layer < top and self.mlp_post is not None:  # ln2_post between it and g
                at_out = self.mlp_post[layer].back(g)
            if layer < top:
                _read(out, src, layer, at_out)
            into = None  # the skip terms' gradient into the residual the MLP reads
            norm, weighted = self.mlp_norm[layer], self.site == "norm"
            if self.skips is not None and layer < top:
                into = at_out @ self.skips[layer].T.to(work)  # at the transcoder's input
            del at_out  # ln2_post's transpose: not held past the skip term
            if into is not None and norm is not None:
                into = norm.back(into, weighted)
            attn = self.ln1[layer]
            if self.parallel:  # attention and MLP read the residual before the block
                g = attn.back(self._attention(layer, g)).add_(g)
            if into is not None:  # in place: g is this pass's own tensor
                g.add_(into)
            # the targets at this layer's transcoder input, each at one position
            _inject(g, norm, rows, positions, vectors, layers == layer, weighted)
            if not self.parallel:  # the MLP read hook_resid_mid, the attention reads before it
                g = attn.back(self._attention(layer, g)).add_(g)
        out[:, src.token_start : src.token_start + p] = torch.einsum("bpd,pd->bp", g, src.embed[:p])
        return out


def _read(out: Tensor, src, layer: int, g: Float[Tensor, "batch pos d_model"]) -> None:
    """The columns of the MLP output ``layer``'s sources (its writers and error nodes) from the
    gradient ``g`` there (positions past ``g``'s carry none)."""
    p = g.shape[1]
    src.add_writer_scores(out, layer, g)  # its writers' columns, block by block
    n_pos = src.embed.shape[0]
    start = src.n_features + layer * (n_pos - 1)
    out[:, start : start + p - 1] = torch.einsum("bpd,pd->bp", g[:, 1:], src.errors[layer][: p - 1])
