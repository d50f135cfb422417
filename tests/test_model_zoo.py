"""Every analysis and command on every architecture of the zoo, checked against transformers.

Each tiny checkpoint (tests/zoo.py) is written and loaded once per test run (the ``zoo``
fixture, shared with tests/models/test_rmsnorm.py and tests/circuits/test_circuits_gqa.py). What
each check
does, and its identity against plain ``transformers``, is in tests/support.py. The expected
outcome of every (model, analysis) cell comes from docs/support.md, which
``experiments/support_table.py`` writes from running the same checks: a cell that says
"works" must work, a "refused" cell must refuse with one clear line, and no cell may fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.support import ANALYSES, CASES, Outcome, build_case, check_all, render_table, run_check
from tests.zoo import ZOO_ARCHS

DOC = Path(__file__).resolve().parents[1] / "docs" / "support.md"
ATOL_LOGITS = 2e-5  # float32, 2 layers, logits of a few units: observed <= 6e-6


@pytest.fixture(scope="module")
def cases(zoo):
    return {name: build_case(name, zoo.root, zoo=zoo) for name in CASES}


@pytest.fixture(scope="module")
def outcomes(cases):
    return {name: check_all(case) for name, case in cases.items()}


def _documented() -> dict[tuple[str, str], str]:
    """``{(model, analysis): status}`` read from docs/support.md's grid."""
    lines = [line for line in DOC.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    header = [cell.strip().strip("`") for cell in lines[0].strip("|").split("|")]
    table = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        for analysis, status in zip(header[1:], cells[1:], strict=True):
            table[(cells[0], analysis)] = status
    return table


@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("toy_attn_only")])
def test_logits_match_transformers(name, cases):
    case = cases[name]
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, int(case.model.cfg.d_vocab), (2, 12), generator=g)
    with torch.no_grad():
        expected = case.hf(tokens).logits
        got = case.model(tokens, return_type="logits")
    assert expected.abs().max() > 1.0  # logits large enough that a mismatch would show
    torch.testing.assert_close(got, expected, atol=ATOL_LOGITS, rtol=0)


# Known bugs, in interp, that the table shows as FAILS: each an expected failure of the tests
# below until fixed. A fixed one then "works", which no longer matches docs/support.md: the
# table must be regenerated and the entry removed here.
KNOWN_BUGS: dict[tuple[str, str], str] = {}  # (model, analysis) -> why it FAILS today


def _expect_known_bugs(name: str, analyses) -> None:
    known = [
        f"{analysis}: {KNOWN_BUGS[(name, analysis)]}"
        for analysis in analyses
        if (name, analysis) in KNOWN_BUGS
    ]
    if known:
        pytest.xfail("; ".join(known))


@pytest.mark.slow  # runs every analysis on 17 models: ~40 s in all
@pytest.mark.parametrize("name", CASES)
def test_every_analysis_as_documented(name, outcomes):
    documented = _documented()
    for analysis, outcome in outcomes[name].items():
        if outcome.status == "FAILS":
            assert (name, analysis) in KNOWN_BUGS, f"{name} {analysis}: {outcome.reason}"
        assert documented[(name, analysis)] == outcome.status, (name, analysis, outcome)
        if outcome.status == "refused":
            assert outcome.reason and "\n" not in outcome.reason
    _expect_known_bugs(name, outcomes[name])


def _without_measurements(text: str) -> str:
    # a reason may quote a measured error (e.g. "by 0.0353"): its last digits may differ
    # between machines; what works, what is refused and why may not
    return re.sub(r"\d+\.\d+(e[-+]?\d+)?", "<number>", text)


@pytest.mark.slow  # runs every analysis on 17 models: ~40 s in all
def test_support_table_is_current(outcomes):
    assert _without_measurements(DOC.read_text(encoding="utf-8")) == _without_measurements(
        render_table(outcomes)
    ), "docs/support.md is out of date: run python experiments/support_table.py"


