"""The SAE check of tests/support.py: ``SAE splice``.

A random ReLU SAE (32 features) at the last layer's ``hook_resid_pre``, spliced with
``run_cached(..., saes=[sae])``:

- with the error term the logits are transformers' own on the same tokens;
- the cached features are ``sae.encode`` of transformers' hidden state entering that layer
  (``output_hidden_states``), or of TransformerLens's cache for a model without a checkpoint;
- without the error term the logits are a plain TransformerLens hook's that replaces the
  activation by ``sae(x)``.

Imported by tests/support.py (after the helpers it uses here are defined); import that
module, not this one.
"""

from __future__ import annotations

import torch

from tests.support import ATOL_LOGITS, Case, _close, _reference_logits, _tokens

ATOL_FEATURES = 1e-4  # float32 encodes of hidden states that agree to about 1e-6
D_SAE = 32  # features of the random SAE


def _random_sae(case: Case, hook: str):
    from interp.saes.sae import SAE

    d = int(case.model.cfg.d_model)
    g = torch.Generator().manual_seed(0)
    return SAE(
        torch.randn(d, D_SAE, generator=g) / d**0.5, torch.zeros(D_SAE),
        torch.randn(D_SAE, d, generator=g) / D_SAE**0.5, torch.randn(d, generator=g) * 0.1,
        hook_name=hook, apply_b_dec_to_input=True,
    )  # fmt: skip


def check_sae_splice(case: Case) -> None:
    from interp import run_cached

    layer = int(case.model.cfg.n_layers) - 1
    hook = f"blocks.{layer}.hook_resid_pre"
    sae = _random_sae(case, hook).to(case.model.cfg.device)
    tokens = _tokens(case)
    spliced = run_cached(case.model, tokens, saes=[sae])
    _close(spliced.logits, _reference_logits(case, tokens), ATOL_LOGITS, "spliced logits")
    with torch.no_grad():
        if case.hf is not None:
            resid = case.hf(tokens, output_hidden_states=True).hidden_states[layer]
        else:
            resid = case.model.run_with_cache(tokens, names_filter=hook)[1][hook]
        features = sae.encode(resid)
        alone = case.model.run_with_hooks(tokens, fwd_hooks=[(hook, lambda x, hook: sae(x))])
    acts = spliced[f"{hook}.hook_sae_acts"]
    _close(acts, features, ATOL_FEATURES, "the spliced SAE's features")
    if not (acts > 0).any():
        raise AssertionError("no feature fires: the check would be trivial")
    without = run_cached(case.model, tokens, saes=[sae], use_error_term=False)
    _close(without.logits, alone, ATOL_LOGITS, "logits of the reconstruction (no error term)")
