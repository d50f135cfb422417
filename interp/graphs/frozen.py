"""The local replacement model of one prompt: attention patterns and norm scales frozen, every
MLP's output a constant (the gradient passes only through a transcoder's skip term).

:func:`frozen_pass` runs the prompt, repeated over ``rows`` rows, with gradients and these
hooks, and hands back the tensors the backward passes read and write:

- ``inputs[l]``: each layer's transcoder input (``tc.input_hook(l)``), where a target feature's
  encoder row is injected;
- ``outputs[l]``: each layer's MLP output, rewritten ``skip(x) + (y - skip(x)).detach()``, whose
  gradient is contracted with the sources' output vectors;
- ``embed``: the token embeddings (``hook_embed``), the one leaf that needs a gradient;
- ``final``: the final norm's output (``unembed.hook_in``), where a logit's vector is injected.

With everything else detached, the map from ``embed`` and the ``outputs`` to ``inputs`` and
``final`` is linear; the backward pass through it is the Jacobian the method defines.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from jaxtyping import Int
from torch import Tensor

from interp.engine import forward

__all__ = ["FINAL_HOOK", "FrozenPass", "frozen_hooks", "frozen_pass", "no_param_grads"]

FINAL_HOOK = "unembed.hook_in"  # the final norm's output: where logit vectors are read


@dataclass
class FrozenPass:
    """The tensors of one frozen pass (module docstring), each ``[rows pos d_model]``."""

    inputs: list[Tensor]
    outputs: list[Tensor]
    embed: Tensor
    final: Tensor


@contextmanager
def no_param_grads(model) -> Iterator[None]:
    """Parameters without gradients while open (the backward passes need none), restored."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def _detach(act: Tensor, hook) -> Tensor:
    return act.detach()


def frozen_hooks(model, tc, keep: dict) -> list:
    """Forward hooks making the replacement model local and linear, recording in ``keep``."""
    names = [n for n in model.hook_dict if n.endswith(".hook_scale")]
    # the pattern is a function of q and k: detaching them freezes it also where the bridge
    # ignores an edited hook_pattern (TransformerLens 4.3: GPT-J, OPT, Gemma 2)
    names += [
        f"blocks.{layer}.attn.{site}"
        for layer in range(tc.n_layers)
        for site in ("hook_q", "hook_k", "hook_pattern")
    ]
    hooks = [(name, _detach) for name in names if name in model.hook_dict]
    keep["inputs"], keep["outputs"] = [None] * tc.n_layers, [None] * tc.n_layers

    def embed(act: Tensor, hook) -> Tensor:
        keep["embed"] = act.detach().requires_grad_(True)
        return keep["embed"]

    def read(layer: int):
        inside_mlp = tc.feature_input_hook == "mlp.hook_in"

        def hook(act: Tensor, hook) -> Tensor | None:
            keep["inputs"][layer] = act
            # the MLP's own graph is never differentiated: do not build it
            return act.detach() if inside_mlp else None

        return hook

    def write(layer: int):
        def hook(act: Tensor, hook) -> Tensor:
            x = keep["inputs"][layer]
            skip = tc.skip(x, layer) if tc.has_skip else x * 0
            # .to: a norm's inside (ln2.hook_normalized) is float32 in a half-precision model
            out = (skip + (act - skip).detach()).to(act.dtype)
            keep["outputs"][layer] = out
            return out

        return hook

    def final(act: Tensor, hook) -> None:
        keep["final"] = act

    hooks.append(("hook_embed", embed))
    for layer in range(tc.n_layers):
        hooks += [(tc.input_hook(layer), read(layer)), (tc.output_hook(layer), write(layer))]
    hooks.append((FINAL_HOOK, final))
    return hooks


def frozen_pass(model, tokens: Int[Tensor, " pos"], tc, rows: int) -> FrozenPass:
    """One pass of ``tokens`` repeated over ``rows`` rows through the frozen replacement model
    (module docstring); call inside :func:`no_param_grads`."""
    keep: dict = {}
    forward(model, tokens[None].expand(rows, -1), frozen_hooks(model, tc, keep), grad=True)
    return FrozenPass(keep["inputs"], keep["outputs"], keep["embed"], keep["final"])
