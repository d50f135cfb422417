"""Run every public analysis and command on one model and check it against plain transformers.

``check_all(case)`` returns ``{analysis: Outcome}``: ``works`` (it ran and its identity held
against ``transformers.AutoModelForCausalLM`` on the same tokens), ``refused`` (it raised one
of interp's documented errors with a one-line reason) or ``FAILS`` (a crash, a number that does
not match, or a refusal that is not one clear line). ``experiments/support_table.py`` writes
the table of these outcomes into docs/support.md; tests/test_model_zoo.py re-derives it.
The intervention checks (patching, over a pair and over a task, path patching, ablation,
``interp patch``) are in tests/support_interventions.py, the discovery checks (``edge_scores``
by each method, ``evaluate_circuit``) in tests/support_discovery.py, the SAE splice in
tests/support_saes.py, the transcoder splice and the attribution graph in
tests/support_graphs.py.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from tests.zoo import TOY_KINDS, ZOO_ARCHS, Zoo, attn_only_model

__all__ = ["Case", "Outcome", "ANALYSES", "CASES", "build_case", "check_all", "render_table"]

ATOL_LOGITS = 2e-5  # float32, 2 layers, logits of a few units: observed <= 6e-6
ATOL_PATTERN = 1e-5  # softmax outputs in [0, 1]
ATOL_SCORE = 1e-4  # scores in [-1, 1] from float32 factored vs float64 dense products
ATOL_LOGPROB = 1e-4  # fold_layernorm's own VERIFY_ATOL for float32

CASES: tuple[str, ...] = (
    *ZOO_ARCHS,
    *TOY_KINDS,
    "toy_no_bos_prefix",
    "toy_attn_only",
    "toy_attn_only_no_norm",
)
DESCRIPTIONS = {
    "gpt2": "GPT-2 (LayerNorm, learned positions)",
    "gpt_neox": "Pythia / GPT-NeoX, sequential residual",
    "gpt_neox_parallel": "Pythia / GPT-NeoX, parallel residual",
    "llama": "Llama (RMSNorm, GQA 4 query / 2 key-value heads)",
    "qwen2": "Qwen2 (RMSNorm, GQA, q/k/v biases)",
    "gemma2": "Gemma 2 (RMSNorm (1+w), GQA, logit soft-capping)",
    "mistral": "Mistral (RMSNorm, GQA)",
    "opt": "OPT (LayerNorm, learned positions offset 2)",
    "gptj": "GPT-J (parallel residual, rotary)",
    "phi": "Phi (parallel residual, partial rotary)",
    "toy_small_vocab": "GPT-2 toy, 40-token vocabulary",
    "toy_no_bos": "GPT-2 toy, 40 tokens, no BOS token in config or tokenizer (TransformerLens "
    "then prepends EOS in its place)",
    "toy_no_bos_prefix": "the same toy run with nothing prepended (cfg.default_prepend_bos "
    "False); commands load afresh, so they do not apply",
    "toy_tied": "GPT-2 toy, 40 tokens, tied embeddings",
    "toy_zero_heads": "GPT-2 toy, 40 tokens, exactly-zero W_O / W_V / W_Q+W_K heads",
    "toy_attn_only": "attention-only (TransformerLens boot_native), 40 tokens, no checkpoint",
    "toy_attn_only_no_norm": "the same without any LayerNorm (normalization_type None), as "
    "hand-set and compiled circuits often are",
}
REFUSALS: tuple[type[BaseException], ...] = (ValueError, KeyError, RuntimeError)


class NotApplicable(Exception):
    """The check cannot be posed for this case (e.g. a command needs a checkpoint directory)."""


@dataclass
class Case:
    """A loaded model, its checkpoint directory (None for boot_native) and plain transformers."""

    name: str
    model: object
    directory: Path | None
    hf: object | None  # transformers model (eager attention), None without a checkpoint
    # copying_scores_dense(model), computed once: four checks compare against it
    dense_copying: pd.DataFrame | None = field(default=None, repr=False)
    cli_loaded: bool = False  # a command has loaded the checkpoint itself (see _cli)


@dataclass(frozen=True)
class Outcome:
    status: str  # "works" | "refused" | "FAILS" | "n/a"
    reason: str = ""

    def cell(self) -> str:
        return self.status if not self.reason else f"{self.status}: {self.reason}"


def build_case(name: str, root: Path, *, zoo: Zoo | None = None) -> Case:
    """The case ``name`` of ``CASES``, its checkpoint written under ``root``, or taken from
    ``zoo`` (shared with other tests; checks must leave the models as they found them)."""
    from interp import load_model

    if name == "toy_attn_only":
        return Case(name, attn_only_model(), None, None)
    if name == "toy_attn_only_no_norm":
        return Case(name, attn_only_model(normalization_type=None), None, None)
    zoo = zoo if zoo is not None else Zoo(root)
    if name == "toy_no_bos_prefix":
        # its own model: the setting below would change the shared "toy_no_bos" model too
        model = load_model(zoo.directory("toy_no_bos"), device="cpu")
        model.cfg.default_prepend_bos = False  # prompts and induction rows start with no BOS
        return Case(name, model, None, zoo.hf("toy_no_bos"))  # a command would load the default
    return Case(name, zoo.model(name), zoo.directory(name), zoo.hf(name))


def _tokens(case: Case, n: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(2, int(case.model.cfg.d_vocab), (1, n), generator=g)


def _reference_logits(case: Case, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        if case.hf is not None:
            return case.hf(tokens).logits
        return case.model(tokens, return_type="logits")


def _precap_logits(case: Case, tokens: torch.Tensor) -> torch.Tensor | None:
    """transformers' logits before a final soft-cap (Gemma 2), or None for a model without one.

    The issue asks attribution to explain the pre-cap logits of such a model (the cap is not
    linear) and to say so; a check accepts either reference, whichever the analysis used.
    """
    cap = getattr(getattr(case.hf, "config", None), "final_logit_softcapping", None)
    if case.hf is None or not cap:
        return None
    out: dict[str, torch.Tensor] = {}
    handle = case.hf.get_output_embeddings().register_forward_hook(
        lambda _m, _i, logits: out.__setitem__("raw", logits.detach())
    )
    try:
        with torch.no_grad():
            case.hf(tokens)
    finally:
        handle.remove()
    return out["raw"]


def _logit_diff_matches(
    case: Case, tokens: torch.Tensor, got: float, answer: int, wrong: int | None, what: str
) -> None:
    refs = [_reference_logits(case, tokens)]
    precap = _precap_logits(case, tokens)
    if precap is not None:
        refs.append(precap)
    wants = [float(r[0, -1, answer] - (0.0 if wrong is None else r[0, -1, wrong])) for r in refs]
    if not any(abs(got - want) <= 1e-4 for want in wants):
        names = " or ".join(f"{w:.6g}" for w in wants)
        raise AssertionError(
            f"{what} gives {got:.6g} but transformers' logit (difference) is {names}"
        )


def _close(got: torch.Tensor, want: torch.Tensor, atol: float, what: str) -> None:
    error = float((got.double() - want.double()).abs().max())
    if not error <= atol:
        raise AssertionError(f"{what} differs from transformers by {error:.3g} (> {atol:g})")


# ---------------------------------------------------------------------------- the analyses


def check_load(case: Case) -> None:
    tokens = _tokens(case)
    with torch.no_grad():
        got = case.model(tokens, return_type="logits")
    _close(got, _reference_logits(case, tokens), ATOL_LOGITS, "logits")


def _hf_attention_outputs(hf, tokens: torch.Tensor) -> tuple[list[torch.Tensor], tuple]:
    """Each layer's attention module output in plain transformers (before any post-norm)."""
    pattern = re.compile(r"\.(\d+)\.(self_attn|attn|attention)$")
    modules = {
        int(m.group(1)): mod for name, mod in hf.named_modules() if (m := pattern.search(name))
    }
    outs: dict[int, torch.Tensor] = {}
    handles = [
        mod.register_forward_hook(
            lambda _m, _i, out, layer=layer: outs.__setitem__(layer, out[0].detach())
        )
        for layer, mod in modules.items()
    ]
    try:
        with torch.no_grad():
            attentions = hf(tokens, output_attentions=True).attentions
    finally:
        for handle in handles:
            handle.remove()
    return [outs[layer] for layer in sorted(outs)], attentions


