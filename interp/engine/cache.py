"""Run a prompt and keep exactly the activations an analysis asked for.

``run_cached(model, prompt, patterns=True)`` caches one hook per layer, not the whole forward
pass: a GPT-2-small-shaped model on 8x256 tokens holds 4.9 GB of activations if everything is
kept, 72 MB for the residual stream after each layer. Per-head outputs (``z @ W_O`` per head)
are computed inside the hook from ``hook_z`` so that neither ``z`` nor TransformerLens's gated
``hook_result`` is kept.

Hooks added here live only for the run: they are removed when it ends, also when a hook or
the forward pass raises (``model.hooks`` context; see tests/engine/test_caching.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.engine.allocator import trim_freed_memory
from interp.engine.feature_edit import FeatureEdit
from interp.engine.hooks import compile_hooks
from interp.engine.passes import HookFn, forward, store_hook
from interp.engine.plan import check_budget
from interp.engine.sites import Intervention
from interp.engine.splice import check_saes, sae_hooks
from interp.engine.tokens import (
    RESID_KINDS,
    Prompt,
    _no_resid_mid,
    check_hook_names,
    hook_name,
    to_tokens,
)
from interp.engine.transcoder_splice import check_transcoders, transcoder_hooks
from interp.foundation.formatting import (
    grouped_names,
    megabytes,
    nbytes,
    summary_html,
    table_html,
    tensor_text,
)
from interp.models.offload import stacked_weight

__all__ = ["CachedRun", "run_cached", "run_logits"]


@dataclass(frozen=True)
class CachedRun:
    """The tokens, logits and the requested activations of one forward pass."""

    tokens: Int[Tensor, "batch pos"]
    logits: Float[Tensor, "batch pos d_vocab"] | None
    activations: dict[str, Tensor] = field(repr=False)
    layers: tuple[int, ...]

    def _groups(self) -> list[tuple[str, list[int], Tensor, int]]:
        """``(name with {L} for the layer, layers, one tensor, bytes of all)`` per kind."""
        groups = []
        for name, layers in grouped_names(self.activations).items():
            names = [name.replace("{L}", str(layer)) for layer in layers] or [name]
            tensors = [self.activations[n] for n in names]
            groups.append((name, layers, tensors[0], sum(nbytes(t) for t in tensors)))
        return groups

    def memory_bytes(self) -> int:
        """Bytes held by the cached activations, the logits and the token ids (what
        :func:`interp.engine.estimate_cache_bytes` estimates before the run)."""
        return (
            sum(nbytes(t) for t in self.activations.values())
            + nbytes(self.logits)
            + nbytes(self.tokens)
        )

    def _summary(self) -> dict[str, str]:
        logits = (
            "not kept"
            if self.logits is None
            else f"{tensor_text(self.logits)}, {megabytes(nbytes(self.logits))}"
        )
        return {
            "tokens": tensor_text(self.tokens),
            "logits": logits,
            "layers": str(list(self.layers)),
            "activations": (
                f"{len(self.activations)} tensors, {len(self._groups())} kind(s) (below)"
            ),
            "memory": f"{megabytes(self.memory_bytes())} (activations, logits, tokens)",
        }

    def __repr__(self) -> str:
        kinds = "; ".join(
            f"{name} x{max(len(layers), 1)} {tensor_text(t)}"
            for name, layers, t, _ in self._groups()
        )
        logits = "not kept" if self.logits is None else tensor_text(self.logits)
        return (
            f"CachedRun(tokens {tensor_text(self.tokens)}, logits {logits}, layers "
            f"{list(self.layers)}, {megabytes(self.memory_bytes())}; cached: "
            f"{kinds or 'nothing'})"
        )

    def _repr_html_(self) -> str:
        import pandas as pd

        table = pd.DataFrame(
            [
                (
                    name,
                    ", ".join(map(str, layers)) or "-",
                    str(list(t.shape)),
                    str(t.dtype).removeprefix("torch."),
                    megabytes(size),
                )
                for name, layers, t, size in self._groups()
            ],
            columns=["activation", "layers", "shape (each)", "dtype", "memory"],
        )
        return summary_html(
            "CachedRun",
            self._summary(),
            table=table_html(table, max_rows=50),
            table_title="cached activations (run[name], e.g. run.patterns())",
        )

    def __getitem__(self, name: str) -> Tensor:
        if name not in self.activations:
            raise KeyError(
                f"'{name}' was not cached; ask for it in run_cached "
                f"(cached: {', '.join(sorted(self.activations)) or 'nothing'})"
            )
        return self.activations[name]

    def _stack(self, suffix: str) -> Tensor:
        return torch.stack([self[hook_name(layer, suffix)] for layer in self.layers])

    def resid(self, kind: str = "post") -> Float[Tensor, "layer batch pos d_model"]:
        return self._stack(f"hook_resid_{kind}")

    def patterns(self) -> Float[Tensor, "layer batch head q_pos k_pos"]:
        return self._stack("attn.hook_pattern")

    def scores(self) -> Float[Tensor, "layer batch head q_pos k_pos"]:
        """Scaled attention scores ``q·k/sqrt(d_head)``; masked entries hold ``finfo.min``."""
        return self._stack("attn.hook_attn_scores")

    def head_outputs(self) -> Float[Tensor, "layer batch pos head d_model"]:
        """Each head's write to the residual stream, ``z @ W_O`` (``b_O`` not included)."""
        return self._stack("attn.hook_result")

    def ln_scales(self, which: str = "ln1") -> Float[Tensor, "layer batch pos 1"]:
        return self._stack(f"{which}.hook_scale")


