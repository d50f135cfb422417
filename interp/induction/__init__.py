"""Induction-head detection: repeated-token batches, head scores, ablations, verdicts."""

from interp.induction.batches import (
    RepeatedTokens,
    choose_seq_lens,
    ordinary_token_ids,
    repeated_tokens,
)
from interp.induction.detect import (
    ABLATION_MIN_SHARE,
    COLUMNS,
    CONTROL_MAX_RATIO,
    DEFAULT_SEQ_LENS,
    INDUCTION_MIN,
    InductionResult,
    detect_induction_heads,
    run_induction_scan,
)
from interp.induction.scores import HeadScan, ablated_repeated_loss, scan_heads

__all__ = [
    "ABLATION_MIN_SHARE",
    "COLUMNS",
    "CONTROL_MAX_RATIO",
    "DEFAULT_SEQ_LENS",
    "INDUCTION_MIN",
    "HeadScan",
    "InductionResult",
    "RepeatedTokens",
    "ablated_repeated_loss",
    "choose_seq_lens",
    "detect_induction_heads",
    "ordinary_token_ids",
    "repeated_tokens",
    "run_induction_scan",
    "scan_heads",
]
