"""QK/OV circuits: weights reproduce a real forward pass; factored results equal dense ones."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch
from transformer_lens.FactoredMatrix import FactoredMatrix

from interp import run_cached
from interp.circuits import (
    CircuitWeights,
    MatrixTooLargeError,
    attention_scores_from_weights,
    circuit_weights,
    composition_baseline,
    composition_scores,
    composition_scores_dense,
    copying_scores,
    copying_scores_dense,
    default_max_bytes,
    direct_path,
    direct_path_top_tokens,
    full_ov_circuit,
    full_ov_diagonal,
    full_qk_circuit,
    head_outputs_from_weights,
    materialize,
    ov_circuit,
    ov_eigenvalues,
    qk_circuit,
    top_copied_tokens,
)
from interp.cli import main as cli_main

FAITHFUL_ATOL = 1e-5  # float32 forward pass vs float32 weights, d_model 64, a few matmuls
FACTORED_ATOL = 1e-6  # float32 factored paths vs float64 dense references (measured ~1e-7)
TL_ATOL = 1e-6  # ours vs TransformerLens's FactoredMatrix computations, both float32
PROMPT = "When Mary and John went to the store, John gave a drink to"


def _causal(n: int) -> torch.Tensor:
    return torch.tril(torch.ones(n, n, dtype=torch.bool))


def _reads(model, layer: int, fold_ln: bool):
    """What layer's heads read: hook_normalized (folded weights) or the LN output (raw)."""
    hook = f"blocks.{layer}.ln1.hook_{'normalized' if fold_ln else 'out'}"
    run = run_cached(model, PROMPT, scores=True, patterns=True, head_outputs=True, hooks=[hook])
    return run, run[hook]


# ---- faithfulness: weight-level circuits reproduce the forward pass ----------------------------


@pytest.mark.parametrize("fold_ln", [True, False])
def test_qk_circuit_with_bias_reproduces_attention_scores(gpt2_model, fold_ln):
    for layer in range(gpt2_model.cfg.n_layers):
        run, x = _reads(gpt2_model, layer, fold_ln)
        scores = attention_scores_from_weights(gpt2_model, layer, x, fold_ln=fold_ln)
        causal = _causal(x.shape[1])
        err = (scores - run.scores()[layer])[..., causal].abs().max()
        assert err <= FAITHFUL_ATOL, f"layer {layer}: max error {err:.2e}"


def test_qk_without_biases_does_not_reproduce_scores(gpt2_model):
    """The faithfulness test can fail: leaving out b_Q, b_K moves scores far beyond ATOL."""
    run, x = _reads(gpt2_model, 0, True)
    qk = qk_circuit(gpt2_model)[0]  # no bias row
    w = circuit_weights(gpt2_model)
    scores = torch.einsum("bqm,hmd,hdn,bkn->bhqk", x, qk.A, qk.B, x) / w.attn_scale
    err = (scores - run.scores()[0])[..., _causal(x.shape[1])].abs().max()
    assert err > 100 * FAITHFUL_ATOL


@pytest.mark.parametrize("fold_ln", [True, False])
@pytest.mark.parametrize("arch", ["gpt2", "neox"])
def test_ov_circuit_reproduces_head_outputs(request, arch, fold_ln):
    model = request.getfixturevalue(f"{arch}_model")
    for layer in range(model.cfg.n_layers):
        run, x = _reads(model, layer, fold_ln)
        out = head_outputs_from_weights(model, layer, x, run.patterns()[layer], fold_ln=fold_ln)
        err = (out - run.head_outputs()[layer]).abs().max()
        assert err <= FAITHFUL_ATOL, f"{arch} layer {layer}: max error {err:.2e}"


def test_rotary_qk_holds_only_on_the_diagonal(neox_model):
    """Rotary: q_i·k_j depends on i - j; the weights alone give the scores only at i == j."""
    with pytest.raises(ValueError, match="rotary"):
        attention_scores_from_weights(neox_model, 0, torch.zeros(1, 3, 64))
    for layer in range(neox_model.cfg.n_layers):
        run, x = _reads(neox_model, layer, True)
        scores = attention_scores_from_weights(neox_model, layer, x, ignore_rotary=True)
        diff = scores - run.scores()[layer]
        assert diff.diagonal(dim1=-2, dim2=-1).abs().max() <= FAITHFUL_ATOL
        strictly_lower = _causal(x.shape[1]) & ~torch.eye(x.shape[1], dtype=torch.bool)
        assert diff[..., strictly_lower].abs().max() > 100 * FAITHFUL_ATOL