def check_run_cached(case: Case) -> None:
    from interp import run_cached

    tokens = _tokens(case)
    n_layers = int(case.model.cfg.n_layers)
    outs = [f"blocks.{layer}.attn.hook_out" for layer in range(n_layers)]
    run = run_cached(
        case.model, tokens, resid=("pre", "post"), patterns=True, head_outputs=True, hooks=outs
    )
    _close(run.logits, _reference_logits(case, tokens), ATOL_LOGITS, "run_cached logits")
    if case.hf is not None:
        attn_out, attentions = _hf_attention_outputs(case.hf, tokens)
    else:
        attn_out, attentions = [run[name] for name in outs], None
    b_O = getattr(case.model, "b_O", None)
    for layer in range(n_layers):  # per-head outputs (one per query head) add up
        total = run.head_outputs()[layer].sum(dim=2)
        if b_O is not None:
            total = total + b_O[layer]
        _close(total, attn_out[layer], 1e-4, f"L{layer} sum of head outputs vs attention output")
        if attentions is not None:
            _close(
                run.patterns()[layer],
                attentions[layer],
                ATOL_PATTERN,
                f"L{layer} attention pattern",
            )


def check_detect_induction_heads(case: Case) -> None:
    from interp.induction import run_induction_scan
    from interp.induction.scores import scores_from_patterns

    result = run_induction_scan(case.model, batch_size=2, ablate=1)
    table = result.table.set_index(["layer", "head"]).sort_index()
    tokens = result.batch.tokens
    if case.hf is not None:
        with torch.no_grad():
            patterns = torch.stack(case.hf(tokens, output_attentions=True).attentions)
    else:
        from interp import run_cached

        patterns = run_cached(case.model, tokens, patterns=True).patterns()
    expected = scores_from_patterns(patterns, result.batch)["induction"].flatten()
    _close(
        torch.tensor(table["induction_score"].values), expected, ATOL_PATTERN, "induction scores"
    )
    copying_scores_agree(table.reset_index(), case)


