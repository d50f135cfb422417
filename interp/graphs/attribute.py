"""Build an attribution graph: one clean pass, one frozen pass, batched backward passes.

``A[t, s] = out_s · J · in_t`` with ``J`` the Jacobian of the local replacement model
(:mod:`interp.graphs.frozen`): attention patterns and norm scales frozen at this prompt, MLP
outputs constant but for a transcoder's skip term. A source's output vector is, for a feature,
its activation times its decoder row (into every layer ``>=`` its own for a cross-layer
transcoder), for an error node the MLP output minus the reconstruction, for a token node its
embedding (``hook_embed``); a target's input vector is, for a feature, its encoder row at its
layer's transcoder input (so its row sums to its pre-activation less ``b_enc`` and the
constants), for a logit the unembedding column minus the mean column, read at the final norm's
output at the last position (before any soft-capping: a logit node is the raw, demeaned logit).

The frozen model is linear, so one pass of ``batch_size`` copies of the prompt serves every
backward pass: each row of a batch carries its own target's vector (circuit-tracer's phases:
logits first, then features, ranked by influence in rounds under ``max_feature_nodes``).
"""

from __future__ import annotations

import functools
import logging
import time

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from interp.engine import run_cached, to_tokens
from interp.engine.allocator import return_freed_memory
from interp.engine.estimates import parse_size
from interp.engine.plan import MemoryBudgetError
from interp.foundation.sizes import format_size
from interp.graphs.budget import (
    choose_batch,
    estimate_graph_bytes,
    free_bytes,
    graph_bytes,
    least_bytes,
)
from interp.graphs.frozen import FINAL_HOOK, frozen_pass, no_param_grads
from interp.graphs.graph import AttributionGraph
from interp.graphs.influence import partial_influences
from interp.graphs.nodes import Sources, node_table, read_sources, salient_logits
from interp.graphs.task_graph import is_task, task_graph_of
from interp.graphs.vjp import one_copy_backward
from interp.transcoders.loading import check_transcoders_fit

__all__ = ["attribution_graph", "estimate_graph_bytes"]

logger = logging.getLogger(__name__)


def _source_bytes(src: Sources) -> int:
    tensors = [src.encoders, src.errors, src.embed] + [v for v, _ in src.writers]
    tensors += [c for _, c in src.writers]
    return sum(t.numel() * t.element_size() for t in tensors)


def _rows(fp, src: Sources, layers: Tensor, positions: Tensor, vectors: Tensor) -> Tensor:
    """Attribution rows ``[b n_cols]`` (every feature, error, token) for ``b`` targets."""
    n_layers, b = len(fp.inputs), len(layers)
    rows, n_pos, d = fp.embed.shape
    outs, grads = [], []
    for layer in layers.unique().tolist():
        mine = torch.nonzero(layers == layer).flatten()
        g = torch.zeros(rows, n_pos, d, dtype=fp.embed.dtype, device=fp.embed.device)
        g[mine, positions[mine]] = vectors[mine].to(g.dtype)
        outs.append(fp.final if layer == n_layers else fp.inputs[layer])
        grads.append(g)
    top = min(int(layers.max()), n_layers)
    # the frozen model is causal: nothing reaches rows past b or positions past the last target
    fp.scope.rows, fp.scope.positions = b, int(positions.max()) + 1
    wrt = [fp.outputs[j] for j in range(top)] + [fp.embed]
    got = torch.autograd.grad(outs, wrt, grads, retain_graph=True, allow_unused=True)
    work = src.embed.dtype  # float32 at least: a half-precision pass's gradients upcast
    out = torch.zeros(b, src.n_cols, dtype=work, device=fp.embed.device)
    for j in range(top):
        if got[j] is None:
            continue
        g = got[j][:b].to(work)
        vecs, cols = src.writers[j]  # [pos slot d_model], [pos slot]
        if vecs.shape[1]:
            scores = torch.bmm(g.transpose(0, 1), vecs.transpose(1, 2))  # [pos b slot]
            valid = cols >= 0
            out[:, cols[valid]] += scores.permute(1, 0, 2)[:, valid]
        start = src.n_features + j * (n_pos - 1)
        out[:, start : start + n_pos - 1] = torch.einsum("bpd,pd->bp", g[:, 1:], src.errors[j])
    if got[-1] is not None:
        out[:, src.token_start :] = torch.einsum("bpd,pd->bp", got[-1][:b].to(work), src.embed)
    return out


def _kept_columns(
    computed: Tensor, row_nodes: Tensor, selected: Tensor, n_feat: int, chunk: int = 256
) -> tuple[Tensor, Tensor]:
    """The rows with only the kept features' columns (and every other node's), and their
    nodes' indices in the graph."""
    columns = torch.cat([selected, torch.arange(n_feat, computed.shape[1])])
    out = torch.empty(computed.shape[0], len(columns), dtype=computed.dtype)
    for i in range(0, len(out), chunk):
        out[i : i + chunk] = computed[i : i + chunk][:, columns]
    moved = torch.full((computed.shape[1],), -1, dtype=torch.long)
    moved[columns] = torch.arange(len(columns))
    return out, moved[row_nodes]


