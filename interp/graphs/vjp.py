"""The one-copy backward: the frozen model's rows from one pass of the prompt.

The frozen replacement model (:mod:`interp.graphs.frozen`) is linear: attention patterns and
norm scales are constants of the prompt, every MLP output a constant but for a transcoder's
skip term. One copy of each pattern and scale serves every row, so a row needs only its own
gradient (``[pos d_model]``, layer by layer), not a batch copy of every activation. The prompt
runs ONCE (batch 1, no autograd graph) and :func:`record` keeps what the transpose reads: each
layer's pattern ``[head q_pos k_pos]``, each norm's scale ``[pos 1]`` and weight, ``W_V``/``W_O``
(:class:`interp.graphs.value_path.ValuePath`) and the skip terms' matrices;
:meth:`interp.graphs.one_copy.OneCopy.rows` then computes batches of rows by hand.

Covered: pre-norm blocks, sequential (``hook_resid_mid``: GPT-2, GPT-NeoX, Llama, Qwen2,
Mistral, OPT; Gemma 2, whose post-norms sit between each sublayer and the residual) or
parallel (attention and MLP reading one residual: parallel NeoX, GPT-J, Phi), with LayerNorm
or RMSNorm (Gemma's ``1 + w`` weights too). The recording pass checks, on the prompt, every
relation the transpose assumes (:func:`interp.graphs.relations.check_block`: each residual the
sum of the previous one and the block's outputs, each norm's and each attention's map against
the bridge's output, the transcoder's input where the layout says); a model whose pass does not
satisfy them keeps the batched frozen pass, with a warning that says so.
"""

from __future__ import annotations

import logging

import torch
from jaxtyping import Int
from torch import Tensor

from interp.engine import forward
from interp.foundation.fallbacks import warn_fallback
from interp.graphs import frozen
from interp.graphs.one_copy import FrozenNorm, OneCopy, fold_post
from interp.graphs.relations import POSTS, block_layout, check_block, checked, needed, with_offsets
from interp.graphs.value_path import check_rtol, rows_miss

logger = logging.getLogger(__name__)

__all__ = ["BACKWARDS", "OneCopy", "one_copy_backward", "one_copy_fits", "record"]

BACKWARDS = ("auto", "one-copy", "batched")  # attribution_graph's ``backward=`` choices
FINAL_HOOK = frozen.FINAL_HOOK  # the final norm's output


class _Stop(Exception):
    """Raised at :data:`FINAL_HOOK` once the final norm's output is checked."""


def one_copy_fits(model, tc) -> bool:
    """Whether the model's hooks and the transcoders' sites fit the one-copy backward (the
    pass checks the rest: a model that fits here may still run batched). False for a model
    without hooks or transcoders without sites (a description to size, not to run)."""
    if not hasattr(model, "hook_dict") or not hasattr(tc, "feature_input_hook"):
        return False
    return not isinstance(block_layout(model, tc), str)


def record(model, tokens: Int[Tensor, " pos"], tc) -> OneCopy | str:
    """One pass of ``tokens`` (batch 1, no graph) recording what :meth:`OneCopy.rows` reads,
    each relation it assumes checked on the way; or why the model is not covered."""
    how = block_layout(model, tc)
    if isinstance(how, str):
        return how
    # read through frozen's names: a list of prompts shares them (interp.graphs.many)
    paths = frozen.value_path_weights(model, int(tc.n_layers))
    norms = frozen.norm_paths(model, set())
    if paths is None or norms is None:
        return "its attention or norm weights cannot be read as frozen maps"
    norms = with_offsets(model, norms)  # Gemma's 1 + w
    rec = _Recording(model, tc, how, paths, norms)
    try:
        forward(model, tokens[None], rec.hooks())
    except _Stop:
        pass
    else:
        return f"the pass did not reach {FINAL_HOOK}"
    rec.check_final()
    if rec.misses:
        return "its pass does not satisfy " + "; ".join(rec.misses[:4])
    return rec.one_copy()


