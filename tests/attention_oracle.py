"""An independent float64 implementation of head loadings and QK attribution for GPT-2 and
Llama checkpoints (no interp code: plain transformers modules, their weights, the transcoders'
tensors), for checking interp.graphs.heads and interp.graphs.qk.

The frozen replacement model is written as dense matrices over the flattened ``[pos d_model]``
stream: each norm a block-diagonal map (its scale from the clean run, recorded by forward hooks
on transformers' modules), each head ``kron(pattern_h, OV_h)``, each transcoder skip a
block-diagonal ``W_skip``. With those:

- an edge is ``in_t · J · out_s``;
- head (l, h)'s loading is ``in_t · D_l · M_lh · N1_l · F_l · out_s`` with ``D_l`` the map from
  the attention's output to the target with every attention layer closed and ``F_l`` the full
  map from the source to layer l's residual stream (module docstring of interp.graphs.heads);
- a node's part of a head's query is ``R_q W_Q,h (N1_l F_l out_s)[q]`` (``R_q`` Llama's rotary
  at position q, written here from its definition), its key's likewise.
"""

from __future__ import annotations

from functools import wraps

import torch
from transformers import AutoModelForCausalLM

__all__ = ["Oracle"]


def _memo(fn):
    """Each dense map computed once per oracle (a per-instance cache)."""

    @wraps(fn)
    def wrapper(self, *args, **kwargs):
        store = self.__dict__.setdefault("_memo", {})
        key = (fn.__name__, args, tuple(sorted(kwargs.items())))
        if key not in store:
            store[key] = fn(self, *args, **kwargs)
        return store[key]

    return wrapper


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Oracle:
    def __init__(self, directory, tokens: torch.Tensor, tc):
        self.hf = AutoModelForCausalLM.from_pretrained(
            directory, attn_implementation="eager", torch_dtype=torch.float64
        ).eval()
        self.tc, self.tokens = tc, tokens
        cfg = self.hf.config
        self.llama = cfg.model_type == "llama"
        self.P, self.d = len(tokens), cfg.hidden_size
        self.H = cfg.num_attention_heads
        self.dh = self.d // self.H
        self.L = cfg.num_hidden_layers
        self._run()

    # ------------------------------------------------------------------ the clean run

    def _parts(self, layer: int):
        if self.llama:
            b = self.hf.model.layers[layer]
            return b.input_layernorm, b.self_attn, b.post_attention_layernorm, b.mlp
        b = self.hf.transformer.h[layer]
        return b.ln_1, b.attn, b.ln_2, b.mlp

    def _final_norm(self):
        return self.hf.model.norm if self.llama else self.hf.transformer.ln_f

    def _run(self) -> None:
        seen: dict = {}

        def keep(name):
            def hook(module, args, out):
                x = args[0][0].detach() if args else None  # norms and MLPs take it positionally
                seen[name] = (x, (out[0] if isinstance(out, tuple) else out))

            return hook

        handles = []
        for layer in range(self.L):
            for name, module in zip(("n1", "attn", "n2", "mlp"), self._parts(layer), strict=True):
                handles.append(module.register_forward_hook(keep(f"{name}{layer}")))
        handles.append(self._final_norm().register_forward_hook(keep("nf")))
        with torch.no_grad():
            out = self.hf(self.tokens[None], output_attentions=True)
        for h in handles:
            h.remove()
        self.patterns = [a[0].detach() for a in out.attentions]  # [head q k]
        self.seen = {k: (v[0], v[1].detach()[0]) for k, v in seen.items()}

    # ------------------------------------------------------------------ dense maps

    def _norm(self, name: str, module) -> torch.Tensor:
        x = self.seen[name][0]  # [pos d]
        d, eye = self.d, torch.eye(self.d, dtype=torch.float64)
        w = module.weight.detach()
        if self.llama:
            scale = (x.pow(2).mean(-1) + module.variance_epsilon).sqrt()
            centre = eye
        else:
            scale = (x.var(-1, unbiased=False) + module.eps).sqrt()
            centre = eye - torch.full((d, d), 1 / d, dtype=torch.float64)
        blocks = [torch.diag(w / s) @ centre for s in scale]
        return torch.block_diag(*blocks)

    @_memo
    def n1(self, layer):
        return self._norm(f"n1{layer}", self._parts(layer)[0])

    @_memo
    def n2(self, layer):
        return self._norm(f"n2{layer}", self._parts(layer)[2])

    @_memo
    def nf(self):
        return self._norm("nf", self._final_norm())

    def _weights(self, layer: int, head: int):
        """(W_Q, W_K, W_V, W_O) of one head as column maps: q = W_Q x, ..., out = W_O z."""
        attn, dh = self._parts(layer)[1], self.dh
        if self.llama:
            group = self.H // self.hf.config.num_key_value_heads
            kv = slice((head // group) * dh, (head // group + 1) * dh)
            mine = slice(head * dh, (head + 1) * dh)
            return (
                attn.q_proj.weight[mine].detach(),
                attn.k_proj.weight[kv].detach(),
                attn.v_proj.weight[kv].detach(),
                attn.o_proj.weight[:, mine].detach(),
            )
        W = attn.c_attn.weight.detach()  # Conv1D [d 3d]: row vectors times W
        cols = [slice(i * self.d + head * dh, i * self.d + (head + 1) * dh) for i in range(3)]
        W_O = attn.c_proj.weight.detach()[head * dh : (head + 1) * dh]  # [dh d]
        return W[:, cols[0]].T, W[:, cols[1]].T, W[:, cols[2]].T, W_O.T

    @_memo
    def head(self, layer: int, head: int) -> torch.Tensor:
        _, _, W_V, W_O = self._weights(layer, head)
        return torch.kron(self.patterns[layer][head], W_O @ W_V)

    @_memo
    def skip(self, layer: int) -> torch.Tensor:
        W = self.tc.W_skip(layer)
        return torch.block_diag(*[W] * self.P)  # x @ W.T per position: W as a column map

    @_memo
    def step(self, layer: int, attention: bool) -> torch.Tensor:
        """The residual stream before ``layer`` to after it (attention closed or open)."""
        eye = torch.eye(self.P * self.d, dtype=torch.float64)
        attn = sum(self.head(layer, h) for h in range(self.H)) @ self.n1(layer)
        mid = eye + attn if attention else eye
        return (eye + self.skip(layer) @ self.n2(layer)) @ mid

    @_memo
    def carry(self, start: int, stop: int, attention: bool = True) -> torch.Tensor:
        """The residual stream before ``start`` to before ``stop``."""
        J = torch.eye(self.P * self.d, dtype=torch.float64)
        for layer in range(start, stop):
            J = self.step(layer, attention) @ J
        return J

    # ------------------------------------------------------------------ nodes

    def _unit(self, pos: int, vec: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(self.P, self.d, dtype=torch.float64)
        out[pos] = vec
        return out.flatten()

    def source(self, node) -> tuple[int, torch.Tensor]:
        """(residual layer it enters before, flattened output vector) of a graph node."""
        tc, pos, layer = self.tc, int(node.pos), int(node.layer)
        if node.kind == "token":
            emb = self.hf.get_input_embeddings().weight[self.tokens[pos]].detach()
            return 0, self._unit(pos, emb)
        x2, y = self.seen[f"n2{layer}"][1][pos], self.seen[f"mlp{layer}"][1][pos]
        a = torch.relu(x2 @ tc.W_enc(layer).T + tc.b_enc(layer))
        if node.kind == "feature":
            return layer + 1, self._unit(pos, a[int(node.feature)] * tc.W_dec(layer)[node.feature])
        recon = a @ tc.W_dec(layer) + tc.b_dec(layer) + x2 @ tc.W_skip(layer).T
        return layer + 1, self._unit(pos, y - recon)

    def target(self, node) -> tuple[torch.Tensor, int]:
        """(the target's read map from the residual stream before layer ``at``, ``at``)."""
        if node.kind == "feature":
            layer = int(node.layer)
            vec = self._unit(int(node.pos), self.tc.W_enc(layer)[int(node.feature)])
            # read at the MLP's input: after the layer's attention
            eye = torch.eye(self.P * self.d, dtype=torch.float64)
            attn = sum(self.head(layer, h) for h in range(self.H)) @ self.n1(layer)
            return vec @ self.n2(layer) @ (eye + attn), layer
        W_U = self.hf.get_output_embeddings().weight.detach().T  # [d vocab]
        col = W_U[:, int(node.token_id)] - W_U.mean(1)
        return self._unit(self.P - 1, col) @ self.nf(), self.L

    # ------------------------------------------------------------------ the decompositions

    def edge(self, target, source) -> float:
        read, at = self.target(target)
        start, vec = self.source(source)
        return float(read @ self.carry(start, at) @ vec) if start <= at else 0.0

    def loadings(self, target, source, by: str = "last") -> dict[tuple[int, int], float]:
        """{(layer, head): loading, (-1, -1): residual part} of one edge; each path given to
        the last head it crosses (``by="last"``) or the first."""
        start, vec = self.source(source)
        feature = target.kind == "feature"
        layer_t = int(target.layer) if feature else self.L
        pos = int(target.pos) if feature else self.P - 1
        if feature:
            tvec = self._unit(pos, self.tc.W_enc(layer_t)[int(target.feature)]) @ self.n2(layer_t)
        else:
            W_U = self.hf.get_output_embeddings().weight.detach().T
            col = W_U[:, int(target.token_id)] - W_U.mean(1)
            tvec = self._unit(pos, col) @ self.nf()
        eye = torch.eye(self.P * self.d, dtype=torch.float64)
        later_open = by == "first"  # after the chosen head: every path, or none with a head
        read = tvec  # from the stream before the target's layer
        if feature and later_open:
            read = tvec @ (
                eye + sum(self.head(layer_t, h) for h in range(self.H)) @ self.n1(layer_t)
            )
        out = {}
        if start <= layer_t:
            out[-1, -1] = float(tvec @ self.carry(start, layer_t, attention=False) @ vec)
        for layer in range(start, layer_t + 1 if feature else self.L):
            # from the attention's output (added to the stream) to the target
            if feature and layer == layer_t:
                D = tvec
            else:
                rest = eye + self.skip(layer) @ self.n2(layer)
                D = read @ self.carry(layer + 1, layer_t, attention=later_open) @ rest
            F = self.n1(layer) @ self.carry(start, layer, attention=not later_open) @ vec
            for h in range(self.H):
                out[layer, h] = float(D @ self.head(layer, h) @ F)
        return out

    def rotary(self, pos: int) -> torch.Tensor:
        """Llama's rotary at ``pos`` as a [dh dh] matrix (the identity for GPT-2)."""
        eye = torch.eye(self.dh, dtype=torch.float64)
        if not self.llama:
            return eye
        theta = getattr(self.hf.config, "rope_theta", None) or 10000.0
        inv = 1.0 / theta ** (torch.arange(0, self.dh, 2, dtype=torch.float64) / self.dh)
        angle = torch.cat([pos * inv, pos * inv])
        return torch.cos(angle)[:, None] * eye + torch.sin(angle)[:, None] * _rotate_half(eye.T).T

    def qk_parts(self, layer, head, query_pos, key_pos, nodes):
        """Query and key items ``[node + (other, constant, bias), dh]`` as interp orders them."""
        W_Q, W_K, _, _ = self._weights(layer, head)
        attn, dh = self._parts(layer)[1], self.dh
        if self.llama:
            b_Q = b_K = torch.zeros(dh, dtype=torch.float64)
        else:
            b = attn.c_attn.bias.detach()
            b_Q = b[head * dh : (head + 1) * dh]
            b_K = b[self.d + head * dh : self.d + (head + 1) * dh]
        x1 = self.seen[f"n1{layer}"][1]  # the attention's input [pos d]
        sides = []
        for W, bias, pos in ((W_Q, b_Q, query_pos), (W_K, b_K, key_pos)):
            R = self.rotary(pos)
            items = torch.zeros(len(nodes) + 3, dh, dtype=torch.float64)
            to_x = {s: self.n1(layer) @ self.carry(s, layer) for s in range(layer + 1)}
            for i, node in enumerate(nodes.itertuples()):
                if node.kind == "logit":
                    continue
                start, vec = self.source(node)
                if start > layer:
                    continue
                x = (to_x[start] @ vec).view(self.P, self.d)[pos]
                items[i] = R @ W @ x
            items[-2] = R @ W @ x1[pos] - items.sum(0)  # constant (other is zero: all nodes)
            items[-1] = R @ bias
            sides.append(items)
        return sides[0], sides[1], dh**-0.5
