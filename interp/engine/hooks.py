"""Turn :class:`Intervention` objects into forward hooks, and apply them for a ``with`` block.

Every hook works on the site's *slab*: the hook's activation with the head (if any) selected,
so that the (query) position is always axis 1 (``[batch pos d]`` or ``[batch q_pos k_pos]``).
A value for the slab is computed (zeros, a mean, a source run's activation, noise added), and
written back at all positions or at ``site.pos``. Values with one batch row are broadcast
over the batch, so the same hooks serve a prompt, a batch and a batched patching grid.

Sources (a mean's reference batch, a resample's corrupted batch) are run once each, before
any hook is added, caching only the hooks they are needed for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from jaxtyping import Float
from torch import Tensor

from interp.engine.passes import HookFn, forward, store_hook
from interp.engine.sites import Intervention, Site
from interp.engine.tokens import check_hook_names, to_tokens

__all__ = ["compile_hooks", "intervene", "HookFn"]

Slab = Float[Tensor, "batch pos ..."]


def _slab_index(site: Site) -> tuple:
    """Index of the site with every position kept (position lands on axis 1 of the slab)."""
    return Site(site.kind, site.layer, head=site.head).index()


def _write(site: Site, value_fn: Callable[[Slab], Slab]) -> HookFn:
    slab_idx, full_idx = _slab_index(site), site.index()

    def hook(act: Tensor, hook) -> Tensor:
        new = value_fn(act[slab_idx])
        if site.kind == "pattern" and act.requires_grad:
            act = act.clone()  # softmax saved its output for the backward pass
        # in place AND returned: the bridge feeds some hooks' tensors on by identity (the
        # residual add after hook_resid_mid uses the tensor the hook saw, ln2 the returned one)
        act[slab_idx if site.pos is None else full_idx] = (
            new if site.pos is None else new[:, site.pos]
        ).to(act.dtype)
        return act

    return hook


def _check_like(value: Tensor, slab: Tensor, what: str, site: Site) -> None:
    if value.shape[1:] != slab.shape[1:]:
        raise ValueError(
            f"{site}: the {what} has shape {tuple(value.shape[1:])} per row but the "
            f"run's activation has {tuple(slab.shape[1:])}; use prompts of the same "
            "token length"
        )


def _mean_value(per_position: bool, reference: Tensor | None, site: Site) -> Callable:
    dims = (0,) if per_position else (0, 1)

    def value(slab: Slab) -> Slab:
        mean = (slab if reference is None else reference).mean(dim=dims, keepdim=True)
        if per_position:
            _check_like(mean, slab, "per-position mean of the reference batch", site)
        return mean.to(slab.device).expand(1, *slab.shape[1:])

    return value


def _source_value(source: Tensor, seed: int, site: Site) -> Callable:
    def value(slab: Slab) -> Slab:
        _check_like(source, slab, "source activation", site)
        src = source.to(slab.device)
        if src.shape[0] in (1, slab.shape[0]):
            return src
        gen = torch.Generator().manual_seed(seed)
        rows = torch.randint(src.shape[0], (slab.shape[0],), generator=gen)
        return src[rows.to(src.device)]

    return value


def _noise_value(std: float, seed: int) -> Callable:
    def value(slab: Slab) -> Slab:
        gen = torch.Generator().manual_seed(seed)
        noise = torch.randn(tuple(slab.shape[1:]), generator=gen, dtype=torch.float32)
        return slab + std * noise.to(slab.device, slab.dtype)[None]

    return value


def _run_sources(model, items: Sequence[Intervention]) -> dict[tuple[int, str], Tensor]:
    """One forward pass per distinct source prompt, caching the hooks it is needed at."""
    wanted: dict[int, tuple[object, set[str]]] = {}
    for item in items:
        if item.kind in ("mean", "resample") and item.source is not None:
            wanted.setdefault(id(item.source), (item.source, set()))[1].add(item.site.hook_name)
    found = {}
    for key, (source, names) in wanted.items():
        tokens = to_tokens(model, source).to(model.cfg.device)
        check_hook_names(model, sorted(names))
        store: dict[str, Tensor] = {}
        forward(model, tokens, [(name, store_hook(store, name)) for name in sorted(names)])
        for name in names:
            found[key, name] = store[name]
    return found


def compile_hooks(
    model,
    interventions: Sequence[Intervention | tuple[str, HookFn]],
) -> list[tuple[str, HookFn]]:
    """``(hook_name, fn)`` forward hooks for ``interventions`` (tuples pass through unchanged;
    an object with a ``hook()`` method, such as :class:`interp.engine.FeatureEdit` of an SAE,
    gives its tuple). Sites are checked against the model first; mean and resample sources are
    run here.
    """
    interventions = [
        item.hook() if not isinstance(item, (Intervention, tuple)) and hasattr(item, "hook")
        else item
        for item in interventions
    ]  # fmt: skip
    items = [item for item in interventions if isinstance(item, Intervention)]
    for item in interventions:
        if not isinstance(item, Intervention) and not (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], str)
            and callable(item[1])
        ):
            raise TypeError(
                f"an intervention is an Intervention or a (hook_name, fn) tuple, got {item!r}"
            )
    hook_names = set(model.hook_dict)
    for site in {item.site for item in items}:
        site.check(model, hook_names)
    sources = _run_sources(model, items)
    hooks = []
    for item in interventions:
        if not isinstance(item, Intervention):
            hooks.append(item)
            continue
        site, slab_idx = item.site, _slab_index(item.site)
        if item.kind == "zero":

            def value_fn(slab):
                return torch.zeros_like(slab[:1])
        elif item.kind == "mean":
            reference = (
                None if item.source is None else sources[id(item.source), site.hook_name][slab_idx]
            )
            value_fn = _mean_value(item.per_position, reference, site)
        elif item.kind == "resample":
            value_fn = _source_value(
                sources[id(item.source), site.hook_name][slab_idx], item.seed, site
            )
        elif item.kind == "patch":
            value_fn = _source_value(item.source[slab_idx], item.seed, site)
        else:
            value_fn = _noise_value(float(item.std), item.seed)
        hooks.append((site.hook_name, _write(site, value_fn)))
    return hooks


@contextmanager
def intervene(model, interventions: Sequence[Intervention | tuple[str, HookFn]]) -> Iterator:
    """Apply ``interventions`` to every forward pass inside the ``with`` block.

    The hooks are removed when the block ends, also when it raises::

        with intervene(model, [Intervention(Site("head", 1, head=0), "zero")]):
            logits = model(tokens)
    """
    hooks = compile_hooks(model, interventions)
    with model.hooks(fwd_hooks=hooks, reset_hooks_end=True):
        yield model