class _Recording:
    """What :func:`record`'s pass keeps, block by block, and the misses its checks found."""

    def __init__(self, model, tc, how, paths, norms) -> None:
        self.model, self.tc, self.how, self.paths, self.norms = model, tc, how, paths, norms
        n = int(tc.n_layers)
        self.n, self.misses = n, []
        self.seen: list[dict] = [{} for _ in range(n)]
        self.kept = {k: [None] * n for k in ("pattern", "ln1", "ln2", *POSTS)}  # scales
        self.embed: dict = {}

    def keep(self, layer: int, key: str):
        def hook(act: Tensor, hook) -> Tensor | None:
            # the row of batch 1; OPT's bridge hands its ln2 [pos ...], rows and positions flat
            self.seen[layer][key] = (act[0] if act.dim() >= 3 else act).detach()
            return _held(act, key)

        return hook

    def close(self, layer: int):
        def hook(act: Tensor, hook) -> None:
            s, embed = self.seen[layer], self.embed
            s["post"] = act[0].detach()
            lost = sorted(needed(self.how) - s.keys())
            if lost:  # a hook the block never ran: nothing to check it by
                self.misses.append(f"layer {layer}: hooks that did not run ({', '.join(lost)})")
                embed["resid"], self.seen[layer] = s["post"], {}
                return
            names = [k for k in self.kept if f"blocks.{layer}.{k}" in self.norms]
            norms = {k: self.norms[f"blocks.{layer}.{k}"] for k in names}
            self.misses.extend(
                f"layer {layer}: {what}"
                for what in check_block(s, self.paths[layer], norms, self.how)
            )
            prev = embed["resid"]
            if s["pre"].shape != prev.shape or rows_miss(s["pre"], prev, _rtol(prev)) > 1:
                self.misses.append(f"layer {layer}: the residual it reads")
            for k in self.kept:  # the pattern, and the scales of the norms the layout reads
                self.kept[k][layer] = s.get(k if k == "pattern" else f"{k}_scale")
            embed["resid"] = s["post"]
            self.seen[layer] = {}  # one block's activations at a time

        return hook

    def at_embed(self, act: Tensor, hook) -> None:  # hook_embed, then hook_pos_embed if any
        self.embed["resid"] = act[0].detach() + self.embed.get("resid", 0)

    def final(self, act: Tensor, hook) -> None:
        self.embed["final_out"] = act[0].detach()
        raise _Stop

    def hooks(self) -> list:
        model, tc = self.model, self.tc
        hooks = [("hook_embed", self.at_embed)]
        if "hook_pos_embed" in model.hook_dict:
            hooks.append(("hook_pos_embed", self.at_embed))
        names = {"hook_resid_pre": "pre", "hook_resid_mid": "mid", "attn.hook_in": "attn_in",
                 "attn.hook_pattern": "pattern", "attn.hook_out": "attn_out"}  # fmt: skip
        for ln in ("ln1", "ln2", *POSTS):
            names |= {f"{ln}.hook_in": f"{ln}_in", f"{ln}.hook_scale": f"{ln}_scale"}
            names[f"{ln}.hook_out"] = f"{ln}_out"
        for layer in range(self.n):
            block = f"blocks.{layer}"
            hooks += [(f"{block}.{k}", self.keep(layer, v)) for k, v in names.items()
                      if f"{block}.{k}" in model.hook_dict]  # fmt: skip
            hooks += [(tc.input_hook(layer), self.keep(layer, "tc_in"))]
            hooks += [(tc.output_hook(layer), self.keep(layer, "mlp_out"))]
            hooks += [(f"{block}.hook_resid_post", self.close(layer))]
        hooks += [(f"ln_final.hook_{s}", keep_final(self.embed, s)) for s in ("in", "scale", "out")]
        hooks.append((FINAL_HOOK, self.final))
        return hooks

    def check_final(self) -> None:
        """The final norm's hooks ran, its frozen map holds, and it reads the residual."""
        embed = self.embed
        if lost := sorted({"in", "scale", "out", "final_out"} - embed.keys()):
            self.misses.append(f"ln_final: hooks that did not run ({', '.join(lost)})")
        if self.misses:
            return
        ln_f = self.norms["ln_final"]
        ln_f.recorded.update(x=checked(embed["in"]), scale=checked(embed["scale"]),
                             out=checked(embed["out"]))  # fmt: skip
        if not ln_f.check():
            self.misses.append("ln_final's frozen map")
        resid = embed["resid"]
        for key, want in (("in", resid), ("final_out", embed["out"])):
            if rows_miss(embed[key].float(), want.float(), _rtol(resid)) > 1:
                self.misses.append(f"ln_final: {key}")

    def norm_of(self, prefix: str, scale: Tensor) -> FrozenNorm:
        norm = self.norms[prefix]
        norm.recorded.clear()
        return FrozenNorm(norm.weight, scale, norm.centre)

    def one_copy(self) -> OneCopy:
        """The recorded pass as the one-copy backward's maps."""
        n, tc, kept, how = self.n, self.tc, self.kept, self.how

        def norms(name: str, there: bool = True) -> list:
            return [self.norm_of(f"blocks.{i}.{name}", kept[name][i]) if there else None
                    for i in range(n)]  # fmt: skip

        ln1, ln2 = norms("ln1"), norms("ln2", not how.shared)
        mlp_norm = [
            None if how.site == "resid" else ln1[i] if how.shared else ln2[i] for i in range(n)
        ]
        skips = None
        if tc.has_skip:  # skip(x) = x M: M read off the skip itself (skip(I) = M)
            eye = torch.eye(tc.d_model, dtype=tc.dtype, device=tc.device)
            skips = [tc.skip(eye, i) for i in range(n)]
        final = self.norm_of("ln_final", self.embed["scale"])
        paths, patterns = self.paths, kept["pattern"]
        if how.attn_post:  # ln1_post folded into W_O and the patterns' rows
            posts = norms(POSTS[0])
            paths = [fold_post(paths[i], patterns[i], posts[i]) for i in range(n)]
        mlp_post = norms(POSTS[1]) if how.mlp_post else None
        return OneCopy(
            paths, patterns, ln1, mlp_norm, final, skips, how.site, how.parallel, how.shared,
            mlp_post,
        )  # fmt: skip