def test_folded_weights_equal_transformer_lens_folding(gpt2_model, gpt2_compat_model):
    """Our LayerNorm folding against TransformerLens's own (enable_compatibility_mode)."""
    ours = circuit_weights(gpt2_model)
    compat = gpt2_compat_model
    for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K"):
        assert torch.allclose(getattr(ours, name), getattr(compat, name), atol=TL_ATOL), name
    assert torch.allclose(ours.unembed_cols(), compat.W_U, atol=TL_ATOL)
    # centring sits on the reading side here, on the writing side there: products agree
    assert torch.allclose(qk_circuit(gpt2_model).AB, compat.QK.AB, atol=TL_ATOL)
    full_ours = materialize(full_ov_circuit(gpt2_model, 1, 2))
    full_tl = (compat.W_E @ compat.OV[1, 2] @ compat.W_U).AB
    assert torch.allclose(full_ours, full_tl, atol=TL_ATOL)
    # folding a folded model changes nothing (its LayerNorms are the identity affine map)
    again = circuit_weights(compat)
    assert torch.allclose(again.W_V, ours.W_V, atol=TL_ATOL)
    diff = copying_scores(compat).copying_score - copying_scores(ours).copying_score
    assert diff.abs().max() <= FACTORED_ATOL


def test_ov_and_qk_circuits_are_the_products(gpt2_model):
    w = circuit_weights(gpt2_model, fold_ln=False)
    assert torch.allclose(ov_circuit(gpt2_model, fold_ln=False).AB, w.W_V @ w.W_O)
    qk_b = qk_circuit(gpt2_model, fold_ln=False, with_bias=True)
    assert qk_b.shape == (2, 4, 65, 65)
    assert torch.allclose(qk_b.AB[..., :64, :64], gpt2_model.QK.AB.detach(), atol=TL_ATOL)
    assert torch.allclose(qk_b.AB[..., -1, -1], (w.b_Q * w.b_K).sum(-1), atol=TL_ATOL)


# ---- copying scores: factored == dense ---------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "neox"])
def test_copying_scores_factored_equal_dense(request, arch):
    model = request.getfixturevalue(f"{arch}_model")
    fast, dense = copying_scores(model), copying_scores_dense(model)
    assert list(fast.columns) == ["layer", "head", "copying_score", "undefined", "kv_head"]
    assert (fast["kv_head"] == fast["head"]).all()  # no grouped-query attention here
    assert len(fast) == model.cfg.n_layers * model.cfg.n_heads
    assert not fast.undefined.any() and fast.copying_score.between(-1, 1).all()
    assert (fast.copying_score - dense.copying_score).abs().max() <= FACTORED_ATOL


def test_copying_scores_equal_transformer_lens_eigenvalues(gpt2_model):
    eig = (gpt2_model.W_E @ gpt2_model.OV @ gpt2_model.W_U).eigenvalues.detach()
    expected = (eig.sum(-1).real / eig.abs().sum(-1)).flatten()
    ours = copying_scores(gpt2_model, fold_ln=False).copying_score
    assert (ours - expected.numpy()).abs().max() <= TL_ATOL


def test_small_eigenproblem_has_the_dense_nonzero_eigenvalues(gpt2_model):
    small = ov_eigenvalues(gpt2_model)[1, 3]
    ov = full_ov_circuit(gpt2_model, 1, 3)
    dense = torch.linalg.eigvals(materialize(FactoredMatrix(ov.A.double(), ov.B.double())))
    assert (dense.abs() > 1e-9).sum() == small.numel()  # rank d_head: the rest are zeros
    for value in small:  # each small eigenvalue is one of the dense matrix's
        assert (dense - value).abs().min() <= FACTORED_ATOL


def test_trace_identity_sum_of_eigenvalues_is_sum_of_diagonal(gpt2_model):
    """Σλ = trace: the eigenvalues against the diagonal computed token by token."""
    eig = ov_eigenvalues(gpt2_model)
    for layer, head in [(0, 0), (1, 2)]:
        diag = full_ov_diagonal(gpt2_model, layer, head).double()
        assert abs(eig[layer, head].sum().real - diag.sum()) <= 1e-9 + 1e-5 * diag.abs().sum()


