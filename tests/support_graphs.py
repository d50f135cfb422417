"""The transcoder and attribution-graph checks of tests/support.py: ``transcoder splice`` and
``attribution graph``.

- ``transcoder splice``: random per-layer ReLU transcoders with skip (tests/transcoder_folders.py)
  spliced with ``run_cached(..., transcoders=tc)``: with error terms the logits are
  transformers' own; without, every MLP output equals the transcoders' reconstruction from the
  run's own MLP input, computed here from the weights.
- ``attribution graph``: the graph of those transcoders; taking a few sources (features of
  each layer, an error node, a token) out of the frozen replacement model run forwards
  (tests/frozen_model.py) moves every target by ``-A[:, s]`` (float32: 1e-4 of the largest).

Models without MLPs are refused in one line (``check_transcoders_fit``). Imported by
tests/support.py after the helpers it uses; import that module, not this one.
"""

from __future__ import annotations

import torch

from tests.support import ATOL_LOGITS, Case, _close, _reference_logits, _tokens

RTOL_GRAPH = 1e-4  # float32 forward differences against float32 gradients, 2 layers


def _transcoders(case: Case):
    from interp.transcoders.loading import check_transcoders_fit
    from tests.transcoder_folders import random_transcoders

    tc = random_transcoders(case.model, skip=True, d_tc=32, seed=0)
    check_transcoders_fit(case.model, tc)  # refuses a model without MLPs
    return tc.to(device=case.model.cfg.device)


def check_transcoder_splice(case: Case) -> None:
    from interp import run_cached

    tc = _transcoders(case)
    tokens = _tokens(case)
    spliced = run_cached(case.model, tokens, transcoders=tc)
    _close(spliced.logits, _reference_logits(case, tokens), ATOL_LOGITS, "spliced logits")
    hooks = [tc.input_hook(lay) for lay in range(tc.n_layers)]
    hooks += [tc.output_hook(lay) for lay in range(tc.n_layers)]
    own = run_cached(case.model, tokens, transcoders=tc, use_error_term=False, hooks=hooks)
    for layer in range(tc.n_layers):
        x = own[tc.input_hook(layer)]
        f = torch.relu(x @ tc.W_enc(layer).T + tc.b_enc(layer))
        if not (f > 0).any():
            raise AssertionError("no feature fires: the check would be trivial")
        want = f @ tc.W_dec(layer) + tc.b_dec(layer) + x @ tc.W_skip(layer).T
        _close(own[tc.output_hook(layer)], want, 1e-4, f"layer {layer}'s reconstruction")


def check_attribution_graph(case: Case) -> None:
    from interp import attribution_graph

    tc = _transcoders(case)
    tokens = _tokens(case, 8)[0]
    check_graph_identity(case.model, tokens, tc, attribution_graph(case.model, tokens, tc))


def check_graph_identity(model, tokens: torch.Tensor, tc, g) -> None:
    """Taking a few sources of graph ``g`` (of ``tokens`` through ``tc``: a feature of layers 0
    and 1, an error node, a token) out of the frozen replacement model moves every target by
    ``-A[:, s]``, within ``RTOL_GRAPH`` of max|A| (float32 models)."""
    from tests.frozen_model import FrozenModel

    fm = FrozenModel(model, tokens, tc)
    nodes = g.nodes
    picks = [
        int(nodes[(nodes.kind == "feature") & (nodes.layer == lay)].index[0]) for lay in (0, 1)
    ]
    picks += [
        int(nodes[nodes.kind == "error"].index[-1]),
        int(nodes[nodes.kind == "token"].index[3]),
    ]
    n_pos, d = len(tokens), tc.d_model
    removed = torch.zeros(len(picks) + 1, tc.n_layers, n_pos, d)
    keep = torch.ones(len(picks) + 1, n_pos)
    for row, index in enumerate(picks, start=1):
        node = nodes.iloc[index]
        layer, pos = int(node.layer), int(node.pos)
        if node.kind == "feature":
            for j, vec in fm.feature_vectors(layer, pos, int(node.feature)).items():
                removed[row, j, pos] = vec
        elif node.kind == "error":
            removed[row, layer, pos] = fm.error(layer)[pos]
        else:
            keep[row, pos] = 0
    xs, final = fm.run(removed.to(model.cfg.device), keep.to(model.cfg.device))
    feats = nodes[nodes.kind == "feature"]
    values = torch.stack(
        [
            xs[int(r.layer)][:, int(r.pos)] @ tc.W_enc(int(r.layer))[int(r.feature)]
            for r in feats.itertuples()
        ],
        dim=1,
    )
    W_U = model.W_U.detach()
    vecs = (W_U[:, g.logit_token_ids] - W_U.mean(1, keepdim=True)).T
    values = torch.cat([values, final[:, -1] @ vecs.T], dim=1).cpu()
    moved = values[1:] - values[:1]  # [pick target]
    targets = torch.tensor(nodes.kind.isin(["feature", "logit"]).to_numpy())
    A = g.adjacency[targets][:, picks]
    error = float((moved.T + A).abs().max())
    scale = float(g.adjacency.abs().max())
    if not error <= RTOL_GRAPH * scale:
        raise AssertionError(f"removing a source moved the targets off -A by {error:.3g}")