def run_cached(
    model,
    prompt: Prompt,
    *,
    resid: Sequence[str] = (),
    patterns: bool = False,
    scores: bool = False,
    head_outputs: bool = False,
    ln_scales: bool = False,
    hooks: Sequence[str] = (),
    layers: Sequence[int] | None = None,
    interventions: Sequence[Intervention | tuple[str, HookFn]] = (),
    keep_logits: bool = True,
    prepend_bos: bool | None = None,
    max_bytes: int | str | None = None,
    saes: Sequence = (),
    use_error_term: bool = True,
    transcoders=None,
    feature_edits: Sequence[FeatureEdit] = (),
) -> CachedRun:
    """Run ``prompt`` through ``model`` once, caching only what was asked for.

    Args:
        resid: residual-stream positions per layer, any of ``"pre"``, ``"mid"``, ``"post"``.
        patterns: attention patterns ``[batch head q_pos k_pos]`` per layer.
        scores: scaled, masked attention scores (the QK products) per layer.
        head_outputs: per-head outputs ``z @ W_O`` ``[batch pos head d_model]`` per layer,
            stored under ``blocks.L.attn.hook_result``: one per query head (with grouped-query
            attention too), summing with ``b_O`` to the attention output
            ``blocks.L.attn.hook_out``. That is ``hook_attn_out`` except where a norm follows
            attention (Gemma 2's ``ln1_post``), which rescales the sum before the residual.
        ln_scales: LayerNorm scales of every LayerNorm in the chosen layers and ``ln_final``.
        hooks: further raw hook names (validated: unknown or gated names raise ``KeyError``).
        layers: the layers to cache (default all).
        interventions: :class:`interp.interventions.Intervention` objects (ablations, patches)
            and/or raw ``(hook_name, fn)`` forward hooks that may edit activations; removed
            when the run ends, even if one raises.
        keep_logits: return the logits (``[batch pos d_vocab]`` can be the largest tensor).
        max_bytes: a budget (bytes, or text such as ``"500MB"``, ``"1GiB"``) for the cache plus
            the forward pass's working memory; a run estimated to exceed it raises
            :class:`interp.engine.MemoryBudgetError` before it starts, saying what would fit.
        saes: SAEs (:func:`interp.load_sae`) spliced in at their hooks, their feature
            activations cached under ``f"{sae.hook_name}.hook_sae_acts"`` ``[batch pos d_sae]``.
        use_error_term: add each SAE's reconstruction error back, so the run is the model's
            own (default); False runs on the reconstructions. The same for ``transcoders``.
        transcoders: a transcoder set (:func:`interp.load_transcoders`) replacing every MLP's
            output, features kept under ``blocks.{l}.hook_transcoder_acts``
            (:mod:`interp.engine.transcoder_splice`); ``feature_edits`` set or scale them.
    """
    tokens = to_tokens(model, prompt, prepend_bos=prepend_bos).to(model.cfg.device)
    asked = dict(resid=resid, patterns=patterns, scores=scores, ln_scales=ln_scales, hooks=hooks)
    chosen, names = _what_to_keep(model, layers, **asked)
    if interventions:
        interventions = compile_hooks(model, interventions)
    check_hook_names(model, names + [name for name, _ in interventions])
    if head_outputs:
        check_hook_names(model, [hook_name(layer, "attn.hook_z") for layer in chosen])
    check_saes(model, saes)
    if transcoders is not None:
        check_transcoders(model, transcoders)
    elif feature_edits:
        raise ValueError("feature_edits edit transcoder features: pass transcoders= too")
    if max_bytes is not None:
        budget = dict(asked, head_outputs=head_outputs, keep_logits=keep_logits, saes=saes)
        check_budget(model, tuple(tokens.shape), max_bytes, layers=chosen, **budget)
    store: dict[str, Tensor] = {}
    splices = dict(saes=saes, transcoders=transcoders, use_error_term=use_error_term)
    fwd_hooks = _hooks(model, store, names, interventions, feature_edits, **splices)
    if head_outputs:
        fwd_hooks += _head_output_hooks(model, chosen, store)
    logits = forward(model, tokens, fwd_hooks)
    if store:  # a kept cache: hand back the pass's freed working memory that glibc keeps
        trim_freed_memory()
    return CachedRun(
        tokens=tokens, logits=logits if keep_logits else None, activations=store, layers=chosen
    )


