"""Direct logit attribution and the logit lens add up to what the model really computes."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from interp import run_cached
from interp.attribution import (
    AttributionError,
    TokenError,
    heads_table,
    logit_attribution,
    logit_lens,
    resolve_token,
    top_contributors,
)
from interp.models.layernorm import fold_layernorm

# the rows (float64 sums of float32 activations) against a float32 forward pass (the brief's bar)
IDENTITY_ATOL = 1e-4
# two computations of the same float32 quantities in different orders
AGREE_ATOL = 1e-5

PROMPT = "When Mary and John went to the store, John gave a drink to"
ANSWER, WRONG = " Mary", " John"
ARCHS = ["gpt2_model", "neox_model"]


@pytest.fixture(scope="module")
def folded(request):
    """Folded copies of the session models, made once for this module."""
    cache = {}

    def get(model):
        if id(model) not in cache:
            cache[id(model)] = fold_layernorm(model)
        return cache[id(model)]

    return get


def real_logits(model, prompt=PROMPT):
    """An independent forward pass of the UNFOLDED model."""
    return run_cached(model, prompt).logits[0].double()


def check_sums(frame):
    parts = frame[frame["component"] != "total"]["contribution"].sum()
    total = frame[frame["component"] == "total"]["contribution"].item()
    assert abs(parts - total) <= 1e-9  # total is literally the sum of the rows
    return total


@pytest.mark.parametrize("arch", ARCHS + ["neox_parallel_model"])
@pytest.mark.parametrize("pos", [-1, 3])
def test_rows_add_up_to_the_original_logit(arch, pos, request):
    model = request.getfixturevalue(arch)
    logits = real_logits(model)
    answer = resolve_token(model, ANSWER)
    frame = logit_attribution(model, PROMPT, ANSWER, pos=pos)
    assert abs(check_sums(frame) - float(logits[pos, answer])) <= IDENTITY_ATOL
    assert frame.attrs["identity_error"] <= IDENTITY_ATOL
    assert list(frame.columns) == ["component", "layer", "head", "contribution"]
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    counts = frame["component"].value_counts()
    assert counts["head"] == n_layers * n_heads and counts["mlp"] == n_layers
    assert counts["attn_bias"] == n_layers and counts["mean_logit"] == 1
    assert ("pos_embed" in counts) == (arch == "gpt2_model")  # rotary models have none


@pytest.mark.parametrize("arch", ARCHS + ["neox_parallel_model"])
def test_rows_add_up_to_the_original_logit_difference(arch, request):
    model = request.getfixturevalue(arch)
    logits = real_logits(model)
    answer, wrong = resolve_token(model, ANSWER), resolve_token(model, WRONG)
    frame = logit_attribution(model, PROMPT, ANSWER, wrong=WRONG)
    expected = float(logits[-1, answer] - logits[-1, wrong])
    assert abs(check_sums(frame) - expected) <= IDENTITY_ATOL
    assert "mean_logit" not in set(frame["component"])  # it cancels in a difference
    assert frame.attrs["wrong_id"] == wrong


@pytest.mark.parametrize("arch", ARCHS)
def test_agrees_with_transformer_lens_on_the_folded_model(arch, request, folded):
    """Our rows against TransformerLens's own stack_head_results / decompose_resid / logit_attrs."""
    model = request.getfixturevalue(arch)
    folded_model = folded(model)
    answer, wrong = resolve_token(model, ANSWER), resolve_token(model, WRONG)
    tokens = run_cached(model, PROMPT).tokens
    _, cache = folded_model.run_with_cache(tokens)
    for wrong_tokens in (None, torch.tensor([wrong])):
        ours = logit_attribution(
            folded_model, tokens, answer, wrong=None if wrong_tokens is None else wrong
        )

        def tl(stack, wrong_tokens=wrong_tokens):
            return cache.logit_attrs(
                stack, tokens=torch.tensor([answer]), incorrect_tokens=wrong_tokens, pos_slice=-1
            )[:, 0].double()

        heads = tl(cache.stack_head_results(layer=-1, pos_slice=-1))
        ours_heads = torch.tensor(ours[ours["component"] == "head"]["contribution"].to_numpy())
        assert torch.allclose(ours_heads, heads, atol=AGREE_ATOL)

        parts, labels = cache.decompose_resid(pos_slice=-1, return_labels=True)
        theirs = dict(zip(labels, tl(parts).tolist(), strict=True))
        assert row(ours, "embed") == pytest.approx(theirs["embed"], abs=AGREE_ATOL)
        if "pos_embed" in theirs:
            assert row(ours, "pos_embed") == pytest.approx(theirs["pos_embed"], abs=AGREE_ATOL)
        n_layers = int(model.cfg.n_layers)
        for layer in range(n_layers):
            assert row(ours, "mlp", layer) == pytest.approx(
                theirs[f"{layer}_mlp_out"], abs=AGREE_ATOL
            )
            attn = float(ours_heads.view(n_layers, -1)[layer].sum()) + row(ours, "attn_bias", layer)
            assert attn == pytest.approx(theirs[f"{layer}_attn_out"], abs=AGREE_ATOL)


