"""What path patching takes and gives: the two ends of a path, a :class:`Sender` (a head's or an
MLP's output) and a :class:`Receiver` (a head's q/k/v input, an MLP's input, or the logits),
which receivers a sender can reach, and the :class:`PathPatchResult`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from interp.foundation.formatting import number, summary_html, table_html
from interp.interventions.grids import undefined

__all__ = [
    "Sender",
    "Receiver",
    "PathPatchResult",
    "as_sender",
    "as_receiver",
    "complete_receivers",
    "path_table",
    "QKV",
]

QKV = ("q", "k", "v")  # the inputs of a head a receiver can be


@dataclass(frozen=True)
class Sender:
    """Whose output is patched: ``Sender("head", L, H)`` or ``Sender("mlp", L)``."""

    kind: str
    layer: int
    head: int | None = None

    def __post_init__(self):
        if self.kind not in ("head", "mlp") or (self.kind == "head") != (self.head is not None):
            raise ValueError(f"a sender is ('head', layer, head) or ('mlp', layer), got {self}")

    def __str__(self) -> str:
        return f"L{self.layer}H{self.head}" if self.kind == "head" else f"MLP{self.layer}"


@dataclass(frozen=True)
class Receiver:
    """What reads the sender: ``("head", L, H, "q"|"k"|"v")``, ``("mlp", L)`` or ``"logits"``."""

    kind: str
    layer: int | None = None
    head: int | None = None
    input: str | None = None  # q, k or v for a head

    def __post_init__(self):
        ok = {
            "head": self.layer is not None and self.head is not None and self.input in QKV,
            "mlp": self.layer is not None and self.head is None and self.input is None,
            "logits": self.layer is None and self.head is None and self.input is None,
        }
        if not ok.get(self.kind, False):
            raise ValueError(
                "a receiver is ('head', layer, head, 'q'|'k'|'v'), ('mlp', layer) "
                f"or 'logits', got {self}"
            )

    def __str__(self) -> str:
        if self.kind == "head":
            return f"L{self.layer}H{self.head}.{self.input}"
        return "logits" if self.kind == "logits" else f"MLP{self.layer}"


def as_sender(spec) -> Sender:
    """A :class:`Sender` from ``(layer, head)``, ``("head", layer, head)`` or ``("mlp", layer)``."""
    if isinstance(spec, Sender):
        return spec
    spec = tuple(spec)
    if len(spec) == 2 and spec[0] != "mlp":  # (layer, head)
        return Sender("head", int(spec[0]), int(spec[1]))
    if spec and spec[0] in ("head", "mlp"):
        return Sender(spec[0], *(int(x) for x in spec[1:]))
    raise ValueError(
        f"a sender is (layer, head), ('head', layer, head) or ('mlp', layer), got {spec}"
    )


def as_receiver(spec) -> Receiver:
    """A :class:`Receiver` from ``("head", layer, head, "q"|"k"|"v")``, ``("mlp", layer)`` or
    ``"logits"``."""
    if isinstance(spec, Receiver):
        return spec
    if spec == "logits":
        return Receiver("logits")
    spec = tuple(spec)
    if len(spec) == 4 and spec[0] == "head":
        return Receiver("head", int(spec[1]), int(spec[2]), spec[3])
    if len(spec) == 2 and spec[0] == "mlp":
        return Receiver("mlp", int(spec[1]))
    raise ValueError(
        f"a receiver is ('head', layer, head, 'q'|'k'|'v'), ('mlp', layer) or 'logits', got {spec}"
    )


def _parallel(model) -> bool:
    return bool(getattr(model.cfg, "parallel_attn_mlp", False))


def _reaches(model, sender: Sender, receiver: Receiver) -> bool:
    """Whether the sender writes to the residual stream before the receiver reads it."""
    if receiver.kind == "logits":
        return True
    if receiver.kind == "mlp" and sender.kind == "head" and not _parallel(model):
        return receiver.layer >= sender.layer  # the MLP reads after its layer's attention
    return receiver.layer > sender.layer


def complete_receivers(model, sender, *, mlps: str = "freeze") -> tuple[Receiver, ...]:
    """Every reader of the residual stream after ``sender``: patching into all of them at once
    equals patching the sender's output (exactly with ``mlps="freeze"``; docs/path_patching.md).
    With ``mlps="recompute"`` MLPs are part of the path, not receivers, and are left out."""
    sender = as_sender(sender)
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    found = [
        Receiver("head", lay, hd, x)
        for lay in range(n_layers)
        for hd in range(n_heads)
        for x in QKV
    ]
    if mlps == "freeze" and _has_mlps(model):
        found += [Receiver("mlp", lay) for lay in range(n_layers)]
    found.append(Receiver("logits"))
    return tuple(r for r in found if _reaches(model, sender, r))


def _has_mlps(model) -> bool:
    return "blocks.0.hook_mlp_out" in model.hook_dict and not getattr(model.cfg, "attn_only", False)


def _recoverable(clean: float, corrupted: float) -> bool:
    return not undefined(clean, corrupted)


@dataclass(frozen=True)
class PathPatchResult:
    """One row per sender (``COLUMNS`` + ``sender``, ``receivers``), and the two reference runs.

    ``recovered = (metric - corrupted_metric) / (clean_metric - corrupted_metric)`` in both
    directions (0 = the corrupted run, 1 = the clean run); NaN, with ``recovered_defined`` False,
    when the clean and corrupted metrics are too close to divide by. Over a task the metrics
    are dataset means, the table adds ``recovered_sem`` (or a ``row`` column with
    ``per_row=True``) and ``clean_metric_rows`` / ``corrupted_metric_rows`` hold each row's.
    """

    table: pd.DataFrame
    clean_metric: float
    corrupted_metric: float
    direction: str
    mlps: str
    n_rows: int = 1  # task rows (1 for a prompt pair, whose prompt rows are averaged)
    clean_metric_rows: tuple[float, ...] = ()  # per task row; empty for a prompt pair
    corrupted_metric_rows: tuple[float, ...] = ()

    @property
    def recovered_defined(self) -> bool:
        return _recoverable(self.clean_metric, self.corrupted_metric)

    def _summary(self) -> dict[str, str]:
        recovered = self.table["recovered"]
        best = self.table.loc[recovered.abs().idxmax()] if recovered.notna().any() else None
        return {
            "direction": self.direction,
            "mlps": self.mlps,
            "metric": (
                f"clean {number(self.clean_metric)}, corrupted "
                f"{number(self.corrupted_metric)}"
                + ("" if self.recovered_defined else " (too close: recovered is NaN)")
            ),
            "senders": f"{len(self.table)} rows"
            + (f" over {self.n_rows} task rows" if self.n_rows > 1 else ""),
            "receivers": _cut(str(self.table["receivers"].iloc[0]) if len(self.table) else ""),
            "largest |recovered|": (
                "none defined" if best is None else f"{best['sender']}: {number(best['recovered'])}"
            ),
        }

    def __repr__(self) -> str:
        summary = self._summary()
        return (
            f"PathPatchResult({summary['direction']}, mlps={summary['mlps']}, "
            f"{summary['metric']}, {summary['senders']}, largest |recovered| "
            f"{summary['largest |recovered|']})"
        )

    def _repr_html_(self) -> str:
        ranked = self.table.reindex(
            self.table["recovered"].abs().sort_values(ascending=False, na_position="last").index
        )
        shown = [c for c in ranked.columns if c != "receivers"]
        return summary_html(
            "Path patching",
            self._summary(),
            table=table_html(ranked, columns=shown),
            table_title="senders by |recovered| (.table)",
        )

    def grid(self, value: str = "recovered") -> pd.DataFrame:
        """Head senders as a layer x head table of ``value`` (what the IOI paper plots)."""
        if "row" in self.table:
            raise ValueError(
                "grid() needs one value per sender; this result has one per task row "
                "(per_row=True): run without per_row for the dataset means"
            )
        heads = self.table[self.table["head"].notna()]
        return heads.pivot(index="layer", columns="head", values=value)


def _cut(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def path_table(
    senders: Sequence,
    receivers: Sequence,
    values: Tensor,
    clean: Tensor,
    corrupted: Tensor,
    *,
    task: bool,
    per_row: bool,
) -> pd.DataFrame:
    """The result table from ``values [senders rows]`` and the clean and corrupted metrics
    ``[rows]`` (one row for a pair): means (a task adds ``recovered_sem``) or, with
    ``per_row``, one table row per sender and row."""
    n_senders, n_rows = values.shape
    c, k = float(clean.mean()), float(corrupted.mean())
    if per_row:
        flat = values.reshape(-1)
        ok = torch.tensor(
            [_recoverable(float(a), float(b)) for a, b in zip(clean, corrupted, strict=True)]
        )
        ratio = ((values - corrupted) / (clean - corrupted)).masked_fill(~ok, math.nan)
        senders = [s for s in senders for _ in range(n_rows)]
        recovered = ratio.reshape(-1).tolist()
    else:
        flat = values.mean(dim=1)
        recovered = (
            ((flat - k) / (c - k)).tolist() if _recoverable(c, k) else [math.nan] * n_senders
        )
    table = pd.DataFrame(
        {
            "site": "path",
            "layer": [s.layer for s in senders],
            "head": pd.array([s.head for s in senders], dtype="Int64"),
            "pos": pd.array([None] * len(senders), dtype="Int64"),
            "method": "exact",
            "metric": flat.tolist(),
            "recovered": recovered,
        }
    )
    if per_row:
        table.insert(4, "row", list(range(n_rows)) * n_senders)
    elif task:
        good = n_rows > 1 and _recoverable(c, k)
        sem = values.std(dim=1) / math.sqrt(n_rows) / abs(c - k) if good else None
        table["recovered_sem"] = math.nan if sem is None else sem.tolist()
    table["sender"] = [str(s) for s in senders]
    table["receivers"] = ", ".join(str(r) for r in receivers)
    return table
