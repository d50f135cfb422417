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
``final`` is linear; the backward pass through it is the Jacobian the method defines. The
attention's part of it is its value path (:mod:`interp.graphs.value_path`), computed on the
rows and positions ``scope`` names; where a model's attention weights do not give its output
that way, the pass falls back to differentiating the bridge's attention with q and k detached.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from jaxtyping import Int
from torch import Tensor

from interp.engine import forward
from interp.foundation.fallbacks import warn_fallback
from interp.graphs.norm_path import NormPath, norm_paths
from interp.graphs.value_path import Scope, ValuePath, value_path_weights

logger = logging.getLogger(__name__)

__all__ = [
    "FINAL_HOOK",
    "FrozenPass",
    "frozen_hooks",
    "frozen_pass",
    "no_param_grads",
    "run_frozen",
]

FINAL_HOOK = "unembed.hook_in"  # the final norm's output: where logit vectors are read


@dataclass
class FrozenPass:
    """The tensors of one frozen pass (module docstring), each ``[rows pos d_model]``."""

    inputs: list[Tensor]
    outputs: list[Tensor]
    embed: Tensor
    final: Tensor
    scope: Scope = field(default_factory=Scope)  # set before each backward pass
    value_path: bool = False  # the attention differentiated through its value path
    norm_path: bool = False  # the norms (those no transcoder hooks) through their frozen maps


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


class _Stop(Exception):
    """Raised at :data:`FINAL_HOOK` once its input is kept: the logits are never read."""


def _attention_hooks(layer: int, path: ValuePath, keep: dict, scope: Scope) -> list:
    """The attention of ``layer`` without a graph of its own, its value path added at its
    output (it runs on every row: TransformerLens 4.3 sizes its output by the mask's batch);
    ``keep["checks"][layer]`` holds row 0's input, pattern and output for
    :meth:`ValuePath.check`. Some bridges fire ``hook_pattern`` after ``hook_out`` (OPT): the
    backward reads the pattern from there, once the pass has recorded it."""
    seen: dict = {}
    keep["checks"][layer] = seen

    def enter(act: Tensor, hook) -> Tensor:
        seen["graph_x"], seen["x"] = act, act[:1].detach().clone()
        return act.detach()

    def pattern(act: Tensor, hook) -> Tensor:
        seen["pattern"] = act[:1].detach().clone()  # every row is the same prompt
        return act.detach()

    def leave(act: Tensor, hook) -> Tensor:
        seen["out"], x = act[:1].detach().clone(), seen.pop("graph_x")
        return path.apply(act, x, seen, scope)

    attn = f"blocks.{layer}.attn"
    return [
        (f"{attn}.hook_in", enter),
        (f"{attn}.hook_pattern", pattern),
        (f"{attn}.hook_out", leave),
    ]


def frozen_hooks(
    model,
    tc,
    keep: dict,
    paths: list[ValuePath] | None = None,
    scope: Scope | None = None,
    norms: dict[str, NormPath] | None = None,
) -> list:
    """Forward hooks making the replacement model local and linear, recording in ``keep``;
    the attention through ``paths`` and the norms named in ``norms`` through their frozen maps
    (their gradient on ``scope``) when given."""
    norms = norms or {}
    names = [n for n in model.hook_dict if n.endswith(".hook_scale")]
    hooks = [(name, _detach) for name in names if name[: -len(".hook_scale")] not in norms]
    for prefix, norm in norms.items():
        norm.recorded.clear()
        hooks += norm.hooks(prefix, scope or Scope())
    keep["inputs"], keep["outputs"] = [None] * tc.n_layers, [None] * tc.n_layers
    keep["checks"] = [None] * tc.n_layers
    for layer in range(tc.n_layers):
        if paths is not None:
            hooks += _attention_hooks(layer, paths[layer], keep, scope or Scope())
            continue
        # the pattern is a function of q and k: detaching them freezes it also where the
        # bridge ignores an edited hook_pattern (TransformerLens 4.3: GPT-J, OPT, Gemma 2)
        for site in ("hook_q", "hook_k", "hook_pattern"):
            name = f"blocks.{layer}.attn.{site}"
            if name in model.hook_dict:
                hooks.append((name, _detach))

    def embed(act: Tensor, hook) -> Tensor:
        keep["embed"] = act.detach().requires_grad_(True)
        return keep["embed"]

    def read(layer: int):
        def hook(act: Tensor, hook) -> None:
            keep["inputs"][layer] = act

        return hook

    def one_row(act: Tensor, hook) -> Tensor:
        # the MLP's output is a constant, the same in every row: compute one, build no graph
        return act[:1].detach()

    def write(layer: int):
        def hook(act: Tensor, hook) -> Tensor:
            # the MLP ran on one row (every row is the same prompt); its output is a constant
            const = act.detach().expand(len(keep["embed"]), *act.shape[1:])
            if not tc.has_skip:  # a leaf, whose gradient is the MLP output's
                keep["outputs"][layer] = const.contiguous().requires_grad_(True)
                return keep["outputs"][layer]
            x = keep["inputs"][layer]
            skip = tc.skip(x, layer)
            # .to: a norm's inside (ln2.hook_normalized) is float32 in a half-precision model
            out = (skip + (const - skip).detach()).to(act.dtype)
            keep["outputs"][layer] = out
            return out

        return hook

    def final(act: Tensor, hook) -> None:
        keep["final"] = act
        raise _Stop  # the unembedding's full-vocabulary logits are never read

    hooks.append(("hook_embed", embed))
    for layer in range(tc.n_layers):
        hooks += [(tc.input_hook(layer), read(layer)), (tc.output_hook(layer), write(layer))]
    mlps = [f"blocks.{layer}.mlp.hook_in" for layer in range(tc.n_layers)]
    hooks += [(name, one_row) for name in mlps if name in model.hook_dict]
    hooks.append((FINAL_HOOK, final))
    return hooks


