"""The attribution graph of a GPT-2 against an independent float64 implementation written here
(no interp code): the model from its transformers weights, the transcoders from their tensors,
and the frozen replacement model (patterns and LayerNorm scales fixed, MLP outputs constant
but for the skip term) run forwards on every source's output vector.
"""

from __future__ import annotations

import math

import pytest
import torch

from interp import attribution_graph
from tests.transcoder_folders import random_transcoders

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17, 40, 41])
# interp runs the model in float32: entries carry float32 rounding through two layers
# (~1e-7 of the largest); a missed path or a norm left unfrozen is off by 1e-2 or more
RTOL = 1e-5


def _gelu_new(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


class Reference:
    """GPT-2 in float64 from a transformers ``GPT2LMHeadModel``."""

    def __init__(self, hf):
        sd = {k: v.detach().double() for k, v in hf.state_dict().items()}
        self.sd, self.cfg = sd, hf.config
        self.n_layers, self.n_heads = hf.config.n_layer, hf.config.n_head
        self.d = hf.config.n_embd
        self.W_U = sd["lm_head.weight"].T  # [d_model d_vocab]

    def ln(self, x, name, scale=None):
        w, b = self.sd[f"{name}.weight"], self.sd[f"{name}.bias"]
        centred = x - x.mean(-1, keepdim=True)
        if scale is None:  # the real norm; return its scale too
            scale = (centred.pow(2).mean(-1, keepdim=True) + self.cfg.layer_norm_epsilon).sqrt()
            return centred / scale * w + b, scale
        return centred / scale * w  # frozen: linear, no bias

    def heads(self, a, layer):
        W = self.sd[f"transformer.h.{layer}.attn.c_attn.weight"]  # [d 3d]
        b = self.sd[f"transformer.h.{layer}.attn.c_attn.bias"]
        return [t.unflatten(-1, (self.n_heads, -1)) for t in (a @ W + b).split(self.d, -1)]

    def forward(self, tokens):
        sd, n = self.sd, len(tokens)
        x = sd["transformer.wte.weight"][tokens] + sd["transformer.wpe.weight"][:n]
        keep = {"embed": sd["transformer.wte.weight"][tokens], "pattern": [], "s1": [], "s2": []}
        keep |= {"mlp_in": [], "mlp_out": []}
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        for layer in range(self.n_layers):
            h = f"transformer.h.{layer}"
            a, s1 = self.ln(x, f"{h}.ln_1")
            q, k, v = self.heads(a, layer)
            scores = torch.einsum("qhe,khe->hqk", q, k) / math.sqrt(q.shape[-1])
            pattern = scores.masked_fill(~mask, float("-inf")).softmax(-1)
            z = torch.einsum("hqk,khe->qhe", pattern, v).flatten(-2)
            x = x + z @ sd[f"{h}.attn.c_proj.weight"] + sd[f"{h}.attn.c_proj.bias"]
            m, s2 = self.ln(x, f"{h}.ln_2")
            hidden = _gelu_new(m @ sd[f"{h}.mlp.c_fc.weight"] + sd[f"{h}.mlp.c_fc.bias"])
            y = hidden @ sd[f"{h}.mlp.c_proj.weight"] + sd[f"{h}.mlp.c_proj.bias"]
            x = x + y
            for key, value in (("pattern", pattern), ("s1", s1), ("s2", s2), ("mlp_in", m)):
                keep[key].append(value)
            keep["mlp_out"].append(y)
        final, keep["sf"] = self.ln(x, "transformer.ln_f")
        keep["logits"] = final[-1] @ self.W_U
        return keep

    def frozen(self, run, embed, mlp_delta, skips):
        """Deltas at every transcoder input ``[S layer pos d]`` and the final norm's output
        ``[S pos d]`` from token-embedding deltas ``[S pos d]`` and MLP-output deltas."""
        sd, r, ins = self.sd, embed, []
        for layer in range(self.n_layers):
            h = f"transformer.h.{layer}"
            a = self.ln(r, f"{h}.ln_1", run["s1"][layer])
            W = sd[f"{h}.attn.c_attn.weight"][:, 2 * self.d :]  # values only: patterns fixed
            v = (a @ W).unflatten(-1, (self.n_heads, -1))
            z = torch.einsum("hqk,skhe->sqhe", run["pattern"][layer], v).flatten(-2)
            r = r + z @ sd[f"{h}.attn.c_proj.weight"]
            m = self.ln(r, f"{h}.ln_2", run["s2"][layer])
            ins.append(m)
            r = r + mlp_delta[:, layer] + m @ skips[layer].double().T
        return torch.stack(ins, 1), self.ln(r, "transformer.ln_f", run["sf"])


@pytest.mark.slow
def test_entries_equal_an_independent_float64_implementation(zoo):
    model, ref = zoo.model("gpt2"), Reference(zoo.hf("gpt2"))
    tc = random_transcoders(model, skip=True, d_tc=32, seed=5)
    g = attribution_graph(model, TOKENS, tc)
    run = ref.forward(TOKENS)
    n_layers, n_pos, d = ref.n_layers, len(TOKENS), ref.d
    enc = [tc.W_enc(lay).double() for lay in range(n_layers)]
    dec = [tc.W_dec(lay).double() for lay in range(n_layers)]
    skips = [tc.W_skip(lay) for lay in range(n_layers)]
    feats = []  # (layer, pos, feature, activation), position 0 excluded
    errors = []
    for layer in range(n_layers):
        m = run["mlp_in"][layer]
        acts = torch.relu(m @ enc[layer].T + tc.b_enc(layer).double())
        recon = acts @ dec[layer] + tc.b_dec(layer).double() + m @ skips[layer].double().T
        errors.append(run["mlp_out"][layer] - recon)
        for p, f in torch.nonzero(acts[1:]).tolist():
            feats.append((layer, p + 1, f, acts[p + 1, f]))
    nodes = g.nodes
    ours = nodes[nodes.kind == "feature"][["layer", "pos", "feature"]].to_numpy().tolist()
    assert ours == [[lay, p, f] for lay, p, f, _ in feats]
    probs = run["logits"].softmax(-1)
    top = probs.topk(len(g.logit_token_ids))
    assert torch.equal(top.indices, g.logit_token_ids)
    torch.testing.assert_close(top.values.float(), g.logit_probabilities, rtol=1e-5, atol=1e-6)

    # one row of deltas per source node, in the graph's column order
    n_src = len(feats) + n_layers * (n_pos - 1) + n_pos
    embed = torch.zeros(n_src, n_pos, d, dtype=torch.float64)
    mlp = torch.zeros(n_src, n_layers, n_pos, d, dtype=torch.float64)
    for row, (layer, p, f, a) in enumerate(feats):
        mlp[row, layer, p] = a * dec[layer][f]
    row = len(feats)
    for layer in range(n_layers):
        for p in range(1, n_pos):
            mlp[row, layer, p] = errors[layer][p]
            row += 1
    for p in range(n_pos):
        embed[row, p] = run["embed"][p]
        row += 1
    ins, final = ref.frozen(run, embed, mlp, skips)
    want = torch.zeros(len(feats) + len(g.logit_token_ids), n_src, dtype=torch.float64)
    for t, (layer, p, f, _) in enumerate(feats):
        want[t] = ins[:, layer, p] @ enc[layer][f]
    vecs = ref.W_U[:, g.logit_token_ids] - ref.W_U.mean(1, keepdim=True)
    want[len(feats) :] = (final[:, -1] @ vecs).T
    rows = torch.cat(
        [torch.arange(len(feats)), torch.arange(len(nodes) - vecs.shape[1], len(nodes))]
    )
    got = g.adjacency[rows][:, :n_src].double()
    scale = want.abs().max()
    torch.testing.assert_close(got, want, rtol=0, atol=RTOL * scale)
    assert (want.abs() > 1e-3 * scale).any(1).all()  # every row has inputs: the check bites
