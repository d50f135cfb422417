"""What a run will cost in memory, before it runs, and how many rows fit a budget.

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

Everything scales with the number of rows, so a budget becomes a number of rows per chunk
(:func:`rows_per_chunk`, which leaves room for what glibc keeps); analyses that reduce as they
go (the induction scan) split their batch into such chunks and give the same numbers as one
pass.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import torch

__all__ = ["MemoryBudgetError", "parse_size", "format_size", "estimate_cache_bytes",
           "estimate_forward_bytes", "estimate_loss_bytes", "estimate_run_bytes", "check_budget",
           "rows_per_chunk", "drop_retained_patterns", "release_retained",
           "return_freed_memory", "trim_freed_memory"]

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
# numbers per token that one layer's transients need on top of the kept residual stream
_ATTENTION = (2, 16)  # 2 * head * pos + 16 * d_model: scores and pattern of one layer
_MLP_TRANSIENT = (5, 4)  # 5 * d_mlp + 4 * d_model: GELU's temporaries dominate
_UNEMBED = (1, 2)  # 1 * d_vocab + 2 * d_model: the logits and the final LayerNorm's output
_LOSS = (2, 4)  # 2 * d_vocab + 4 * d_model: the logits and logsumexp's temporaries (measured 2.1)


class MemoryBudgetError(ValueError):
    """A run would not fit its ``max_bytes``; the message says what would."""


def parse_size(size: int | str) -> int:
    """Bytes from ``1024``, ``"500MB"``, ``"1GiB"``, ``"1.5 GB"`` (KB/MB/GB are powers of 1000,
    KiB/MiB/GiB powers of 1024, as in accelerate's ``max_memory``)."""
    if isinstance(size, bool):
        raise ValueError(f"a memory size is a number of bytes or text like '1GiB', not {size!r}")
    if isinstance(size, int):
        value = size
    else:
        match = _SIZE.match(str(size))
        unit = match and match.group(2).lower()
        if not match or unit not in _UNITS:
            raise ValueError(f"cannot read {size!r} as a memory size; write a number of bytes or "
                             "a number with a unit: 500MB, 1GiB, 2GB (units: B, KB, MB, GB, TB, "
                             "KiB, MiB, GiB, TiB)")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"a memory size must be positive, got {size!r}")
    return value


def format_size(n_bytes: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n_bytes) < 1024 or unit == "GiB":
            return f"{n_bytes:.0f} B" if unit == "B" else f"{n_bytes:.2f} {unit}"
        n_bytes /= 1024
    return f"{n_bytes:.2f} GiB"  # pragma: no cover


def _shape(prompt_shape) -> tuple[int, int]:
    dims = tuple(int(d) for d in (prompt_shape.shape if isinstance(prompt_shape, torch.Tensor)
                                  else prompt_shape))
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
    return {"n_layers": int(cfg.n_layers), "head": n_heads, "d_head": d_head, "kv": n_kv,
            "d_model": int(cfg.d_model), "d_mlp": int(getattr(cfg, "d_mlp", 0) or 0),
            "d_vocab": int(cfg.d_vocab)}


def _per_token(suffix: str, dims: dict[str, int], n_pos: int) -> int | None:
    """Numbers per (row, position) a hook holds, by its name's suffix; None when unknown."""
    table = {
        "hook_scale": 1, "hook_pattern": dims["head"] * n_pos,
        "hook_attn_scores": dims["head"] * n_pos,
        "hook_q": dims["head"] * dims["d_head"], "hook_z": dims["head"] * dims["d_head"],
        "hook_k": dims["kv"] * dims["d_head"], "hook_v": dims["kv"] * dims["d_head"],
        "attn.hook_result": dims["head"] * dims["d_model"],
        "mlp.hook_pre": dims["d_mlp"], "mlp.hook_post": dims["d_mlp"],
    }
    for key, value in table.items():
        if suffix.endswith(key):
            return value
    d_model_hooks = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out",
                     "hook_mlp_out", "hook_embed", "hook_pos_embed", "hook_normalized",
                     "hook_out", "hook_in")
    return dims["d_model"] if suffix.endswith(d_model_hooks) else None


def _probe_per_row(model, names: Sequence[str], n_pos: int) -> dict[str, int]:
    """Bytes per row of hooks the table does not know, from one forward pass of one row."""
    sizes: dict[str, int] = {}

    def keep(act: torch.Tensor, hook) -> None:
        sizes[hook.name] = act.nbytes // max(1, act.shape[0])

    tokens = torch.zeros((1, n_pos), dtype=torch.long, device=model.cfg.device)
    with torch.inference_mode(), model.hooks(fwd_hooks=[(n, keep) for n in names],
                                             reset_hooks_end=True):
        model(tokens, return_type=None)
    release_retained(model)
    return sizes