def test_copying_score_undefined_for_numerically_zero_heads(gpt2_model):
    w = circuit_weights(gpt2_model)
    W_V = w.W_V.clone()
    W_V[0, 1] = 0  # a pruned head
    W_O = w.W_O.clone()
    W_O[1, 3] = torch.randn(w.d_head, 1) * torch.ones(1, w.d_model)  # writes only the mean
    df = copying_scores(dataclasses.replace(w, W_V=W_V, W_O=W_O))
    flagged = set(zip(df["layer"][df.undefined], df["head"][df.undefined], strict=True))
    assert flagged == {(0, 1), (1, 3)}  # the final LayerNorm centres L1H3's output away
    assert df.copying_score[df.undefined].isna().all()
    assert df.copying_score[~df.undefined].notna().all()


def test_top_copied_tokens_match_dense(gpt2_model):
    df = top_copied_tokens(gpt2_model, 1, 2, k=5)
    assert list(df.columns) == ["token", "token_str", "diagonal", "row_rank"]
    dense = materialize(full_ov_circuit(gpt2_model, 1, 2))
    diag = dense.diagonal()
    assert df.token.tolist() == diag.topk(5).indices.tolist()
    assert torch.allclose(
        torch.tensor(df.diagonal.values, dtype=torch.float32),
        diag.topk(5).values,
        atol=FACTORED_ATOL,
    )
    for token, rank in zip(df.token, df.row_rank, strict=True):
        assert rank == int((dense[token] > dense[token, token]).sum()) + 1
    assert all(isinstance(s, str) for s in df.token_str)


# ---- full circuits, direct path, memory guard --------------------------------------------------


def test_full_circuits_equal_products_of_the_weights(gpt2_model):
    w = circuit_weights(gpt2_model)
    rows, cols = [0, 5, 399], range(10, 20)
    qk = materialize(full_qk_circuit(gpt2_model, 1, 0), rows, cols).double()
    W_E = w.W_E.double()
    expected = W_E[rows] @ w.W_Q[1, 0].double() @ w.W_K[1, 0].double().T @ W_E[list(cols)].T
    assert torch.allclose(qk, expected, atol=FACTORED_ATOL)
    ov = materialize(full_ov_circuit(gpt2_model, 0, 3), rows, cols).double()
    W_U = w.unembed_cols().double()
    expected = W_E[rows] @ w.W_V[0, 3].double() @ w.W_O[0, 3].double() @ W_U[:, list(cols)]
    assert torch.allclose(ov, expected, atol=FACTORED_ATOL)
    mask = torch.zeros(400, dtype=torch.bool)
    mask[[0, 5, 399]] = True
    assert torch.equal(materialize(full_ov_circuit(gpt2_model, 0, 3), mask, cols), ov.float())


def test_direct_path_is_the_final_layernorm_applied_to_embeddings(gpt2_model):
    """Row t of W_E W_U' equals ln_final(W_E[t]) @ W_U, less biases and vocabulary mean,
    times the LayerNorm scale the factored form leaves out."""
    tokens = [3, 42, 300]
    ln_f = gpt2_model.ln_final
    with torch.no_grad():
        e = gpt2_model.W_E[tokens]
        logits = (ln_f(e) - ln_f.original_component.bias) @ gpt2_model.W_U
        logits = logits - logits.mean(-1, keepdim=True)
        centred = e - e.mean(-1, keepdim=True)
        scale = (centred.pow(2).mean(-1, keepdim=True) + ln_f.original_component.eps).sqrt()
    row = materialize(direct_path(gpt2_model), tokens)
    assert torch.allclose(row, logits * scale, atol=FACTORED_ATOL)
    top = direct_path_top_tokens(gpt2_model, tokens, k=3)
    assert list(top.columns) == [
        "token",
        "token_str",
        "rank",
        "next_token",
        "next_token_str",
        "logit",
    ]
    assert top[top.token == 42].next_token.tolist() == row[1].topk(3).indices.tolist()


