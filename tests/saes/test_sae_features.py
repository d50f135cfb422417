"""SAE feature pages: `interp features` writes what interp.saes.features computes; the top
contexts' activations are the SAE's encoding of the scanned tokens; logit effects rank tokens as
the folded unembedding does; hostile text stays text; bad input is refused before any output."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import torch

from interp import load_sae
from interp.cli import main
from interp.models.layernorm import fold_layernorm
from interp.saes.features import feature_summary, logit_effects
from tests.pages.test_html import ALLOWED_TAGS, HOSTILE, executable, parse

HOOK = "blocks.1.hook_resid_pre"
COLUMNS = ["feature", "frequency", "mean_act", "max_act", "top_promoted", "top_suppressed"]
STYLE = re.compile(
    r"^background: rgba\(255, 140, 0, [01]\.\d{3}\);( outline: 1px solid #1f2328;)?$"
)


@pytest.fixture(scope="module")
def sae():
    return load_sae("tiny-induction-sae")


def test_contexts_and_frequencies_are_the_encoding_of_the_tokens(bundled_model, sae):
    g = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(1, 300, (3, 20), generator=g),
        torch.randint(1, 300, (2, 12), generator=g),
    ]
    summary = feature_summary(bundled_model, sae, batches, top=5, contexts=4)
    encoded = []
    for batch in batches:
        with torch.no_grad():
            _, cache = bundled_model.run_with_cache(batch, names_filter=HOOK)
            encoded.append(sae.encode(cache[HOOK]).reshape(-1, sae.d_sae))
    flat = torch.cat(encoded)
    assert summary.n_tokens == 3 * 20 + 2 * 12
    assert summary.n_dead == int((flat.amax(0) <= 0).sum())
    for row in summary.table.itertuples(index=False):
        j = int(row.feature)
        assert row.frequency == pytest.approx(float((flat[:, j] > 0).float().mean()))
        assert row.max_act == pytest.approx(float(flat[:, j].max()), abs=1e-5)
        tops = flat[:, j].topk(4).values
        got = [c.activation for c in summary.contexts[j]]
        assert got == pytest.approx(tops[: len(got)].tolist(), abs=1e-5)
        first = summary.contexts[j][0]
        assert first.activations[first.center] == pytest.approx(first.activation)
    means = (
        (flat > 0).float().mean(0)
        * torch.where(flat > 0, flat, 0).sum(0)
        / (flat > 0).sum(0).clamp_min(1)
    )
    assert list(summary.table["feature"]) == means.topk(5).indices.tolist()


def test_logit_effects_rank_tokens_as_the_folded_unembedding(bundled_model, sae):
    promoted, suppressed, effects = logit_effects(bundled_model, sae, k=5)
    folded = fold_layernorm(bundled_model)
    reference = sae.W_dec.detach().double() @ folded.W_U.detach().double()  # [d_sae d_vocab]
    # equal up to one constant per feature (the folded unembedding is centred over the vocab)
    gap = effects.double() - reference
    assert float((gap - gap.mean(-1, keepdim=True)).abs().max()) < 1e-4
    assert torch.equal(promoted, reference.topk(5, dim=-1).indices)
    assert torch.equal(suppressed, (-reference).topk(5, dim=-1).indices)


def test_the_command_writes_the_files_and_hostile_text_stays_text(tmp_path, capsys):
    text = tmp_path / "hostile.txt"
    text.write_text(("\n".join(HOSTILE) + "\ndef f(x):\n    return x + x\n") * 40, encoding="utf-8")
    out = tmp_path / "out"
    argv = ["features", "--sae", "tiny-induction-sae", "--text", str(text), "--tokens", "2048"]
    assert main([*argv, "--top", "6", "--out", str(out)]) == 0
    names = ["features.csv", "report.html", "summary.json"]
    assert sorted(p.name for p in out.iterdir()) == names
    # the output contract (interp.cli.output): results and one "wrote" line per file on stdout
    printed = capsys.readouterr().out.splitlines()
    assert sorted(line for line in printed if line.startswith("wrote ")) == [
        f"wrote {out / name}" for name in names
    ]
    assert printed[0].startswith("2048 tokens scanned")
    table = pd.read_csv(out / "features.csv")
    assert list(table.columns) == COLUMNS and len(table) == 6
    summary = json.loads((out / "summary.json").read_text())
    assert summary["shown"] == list(table["feature"]) and summary["hook"] == HOOK
    page = (out / "report.html").read_text(encoding="utf-8")
    parser = parse(page)
    assert {tag for tag, _ in parser.tags} <= ALLOWED_TAGS | {"span"}
    assert not [(t, a) for t, a in parser.tags for name in a if name.startswith("on")]
    styles = [dict(a)["style"] for t, a in parser.tags if t == "span"]
    assert styles and all(STYLE.match(s) for s in styles)
    assert "__pwned" not in "".join(executable(parser))
    shown = re.findall(r'<span class="interp-token"[^>]*>([^<]*)</span>', page)
    assert len(shown) == len(styles)  # every token span holds text only
    assert any("&lt;" in token for token in shown)  # hostile characters shown, escaped


def test_bad_input_is_refused_before_any_output(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["features", "--sae", "no-such-sae", "--out", str(out)]) == 2
    assert "not a bundled SAE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["features", "--sae", "tiny-induction-sae", "--tokens", "3", "--out", str(out)])
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    assert (
        main(["features", "--sae", "tiny-induction-sae", "--text", str(empty), "--out", str(out)])
        == 2
    )
    sae = load_sae("tiny-induction-sae")
    narrow = type(sae)(sae.W_enc[:32], sae.b_enc, sae.W_dec[:, :32], sae.b_dec[:32],
                       architecture="topk", k=16, hook_name=HOOK)  # fmt: skip
    narrow.save(tmp_path / "narrow")
    assert main(["features", "--sae", str(tmp_path / "narrow"), "--out", str(out)]) == 1
    assert "d_in=32" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("content", [b"\xff" * 8 + b"not a header", b"\x01\x00", b""])
def test_an_unreadable_weights_file_is_refused_in_one_line_naming_it(content, tmp_path, capsys):
    folder = tmp_path / "broken"
    load_sae("tiny-induction-sae").save(folder)
    weights = folder / "sae_weights.safetensors"
    weights.write_bytes(content)  # header too large, invalid length, empty
    out = tmp_path / "out"
    assert main(["features", "--sae", str(folder), "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1, error
    assert str(weights) in error[0] and "is not a readable safetensors file" in error[0]
    assert "save it again, or download it afresh" in error[0]  # what to do
    assert not out.exists()


def test_the_page_renders_offline_in_a_browser(tmp_path, browser):
    """Every figure draws, no request is made, no error is raised (CSP included)."""
    from tests.test_browser import assert_clean, open_page

    text = tmp_path / "hostile.txt"
    text.write_text(("\n".join(HOSTILE) + "\nx = y + y\n") * 30, encoding="utf-8")
    out = tmp_path / "out"
    argv = ["features", "--sae", "tiny-induction-sae", "--text", str(text), "--tokens", "1024"]
    assert main([*argv, "--top", "3", "--out", str(out)]) == 0
    assert_clean(open_page(browser, out / "report.html", "features"))