def attribution_graph(
    model,
    tokens_or_text,
    tc,
    *,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    max_feature_nodes: int | None = None,
    batch_size: int | None = None,
    max_bytes: int | str | None = None,
    progress: bool = False,
    backward: str = "auto",
) -> AttributionGraph:
    """The attribution graph of one prompt through transcoders ``tc`` (module docstring).

    Args:
        tokens_or_text: text (tokenised with the model's default BOS) or token ids ``[pos]``
            (or ``[1 pos]``) taken as they are.
        tc: a :class:`interp.transcoders.TranscoderSet` fitting ``model``.
        max_n_logits, desired_logit_prob: logit nodes, by descending probability, until their
            cumulative probability reaches ``desired_logit_prob``, at most ``max_n_logits``.
        max_feature_nodes: keep at most this many features, the most influential (ranked by
            influence through the rows computed so far, in rounds), as circuit-tracer does.
        batch_size: targets per backward pass (rows of the frozen pass); None: 64. Without
            ``max_bytes`` it is halved while the build's estimate
            (:func:`interp.estimate_graph_bytes`) exceeds the memory free on the model's
            device (a warning says so for a batch asked for, and where even one row does not
            fit).
        max_bytes: a budget for what the build holds (the sources, rows, frozen pass, pruning;
            not the model): the batch is halved until the estimate fits; a graph that needs
            more even at its smallest batch is refused (``MemoryBudgetError``) with what it needs.
        progress: show a progress bar over the features.
        backward: how rows are computed: ``"one-copy"`` the frozen model's backward by hand
            from one pass of the prompt (:mod:`interp.graphs.vjp`), ``"batched"`` backward
            passes through ``batch_size`` copies of it (:mod:`interp.graphs.frozen`),
            ``"auto"`` the first where the model is covered (a warning says when not).

    Given an :class:`interp.Task`, the task graph of its rows (:mod:`interp.graphs.task_graph`).
    """
    options = dict(locals())  # the arguments (nothing else is defined yet), for a list
    from interp.graphs.many import graphs_of_prompts, many_prompts

    if many_prompts(tokens_or_text):  # a list of prompts: a list of graphs (graphs.many)
        for name in ("model", "tokens_or_text", "tc"):
            del options[name]
        return graphs_of_prompts(attribution_graph, model, tokens_or_text, tc, options)
    if is_task(tokens_or_text):  # a Task: its rows' graphs aligned and averaged
        return task_graph_of(attribution_graph, locals())
    start = time.perf_counter()
    tokens = to_tokens(model, tokens_or_text)
    if tokens.shape[0] != 1:
        raise ValueError(f"an attribution graph is of one prompt, got {tokens.shape[0]} rows")
    tokens: Int[Tensor, " pos"] = tokens[0].to(model.cfg.device)
    if len(tokens) < 2:
        raise ValueError("the prompt needs at least 2 tokens (position 0 has no feature nodes)")
    check_transcoders_fit(model, tc)
    # float32 at least (a half-precision model's graph is computed in float32), float64 kept
    dtype = torch.float64 if model.cfg.dtype == torch.float64 else torch.float32
    tc = tc.to(device=model.cfg.device, dtype=dtype)
    names = [tc.input_hook(lay) for lay in range(tc.n_layers)]
    names += [tc.output_hook(lay) for lay in range(tc.n_layers)] + ["hook_embed"]
    clean = run_cached(model, tokens[None], hooks=names)
    src = read_sources(model, tc, clean, dtype)
    logit_ids, logit_p, logit_vecs = salient_logits(
        model, clean.logits[0, -1], max_n_logits, desired_logit_prob, dtype
    )
    n_feat = src.n_features
    keep = n_feat if max_feature_nodes is None else min(int(max_feature_nodes), n_feat)
    n_logits, n_pos = len(logit_ids), len(tokens)
    n_nodes = keep + src.n_cols - n_feat + n_logits
    del clean  # read: its activations and logits are not held through the build
    one_copy = one_copy_backward(model, tokens, tc, backward)  # None: the batched pass
    sized = functools.partial(
        graph_bytes, model, tc, n_pos, n_active=n_feat, keep=keep, n_logits=n_logits,
        source_bytes=_source_bytes(src), one_copy=one_copy is not None,
    )  # fmt: skip
    chosen = 64 if batch_size is None else int(batch_size)
    # a round visits 4 x the batch asked for (circuit-tracer's rounds), whatever batch the
    # memory allows: the same features are kept under any budget
    round_size = 4 * chosen
    chosen = max(1, min(chosen, keep + n_logits))
    if max_bytes is not None:
        budget = parse_size(max_bytes)
        need = least_bytes(lambda b: sized(batch=b), chosen)
        if need > budget:
            raise MemoryBudgetError(
                f"this graph ({n_nodes} nodes, {n_pos} positions) needs at least {need} bytes "
                f"({format_size(need)}) at its smallest batch; raise max_bytes to {need} or "
                "lower max_feature_nodes"
            )
        return_freed_memory()  # freed blocks go back at once: the process's size is its use
        chosen = choose_batch(lambda b: sized(batch=b), chosen, budget)
    else:  # the memory free on the device bounds the batch, asked for or not
        budget = free_bytes(model.cfg.device)
        if budget is None and batch_size is None:
            raise RuntimeError(
                "the host's available memory cannot be read here; pass max_bytes or batch_size"
            )
        budget = budget if budget is not None else sized(batch=chosen)
        asked, chosen = chosen, choose_batch(lambda b: sized(batch=b), chosen, budget)
        if batch_size is not None and chosen < asked:
            logger.warning(
                "batch_size %d needs about %s, more than the %s free on %s: batch %d instead",
                asked, format_size(sized(batch=asked)), format_size(budget), model.cfg.device,
                chosen,
            )  # fmt: skip
        if sized(batch=chosen) > budget:
            logger.warning(
                "this graph needs about %s with one row per pass, more than the %s free on %s",
                format_size(sized(batch=chosen)), format_size(budget), model.cfg.device,
            )  # fmt: skip
    batch_size = chosen

    total_cols = src.n_cols + n_logits
    # the rows computed (logits first, then features in the order visited), every source's
    # column; under a cap they rank the features still to visit
    computed = torch.zeros(keep + n_logits, total_cols, dtype=dtype)
    row_nodes = torch.zeros(keep + n_logits, dtype=torch.long)  # each row's column
    with no_param_grads(model):
        if one_copy is None:
            rows_of = functools.partial(_rows, frozen_pass(model, tokens, tc, batch_size))
        else:
            rows_of = one_copy
        device = src.embed.device
        for i in range(0, n_logits, batch_size):
            chunk = slice(i, min(i + batch_size, n_logits))
            b = chunk.stop - chunk.start
            rows = rows_of(
                src,
                torch.full((b,), tc.n_layers, device=device),
                torch.full((b,), n_pos - 1, device=device),
                logit_vecs[chunk],
            )
            row_nodes[chunk] = torch.arange(chunk.start, chunk.stop) + src.n_cols
            computed[chunk, : src.n_cols] = rows.cpu()
        visited = torch.zeros(n_feat, dtype=torch.bool)
        filled = n_logits
        bar = tqdm(total=keep, desc="attribution graph: features", disable=not progress)
        while filled < n_logits + keep:
            if keep == n_feat:
                pending = torch.arange(n_feat)
            else:
                influence = partial_influences(computed[:filled], logit_p, row_nodes[:filled])
                rank = torch.argsort(influence[:n_feat], descending=True)
                pending = rank[~visited[rank]][: min(round_size, n_logits + keep - filled)]
                # a round's rows in (layer, pos) order: each batch then reaches fewer positions
                pending = pending.sort().values
            for batch in torch.split(pending, batch_size):
                rows = rows_of(
                    src,
                    src.feat_layer[batch].to(device),
                    src.feat_pos[batch].to(device),
                    src.encoders[batch.to(device)],
                )
                computed[filled : filled + len(batch), : src.n_cols] = rows.cpu()
                row_nodes[filled : filled + len(batch)] = batch
                visited[batch] = True
                filled += len(batch)
                bar.update(len(batch))
        bar.close()
        del rows_of

    selected = torch.nonzero(visited).flatten()
    if keep < n_feat:  # the unvisited features' columns go: the rows in place, chunk by chunk
        computed, row_nodes = _kept_columns(computed, row_nodes, selected, n_feat)
    nodes = node_table(src, selected, tc.n_layers, tokens, logit_ids, logit_p)
    return AttributionGraph(
        nodes=nodes,
        rows=computed,
        row_nodes=row_nodes,
        tokens=tokens.cpu(),
        logit_token_ids=logit_ids.cpu(),
        logit_probabilities=logit_p.cpu(),
        model_name=str(getattr(model.cfg, "model_name", "")),
        transcoder_name=tc.name,
        info={
            "active_features": n_feat,
            "seconds": time.perf_counter() - start,
            "batch_size": batch_size,
            "estimated_bytes": sized(batch=batch_size),
            "hook": FINAL_HOOK,
            "backward": "batched" if one_copy is None else "one-copy",
        },
        context={"model": model, "tc": tc},  # for head loadings and QK attribution
    )
