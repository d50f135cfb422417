"""``interp graph`` keeps the command contract (docs/commands.md): arguments, transcoders and
--out checked before the model loads, misfits refused after it loads and before any work,
exit codes 0 / 1 / 2, every file of a run or none; and its files agree with each other."""

from __future__ import annotations

import errno
import json

import pandas as pd
import pytest
import torch

import interp.pages.html as html
from interp.cli import main
from tests.cli.test_cli_contract import no_loading, old_state, staging_left  # noqa: F401
from tests.transcoder_folders import make_transcoder_folder

FILES = ["edges.csv", "graph.json", "nodes.csv", "report.html", "summary.json"]


@pytest.fixture(scope="module")
def tc_dir(gpt2_model, tmp_path_factory):
    return make_transcoder_folder(tmp_path_factory.mktemp("tc") / "tc", gpt2_model, d_tc=32)


def argv(gpt2_dir, tc_dir, out, *extra) -> list[str]:
    given = [] if any(a in extra for a in ("--prompt", "--tokens")) else ["--prompt", "a b c a b"]
    return ["graph", "--model", str(gpt2_dir), "--transcoders", str(tc_dir), "--out", str(out),
            *given, *extra]  # fmt: skip


@pytest.mark.slow
def test_a_graph_writes_every_file_and_they_agree(gpt2_dir, tc_dir, tmp_path, capsys):
    out = tmp_path / "out"
    before = old_state(out, FILES)
    assert main(argv(gpt2_dir, tc_dir, out)) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*FILES, "notes.txt"])
    assert (out / "notes.txt").read_text() == before["notes.txt"]
    printed = capsys.readouterr().out
    assert all(f"wrote {out / n}" in printed for n in FILES)
    assert staging_left(tmp_path) == []
    data = json.loads((out / "graph.json").read_text())
    nodes = pd.read_csv(out / "nodes.csv")
    edges = pd.read_csv(out / "edges.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert list(nodes["node_id"]) == [n["node_id"] for n in data["nodes"]]
    assert len(edges) == len(data["links"]) == summary["edges_kept"]
    assert summary["nodes"]["kept"] == len(nodes)
    assert edges["weight"].tolist() == pytest.approx([ln["weight"] for ln in data["links"]])
    assert data["metadata"]["prompt"] == "a b c a b" and data["metadata"]["node_threshold"] == 0.8
    assert set(summary["scores"]) == {"replacement", "completeness"}
    assert summary["seconds"]["total"] >= summary["seconds"]["graph"] > 0
    assert (out / "report.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.slow
def test_token_ids_are_taken_as_they_are(gpt2_dir, tc_dir, tmp_path):
    out = tmp_path / "out"
    assert main(argv(gpt2_dir, tc_dir, out, "--tokens", "5,9,0,7", "--max-feature-nodes", "4")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens"] == [5, 9, 0, 7]  # a 0 (BOS/pad) mid-prompt is a token like others
    assert summary["nodes_by_kind"]["all"]["feature"] <= 4
    assert summary["max_feature_nodes"] == 4
    assert summary["ranking"]["mode"] == "dense" and summary["ranking"]["rounds"] is None


@pytest.mark.slow
def test_ranking_sparse_is_reported(gpt2_dir, tc_dir, tmp_path):
    out = tmp_path / "out"
    extra = ["--tokens", "5,9,0,7,3,8", "--max-feature-nodes", "4", "--ranking", "sparse"]
    assert main(argv(gpt2_dir, tc_dir, out, *extra)) == 0
    ranking = json.loads((out / "summary.json").read_text())["ranking"]
    assert ranking["mode"] == "sparse" and ranking["entries"] >= 1
    assert 0 <= ranking["certified"] <= ranking["rounds"] >= 1


REFUSED = [
    (["--node-threshold", "0"], "must be above 0 and at most 1, got 0.0"),
    (["--edge-threshold", "1.5"], "must be above 0 and at most 1, got 1.5"),
    (["--tokens", "1,x"], "expected comma-separated token ids"),
    (["--prompt", "a", "--tokens", "1,2"], "not allowed with argument"),
    (["--max-feature-nodes", "0"], "must be at least 1"),
    (["--ranking", "top"], "invalid choice: 'top'"),
]


@pytest.mark.usefixtures("no_loading")
@pytest.mark.parametrize(("extra", "message"), REFUSED)
def test_bad_options_exit_2_before_loading(extra, message, tc_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv("tiny-induction", tc_dir, tmp_path / "o", *extra))
    assert info.value.code == 2 and message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "transcoders", "message"),
    [
        (["--prompt", " "], None, "--prompt is empty"),
        ([], "no-such-set", "--transcoders no-such-set: no such folder or bundled"),
        (["--text", "missing.txt"], None, "--text missing.txt: cannot read it"),
        (["--ranking", "sparse"], None, "--ranking sparse ranks features under a cap: pass"),
    ],
)
@pytest.mark.usefixtures("no_loading")
def test_empty_prompt_and_missing_files_exit_2_before_loading(
    extra, transcoders, message, tc_dir, tmp_path, capsys
):
    code = main(argv("tiny-induction", transcoders or tc_dir, tmp_path / "o", *extra))
    assert code == 2 and message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_transcoders_that_do_not_fit_exit_2_before_any_work(gpt2_dir, tmp_path, capsys):
    from interp.transcoders.transcoder import TranscoderSet

    narrow = TranscoderSet(
        [torch.zeros(8, 16)] * 2, [torch.zeros(8)] * 2, [torch.zeros(8, 16)] * 2,
        [torch.zeros(16)] * 2, name="narrow",
    )  # fmt: skip
    narrow.save(tmp_path / "narrow")
    assert main(argv(gpt2_dir, tmp_path / "narrow", tmp_path / "o")) == 2
    assert "d_model is 64" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prompt", " ".join(["a"] * 80)], "context is 64"),
        (["--tokens", "1,99999"], "--tokens 99999: at most"),
        (["--tokens", "3"], "at least 2 tokens"),
    ],
)
def test_prompts_that_cannot_work_exit_2_after_loading(
    extra, message, gpt2_dir, tc_dir, tmp_path, capsys
):
    assert main(argv(gpt2_dir, tc_dir, tmp_path / "o", *extra)) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_failed_write_keeps_the_old_folder(gpt2_dir, tc_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    before = old_state(out, FILES)
    real = html.write_text_atomic

    def fails_on_last(path, text):
        if path.name == FILES[-1]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, text)

    monkeypatch.setattr(html, "write_text_atomic", fails_on_last)
    assert main(argv(gpt2_dir, tc_dir, out)) == 1
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    assert staging_left(tmp_path) == []
    assert f"could not write {out / FILES[-1]}: no space left" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("model", [None, "tiny-induction", "bundled-folder"])