def row(frame, component: str, layer: int | None = None) -> float:
    """The one contribution of ``component`` (in ``layer``)."""
    chosen = frame[frame["component"] == component]
    if layer is not None:
        chosen = chosen[chosen["layer"] == layer]
    return chosen["contribution"].item()


@pytest.mark.parametrize("arch", ARCHS)
def test_transformer_lens_logit_attrs_are_wrong_on_an_unfolded_model(arch, request):
    """The trap this module exists to avoid: on the unfolded model TL's rows miss ln_final's
    weight and bias. If this ever passes with a small error the fixtures stopped exercising it."""
    model = request.getfixturevalue(arch)
    answer = resolve_token(model, ANSWER)
    with torch.no_grad():
        logits, cache = model.run_with_cache(run_cached(model, PROMPT).tokens)
        parts = cache.decompose_resid(pos_slice=-1)
        tl_sum = float(cache.logit_attrs(parts, tokens=torch.tensor([answer]), pos_slice=-1).sum())
    assert abs(tl_sum - float(logits[0, -1, answer] - model.b_U[answer])) > 1e-2


@pytest.mark.parametrize("arch", ARCHS)
def test_neurons_split_the_mlp_rows_exactly(arch, request, folded):
    model = request.getfixturevalue(arch)
    folded_model = folded(model)
    by_mlp = logit_attribution(folded_model, PROMPT, ANSWER, wrong=WRONG)
    by_neuron = logit_attribution(folded_model, PROMPT, ANSWER, wrong=WRONG, neurons=True)
    assert list(by_neuron.columns) == ["component", "layer", "head", "neuron", "contribution"]
    assert check_sums(by_neuron) == pytest.approx(check_sums(by_mlp), abs=AGREE_ATOL)
    d_mlp = int(model.cfg.d_mlp)
    for layer in range(int(model.cfg.n_layers)):
        in_layer = by_neuron[by_neuron["layer"] == layer]
        neurons = in_layer[in_layer["component"] == "neuron"]
        assert list(neurons["neuron"]) == list(range(d_mlp))
        split = (
            neurons["contribution"].sum()
            + in_layer[in_layer["component"] == "mlp_bias"]["contribution"].item()
        )
        mlp = by_mlp[(by_mlp["component"] == "mlp") & (by_mlp["layer"] == layer)]
        assert split == pytest.approx(mlp["contribution"].item(), abs=AGREE_ATOL)
    # dense reference for one neuron: its activation times its output direction, through the
    # frozen final LayerNorm scale, onto the logit-difference direction of the folded W_U
    answer, wrong = resolve_token(model, ANSWER), resolve_token(model, WRONG)
    run = run_cached(folded_model, PROMPT, hooks=["blocks.1.mlp.hook_post"], ln_scales=True)
    act = run["blocks.1.mlp.hook_post"][0, -1, 7].double()
    out = folded_model.W_out[1, 7].detach().double()
    direction = (folded_model.W_U[:, answer] - folded_model.W_U[:, wrong]).detach().double()
    expected = act * ((out - out.mean()) @ direction) / run["ln_final.hook_scale"][0, -1, 0]
    row = by_neuron[
        (by_neuron["component"] == "neuron")
        & (by_neuron["layer"] == 1)
        & (by_neuron["neuron"] == 7)
    ]
    assert row["contribution"].item() == pytest.approx(float(expected), abs=AGREE_ATOL)


