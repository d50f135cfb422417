"""The runs of path patching (docs/path_patching.md): cache the clean and corrupted runs,
record what each receiver reads with the sender patched and everything else frozen (step 2),
and deliver each receiver its change alone (step 3), many senders per batched pass."""

from __future__ import annotations

from collections.abc import Sequence

from jaxtyping import Float, Int
from torch import Tensor

from interp.engine import run_cached
from interp.interventions.path_nodes import Receiver, Sender, _has_mlps
from interp.models.norms import check_qkv_input, qkv_weights

__all__ = ["read_point", "cache_runs", "record_changes", "deliver_changes", "layer_hooks"]

_REFUSAL = "path patching into q/k/v inputs is not supported for it: use 'logits' or MLP receivers"


def layer_hooks(model) -> tuple[list[str], dict[int, str], dict[int, str], str]:
    """Every head's ``hook_z``, each MLP's output by layer, each ``ln1`` input by layer, and the
    final norm's input: the hooks path patching caches and freezes."""
    n_layers = int(model.cfg.n_layers)
    z = [f"blocks.{lay}.attn.hook_z" for lay in range(n_layers)]
    mlp = {lay: f"blocks.{lay}.hook_mlp_out" for lay in range(n_layers)} if _has_mlps(model) else {}
    return z, mlp, {lay: f"blocks.{lay}.ln1.hook_in" for lay in range(n_layers)}, "ln_final.hook_in"


def _shared_norm(model) -> bool:
    """Parallel blocks whose attention and MLP read one norm (GPT-J, Phi): no ``ln2``."""
    return _has_mlps(model) and "blocks.0.ln2.hook_in" not in model.hook_dict


def read_point(model, receiver: Receiver) -> str:
    """The hook holding what a receiver reads from the residual stream (its norm's input)."""
    if receiver.kind == "logits":
        return "ln_final.hook_in"
    norm = "ln1" if receiver.kind == "head" or _shared_norm(model) else "ln2"
    return f"blocks.{receiver.layer}.{norm}.hook_in"


def cache_runs(model, tokens: Tensor, read_points: Sequence[str]):
    """Step 1: one run of ``tokens`` caching every sender's output and the receivers' inputs."""
    z, mlp, _, _ = layer_hooks(model)
    return run_cached(model, tokens, hooks=[*z, *mlp.values(), *read_points])


def record_changes(
    model, base, source, senders: Sequence[Sender], read_points: Sequence[str], mlps: str
) -> dict[str, Float[Tensor, "batch pos d_model"]]:
    """Step 2 for ``len(senders)`` senders at once (one per block of batch rows): the change in
    each read point with the sender patched and every other head (and MLP if frozen) fixed."""
    k, rows = len(senders), base.tokens.shape[0]
    z_names, mlp_names, _, _ = layer_hooks(model)
    store: dict[str, Tensor] = {}

    def fix(name: str, kind: str, layer: int, freeze: bool):
        def hook(act: Tensor, hook) -> Tensor:
            out = base[name].repeat(k, *[1] * (act.ndim - 1)) if freeze else act.clone()
            for i, s in enumerate(senders):
                if s.kind == kind and s.layer == layer:
                    block = slice(i * rows, (i + 1) * rows)
                    if kind == "head":
                        out[block, :, s.head] = source[name][:, :, s.head]
                    else:
                        out[block] = source[name]
            return out

        return hook

    def keep(name: str):
        def hook(act: Tensor, hook) -> None:
            store[name] = act.detach().clone()

        return hook

    hooks = [(name, fix(name, "head", lay, True)) for lay, name in enumerate(z_names)]
    hooks += [(name, fix(name, "mlp", lay, mlps == "freeze")) for lay, name in mlp_names.items()]
    hooks += [(name, keep(name)) for name in read_points]
    run_cached(model, base.tokens.repeat(k, 1), interventions=hooks, keep_logits=False)
    return {name: store[name] - base[name].repeat(k, 1, 1) for name in read_points}


def _n_kv_heads(model) -> int:
    return int(getattr(model.cfg, "n_key_value_heads", None) or model.cfg.n_heads)


def deliver_changes(
    model,
    tokens: Int[Tensor, "batch pos"],
    receivers: Sequence[Receiver],
    changes: dict[str, Tensor],
) -> Float[Tensor, "batch pos d_vocab"]:
    """Step 3: run ``tokens`` with each receiver's recorded input change added, nothing frozen."""
    normed: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> ln1(x), ln1(x + change) this run
    busy: set[int] = set()  # calling ln1 below fires ln1.hook_in again: do not recurse
    hooks: list = []

    def see(layer: int):
        def hook(x: Tensor, hook) -> None:
            if layer in busy:
                return
            busy.add(layer)
            try:
                ln1 = model.blocks[layer].ln1
                normed[layer] = (ln1(x), ln1(x + changes[f"blocks.{layer}.ln1.hook_in"]))
            finally:
                busy.discard(layer)

        return hook

    def shift(name: str):
        def hook(x: Tensor, hook) -> Tensor:
            return x + changes[name]

        return hook

    def move_heads(layer: int, which: str, heads: list[int]):
        weights = qkv_weights(model, which)
        W = weights[0]

        def hook(act: Float[Tensor, "batch pos head d_head"], hook) -> Tensor:
            before, after = normed[layer]
            out = act.clone()
            for h in heads:
                check_qkv_input(act, before, weights, layer, h, which, _REFUSAL)
                out[:, :, h] = act[:, :, h] + (after - before) @ W[layer, h]
            return out

        return hook

    def move_mlp(layer: int):  # shared norm: the MLP's input moves by ln1(x + change) - ln1(x)
        def hook(act: Float[Tensor, "batch pos d_model"], hook) -> Tensor:
            before, after = normed[layer]
            return act + (after - before)

        return hook

    shared = _shared_norm(model)
    seen: set[int] = set()  # layers whose ln1 input and change are needed
    for r in receivers:
        if r.kind == "mlp" and shared:
            hooks.append((f"blocks.{r.layer}.mlp.hook_in", move_mlp(r.layer)))
            seen.add(r.layer)
        elif r.kind != "head":
            hooks.append((read_point(model, r), shift(read_point(model, r))))
    groups: dict[tuple[int, str], list[int]] = {}
    kv_group = int(model.cfg.n_heads) // _n_kv_heads(model)
    for r in receivers:
        if r.kind == "head":  # keys and values of grouped-query attention: the shared head
            index = r.head if r.input == "q" else r.head // kv_group
            groups.setdefault((r.layer, r.input), []).append(index)
            seen.add(r.layer)
    for layer in sorted(seen):
        hooks.append((f"blocks.{layer}.ln1.hook_in", see(layer)))
    for (layer, which), heads in groups.items():
        hooks.append(
            (f"blocks.{layer}.attn.hook_{which}", move_heads(layer, which, sorted(set(heads))))
        )
    return run_cached(model, tokens, interventions=hooks).logits
