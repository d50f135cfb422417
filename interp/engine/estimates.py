"""What a run will cost in memory, from the model's shapes, before it runs.

Two numbers matter. The *cache* is what :func:`interp.run_cached` hands back (activations,
logits, tokens): :func:`estimate_cache_bytes` counts it exactly from the model's shapes. The
*working memory* of the forward pass is what exists only while it runs; on TransformerLens 4.3
it is the largest of three moments, one layer at a time (measured on GPT-2- and NeoX-shaped
models, see benchmarks/bench_memory.py):

* a layer's attention: its scores and pattern, ``2 * head * pos`` numbers per token (plus
  about ``16 * d_model``); this dominates long prompts;
* a layer's MLP: the hidden activations and GELU's temporaries (about
  ``5 * d_mlp + 4 * d_model`` numbers per token);
* the unembedding: the logits (``d_vocab + 2 * d_model``); a loss over them afterwards needs
  ``2 * d_vocab`` more (:func:`estimate_loss_bytes`).

TransformerLens 4.3's attention also keeps every layer's last pattern alive, unread
(``_pattern``), which would add ``n_layers * head * pos**2`` numbers per row until the pass
ends; ``run_cached`` drops each one as soon as its layer is done
(:func:`drop_retained_patterns`).

Peaks match these estimates once freed memory goes back to the operating system at once
(:func:`return_freed_memory`); glibc's default keeps 1.4-2.2x what is in use resident.

How a budget becomes chunks of rows is :mod:`interp.engine.plan`."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from interp.engine.allocator import release_retained
from interp.foundation.sizes import format_size, parse_size

__all__ = [
    "parse_size",
    "format_size",
    "estimate_cache_bytes",
    "estimate_forward_bytes",
    "estimate_loss_bytes",
    "estimate_run_bytes",
    "estimate_attribution_bytes",
    "Kept",
]

# numbers per token that one layer's transients need on top of the kept residual stream
_ATTENTION = (2, 16)  # 2 * head * pos + 16 * d_model: scores and pattern of one layer
_MLP_TRANSIENT = (5, 4)  # 5 * d_mlp + 4 * d_model: GELU's temporaries dominate
_UNEMBED = (1, 2)  # 1 * d_vocab + 2 * d_model: the logits and the final LayerNorm's output
_LOSS = (2, 4)  # 2 * d_vocab + 4 * d_model: the logits and logsumexp's temporaries (measured 2.1)


def _shape(prompt_shape) -> tuple[int, int]:
    dims = tuple(
        int(d)
        for d in (prompt_shape.shape if isinstance(prompt_shape, torch.Tensor) else prompt_shape)
    )
    if len(dims) == 1:
        dims = (1, dims[0])
    if len(dims) != 2 or min(dims) < 1:
        raise ValueError(f"prompt_shape is (batch, pos) or (pos,), got {prompt_shape!r}")
    return dims


def _itemsize(model) -> int:
    dtype = getattr(model.cfg, "dtype", None)
    return (dtype if isinstance(dtype, torch.dtype) else torch.float32).itemsize


def _dims(model) -> dict[str, int]:
    cfg = model.cfg
    n_heads = int(cfg.n_heads)
    d_head = int(getattr(cfg, "d_head", 0) or int(cfg.d_model) // n_heads)
    n_kv = int(getattr(cfg, "n_key_value_heads", None) or n_heads)
    return {
        "n_layers": int(cfg.n_layers),
        "head": n_heads,
        "d_head": d_head,
        "kv": n_kv,
        "d_model": int(cfg.d_model),
        "d_mlp": int(getattr(cfg, "d_mlp", 0) or 0),
        "d_vocab": int(cfg.d_vocab),
    }


def _per_token(suffix: str, dims: dict[str, int], n_pos: int) -> int | None:
    """Numbers per (row, position) a hook holds, by its name's suffix; None when unknown."""
    table = {
        "hook_scale": 1,
        "hook_pattern": dims["head"] * n_pos,
        "hook_attn_scores": dims["head"] * n_pos,
        "hook_q": dims["head"] * dims["d_head"],
        "hook_z": dims["head"] * dims["d_head"],
        "hook_k": dims["kv"] * dims["d_head"],
        "hook_v": dims["kv"] * dims["d_head"],
        "attn.hook_result": dims["head"] * dims["d_model"],
        "mlp.hook_pre": dims["d_mlp"],
        "mlp.hook_post": dims["d_mlp"],
    }
    for key, value in table.items():
        if suffix.endswith(key):
            return value
    d_model_hooks = (
        "hook_resid_pre",
        "hook_resid_mid",
        "hook_resid_post",
        "hook_attn_out",
        "hook_mlp_out",
        "hook_embed",
        "hook_pos_embed",
        "hook_normalized",
        "hook_out",
        "hook_in",
    )
    return dims["d_model"] if suffix.endswith(d_model_hooks) else None


