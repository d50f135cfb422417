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
Mistral, OPT) or parallel (attention and MLP reading one residual: parallel NeoX, GPT-J, Phi),
with LayerNorm or RMSNorm. The recording pass checks, on the prompt, every relation the
transpose assumes (each residual the sum of the previous one and the block's outputs, each
norm's and each attention's map against the bridge's output, the transcoder's input where the
map says); a model whose pass does not satisfy them (Gemma 2: ``1 + w`` norms, post-norms)
keeps the batched frozen pass, with a warning that says so.
"""

from __future__ import annotations

import logging

import torch
from jaxtyping import Int
from torch import Tensor

from interp.engine import forward
from interp.foundation.fallbacks import warn_fallback
from interp.graphs import frozen
from interp.graphs.norm_path import NormPath
from interp.graphs.one_copy import FrozenNorm, OneCopy
from interp.graphs.value_path import ValuePath, check_rtol, rows_miss

logger = logging.getLogger(__name__)

__all__ = ["BACKWARDS", "OneCopy", "one_copy_backward", "one_copy_fits", "record"]

BACKWARDS = ("auto", "one-copy", "batched")  # attribution_graph's ``backward=`` choices
FINAL_HOOK = frozen.FINAL_HOOK  # the final norm's output
_SITES = {  # what a transcoder's input hook holds, by its name inside a block
    "mlp.hook_in": "norm",
    "hook_mlp_in": "resid",  # the bridge fires it on the MLP block's input, before ln2
    "ln2.hook_out": "norm",
    "ln2.hook_normalized": "normalized",
    "hook_resid_mid": "resid",
}


_BLOCK = {"pre", "ln1_in", "ln1_scale", "ln1_out", "attn_in", "pattern", "attn_out", "tc_in"}
_BLOCK |= {"mlp_out"}
_LN2 = {"ln2_in", "ln2_scale", "ln2_out"}
_NEEDED = {  # what a block's hooks record, by (parallel, shared_norm)
    (False, False): _BLOCK | _LN2 | {"mid"},
    (True, False): _BLOCK | _LN2,
    (True, True): _BLOCK,
}


class _Stop(Exception):
    """Raised at :data:`FINAL_HOOK` once the final norm's output is checked."""


def _sites(model, tc) -> tuple[str, bool, bool] | str:
    """(site, parallel, shared_norm), or why the model's hooks do not fit the one-copy step."""
    inside = tc.feature_input_hook
    if inside not in _SITES or tc.feature_output_hook not in ("mlp.hook_out", "hook_mlp_out"):
        return f"transcoders read {inside} and write {tc.feature_output_hook}"
    hooks = model.hook_dict.keys()
    parallel = "blocks.0.hook_resid_mid" not in hooks
    shared = parallel and "blocks.0.ln2.hook_scale" not in hooks
    need = ["hook_embed", FINAL_HOOK] + [f"ln_final.hook_{s}" for s in ("in", "scale", "out")]
    for layer in range(int(tc.n_layers)):
        block = f"blocks.{layer}"
        need += [f"{block}.hook_resid_pre", f"{block}.hook_resid_post", tc.input_hook(layer)]
        need += [f"{block}.attn.hook_{s}" for s in ("in", "pattern", "out")]
        need += [tc.output_hook(layer)]
        norms = ("ln1",) if shared else ("ln1", "ln2")
        need += [f"{block}.{ln}.hook_{s}" for ln in norms for s in ("in", "scale", "out")]
        need += [] if parallel else [f"{block}.hook_resid_mid"]
    missing = [name for name in need if name not in hooks]
    if missing:
        return f"the model has no hook {missing[0]}"
    others = [n for n in hooks if n.startswith("blocks.0.") and n.endswith(".hook_scale")]
    others = [n for n in others if n not in ("blocks.0.ln1.hook_scale", "blocks.0.ln2.hook_scale")]
    if others:  # Gemma 2's post-norms: another map on the residual's way
        return f"its blocks have norms other than ln1 and ln2 ({others[0]})"
    if shared and _SITES[inside] != "norm":
        return f"transcoders read {inside}, but attention and MLP share one norm"
    return _SITES[inside], parallel, shared


def one_copy_fits(model, tc) -> bool:
    """Whether the model's hooks and the transcoders' sites fit the one-copy backward (the
    pass checks the rest: a model that fits here may still run batched). False for a model
    without hooks or transcoders without sites (a description to size, not to run)."""
    if not hasattr(model, "hook_dict") or not hasattr(tc, "feature_input_hook"):
        return False
    return not isinstance(_sites(model, tc), str)