def test_the_bundled_model_needs_no_transcoders(model, tmp_path, capsys):
    from interp.models.sources import BUNDLED_DIR

    given = {None: [], "tiny-induction": ["--model", "tiny-induction"],
             "bundled-folder": ["--model", str(BUNDLED_DIR / "tiny-induction")]}[model]  # fmt: skip
    out = tmp_path / "g"
    assert main(["graph", *given, "--prompt", "a b c a b", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["transcoders"] == "tiny-induction-transcoders"
    assert summary["nodes"]["kept"] < summary["nodes"]["all"]  # pruned
    assert summary["reading"][0].startswith("The model predicts")
    assert "<h2>What the graph says</h2>" in (out / "report.html").read_text(encoding="utf-8")
    assert "wrote" in capsys.readouterr().out


@pytest.mark.usefixtures("no_loading")
def test_another_model_without_transcoders_exits_2_before_loading(gpt2_dir, tmp_path, capsys):
    code = main(
        ["graph", "--model", str(gpt2_dir), "--prompt", "a b", "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"--transcoders is required for {gpt2_dir}: " in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_saelens_transcoder_folders_are_taken(gpt2_dir, tmp_path):
    from tests.transcoders.test_transcoders_saelens import write_set

    folder = write_set(tmp_path / "saelens", "skip_transcoder")
    assert main(argv(gpt2_dir, folder, tmp_path / "o")) == 0
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["nodes"]["all"] > 0