def _rtol(t: Tensor) -> float:
    return check_rtol(checked(t).dtype, t.shape[-1])


def _held(act: Tensor, key: str) -> Tensor | None:
    """Norm scales and the attention's input handed back (detached), as the batched frozen pass
    hands them back: TransformerLens 4.3 then computes a norm's output from the hooked values
    in the model's dtype rather than by transformers' own norm (which normalises a float64
    Llama in float32), so both passes freeze the same values (a float64 Llama's rows 2e-16
    apart; untouched, 1e-7). GPT-J's float32 attention still rounds its pattern by the batch's
    shape: there the batched pass's pattern is its batch's, this pass's the prompt's own."""
    return act.detach() if key.endswith("scale") or key == "attn_in" else None


def keep_final(store: dict, key: str):
    def hook(act: Tensor, hook) -> Tensor | None:
        store[key] = act[0].detach()
        return _held(act, key)

    return hook


def one_copy_backward(model, tokens: Int[Tensor, " pos"], tc, backward: str = "auto"):
    """The one-copy row step (``OneCopy.rows``) for ``tokens``, or None where the batched frozen
    pass must run: ``backward`` is ``"batched"``, or the model is not covered (a warning, once,
    says which path runs and why; ``"one-copy"`` then raises instead)."""
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {', '.join(BACKWARDS)}, got {backward!r}")
    if backward == "batched":
        return None
    got = record(model, tokens, tc)
    if isinstance(got, OneCopy):
        return got.rows
    if backward == "one-copy":
        raise ValueError(f"the one-copy backward does not cover this model: {got}; "
                         "pass backward='batched' (or 'auto')")  # fmt: skip
    warn_fallback(
        logger,
        "vjp:batched",
        "attribution graph: the one-copy backward does not cover this model (%s): running the "
        "batched frozen pass (batch_size copies of the prompt) instead",
        got,
    )
    return None