def test_materialize_refuses_what_does_not_fit():
    d_vocab, d_model, d_head = 50257, 8, 4  # GPT-2's vocabulary: 10.1 GB per full circuit
    w = CircuitWeights(
        W_E=torch.randn(d_vocab, d_model),
        W_Q=torch.randn(1, 1, d_model, d_head),
        W_K=torch.randn(1, 1, d_model, d_head),
        W_V=torch.randn(1, 1, d_model, d_head),
        W_O=torch.randn(1, 1, d_head, d_model),
        b_Q=torch.zeros(1, 1, d_head),
        b_K=torch.zeros(1, 1, d_head),
        b_V=torch.zeros(1, 1, d_head),
        W_U=torch.randn(d_model, d_vocab),
    )
    ov = full_ov_circuit(w, 0, 0)
    assert 0 < default_max_bytes() <= 1024**3
    with pytest.raises(MatrixTooLargeError, match=r"10\.10 GB.*rows=/cols="):
        materialize(ov)
    with pytest.raises(MatrixTooLargeError, match="0.00 GB budget"):
        materialize(ov, range(2), range(2), max_bytes=8)
    part = materialize(ov, range(3), [7, 50256])
    assert torch.allclose(part, ov.A[:3] @ ov.B[:, [7, 50256]])
    with pytest.raises(IndexError, match=r"\[0, 50256\]"):
        materialize(ov, [50257])
    with pytest.raises(IndexError, match="L0H1 does not exist"):
        full_ov_circuit(w, 0, 1)


def test_weights_reject_mismatched_shapes_and_fold_flags(gpt2_model):
    w = circuit_weights(gpt2_model)
    with pytest.raises(ValueError, match=r"W_O has shape \(2, 4, 64, 16\)"):
        dataclasses.replace(w, W_O=w.W_O.transpose(-2, -1))
    with pytest.raises(ValueError, match="fold_ln=True"):
        copying_scores(w, fold_ln=False)


# ---- composition scores ------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "neox"])
def test_composition_scores_factored_equal_dense(request, arch):
    model = request.getfixturevalue(f"{arch}_model")
    fast, dense = composition_scores(model, "QKV"), composition_scores_dense(model, "QKV")
    assert list(fast.columns) == [
        "kind",
        "src_layer",
        "src_head",
        "dst_layer",
        "dst_head",
        "score",
        "baseline",
        "undefined",
        "src_kv_head",
        "dst_kv_head",
    ]
    assert not fast.undefined.any()
    assert len(fast) == 3 * 4 * 4  # 2 layers of 4 heads: 16 pairs per kind
    assert (fast.src_layer < fast.dst_layer).all()
    pd.testing.assert_frame_equal(fast.drop(columns="score"), dense.drop(columns="score"))
    assert (fast.score - dense.score).abs().max() <= FACTORED_ATOL
    assert fast.score.between(0, 1).all()


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
def test_composition_scores_equal_transformer_lens(gpt2_model, kind):
    ours = composition_scores(gpt2_model, kind, fold_ln=False)
    tl = gpt2_model.all_composition_scores(kind).scores.detach()
    index = [
        torch.tensor(ours[c].to_numpy()) for c in ("src_layer", "src_head", "dst_layer", "dst_head")
    ]
    expected = tl[tuple(index)]
    assert (ours.score - expected.numpy()).abs().max() <= TL_ATOL


def test_composition_baseline_is_what_random_heads_score(gpt2_model):
    mean, std = composition_baseline(64, 16)
    assert (mean, std) == composition_baseline(64, 16)  # seeded
    assert composition_baseline(64, 16, seed=1) != (mean, std)
    assert composition_baseline(768, 64)[0] < mean  # larger residual stream: less overlap
    # a random, untrained model's scores scatter around the baseline, not around 0
    scores = composition_scores(gpt2_model, "QKV").score
    assert abs(scores.mean() - mean) < 3 * std
    assert (composition_scores(gpt2_model).baseline == mean).all()


def test_composition_undefined_for_a_zeroed_head(gpt2_model):
    w = circuit_weights(gpt2_model)
    W_O = w.W_O.clone()
    W_O[0, 2] = 0
    df = composition_scores(dataclasses.replace(w, W_O=W_O), "QKV")
    zeroed = (df.src_layer == 0) & (df.src_head == 2)
    assert df.score[zeroed].isna().all()
    v_into = (df.kind == "V") & (df.dst_layer == 0) & (df.dst_head == 2)
    assert not v_into.any()  # layer 0 has no earlier heads
    assert df.score[~zeroed].notna().all()
    with pytest.raises(ValueError, match="kind must be one of"):
        composition_scores(w, "X")


