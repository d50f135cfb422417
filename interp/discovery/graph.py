"""The graph circuit discovery scores: writers into the residual stream, readers of it, and an
edge from every writer to every reader after it (docs/discovery.md).

- Writers: ``embed`` (token and position embeddings), ``L{l}H{h}`` (a head's output
  ``z @ W_O``, no bias), ``MLP{l}`` (its output).
- Readers: ``L{l}H{h}.q``, ``L{l}H{h}.k``, ``L{l}H{h}.v`` (the head's query, key and value
  input), ``MLP{l}`` (its input), ``logits`` (the final stream).
- An edge is named ``SOURCE->TARGET``: ``embed->L0H0.v``, ``L0H0->L1H2.k``, ``L1H2->logits``.

Grouped-query attention: key and value readers are the shared key/value heads, so ``L{l}H{h}.k``
and ``.v`` take ``h`` in ``0 .. n_key_value_heads - 1`` (the key/value head's index), while
``.q`` takes every query head. Parallel residual (GPT-J, Phi, Pythia): a layer's attention and
MLP read the same stream, so the layer's heads do not write into its own MLP. Biases, and
anything equal in the clean and corrupted runs, are not nodes. GPT-2 small has 32,491 edges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import pandas as pd

__all__ = ["EdgeGraph", "Reader", "edge_count", "edge_name", "split_edge", "edge_frame"]

QKV = ("q", "k", "v")


@dataclass(frozen=True)
class Reader:
    """A reader: ``kind`` is ``"q"``, ``"k"``, ``"v"`` (``head`` set: a query head for q, a
    key/value head for k and v), ``"mlp"`` or ``"logits"`` (``layer`` None)."""

    kind: str
    layer: int | None = None
    head: int | None = None

    def __str__(self) -> str:
        if self.kind in QKV:
            return f"L{self.layer}H{self.head}.{self.kind}"
        return "logits" if self.kind == "logits" else f"MLP{self.layer}"


def edge_name(source: str, target: str) -> str:
    """``SOURCE->TARGET``."""
    return f"{source}->{target}"


def split_edge(edge: str) -> tuple[str, str]:
    """``(source, target)`` of ``SOURCE->TARGET``; a ValueError for anything else."""
    parts = edge.split("->")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"an edge is named SOURCE->TARGET (e.g. 'L0H1->L1H2.k'), got {edge!r}")
    return parts[0], parts[1]


def edge_frame(pairs: Sequence[tuple[str, object]], score, attrs: dict) -> pd.DataFrame:
    """``edge, source, target, score``, one row per ``(source, target)`` pair (targets may be
    :class:`Reader`), with ``attrs``: every discovery score frame."""
    sources, targets = [s for s, _ in pairs], [str(t) for _, t in pairs]
    frame = pd.DataFrame(
        {
            "edge": [edge_name(s, t) for s, t in zip(sources, targets, strict=True)],
            "source": sources,
            "target": targets,
            "score": score,
        }
    )
    frame.attrs.update(attrs)
    return frame


@dataclass(frozen=True)
class EdgeGraph:
    """The writers, readers and edges of a model of this shape.

    Build it with :meth:`from_model` (a loaded model) or :meth:`from_config` (the config
    alone). ``writers`` and ``readers`` are in topological order; ``edges`` lists
    ``(writer, reader)`` names, readers in order and each reader's writers in order.
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    mlps: bool = True  # False: attention only
    parallel: bool = False  # attention and MLP of a layer read the same stream

    def __post_init__(self):
        if self.n_layers < 1 or self.n_heads < 1 or self.n_kv_heads < 1:
            raise ValueError(f"a graph needs at least one layer and one head, got {self}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.n_heads} query heads do not share {self.n_kv_heads} key/value heads "
                "evenly; n_heads must be a multiple of n_key_value_heads"
            )

    @classmethod
    def from_config(cls, cfg) -> EdgeGraph:
        """From a config with ``n_layers``, ``n_heads`` and optionally ``n_key_value_heads``,
        ``attn_only`` and ``parallel_attn_mlp`` (TransformerLens's names)."""
        n_heads = int(cfg.n_heads)
        return cls(
            n_layers=int(cfg.n_layers),
            n_heads=n_heads,
            n_kv_heads=int(getattr(cfg, "n_key_value_heads", None) or n_heads),
            mlps=not bool(getattr(cfg, "attn_only", False)),
            parallel=bool(getattr(cfg, "parallel_attn_mlp", False)),
        )

    @classmethod
    def from_model(cls, model) -> EdgeGraph:
        """From a loaded model (post-norms stay inside their writers: see runs.py)."""
        graph = cls.from_config(model.cfg)
        return replace(graph, mlps=graph.mlps and "blocks.0.hook_mlp_out" in model.hook_dict)

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    def layer_writers(self, layer: int) -> tuple[list[str], list[str]]:
        """``(heads, mlps)``: the writers of ``layer``'s attention and of its MLP."""
        heads = [f"L{layer}H{h}" for h in range(self.n_heads)]
        return heads, ([f"MLP{layer}"] if self.mlps else [])

    def layer_readers(self, layer: int) -> tuple[list[Reader], list[Reader]]:
        """``(attention readers, MLP readers)`` of ``layer``."""
        attn = [Reader("q", layer, h) for h in range(self.n_heads)]
        for kind in ("k", "v"):
            attn += [Reader(kind, layer, h) for h in range(self.n_kv_heads)]
        return attn, ([Reader("mlp", layer)] if self.mlps else [])

    @cached_property
    def writers(self) -> tuple[str, ...]:
        """``embed``, then each layer's heads and its MLP."""
        out = ["embed"]
        for layer in range(self.n_layers):
            heads, mlps = self.layer_writers(layer)
            out += heads + mlps
        return tuple(out)

    @cached_property
    def readers(self) -> tuple[Reader, ...]:
        """Each layer's q, k, v readers and its MLP, then ``logits``."""
        out: list[Reader] = []
        for layer in range(self.n_layers):
            attn, mlps = self.layer_readers(layer)
            out += attn + mlps
        return (*out, Reader("logits"))

    @cached_property
    def edges(self) -> tuple[tuple[str, Reader], ...]:
        """``(writer, reader)`` pairs: every writer to every reader after it."""
        found: list[tuple[str, Reader]] = []
        before = ["embed"]
        for layer in range(self.n_layers):
            attn, mlp_readers = self.layer_readers(layer)
            heads, mlps = self.layer_writers(layer)
            found += [(w, r) for r in attn for w in before]
            into_mlp = before if self.parallel else before + heads
            found += [(w, r) for r in mlp_readers for w in into_mlp]
            before = before + heads + mlps
        found += [(w, Reader("logits")) for w in before]
        return tuple(found)

    @cached_property
    def edge_names(self) -> tuple[str, ...]:
        """``SOURCE->TARGET`` of every edge, in the order of :attr:`edges`."""
        return tuple(edge_name(w, str(r)) for w, r in self.edges)

    def __len__(self) -> int:
        return len(self.edges)


def edge_count(model_or_config) -> int:
    """The number of edges of a model's (or a config's) graph."""
    loaded = hasattr(model_or_config, "hook_dict")
    return len((EdgeGraph.from_model if loaded else EdgeGraph.from_config)(model_or_config))