def _cache_items(model, prompt_shape, *, resid: Sequence[str] = (), patterns: bool = False,
                 scores: bool = False, head_outputs: bool = False, ln_scales: bool = False,
                 hooks: Sequence[str] = (), layers: Sequence[int] | None = None,
                 keep_logits: bool = True) -> dict[str, int]:
    """Bytes of each kind of thing ``run_cached`` would keep (same arguments)."""
    batch, n_pos = _shape(prompt_shape)
    dims, item = _dims(model), _itemsize(model)
    chosen = range(dims["n_layers"]) if layers is None else list(dict.fromkeys(layers))
    rows = batch * n_pos * item  # bytes of one number per (row, position)
    names: dict[str, str] = {}  # hook name -> what it is, deduplicated like run_cached does
    for layer in chosen:
        for kind in resid:
            names[f"blocks.{layer}.hook_resid_{kind}"] = "resid"
        if patterns:
            names[f"blocks.{layer}.attn.hook_pattern"] = "patterns"
        if scores:
            names[f"blocks.{layer}.attn.hook_attn_scores"] = "scores"
        if ln_scales:
            for ln in ("ln1", "ln2"):
                if f"blocks.{layer}.{ln}.hook_scale" in model.hook_dict:
                    names[f"blocks.{layer}.{ln}.hook_scale"] = "ln_scales"
    if ln_scales:
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
    if head_outputs:  # stored under attn.hook_result, computed from hook_z
        items["head_outputs"] = len(chosen) * rows * dims["head"] * dims["d_model"]
    if keep_logits:
        items["logits"] = rows * dims["d_vocab"]
    return items


def estimate_cache_bytes(
        model, prompt_shape, *, resid: Sequence[str] = (), patterns: bool = False,
        scores: bool = False, head_outputs: bool = False, ln_scales: bool = False,
        hooks: Sequence[str] = (), layers: Sequence[int] | None = None,
        keep_logits: bool = True) -> int:
    """Bytes of the :class:`interp.CachedRun` that ``run_cached(model, prompt, ...)`` returns.

    ``prompt_shape`` is ``(batch, pos)`` (or ``(pos,)``, or a token tensor); the keyword
    arguments are run_cached's, with the same meaning and defaults. Counts the activations, the logits and the token ids from the model's
    shapes and dtype; hooks the estimate does not know by name are measured on one row.
    The forward pass needs working memory on top: see :func:`estimate_run_bytes`.
    """
    what = dict(resid=resid, patterns=patterns, scores=scores, head_outputs=head_outputs,
                ln_scales=ln_scales, hooks=hooks, layers=layers, keep_logits=keep_logits)
    return sum(_cache_items(model, prompt_shape, **what).values())


def estimate_forward_bytes(model, prompt_shape) -> int:
    """Peak working memory of one forward pass of ``run_cached`` (see the module docstring),
    the logits included but nothing else that is cached: the largest of one layer's attention
    (scores and pattern), one layer's MLP, and the unembedding."""
    return max(_transients(model, prompt_shape).values())


def _transients(model, prompt_shape) -> dict[str, int]:
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
    return {moment: batch * n_pos * item * n for moment, n in per_token.items()}


def estimate_loss_bytes(model, prompt_shape) -> int:
    """Peak memory of a next-token loss over the logits after the forward pass: the logits and
    ``logsumexp``'s temporaries (about ``2 * d_vocab + 4 * d_model`` numbers per token)."""
    batch, n_pos = _shape(prompt_shape)
    dims, item = _dims(model), _itemsize(model)
    return batch * n_pos * item * (_LOSS[0] * dims["d_vocab"] + _LOSS[1] * dims["d_model"])


def estimate_run_bytes(
        model, prompt_shape, *, resid: Sequence[str] = (), patterns: bool = False,
        scores: bool = False, head_outputs: bool = False, ln_scales: bool = False,
        hooks: Sequence[str] = (), layers: Sequence[int] | None = None,
        keep_logits: bool = True) -> int:
    """Peak extra memory of ``run_cached(model, prompt, ...)``: the largest of the last layer's
    three moments, each with what is cached by then. During its attention, the layer's own
    patterns, scores, head outputs and later residual streams do not exist yet; during its MLP,
    its ``resid_post``; at the unembedding the whole cache does (the logits are counted there,
    whether they are kept or not)."""
    what = dict(resid=resid, patterns=patterns, scores=scores, head_outputs=head_outputs,
                ln_scales=ln_scales, hooks=hooks, layers=layers, keep_logits=keep_logits)
    cache = estimate_cache_bytes(model, prompt_shape, **{**what, "keep_logits": False})
    moments = _transients(model, prompt_shape)
    batch, n_pos = _shape(prompt_shape)
    dims = _dims(model)
    last = dims["n_layers"] - 1
    row = batch * n_pos * _itemsize(model)  # one number per token
    after_mlp = after_attention = 0
    if layers is None or last in layers:
        after_mlp = row * dims["d_model"] * ("post" in resid)
        after_attention = after_mlp + row * (dims["d_model"] * ("mid" in resid)
                                             + dims["head"] * n_pos * (patterns + scores)
                                             + dims["head"] * dims["d_model"] * head_outputs)
    return max(cache - after_attention + moments["attention"], cache - after_mlp + moments["mlp"],
               cache + moments["unembed"])