def copying_scores_agree(table: pd.DataFrame, case: Case) -> None:
    from interp.circuits import copying_scores_dense

    if case.dense_copying is None:
        case.dense_copying = copying_scores_dense(case.model)
    dense = case.dense_copying.set_index(["layer", "head"]).sort_index()
    got = table.set_index(["layer", "head"]).sort_index()["copying_score"]
    both = got.notna() == dense["copying_score"].notna()
    if not both.all():
        raise AssertionError("copying scores defined where the dense reference is undefined")
    diff = (got - dense["copying_score"]).abs().max()
    if not (pd.isna(diff) or diff <= ATOL_SCORE):
        raise AssertionError(f"copying scores differ from the dense reference by {diff:.3g}")


def check_copying_scores(case: Case) -> None:
    from interp import copying_scores

    table = copying_scores(case.model)
    if not (table["undefined"] == table["copying_score"].isna()).all():
        raise AssertionError("undefined flags do not match the NaN scores")
    copying_scores_agree(table, case)


def check_composition_scores(case: Case) -> None:
    from interp.circuits import composition_scores, composition_scores_dense

    fast = composition_scores(case.model, "QKV", baseline_samples=20)
    dense = composition_scores_dense(case.model, "QKV", baseline_samples=20)
    if not (fast["undefined"] == dense["undefined"]).all():
        raise AssertionError("composition: undefined flags differ from the dense reference")
    if not (fast["undefined"] == fast["score"].isna()).all():
        raise AssertionError("composition: undefined flags do not match the NaN scores")
    diff = (fast["score"] - dense["score"]).abs().max()
    if not (pd.isna(diff) or diff <= ATOL_SCORE):
        raise AssertionError(f"composition scores differ from the dense reference by {diff:.3g}")


