"""Where an intervention acts (:class:`Site`) and what it does there (:class:`Intervention`).

A site names one TransformerLens hook and, optionally, one head and one position inside it:

=============  ==========================  ====================================  =========
kind           hook                        activation                            ``pos``
=============  ==========================  ====================================  =========
resid_pre      ``blocks.L.hook_resid_pre``  ``[batch pos d_model]``               position
resid_mid      ``blocks.L.hook_resid_mid``  ``[batch pos d_model]``               position
resid_post     ``blocks.L.hook_resid_post`` ``[batch pos d_model]``               position
attn_out       ``blocks.L.hook_attn_out``   ``[batch pos d_model]``               position
mlp_out        ``blocks.L.hook_mlp_out``    ``[batch pos d_model]``               position
head           ``blocks.L.attn.hook_z``     ``[batch pos head d_head]``           position
q, k, v        ``blocks.L.attn.hook_q|k|v`` ``[batch pos head d_head]``           position
pattern        ``blocks.L.attn.hook_pattern`` ``[batch head q_pos k_pos]``        query
=============  ==========================  ====================================  =========

A head's output is ``z @ W_O`` (plus the shared ``b_O``), linear in ``z``: replacing the head's
``z`` replaces its output, so ``head`` sites act on ``hook_z`` and need no gated hook. ``q`` and
``k`` are the projections *before* rotary embedding on rotary models (GPT-NeoX, the bundled
model): the bridge computes them as ``ln1(x) @ W_Q + b_Q`` and rotates afterwards (checked in
tests/interventions/test_interventions.py). Attention-only models have no ``resid_mid`` or
``mlp_out``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

__all__ = ["Site", "Intervention", "SITE_KINDS", "ABLATIONS"]


@dataclass(frozen=True)
class _Kind:
    suffix: str  # hook name after ``blocks.L.``
    head_axis: int | None  # axis of the head index in the hook's activation
    pos_axis: int  # axis of the (query) position


SITE_KINDS: dict[str, _Kind] = {  # site kind -> its hook and the axes of head and position
    "resid_pre": _Kind("hook_resid_pre", None, 1),
    "resid_mid": _Kind("hook_resid_mid", None, 1),
    "resid_post": _Kind("hook_resid_post", None, 1),
    "attn_out": _Kind("hook_attn_out", None, 1),
    "mlp_out": _Kind("hook_mlp_out", None, 1),
    "head": _Kind("attn.hook_z", 2, 1),
    "q": _Kind("attn.hook_q", 2, 1),
    "k": _Kind("attn.hook_k", 2, 1),
    "v": _Kind("attn.hook_v", 2, 1),
    "pattern": _Kind("attn.hook_pattern", 1, 2),
}
HEAD_KINDS = tuple(k for k, s in SITE_KINDS.items() if s.head_axis is not None)  # per head

# ablation kind -> what it needs: zero (nothing), mean (optional reference batch), resample
# (a source batch), noise (std, seed), patch (a source activation tensor)
ABLATIONS = ("zero", "mean", "resample", "noise", "patch")


@dataclass(frozen=True)
class Site:
    """One hook, and optionally one head and one (query) position in it.

    ``Site("head", 1, head=2)`` is head 1.2's output at every position; ``Site("resid_pre", 0,
    pos=3)`` the residual stream entering layer 0 at position 3. ``pos`` may be negative
    (counted from the end).
    """

    kind: str
    layer: int
    head: int | None = None
    pos: int | None = None

    def __post_init__(self):
        if self.kind not in SITE_KINDS:
            raise ValueError(f"site kind must be one of {', '.join(SITE_KINDS)}, got {self.kind!r}")
        if self.head is not None and self.kind not in HEAD_KINDS:
            raise ValueError(
                f"a {self.kind} site has no heads; pass head=None or a head kind "
                f"({', '.join(HEAD_KINDS)})"
            )
        if self.kind in HEAD_KINDS and self.head is None:
            raise ValueError(
                f"a {self.kind} site needs head=; e.g. Site({self.kind!r}, {self.layer}, head=0)"
            )
        if isinstance(self.layer, bool) or int(self.layer) != self.layer or self.layer < 0:
            raise ValueError(f"layer must be a non-negative integer, got {self.layer!r}")

    @property
    def hook_name(self) -> str:
        return f"blocks.{self.layer}.{SITE_KINDS[self.kind].suffix}"

    def index(self) -> tuple:
        """Index of the site's slice in the hook's activation (all batch rows)."""
        spec = SITE_KINDS[self.kind]
        ndim = 4 if spec.head_axis is not None else 3
        idx: list = [slice(None)] * ndim
        if spec.head_axis is not None:
            idx[spec.head_axis] = self.head
        if self.pos is not None:
            idx[spec.pos_axis] = self.pos
        return tuple(idx)

    def check(self, model, hook_names=None) -> None:
        """Raise if the model has no such layer, head or hook (``hook_names``: the model's
        hook names, when checking many sites)."""
        n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
        if self.layer >= n_layers:
            raise ValueError(
                f"{self}: layer {self.layer} out of range; the model has {n_layers} layers"
            )
        if self.head is not None and not 0 <= self.head < n_heads:
            raise ValueError(
                f"{self}: head {self.head} out of range; the model has {n_heads} heads per layer"
            )
        if self.hook_name not in (model.hook_dict if hook_names is None else hook_names):
            raise ValueError(
                f"{self}: the model has no hook {self.hook_name} (attention-only "
                "models have no resid_mid or mlp_out)"
            )

    def __str__(self) -> str:
        head = f"H{self.head}" if self.head is not None else ""
        pos = f"@{self.pos}" if self.pos is not None else ""
        return f"{self.kind} L{self.layer}{head}{pos}"


@dataclass(frozen=True, eq=False)
class Intervention:
    """What to do at a site: a small declarative object, printable and cheap to build.

    - ``zero``: set the site to 0.
    - ``mean``: set it to its mean over ``source`` (a reference prompt or batch; without one,
      over the batch being run), averaged over batch rows and also over positions unless
      ``per_position``.
    - ``resample``: set it to its value on ``source`` (a corrupted prompt or batch of the same
      length; one row is broadcast, otherwise rows are drawn with ``seed``).
    - ``noise``: add Gaussian noise of standard deviation ``std``, drawn with ``seed``; the same
      noise for every batch row, so the rows of a patching grid stay comparable (causal tracing).
    - ``patch``: set it to ``source[site.index()]``, where ``source`` is the hook's whole
      activation from another run (``[1 ...]`` or the run's batch size).
    """

    site: Site
    kind: str = "zero"
    source: object = field(default=None, repr=False)
    std: float | None = None
    seed: int = 0
    per_position: bool = False

    def __post_init__(self):
        if not isinstance(self.site, Site):
            raise TypeError(f"site must be a Site, got {type(self.site).__name__}")
        if self.kind not in ABLATIONS:
            raise ValueError(
                f"ablation kind must be one of {', '.join(ABLATIONS)}, got {self.kind!r}"
            )
        if self.kind == "noise" and (self.std is None or not self.std > 0):
            raise ValueError(f"noise needs a positive std=, got {self.std!r}")
        if self.kind == "resample" and self.source is None:
            raise ValueError("resample needs source= (the corrupted prompt or token batch)")
        if self.kind == "patch" and not isinstance(self.source, Tensor):
            raise ValueError("patch needs source= the hook's activation tensor from another run")

    def __str__(self) -> str:
        extra = f", std={self.std}" if self.kind == "noise" else ""
        return f"{self.kind}({self.site}{extra})"
