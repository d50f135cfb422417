"""The attribution graph's identities on every zoo architecture, per-layer (with skip) and
cross-layer transcoders, in float64 (tests/frozen_model.py runs the frozen model forwards):

- intervention: taking one source's output vector out of the frozen replacement model moves
  every target (a feature's pre-activation less ``b_enc``, a logit's demeaned raw logit) by
  exactly ``-A[:, s]``, for every feature, error and token source;
- completeness: taking every source out moves each target by its whole row sum, so the row
  plus the constants (biases, positional embeddings, ``b_dec``, position 0's MLP outputs)
  is the target's value.

Transcoders read ``mlp.hook_in`` and, where the model has it, ``ln2.hook_normalized``.
"""

from __future__ import annotations

import pytest
import torch

from interp import attribution_graph, load_model
from tests.frozen_model import FrozenModel
from tests.transcoder_folders import random_transcoders
from tests.zoo import RMSNORM_ARCHS, ZOO_ARCHS

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17])
# float64 through two layers: rounding ~1e-15 of values of a few units; a wrong edge (a missed
# path, a norm not frozen) is off by 1e-2 or more
RTOL = 1e-9
_models: dict = {}


def _model(zoo, arch):
    if arch not in _models:  # a float64 copy of the zoo checkpoint, loaded once per module
        _models[arch] = load_model(zoo.directory(arch), device="cpu", dtype=torch.float64)
    return _models[arch]


def _targets(fm: FrozenModel, g, xs, final) -> torch.Tensor:
    """Every feature's and logit's value ``[rows target]`` in a frozen run."""
    nodes = g.nodes
    feats = nodes[nodes.kind == "feature"]
    values = [
        xs[int(r.layer)][:, int(r.pos)] @ fm.tc.W_enc(int(r.layer))[int(r.feature)]
        for r in feats.itertuples()
    ]
    W_U = fm.model.W_U.detach()
    vecs = (W_U[:, g.logit_token_ids] - W_U.mean(dim=1, keepdim=True)).T
    return torch.cat([torch.stack(values, dim=1), final[:, -1] @ vecs.T], dim=1)


def _sources(fm: FrozenModel, g) -> tuple[torch.Tensor, torch.Tensor]:
    """One row per source node (adjacency order, logits excluded): what its removal takes out."""
    n_pos = len(TOKENS)
    sources = g.nodes[g.nodes.kind != "logit"]
    removed = torch.zeros(len(sources), fm.n_layers, n_pos, fm.tc.d_model, dtype=torch.float64)
    keep = torch.ones(len(sources), n_pos, dtype=torch.float64)
    for row, node in enumerate(sources.itertuples()):
        layer, pos = int(node.layer), int(node.pos)
        if node.kind == "feature":
            for j, vec in fm.feature_vectors(layer, pos, int(node.feature)).items():
                removed[row, j, pos] = vec
        elif node.kind == "error":
            removed[row, layer, pos] = fm.error(layer)[pos]
        else:
            keep[row, pos] = 0
    return removed, keep


# ln2.hook_normalized -> hook_mlp_out (SAELens's GPT-2 transcoders, Gemma Scope's in
# circuit-tracer: the MLP's norm before its weight and bias; on Gemma 2 hook_mlp_out is after the
# post-MLP norm) where the model has it as [batch pos d_model]: not GPT-J, Phi (one norm), OPT
NORMALIZED_ARCHS = tuple(a for a in ZOO_ARCHS if a not in ("gptj", "phi", "opt"))
NORMALIZED = ("ln2.hook_normalized", "hook_mlp_out")
CASES = [
    (a, k, ("mlp.hook_in", "mlp.hook_out")) for a in ZOO_ARCHS for k in ("per-layer", "cross-layer")
]
CASES += [(arch, "per-layer", NORMALIZED) for arch in NORMALIZED_ARCHS]
CASES += [("gpt2", "cross-layer", NORMALIZED), ("gemma2", "cross-layer", NORMALIZED)]


@pytest.mark.slow
@pytest.mark.parametrize("arch,kind,hooks", CASES)
def test_intervention_and_completeness(zoo, arch, kind, hooks):
    model = _model(zoo, arch)
    tc = random_transcoders(
        model, kind=kind, skip=kind == "per-layer", d_tc=24, seed=3, input_hook=hooks[0],
        output_hook=hooks[1],
    )  # fmt: skip
    tc = tc.to(dtype=torch.float64)
    g = attribution_graph(model, TOKENS, tc)
    assert g.info["backward"] == "one-copy"  # every zoo architecture, Gemma 2 included
    assert g.adjacency.dtype == torch.float64
    fm = FrozenModel(model, TOKENS, tc)
    targets = torch.nonzero(torch.tensor(g.nodes.kind.isin(["feature", "logit"]).to_numpy()))
    targets = targets.flatten()
    A = g.adjacency[targets]  # [target node]
    scale = A.abs().max()

    # the frozen run with nothing taken out is the clean run
    n_pos, n_layers = len(TOKENS), tc.n_layers
    nothing = torch.zeros(1, n_layers, n_pos, tc.d_model, dtype=torch.float64)
    xs, final = fm.run(nothing, torch.ones(1, n_pos, dtype=torch.float64))
    # transformers' RMSNorms normalise in float32 even in a float64 model: the clean run is
    # float32-accurate there (~1e-6), the frozen one (its scales given) float64
    # (and GPT-J's attention upcasts q, k and the pattern to float32)
    in_float32 = arch in RMSNORM_ARCHS or arch == "gptj"
    same = 1e-5 if in_float32 else 1e-10
    rtol = 1e-5 if in_float32 else RTOL  # the same float32 rounding in the edges
    for layer in range(n_layers):
        torch.testing.assert_close(xs[layer][0], fm.xs[layer], rtol=0, atol=same)
    base = _targets(fm, g, xs, final)[0]

    removed, keep = _sources(fm, g)
    xs, final = fm.run(removed, keep)
    moved = _targets(fm, g, xs, final) - base  # [source target]
    n_src = removed.shape[0]
    torch.testing.assert_close(moved.T, -A[:, :n_src], rtol=0, atol=rtol * scale)

    # every source out at once (position 0's features and errors stay: they are constants)
    xs, final = fm.run(removed.sum(0, keepdim=True), torch.zeros(1, n_pos, dtype=torch.float64))
    whole = base - _targets(fm, g, xs, final)[0]
    torch.testing.assert_close(whole, A.sum(1), rtol=0, atol=rtol * scale * A.shape[1])
    assert (A[:, :n_src] != 0).any(1).float().mean() > 0.5  # the rows are not empty
