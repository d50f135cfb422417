"""The task graph (interp.graphs.task_graph) against the per-prompt graphs it averages, keyed
here independently of the module: identical rows give each edge exactly its one-prompt weight
with sem 0; distinct rows (of different lengths, aligned by names and by offsets from the end)
give the mean, the standard error and the counts computed by hand with numpy."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import interp
from interp import Task, attribution_graph
from interp.graphs.task_graph import TaskGraph, position_keys
from interp.tasks import induction

# float64 means of a few float32 weights: summation order changes the last bit (~1e-16 rel)
RTOL = 1e-12
# head loadings of a float32 model sum to the edge within float32 rounding over 2 layers
RTOL_HEADS = 1e-5
SEEDS_LENGTHS = ((3, 3), (4, 4), (5, 5))  # induction rows of 5, 7 and 9 tokens


@pytest.fixture(scope="module")
def rows(setup):
    """Three induction rows of different lengths, named A, B, END; wrong: the first token."""
    model, _ = setup
    out = []
    for seed, seq_len in SEEDS_LENGTHS:
        (record,) = induction(model, 1, seed=seed, seq_len=seq_len).to_records()
        clean = record["clean"]
        out.append({"clean": clean, "answer": [record["answer"]], "wrong": [clean[0]],
                    "positions": record["positions"]})  # fmt: skip
    return out


@pytest.fixture(scope="module")
def setup():
    model = interp.load_model("tiny-induction")
    tc = interp.load_transcoders("tiny-induction-transcoders")
    return model, tc


@pytest.fixture(scope="module")
def built(setup, rows):
    """The task graph of the three rows, and each row's own graph."""
    model, tc = setup
    per_row = [attribution_graph(model, torch.tensor(r["clean"]), tc) for r in rows]
    return attribution_graph(model, _task(rows), tc), per_row


def _task(rows) -> Task:
    return Task.from_records(
        [{**r, "corrupted": [1] * len(r["clean"]), "positions": r["positions"]} for r in rows]
    )


def _keyed(g, row) -> dict:
    """The test's own keying: {(target key, source key): weight}, a role's logits summed."""
    n = len(row["clean"])
    names = {p % n: label for label, p in row["positions"].items()}

    def key(i):
        node = g.nodes.iloc[i]
        if node.kind == "logit":
            t = int(node.token_id)
            role = "answer" if t in row["answer"] else "wrong" if t in row["wrong"] else "other"
            return ("logit", role)
        pos = int(node.pos)
        return (node.kind, int(node.layer), int(node.feature), names.get(pos, pos - n))

    out: dict = {}
    A = g.adjacency.double()
    keys = [key(i) for i in range(len(g.nodes))]
    for t, s in torch.nonzero(A).tolist():
        k = (keys[t], keys[s])
        out[k] = out.get(k, 0.0) + float(A[t, s])
    return out


def _task_keys(tg: TaskGraph) -> list:
    keys = []
    for node in tg.nodes.itertuples():
        if node.kind == "logit":
            keys.append(("logit", node.position))
            continue
        pos = node.position
        pos = int(pos[1:-1]) if pos.startswith("[") else pos
        keys.append((node.kind, node.layer, node.feature, pos))
    return keys


def _edges(tg: TaskGraph) -> dict:
    keys = _task_keys(tg)
    return {
        (keys[e.target], keys[e.source]): (e.weight, e.sem, e.count) for e in tg.edges.itertuples()
    }


def test_position_keys():
    assert position_keys(5, {"A": 1, "END": 4}, bos=True) == ["BOS", "A", "[-3]", "[-2]", "END"]
    assert position_keys(3, {"X": 1, "Y": 1}, bos=False) == ["[-3]", "X", "[-1]"]  # first name
    with pytest.raises(ValueError, match="looks like the key of an unnamed position"):
        position_keys(3, {"[-1]": 0}, bos=False)


def test_identical_rows_give_the_single_graph(setup, rows):
    model, tc = setup
    row = rows[1]
    g = attribution_graph(model, torch.tensor(row["clean"]), tc)
    tg = attribution_graph(model, _task([row] * 3), tc)
    assert isinstance(tg, TaskGraph) and tg.n_prompts == 3
    expected, got = _keyed(g, row), _edges(tg)
    assert set(got) == set(expected)
    for k, w in expected.items():
        assert got[k] == (w, 0.0, 3), k  # bit for bit: float64 sums of identical float32s
    assert (tg.nodes["count"] == 3).all()
    feats = tg.nodes[tg.nodes.kind == "feature"]
    single = g.nodes[g.nodes.kind == "feature"]
    assert sorted(feats["activation"]) == sorted(single["activation"])


