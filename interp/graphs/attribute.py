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

The frozen model is linear, so one pass of the prompt serves every backward pass: recorded
once (:mod:`interp.graphs.vjp`, the one-copy backward, where the model is covered) or run as
``batch_size`` copies (:mod:`interp.graphs.frozen`); each row of a batch carries its own
target's vector (circuit-tracer's phases: logits first, then features, ranked by influence in
rounds under ``max_feature_nodes``).

The build reads as three steps: the plan (:func:`interp.graphs.graph_plan.plan_graph`: features
kept, batch, rounds, the ranking, under the memory budget), the rows (:func:`_graph_rows`:
logits, then features in rounds, each batch of targets turned into rows by one call of the row
step: :func:`_rows` over the batched frozen pass, or :meth:`interp.graphs.one_copy.OneCopy.rows`)
and the assembly (:func:`_assemble`: the kept columns, the node table, the graph). Under a cap
the dense ranking keeps every row over every column; the sparse one
(:mod:`interp.graphs.sparse_ranking`, where the dense one does not fit) keeps each row's largest
normalised entries only, and once the features are chosen the same batches are computed again
(:func:`interp.graphs.row_table.kept_rows`) with only the kept columns stored: the graph's rows
are exact either way.
"""

from __future__ import annotations

import functools
import itertools
import time

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from interp.engine import run_cached, to_tokens
from interp.engine.allocator import return_freed_memory
from interp.graphs.budget import FREED_AT, estimate_graph_bytes, free_bytes
from interp.graphs.frozen import FINAL_HOOK, frozen_pass, no_param_grads
from interp.graphs.graph import AttributionGraph
from interp.graphs.graph_plan import GraphPlan, plan_graph
from interp.graphs.nodes import Sources, node_table, read_sources, salient_logits
from interp.graphs.row_table import RowTable as _RowTable  # tests/graphs patch its next_round
from interp.graphs.row_table import certified, kept_columns, kept_rows, new_table
from interp.graphs.sparse_ranking import RANKINGS
from interp.graphs.task_graph import is_task, task_graph_of
from interp.graphs.vjp import one_copy_backward
from interp.transcoders.loading import check_transcoders_fit

__all__ = ["attribution_graph", "estimate_graph_bytes"]


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
        src.add_writer_scores(out, j, g)  # its writers' columns, block by block
        start = src.n_features + j * (n_pos - 1)
        out[:, start : start + n_pos - 1] = torch.einsum("bpd,pd->bp", g[:, 1:], src.errors[j])
    if got[-1] is not None:
        out[:, src.token_start :] = torch.einsum("bpd,pd->bp", got[-1][:b].to(work), src.embed)
    return out


def _logit_targets(src: Sources, plan: GraphPlan, logits: tuple, n_layers: int, n_pos: int):
    """The logits' batches of targets: (layers, positions, vectors) and their nodes."""
    device = src.embed.device
    for i in range(0, plan.n_logits, plan.batch):
        chunk = torch.arange(i, min(i + plan.batch, plan.n_logits))
        at = torch.full((len(chunk),), n_layers, device=device)  # the final norm's output
        end = torch.full((len(chunk),), n_pos - 1, device=device)
        yield (at, end, logits[2][chunk]), chunk + src.n_cols


def _feature_targets(src: Sources, batch: Int[Tensor, " batch"]) -> tuple:
    """A batch of features' targets: their layers, positions and encoder rows."""
    device = src.embed.device
    layers, positions = src.feat_layer[batch], src.feat_pos[batch]
    vectors = src.encoder_rows(batch)
    return layers.to(device), positions.to(device), vectors


def _graph_rows(
    model, tokens: Int[Tensor, " pos"], tc, src: Sources, plan: GraphPlan, logits: tuple,
    progress: bool, one_copy,
) -> tuple[_RowTable, Tensor]:  # fmt: skip
    """Every logit's and kept feature's row (through ``one_copy``'s recording, or one frozen
    pass of ``plan.batch`` rows where it is None), and which features were visited."""
    n_pos = len(tokens)
    table = new_table(model, tc, src, plan, logits[1], n_pos)
    visited = torch.zeros(plan.n_active, dtype=torch.bool)
    bar = tqdm(total=plan.keep, desc="attribution graph: features", disable=not progress)
    with no_param_grads(model):
        if one_copy is None:
            rows_of = functools.partial(_rows, frozen_pass(model, tokens, tc, plan.batch))
        else:
            rows_of = one_copy
        for targets, nodes in _logit_targets(src, plan, logits, tc.n_layers, n_pos):
            table.add(rows_of(src, *targets), nodes)
        while table.filled < plan.n_rows:
            for batch in torch.split(table.next_round(visited, plan), plan.batch):
                table.add(rows_of(src, *_feature_targets(src, batch)), batch)
                table.batches.append(batch)
                visited[batch] = True
                bar.update(len(batch))
        bar.close()
        table.rounds = certified(table.ranking)
        table.ranking = None  # its buffer goes before the assembly (or the kept rows)
        if plan.sparse:  # the same batches again, the kept columns stored
            again = itertools.chain(
                _logit_targets(src, plan, logits, tc.n_layers, n_pos),
                ((_feature_targets(src, b), b) for b in table.batches),
            )
            kept_rows(table, rows_of, src, plan, again, visited)
        del rows_of
    return table, visited


