"""``interp graph --attention``: edges.csv and graph.json carry each kept edge's head loadings
(a ``heads`` field circuit-tracer's viewer ignores), summing to the edge's weight; without the
flag the files are as before."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from interp.cli import main
from tests.transcoder_folders import make_transcoder_folder

RTOL = 1e-5  # float32 loadings of a 2-layer model: a few terms each, rounded at 1e-7


@pytest.fixture(scope="module")
def tc_dir(gpt2_model, tmp_path_factory):
    return make_transcoder_folder(tmp_path_factory.mktemp("tc") / "tc", gpt2_model, d_tc=32)


@pytest.mark.slow
def test_attention_adds_head_loadings_to_the_edges(gpt2_dir, tc_dir, tmp_path):
    out = tmp_path / "out"
    argv = ["graph", "--model", str(gpt2_dir), "--transcoders", str(tc_dir), "--out", str(out),
            "--prompt", "a b c a b", "--attention"]  # fmt: skip
    assert main(argv) == 0
    edges = pd.read_csv(out / "edges.csv", keep_default_na=False)
    data = json.loads((out / "graph.json").read_text())
    nodes = pd.read_csv(out / "nodes.csv").set_index("node_id")
    scale = float(edges.weight.abs().max())
    split = 0
    for row, link in zip(edges.itertuples(), data["links"], strict=True):
        assert (row.source, row.target) == (link["source"], link["target"])
        if nodes.kind[row.source] == "logit":
            assert link["heads"] == [] and row.heads == ""
            continue
        weights = [w for _, _, w in link["heads"]]
        assert sum(weights) == pytest.approx(row.weight, abs=RTOL * scale)
        parsed = [float(part.split(":")[1]) for part in row.heads.split()]
        assert parsed == pytest.approx(weights, rel=1e-5)
        crosses = nodes.pos[row.source] != nodes.pos[row.target]
        assert not (crosses and any(layer == -1 for layer, _, _ in link["heads"]))
        split += crosses
    assert split > 0  # some edges cross positions: carried by heads alone
    plain = tmp_path / "plain"
    assert main([*argv[:6], str(plain), *argv[7:-1]]) == 0
    assert "heads" not in pd.read_csv(plain / "edges.csv").columns