def test_a_folded_model_gives_the_same_rows(gpt2_model, folded):
    a = logit_attribution(gpt2_model, PROMPT, ANSWER)
    b = logit_attribution(folded(gpt2_model), PROMPT, ANSWER)
    assert list(a["component"]) == list(b["component"])
    assert torch.allclose(
        torch.tensor(a["contribution"].to_numpy()),
        torch.tensor(b["contribution"].to_numpy()),
        atol=AGREE_ATOL,
    )


def test_uncentred_fold_needs_no_mean_logit(gpt2_model):
    folded_model = fold_layernorm(gpt2_model, center_unembed=False)
    frame = logit_attribution(folded_model, PROMPT, ANSWER)
    assert "mean_logit" not in set(frame["component"])
    answer = resolve_token(gpt2_model, ANSWER)
    assert abs(check_sums(frame) - float(real_logits(gpt2_model)[-1, answer])) <= IDENTITY_ATOL


def test_a_missing_component_is_caught(gpt2_model, folded, monkeypatch):
    import interp.attribution.residual as residual

    monkeypatch.setattr(residual, "has_pos_embed", lambda model: False)
    with pytest.raises(AttributionError, match="final residual stream"):
        logit_attribution(folded(gpt2_model), PROMPT, ANSWER)


def test_rows_that_miss_the_original_logit_are_refused(gpt2_model, monkeypatch):
    """If the fold were wrong, the rows would add up on the folded model only; the check
    against the original model's own logit must refuse them."""
    import interp.attribution.rows as attribution

    def bad_fold(model):
        copy = fold_layernorm(model)
        with torch.no_grad():
            copy.blocks[1].ln2.weight.mul_(1.5)  # the kind of mistake a fold can make
        return copy

    monkeypatch.setattr(attribution, "fold_layernorm", bad_fold)
    with pytest.raises(AttributionError, match="the model's logit"):
        logit_attribution(gpt2_model, PROMPT, ANSWER)


def test_multi_token_answer_lists_its_tokens(gpt2_model):
    ids = gpt2_model.to_tokens(" Paris", prepend_bos=False)[0].tolist()
    pieces = [gpt2_model.tokenizer.decode([i]) for i in ids]
    assert len(pieces) > 1
    with pytest.raises(TokenError) as error:
        logit_attribution(gpt2_model, PROMPT, " Paris")
    assert str(error.value) == (
        f"' Paris' tokenises to {len(ids)} tokens {pieces}; pass a single-token answer"
    )
    with pytest.raises(TokenError, match="single-token wrong answer"):
        logit_attribution(gpt2_model, PROMPT, ANSWER, wrong=" Paris")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (dict(answer=" Mary", wrong=" Mary"), TokenError, "same token"),
        (dict(answer=10**6), TokenError, "outside the vocabulary"),
        (dict(answer=""), TokenError, "empty"),
        (dict(answer=" Mary", pos=99), ValueError, "out of range"),
    ],
)
def test_bad_arguments_are_refused(gpt2_model, kwargs, error, message):
    with pytest.raises(error, match=message):
        logit_attribution(gpt2_model, PROMPT, **kwargs)


def test_a_batch_is_refused(gpt2_model):
    with pytest.raises(ValueError, match="one prompt"):
        logit_attribution(gpt2_model, torch.zeros(2, 5, dtype=torch.long), ANSWER)


def test_top_contributors_and_heads_table(gpt2_model):
    frame = logit_attribution(gpt2_model, PROMPT, ANSWER, wrong=WRONG)
    top = top_contributors(frame, n=3)
    assert len(top) == 3 and "total" not in set(top["component"])
    others = frame[frame["component"] != "total"]["contribution"].abs()
    assert top["contribution"].abs().min() >= others.nlargest(3).min()
    heads = heads_table(frame)
    assert list(heads.columns) == ["layer", "head", "contribution"]
    assert len(heads) == int(gpt2_model.cfg.n_layers) * int(gpt2_model.cfg.n_heads)


# ---------------------------------------------------------------- logit lens


