"""Transcoders reading ``blocks.L.ln2.hook_normalized``: the MLP's norm before its weight and bias
(what a HookedTransformer with ``fold_ln`` hands its MLP; SAELens's GPT-2 transcoders read it).

On every zoo architecture that has it as ``[batch pos d_model]`` the hook is the norm's input
centred (LayerNorm) and divided by its root mean square, computed here from ``ln2.hook_in``; a
splice with error terms is the plain model, without them each MLP output is the reconstruction
of that value. GPT-J and Phi (one norm per parallel block) and OPT (whose bridge flattens batch
and position inside the MLP's norm) are refused in one line before any run.
SAELens itself: experiments/transcoders_vs_saelens_normalized.py."""

from __future__ import annotations

import pytest
import torch

from interp import feature_intervention, load_model, load_transcoders, run_cached
from interp.transcoders.loading import TranscoderFitError, check_transcoders_fit
from tests.graphs.test_graph_half_precision import check_half_graph
from tests.transcoder_folders import random_transcoders, write_raw_folder
from tests.transcoders.test_transcoders_saelens import write_set
from tests.zoo import RMSNORM_ARCHS, ZOO_ARCHS

TOKENS = torch.tensor([[0, 5, 17, 33, 99, 12, 7, 5, 17]])
HOOK = "ln2.hook_normalized"
FITS = [a for a in ZOO_ARCHS if a not in ("gptj", "phi", "opt")]
ONE_NORM = "has no ln2.hook_normalized: its attention and MLP read one norm; use mlp.hook_in"
ATOL = 1e-5  # float32 over 2 layers, values of a few units


def _eps(model) -> float:
    return float(getattr(model.cfg, "eps", 1e-5))


@pytest.mark.parametrize("arch", FITS)
def test_splice_on_the_normalised_input(zoo, arch):
    model = zoo.model(arch)
    tc = random_transcoders(model, skip=True, input_hook=HOOK, output_hook="hook_mlp_out")
    check_transcoders_fit(model, tc)
    plain = run_cached(model, TOKENS).logits
    same = run_cached(model, TOKENS, transcoders=tc)
    assert (same.logits - plain).abs().max() <= ATOL
    names = [f"blocks.{lay}.{site}" for lay in range(2) for site in (HOOK, "ln2.hook_in")]
    names += [tc.output_hook(lay) for lay in range(2)]
    own = run_cached(model, TOKENS, transcoders=tc, use_error_term=False, hooks=names)
    assert (own.logits - plain).abs().max() > 0.1  # random transcoders change the model
    for layer in range(2):
        x = own[tc.input_hook(layer)]
        # the hook is the norm without its weight and bias, from the norm's input
        r = own[f"blocks.{layer}.ln2.hook_in"]
        r = r if arch in RMSNORM_ARCHS else r - r.mean(-1, keepdim=True)
        want_x = r / (r.pow(2).mean(-1, keepdim=True) + _eps(model)).sqrt()
        torch.testing.assert_close(x, want_x, rtol=0, atol=1e-4)
        f = own[f"blocks.{layer}.hook_transcoder_acts"]
        assert torch.equal(f, tc.encode(x, layer)) and (f > 0).any()
        want = f @ tc.W_dec(layer) + tc.b_dec(layer) + x @ tc.W_skip(layer).T
        torch.testing.assert_close(own[tc.output_hook(layer)], want, atol=ATOL, rtol=ATOL)


def test_circuit_tracer_folder_keeps_the_hook(zoo, tmp_path):
    model = zoo.model("gpt2")
    tc = random_transcoders(model, input_hook=HOOK, output_hook="hook_mlp_out")
    loaded = load_transcoders(write_raw_folder(tmp_path / "raw", tc))
    assert loaded.input_hook(1) == "blocks.1.ln2.hook_normalized"
    again = load_transcoders(loaded.save(tmp_path / "saved"))
    assert again.feature_input_hook == HOOK
    check_transcoders_fit(model, again)


def test_saelens_folders_on_the_hook_load(zoo, tmp_path):
    tc = load_transcoders(write_set(tmp_path / "set", "skip_transcoder", site=HOOK))
    assert (tc.input_hook(0), tc.output_hook(0)) == (
        "blocks.0.ln2.hook_normalized",
        "blocks.0.hook_mlp_out",
    )
    check_transcoders_fit(zoo.model("gpt2"), tc)


@pytest.mark.parametrize(
    "arch,message",
    [
        ("gptj", ONE_NORM),
        ("phi", ONE_NORM),
        ("opt", r"flattens over batch and position \(shape \[2, 64\]"),
    ],
)
def test_refused_where_the_hook_is_missing_or_flattened(zoo, arch, message):
    model = zoo.model(arch)
    tc = random_transcoders(model, input_hook=HOOK)
    with pytest.raises(TranscoderFitError, match=message) as err:
        check_transcoders_fit(model, tc)
    assert "\n" not in str(err.value)
    engine = "flattens" if arch == "opt" else "no hook for"
    with pytest.raises(ValueError, match=engine) as err:  # the engine, before the run
        run_cached(model, TOKENS, transcoders=tc)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_half_precision_model(zoo, arch):
    # the norm computes its inside in float32 in a bfloat16 model: what the graph and the frozen
    # run write back into the model must be cast to its dtype
    model = load_model(zoo.directory(arch), device="cpu", dtype=torch.bfloat16)
    tc = random_transcoders(model, skip=True, input_hook=HOOK)
    plain = run_cached(model, TOKENS).logits[0].float()
    spliced = run_cached(model, TOKENS, transcoders=tc).logits[0].float()
    assert (spliced - plain).abs().max() <= 0.05 * plain.abs().max()  # bfloat16 rounding
    # the graph: the float32 graph of the rounded weights, within bfloat16's bound
    check_half_graph(zoo.directory(arch), torch.bfloat16, input_hook=HOOK)
    frozen = feature_intervention(model, TOKENS[0], tc, constrained_layers=range(2))
    assert frozen.logits.dtype == torch.bfloat16
    assert (frozen.logits.float() - plain).abs().max() <= 0.05 * plain.abs().max()
