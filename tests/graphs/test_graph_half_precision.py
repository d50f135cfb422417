"""The attribution graph of a half-precision model (bfloat16, float16) against the float32 graph
of the same weights (the float32 model's weights rounded to the half dtype): the same nodes but
for features at the edge of firing, and entries within a tolerance derived from the dtype's unit
roundoff and the model's depth. The graph itself is float32 (its rows, adjacency, influence and
pruning); the passes it reads run in the model's dtype.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from interp import attribution_graph, load_model
from tests.transcoder_folders import random_transcoders

TOKENS = torch.tensor([0, 5, 17, 33, 99, 12, 7, 5, 17, 40, 41])
# Each rounding of a vector to the half dtype moves it by at most u = eps / 2 of itself. A graph
# entry reads the forward's activations (source vectors, frozen patterns and norm scales) and a
# backward pass's gradient, each rounded about ROUNDINGS times per layer (norm, q/k/v, the
# pattern's mix, the attention's output, the residual's add, norm, MLP in and out, the add),
# and once more at the embedding and the unembedding: worst case, the errors add up to
# ROUNDINGS * (n_layers + 1) * u of the largest entry (bfloat16, 2 layers: 0.117; float16:
# 0.015). Measured: 0.0065-0.033 (bfloat16), 0.001-0.0054 (float16) on gpt2, llama, gpt_neox.
ROUNDINGS = 10


def half_tolerance(dtype: torch.dtype, n_layers: int) -> float:
    """The bound above, relative to the largest entry of the float32 graph."""
    return ROUNDINGS * (n_layers + 1) * torch.finfo(dtype).eps / 2


def _keys(nodes) -> list[tuple]:
    return list(nodes[["kind", "layer", "pos", "feature", "token_id"]].itertuples(index=False))


def check_half_graph(directory, dtype: torch.dtype, tamper=None, **tc_options) -> None:
    """The graph of the model at ``directory`` loaded in ``dtype`` against the float32 graph of
    its rounded weights (module docstring); ``tamper(model)`` changes the half model first."""
    half = load_model(directory, device="cpu", dtype=dtype)
    if tamper is not None:
        tamper(half)
    rounded = load_model(directory, device="cpu", dtype=torch.float32)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.to(dtype).float())
    tc = random_transcoders(rounded, skip=True, seed=3, **tc_options)
    g_half, g_32 = attribution_graph(half, TOKENS, tc), attribution_graph(rounded, TOKENS, tc)
    assert g_half.adjacency.dtype == torch.float32  # the graph is float32 whatever the model
    n_layers = int(half.cfg.n_layers)
    rtol = half_tolerance(dtype, n_layers)
    k_half, k_32 = _keys(g_half.nodes), _keys(g_32.nodes)
    both = set(k_half) & set(k_32)
    common = [k for k in k_32 if k in both]
    at_half = torch.tensor([k_half.index(k) for k in common])
    at_32 = torch.tensor([k_32.index(k) for k in common])
    a_half = g_half.adjacency[at_half][:, at_half]
    a_32 = g_32.adjacency[at_32][:, at_32]
    scale = float(a_32.abs().max())
    worst = float((a_half - a_32).abs().max())
    assert worst <= rtol * scale, f"off by {worst / scale:.4f} of the largest entry, > {rtol:.4f}"
    # the same logits; features that fire in one graph only sit at the edge of firing: their
    # activation is within the bound of the largest activation
    assert g_half.logit_token_ids.tolist() == g_32.logit_token_ids.tolist()
    for graph, keys in ((g_half, k_half), (g_32, k_32)):
        acts = graph.nodes.activation.to_numpy()
        alone = [i for i, k in enumerate(keys) if k not in both]
        edge = rtol * np.nanmax(acts)
        assert all(acts[i] <= edge for i in alone), ([keys[i] for i in alone], acts[alone])
    assert len(both) >= 0.95 * len(k_32)
    torch.testing.assert_close(
        g_half.logit_probabilities, g_32.logit_probabilities, rtol=0, atol=rtol
    )


@pytest.mark.parametrize(
    "arch,dtype",
    [
        ("gpt2", torch.bfloat16),
        ("gpt2", torch.float16),
        ("llama", torch.bfloat16),  # RMSNorm, grouped query heads, rotary
    ],
)
def test_a_half_precision_graph_is_the_float32_graph_of_its_weights(zoo, arch, dtype):
    check_half_graph(zoo.directory(arch), dtype)


def _zero_head(model, head: int = 1) -> None:
    """GPT-2's layer 0 without one head: its rows of the output projection zeroed."""
    d_head = int(model.cfg.d_head)
    proj = model.original_model.transformer.h[0].attn.c_proj.weight  # Conv1D [in out]
    with torch.no_grad():
        proj[head * d_head : (head + 1) * d_head] = 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_tolerance_catches_a_missing_head(zoo, dtype):
    # the check is not vacuous: the half model with one of layer 0's 4 heads removed is not
    # the float32 graph of its weights within the bound
    with pytest.raises(AssertionError, match="off by"):
        check_half_graph(zoo.directory("gpt2"), dtype, tamper=_zero_head)
