"""A norm's gradient in the frozen replacement model: its frozen linear map, computed on the rows
and positions a backward pass can reach.

With its scale frozen, a LayerNorm is affine in its input: ``out = (x - mean(x)) / scale * w +
b`` (an RMSNorm without the centring). Differentiating the bridge's norm runs its whole
backward (subtraction, mean, division, product) on every row and position of the frozen pass,
though a backward pass's gradient is zero past its scope (:class:`Scope`). So the frozen pass
records what enters the norm (``hook_in``) and replaces its output (``hook_out``) by the same
values detached plus a zero whose gradient into that input is this map's transpose,
``centre(g * w / scale)``, on the scope only: the norm's own graph is left unused.

Each norm's map is checked once against the bridge's output (row 0, bias included) during the
pass; a norm whose weights cannot be read or do not reproduce it (an offset weight, another
layout) makes the caller differentiate the bridge's norms instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from interp.graphs.value_path import Scope, check_rtol, rows_miss

__all__ = ["NormPath", "norm_paths"]


@dataclass
class NormPath:
    """One norm's frozen map: its weight ``[d_model]`` (None: 1), its bias (None: 0), whether it
    centres; ``recorded`` holds row 0's input, scale and output for :meth:`check`, the scale
    ``[pos 1]`` for the backward."""

    weight: Tensor | None
    bias: Tensor | None
    centre: bool
    recorded: dict

    def check(self) -> bool:
        """Whether the map, bias included, gives the bridge's output on row 0: every position's
        vector within :func:`interp.graphs.value_path.check_rtol` of its norm (the largest
        ratio of a miss to its tolerance is kept in ``last_miss``)."""
        seen = self.recorded
        self.last_miss = float("inf")
        if not {"x", "scale", "out"} <= seen.keys():
            return False
        work = torch.promote_types(seen["x"].dtype, torch.float32)
        x, scale, want = seen["x"].to(work), seen["scale"].to(work), seen["out"].to(work)
        if self.centre:
            x = x - x.mean(-1, keepdim=True)
        mine = x / scale
        if self.weight is not None:
            mine = mine * self.weight.to(work)
        if self.bias is not None:
            mine = mine + self.bias.to(work)
        self.last_miss = rows_miss(mine, want, check_rtol(seen["out"].dtype, x.shape[-1]))
        return self.last_miss <= 1.0

    def hooks(self, prefix: str, scope: Scope) -> list:
        """The forward hooks at ``prefix.hook_in``, ``.hook_scale`` and ``.hook_out``."""
        seen = self.recorded

        def enter(act: Tensor, hook) -> None:
            # left as it is: some bridges carry the residual stream on from a norm's hook_in
            # (GPT-2's ln2.hook_in is hook_resid_mid); the norm's own graph goes unused
            seen["graph_x"], seen["x"] = act, act[0].detach().clone()

        def scale(act: Tensor, hook) -> Tensor:
            seen["scale"] = act[0].detach().clone()  # [pos 1]: every row is the same prompt
            return act.detach()

        def leave(act: Tensor, hook) -> Tensor:
            seen["out"], x = act[0].detach().clone(), seen.pop("graph_x")
            return _Linear.apply(act.detach(), x, self, scope)

        return [
            (f"{prefix}.hook_in", enter),
            (f"{prefix}.hook_scale", scale),
            (f"{prefix}.hook_out", leave),
        ]


def norm_paths(model, busy: set[str]) -> dict[str, NormPath] | None:
    """Each norm's :class:`NormPath` by its prefix (``blocks.0.ln1``), leaving out norms with a
    hook in ``busy`` (a transcoder reads or writes there); None when a weight cannot be read."""
    paths = {}
    for name in model.hook_dict:
        if not name.endswith(".hook_scale"):
            continue
        prefix = name[: -len(".hook_scale")]
        sites = {f"{prefix}.{s}" for s in ("hook_in", "hook_out", "hook_scale", "hook_normalized")}
        ends = {f"{prefix}.hook_in", f"{prefix}.hook_out"}
        if sites & busy or not ends <= model.hook_dict.keys():
            continue
        try:
            module = model.get_submodule(prefix).original_component
        except AttributeError:
            return None
        if module is None:
            return None
        weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
        centre = "rms" not in type(module).__name__.lower()
        paths[prefix] = NormPath(
            None if weight is None else weight.detach(),
            None if bias is None else bias.detach(),
            centre,
            {},
        )
    return paths


class _Linear(torch.autograd.Function):
    """Forward: ``out`` as it is. Backward: the frozen norm's transpose, on the scope only."""

    @staticmethod
    def forward(ctx, out, x, path: NormPath, scope: Scope):
        ctx.path, ctx.scope = path, scope
        return out.clone()

    @staticmethod
    def backward(ctx, grad: Float[Tensor, "rows pos d_model"]):
        path, scope = ctx.path, ctx.scope
        rows, n_pos, _ = grad.shape
        b, p = min(scope.rows or rows, rows), min(scope.positions or n_pos, n_pos)
        # one new tensor, written in place: zero past the scope, the map's transpose on it
        # (a tensor per step and a zeroed copy made this a third of a 256-position build)
        full = grad.new_empty(grad.shape)
        full[b:].zero_()
        full[:b, p:].zero_()
        g = full[:b, :p]
        if path.weight is not None:
            torch.mul(grad[:b, :p], path.weight.to(grad.dtype), out=g)
        else:
            g.copy_(grad[:b, :p])
        g.div_(path.recorded["scale"][:p].to(grad.dtype))  # [b p d_model] / [p 1]
        if path.centre:
            g.sub_(g.mean(-1, keepdim=True))
        return None, full, None, None