@pytest.mark.slow  # runs every analysis on 17 models: ~40 s in all
def test_layernorm_models_work_everywhere(outcomes):
    # the architectures with LayerNorm have no reason to refuse anything
    names = ("gpt2", "gpt_neox", "gpt_neox_parallel", "opt", "gptj", "phi")
    for name in names:
        statuses = {a: o.status for a, o in outcomes[name].items() if (name, a) not in KNOWN_BUGS}
        assert set(statuses.values()) == {"works"}, (name, statuses)
    for name in names:
        _expect_known_bugs(name, outcomes[name])


def test_a_broken_identity_is_reported_not_hidden(cases):
    case = cases["gpt2"]

    def wrong(c):  # an analysis whose numbers disagree with transformers
        raise AssertionError("logits differ from transformers by 1")

    assert run_check(wrong, case).status == "FAILS"
    assert run_check(lambda c: (_ for _ in ()).throw(ValueError("a\nb")), case).status == "FAILS"
    refused = run_check(lambda c: (_ for _ in ()).throw(ValueError("no BOS here")), case)
    assert (refused.status, refused.reason) == ("refused", "no BOS here")


def test_zoo_covers_the_issue_architectures():
    assert {"gpt2", "gpt_neox", "llama", "qwen2", "gemma2", "mistral", "opt", "gptj", "phi"} <= set(
        ZOO_ARCHS
    )
    assert set(ANALYSES) >= {"detect_induction_heads", "logit_attribution", "interp circuits"}


def test_toy_zero_heads_are_exactly_zero(cases):
    model = cases["toy_zero_heads"].model
    assert model.W_O[0, 1].abs().max() == 0 and model.W_V[1, 2].abs().max() == 0
    assert model.W_Q[1, 3].abs().max() == 0 and model.W_K[1, 3].abs().max() == 0
    assert model.W_O[0, 0].abs().max() > 0


def test_toy_properties(cases):
    assert int(cases["toy_small_vocab"].model.cfg.d_vocab) == 40
    tied = cases["toy_tied"].model
    torch.testing.assert_close(tied.W_E, tied.W_U.T)
    untied = cases["toy_small_vocab"].model
    assert not torch.allclose(untied.W_E, untied.W_U.T)
    assert cases["toy_no_bos"].hf.config.bos_token_id is None
    attn_only = cases["toy_attn_only"].model
    assert attn_only.cfg.attn_only and "blocks.0.hook_resid_mid" not in attn_only.hook_dict


@pytest.mark.parametrize("name", ["gpt_neox_parallel", "gptj", "phi", "toy_attn_only"])
def test_resid_mid_refused_with_the_reason(name, cases):
    from interp import run_cached

    with pytest.raises(ValueError, match=r"parallel residual|attention-only") as info:
        run_cached(cases[name].model, [1, 2, 3], resid=("mid",))
    assert "\n" not in str(info.value)
    assert re.search("pre' or 'post", str(info.value))


def test_a_command_that_changes_the_model_it_was_handed_fails(cases, monkeypatch):
    """After a case's first command, the commands get the loaded model instead of loading it
    again (tests/support.py, _loaded_once): one that leaves it changed fails its check."""
    import interp.cli
    import interp.models.loading as loading
    from tests.support import _cli

    case = cases["gpt2"]
    monkeypatch.setattr(case, "cli_loaded", True)

    def leaves_a_hook(argv):
        model = loading.load_model(str(case.directory))
        assert model is case.model  # handed over, not loaded again
        model.add_hook("blocks.0.hook_resid_pre", lambda x, hook: x)
        return 0

    monkeypatch.setattr(interp.cli, "main", leaves_a_hook)
    try:
        outcome = run_check(lambda c: _cli(c, ["induction"]), case)
    finally:
        case.model.reset_hooks()
    assert outcome == Outcome("FAILS", "the command changed the model it was handed")