def check_logit_attribution(case: Case) -> None:
    from interp import logit_attribution

    tokens = _tokens(case)
    frame = logit_attribution(case.model, tokens, 5, wrong=6)
    total = float(frame.loc[frame["component"] == "total", "contribution"].iloc[0])
    parts = float(frame.loc[frame["component"] != "total", "contribution"].sum())
    _logit_diff_matches(case, tokens, parts, 5, 6, "the sum of the attributions")
    _logit_diff_matches(case, tokens, total, 5, 6, "the total row")


def check_logit_lens(case: Case) -> None:
    from interp import logit_lens

    tokens = _tokens(case)
    frame = logit_lens(case.model, tokens, 5, wrong=6)
    _logit_diff_matches(
        case, tokens, float(frame["logit_diff"].iloc[-1]), 5, 6, "the lens's last row"
    )


def check_fold_layernorm(case: Case) -> None:
    from interp import fold_layernorm

    tokens = _tokens(case)
    folded = fold_layernorm(case.model)
    with torch.no_grad():
        got = folded(tokens, return_type="logits").double().log_softmax(-1)
    want = _reference_logits(case, tokens).double().log_softmax(-1)
    _close(got, want, ATOL_LOGPROB, "folded log-probs")


def _cli(case: Case, argv: list[str]) -> None:
    """Run ``interp ...``: exit 0 works; exit 1 with one stderr line is a refusal."""
    from interp.cli import main

    if case.directory is None:
        raise NotApplicable(
            "commands load a checkpoint directory afresh; this model's setup exists only in memory"
        )
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        with _loaded_once(case):
            code = main(argv)
    if code == 0:
        return
    lines = [line for line in err.getvalue().splitlines() if line.startswith("interp ")]
    raise ValueError(lines[-1].split("error: ", 1)[-1] if lines else f"exit code {code}")


@contextlib.contextmanager
def _loaded_once(case: Case):
    """A case's first command loads the checkpoint as the command line does. The later ones
    get ``case.model`` from the same call (``load_model(directory, device="cpu")``, checked
    against transformers by ``check_load``) instead of loading it again, 0.3 s each and some
    eighty times; each must then leave it as it found it (no tensor written in place, no hook
    left, the config unchanged), or the check fails."""
    import interp.models.loading as loading

    if not case.cli_loaded or torch.cuda.is_available():  # a command's default device: cpu
        case.cli_loaded = True
        yield
        return
    real = loading.load_model

    def load(name, **given):
        if Path(name) == case.directory and given.get("device", "cpu") == "cpu" and len(given) <= 1:
            return case.model
        return real(name, **given)

    before = _state(case.model)
    loading.load_model = load
    try:
        yield
    finally:
        loading.load_model = real
    after = _state(case.model)
    same = before[1:] == after[1:] and before[0].keys() == after[0].keys()
    if not (same and all(torch.equal(t, after[0][n]) for n, t in before[0].items())):
        raise AssertionError("the command changed the model it was handed")


def _state(model) -> tuple:
    """What a command could change in a model it was handed: its tensors (copies: the models
    are tiny), hooks left on its hook points, its config."""
    tensors = {n: t.detach().clone() for n, t in model.state_dict().items()}
    hooks = sum(len(h._forward_hooks) + len(h._backward_hooks) for h in model.hook_dict.values())
    return tensors, hooks, repr(sorted(vars(model.cfg).items(), key=lambda kv: kv[0]))


