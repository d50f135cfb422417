"""The attribution graph of a task: one graph per row's clean prompt, aligned and averaged.

``attribution_graph(model, task, tc)`` builds each row's graph from its **clean** prompt (the
corrupted prompt is not used) with the per-prompt method, then keys every node so that the
same node of different rows meets:

- a feature ``("feature", layer, feature, position)``, an error ``("error", layer, -1,
  position)``, a token ``("token", -1, -1, position)`` (its token id differs per row);
- ``position`` is the row's **name** for that position (``task.labels``, e.g. ``"S2"``); a
  position with two names takes the one the task uses first; a position without a name is
  keyed by its offset from the end, ``"[-3]"`` (Python's negative index: ``"[-1]"`` is the
  last token), and a BOS the model prepended to a text prompt is ``"BOS"``. Rows of one
  template therefore align token for token; rows of different lengths align their named
  positions and their ends;
- a logit ``("logit", n_layers, -1, role)`` with ``role`` the row's ``"answer"`` (a logit
  whose token is among the row's answers), ``"wrong"`` (among its wrong answers) or
  ``"other"`` (any other logit the graph kept). Several logits of one role in one row (a list
  answer, several others) are one node: their rows summed (the attribution to their summed
  demeaned logits) and their probabilities summed. The per-prompt graph keeps the most
  probable logits (``max_n_logits``, ``desired_logit_prob``): a row whose answer is not among
  them has no answer node, which its ``count`` shows, and a warning says so.

Over the ``R`` rows, an edge's ``weight`` is its mean (a row without the edge counts as 0),
``sem`` the standard error of that mean (sample standard deviation over the ``R`` rows, ``/
sqrt(R)``; NaN for one row) and ``count`` the rows where it is nonzero. A node's ``count`` is
the rows where it is active (a node of that row's graph); ``activation`` a feature's mean
activation over those rows; ``probability`` a logit node's mean probability over all rows.
:meth:`TaskGraph.prune` applies the method's pruning (influence on the logits, weighted by
their mean probabilities) to the mean adjacency. Sums are taken in float64, so a task of
identical rows gives each edge exactly its one-prompt weight, with ``sem`` 0.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.graphs.influence import prune_masks
from interp.tasks.task import Task

logger = logging.getLogger(__name__)

__all__ = [
    "EDGE_COLUMNS",
    "TASK_NODE_COLUMNS",
    "TaskGraph",
    "is_task",
    "position_keys",
    "task_graph",
]

KINDS = ("feature", "error", "token", "logit")  # node order: features first, tokens+logits last
ROLES = ("answer", "wrong", "other")  # logit nodes, in this order
KEY = ("kind", "layer", "feature", "position")  # a node's key: the same node in every row
# the columns of TaskGraph.nodes (a pruned graph's add influence and cumulative)
TASK_NODE_COLUMNS = (*KEY, "count", "activation", "probability")
# the columns of TaskGraph.edges: node rows, mean weight, its standard error, rows nonzero
EDGE_COLUMNS = ("target", "source", "weight", "sem", "count")
_RESERVED = re.compile(r"\[-\d+\]|BOS")  # position keys of unnamed positions


def is_task(value) -> bool:
    """Whether ``attribution_graph`` was given a task (rather than one prompt)."""
    return isinstance(value, Task)


def position_keys(n_pos: int, named: dict[str, int], bos: bool) -> list[str]:
    """Each position's key (module docstring): its first name in ``named`` (label -> index in
    the prompt as run, BOS counted), else ``"BOS"`` (position 0 when ``bos``), else
    ``"[-k]"``."""
    keys = [f"[{p - n_pos}]" for p in range(n_pos)]
    if bos:
        keys[0] = "BOS"
    named_here: set[int] = set()
    for label, p in named.items():
        if _RESERVED.fullmatch(label):
            raise ValueError(
                f"position label {label!r} looks like the key of an unnamed position "
                "('[-k]', 'BOS'); rename it in the task"
            )
        if 0 <= p < n_pos and p not in named_here:
            keys[p], _ = label, named_here.add(p)
    return keys


def _row_entries(g, keys: list[str], answers, wrong, index: dict) -> tuple:
    """One row's graph as keyed entries: ``(targets, sources, weights)`` over node ids in
    ``index`` (grown as new keys appear), duplicates (logits of one role) summed; and the
    row's node ids with their activations and probabilities."""
    nodes = g.nodes
    ids = np.empty(len(nodes), dtype=np.int64)
    for i, (kind, layer, pos, feature, token) in enumerate(
        zip(
            nodes["kind"],
            nodes["layer"],
            nodes["pos"],
            nodes["feature"],
            nodes["token_id"],
            strict=True,
        )
    ):
        if kind == "logit":
            role = "answer" if token in answers else "wrong" if token in wrong else "other"
            key = (kind, int(layer), -1, role)
        else:
            key = (kind, int(layer), int(feature), keys[int(pos)])
        ids[i] = index.setdefault(key, len(index))
    adjacency = g.adjacency.detach().cpu().to(torch.float64)
    t, s = torch.nonzero(adjacency, as_tuple=True)
    ids_t = torch.from_numpy(ids)
    pairs = torch.stack([ids_t[t], ids_t[s]])
    pairs, inverse = torch.unique(pairs, dim=1, return_inverse=True)
    weights = torch.zeros(pairs.shape[1], dtype=torch.float64)
    weights.index_add_(0, inverse, adjacency[t, s])  # float64: exact for a single entry
    return pairs[0], pairs[1], weights, ids, nodes


