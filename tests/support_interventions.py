"""The intervention checks of tests/support.py: activation patching, path patching, ablations
and ``interp patch``, each against plain transformers or a plain hook on the same model.

Imported by tests/support.py (after the helpers it uses here are defined); import that
module, not this one.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pandas as pd
import torch

from tests.support import (
    ATOL_LOGITS,
    Case,
    NotApplicable,
    _cli,
    _close,
    _reference_logits,
    _tokens,
)

ANSWER, WRONG = 5, 6  # token ids of the logit-difference metric (every vocabulary has them)
ATOL_PATCH = 1e-4  # a metric from logits of a few units, float32, against transformers
ATOL_PATH = 1e-5  # a patched run against the same patch made with a plain hook (same model)


def _pair(case: Case, n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean tokens and corrupted tokens of the same length (the first half redrawn)."""
    clean = _tokens(case, n)
    g = torch.Generator().manual_seed(1)
    corrupted = clean.clone()
    corrupted[0, : n // 2] = torch.randint(2, int(case.model.cfg.d_vocab), (n // 2,), generator=g)
    return clean, corrupted


def _hf_metric(case: Case, tokens: torch.Tensor, answer: int = ANSWER, wrong: int = WRONG) -> float:
    """The logit difference at the last position from plain transformers' logits."""
    logits = _reference_logits(case, tokens)
    return float(logits[0, -1, answer] - logits[0, -1, wrong])


def _near(got: float, want: float, atol: float, what: str) -> None:
    if not abs(got - want) <= atol:
        raise AssertionError(f"{what} is {got:.6g} but should be {want:.6g} (> {atol:g} apart)")


def _head_patched_metric(
    case: Case, base: torch.Tensor, source: torch.Tensor, layer: int, head: int, metric
) -> float:
    """Patch one head's output (its slice of ``hook_z``) with a plain hook: the reference."""
    from interp import run_cached

    name = f"blocks.{layer}.attn.hook_z"
    src = run_cached(case.model, source, hooks=[name])[name]

    def hook(act, hook):
        act = act.clone()
        act[:, :, head] = src[:, :, head]
        return act

    return float(metric(run_cached(case.model, base, interventions=[(name, hook)]).logits)[0])


def check_patch_activations(case: Case) -> None:
    from interp import run_cached
    from interp.interventions import Intervention, Site, logit_diff, patch_activations, run_patched

    clean, corrupted = _pair(case)
    metric = logit_diff(ANSWER, WRONG)
    frame = patch_activations(case.model, clean, corrupted, metric, sites=["resid_pre", "heads"])
    clean_m, corrupted_m = frame.attrs["clean_metric"], frame.attrs["corrupted_metric"]
    _near(clean_m, _hf_metric(case, clean), ATOL_PATCH, "the clean metric")
    _near(corrupted_m, _hf_metric(case, corrupted), ATOL_PATCH, "the corrupted metric")
    name = "blocks.0.hook_resid_pre"  # denoising the whole residual stream at layer 0 = clean
    whole = Intervention(
        Site("resid_pre", 0), "patch", source=run_cached(case.model, clean, hooks=[name])[name]
    )
    _near(
        float(run_patched(case.model, corrupted, [[whole]], metric)[0]),
        clean_m,
        ATOL_PATCH,
        "resid_pre L0 patched at every position",
    )
    heads = frame[frame["site"] == "head"]  # the "heads" grid's cells are head sites
    if len(heads) != int(case.model.cfg.n_layers) * int(case.model.cfg.n_heads):
        raise AssertionError(f"the heads grid has {len(heads)} rows, not layers x query heads")
    nan = heads["recovered"].isna()
    if nan.any() and not frame.attrs["recovered_undefined"]:
        raise AssertionError("recovered is NaN although the clean and corrupted metrics differ")
    if not (nan | heads["recovered"].map(lambda v: abs(v) < float("inf"))).all():
        raise AssertionError("recovered is infinite in the heads grid")
    first = heads[(heads["layer"] == 0) & (heads["head"] == 0)]["metric"].item()
    _near(
        first,
        _head_patched_metric(case, corrupted, clean, 0, 0, metric),
        ATOL_PATH,
        "the heads grid's L0H0 cell against a plain hook_z patch",
    )


def _task_records(case: Case, lengths=(5, 7, 6)) -> list[dict]:
    """Token-id rows of different lengths (run as given: no BOS is added), each with its own
    answer and wrong token; the corrupted prompt redraws the first two tokens."""
    vocab = min(int(case.model.cfg.d_vocab), 40)  # the toys have 40 tokens
    g = torch.Generator().manual_seed(3)
    records = []
    for i, n in enumerate(lengths):
        clean = torch.randint(2, vocab, (n,), generator=g)
        corrupted = clean.clone()
        corrupted[:2] = torch.randint(2, vocab, (2,), generator=g)
        answer, wrong = ANSWER + i, WRONG + 2 * i + 1
        records.append(
            {"clean": clean.tolist(), "corrupted": corrupted.tolist(), "answer": answer}
            | {"wrong": wrong}
        )
    return records


def check_patch_task(case: Case) -> None:
    """A task of 3 rows of different lengths (right-padded): each row's per-head grid equals
    that row as a single pair, and a task of its first row is the single-pair grid."""
    from interp.interventions import logit_diff, patch_activations
    from interp.tasks import Task

    records = _task_records(case)
    rows = patch_activations(case.model, Task.from_records(records), sites=["heads"], per_row=True)
    first = patch_activations(case.model, Task.from_records(records[:1]), sites=["heads"])
    for i, record in enumerate(records):
        clean, corrupted = (torch.tensor([record[k]]) for k in ("clean", "corrupted"))
        metric = logit_diff(record["answer"], record["wrong"])
        pair = patch_activations(case.model, clean, corrupted, metric, sites=["heads"])
        mine = rows[rows["row"] == i]
        if len(mine) != len(pair):
            raise AssertionError(f"row {i + 1} has {len(mine)} cells, the pair {len(pair)}")
        gap = float(
            (torch.tensor(mine["metric"].to_numpy()) - torch.tensor(pair["metric"].to_numpy()))
            .abs()
            .max()
        )
        _near(
            gap,
            0.0,
            ATOL_PATH,
            f"row {i + 1} of the padded task against its single pair (max |diff|)",
        )
        if i == 0:
            gap = float(
                (torch.tensor(first["metric"].to_numpy()) - torch.tensor(pair["metric"].to_numpy()))
                .abs()
                .max()
            )
            _near(gap, 0.0, ATOL_PATH, "a task of one row against the single pair (max |diff|)")
            for key in ("clean_metric", "corrupted_metric"):
                _near(first.attrs[key], pair.attrs[key], ATOL_PATH, f"a one-row task's {key}")
    base = torch.tensor(rows.attrs["corrupted_metric_rows"])[torch.tensor(rows["row"].to_numpy())]
    if float((torch.tensor(rows["metric"].to_numpy()) - base).abs().max()) <= 10 * ATOL_PATH:
        raise AssertionError("no head changes any row's metric: the identity would be trivial")


def check_path_patch(case: Case) -> None:
    from interp.interventions import complete_receivers, logit_diff, path_patch

    clean, corrupted = _pair(case, 8)
    metric = logit_diff(ANSWER, WRONG)
    corrupted_m = _hf_metric(case, corrupted)
    # the layer-0 head whose output matters most, so that the identity is not 0 == 0
    patched = [
        _head_patched_metric(case, corrupted, clean, 0, h, metric)
        for h in range(int(case.model.cfg.n_heads))
    ]
    head = max(range(len(patched)), key=lambda h: abs(patched[h] - corrupted_m))
    if not abs(patched[head] - corrupted_m) > 10 * ATOL_PATH:
        raise AssertionError(
            "patching any layer-0 head changes nothing: the identity would be 0 == 0"
        )
    sender = ("head", 0, head)
    receivers = complete_receivers(case.model, sender, mlps="freeze")
    try:
        result = path_patch(
            case.model,
            clean,
            corrupted,
            sender=sender,
            receivers=receivers,
            metric=metric,
            mlps="freeze",
        )
    except KeyError as exc:  # a hook it made up itself from its own receivers: a bug
        raise AssertionError(f"path_patch used a hook this model lacks: {exc.args[0]}") from exc
    _near(
        float(result.table["metric"].item()),
        patched[head],
        ATOL_PATH,
        f"head 0.{head} into every receiver (MLPs frozen) against patching its output",
    )
    _near(result.corrupted_metric, corrupted_m, ATOL_PATCH, "path patching's corrupted metric")


def _hf_out_projection(hf, layer: int) -> torch.nn.Module:
    """The linear map from the concatenated heads to d_model in transformers' layer ``layer``."""
    pattern = re.compile(rf"\.{layer}\.(self_attn|attn|attention)\.(o_proj|out_proj|c_proj|dense)$")
    found = [mod for name, mod in hf.named_modules() if pattern.search(name)]
    if len(found) != 1:
        raise AssertionError(f"found {len(found)} attention output projections in layer {layer}")
    return found[0]


def _hf_ablated_logits(
    case: Case, tokens: torch.Tensor, layer: int, head: int, kind: str
) -> torch.Tensor:
    """transformers' logits with head ``head``'s input slice of the output projection zeroed or
    set to its mean over the batch and positions (an independent ablation)."""
    d_head = int(case.model.cfg.d_head)
    cols = slice(head * d_head, (head + 1) * d_head)

    def pre(_module, args):
        x = args[0].clone()
        x[..., cols] = 0 if kind == "zero" else x[..., cols].mean(dim=(0, 1))
        return (x, *args[1:])

    handle = _hf_out_projection(case.hf, layer).register_forward_pre_hook(pre)
    try:
        with torch.no_grad():
            return case.hf(tokens).logits
    finally:
        handle.remove()


def check_ablation(case: Case) -> None:
    from interp import run_cached
    from interp.interventions import Intervention, Site

    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(2, int(case.model.cfg.d_vocab), (2, 8), generator=g)
    layer, head = int(case.model.cfg.n_layers) - 1, 1
    out = f"blocks.{layer}.attn.hook_out"  # before any post-attention norm (Gemma 2)
    plain = run_cached(case.model, tokens, head_outputs=True, hooks=[out])
    for kind in ("zero", "mean"):
        run = run_cached(
            case.model,
            tokens,
            hooks=[out],
            interventions=[Intervention(Site("head", layer, head=head), kind)],
        )
        if kind == "zero":  # the attention output loses exactly that head's output
            _close(
                run[out],
                plain[out] - plain.head_outputs()[layer][:, :, head],
                ATOL_PATH,
                f"L{layer} attention output with head {head} zero-ablated",
            )
        if case.hf is not None:
            _close(
                run.logits,
                _hf_ablated_logits(case, tokens, layer, head, kind),
                ATOL_LOGITS,
                f"logits with head {layer}.{head} {kind}-ablated",
            )
    if float((run.logits - plain.logits).abs().max()) <= 10 * ATOL_LOGITS:
        raise AssertionError("ablating the head changed nothing: the identity would be trivial")


CLI_TEXTS = (  # (clean, corrupted, answer, wrong): the first whose pieces are single tokens
    (
        "When Mary and John went to the store, John gave a drink to",
        "When Mary and John went to the store, Mary gave a drink to",
        " Mary",
        " John",
    ),
    ("w1 w2 w3 w4 w5 w2", "w1 w6 w3 w4 w5 w6", "w3", "w7"),
)


def _cli_texts(case: Case) -> tuple[str, str, str, str]:
    from interp.attribution import resolve_token
    from interp.engine import to_tokens

    for clean, corrupted, answer, wrong in CLI_TEXTS:
        model = case.model
        single = all(len(model.to_tokens(t, prepend_bos=False)[0]) == 1 for t in (answer, wrong))
        if single and to_tokens(model, clean).shape == to_tokens(model, corrupted).shape:
            if resolve_token(model, answer) != resolve_token(model, wrong):
                return clean, corrupted, answer, wrong
    raise AssertionError("no pair of test texts tokenises to equal lengths with this tokenizer")


def check_cli_patch(case: Case) -> None:
    from interp.attribution import resolve_token
    from interp.engine import to_tokens

    if case.directory is None:
        raise NotApplicable(
            "commands load a checkpoint directory afresh; this model's setup exists only in memory"
        )
    clean, corrupted, answer, wrong = _cli_texts(case)
    with tempfile.TemporaryDirectory() as out:
        _cli(
            case,
            [
                "patch",
                "--model",
                str(case.directory),
                "--clean",
                clean,
                "--corrupted",
                corrupted,
                "--answer",
                answer,
                "--wrong",
                wrong,
                "--sites",
                "resid_pre",
                "--out",
                out,
            ],
        )
        frame = pd.read_csv(Path(out) / "patching.csv")
        summary = json.loads((Path(out) / "summary.json").read_text(encoding="utf-8"))
    columns = ["site", "layer", "head", "pos", "method", "metric", "recovered"]
    if list(frame.columns) != columns:
        raise AssertionError(f"patching.csv has columns {list(frame.columns)}, not {columns}")
    ids = resolve_token(case.model, answer), resolve_token(case.model, wrong)
    for role, text in (("clean", clean), ("corrupted", corrupted)):
        want = _hf_metric(case, to_tokens(case.model, text), *ids)  # as the command tokenises
        _near(summary[f"{role}_metric"], want, ATOL_PATCH, f"summary.json's {role}_metric")