@pytest.mark.parametrize("arch", ARCHS + ["neox_parallel_model"])
def test_logit_lens_last_row_is_the_model_output(arch, request):
    model = request.getfixturevalue(arch)
    logits = real_logits(model)
    answer, wrong = resolve_token(model, ANSWER), resolve_token(model, WRONG)
    lens = logit_lens(model, PROMPT, ANSWER, wrong=WRONG, k=3)
    last = lens.iloc[-1]
    n_layers = int(model.cfg.n_layers)
    assert list(lens["layer"]) == list(range(n_layers + 1))
    assert list(lens["label"]) == ["embed"] + [f"L{i}" for i in range(n_layers)]
    assert abs(last["answer_logit"] - float(logits[-1, answer])) <= AGREE_ATOL
    assert abs(last["logit_diff"] - float(logits[-1, answer] - logits[-1, wrong])) <= AGREE_ATOL
    probs = logits[-1].softmax(-1)
    assert last["answer_prob"] == pytest.approx(float(probs[answer]), abs=AGREE_ATOL)
    assert last["answer_rank"] == int((logits[-1] > logits[-1, answer]).sum())
    assert [last[f"top{i}_id"] for i in (1, 2, 3)] == probs.topk(3).indices.tolist()
    assert lens.attrs["identity_error"] <= AGREE_ATOL


@pytest.mark.parametrize("arch", ARCHS)
def test_logit_lens_embed_row_by_hand(arch, request):
    """Independent reading of the embeddings: F.layer_norm with the HF module's weights."""
    model = request.getfixturevalue(arch)
    hooks = ["hook_embed"] + (["hook_pos_embed"] if arch == "gpt2_model" else [])
    run = run_cached(model, PROMPT, hooks=hooks)
    x = sum(run[name][0, -1] for name in hooks).double()
    ln = model.ln_final
    normed = F.layer_norm(
        x, x.shape, ln.weight.detach().double(), ln.bias.detach().double(), eps=float(model.cfg.eps)
    )
    expected = normed @ model.W_U.detach().double() + model.b_U.detach().double()
    lens = logit_lens(model, PROMPT, ANSWER, k=1)
    answer = resolve_token(model, ANSWER)
    assert lens.iloc[0]["answer_logit"] == pytest.approx(float(expected[answer]), abs=AGREE_ATOL)
    assert lens.iloc[0]["top1_id"] == int(expected.argmax())


@pytest.mark.parametrize("arch", ARCHS)
def test_logit_lens_agrees_with_transformer_lens(arch, request):
    from transformer_lens.tools.analysis.logit_lens import logit_lens as tl_logit_lens

    model = request.getfixturevalue(arch)
    answer = resolve_token(model, ANSWER)
    tokens = run_cached(model, PROMPT).tokens
    theirs = tl_logit_lens(model, tokens, targets=answer)
    ours = logit_lens(model, tokens, answer)
    # TL's stack: resid_pre of each layer, then the final resid_post (the same states as ours)
    assert len(theirs.labels) == len(ours)
    assert torch.allclose(
        theirs.values.flatten().double(),
        torch.tensor(ours["answer_logit"].to_numpy()),
        atol=AGREE_ATOL,
    )
    assert theirs.rank_trajectory().flatten().tolist() == ours["answer_rank"].tolist()


def test_logit_lens_without_answer_has_only_top_k(neox_model):
    lens = logit_lens(neox_model, PROMPT, k=2)
    assert list(lens.columns) == [
        "layer",
        "label",
        "top1_token",
        "top1_id",
        "top1_prob",
        "top2_token",
        "top2_id",
        "top2_prob",
    ]
    assert (lens["top1_prob"] >= lens["top2_prob"]).all()
    with pytest.raises(ValueError, match="needs an answer"):
        logit_lens(neox_model, PROMPT, wrong=WRONG)


# ---------------------------------------------------------------- command line


def run_cli(*args: str) -> int:
    from interp.cli import main

    return main(["attribute", *args])