@dataclass(frozen=True, eq=False)
class TaskGraph:
    """The attribution graph of a task (module docstring).

    ``nodes``: one row per node, columns :data:`TASK_NODE_COLUMNS` (features, errors, tokens,
    logits in that order; features by layer, position, feature), plus ``influence`` and
    ``cumulative`` on a pruned graph. ``edges``: :data:`EDGE_COLUMNS`, ``target`` and
    ``source`` row numbers of ``nodes``, one row per edge nonzero in some row (on a pruned
    graph: the kept edges only). ``kept_nodes``: on a pruned graph, each node's row in the
    unpruned one. ``graphs``: each row's own graph (for :meth:`head_loadings`), with
    ``node_ids`` its nodes' rows in the unpruned ``nodes`` and ``row_positions`` its position
    keys.
    """

    nodes: pd.DataFrame = field(repr=False)
    edges: pd.DataFrame = field(repr=False)
    n_prompts: int
    model_name: str = ""
    transcoder_name: str = ""
    kept_nodes: np.ndarray | None = field(default=None, repr=False)
    info: dict = field(default_factory=dict, repr=False)
    graphs: tuple = field(default=(), repr=False)
    node_ids: tuple = field(default=(), repr=False)
    row_positions: tuple = field(default=(), repr=False)  # each row's position keys

    @property
    def adjacency(self) -> Float[Tensor, "node node"]:
        """The mean adjacency ``[n n]`` (float64; row = target, column = source)."""
        n = len(self.nodes)
        dense = torch.zeros(n, n, dtype=torch.float64)
        e = self.edges
        where = torch.tensor(e["target"].to_numpy()), torch.tensor(e["source"].to_numpy())
        dense[where] = torch.tensor(e["weight"].to_numpy(), dtype=torch.float64)
        return dense

    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> TaskGraph:
        """The nodes and edges the method's pruning keeps on the mean adjacency (tokens and
        logits always kept), weighted by the logit nodes' mean probabilities."""
        if self.kept_nodes is not None:
            raise ValueError("this task graph is pruned already: prune the graph it came from")
        kinds = self.nodes["kind"].to_numpy()
        weights = torch.as_tensor(
            np.where(kinds == "logit", self.nodes["probability"].to_numpy(), 0.0)
        )
        node_mask, edge_mask, cumulative, influence = prune_masks(
            self.adjacency,
            weights,
            n_features=int((kinds == "feature").sum()),
            n_kept_tail=int(np.isin(kinds, ("token", "logit")).sum()),
            node_threshold=node_threshold,
            edge_threshold=edge_threshold,
        )
        kept = torch.nonzero(node_mask).flatten().numpy()
        nodes = self.nodes.iloc[kept].reset_index(drop=True)
        nodes["influence"] = influence[kept].numpy()
        nodes["cumulative"] = cumulative[kept].numpy()
        e = self.edges
        t, s = e["target"].to_numpy(), e["source"].to_numpy()
        keep = edge_mask[torch.tensor(t), torch.tensor(s)].numpy()
        new = np.full(len(self.nodes), -1)
        new[kept] = np.arange(len(kept))
        edges = e[keep].reset_index(drop=True)
        edges["target"], edges["source"] = new[t[keep]], new[s[keep]]
        info = self.info | {"node_threshold": node_threshold, "edge_threshold": edge_threshold}
        return replace(self, nodes=nodes, edges=edges, kept_nodes=kept, info=info)

    def head_loadings(self, edges=None) -> pd.DataFrame:
        """Each edge's head loadings averaged over the rows
        (:func:`interp.graphs.task_attention.task_head_loadings`)."""
        from interp.graphs.task_attention import task_head_loadings

        return task_head_loadings(self, edges)

    def qk_attribution(self, layer: int, head: int, query: str, key: str, *, top=None):
        """One head's score between two named positions over node pairs, averaged over the rows
        (:func:`interp.graphs.task_attention.task_qk_attribution`)."""
        from interp.graphs.task_attention import task_qk_attribution

        return task_qk_attribution(self, layer, head, query, key, top=top)

    def __repr__(self) -> str:
        counts = self.nodes["kind"].value_counts()
        parts = ", ".join(f"{counts.get(k, 0)} {k}" for k in KINDS)
        pruned = "" if self.kept_nodes is None else ", pruned"
        return (
            f"TaskGraph({self.n_prompts} prompts, {len(self.nodes)} nodes: {parts}; "
            f"{len(self.edges)} edges{pruned})"
        )


