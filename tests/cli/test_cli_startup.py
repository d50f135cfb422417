"""`interp` starts fast: help and refused command lines import no heavy library.

torch, TransformerLens, transformers, pandas and plotly cost seconds to import, so the
command line imports them (and the analysis modules that do) only when a command runs its
work. Checked without timing: a fresh interpreter runs each command line through
``interp.cli.main`` and reports which of those modules were imported by then.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from interp.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformer_lens", "transformers", "pandas", "plotly", "numpy")

# runs each command line in turn; after each, the heavy modules (and interp modules outside
# the command line, but the torch-free interp.foundation.sizes and interp.models.sources it
# checks with) imported
PROBE = """
import contextlib, io, json, sys
from interp.cli import main

heavy = tuple(json.loads(sys.argv[1]))
allowed = ("interp.cli", "interp.foundation.sizes", "interp.models.sources")  # torch-free
packages = ("interp.foundation", "interp.models")  # their __init__: a docstring, no import
def loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] in heavy
                  or (m.startswith("interp.") and not m.startswith(allowed)
                      and m not in packages))
report = []
for argv in json.loads(sys.argv[2]):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    report.append({"argv": argv, "code": code, "err": err.getvalue(), "loaded": loaded()})
print(json.dumps(report))
"""


def probe(command_lines: list[list[str]]) -> list[dict]:
    """Run the command lines in one fresh interpreter, in order."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HEAVY), json.dumps(command_lines)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def assert_light(report: list[dict], expected_code: int) -> None:
    for case in report:
        assert case["code"] == expected_code, case
        # the first command line that imports one is named: the imports stay afterwards
        heavy = sorted({m if m.startswith("interp.") else m.split(".")[0] for m in case["loaded"]})
        assert heavy == [], f"{case['argv']} imported {heavy}"


@pytest.fixture
def places(tmp_path) -> dict[str, str]:
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "not-a-model").mkdir()
    return {
        "out": str(tmp_path / "out"),
        "file": str(tmp_path / "a-file"),
        "under_file": str(tmp_path / "a-file" / "out"),
        "page": str(tmp_path / "p.html"),
        "missing": str(tmp_path / "no-such-model"),
        "empty": str(tmp_path / "not-a-model"),
    }


def test_help_imports_nothing_heavy():
    lines = [["--help"], *([name, "--help"] for name in COMMANDS)]
    assert_light(probe(lines), 0)


def test_refused_command_lines_import_nothing_heavy(places):
    out, page = places["out"], places["page"]
    patch = ["patch", "--clean", "a b", "--corrupted", "a c", "--answer", " b"]
    lines = [
        [],  # no command
        ["nonsense"],
        ["induction", "--top-k", "5"],
        ["induction", "--seq-lens", "0", "--out", out],
        ["induction", "--batch-size", "x"],
        ["induction", "--max-bytes", "5XB"],
        ["induction", "--max-bytes", "0"],
        ["induction", "--max-memory", "lots", "--device-map", "auto"],
        ["induction", "--max-memory", "1GiB", "--out", out],  # needs --device-map
        ["induction", "--no-ablation", "--ablate-top", "2", "--out", out],
        ["induction", "--model", ""],
        ["induction", "--out", places["file"]],
        ["circuits", "--kinds", "QX", "--out", out],
        ["circuits", "--out", places["under_file"]],
        ["attribute", "--prompt", "", "--answer", " c", "--out", out],
        ["attribute", "--prompt", "a", "--answer", " c", "--wrong", " c", "--out", out],
        ["attribute", "--prompt", "a", "--answer", " c", "--top-k", "0", "--out", out],
        ["attention", "--prompt", "a", "--out", places["file"]],
        ["attention", "--prompt", "a", "--out", str(Path(out) / "page.txt")],
        ["attention", "--prompt", "", "--out", page],
        ["attention", "--prompt", "a", "--layers", "-1", "--out", page],
        [*patch, "--sites", "everything", "--out", out],
        [*patch, "--method", "guess", "--out", out],
        [*patch, "--wrong", "", "--out", out],
        ["patch", "--clean", "", "--corrupted", "a", "--answer", " b", "--out", out],
        ["models", "--no-such-option"],  # -v after a command is taken (issue 40)
        ["graph", "--transcoders", "tiny-induction-transcoders", "--prompt", "", "--out", out],
        ["graph", "--transcoders", "no-such-set", "--prompt", "a", "--out", out],
        ["graph", "--transcoders", "x", "--prompt", "a", "--node-threshold", "2", "--out", out],
    ]
    assert_light(probe(lines), 2)
    assert not Path(out).exists()