def _what_to_keep(
    model, layers, *, resid, patterns, scores, ln_scales, hooks
) -> tuple[tuple[int, ...], list[str]]:
    """The layers to cache (default all) and the hook names kept as they are, checked."""
    n_layers = int(model.cfg.n_layers)
    chosen = tuple(range(n_layers)) if layers is None else tuple(int(layer) for layer in layers)
    bad = [layer for layer in chosen if not 0 <= layer < n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range: the model has {n_layers} layers")
    unknown = [kind for kind in resid if kind not in RESID_KINDS]
    if unknown:
        raise ValueError(f"resid kinds must be among {RESID_KINDS}, got {unknown}")
    if "mid" in resid and hook_name(0, "hook_resid_mid") not in model.hook_dict:
        raise ValueError(_no_resid_mid(model))
    names = [hook_name(layer, f"hook_resid_{kind}") for layer in chosen for kind in resid]
    names += [hook_name(layer, "attn.hook_pattern") for layer in chosen if patterns]
    names += [hook_name(layer, "attn.hook_attn_scores") for layer in chosen if scores]
    if ln_scales:
        norms = [hook_name(layer, f"{ln}.hook_scale") for layer in chosen for ln in ("ln1", "ln2")]
        names += [n for n in norms if n in model.hook_dict] + ["ln_final.hook_scale"]
    return chosen, names + list(hooks)


def _hooks(model, store, names, interventions, feature_edits, *, saes, transcoders, use_error_term):
    """The run's hooks: the interventions first, then the splices, then the stores."""
    fwd_hooks: list[tuple[str, HookFn]] = list(interventions)
    fwd_hooks += sae_hooks(saes, store, use_error_term=use_error_term)
    if transcoders is not None:
        fwd_hooks += transcoder_hooks(
            transcoders, store, use_error_term=use_error_term, edits=feature_edits
        )
    # interventions edit activations in place: a later one must not change what was kept
    copy = bool(interventions or saes or transcoders)
    return fwd_hooks + [(name, store_hook(store, name, copy=copy)) for name in dict.fromkeys(names)]


def _head_output_hooks(model, chosen, store: dict) -> list[tuple[str, HookFn]]:
    """At each chosen layer's ``hook_z``, keep ``z @ W_O`` per head under ``attn.hook_result``."""
    W_O = stacked_weight(model, "W_O")  # also when accelerate offloaded the layers

    def keep(W_O: Float[Tensor, "head d_head d_model"], name: str) -> HookFn:
        def hook(z: Float[Tensor, "batch pos head d_head"], hook) -> None:
            store[name] = torch.einsum("bphd,hdm->bphm", z.detach(), W_O.to(z.dtype))

        return hook

    return [
        (hook_name(layer, "attn.hook_z"), keep(W_O[layer], hook_name(layer, "attn.hook_result")))
        for layer in chosen
    ]


def run_logits(
    model,
    tokens: Int[Tensor, "batch pos"],
    interventions: Sequence[Intervention | tuple[str, HookFn]] = (),
    *,
    before: Sequence[tuple[str, HookFn]] = (),
    after: Sequence[tuple[str, HookFn]] = (),
    grad: bool = False,
) -> Float[Tensor, "batch pos d_vocab"]:
    """The logits of one pass of ``tokens`` with ``interventions``, raw hooks ``before`` and
    ``after`` them (in that order at a shared hook), with gradients when ``grad`` (attribution
    patching differentiates a metric of these logits)."""
    hooks = [*before, *compile_hooks(model, interventions), *after]
    return forward(model, tokens, hooks, grad=grad)
