"""`interp discover`, its `--shard` and `interp merge`: the files hold exactly what the library
computes (edge_scores, discover_circuit, evaluate_circuit, acdc) on the same task; 3 shards
merged equal the whole run; the report keeps hostile task text as text; bad option mixes are
refused before any model loads and write nothing."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import interp.models.loading
from interp import Task
from interp.cli import main
from interp.discovery import discover_circuit, edge_scores, evaluate_circuit
from interp.discovery.acdc import acdc
from interp.tasks import induction
from tests.pages.test_html import ALLOWED_TAGS, HOSTILE, executable, parse

FILES = ["circuit.json", "curve.csv", "edges.csv", "report.html", "summary.json"]
EDGE_COLUMNS = ["edge", "source", "target", "score", "in_circuit"]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory, bundled_model):
    """Induction rows whose corrupted prompt differs only at the earlier copy of the last
    token (docs/discovery.md's copy task): the key path of the induction heads shows."""
    rows = induction(bundled_model, 9, seed=1, seq_len=5).to_records()
    for row in rows:
        a = row["positions"]["A"]
        row["corrupted"] = row["clean"][:a] + row["corrupted"][a : a + 1] + row["clean"][a + 1 :]
    path = tmp_path_factory.mktemp("task") / "copy.jsonl"
    Task.from_records(rows).to_jsonl(path)
    return path


@pytest.fixture(scope="module")
def task(task_file):
    return Task.from_jsonl(task_file)


def discover(tmp_path_factory, name: str, *argv: str):
    out = tmp_path_factory.mktemp(name) / "out"
    assert main(["discover", *argv, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def eap_ig(task_file, tmp_path_factory):
    argv = ["--task", str(task_file), "--method", "eap-ig", "--top-n", "12", "--ig-steps", "3"]
    return discover(tmp_path_factory, "eapig", *argv)


@pytest.fixture(scope="module")
def exact(task_file, tmp_path_factory):
    argv = ["--task", str(task_file), "--method", "exact", "--threshold", "0.05"]
    return discover(tmp_path_factory, "exact", *argv)


@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(interp.models.loading, "load_model", refuse)


def read_json(folder, name: str) -> dict:
    return json.loads((folder / name).read_text(encoding="utf-8"))


def test_files_and_columns_are_as_named(eap_ig):
    assert sorted(p.name for p in eap_ig.iterdir()) == FILES
    assert list(pd.read_csv(eap_ig / "edges.csv").columns) == EDGE_COLUMNS
    assert list(pd.read_csv(eap_ig / "curve.csv").columns) == [
        "fraction",
        "n_edges",
        "faithfulness",
    ]
    circuit = read_json(eap_ig, "circuit.json")
    for key in ("method", "parameters", "edges", "faithfulness", "task"):
        assert key in circuit
    assert circuit["parameters"] == {"metric": "logit_diff", "ig_steps": 3, "top_n": 12}
    assert circuit["task"]["n_rows"] == 9 and circuit["n_total"] == 110


def test_the_files_equal_the_library(eap_ig, task, bundled_model):
    circuit = discover_circuit(bundled_model, task, "eap-ig", top_n=12, ig_steps=3)
    result = evaluate_circuit(bundled_model, task, circuit)
    edges = pd.read_csv(eap_ig / "edges.csv")
    assert list(edges["edge"]) == list(circuit.scores["edge"])
    assert np.allclose(edges["score"], circuit.scores["score"], atol=1e-6, rtol=0)
    assert list(edges["in_circuit"]) == list(circuit.scores["in_circuit"])
    written = read_json(eap_ig, "circuit.json")
    assert written["edges"] == list(circuit.edges) and len(circuit.edges) == 12
    assert written["faithfulness"] == pytest.approx(result.faithfulness, abs=1e-6)
    assert written["cpr"] == pytest.approx(result.cpr, abs=1e-6)
    assert written["cmd"] == pytest.approx(result.cmd, abs=1e-6)
    curve = pd.read_csv(eap_ig / "curve.csv")
    assert list(curve["n_edges"]) == list(result.curve["n_edges"])
    assert np.allclose(curve["fraction"], result.curve["fraction"], atol=0, rtol=0)
    assert np.allclose(curve["faithfulness"], result.curve["faithfulness"], atol=1e-6, rtol=0)
    summary = read_json(eap_ig, "summary.json")
    assert summary["faithfulness"] == written["faithfulness"] and summary["evaluated"]


def test_exact_with_a_threshold_keeps_every_edge_above_it(exact, task, bundled_model):
    scores = edge_scores(bundled_model, task, "exact")
    edges = pd.read_csv(exact / "edges.csv")
    assert np.allclose(edges["score"], scores["score"], atol=1e-6, rtol=0)
    assert list(edges["in_circuit"]) == list(scores["score"].abs() >= 0.05)
    written = read_json(exact, "circuit.json")
    result = evaluate_circuit(bundled_model, task, written["edges"], scores=scores)
    assert written["faithfulness"] == pytest.approx(result.faithfulness, abs=1e-6)


def test_acdc_equals_the_library(task_file, task, tmp_path_factory, bundled_model):
    argv = ["--task", str(task_file), "--method", "acdc", "--threshold", "0.02"]
    out = discover(tmp_path_factory, "acdc", *argv, "--ablation", "mean")
    frame = acdc(bundled_model, task, threshold=0.02)
    edges = pd.read_csv(out / "edges.csv")
    assert list(edges["in_circuit"]) == list(frame["in_circuit"].astype(bool))
    assert np.allclose(edges["score"], frame["score"], atol=1e-6, rtol=0)
    written = read_json(out, "circuit.json")
    kept = list(frame.loc[frame["in_circuit"].astype(bool), "edge"])
    result = evaluate_circuit(bundled_model, task, kept, ablation="mean", scores=frame)
    assert written["edges"] == kept and written["ablation"] == "mean"
    assert written["faithfulness"] == pytest.approx(result.faithfulness, abs=1e-6)
    assert written["parameters"] == {"metric": "logit_diff", "threshold": 0.02}


def test_three_shards_merge_into_the_whole_run(exact, task_file, tmp_path, capsys):
    folders = []
    argv = ["discover", "--task", str(task_file), "--method", "exact", "--threshold", "0.05"]
    for i in range(3):
        folders.append(tmp_path / f"shard{i}")
        assert main([*argv, "--shard", f"{i}/3", "--out", str(folders[-1])]) == 0
        assert [p.name for p in folders[-1].iterdir()] == ["partial.json"]
    merged = tmp_path / "merged"
    assert main(["merge", *map(str, folders[::-1]), "--out", str(merged)]) == 0
    assert sorted(p.name for p in merged.iterdir()) == sorted(set(FILES) - {"curve.csv"})
    whole, parts = pd.read_csv(exact / "edges.csv"), pd.read_csv(merged / "edges.csv")
    assert list(whole["edge"]) == list(parts["edge"])
    assert np.allclose(whole["score"], parts["score"], atol=1e-6, rtol=0)
    assert list(whole["in_circuit"]) == list(parts["in_circuit"])
    one, three = read_json(exact, "circuit.json"), read_json(merged, "circuit.json")
    assert one["edges"] == three["edges"] and one["evaluated"] and not three["evaluated"]
    assert three["faithfulness"] is None and three["task"]["shards"] == 3
    assert "Not evaluated" in (merged / "report.html").read_text(encoding="utf-8")
    # --evaluate loads the shards' model and task: then the files are the whole run's
    evaluated = tmp_path / "evaluated"
    assert main(["merge", *map(str, folders), "--evaluate", "--out", str(evaluated)]) == 0
    assert sorted(p.name for p in evaluated.iterdir()) == FILES
    four = read_json(evaluated, "circuit.json")
    assert four["edges"] == one["edges"] and four["evaluated"]
    for key in ("faithfulness", "cpr", "cmd"):
        assert four[key] == pytest.approx(one[key], abs=1e-6), key
    curves = [pd.read_csv(d / "curve.csv") for d in (exact, evaluated)]
    assert np.allclose(curves[0]["faithfulness"], curves[1]["faithfulness"], atol=1e-6, rtol=0)
    # a shard missing, or shards of other settings, are refused and nothing is written
    assert main(["merge", *map(str, folders[:2]), "--out", str(tmp_path / "never")]) == 2
    assert "shard(s) 2 missing" in capsys.readouterr().err
    other = tmp_path / "other"
    argv = ["discover", "--task", str(task_file), "--method", "exact", "--top-n", "5"]
    assert main([*argv, "--shard", "2/3", "--out", str(other)]) == 0
    assert main(["merge", *map(str, folders[:2]), str(other), "--out", str(tmp_path / "n")]) == 2
    assert "other --top-n" in capsys.readouterr().err
    assert not (tmp_path / "never").exists() and not (tmp_path / "n").exists()


def test_evaluate_refuses_a_changed_task_file_before_loading(
    tmp_path, capsys, monkeypatch, bundled_model
):
    path = tmp_path / "t.jsonl"
    induction(bundled_model, 4, seed=0, seq_len=5).to_jsonl(path)
    shard = tmp_path / "s0"
    argv = ["discover", "--task", str(path), "--method", "eap", "--top-n", "3"]
    assert main([*argv, "--shard", "0/1", "--out", str(shard)]) == 0
    induction(bundled_model, 4, seed=1, seq_len=5).to_jsonl(path)  # other rows, same path

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the task was checked")

    monkeypatch.setattr(interp.models.loading, "load_model", refuse)
    code = main(["merge", str(shard), "--evaluate", "--out", str(tmp_path / "never")])
    assert code == 2 and "is not the one the shards scored" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_the_report_keeps_hostile_task_text_as_text(tmp_path, bundled_model):
    rows = [
        {"clean": f"{text} a b a", "corrupted": f"{text} c d c", "answer": " b", "wrong": " d"}
        for text in (HOSTILE[0], HOSTILE[1])
    ]
    path = tmp_path / "hostile.jsonl"
    Task.from_records(rows).to_jsonl(path)
    out = tmp_path / "out"
    argv = ["discover", "--task", str(path), "--method", "eap", "--top-n", "5"]
    assert main([*argv, "--out", str(out)]) == 0
    parser = parse((out / "report.html").read_text(encoding="utf-8"))
    assert {tag for tag, _ in parser.tags} <= ALLOWED_TAGS
    assert not [(t, a) for t, a in parser.tags for name in a if name.startswith("on")]
    assert {rows[0]["clean"], rows[1]["corrupted"]} <= set(parser.text["td"])
    from interp.pages.html import _BOOTSTRAP, plotly_js

    assert executable(parser) == [plotly_js(partial=True), _BOOTSTRAP]
    from tests.pages.test_pages import figures

    drawn = figures(out / "report.html")
    assert len(drawn) == 2 and all(f["layout"]["title"]["text"].strip() for f in drawn)


def test_the_pages_render_offline_in_a_browser(eap_ig, tmp_path, browser, bundled_model):
    """The whole run's page and the hostile one draw every figure, make no request, raise no
    error (CSP included) and run nothing from the task's text."""
    from tests.test_browser import assert_clean, open_page

    rows = [{"clean": f"{HOSTILE[0]} a b a", "corrupted": f"{HOSTILE[0]} c d c", "answer": " b"}]
    path = tmp_path / "hostile.jsonl"
    Task.from_records(rows).to_jsonl(path)
    argv = ["discover", "--task", str(path), "--method", "eap", "--top-n", "4"]
    assert main([*argv, "--out", str(tmp_path / "hostile")]) == 0
    for name, page in (("discover", eap_ig), ("discover-hostile", tmp_path / "hostile")):
        result = open_page(browser, page / "report.html", name)
        assert_clean(result)
        assert "L1H0" in result.values["svg_text"]  # the graph's node labels are drawn
    assert rows[0]["clean"] in result.values["cells"]


REFUSED = [
    (["--method", "acdc", "--top-n", "3"], "pass --threshold T (and no --top-n)"),
    (["--method", "acdc", "--threshold", "0.1", "--shard", "0/2"], "acdc has no shards"),
    (["--method", "eap"], "exactly one of --top-n N or --threshold T"),
    (["--method", "eap", "--top-n", "3", "--threshold", "0.1"], "exactly one of"),
    (["--method", "eap", "--top-n", "3", "--ig-steps", "4"], "--ig-steps is for --method eap-ig"),
    (["--method", "exact", "--top-n", "3", "--n", "4"], "--n are for a generated task"),
    (["--method", "exact", "--top-n", "3", "--shard", "9/10"], "--shard 9/10 has no rows"),
    (["--method", "exact", "--threshold", "-1"], "must be a finite number >= 0"),
    (["--method", "bogus", "--top-n", "3"], "invalid choice"),
    (["--method", "eap", "--top-n", "0"], "must be at least 1"),
]


@pytest.mark.parametrize(("extra", "message"), REFUSED)
def test_bad_options_are_refused_before_loading(
    extra, message, task_file, tmp_path, capsys, no_loading
):
    out = tmp_path / "out"
    try:
        code = main(["discover", "--task", str(task_file), *extra, "--out", str(out)])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1]
    if "invalid choice" not in message and "must be" not in message:  # argparse adds usage
        assert len(err) == 1 and err[0].startswith("interp discover: error:")
    assert not out.exists()


def test_a_bad_task_file_is_refused_before_loading(tmp_path, capsys, no_loading):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"clean": "a", "corrupted": "b", "answer": "c"}\n{"clean": \n')
    out = tmp_path / "out"
    assert (
        main(
            ["discover", "--task", str(path), "--method", "eap", "--top-n", "2", "--out", str(out)]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--task" in err[0] and "line 2: malformed JSON" in err[0]
    assert not out.exists()


def test_top_n_past_the_graph_is_refused_before_any_work(task_file, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["discover", "--task", str(task_file), "--method", "eap", "--top-n", "111"]
    assert main([*argv, "--out", str(out)]) == 2
    assert "--top-n 111: at most 110 (the graph has 110 edges)" in capsys.readouterr().err
    assert not out.exists()


def test_a_generated_task(tmp_path):
    out = tmp_path / "out"
    argv = ["discover", "--task", "induction", "--n", "4", "--seed", "3", "--method", "eap"]
    assert main([*argv, "--top-n", "10", "--out", str(out)]) == 0
    task = read_json(out, "circuit.json")["task"]
    assert task["generated"] == {"n": 4, "seed": 3} and task["n_rows"] == 4


def test_the_command_lines_lists_are_the_librarys():
    from interp.cli import discover as command
    from interp.discovery import ABLATIONS, METHODS
    from interp.discovery.runs import METRICS

    assert command.METHODS == METHODS and command.ABLATIONS == ABLATIONS
    assert command.TASK_METRICS == METRICS


def test_the_graph_tells_q_k_v_apart_and_widens_with_the_score():
    """Grouped-query attention (4 query heads share 2 key/value heads): every circuit edge has
    its own hover point with its score, ends at its reader's port (q, k and v at different
    places, coloured by kind), and is wider the larger its |score|."""
    from interp.discovery import EdgeGraph
    from interp.pages.discovery_plots import READER_COLOURS, circuit_graph

    graph = EdgeGraph(n_layers=2, n_heads=4, n_kv_heads=2)
    names = list(graph.edge_names)
    kept = ["L0H1->L1H3.q", "L0H1->L1H1.k", "L0H1->L1H1.v", "L1H2->logits", "embed->MLP0"]
    scores = [0.9, -0.6, 0.3, 0.05, 0.01]
    frame = pd.DataFrame(
        {
            "edge": names,
            "source": [e.split("->")[0] for e in names],
            "target": [e.split("->")[1] for e in names],
            "score": [scores[kept.index(e)] if e in kept else 0.0 for e in names],
            "in_circuit": [e in kept for e in names],
        }
    )
    figure = circuit_graph(frame)
    lines = [t for t in figure.data if t.mode == "lines"]
    assert len(lines) == len(kept)
    widths = [t.line.width for t in lines]  # drawn largest |score| first
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]
    assert [t.line.dash for t in lines[:2]] == ["solid", "dot"]  # -0.6 is dotted
    ends = {(t.x[1], t.y[1]) for t in lines[:3]}
    assert len(ends) == 3  # q, k and v of the same layer end at different ports
    assert [t.line.color for t in lines[:3]] == [READER_COLOURS[k] for k in ("q", "k", "v")]
    hover = [h for t in figure.data if t.mode == "markers" and t.hovertext for h in t.hovertext]
    for edge, score in zip(kept, scores, strict=True):
        assert f"{edge.replace('>', '&gt;')}<br>score {score:.4g}" in hover


def test_a_generator_that_cannot_run_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["discover", "--task", "ioi", "--method", "eap", "--top-n", "3", "--out", str(out)]
    assert main(argv) == 2  # the bundled tokenizer keeps no first name whole
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(err) == 1 and "--task ioi: ioi needs" in err[0]
    assert "interp task ioi --names" in err[0] and not out.exists()


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_shard_sums_merge_into_edge_scores(method, task, bundled_model):
    from interp.discovery.shards import discovery_partial_sums, merge_discovery_sums

    whole = edge_scores(bundled_model, task, method, ig_steps=3)
    parts = [
        discovery_partial_sums(bundled_model, task, method, shard=(i, 2), ig_steps=3)
        for i in (1, 0)
    ]
    merged = merge_discovery_sums(parts)
    pd.testing.assert_frame_equal(
        merged[["edge", "source", "target"]], whole[["edge", "source", "target"]]
    )
    assert np.allclose(merged["score"], whole["score"], atol=1e-6, rtol=0)
    for key in ("clean_metric", "corrupted_metric"):
        assert merged.attrs[key] == pytest.approx(whole.attrs[key], abs=1e-9)
    with pytest.raises(ValueError, match="has no shards"):
        discovery_partial_sums(bundled_model, task, "acdc")