def test_a_model_that_does_not_exist_fails_before_the_heavy_imports(places):
    """Exit code 2 (refused before any work), with the loader's own message."""
    lines = [
        [name, "--model", model, "--out", places["out"], *extra]
        for model in (places["missing"], places["empty"])
        for name, extra in (
            ("induction", []),
            ("circuits", []),
            ("attribute", ["--prompt", "a", "--answer", " b"]),
            ("patch", ["--clean", "a", "--corrupted", "b", "--answer", " c"]),
        )
    ]
    lines.append(
        ["attention", "--model", places["missing"], "--prompt", "a", "--out", places["page"]]
    )
    report = probe(lines)
    assert_light(report, 2)
    for case in report:
        last = case["err"].strip().splitlines()[-1]
        assert last.startswith(f"interp {case['argv'][0]}: error: "), case
        assert "no such directory" in last or "has no config.json" in last, last


# -- the command line's torch-free copies say what the library says ---------------------------

SIZES = [
    "1",
    "1024",
    "500MB",
    "1GiB",
    "1.5 GB",
    " 2 kib ",
    ".5MB",
    "1.",
    "0",
    "0.1",
    "0MB",
    "-1",
    "",
    "5XB",
    "1e9",
    "GB",
    "1 2MB",
    "2TiB",
]


@pytest.mark.parametrize("text", SIZES)
def test_memory_size_accepts_what_parse_size_reads(text):
    import argparse

    from interp.cli.options import memory_size
    from interp.engine import parse_size

    try:
        parse_size(text)
    except ValueError as exc:
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            memory_size(text)
        assert str(refused.value) == str(exc)
    else:
        assert memory_size(text) == text


def test_patch_choices_are_the_library_s():
    from interp.cli import patch
    from interp.interventions import patching

    assert patch.GRIDS == tuple(patching.GRIDS)
    assert patch.METHODS == patching.METHODS
    assert patch.DIRECTIONS == patching.DIRECTIONS


def test_bundled_models_are_the_loader_s():
    import interp.models.loading as loading
    from interp.cli import sources

    assert sources.BUNDLED_DIR == loading.BUNDLED_DIR
    assert sources.bundled_models() == loading.bundled_models() != []


def _loader_refusal(name: str | os.PathLike) -> str | None:
    """The loader's message for ``name`` before it imports TransformerLens, or None."""
    import interp.models.loading as loading

    try:
        kind, location = loading.resolve_source(name)
        if kind != "hub":
            loading.check_checkpoint_dir(Path(location), allow_pickle=False)
    except loading.ModelLoadError as exc:
        return str(exc)
    return None


def test_model_sources_are_refused_as_the_loader_refuses_them(tmp_path):
    from interp.cli.output import UsageError
    from interp.cli.sources import check_source

    def folder(name: str, *files: str) -> str:
        (tmp_path / name).mkdir()
        for file in files:
            (tmp_path / name / file).write_text("")
        return str(tmp_path / name)

    (tmp_path / "a-file").write_text("")
    names = [
        str(tmp_path / "missing"),
        "./missing",
        "~/interp-missing-model",
        "a/b/c",
        str(tmp_path / "a-file"),
        folder("empty"),
        folder("config-only", "config.json"),
        folder("pickled", "config.json", "pytorch_model.bin"),
        folder("no-tokenizer", "config.json", "model.safetensors"),
        folder("complete", "config.json", "model.safetensors", "vocab.json", "merges.txt"),
        folder("sharded", "config.json", "model.safetensors.index.json", "tokenizer.json"),
        "gpt2",
        "org/model",
        "tiny-induction",
        tmp_path / "missing",
        Path("gpt2"),
    ]
    for name in names:
        expected = _loader_refusal(name)
        if expected is None:
            check_source(name)
        else:
            with pytest.raises(UsageError) as refused:  # exit 2, before any work
                check_source(name)
            assert str(refused.value) == expected, name
