"""Exact edge patching and attribution patching of single edges, with plain hooks: an oracle
for circuit discovery on attention-only models without norms (tests/circuit_models.py).

The graph's names are the issue's: writers ``embed`` (token + position embeddings) and
``L{l}H{h}`` (a head's output, ``z @ W_O``); readers ``L{l}H{h}.q/.k/.v`` and ``logits``.
Without norms a head's q/k/v input is the residual stream itself, so an edge's change
``delta`` reaches head ``h``'s query as ``delta @ W_Q[l, h]`` and nothing else.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

__all__ = [
    "all_edges",
    "patch_edges",
    "replace_edges",
    "attribution_edge",
    "run_caches",
    "head_output",
]


def all_edges(model) -> list[str]:
    """Every edge ``SOURCE->TARGET`` of an attention-only model: each writer (``embed``,
    ``L{l}H{h}``) to each reader after it (``L{l}H{h}.q/.k/.v`` of later layers, ``logits``)."""
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    writers = [(-1, "embed")] + [
        (lay, f"L{lay}H{h}") for lay in range(n_layers) for h in range(n_heads)
    ]
    readers = [
        (lay, f"L{lay}H{h}.{x}") for lay in range(n_layers) for h in range(n_heads) for x in "qkv"
    ]
    readers.append((n_layers, "logits"))
    return [f"{w}->{r}" for wl, w in writers for rl, r in readers if rl > wl]


def head_output(model, cache, layer: int, head: int) -> Float[Tensor, "batch pos d_model"]:
    """One head's write into the residual stream: ``z[:, :, head] @ W_O[layer, head]``."""
    return cache[f"blocks.{layer}.attn.hook_z"][:, :, head] @ model.W_O[layer, head]


def _writer_hooks(model) -> list[str]:
    return ["hook_embed", "hook_pos_embed"] + [
        f"blocks.{lay}.attn.hook_z" for lay in range(int(model.cfg.n_layers))
    ]


def _writer(model, cache, name: str) -> Tensor:
    if name == "embed":
        return cache["hook_embed"] + cache["hook_pos_embed"]
    layer, head = (int(x) for x in name[1:].split("H"))
    return head_output(model, cache, layer, head)


def patch_edges(
    model, base: Int[Tensor, "batch pos"], source: Int[Tensor, "batch pos"], edges
) -> Float[Tensor, "batch pos d_vocab"]:
    """Exact edge patching with plain hooks (no norms, attention only): run ``base`` and give
    each reader, for each of ``edges`` into it, the sender's value from the ``source`` run in
    place of the sender's value in this run; everything downstream is recomputed. A head's
    q/k/v input moves by ``change @ W_Q/K/V`` for that head only; ``logits`` by ``change``."""
    _, source_cache = model.run_with_cache(source, names_filter=lambda n: n in _writer_hooks(model))
    return replace_edges(model, base, lambda s: _writer(model, source_cache, s), edges)


def replace_edges(
    model, base: Int[Tensor, "batch pos"], value, edges
) -> Float[Tensor, "batch pos d_vocab"]:
    """Run ``base`` and give each reader, for each of ``edges`` into it, ``value(sender)`` (a
    tensor broadcasting to ``[batch pos d_model]``) in place of the sender's value in this run;
    everything downstream is recomputed. ``patch_edges`` is this with the source run's values;
    circuit evaluation removes edges from the clean run with corrupted, mean or zero values."""
    live: dict[str, Tensor] = {}

    def keep(name):
        def hook(act, hook):
            live[name] = act

        return hook

    by_reader: dict[str, list[str]] = {}
    for edge in edges:
        sender, reader = edge.split("->")
        by_reader.setdefault(reader, []).append(sender)

    def change(senders) -> Tensor:
        return sum(value(s) - _writer(model, live, s) for s in senders)

    def move_qkv(layer, which):
        heads = {
            int(r.split("H")[1].split(".")[0]): s
            for r, s in by_reader.items()
            if r.startswith(f"L{layer}H") and r.endswith(f".{which}")
        }

        def hook(act, hook):
            out = act.clone()
            W = getattr(model, f"W_{which.upper()}")
            for h, senders in heads.items():
                out[:, :, h] = act[:, :, h] + change(senders) @ W[layer, h]
            return out

        return hook

    hooks = [(name, keep(name)) for name in _writer_hooks(model)]
    for layer in range(int(model.cfg.n_layers)):
        for which in "qkv":
            hooks.append((f"blocks.{layer}.attn.hook_{which}", move_qkv(layer, which)))
    if "logits" in by_reader:
        hooks.append(("ln_final.hook_in", lambda x, hook: x + change(by_reader["logits"])))
    with model.hooks(fwd_hooks=hooks):
        return model(base)


def run_caches(model, batch) -> tuple:
    """The clean and the corrupted run's caches, for :func:`attribution_edge` over many edges."""
    with torch.no_grad():
        return model.run_with_cache(batch.clean)[1], model.run_with_cache(batch.corrupted)[1]


def attribution_edge(
    model, batch, edge: str, *, at: str = "corrupted", ig_steps: int = 0, caches=None
) -> float:
    """Attribution patching of one edge in metric units (divide by clean - corrupted for
    recovered): the gradient of the mean ``batch.logit_diff`` with respect to the reader's
    input on the ``at`` run (``"clean"`` or ``"corrupted"``), dotted with the sender's clean -
    corrupted output, summed over positions. ``ig_steps=m > 0``: integrated gradients along
    the input path instead (EAP-IG-inputs), the gradient averaged over the runs whose token
    embeddings are ``corrupted + k/m (clean - corrupted)``, ``k = 1 .. m``. ``caches``:
    :func:`run_caches` of the same model and batch, computed once for many edges."""
    sender, reader = edge.split("->")
    clean_cache, corrupt_cache = caches if caches is not None else run_caches(model, batch)
    with torch.no_grad():
        delta = _writer(model, clean_cache, sender) - _writer(model, corrupt_cache, sender)
    reader_input = torch.zeros_like(delta, requires_grad=True)
    if reader == "logits":
        hooks = [("ln_final.hook_in", lambda x, hook: x + reader_input)]
    else:
        head, which = reader.split(".")
        layer, h = (int(x) for x in head[1:].split("H"))
        W = getattr(model, f"W_{which.upper()}")[layer, h]

        def move(act, hook):
            out = act.clone()
            out[:, :, h] = act[:, :, h] + reader_input @ W
            return out

        hooks = [(f"blocks.{layer}.attn.hook_{which}", move)]
    tokens = batch.clean if at == "clean" else batch.corrupted
    alphas = [k / ig_steps for k in range(1, ig_steps + 1)] if ig_steps else [None]
    for alpha in alphas:
        if alpha is not None:  # position embeddings are equal in both runs
            tokens = batch.corrupted
            step = alpha * (clean_cache["hook_embed"] - corrupt_cache["hook_embed"])
            hooks_here = [*hooks, ("hook_embed", lambda x, hook, step=step: x + step)]
        else:
            hooks_here = hooks
        with torch.enable_grad():
            logits = model.run_with_hooks(tokens, fwd_hooks=hooks_here)
            batch.logit_diff(logits).mean().backward()  # gradients add up over the steps
    return float((reader_input.grad * delta).sum()) / len(alphas)