def _probe_per_row(model, names: Sequence[str], n_pos: int) -> dict[str, int]:
    """Bytes per row of hooks the table does not know, from one forward pass of one row."""
    sizes: dict[str, int] = {}

    def keep(act: torch.Tensor, hook) -> None:
        sizes[hook.name] = act.nbytes // max(1, act.shape[0])

    tokens = torch.zeros((1, n_pos), dtype=torch.long, device=model.cfg.device)
    with (
        torch.inference_mode(),
        model.hooks(fwd_hooks=[(n, keep) for n in names], reset_hooks_end=True),
    ):
        model(tokens, return_type=None)
    release_retained(model)
    return sizes


@dataclass(frozen=True)
class Kept:
    """What a :func:`interp.run_cached` call keeps: its keyword arguments of these names, with
    the same meaning and defaults (the estimates and :func:`interp.engine.check_budget` take
    them as keywords)."""

    resid: Sequence[str] = ()
    patterns: bool = False
    scores: bool = False
    head_outputs: bool = False
    ln_scales: bool = False
    hooks: Sequence[str] = ()
    layers: Sequence[int] | None = None
    keep_logits: bool = True
    saes: Sequence = ()


def takes_kept(fn):
    """``fn(..., **kept)`` shown, by ``inspect`` and in docs/api.md, with :class:`Kept`'s fields
    as keyword-only parameters: that is how it is called (``Kept(**kept)`` refuses others)."""
    own = inspect.signature(fn).parameters.values()
    params = [p for p in own if p.kind is not p.VAR_KEYWORD]
    params += [p.replace(kind=p.KEYWORD_ONLY) for p in inspect.signature(Kept).parameters.values()]
    fn.__signature__ = inspect.signature(fn).replace(parameters=params)
    return fn


def _cache_items(model, prompt_shape, kept: Kept) -> dict[str, int]:
    """Bytes of each kind of thing ``run_cached`` would keep."""
    resid, layers, hooks, saes = kept.resid, kept.layers, kept.hooks, kept.saes
    batch, n_pos = _shape(prompt_shape)
    dims, item = _dims(model), _itemsize(model)
    chosen = range(dims["n_layers"]) if layers is None else list(dict.fromkeys(layers))
    rows = batch * n_pos * item  # bytes of one number per (row, position)
    names: dict[str, str] = {}  # hook name -> what it is, deduplicated like run_cached does
    for layer in chosen:
        for kind in resid:
            names[f"blocks.{layer}.hook_resid_{kind}"] = "resid"
        if kept.patterns:
            names[f"blocks.{layer}.attn.hook_pattern"] = "patterns"
        if kept.scores:
            names[f"blocks.{layer}.attn.hook_attn_scores"] = "scores"
        if kept.ln_scales:
            for ln in ("ln1", "ln2"):
                if f"blocks.{layer}.{ln}.hook_scale" in model.hook_dict:
                    names[f"blocks.{layer}.{ln}.hook_scale"] = "ln_scales"
    if kept.ln_scales:
        names["ln_final.hook_scale"] = "ln_scales"
    for name in hooks:
        names.setdefault(name, "hooks")
    items: dict[str, int] = {"tokens": batch * n_pos * 8}
    unknown = [n for n in names if _per_token(n, dims, n_pos) is None]
    probed = _probe_per_row(model, unknown, n_pos) if unknown else {}
    for name, kind in names.items():
        per_token = _per_token(name, dims, n_pos)
        size = rows * per_token if per_token is not None else batch * probed.get(name, 0)
        items[kind] = items.get(kind, 0) + size
    if kept.head_outputs:  # stored under attn.hook_result, computed from hook_z
        items["head_outputs"] = len(chosen) * rows * dims["head"] * dims["d_model"]
    if saes:  # feature activations [batch pos d_sae] of each spliced SAE
        items["sae_acts"] = rows * sum(int(sae.d_sae) for sae in saes)
    if kept.keep_logits:
        items["logits"] = rows * dims["d_vocab"]
    return items


@takes_kept
def estimate_cache_bytes(model, prompt_shape, **kept) -> int:
    """Bytes of the :class:`interp.CachedRun` that ``run_cached(model, prompt, ...)`` returns.

    ``prompt_shape`` is ``(batch, pos)`` (or ``(pos,)``, or a token tensor); the keyword
    arguments are run_cached's of what it keeps (:class:`Kept`), with the same meaning and
    defaults. Counts the activations,
    the logits and the token ids from the model's shapes and dtype; hooks the estimate does
    not know by name are measured on one row; spliced ``saes`` add their feature activations.
    The forward pass needs working memory on top: see :func:`estimate_run_bytes`.
    """
    return sum(_cache_items(model, prompt_shape, Kept(**kept)).values())


