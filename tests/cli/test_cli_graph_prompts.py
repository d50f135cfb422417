"""``interp graph --prompts FILE``: a folder per line of FILE, each holding what a one-prompt
run writes for that prompt, and index.json listing them; an empty file or a blank line is
refused before the model loads (exit 2)."""

from __future__ import annotations

import json

import pytest

from interp.cli import main
from tests.cli.test_cli_contract import no_loading, staging_left  # noqa: F401
from tests.cli.test_cli_graph import FILES
from tests.transcoder_folders import make_transcoder_folder

PROMPTS = ["a b c a b", "the cat sat on the mat", "x y x"]


@pytest.fixture(scope="module")
def tc_dir(gpt2_model, tmp_path_factory):
    return make_transcoder_folder(tmp_path_factory.mktemp("tc") / "tc", gpt2_model, d_tc=32)


def argv(model, tc_dir, out, *given) -> list[str]:
    return ["graph", "--model", str(model), "--transcoders", str(tc_dir), "--out", str(out),
            *given]  # fmt: skip


def _graph(folder):
    data = json.loads((folder / "graph.json").read_text())
    data["metadata"].pop("slug")
    return data


@pytest.mark.slow
def test_each_prompt_gets_the_folder_a_run_of_it_alone_writes(gpt2_dir, tc_dir, tmp_path, capsys):
    listing = tmp_path / "prompts.txt"
    listing.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    (out / "prompt_009").mkdir()  # an earlier run's: replaced by this run's folders
    (out / "notes.txt").write_text("the user's own file")
    assert main(argv(gpt2_dir, tc_dir, out, "--prompts", str(listing))) == 0
    names = ["prompt_000", "prompt_001", "prompt_002"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*names, "index.json", "notes.txt"])
    assert staging_left(tmp_path) == []
    index = json.loads((out / "index.json").read_text())
    assert [e["folder"] for e in index["prompts"]] == names
    assert [e["prompt"] for e in index["prompts"]] == PROMPTS
    printed = capsys.readouterr().out
    assert f"wrote {out / 'index.json'}" in printed
    for name, prompt, entry in zip(names, PROMPTS, index["prompts"], strict=True):
        assert sorted(p.name for p in (out / name).iterdir()) == sorted(FILES)
        alone = tmp_path / f"alone-{name}"
        assert main(argv(gpt2_dir, tc_dir, alone, "--prompt", prompt)) == 0
        assert _graph(out / name) == _graph(alone)
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["prompt"] == prompt and entry["tokens"] == len(summary["tokens"])
        assert entry["scores"] == summary["scores"]
        assert (out / name / "edges.csv").read_text() == (alone / "edges.csv").read_text()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty; write one prompt a line"),
        ("a b\n\nc d\n", "line 2 is blank"),
        ("a b\n   \nc\n\t\n", "lines 2, 4 are blank"),
        (b"\xff\xfe", "cannot read it as UTF-8"),
    ],
)
@pytest.mark.usefixtures("no_loading")
def test_an_empty_file_or_a_blank_line_exits_2_before_loading(
    text, message, tc_dir, tmp_path, capsys
):
    listing = tmp_path / "prompts.txt"
    (listing.write_bytes if isinstance(text, bytes) else listing.write_text)(text)
    code = main(argv("tiny-induction", tc_dir, tmp_path / "o", "--prompts", str(listing)))
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.usefixtures("no_loading")
def test_prompts_and_prompt_together_are_refused(tc_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv("tiny-induction", tc_dir, tmp_path / "o", "--prompt", "a", "--prompts", "f"))
    assert info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_a_prompt_too_long_exits_2_before_any_graph(gpt2_dir, tc_dir, tmp_path, capsys):
    listing = tmp_path / "prompts.txt"
    listing.write_text("a b c\n" + " ".join(["a"] * 80) + "\n")
    assert main(argv(gpt2_dir, tc_dir, tmp_path / "o", "--prompts", str(listing))) == 2
    assert "prompt 1: prompt has 81 tokens" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