def test_cli_writes_csv_whose_total_is_the_logit_difference(gpt2_dir, gpt2_model, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        run_cli(
            "--model",
            str(gpt2_dir),
            "--prompt",
            PROMPT,
            "--answer",
            ANSWER,
            "--wrong",
            WRONG,
            "--out",
            str(out),
        )
        == 0
    )
    frame = pd.read_csv(out / "attribution.csv")
    assert list(frame.columns) == ["component", "layer", "head", "contribution"]
    logits = real_logits(gpt2_model)
    answer, wrong = resolve_token(gpt2_model, ANSWER), resolve_token(gpt2_model, WRONG)
    total = frame[frame["component"] == "total"]["contribution"].item()
    assert abs(total - float(logits[-1, answer] - logits[-1, wrong])) <= IDENTITY_ATOL
    assert abs(frame[frame["component"] != "total"]["contribution"].sum() - total) <= 1e-9
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "Logit lens" in html and "Top contributors" in html
    assert "logit difference" in capsys.readouterr().out


def test_cli_single_logit_total(neox_dir, neox_model, tmp_path):
    out = tmp_path / "out"
    assert (
        run_cli("--model", str(neox_dir), "--prompt", PROMPT, "--answer", ANSWER, "--out", str(out))
        == 0
    )
    frame = pd.read_csv(out / "attribution.csv")
    total = frame[frame["component"] == "total"]["contribution"].item()
    answer = resolve_token(neox_model, ANSWER)
    assert abs(total - float(real_logits(neox_model)[-1, answer])) <= IDENTITY_ATOL


def test_cli_multi_token_answer_fails_and_writes_nothing(gpt2_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        run_cli(
            "--model", str(gpt2_dir), "--prompt", PROMPT, "--answer", " Paris", "--out", str(out)
        )
        == 2
    )
    error = capsys.readouterr().err
    assert "interp attribute: error: ' Paris' tokenises to" in error
    assert "pass a single-token answer" in error
    assert not out.exists()


def test_cli_failure_while_reporting_leaves_nothing(gpt2_dir, tmp_path, monkeypatch):
    import interp.pages.attribution as pages

    def broken(*args, **kwargs):
        raise RuntimeError("report failed")

    monkeypatch.setattr(pages, "prompt_report", broken)
    out = tmp_path / "out"
    assert (
        run_cli("--model", str(gpt2_dir), "--prompt", PROMPT, "--answer", ANSWER, "--out", str(out))
        == 1
    )
    assert not out.exists()


def test_cli_failure_on_the_second_file_removes_the_first(gpt2_dir, tmp_path, monkeypatch):
    import interp.pages.html as html

    real = html.write_text_atomic

    def fail_on_report(path, text):
        if "report.html" in str(path):
            raise OSError("disk full")
        return real(path, text)

    monkeypatch.setattr(html, "write_text_atomic", fail_on_report)
    out = tmp_path / "out"
    assert (
        run_cli("--model", str(gpt2_dir), "--prompt", PROMPT, "--answer", ANSWER, "--out", str(out))
        == 1
    )
    assert not out.exists()


def test_cli_failure_keeps_the_previous_outputs(gpt2_dir, tmp_path, monkeypatch):
    """Into an existing directory: a failed run leaves the old pair of files as they were."""
    import interp.pages.html as html

    out = tmp_path / "out"
    out.mkdir()
    (out / "attribution.csv").write_text("old csv")
    (out / "report.html").write_text("old report")
    real = html.write_text_atomic

    def fail_on_report(path, text):
        if "report.html" in str(path):
            raise OSError("disk full")
        return real(path, text)

    monkeypatch.setattr(html, "write_text_atomic", fail_on_report)
    assert (
        run_cli("--model", str(gpt2_dir), "--prompt", PROMPT, "--answer", ANSWER, "--out", str(out))
        == 1
    )
    assert sorted(p.name for p in out.iterdir()) == ["attribution.csv", "report.html"]
    assert (out / "attribution.csv").read_text() == "old csv"
    assert (out / "report.html").read_text() == "old report"


def test_check_within_refuses_an_error_past_its_bound_and_a_nan():
    """The one identity check: the error back when within ``atol + rtol * scale``, else a
    refusal that says what, the error and the bound."""
    from interp.attribution.residual import check_within

    assert check_within(1.5e-4, 10.0, 1e-4, 1e-5, "parts") == 1.5e-4  # bound 2e-4
    with pytest.raises(AttributionError, match=r"^parts \(error 0.00025 > allowed 0.0002\)$"):
        check_within(2.5e-4, 10.0, 1e-4, 1e-5, "parts")
    with pytest.raises(AttributionError, match="error nan"):
        check_within(float("nan"), 10.0, 1e-4, 1e-5, "parts")