def _check_block(seen: dict, path: ValuePath, ln1: NormPath, ln2: NormPath | None, how) -> list:
    """The relations the transpose assumes in one block, on the recorded row (each ``[pos
    d_model]``): the names of those the bridge's values miss."""
    site, parallel, shared = how
    seen = {k: _checked(t) for k, t in seen.items()}
    rtol = check_rtol(seen["pre"].dtype, seen["pre"].shape[-1])
    v = {k: t.float() for k, t in seen.items() if t.dim() == 2}
    misses = []

    def same(name: str, mine: Tensor, want: Tensor) -> None:
        if mine.shape != want.shape or rows_miss(mine, want, rtol) > 1.0:
            misses.append(name)

    same("ln1 reads the residual", v["ln1_in"], v["pre"])
    same("attention reads ln1", v["attn_in"], v["ln1_out"])
    ln1.recorded.update(x=seen["ln1_in"], scale=seen["ln1_scale"], out=seen["ln1_out"])
    if not ln1.check():
        misses.append("ln1's frozen map")
    if not path.check(seen["attn_in"][None], seen["pattern"][None], seen["attn_out"][None]):
        misses.append("the attention's value path")
    reads = v["pre"] if parallel else v["mid"]
    if not parallel:
        same("the residual after attention", v["mid"], v["pre"] + v["attn_out"])
    norm_out = v["ln1_out"] if shared else v.get("ln2_out")
    if not shared:
        same("ln2 reads the residual", v["ln2_in"], reads)
        ln2.recorded.update(x=seen["ln2_in"], scale=seen["ln2_scale"], out=seen["ln2_out"])
        if not ln2.check():
            misses.append("ln2's frozen map")
    if site == "resid":
        same("the transcoder reads the residual", v["tc_in"], reads)
    elif site == "norm":
        same("the transcoder reads the norm", v["tc_in"], norm_out)
    else:
        x = reads - reads.mean(-1, keepdim=True) if ln2.centre else reads
        same("the transcoder reads the normalised residual", v["tc_in"], x / v["ln2_scale"])
    added = v["attn_out"] + v["mlp_out"] if parallel else v["mlp_out"]
    same("the residual after the MLP", v["post"], (v["pre"] if parallel else v["mid"]) + added)
    return misses


def record(model, tokens: Int[Tensor, " pos"], tc) -> OneCopy | str:
    """One pass of ``tokens`` (batch 1, no graph) recording what :meth:`OneCopy.rows` reads,
    each relation it assumes checked on the way; or why the model is not covered."""
    how = _sites(model, tc)
    if isinstance(how, str):
        return how
    # read through frozen's names: a list of prompts shares them (interp.graphs.many)
    paths = frozen.value_path_weights(model, int(tc.n_layers))
    norms = frozen.norm_paths(model, set())
    if paths is None or norms is None:
        return "its attention or norm weights cannot be read as frozen maps"
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
        self.kept = {"patterns": [None] * n, "ln1": [None] * n, "ln2": [None] * n}
        self.embed: dict = {}

    def keep(self, layer: int, key: str):
        def hook(act: Tensor, hook) -> Tensor | None:
            # the row of batch 1; OPT's bridge hands its ln2 [pos ...], rows and positions flat
            self.seen[layer][key] = (act[0] if act.dim() >= 3 else act).detach()
            return _held(act, key)

        return hook

    def close(self, layer: int):
        _, parallel, shared = self.how

        def hook(act: Tensor, hook) -> None:
            s, embed = self.seen[layer], self.embed
            s["post"] = act[0].detach()
            lost = sorted(_NEEDED[parallel, shared] - s.keys())
            if lost:  # a hook the block never ran: nothing to check it by
                self.misses.append(f"layer {layer}: hooks that did not run ({', '.join(lost)})")
                embed["resid"], self.seen[layer] = s["post"], {}
                return
            ln1 = self.norms[f"blocks.{layer}.ln1"]
            ln2 = None if shared else self.norms[f"blocks.{layer}.ln2"]
            self.misses.extend(
                f"layer {layer}: {what}"
                for what in _check_block(s, self.paths[layer], ln1, ln2, self.how)
            )
            prev = embed["resid"]
            if s["pre"].shape != prev.shape or rows_miss(s["pre"], prev, _rtol(prev)) > 1:
                self.misses.append(f"layer {layer}: the residual it reads")
            self.kept["patterns"][layer] = s["pattern"]
            self.kept["ln1"][layer] = s["ln1_scale"]
            self.kept["ln2"][layer] = s.get("ln2_scale")
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
        for ln in ("ln1", "ln2"):
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
        ln_f.recorded.update(x=_checked(embed["in"]), scale=_checked(embed["scale"]),
                             out=_checked(embed["out"]))  # fmt: skip
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
        n, tc, kept = self.n, self.tc, self.kept
        site, parallel, shared = self.how
        ln1 = [self.norm_of(f"blocks.{i}.ln1", kept["ln1"][i]) for i in range(n)]
        ln2 = [
            None if shared else self.norm_of(f"blocks.{i}.ln2", kept["ln2"][i]) for i in range(n)
        ]
        mlp_norm = [None if site == "resid" else ln1[i] if shared else ln2[i] for i in range(n)]
        skips = None
        if tc.has_skip:  # skip(x) = x M: M read off the skip itself (skip(I) = M)
            eye = torch.eye(tc.d_model, dtype=tc.dtype, device=tc.device)
            skips = [tc.skip(eye, i) for i in range(n)]
        final = self.norm_of("ln_final", self.embed["scale"])
        return OneCopy(
            self.paths, kept["patterns"], ln1, mlp_norm, final, skips, site, parallel, shared
        )


def _checked(t: Tensor) -> Tensor:
    """``t`` as the checks compare it: a float64 model's values in float32, for transformers
    computes some maps of a float64 model in float32 (Llama's RMSNorm, GPT-J's attention), so
    its outputs agree with the map to float32's rounding only. A wrong map (a missing weight or
    head, ``1 + w``) misses by far more (interp.graphs.value_path.check_rtol)."""
    return t.float() if t.dtype == torch.float64 else t


def _rtol(t: Tensor) -> float:
    return check_rtol(_checked(t).dtype, t.shape[-1])


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