@pytest.mark.slow
def test_scores_on_gpt2_small_shaped_model(gpt2_small_shaped_model):
    model = gpt2_small_shaped_model
    copying = copying_scores(model)
    assert len(copying) == 144 and copying.copying_score.notna().all()
    comp = composition_scores(model, "QKV")
    assert len(comp) == 3 * 144 * 132 // 2  # pairs with src_layer < dst_layer
    w = circuit_weights(model)
    # spot-check pairs against dense float64 d_model x d_model products
    pairs = [("Q", (0, 1, 11, 5)), ("K", (4, 7, 5, 0)), ("V", (10, 11, 11, 11))]
    for kind, (sl, sh, dl, dh) in pairs:
        A = w.W_V[sl, sh].double() @ w.W_O[sl, sh].double()
        QK = w.W_Q[dl, dh].double() @ w.W_K[dl, dh].double().T
        B = {"Q": QK, "K": QK.T, "V": w.W_V[dl, dh].double() @ w.W_O[dl, dh].double()}[kind]
        expected = (A @ B).norm() / (A.norm() * B.norm())
        row = comp[
            (comp.kind == kind)
            & (comp.src_layer == sl)
            & (comp.src_head == sh)
            & (comp.dst_layer == dl)
            & (comp.dst_head == dh)
        ]
        assert abs(float(row.score.iloc[0]) - float(expected)) <= FACTORED_ATOL
    # and two heads' copying scores against the dense 1000 x 1000 eigenproblem
    for layer, head in [(0, 0), (11, 7)]:
        ov = full_ov_circuit(model, layer, head)
        eig = torch.linalg.eigvals(materialize(FactoredMatrix(ov.A.double(), ov.B.double())))
        expected = eig.sum().real / eig.abs().sum()
        got = copying.copying_score[(copying["layer"] == layer) & (copying["head"] == head)].iloc[0]
        assert abs(got - float(expected)) <= FACTORED_ATOL


# ---- command line ------------------------------------------------------------------------------


def test_cli_writes_csvs_and_report(gpt2_dir, gpt2_model, tmp_path, capsys):
    out = tmp_path / "circuits"
    assert cli_main(["circuits", "--model", str(gpt2_dir), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "composition_scores.csv",
        "copying_scores.csv",
        "report.html",
    ]
    copying = pd.read_csv(out / "copying_scores.csv")
    assert list(copying.columns) == ["layer", "head", "copying_score", "undefined", "kv_head"]
    expected = copying_scores(gpt2_model)
    assert (copying.copying_score - expected.copying_score).abs().max() <= 1e-9
    comp = pd.read_csv(out / "composition_scores.csv")
    assert list(comp.columns) == [
        "kind",
        "src_layer",
        "src_head",
        "dst_layer",
        "dst_head",
        "score",
        "baseline",
        "undefined",
        "src_kv_head",
        "dst_kv_head",
    ]
    assert sorted(comp.kind.unique()) == ["K", "Q", "V"] and len(comp) == 48
    html = (out / "report.html").read_text()
    assert "QK/OV circuits of" in html and "K-composition" in html
    assert "wrote" in capsys.readouterr().out


def test_cli_kinds_and_no_report(gpt2_dir, tmp_path):
    out = tmp_path / "k-only"
    assert (
        cli_main(
            [
                "circuits",
                "--model",
                str(gpt2_dir),
                "--out",
                str(out),
                "--kinds",
                "K",
                "--no-report",
                "--no-fold-ln",
            ]
        )
        == 0
    )
    assert sorted(p.name for p in out.iterdir()) == ["composition_scores.csv", "copying_scores.csv"]
    assert set(pd.read_csv(out / "composition_scores.csv").kind) == {"K"}


def test_cli_errors_write_nothing(tmp_path, capsys):
    out = tmp_path / "never"
    assert (
        cli_main(["circuits", "--model", str(tmp_path / "missing"), "--out", str(out)]) == 2
    )  # refused before any work
    assert "interp circuits: error:" in capsys.readouterr().err
    assert not out.exists()
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert cli_main(["circuits", "--model", str(tmp_path), "--out", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["circuits", "--out", str(out), "--kinds", "QX"])
