"""QK / OV circuits: the weights-side view of attention.

Each head is a QK circuit (where it looks) and an OV circuit (what it moves); see
``docs/circuits.md``. Submodules:

* ``weights``: LayerNorm-folded weights, per-head ``qk_circuit`` / ``ov_circuit``, and scores
  and outputs recomputed from them (checked against a real forward pass);
* ``full``: circuits through the embeddings, kept factored; memory-guarded ``materialize``;
* ``copying``: copying scores from ``d_head x d_head`` eigenproblems;
* ``composition``: Q/K/V-composition scores with a random-matrix baseline.
"""

from interp.circuits.composition import (
    KINDS,
    composition_baseline,
    composition_scores,
    composition_scores_dense,
)
from interp.circuits.copying import copying_scores, copying_scores_dense, ov_eigenvalues
from interp.circuits.full import (
    MatrixTooLargeError,
    default_max_bytes,
    direct_path,
    direct_path_top_tokens,
    full_ov_circuit,
    full_ov_diagonal,
    full_qk_circuit,
    materialize,
    top_copied_tokens,
)
from interp.circuits.products import (
    attention_scores_from_weights,
    head_outputs_from_weights,
    ov_circuit,
    qk_circuit,
)
from interp.circuits.weights import CircuitWeights, circuit_weights

__all__ = [
    "KINDS",
    "CircuitWeights",
    "MatrixTooLargeError",
    "attention_scores_from_weights",
    "circuit_weights",
    "composition_baseline",
    "composition_scores",
    "composition_scores_dense",
    "copying_scores",
    "copying_scores_dense",
    "default_max_bytes",
    "direct_path",
    "direct_path_top_tokens",
    "full_ov_circuit",
    "full_ov_diagonal",
    "full_qk_circuit",
    "head_outputs_from_weights",
    "materialize",
    "ov_circuit",
    "ov_eigenvalues",
    "qk_circuit",
    "top_copied_tokens",
]