def task_graph_of(one_graph: Callable, arguments: dict) -> TaskGraph:
    """:func:`task_graph` from ``attribution_graph``'s ``locals()`` (its dispatch): only its
    parameters are read, so other names defined before the dispatch do no harm."""
    names = inspect.signature(task_graph).parameters
    return task_graph(one_graph, **{k: v for k, v in arguments.items() if k in names})


def task_graph(
    one_graph: Callable,
    model,
    tokens_or_text: Task,
    tc,
    *,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    max_feature_nodes: int | None = None,
    batch_size: int = 64,
    max_bytes: int | str | None = None,
    progress: bool = False,
    backward: str = "auto",
    ranking: str = "auto",
) -> TaskGraph:
    """The task graph (module docstring): ``one_graph`` (``attribution_graph``, passed in so
    this module sits below it) builds each row's graph with the other arguments (its own)."""
    options = dict(
        max_n_logits=max_n_logits,
        desired_logit_prob=desired_logit_prob,
        max_feature_nodes=max_feature_nodes,
        batch_size=batch_size,
        max_bytes=max_bytes,
        progress=progress,
        backward=backward,
        ranking=ranking,
    )
    task: Task = tokens_or_text
    batch = task.tokens(model)  # every row checked before any graph
    index: dict[tuple, int] = {}
    targets, sources, weights = [], [], []
    graphs, node_ids, tables, row_positions = [], [], [], []
    missing = []
    for r in range(len(task)):
        n = int(batch.lengths[r])
        named = {k: int(v[r]) for k, v in batch.positions.items() if int(v[r]) >= 0}
        keys = position_keys(n, named, bool(batch.prefix[r]))
        g = one_graph(model, batch.clean[r, :n].clone(), tc, **options)
        answers, wrong = set(batch.answers[r]), set(batch.wrong[r] if batch.wrong else ())
        t, s, w, ids, nodes = _row_entries(g, keys, answers, wrong, index)
        if not answers & set(g.logit_token_ids.tolist()):
            missing.append(r + 1)
        targets.append(t), sources.append(s), weights.append(w)
        tables.append(nodes[["activation", "probability", "pos"]].assign(id=ids, row=r))
        graphs.append(g), node_ids.append(ids), row_positions.append(tuple(keys))
    if missing:
        logger.warning(
            "rows %s: the answer is not among the graph's logits (raise max_n_logits or "
            "desired_logit_prob); those rows have no answer node",
            ", ".join(map(str, missing)),
        )
    built = _assemble(task, index, targets, sources, weights, tables, graphs, node_ids)
    return replace(built, row_positions=tuple(row_positions))


