"""Causal interventions: ablations, activation patching and attribution patching.

- :class:`Site` (what and where) and :class:`Intervention` (zero, mean, resample, noise, patch)
  are small declarative objects; :func:`intervene` applies them for a ``with`` block, and
  ``run_cached(..., interventions=[...])`` for one run.
- :func:`run_patched` runs many patched copies of a prompt in batched forward passes;
  :func:`patch_activations` builds every grid on it (exact and/or attribution patching).
- :mod:`interp.interventions.metrics` has the metrics; :mod:`~.plots` the heatmaps;
  :mod:`~.report` the report section.

- :func:`to_grid` (:mod:`~.grid_tensors`) gives one grid of a patching table as
  TransformerLens's ``[layer pos]`` / ``[layer head]`` / ``[layer pos head]`` tensor.
- :func:`ablation_effects` (:mod:`~.ablate`) ablates each head or layer alone, over a task.
- :func:`path_patch` (:mod:`~.paths`) patches a sender only along chosen paths (IOI-style);
  :func:`path_patch_senders` sweeps every head.
"""

from __future__ import annotations

from interp.engine import (
    ABLATIONS,
    SITE_KINDS,
    Intervention,
    Site,
    compile_hooks,
    intervene,
    pair_tokens,
    run_patched,
)
from interp.interventions.ablate import ablation_effects
from interp.interventions.grid_tensors import to_grid
from interp.interventions.metrics import Metric, answer_loss, logit_diff, probability
from interp.interventions.patching import (
    COLUMNS,
    GRIDS,
    method_errors,
    patch_activations,
)
from interp.interventions.paths import (
    PathPatchResult,
    Receiver,
    Sender,
    complete_receivers,
    path_patch,
    path_patch_senders,
)

__all__ = [
    "Site",
    "Intervention",
    "SITE_KINDS",
    "ABLATIONS",
    "intervene",
    "compile_hooks",
    "run_patched",
    "patch_activations",
    "ablation_effects",
    "method_errors",
    "to_grid",
    "pair_tokens",
    "GRIDS",
    "COLUMNS",
    "Metric",
    "logit_diff",
    "probability",
    "answer_loss",
    "path_patch",
    "path_patch_senders",
    "complete_receivers",
    "Sender",
    "Receiver",
    "PathPatchResult",
]
