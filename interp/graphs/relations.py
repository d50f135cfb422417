"""What the one-copy backward (:mod:`interp.graphs.vjp`) assumes of a model's blocks, and the
checks of it on the recorded pass.

:func:`block_layout` reads the layout off the model's hooks and the transcoders' sites: where a
transcoder reads (``_SITES``), whether attention and MLP read one residual (parallel) and one
norm, and whether post-norms sit between a sublayer and the residual (Gemma 2's ``ln1_post``
after the attention, ``ln2_post`` after the MLP: RMSNorms whose scales are frozen like every
other norm's, so linear once frozen). :func:`check_block` then checks, on the prompt's own
values, every relation the transpose assumes in a block: each residual the previous one plus
the block's outputs (through the post-norms where there are any), each norm's frozen map and
the attention's value path against the bridge's output, the transcoder's input where the layout
says. Gemma's norms scale by ``1 + w`` (:func:`with_offsets`), which the norms' checks hold
like any other weight: a map without the offset misses the bridge's output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from interp.graphs.frozen import FINAL_HOOK
from interp.graphs.norm_path import NormPath
from interp.graphs.value_path import ValuePath, check_rtol, rows_miss

__all__ = [
    "POSTS",
    "SITES",
    "Layout",
    "block_layout",
    "check_block",
    "checked",
    "needed",
    "with_offsets",
]

SITES = {  # what a transcoder's input hook holds, by its name inside a block
    "mlp.hook_in": "norm",
    "hook_mlp_in": "resid",  # the bridge fires it on the MLP block's input, before ln2
    "ln2.hook_out": "norm",
    "ln2.hook_normalized": "normalized",
    "hook_resid_mid": "resid",
}
POSTS = ("ln1_post", "ln2_post")  # Gemma 2's norms on the attention's and the MLP's outputs
_NORM = ("in", "scale", "out")


@dataclass(frozen=True)
class Layout:
    """How a block's parts meet the residual stream, as the transpose walks them."""

    site: str  # what the transcoders read: "norm", "normalized" or "resid" (SITES)
    parallel: bool  # attention and MLP read the residual before the block
    shared: bool  # parallel blocks whose attention and MLP read one norm (GPT-J, Phi)
    attn_post: bool = False  # ln1_post between the attention's output and the residual
    mlp_post: bool = False  # ln2_post between the transcoders' output hook and the residual


def _keys(norm: str) -> set[str]:
    return {f"{norm}_{s}" for s in _NORM}


_BLOCK = {"pre", "attn_in", "pattern", "attn_out", "tc_in", "mlp_out"} | _keys("ln1")


def needed(how: Layout) -> set[str]:
    """What a block's hooks record (:class:`interp.graphs.vjp._Recording`'s keys)."""
    keys = _BLOCK | (set() if how.shared else _keys("ln2")) | (set() if how.parallel else {"mid"})
    keys |= _keys("ln1_post") if how.attn_post else set()
    return keys | (_keys("ln2_post") if how.mlp_post else set())


def block_layout(model, tc) -> Layout | str:
    """The blocks' :class:`Layout`, or why the model's hooks do not fit the one-copy step."""
    inside, output = tc.feature_input_hook, tc.feature_output_hook
    if inside not in SITES or output not in ("mlp.hook_out", "hook_mlp_out"):
        return f"transcoders read {inside} and write {output}"
    hooks = model.hook_dict.keys()
    parallel = "blocks.0.hook_resid_mid" not in hooks
    shared = parallel and "blocks.0.ln2.hook_scale" not in hooks
    posts = [] if parallel else [p for p in POSTS if f"blocks.0.{p}.hook_scale" in hooks]
    norms = ("ln1",) if shared else ("ln1", "ln2")
    need = ["hook_embed", FINAL_HOOK] + [f"ln_final.hook_{s}" for s in _NORM]
    for layer in range(int(tc.n_layers)):
        block = f"blocks.{layer}"
        need += [f"{block}.hook_resid_pre", f"{block}.hook_resid_post", tc.input_hook(layer)]
        need += [f"{block}.attn.hook_{s}" for s in ("in", "pattern", "out")]
        need += [tc.output_hook(layer)]
        need += [f"{block}.{ln}.hook_{s}" for ln in norms + tuple(posts) for s in _NORM]
        need += [] if parallel else [f"{block}.hook_resid_mid"]
    missing = [name for name in need if name not in hooks]
    if missing:
        return f"the model has no hook {missing[0]}"
    known = {f"blocks.0.{ln}.hook_scale" for ln in ("ln1", "ln2", *posts)}
    others = [n for n in hooks if n.startswith("blocks.0.") and n.endswith(".hook_scale")]
    if others := [n for n in others if n not in known]:  # another map on the residual's way
        return f"its blocks have norms other than ln1, ln2 and sequential post-norms ({others[0]})"
    if shared and SITES[inside] != "norm":
        return f"transcoders read {inside}, but attention and MLP share one norm"
    # mlp.hook_out is the MLP's own output, hook_mlp_out what the block adds (after ln2_post)
    mlp_post = "ln2_post" in posts and output == "mlp.hook_out"
    return Layout(SITES[inside], parallel, shared, "ln1_post" in posts, mlp_post)