def rows_per_chunk(model, n_pos: int, max_bytes: int | str, *, n_rows: int,
                   kept_per_row: int = 0, loss: bool = False, held: int = 0,
                   what: str = "this analysis") -> int:
    """How many rows of ``n_pos`` tokens one forward pass may take under ``max_bytes``.

    ``kept_per_row``: bytes per row a pass needs beside the forward pass (what it records);
    ``loss``: it computes a next-token loss from the logits after each pass
    (:func:`estimate_loss_bytes`); ``held``: bytes the analysis keeps throughout, whatever its
    chunks (they come off the budget first). Chunks are planned to 90% of the budget, and to 2.5x the
    estimate per row: glibc keeps freed memory resident (peaks measured 1.4-2.5x what is in
    use), and splitting costs almost nothing, since a pass's time grows with its rows. Only
    when one row would not fit that way are freed blocks returned to the operating system
    (:func:`return_freed_memory`, which costs page faults) and chunks planned to the estimate
    itself. Raises :class:`MemoryBudgetError` when not even one row fits.
    """
    budget = parse_size(max_bytes)
    per_row = estimate_forward_bytes(model, (1, n_pos))
    if loss:
        per_row = max(per_row, estimate_loss_bytes(model, (1, n_pos)))
    per_row += kept_per_row
    usable = int((budget - held) * _PLAN_SHARE)
    if held and per_row > usable:
        least = held + per_row / _PLAN_SHARE
        raise MemoryBudgetError(
            f"{what} keeps {format_size(held)} throughout and needs about "
            f"{format_size(per_row)} per row of {n_pos} tokens in a pass, more than "
            f"max_bytes={format_size(budget)} allows (passes are planned to {_PLAN_SHARE:.0%} "
            f"of what is left); raise max_bytes to at least {format_size(least)}, or use fewer "
            "or shorter rows")
    if per_row > usable:
        raise MemoryBudgetError(
            f"{what} needs about {format_size(per_row)} per row of {n_pos} tokens, more than "
            f"{_PLAN_SHARE:.0%} of max_bytes={format_size(budget)}; raise max_bytes to at least "
            f"{format_size(per_row / _PLAN_SHARE)} or use shorter rows")
    if per_row * n_rows * _GLIBC_SLACK <= usable:
        return n_rows  # one pass, with room for what glibc keeps
    if per_row * _GLIBC_SLACK <= usable:
        return int(usable // (per_row * _GLIBC_SLACK))
    return_freed_memory()
    return min(n_rows, usable // per_row)


def check_budget(
        model, prompt_shape, max_bytes: int | str, *, resid: Sequence[str] = (), patterns: bool = False,
        scores: bool = False, head_outputs: bool = False, ln_scales: bool = False,
        hooks: Sequence[str] = (), layers: Sequence[int] | None = None,
        keep_logits: bool = True) -> None:
    """Raise :class:`MemoryBudgetError` before a run of ``run_cached(...)`` that would not fit,
    saying what would: a smaller batch, fewer layers, or dropping the largest items."""
    what = dict(resid=resid, patterns=patterns, scores=scores, head_outputs=head_outputs,
                ln_scales=ln_scales, hooks=hooks, layers=layers, keep_logits=keep_logits)
    budget = parse_size(max_bytes)
    batch, n_pos = _shape(prompt_shape)
    need = estimate_run_bytes(model, (batch, n_pos), **what)
    if budget < _GLIBC_SLACK_ONE_PASS * need:
        return_freed_memory()
    if need <= budget:
        return
    items = _cache_items(model, (batch, n_pos), **what)
    items.pop("logits", None)  # counted with the forward pass, where they are made
    parts = ", ".join(f"{k} {format_size(v)}" for k, v in sorted(items.items(), key=lambda kv: -kv[1])
                      if v)
    n_layers = int(model.cfg.n_layers)
    chosen = list(range(n_layers)) if what.get("layers") is None else list(what["layers"])
    forward = need - sum(items.values())
    options = []
    per_row = estimate_run_bytes(model, (1, n_pos), **what)
    if per_row <= budget:
        options.append(f"a batch of at most {budget // per_row} rows (of {batch})")
    fits_layers = [k for k in range(1, len(chosen))
                   if estimate_run_bytes(model, (batch, n_pos), **{**what, "layers": chosen[:k]})
                   <= budget]
    if fits_layers:
        options.append(f"at most {fits_layers[-1]} of the {len(chosen)} layers "
                       f"(layers={chosen[:fits_layers[-1]]})")
    big = [k for k in ("patterns", "scores", "head_outputs") if what.get(k)]
    if big:
        lean = estimate_run_bytes(model, (batch, n_pos), **{**what, **dict.fromkeys(big, False)})
        verdict = "fits" if lean <= budget else "still needs " + format_size(lean)
        options.append(f"reducing {' and '.join(big)} inside a hook instead of caching them "
                       f"(run_cached(interventions=...), as the induction scan does; {verdict})")
    advice = "; or ".join(options) if options else (
        f"nothing smaller fits: one row alone needs {format_size(per_row)}; use shorter prompts")
    raise MemoryBudgetError(
        f"this run needs about {format_size(need)} (cache: {parts}; forward pass with logits "
        f"{format_size(forward)}) but max_bytes is {format_size(budget)}. What fits: {advice}.")


def drop_retained_patterns(model) -> list[tuple[str, object]]:
    """Forward hooks that drop each layer's retained pattern as soon as its attention is done
    (TransformerLens 4.3 keeps it, unread, on the attention module as ``_pattern``): without
    them a pass holds every layer's ``[batch head q_pos k_pos]`` pattern until it ends."""
    hooks = []
    for layer, block in enumerate(getattr(model, "blocks", [])):
        name = f"blocks.{layer}.attn.hook_out"
        attn = getattr(block, "attn", None)
        if attn is not None and name in model.hook_dict:
            def drop(act, hook, attn=attn):
                attn._pattern = None

            hooks.append((name, drop))
    return hooks


def release_retained(model) -> None:
    """Drop the attention patterns TransformerLens 4.3's attention keeps after a forward pass
    (``_pattern``, ``n_layers * batch * head * pos**2`` numbers that would stay allocated)."""
    for module in model.modules():
        if getattr(module, "_pattern", None) is not None:
            module._pattern = None


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
# glibc's default keeps resident up to this many times the memory in use (measured 1.4-2.2x
# for one pass, growing to 2.5x over 14 chunks): plans this much above the estimate hold
# without returning memory (which costs page faults); run_cached's single pass uses 2
_GLIBC_SLACK = 2.5
_GLIBC_SLACK_ONE_PASS = 2
# chunks are planned to this share of a budget: the rest covers the estimate's error and
# what grows across chunks (allocator, interpreter; measured up to +7% after 6 chunks)
_PLAN_SHARE = 0.9
_FREED_MEMORY_RETURNED = False


def return_freed_memory(threshold: int = 2**20) -> bool:
    """Make freed tensors of ``threshold`` bytes or more go back to the operating system at once.

    glibc raises its mmap threshold as large blocks are freed, after which tensors of up to
    32 MiB come from a heap that keeps freed memory resident: a forward pass then peaks ~40%
    above what it uses (measured by benchmarks/bench_memory.py). Fixing the threshold (glibc's
    ``mallopt(M_MMAP_THRESHOLD)``, what ``MALLOC_MMAP_THRESHOLD_`` sets) keeps the peak at
    what is in use, at the price of page faults on fresh memory (a scan ran 1.3-1.5x slower).
    Process-wide and harmless to results; interp calls it only where splitting cannot help:
    a ``run_cached`` budget under twice its estimate, or chunks where one row with glibc's
    slack would not fit. It leaves a ``MALLOC_MMAP_THRESHOLD_`` the user set alone. Returns
    False where there is no glibc (macOS, Windows, musl).
    """
    global _FREED_MEMORY_RETURNED
    if _FREED_MEMORY_RETURNED or os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return True  # done already, or the user chose glibc's threshold
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt, trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return False
    _FREED_MEMORY_RETURNED = bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))
    if _FREED_MEMORY_RETURNED:
        trim(0)  # and hand back what the heap holds now
    return _FREED_MEMORY_RETURNED



def trim_freed_memory() -> bool:
    """Hand back to the operating system the free memory glibc's heap still holds
    (``malloc_trim(0)``), so that the process's resident size is what it uses.

    ``run_cached`` calls it after a pass that keeps activations: glibc's default keeps the
    pass's freed working memory resident, 1.4-1.9x the cache on the benchmark, and after the
    trim the resident growth is within 7% of :func:`estimate_cache_bytes`. Returns False where
    there is no glibc.
    """
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim  # noqa: B018 - glibc only
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC is False:
        return False
    _LIBC.malloc_trim(0)
    return True


_LIBC = None  # glibc, once looked up; False where there is none