def estimate_forward_bytes(model, prompt_shape, *, read_positions: int | None = None) -> int:
    """Peak working memory of one forward pass of ``run_cached`` (see the module docstring),
    the logits included but nothing else that is cached: the largest of one layer's attention
    (scores and pattern), one layer's MLP, and the unembedding. ``read_positions``: a pass
    that unembeds only that many positions per row (``interp.engine.passes.forward_read``)."""
    return max(_transients(model, prompt_shape, read_positions).values())


def _transients(model, prompt_shape, read_positions: int | None = None) -> dict[str, int]:
    """Bytes of each moment's working memory: one layer's attention, one layer's MLP, and the
    unembedding (see the module docstring)."""
    batch, n_pos = _shape(prompt_shape)
    dims, item = _dims(model), _itemsize(model)
    d_mlp = dims["d_mlp"] or 4 * dims["d_model"]
    per_token = {
        "attention": _ATTENTION[0] * dims["head"] * n_pos + _ATTENTION[1] * dims["d_model"],
        "mlp": _MLP_TRANSIENT[0] * d_mlp + _MLP_TRANSIENT[1] * dims["d_model"],
        "unembed": _UNEMBED[0] * dims["d_vocab"] + _UNEMBED[1] * dims["d_model"],
    }
    moments = {moment: batch * n_pos * item * n for moment, n in per_token.items()}
    if read_positions is not None:
        moments["unembed"] = batch * min(n_pos, read_positions) * item * per_token["unembed"]
    return moments


def estimate_loss_bytes(model, prompt_shape) -> int:
    """Peak memory of a next-token loss over the logits after the forward pass: the logits and
    ``logsumexp``'s temporaries (about ``2 * d_vocab + 4 * d_model`` numbers per token)."""
    batch, n_pos = _shape(prompt_shape)
    dims, item = _dims(model), _itemsize(model)
    return batch * n_pos * item * (_LOSS[0] * dims["d_vocab"] + _LOSS[1] * dims["d_model"])


@takes_kept
def estimate_run_bytes(model, prompt_shape, **kept) -> int:
    """Peak extra memory of ``run_cached(model, prompt, ...)``: the largest of the last layer's
    three moments, each with what is cached by then. During its attention, the layer's own
    patterns, scores, head outputs and later residual streams do not exist yet; during its MLP,
    its ``resid_post``; at the unembedding the whole cache does (the logits are counted there,
    whether they are kept or not). The keyword arguments: :class:`Kept`."""
    return _run_bytes(model, prompt_shape, Kept(**kept))


def _run_bytes(model, prompt_shape, kept: Kept) -> int:
    resid = kept.resid
    cache = sum(_cache_items(model, prompt_shape, replace(kept, keep_logits=False)).values())
    moments = _transients(model, prompt_shape)
    batch, n_pos = _shape(prompt_shape)
    dims = _dims(model)
    last = dims["n_layers"] - 1
    row = batch * n_pos * _itemsize(model)  # one number per token
    after_mlp = after_attention = 0
    if kept.layers is None or last in kept.layers:
        after_mlp = row * dims["d_model"] * ("post" in resid)
        after_attention = after_mlp + row * (
            dims["d_model"] * ("mid" in resid)
            + dims["head"] * n_pos * (kept.patterns + kept.scores)
            + dims["head"] * dims["d_model"] * kept.head_outputs
        )
    return max(
        cache - after_attention + moments["attention"],
        cache - after_mlp + moments["mlp"],
        cache + moments["unembed"],
    )


def estimate_attribution_bytes(model, n_pos: int) -> int:
    """Peak extra memory of :func:`attribution_deltas` on one prompt of ``n_pos`` tokens: the
    forward pass with gradients keeps every layer's activations for the backward pass (per
    token and layer about ``3 * head * pos`` numbers for scores, pattern and its gradient,
    ``4 * head * d_head`` for q, k, v, z, ``3 * d_mlp`` and ``15 * d_model``), plus the logits
    and their gradient (``3 * d_vocab``). Measured on a GPT-2-small-shaped model (first call in
    a fresh process, freed memory returned at once): 4% under the peak at 41 tokens, 2% over
    at 81."""
    dims = _dims(model)
    d_mlp = dims["d_mlp"] or 4 * dims["d_model"]
    per_layer = (
        3 * dims["head"] * n_pos
        + 4 * dims["head"] * dims["d_head"]
        + 3 * d_mlp
        + 15 * dims["d_model"]
    )
    return n_pos * _itemsize(model) * (dims["n_layers"] * per_layer + 3 * dims["d_vocab"])