def check_cli_induction(case: Case) -> None:
    with tempfile.TemporaryDirectory() as out:
        _cli(
            case,
            [
                "induction",
                "--model",
                str(case.directory),
                "--out",
                out,
                "--batch-size",
                "2",
                "--ablate-top",
                "1",
            ],
        )
        table = pd.read_csv(Path(out) / "head_scores.csv")
    copying_scores_agree(table, case)


def check_cli_attribute(case: Case) -> None:
    from interp.attribution import resolve_token
    from interp.engine import to_tokens

    text = case.model.tokenizer.decode(_tokens(case)[0])
    answer = case.model.tokenizer.decode([5])
    with tempfile.TemporaryDirectory() as out:
        _cli(
            case,
            [
                "attribute",
                "--model",
                str(case.directory),
                "--prompt",
                text,
                "--answer",
                answer,
                "--out",
                out,
            ],
        )
        frame = pd.read_csv(Path(out) / "attribution.csv")
    tokens = to_tokens(case.model, text)  # as the command tokenises the prompt
    parts = float(frame.loc[frame["component"] != "total", "contribution"].sum())
    _logit_diff_matches(
        case, tokens, parts, resolve_token(case.model, answer), None, "attribution.csv"
    )


def check_cli_circuits(case: Case) -> None:
    with tempfile.TemporaryDirectory() as out:
        _cli(
            case,
            [
                "circuits",
                "--model",
                str(case.directory),
                "--out",
                out,
                "--baseline-samples",
                "20",
                "--no-report",
            ],
        )
        table = pd.read_csv(Path(out) / "copying_scores.csv")
    copying_scores_agree(table, case)


def check_cli_attention(case: Case) -> None:
    text = case.model.tokenizer.decode(_tokens(case)[0])
    with tempfile.TemporaryDirectory() as out:
        page = Path(out) / "attention.html"
        _cli(
            case,
            ["attention", "--model", str(case.directory), "--prompt", text, "--out", str(page)],
        )
        if not page.stat().st_size:
            raise AssertionError("the attention page is empty")


# the intervention checks use the helpers above: imported only once those exist
from tests.support_discovery import (  # noqa: E402
    check_cli_discover,
    check_edge_scores_acdc,
    check_edge_scores_eap,
    check_edge_scores_eap_ig,
    check_edge_scores_exact,
    check_evaluate_circuit,
)
from tests.support_graphs import check_attribution_graph, check_transcoder_splice  # noqa: E402
from tests.support_interventions import (  # noqa: E402
    check_ablation,
    check_cli_patch,
    check_patch_activations,
    check_patch_task,
    check_path_patch,
)
from tests.support_saes import check_sae_splice  # noqa: E402
from tests.support_tasks import check_cli_attribute_task  # noqa: E402

ANALYSES: dict[str, Callable[[Case], None]] = {
    "load_model": check_load,
    "run_cached": check_run_cached,
    "detect_induction_heads": check_detect_induction_heads,
    "copying_scores": check_copying_scores,
    "composition_scores": check_composition_scores,
    "logit_attribution": check_logit_attribution,
    "logit_lens": check_logit_lens,
    "fold_layernorm": check_fold_layernorm,
    "interp induction": check_cli_induction,
    "interp attribute": check_cli_attribute,
    "interp attribute --task": check_cli_attribute_task,
    "interp circuits": check_cli_circuits,
    "interp attention": check_cli_attention,
    "patch_activations": check_patch_activations,
    "patch_activations (task)": check_patch_task,
    "path_patch": check_path_patch,
    "ablation": check_ablation,
    "interp patch": check_cli_patch,
    "edge_scores (exact)": check_edge_scores_exact,
    "edge_scores (eap)": check_edge_scores_eap,
    "edge_scores (eap-ig)": check_edge_scores_eap_ig,
    "edge_scores (acdc)": check_edge_scores_acdc,
    "evaluate_circuit": check_evaluate_circuit,
    "interp discover": check_cli_discover,
    "SAE splice": check_sae_splice,
    "transcoder splice": check_transcoder_splice,
    "attribution graph": check_attribution_graph,
}


