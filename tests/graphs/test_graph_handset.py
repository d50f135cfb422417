"""A hand-set model and transcoders whose feature path is known: at the last position, feature
F0 of layer 0 fires on the prompt's last token and writes a large direction ``u``; feature F1 of
layer 1 reads ``u`` and writes the unembedding direction of one token. Each model MLP computes
``gelu(h) d`` for its one feature (``h`` the feature's pre-activation, ``d`` its decoder row), so
the transcoders' errors are small (the distractor features, which fire too, have small
decoders the model does not compute). The pruned graph is the path: tokens -> F0 -> F1 -> that
logit, with no other feature.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoTokenizer

from interp import attribution_graph, load_model
from interp.transcoders.transcoder import TranscoderSet

TOKENS = torch.tensor([0, 11, 23, 35, 47, 59])
GAIN = 20.0  # pre-activation of a firing feature: GAIN / 2 = 10 (gelu(10) = relu(10) to 1e-20)
D_TC = 8  # features 1..7: distractors, firing where they like with small decoders


def _mlp_input(hf, layer: int) -> torch.Tensor:
    seen = {}
    handle = hf.transformer.h[layer].mlp.register_forward_pre_hook(
        lambda module, args: seen.update(x=args[0].detach())
    )
    with torch.no_grad():
        hf(TOKENS[None])
    handle.remove()
    return seen["x"][0]  # [pos d_model]


def _set_feature(hf, layer: int, enc: torch.Tensor, bias: float, dec: torch.Tensor) -> None:
    mlp = hf.transformer.h[layer].mlp
    with torch.no_grad():
        mlp.c_fc.weight.zero_()  # Conv1D [d_model d_mlp]
        mlp.c_fc.bias.fill_(-100.0)  # gelu(-100) = 0: every other hidden unit silent
        mlp.c_fc.weight[:, 0] = enc
        mlp.c_fc.bias[0] = bias
        mlp.c_proj.weight.zero_()
        mlp.c_proj.bias.zero_()
        mlp.c_proj.weight[0] = dec


@pytest.mark.slow
def test_pruned_graph_is_the_known_path(zoo, tmp_path):
    hf = copy.deepcopy(zoo.hf("gpt2"))
    d_model, q = hf.config.n_embd, len(TOKENS) - 1
    gen = torch.Generator().manual_seed(0)
    target = 123  # the token the path promotes
    W_U = hf.lm_head.weight.detach().T  # [d_model d_vocab]
    encs, biases, decs = [], [], []
    for layer in range(2):
        x = _mlp_input(hf, layer)
        enc = GAIN * x[q] / x[q].pow(2).sum()  # reads the last position's input: h = GAIN there
        if layer == 0:
            dec = torch.randn(d_model, generator=gen)
            dec = 30 * dec / dec.norm()  # u: large, so layer 1's input at q is mostly u
        else:
            dec = W_U[:, target] - W_U.mean(1)
            dec = 60 * dec / dec.norm()
        _set_feature(hf, layer, enc, -GAIN / 2, dec)
        encs.append(enc)
        biases.append(-GAIN / 2)
        decs.append(dec)
    hf.save_pretrained(tmp_path / "model")
    # the zoo's tokenizer beside the hand-set weights
    AutoTokenizer.from_pretrained(zoo.directory("gpt2")).save_pretrained(tmp_path / "model")
    model = load_model(tmp_path / "model", device="cpu")

    def with_distractors(vector, scale):  # the model's MLP does not compute them: small errors
        return torch.cat([vector[None], scale * torch.randn(D_TC - 1, d_model, generator=gen)])

    tc = TranscoderSet(
        [with_distractors(e, d_model**-0.5) for e in encs],
        [torch.tensor([b] + [0.0] * (D_TC - 1)) for b in biases],
        [with_distractors(d, 0.05) for d in decs],
        [torch.zeros(d_model)] * 2,
        name="hand-set",
    )
    g = attribution_graph(model, TOKENS, tc)
    feats = g.nodes[g.nodes.kind == "feature"][["layer", "pos", "feature"]].to_numpy().tolist()
    assert [0, q, 0] in feats and [1, q, 0] in feats and len(feats) > 10  # distractors fire
    assert int(g.logit_token_ids[0]) == target and float(g.logit_probabilities[0]) > 0.5

    p = g.prune()
    kept = p.nodes
    assert kept[kept.kind == "feature"][["layer", "pos", "feature"]].to_numpy().tolist() == [
        [0, q, 0],
        [1, q, 0],
    ]
    f0, f1 = 0, 1  # features come first, in (layer, pos, feature) order
    logit = int((kept.kind == "logit").to_numpy().nonzero()[0][0])
    assert p.kept_edges[f1, f0] and p.kept_edges[logit, f1]
    assert p.adjacency[f1, f0] > 0 and p.adjacency[logit, f1] > 0
    # the path carries the logit: F1's edge is its largest input, F0's is F1's
    assert p.adjacency[logit].abs().argmax() == f1
    assert g.adjacency[p.kept_nodes[f1]].abs().argmax() == p.kept_nodes[f0]