def test_distinct_rows_mean_sem_count(built, rows):
    tg, graphs = built
    per_row = [_keyed(g, r) for g, r in zip(graphs, rows, strict=True)]
    union = set().union(*per_row)
    got = _edges(tg)
    assert set(got) == union
    for k in union:
        values = np.array([d.get(k, 0.0) for d in per_row])
        weight, sem, count = got[k]
        assert weight == pytest.approx(values.mean(), rel=RTOL, abs=0), k
        assert sem == pytest.approx(values.std(ddof=1) / np.sqrt(3), rel=1e-9, abs=1e-18), k
        assert count == int((values != 0).sum()), k
    # the three rows' names and ends align; the middle of rows of different lengths does not
    tokens = tg.nodes[tg.nodes.kind == "token"]
    counts = dict(zip(tokens["position"], tokens["count"], strict=True))
    assert counts["A"] == counts["B"] == counts["END"] == 3 and counts["[-9]"] == 1
    logits = tg.nodes[tg.nodes.kind == "logit"].set_index("position")
    assert logits.loc["answer", "count"] == 3  # the induction heads predict every answer


def test_prune_and_head_loadings(built):
    tg, _ = built
    pruned = tg.prune()
    kinds = pruned.nodes["kind"]
    assert (kinds == "token").sum() == (tg.nodes["kind"] == "token").sum()  # always kept
    assert len(pruned.edges) < len(tg.edges)
    # kept edges carry their unpruned mean weights
    full = tg.edges.set_index(["target", "source"])["weight"]
    kept = pruned.kept_nodes
    for e in pruned.edges.itertuples():
        assert full[(kept[e.target], kept[e.source])] == e.weight
    loads = pruned.head_loadings()
    sums = loads.groupby(["target", "source"])["weight"].sum()
    weights = pruned.edges.set_index(["target", "source"])["weight"].reindex(sums.index)
    scale = pruned.edges["weight"].abs().max()
    assert np.allclose(
        sums.to_numpy(), weights.to_numpy(), rtol=RTOL_HEADS, atol=RTOL_HEADS * scale
    )


def test_missing_answer_is_named(setup, rows, caplog):
    model, tc = setup
    row = {**rows[0], "answer": [99], "wrong": [98]}  # not among the graph's top logits
    with caplog.at_level(logging.WARNING, logger="interp.graphs.task_graph"):
        tg = attribution_graph(model, _task([row]), tc, max_n_logits=2)
    assert "rows 1: the answer is not among the graph's logits" in caplog.text
    assert "answer" not in set(tg.nodes["position"])
    assert tg.edges["sem"].isna().all()  # one row: no standard error


def test_qk_attribution_is_the_rows_mean(built, rows):
    tg, per_row = built
    # END is the second copy of A: an induction head looks from it to B
    scores = [
        g.qk_attribution(1, 0, len(r["clean"]) - 1, r["positions"]["B"]).attrs["score"]
        for g, r in zip(per_row, rows, strict=True)
    ]
    for graph in (tg, tg.prune()):
        table = graph.qk_attribution(1, 0, "END", "B")
        assert table.attrs["rows"] == 3
        assert table.attrs["score"] == pytest.approx(np.mean(scores), rel=RTOL)
        # float32 parts summed in float64: the pairs sum to the score within float32 rounding
        assert table["contribution"].sum() == pytest.approx(np.mean(scores), rel=RTOL_HEADS)
        assert (table["query_node"] < len(graph.nodes)).all()
    pruned = tg.prune().qk_attribution(1, 0, "END", "B")
    assert "other" in set(pruned["query_id"]) | set(pruned["key_id"])  # dropped nodes lumped
    with pytest.raises(ValueError, match="no row has both positions"):
        tg.qk_attribution(1, 0, "B", "END")  # the key after the query


def test_identical_rows_qk_is_the_single_graphs(setup, rows):
    """Each pair of the single graph's QK table, mapped by the test's own keys, is the task
    graph's pair with the same contribution (the mean of three equal values)."""
    model, tc = setup
    row = rows[1]
    g = attribution_graph(model, torch.tensor(row["clean"]), tc)
    tg = attribution_graph(model, _task([row] * 3), tc)
    end, b = len(row["clean"]) - 1, row["positions"]["B"]
    single = g.qk_attribution(1, 2, end, b)
    names = {p: label for label, p in row["positions"].items()}

    def key(i, label):
        if i < 0:
            return label
        node = g.nodes.iloc[i]
        pos = names.get(int(node.pos), f"[{int(node.pos) - len(row['clean'])}]")
        return f"{node.kind} L{node.layer} f{node.feature} @{pos}"

    expected = {
        (key(q, qi), key(k, ki)): c
        for q, k, qi, ki, c in zip(*(single[c] for c in single.columns), strict=True)
    }
    task = tg.qk_attribution(1, 2, "END", "B")
    got = dict(zip(zip(task.query_id, task.key_id, strict=True), task.contribution, strict=True))
    assert set(got) == set(expected)
    for k, c in expected.items():
        assert got[k] == c, k  # float64 sums of equal float32s: exact
    assert task.attrs["score"] == pytest.approx(single.attrs["score"], rel=RTOL)