def _assemble(task, index, targets, sources, weights, tables, graphs, node_ids) -> TaskGraph:
    n_rows = len(task)
    keys = list(index)
    per_node = pd.concat(tables, ignore_index=True)
    grouped = per_node.groupby("id")
    count = grouped["row"].nunique().reindex(range(len(keys)), fill_value=0).to_numpy()
    activation = grouped["activation"].mean().reindex(range(len(keys))).to_numpy()
    # a role's several logits in one row: their probabilities summed, then averaged over rows
    prob = per_node.groupby("id")["probability"].sum(min_count=1) / n_rows
    probability = prob.reindex(range(len(keys))).to_numpy()
    mean_pos = grouped["pos"].mean().reindex(range(len(keys))).to_numpy()
    frame = pd.DataFrame(keys, columns=list(KEY))
    frame["count"], frame["activation"], frame["probability"] = count, activation, probability
    frame["probability"] = frame["probability"].where(frame["kind"] == "logit")
    # order: kinds, then layer, then position (mean index over rows), feature, logit role
    order_key = pd.DataFrame(
        {
            "k": frame["kind"].map(KINDS.index),
            "layer": frame["layer"],
            "p": np.where(frame["kind"] == "logit", frame["position"].map(_role_rank), mean_pos),
            "f": frame["feature"],
            "name": frame["position"],
        }
    )
    order = order_key.sort_values(["k", "layer", "p", "f", "name"], kind="stable").index
    order = order.to_numpy()
    new = np.empty(len(keys), dtype=np.int64)
    new[order] = np.arange(len(keys))
    nodes = frame.iloc[order].reset_index(drop=True)

    t = torch.as_tensor(new)[torch.cat(targets)]
    s = torch.as_tensor(new)[torch.cat(sources)]
    w = torch.cat(weights)
    pairs, inverse = torch.unique(torch.stack([t, s]), dim=1, return_inverse=True)
    m = pairs.shape[1]
    total = torch.zeros(m, dtype=torch.float64).index_add_(0, inverse, w)
    hits = torch.zeros(m, dtype=torch.long).index_add_(0, inverse, torch.ones_like(inverse))
    mean = total / n_rows
    # two passes: deviations from the mean, the absent rows' zeros counted (exactly 0 for
    # identical rows, where one pass's sum of squares would leave rounding)
    deviations = torch.zeros(m, dtype=torch.float64).index_add_(
        0, inverse, (w - mean[inverse]) ** 2
    )
    deviations += (n_rows - hits) * mean**2
    sem = (
        (deviations / (n_rows - 1) / n_rows).sqrt()
        if n_rows > 1
        else torch.full((m,), float("nan"), dtype=torch.float64)
    )
    edges = pd.DataFrame(
        {
            "target": pairs[0].numpy(),
            "source": pairs[1].numpy(),
            "weight": mean.numpy(),
            "sem": sem.numpy(),
            "count": hits.numpy(),
        }
    )
    first = graphs[0]
    return TaskGraph(
        nodes=nodes,
        edges=edges,
        n_prompts=n_rows,
        model_name=first.model_name,
        transcoder_name=first.transcoder_name,
        info={"rows": n_rows, "source": task.source},
        graphs=tuple(graphs),
        node_ids=tuple(new[ids] for ids in node_ids),
    )


def _role_rank(role: str) -> int:
    return ROLES.index(role) if role in ROLES else len(ROLES)