def _assemble(
    model, tokens: Int[Tensor, " pos"], tc, src: Sources, plan: GraphPlan, logits: tuple,
    table: _RowTable, visited: Tensor, start: float,
) -> AttributionGraph:  # fmt: skip
    """The graph of the rows computed: under a cap the unvisited features' columns dropped."""
    logit_ids, logit_p, _ = logits
    selected = torch.nonzero(visited).flatten()
    rows, row_nodes = table.values, table.nodes
    if plan.capped and not table.kept:  # the unvisited features' columns go, chunk by chunk
        rows, row_nodes = kept_columns(rows, row_nodes, selected, plan.n_active)
    return AttributionGraph(
        nodes=node_table(src, selected, tc.n_layers, tokens, logit_ids, logit_p),
        rows=rows,
        row_nodes=row_nodes,
        tokens=tokens.cpu(),
        logit_token_ids=logit_ids.cpu(),
        logit_probabilities=logit_p.cpu(),
        model_name=str(getattr(model.cfg, "model_name", "")),
        transcoder_name=tc.name,
        info={
            "active_features": plan.n_active,
            "seconds": time.perf_counter() - start,
            "batch_size": plan.batch,
            "estimated_bytes": plan.estimated_bytes,
            "hook": FINAL_HOOK,
            "backward": "one-copy" if plan.one_copy else "batched",
            "ranking": table.ranked_on,  # where the features were ranked (None: uncapped)
            # dense (every row over every column), sparse (interp.graphs.sparse_ranking)
            "ranking_mode": None if not plan.capped else "sparse" if plan.sparse else "dense",
            **table.rounds,  # the sparse ranking's rounds, and how many were certified
        },
        context={"model": model, "tc": tc},  # for head loadings and QK attribution
    )


def _check_ranking(ranking: str, max_feature_nodes: int | None) -> None:
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {', '.join(RANKINGS)}, got {ranking!r}")
    if ranking == "sparse" and max_feature_nodes is None:
        raise ValueError(
            "ranking='sparse' ranks features under max_feature_nodes: pass max_feature_nodes "
            "(or leave ranking='auto')"
        )


def _prompt(model, tokens_or_text) -> Int[Tensor, " pos"]:
    """The prompt's token ids on the model's device, checked."""
    tokens = to_tokens(model, tokens_or_text)
    if tokens.shape[0] != 1:
        raise ValueError(f"an attribution graph is of one prompt, got {tokens.shape[0]} rows")
    tokens = tokens[0].to(model.cfg.device)
    if len(tokens) < 2:
        raise ValueError("the prompt needs at least 2 tokens (position 0 has no feature nodes)")
    return tokens


def _read_prompt(
    model, tc, tokens: Int[Tensor, " pos"], dtype: torch.dtype, max_n_logits: int,
    desired_logit_prob: float,
) -> tuple[Sources, tuple]:  # fmt: skip
    """The sources and the salient logits (ids, probabilities, vectors) of one clean pass,
    whose activations and logits are not held through the build."""
    names = [tc.input_hook(lay) for lay in range(tc.n_layers)]
    names += [tc.output_hook(lay) for lay in range(tc.n_layers)] + ["hook_embed"]
    clean = run_cached(model, tokens[None], hooks=names)
    src = read_sources(model, tc, clean, dtype)
    logits = salient_logits(model, clean.logits[0, -1], max_n_logits, desired_logit_prob, dtype)
    return src, logits


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
    ranking: str = "auto",
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
        ranking: how features are ranked under ``max_feature_nodes``: ``"dense"`` through every
            row over every active feature (circuit-tracer's ranking), ``"sparse"`` through each
            row's large normalised entries (:mod:`interp.graphs.sparse_ranking`: bounded memory,
            the row step run twice, the rows exact, the features the dense ranking's wherever
            ``graph.info["ranking_certified"]`` equals ``info["ranking_rounds"]``), ``"auto"``
            the dense one wherever its estimate fits ``max_bytes`` (or the memory free on the
            model's device), else the sparse one (a warning says so).

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
    _check_ranking(ranking, max_feature_nodes)
    start = time.perf_counter()
    tokens = _prompt(model, tokens_or_text)
    check_transcoders_fit(model, tc)
    # float32 at least (a half-precision model's graph is computed in float32), float64 kept
    dtype = torch.float64 if model.cfg.dtype == torch.float64 else torch.float32
    tc = tc.to(device=model.cfg.device, dtype=dtype)
    src, logits = _read_prompt(model, tc, tokens, dtype, max_n_logits, desired_logit_prob)
    one_copy = one_copy_backward(model, tokens, tc, backward)  # None: the batched pass
    plan = plan_graph(
        model, tc, len(tokens), n_active=src.n_features, n_logits=len(logits[0]),
        source_bytes=src.held_bytes, block_bytes=src.block_bytes,
        max_feature_nodes=max_feature_nodes, batch_size=batch_size, max_bytes=max_bytes,
        free=free_bytes(model.cfg.device) if max_bytes is None else None,
        one_copy=one_copy is not None, ranking=ranking,
    )  # fmt: skip
    if max_bytes is not None:
        return_freed_memory(FREED_AT)  # freed blocks go back at once: the size is the use
    table, visited = _graph_rows(model, tokens, tc, src, plan, logits, progress, one_copy)
    return _assemble(model, tokens, tc, src, plan, logits, table, visited, start)