def with_offsets(model, norms: dict[str, NormPath]) -> dict[str, NormPath]:
    """``norms`` with each weight the model scales by as ``1 + w`` (Gemma: the bridge's
    ``uses_weight_offset``) replaced by ``1 + w``, in float32 at least as Gemma computes it."""
    for prefix, norm in norms.items():
        offset = getattr(model.get_submodule(prefix), "uses_weight_offset", False)
        if offset is True and norm.weight is not None:
            w = norm.weight
            norm.weight = 1 + w.to(torch.promote_types(w.dtype, torch.float32))
    return norms


def _frozen(norm: NormPath, seen: dict, name: str) -> bool:
    norm.recorded.update(x=seen[f"{name}_in"], scale=seen[f"{name}_scale"], out=seen[f"{name}_out"])
    return norm.check()


def check_block(seen: dict, path: ValuePath, norms: dict[str, NormPath], how: Layout) -> list:
    """The relations the transpose assumes in one block, on the recorded row (each ``[pos
    d_model]``; ``norms`` the block's by name, ``ln1``, ``ln2``, ``ln1_post``...): the names of
    those the bridge's values miss."""
    seen = {k: checked(t) for k, t in seen.items()}
    rtol = check_rtol(seen["pre"].dtype, seen["pre"].shape[-1])
    v = {k: t.float() for k, t in seen.items() if t.dim() == 2}
    misses = []

    def same(name: str, mine: Tensor, want: Tensor) -> None:
        if mine.shape != want.shape or rows_miss(mine, want, rtol) > 1.0:
            misses.append(name)

    def frozen(name: str) -> None:
        if not _frozen(norms[name], seen, name):
            misses.append(f"{name}'s frozen map")

    same("ln1 reads the residual", v["ln1_in"], v["pre"])
    same("attention reads ln1", v["attn_in"], v["ln1_out"])
    frozen("ln1")
    if not path.check(seen["attn_in"][None], seen["pattern"][None], seen["attn_out"][None]):
        misses.append("the attention's value path")
    added = {"attn_out": v["attn_out"], "mlp_out": v["mlp_out"]}  # what reaches the residual
    for post, out, there in (("ln1_post", "attn_out", how.attn_post),
                             ("ln2_post", "mlp_out", how.mlp_post)):  # fmt: skip
        if there:  # Gemma 2: the sublayer's output through its post-norm
            same(f"{post} reads the {out}", v[f"{post}_in"], v[out])
            frozen(post)
            if norms[post].centre:  # interp.graphs.one_copy.fold_post folds an RMSNorm only
                misses.append(f"{post} centres (a LayerNorm after the sublayer)")
            added[out] = v[f"{post}_out"]
    reads = v["pre"] if how.parallel else v["mid"]
    if not how.parallel:
        same("the residual after attention", v["mid"], v["pre"] + added["attn_out"])
    norm_out = v["ln1_out"] if how.shared else v.get("ln2_out")
    if not how.shared:
        same("ln2 reads the residual", v["ln2_in"], reads)
        frozen("ln2")
    if how.site == "resid":
        same("the transcoder reads the residual", v["tc_in"], reads)
    elif how.site == "norm":
        same("the transcoder reads the norm", v["tc_in"], norm_out)
    else:
        x = reads - reads.mean(-1, keepdim=True) if norms["ln2"].centre else reads
        same("the transcoder reads the normalised residual", v["tc_in"], x / v["ln2_scale"])
    mlp = added["mlp_out"] + added["attn_out"] if how.parallel else added["mlp_out"]
    same("the residual after the MLP", v["post"], reads + mlp)
    return misses


def checked(t: Tensor) -> Tensor:
    """``t`` as the checks compare it: a float64 model's values in float32, for transformers
    computes some maps of a float64 model in float32 (Llama's RMSNorm, GPT-J's attention), so
    its outputs agree with the map to float32's rounding only. A wrong map (a missing weight or
    head, ``1 + w``) misses by far more (interp.graphs.value_path.check_rtol)."""
    return t.float() if t.dtype == torch.float64 else t
