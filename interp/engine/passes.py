"""One forward pass with hooks: the only place the engine calls the model.

Every pass runs without Hugging Face's KV cache (two residual streams per layer and row that
no analysis reads), drops each layer's retained attention pattern as soon as the layer is done
(:func:`interp.engine.allocator.drop_retained_patterns`), and removes its hooks when it ends,
also when a hook or the model raises.

:func:`forward_read` is a pass read at one position per row: it stops where the residual
enters ``ln_final`` and applies ``ln_final`` and the unembedding to that one position of each
row, instead of ``[batch pos d_vocab]`` logits (GPT-2 small's unembedding costs about five of
its layers per token). :func:`reads_like_forward` checks, on one row, that a model's logits
are that (a model that changes them after the unembedding, say by soft-capping, is not).

Given ``prefix`` (:func:`prefix_cache`), :func:`forward_read` runs only the tokens after a
prefix whose keys and values another pass recorded (:func:`record_states`): the attention of
every layer reads the prefix's keys and values, repeated over the batch as hooks repeat its
rows, and the positions continue after it. The engine injects them into each attention module
itself (TransformerLens's attention reads ``past_key_values``, which Hugging Face now passes as
``cache``); :func:`interp.engine.suffix.suffix_like_forward` checks a model on one row first.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from interp.engine.allocator import drop_retained_patterns, release_retained
from interp.foundation.fallbacks import warn_fallback

logger = logging.getLogger(__name__)

__all__ = [
    "HookFn",
    "forward",
    "forward_read",
    "reads_like_forward",
    "store_hook",
    "record_states",
    "hook_shape",
    "prefix_cache",
    "masks_follow_rows",
    "STRUCTURE_ERRORS",
]

# what a model laid out otherwise raises when a fast path cannot follow it (a missing module,
# a shape the path does not expect); out of memory (a RuntimeError too) is always re-raised first
STRUCTURE_ERRORS = (
    AttributeError,
    TypeError,
    ValueError,
    IndexError,
    KeyError,
    NotImplementedError,
    RuntimeError,
)

HookFn = Callable[..., Tensor | None]  # a forward hook: (activation, hook) -> new value or None


_SCALE_EDIT = "A forward hook edited hook_scale"  # TransformerLens 4.3's warning


def forward(
    model,
    tokens: Int[Tensor, "batch pos"],
    hooks: Sequence[tuple[str, HookFn]] = (),
    *,
    grad: bool = False,
) -> Float[Tensor, "batch pos d_vocab"]:
    """The logits of ``tokens`` with ``hooks`` applied (in order), under ``inference_mode``, or
    with gradients enabled when ``grad`` (attribution patching differentiates the logits after
    the pass); the retained patterns are dropped after the hooks that may read them."""
    fwd_hooks = [*hooks, *drop_retained_patterns(model)]
    mode = torch.enable_grad() if grad else torch.inference_mode()
    try:
        with (
            mode,
            model.hooks(fwd_hooks=fwd_hooks, reset_hooks_end=True),
            warnings.catch_warnings(),
        ):
            # TransformerLens 4.3 warns whenever a hook returns a norm's scale; interp's frozen
            # passes hold the scales on purpose (the same values, detached)
            warnings.filterwarnings("ignore", message=_SCALE_EDIT)
            return model(tokens, return_type="logits", use_cache=False)
    finally:
        release_retained(model)


READ_HOOK = "ln_final.hook_in"  # the residual stream after the last block
# hooks at or after READ_HOOK would see one position, not the pass's [batch pos ...]
_AFTER_READ = ("ln_final.", "unembed.", "hook_unembed")


class _Stop(Exception):
    """Raised at :data:`READ_HOOK` once the residual is kept: the rest of the pass is unread."""


class _PrefixLayer(DynamicLayer):
    """One layer's recorded keys and values ``[rows kv_heads prefix d_head]``, put before the
    pass's own and repeated to its batch (run-major, as the hooks repeat rows); never grown."""

    def __init__(self, keys: Tensor, values: Tensor):
        super().__init__()
        self.keys, self.values = keys, values
        self.is_initialized, self.device = True, keys.device

    def update(self, keys: Tensor, values: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        repeat = keys.shape[0] // self.keys.shape[0]
        old_k, old_v = self.keys, self.values
        if repeat > 1:
            old_k, old_v = old_k.repeat(repeat, 1, 1, 1), old_v.repeat(repeat, 1, 1, 1)
        return torch.cat([old_k, keys], dim=-2), torch.cat([old_v, values], dim=-2)


def prefix_cache(
    states: DynamicCache, rows: slice, length: int
) -> Cache:  # keys, values [rows kv_heads pos d_head] per layer
    """The first ``length`` positions of ``rows`` of recorded ``states``
    (:func:`record_states`), as a prefix for :func:`forward_read`."""
    return Cache(
        layers=[
            _PrefixLayer(layer.keys[rows, :, :length], layer.values[rows, :, :length])
            for layer in states.layers
        ]
    )


@contextmanager
def _attention_reads(model, cache: Cache | None) -> Iterator[None]:
    """While open, every block's attention gets ``cache`` as ``past_key_values``."""
    if cache is None:
        yield
        return

    def give(module, args: tuple, kwargs: dict):
        if kwargs.get("past_key_values") is None and kwargs.get("layer_past") is None:
            return args, {**kwargs, "past_key_values": cache}
        return None

    handles = [
        block.attn.register_forward_pre_hook(give, with_kwargs=True) for block in model.blocks
    ]
    try:
        with warnings.catch_warnings():  # Hugging Face renames past_key_values to cache
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        for handle in handles:
            handle.remove()


def _run(model, tokens, fwd_hooks, cache: Cache | None) -> None:
    extra = {} if cache is None else {"past_key_values": cache}
    with _attention_reads(model, cache), model.hooks(fwd_hooks=fwd_hooks, reset_hooks_end=True):
        model(tokens, return_type="logits", use_cache=cache is not None, **extra)


def hook_shape(model, name: str) -> tuple[int, ...]:
    """The shape ``name``'s activation has in a pass of one row of two tokens (the pass stops
    there): ``(1, 2, ...)`` where the hook sees ``[batch pos ...]``; some bridges flatten batch
    and position inside a block (OPT's MLP norm: ``(2, d_model)``)."""
    seen: dict[str, tuple[int, ...]] = {}

    def stop(act: Tensor, hook) -> None:
        seen["shape"] = tuple(act.shape)
        raise _Stop

    tokens = torch.zeros(1, 2, dtype=torch.long, device=model.cfg.device)
    try:
        with torch.inference_mode():
            try:
                _run(model, tokens, [(name, stop), *drop_retained_patterns(model)], None)
            except _Stop:
                pass
    finally:
        release_retained(model)
    if "shape" not in seen:
        raise RuntimeError(f"the model's pass did not reach {name}")
    return seen["shape"]


@contextmanager
def _stopped_pass(model, tokens, hooks, stop: HookFn, cache: Cache | None) -> Iterator[None]:
    """A pass under ``inference_mode`` that ``stop`` ends at :data:`READ_HOOK` by raising
    :class:`_Stop`; the block runs after it, still in inference mode, and the retained patterns
    are dropped at the end."""
    fwd_hooks = [*hooks, *drop_retained_patterns(model), (READ_HOOK, stop)]
    try:
        with torch.inference_mode():
            try:
                _run(model, tokens, fwd_hooks, cache)
            except _Stop:
                pass
            yield
    finally:
        release_retained(model)


def record_states(
    model, tokens: Int[Tensor, "batch pos"], hooks: Sequence[tuple[str, HookFn]] = ()
) -> DynamicCache:
    """Every layer's attention keys and values of ``tokens`` (as the attention reads them:
    rotated, on rotary models), with ``hooks`` applied; the pass stops before ``ln_final``."""
    states = DynamicCache()

    def stop(act: Tensor, hook) -> None:
        raise _Stop

    with _stopped_pass(model, tokens, hooks, stop, states):
        pass
    if len(states.layers) != len(model.blocks):
        raise RuntimeError("the model's attention did not record its keys and values")
    return states


def forward_read(
    model,
    tokens: Int[Tensor, "batch pos"],
    hooks: Sequence[tuple[str, HookFn]],
    read_at: Int[Tensor, " batch"],
    *,
    prefix: Cache | None = None,
) -> Float[Tensor, "batch d_vocab"]:
    """The logits of ``tokens`` with ``hooks`` applied, at position ``read_at[b]`` of each row
    ``b`` only: the residual entering ``ln_final`` is gathered there and the pass stops;
    ``ln_final`` and the unembedding then run on ``[batch 1 d_model]``. Callers check the
    model with :func:`reads_like_forward` first; ``hooks`` must not be at or after
    ``ln_final.hook_in`` (they would see one position). ``prefix``: ``tokens`` continue a
    recorded prefix (module docstring); ``read_at`` then counts from the first of ``tokens``."""
    late = [name for name, _ in hooks if name.startswith(_AFTER_READ)]
    if late:
        raise ValueError(f"forward_read cannot apply hooks at or after {READ_HOOK}: {late}")
    kept: dict[str, Tensor] = {}

    def keep(act: Tensor, hook) -> None:
        rows = torch.arange(act.shape[0], device=act.device)
        kept["resid"] = act[rows, read_at.to(act.device)][:, None]  # [batch 1 d_model]
        raise _Stop

    with _stopped_pass(model, tokens, hooks, keep, prefix):
        if "resid" not in kept:
            raise RuntimeError(f"the model's pass did not reach {READ_HOOK}")
        return model.unembed(model.ln_final(kept["resid"]))[:, 0]


def reads_like_forward(
    model,
    tokens: Int[Tensor, "batch pos"],
    read_at: Int[Tensor, " batch"],
    hook_names: Sequence[str] = (),
) -> bool:
    """Whether :func:`forward_read` gives this model's logits: it has ``ln_final`` and
    ``unembed`` with :data:`READ_HOOK`, is not placed by accelerate (``device_map``), no hook in
    ``hook_names`` is at or after it, and on the first row of ``tokens`` the two agree (float
    rounding: 1e-5). When not, the caller computes the full logits, and a warning (once per
    reason and process) says so. Out of memory is raised, never taken for a mismatch."""
    reason = _read_refused(model, tokens, read_at, hook_names)
    if reason is None:
        return True
    warn_fallback(
        logger,
        f"forward_read:{reason.split(':')[0]}",
        "the one-position read (forward_read) is not used: %s; computing the full logits (slower)",
        reason,
    )
    return False


def _read_refused(model, tokens: Tensor, read_at: Tensor, hook_names: Sequence[str]) -> str | None:
    """Why :func:`forward_read` cannot stand for this model's logits, or None."""
    if not (hasattr(model, "ln_final") and hasattr(model, "unembed")):
        return "the model has no ln_final and unembed"
    if getattr(getattr(model, "original_model", None), "hf_device_map", None):
        return "placed by accelerate, whose hooks must see every pass to its end"
    if READ_HOOK not in model.hook_dict:
        return f"the model has no {READ_HOOK}"
    if any(n.startswith(_AFTER_READ) for n in hook_names):
        return f"a hook at or after {READ_HOOK}"
    probe, at = tokens[:1], read_at[:1]
    try:
        fast = forward_read(model, probe, (), at)
    except torch.OutOfMemoryError:
        raise
    except STRUCTURE_ERRORS as exc:  # a structure the read cannot follow
        return f"it raised {type(exc).__name__}: {str(exc).strip()[:200]}"
    full = forward(model, probe)[:, int(at[0])]
    if fast.shape != full.shape or not torch.allclose(fast, full, rtol=1e-5, atol=1e-5):
        return "its logits differ from the model's (soft-capping or another final step)"
    return None


def store_hook(store: dict, name: str, copy: bool = False) -> HookFn:
    """A hook keeping its activation in ``store[name]`` (a copy where later hooks edit it in
    place: what was kept must not change)."""

    def hook(act: Tensor, hook) -> None:
        store[name] = act.detach().clone() if copy else act.detach()

    return hook


def _repeat_mask(module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """Repeat an attention mask made for the rows ``[rows 1 q_pos k_pos]`` to the repeated
    batch ``[runs * rows ...]`` (run-major, as the rows were), so each row keeps its own."""
    mask = kwargs.get("attention_mask")
    hidden = args[0] if args else kwargs.get("hidden_states")
    if not isinstance(mask, Tensor) or not isinstance(hidden, Tensor) or mask.ndim < 3:
        return None
    rows, batch = mask.shape[0], hidden.shape[0]
    if rows in (1, batch) or batch % rows:
        return None
    return args, {**kwargs, "attention_mask": mask.repeat(batch // rows, *[1] * (mask.ndim - 1))}


@contextmanager
def masks_follow_rows(model) -> Iterator[None]:
    """While the block is open, attention masks follow the rows when a hook repeats them: the
    model builds its (causal) mask for the batch it was given, ``[rows ...]``, which does not
    broadcast over ``[runs * rows ...]`` once ``rows > 1``."""
    handles = [
        block.attn.register_forward_pre_hook(_repeat_mask, with_kwargs=True)
        for block in model.blocks
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
