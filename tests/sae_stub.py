"""A minimal SAE for tests/test_sae_train.py until branch saecore lands interp.saes.sae."""

import sys
import types

import torch


class SAE(torch.nn.Module):
    def __init__(
        self,
        W_enc,
        b_enc,
        W_dec,
        b_dec,
        *,
        architecture="standard",
        hook_name,
        threshold=None,
        k=None,
        apply_b_dec_to_input=False,
        cfg=None,
    ):
        super().__init__()
        self.W_enc, self.b_enc, self.W_dec, self.b_dec = (
            torch.nn.Parameter(t) for t in (W_enc, b_enc, W_dec, b_dec)
        )
        self.architecture, self.hook_name, self.k, self.apply_b_dec_to_input, self.cfg = (
            architecture,
            hook_name,
            k,
            apply_b_dec_to_input,
            cfg or {},
        )
        self.d_in, self.d_sae = W_dec.shape[1], W_dec.shape[0]

    def encode(self, x):
        pre = (x - self.b_dec * self.apply_b_dec_to_input) @ self.W_enc + self.b_enc
        if self.k is None:
            return torch.relu(pre)
        v, i = pre.topk(self.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, i, torch.relu(v))

    def decode(self, f):
        return f @ self.W_dec + self.b_dec

    def forward(self, x):
        return self.decode(self.encode(x))


def install() -> None:
    module = types.ModuleType("interp.saes.sae")
    module.SAE = SAE
    sys.modules["interp.saes.sae"] = module