def run_check(check: Callable[[Case], None], case: Case) -> Outcome:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)
            try:
                check(case)
            finally:
                logging.disable(logging.NOTSET)
    except NotApplicable as exc:
        return Outcome("n/a", str(exc))
    except AssertionError as exc:
        return Outcome("FAILS", str(exc).splitlines()[0] if str(exc) else "identity failed")
    except REFUSALS as exc:
        message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        if not message or "\n" in message.strip():
            return Outcome("FAILS", f"{type(exc).__name__} without a one-line reason")
        return Outcome("refused", message.strip())
    except Exception as exc:  # noqa: BLE001 - a crash is a result here
        return Outcome("FAILS", f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return Outcome("works")


def check_all(case: Case) -> dict[str, Outcome]:
    return {name: run_check(check, case) for name, check in ANALYSES.items()}


def render_table(results: dict[str, dict[str, Outcome]]) -> str:
    """docs/support.md: a summary grid, then every refusal's reason."""
    names = list(ANALYSES)
    lines = [
        "# What works on which model",
        "",
        "Generated by `python experiments/support_table.py` from running every analysis and",
        "command on tiny random checkpoints of each architecture (`tests/zoo.py`, 2 layers,",
        "d_model 64, norm weights far from 1, random biases) and on hand-set toy models.",
        "**works** means it ran and its identity held against plain `transformers` on the same",
        "tokens (logits; attention patterns; per-head outputs summing to the attention output;",
        "attributions summing to the logit difference; folded log-probs; scores equal to their",
        "dense reference; patched metrics equal to transformers' and to plain hooks; a task of",
        "rows of different lengths, patched at once, equal to each row as a single pair; ablated",
        "logits equal to transformers' with the head's slice of its output projection zeroed",
        "or mean-set; edge scores equal to path patching's direct effects and to autograd",
        "through plain hooks; a circuit's runs equal to transformers' and to plain hooks;",
        "ACDC's kept circuit as faithful as 1 - its removed edges' scores; interp discover's",
        "files equal to the library's scores and evaluation on the same model:",
        "tests/support_discovery.py; an SAE spliced in leaving transformers' logits, its",
        "features the encoding of transformers' hidden state, and without the error term the",
        "logits of a plain replacing hook: tests/support_saes.py; transcoders spliced in",
        "leaving transformers' logits and, without error terms, writing their own",
        "reconstruction; an attribution graph whose entries are what taking a source out of",
        "an independent frozen replacement model moves each target by:",
        "tests/support_graphs.py). **refused** means it",
        "stopped with the one-line reason",
        "listed below; **n/a**: the check cannot be posed (a command loads a checkpoint afresh).",
        "**FAILS**: a known bug: it crashed or its identity did not hold (the error is listed",
        "below); `tests/test_model_zoo.py` names each one as an expected failure until fixed.",
        "`tests/test_model_zoo.py` re-derives this table and fails if it is out of date.",
        "",
        "| model | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for case, outcomes in results.items():
        cells = [outcomes[n].status for n in names]
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    lines += ["", "## Models", ""]
    lines += [f"- **{case}**: {DESCRIPTIONS.get(case, case)}" for case in results]
    lines += ["", "## Reasons", ""]
    for case, outcomes in results.items():
        for name in names:
            if outcomes[name].reason:
                reason = outcomes[name].reason.replace("|", "\\|")
                lines.append(f"- {case}, `{name}` ({outcomes[name].status}): {reason}")
    return "\n".join(lines) + "\n"