def _busy(tc) -> set[str]:
    """The hooks a transcoder reads or writes, and the final norm's output."""
    names = {FINAL_HOOK}
    for layer in range(tc.n_layers):
        names |= {tc.input_hook(layer), tc.output_hook(layer)}
    return names


def run_frozen(model, batch: Tensor, hooks: list) -> None:
    """The frozen pass up to :data:`FINAL_HOOK` (the hooks record what it holds)."""
    try:
        forward(model, batch, hooks, grad=True)
    except _Stop:
        return
    raise RuntimeError(f"the frozen pass did not reach {FINAL_HOOK}")


def frozen_pass(model, tokens: Int[Tensor, " pos"], tc, rows: int) -> FrozenPass:
    """One pass of ``tokens`` repeated over ``rows`` rows through the frozen replacement model
    (module docstring); call inside :func:`no_param_grads`. The attention's value path and the
    norms' frozen maps are tried first, each dropped where it does not reproduce the bridge."""
    batch = tokens[None].expand(rows, -1)
    scope = Scope()
    paths = value_path_weights(model, tc.n_layers)
    norms = norm_paths(model, _busy(tc)) if paths is not None else None
    tries = [(paths, norms)] if norms else []
    tries += [(paths, None)] if paths is not None else []
    if paths is None:
        warn_fallback(
            logger,
            "frozen:value_path_weights",
            "attribution graph: this model's attention weights cannot be read as a value path: "
            "differentiating the bridge's attention and norms instead (slower)",
        )
    elif norms is None:
        warn_fallback(
            logger,
            "frozen:norm_paths",
            "attribution graph: this model's norm weights cannot be read as frozen maps: "
            "differentiating the bridge's norms instead (slower)",
        )
    for value, norm in tries:
        keep: dict = {}
        run_frozen(model, batch, frozen_hooks(model, tc, keep, value, scope, norm))
        mismatch = [
            layer
            for layer, seen in enumerate(keep["checks"])
            if not (
                "pattern" in seen and value[layer].check(seen["x"], seen["pattern"], seen["out"])
            )
        ]
        wrong = [prefix for prefix, path in (norm or {}).items() if not path.check()]
        if not mismatch and not wrong:
            return FrozenPass(
                keep["inputs"],
                keep["outputs"],
                keep["embed"],
                keep["final"],
                scope,
                True,
                bool(norm),
            )
        if wrong:
            warn_fallback(
                logger,
                "frozen:norm_path",
                "attribution graph: the norms' frozen maps do not reproduce %s (off by up to %.3g "
                "times the check's tolerance): differentiating the bridge's norms instead (slower)",
                wrong,
                max(norm[prefix].last_miss for prefix in wrong),
            )
            continue
        warn_fallback(
            logger,
            "frozen:value_path",
            "attribution graph: the attention's value path does not reproduce layers %s (off by "
            "up to %.3g times the check's tolerance): differentiating the bridge's attention "
            "instead (slower)",
            mismatch,
            max(value[layer].last_miss for layer in mismatch),
        )
        break
    keep = {}
    run_frozen(model, batch, frozen_hooks(model, tc, keep))
    return FrozenPass(keep["inputs"], keep["outputs"], keep["embed"], keep["final"], scope)
