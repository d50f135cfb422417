"""The frozen replacement model run forwards, for checking attribution graphs (no interp code:
TransformerLens hooks on the bridge, the transcoders' weights read directly).

``FrozenModel(model, tokens, tc)`` runs the prompt once and keeps every attention pattern, norm
scale, transcoder input and output and the token embeddings. :meth:`FrozenModel.run` then runs
the prompt with every pattern and scale replaced by its clean value and each MLP output by
``skip(x) + (clean output - clean skip) - removed`` (``x`` this run's transcoder input), the
token embeddings scaled by ``keep_tokens``: a forward pass of the local replacement model in
which ``removed`` takes chosen nodes' output vectors out. Its targets are each feature's
pre-activation less ``b_enc`` and each logit's demeaned raw logit, computed in the test from
what the run records.
"""

from __future__ import annotations

import torch

__all__ = ["FrozenModel"]


class FrozenModel:
    def __init__(self, model, tokens: torch.Tensor, tc):
        self.model, self.tc, self.tokens = model, tc, tokens
        self.n_layers = tc.n_layers
        _, cache = model.run_with_cache(tokens[None])
        self.cache = {k: v.detach() for k, v in cache.items()}
        self.xs = [self.cache[tc.input_hook(lay)][0] for lay in range(self.n_layers)]
        self.ys = [self.cache[tc.output_hook(lay)][0] for lay in range(self.n_layers)]
        self.acts = []
        for layer, x in enumerate(self.xs):
            h = x @ tc.W_enc(layer).T + tc.b_enc(layer)
            self.acts.append(tc.activate(h, layer))

    def skip(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        W = self.tc.W_skip(layer)
        return torch.zeros_like(x) if W is None else x @ W.T

    def feature_vectors(self, layer: int, pos: int, feature: int) -> dict[int, torch.Tensor]:
        """``{output layer: vector}`` of one feature (every later layer for a CLT)."""
        a = self.acts[layer][pos, feature]
        if self.tc.kind == "per-layer":
            return {layer: a * self.tc.W_dec(layer)[feature]}
        W = self.tc.W_dec(layer)
        return {j: a * W[feature, j - layer] for j in range(layer, self.n_layers)}

    def error(self, layer: int) -> torch.Tensor:
        """The MLP output less the reconstruction from every active feature ``[pos d_model]``
        (features at position 0 included: the graph's errors there are not nodes)."""
        tc = self.tc
        if tc.kind == "per-layer":
            recon = self.acts[layer] @ tc.W_dec(layer) + tc.b_dec(layer)
        else:
            recon = tc.b_dec(layer) + sum(
                self.acts[s] @ tc.W_dec(s)[:, layer - s] for s in range(layer + 1)
            )
        return self.ys[layer] - recon - self.skip(self.xs[layer], layer)

    def run(
        self,
        removed: torch.Tensor,
        keep_tokens: torch.Tensor,
        *,
        free: tuple[str, ...] = (),
        record: tuple[str, ...] = (),
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """``removed [rows layer pos d_model]``, ``keep_tokens [rows pos]`` -> each layer's
        transcoder input ``[rows pos d_model]`` and the final norm's output. Hooks named in
        ``free`` are left to compute (a layer's ``hook_q`` and ``hook_k``: its scores follow
        the run); those in ``record`` are kept in ``self.recorded``."""
        rows = removed.shape[0]
        cache, tc, got = self.cache, self.tc, {}

        def frozen(name):  # the clean value in every row (some hooks see rows x pos flattened)
            value = cache[name]
            return lambda act, hook: value.reshape(1, -1).expand(rows, -1).reshape(act.shape)

        hooks = [
            (name, frozen(name))
            for name in cache
            # q and k too: some bridges ignore an edited hook_pattern (GPT-J, OPT, Gemma 2)
            if name.endswith((".hook_scale", "attn.hook_pattern", "attn.hook_q", "attn.hook_k"))
            and name not in free
        ]
        self.recorded = {}
        for name in record:
            hooks.append((name, lambda act, hook: self.recorded.__setitem__(hook.name, act)))

        def embed(act, hook):
            return cache["hook_embed"] * keep_tokens[..., None].to(act.dtype)

        def read(layer):
            def hook(act, hook):
                got[layer] = act

            return hook

        def write(layer):
            def hook(act, hook):
                const = self.ys[layer] - self.skip(self.xs[layer], layer)
                return self.skip(got[layer], layer) + const - removed[:, layer]

            return hook

        def final(act, hook):
            got["final"] = act

        hooks.append(("hook_embed", embed))
        for layer in range(self.n_layers):
            hooks += [(tc.input_hook(layer), read(layer)), (tc.output_hook(layer), write(layer))]
        hooks.append(("unembed.hook_in", final))
        with torch.no_grad():
            self.model.run_with_hooks(self.tokens[None].expand(rows, -1), fwd_hooks=hooks)
        return [got[lay] for lay in range(self.n_layers)], got["final"]
