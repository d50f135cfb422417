"""Attribution, the logit lens and folding on RMSNorm, GQA and parallel-residual models.

Every identity is checked against plain ``transformers`` (``AutoModelForCausalLM`` on the same
tokens), never against interp itself: the attribution total against the HF logit (difference),
the lens's last row against the HF logits, the folded model's log-probs against HF's, and the
per-head rows of RMSNorm models against a direct logit attribution computed from the HF modules'
own weights and activations.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GemmaConfig, GemmaForCausalLM

from interp import load_model
from interp.attribution import AttributionError, logit_attribution, logit_lens
from interp.models.layernorm import FoldError, fold_info, fold_layernorm
from interp.models.norms import effective_bias, effective_weight
from tests.checkpoints import make_tokenizer
from tests.zoo import RMSNORM_ARCHS, _randomise

# float64 sums of float32 activations against a float32 HF forward pass (the bar)
IDENTITY_ATOL = 1e-4
# float32 forward passes of a 2-layer model after an exact refactoring of its weights: rounding
# grows with the log-probs' size (up to ~17 here; observed <= 1.4e-5); a broken fold moves them
# by 1e-2 or more
LOGPROB_ATOL = 1e-5
LOGPROB_RTOL = 2e-6
# one float32 computation done in two orders (interp's rows vs the same sum by hand from HF)
AGREE_ATOL = 1e-5
SMALL_CAP = 1.0  # a soft-cap small enough to bend these models' logits (a few units)

GEMMA_LIKE = ("gemma", "gemma2", "gemma2_capped")
ARCHS = (
    "gpt2",
    "gpt_neox",
    "gpt_neox_parallel",
    "gptj",
    "phi",
    "opt",
    *RMSNORM_ARCHS,
    "gemma",
    "gemma2_capped",
    "qwen2_tied",
)
RMS_ARCHS = (*RMSNORM_ARCHS, "gemma", "gemma2_capped", "qwen2_tied")
ANSWER, WRONG = 5, 7  # token ids: every zoo vocabulary has them


def make_gemma(directory):
    """Gemma 1 (not in the zoo): (1 + w) RMSNorm, sqrt(d_model) embedding scale, one KV head."""
    torch.manual_seed(0)
    tokenizer = make_tokenizer(300)
    config = GemmaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        initializer_range=0.2,
    )
    model = GemmaForCausalLM(config)
    _randomise(model)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# the zoo's checkpoint (shared with the other zoo tests) behind each name but "gemma"
ZOO_VARIANTS = {
    "gemma2_capped": ("gemma2", {"final_logit_softcapping": SMALL_CAP}),
    "qwen2_tied": ("qwen2", {"tie_word_embeddings": True}),
}


def zoo_spec(name: str) -> tuple[str, dict]:
    return ZOO_VARIANTS.get(name, (name, {}))


@pytest.fixture(scope="module")
def dirs(zoo, tmp_path_factory):
    return {
        name: make_gemma(tmp_path_factory.mktemp(name))
        if name == "gemma"
        else zoo.directory(zoo_spec(name)[0], **zoo_spec(name)[1])
        for name in ARCHS
    }


@pytest.fixture(scope="module")
def models(zoo, dirs):
    return {
        name: load_model(dirs[name], device="cpu")
        if name == "gemma"
        else zoo.model(zoo_spec(name)[0], **zoo_spec(name)[1])
        for name in ARCHS
    }


@pytest.fixture(scope="module")
def folded(models):
    return {name: fold_layernorm(model) for name, model in models.items()}


def soft_caps(directory) -> bool:
    config = AutoConfig.from_pretrained(directory)
    return getattr(config, "final_logit_softcapping", None) is not None


def hf_model(directory, *, capped: bool = True):
    """The plain transformers model; ``capped=False`` turns Gemma 2's logit soft-cap off."""
    kwargs = {"final_logit_softcapping": None} if soft_caps(directory) and not capped else {}
    return AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager", **kwargs
    ).eval()


@pytest.fixture(scope="module")
def hf(zoo, dirs):
    """Logits before any soft-cap (what attribution decomposes) and the models' outputs (the
    same model where there is no cap to turn off)."""
    pairs = {}
    for name, directory in dirs.items():
        output = (
            hf_model(directory)
            if name == "gemma"
            else zoo.hf(zoo_spec(name)[0], **zoo_spec(name)[1])
        )
        raw = hf_model(directory, capped=False) if soft_caps(directory) else output
        pairs[name] = (raw, output)
    return pairs


def tokens_for(model, n: int = 14, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, int(model.cfg.d_vocab), (1, n), generator=generator)


def hf_logits(model, tokens) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits[0].double()


def total(frame) -> float:
    rows = frame[frame["component"] != "total"]["contribution"].sum()
    value = frame[frame["component"] == "total"]["contribution"].item()
    assert abs(rows - value) <= 1e-9
    return value


# ---------------------------------------------------------------- attribution == transformers


@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("pos", [-1, 4])
def test_attribution_total_is_the_transformers_logit(name, pos, models, hf):
    model, (raw, _) = models[name], hf[name]
    tokens = tokens_for(model)
    logits = hf_logits(raw, tokens)
    single = logit_attribution(model, tokens, ANSWER, pos=pos)
    diff = logit_attribution(model, tokens, ANSWER, wrong=WRONG, pos=pos)
    assert abs(total(single) - float(logits[pos, ANSWER])) <= IDENTITY_ATOL
    assert abs(total(diff) - float(logits[pos, ANSWER] - logits[pos, WRONG])) <= IDENTITY_ATOL
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    counts = diff["component"].value_counts()
    assert counts["head"] == n_layers * n_heads  # query heads, also with fewer KV heads
    rms = name in RMS_ARCHS
    assert single.attrs["normalization"] == ("RMSNorm" if rms else "LayerNorm")
    assert ("mean_logit" in set(single["component"])) == (not rms)  # RMSNorm centres nothing


@pytest.mark.parametrize("name", ARCHS)
def test_neuron_rows_add_up_to_the_transformers_logit(name, models, hf, folded):
    model, (raw, _) = models[name], hf[name]
    tokens = tokens_for(model, seed=1)
    logits = hf_logits(raw, tokens)
    frame = logit_attribution(folded[name], tokens, ANSWER, wrong=WRONG, neurons=True)
    assert abs(total(frame) - float(logits[-1, ANSWER] - logits[-1, WRONG])) <= IDENTITY_ATOL
    assert (frame["component"] == "neuron").sum() == int(model.cfg.n_layers) * int(model.cfg.d_mlp)


@pytest.mark.parametrize("name", ARCHS)
def test_bias_rows_only_for_biases_the_model_has(name, models, folded):
    frame = logit_attribution(
        folded[name], tokens_for(models[name]), ANSWER, wrong=WRONG, neurons=True
    )
    components = set(frame["component"])
    try:
        has_b_O = folded[name].b_O is not None
    except AttributeError:  # TransformerLens: "this checkpoint has no such parameter"
        has_b_O = False
    assert ("attn_bias" in components) == has_b_O
    assert ("attn_bias" in components) == (
        name not in ("llama", "mistral", "gemma", "gemma2", "gemma2_capped")
    )
    # Llama-style MLPs have no biases; GPT-2-style ones do
    assert ("mlp_bias" in components) == (name not in RMS_ARCHS)


# ---------------------------------------------------------------- per-head rows by hand from HF


def hf_parts(name, model):
    """The HF modules a by-hand attribution reads, for the Llama-style decoders."""
    layers = model.model.layers
    post = (
        [layer.post_attention_layernorm for layer in layers]
        if name.startswith("gemma2")
        else [None] * len(layers)
    )
    return model.model.embed_tokens, layers, post, model.model.norm


def hf_weight(norm) -> torch.Tensor:
    """An HF RMSNorm's multiplier: Gemma stores it as an offset from one."""
    weight = norm.weight.detach().double()
    return 1 + weight if "Gemma" in type(norm).__name__ else weight


def hf_scale(x: torch.Tensor, norm) -> torch.Tensor:
    eps = getattr(norm, "variance_epsilon", None) or norm.eps
    return torch.sqrt(x.double().pow(2).mean(-1) + eps)


@pytest.mark.parametrize("name", RMS_ARCHS)
def test_head_and_embed_rows_by_hand_from_transformers(name, models, hf, folded):
    """Per query head: (z_h - b_V of its KV group) @ W_O,h, through Gemma 2's post-attention
    norm with its scale frozen, through the final RMSNorm with its scale frozen, onto
    W_U[answer] - W_U[wrong]. The embedding row: HF's embedding times Gemma's sqrt(d_model)."""
    model, (raw, _) = models[name], hf[name]
    tokens = tokens_for(model, seed=2)
    embed, layers, posts, final = hf_parts(name, raw)
    config = raw.config
    n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    seen: dict[str, torch.Tensor] = {}
    handles = [final.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0]))]
    for i, layer in enumerate(layers):
        o_proj = layer.self_attn.o_proj
        handles.append(
            o_proj.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(f"z{i}", a[0]))
        )
        handles.append(
            o_proj.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"a{i}", out))
        )
    try:
        logits = hf_logits(raw, tokens)
    finally:
        for handle in handles:
            handle.remove()
    W_U = raw.lm_head.weight.detach().double()
    direction = hf_weight(final) * (W_U[ANSWER] - W_U[WRONG]) / hf_scale(seen["x"][0, -1], final)

    expected = []
    for i, layer in enumerate(layers):
        z = seen[f"z{i}"][0, -1].double().view(n_heads, d_head)
        v_bias = layer.self_attn.v_proj.bias
        if v_bias is not None:  # folding moves each head's value bias into attn_bias
            z = z - v_bias.detach().double().view(n_kv, d_head).repeat_interleave(
                n_heads // n_kv, dim=0
            )
        W_O = layer.self_attn.o_proj.weight.detach().double()  # [d_model, head*d_head]
        heads = torch.stack([W_O[:, h * d_head : (h + 1) * d_head] @ z[h] for h in range(n_heads)])
        if posts[i] is not None:  # Gemma 2: the post-attention RMSNorm, scale frozen
            heads = heads / hf_scale(seen[f"a{i}"][0, -1], posts[i]) * hf_weight(posts[i])
        expected += (heads @ direction).tolist()
    frame = logit_attribution(folded[name], tokens, ANSWER, wrong=WRONG)
    got = frame[frame["component"] == "head"]["contribution"].tolist()
    assert got == pytest.approx(expected, abs=AGREE_ATOL)
    assert max(abs(v) for v in expected) > 1e-2  # the heads matter, so the check bites

    # Gemma multiplies the embedding by sqrt(d_model) (in the weights' dtype) before block 0
    normalizer = math.sqrt(config.hidden_size) if name in GEMMA_LIKE else 1.0
    embedding = embed.weight[tokens[0, -1]].detach() * torch.tensor(normalizer, dtype=torch.float32)
    assert torch.equal(embedding, embed(tokens)[0, -1].detach())  # what HF's forward adds
    embed_row = frame[frame["component"] == "embed"]["contribution"].item()
    assert embed_row == pytest.approx(float(embedding.double() @ direction), abs=AGREE_ATOL)
    assert float(logits[-1, ANSWER] - logits[-1, WRONG]) == pytest.approx(
        total(frame), abs=IDENTITY_ATOL
    )


# ---------------------------------------------------------------- soft-capped logits (Gemma 2)


def test_soft_capped_logits_are_attributed_before_the_cap(models, hf):
    model, (raw, capped) = models["gemma2_capped"], hf["gemma2_capped"]
    tokens = tokens_for(model, seed=3)
    before, after = hf_logits(raw, tokens), hf_logits(capped, tokens)
    assert float((before - after).abs().max()) > 0.1  # the cap really bends these logits
    frame = logit_attribution(model, tokens, ANSWER, wrong=WRONG)
    assert abs(total(frame) - float(before[-1, ANSWER] - before[-1, WRONG])) <= IDENTITY_ATOL
    assert frame.attrs["output"] == pytest.approx(
        float(after[-1, ANSWER] - after[-1, WRONG]), abs=IDENTITY_ATOL
    )
    assert frame.attrs["soft_cap"] == SMALL_CAP
    assert "before soft-capping" in frame.attrs["reference_is"]
    assert "before the cap" in frame.attrs["note"]
    plain = logit_attribution(models["llama"], tokens, ANSWER)
    assert plain.attrs["note"] is None and plain.attrs["soft_cap"] is None
    assert plain.attrs["output"] == plain.attrs["reference"]


def test_a_folded_soft_capped_model_gives_the_same_rows(models, folded):
    tokens = tokens_for(models["gemma2_capped"], seed=8)
    a = logit_attribution(models["gemma2_capped"], tokens, ANSWER)
    b = logit_attribution(folded["gemma2_capped"], tokens, ANSWER)
    assert list(a["component"]) == list(b["component"])
    assert a["contribution"].tolist() == pytest.approx(b["contribution"].tolist(), abs=AGREE_ATOL)
    assert b.attrs["reference_is"] == "the folded model's logit before soft-capping"
    assert b.attrs["output"] == pytest.approx(a.attrs["output"], abs=AGREE_ATOL)


def test_soft_capped_model_folds_without_centring(models):
    model = models["gemma2_capped"]
    assert not fold_info(fold_layernorm(model)).center_unembed
    with pytest.raises(FoldError, match="soft-caps its logits"):
        fold_layernorm(model, center_unembed=True)


def test_a_soft_cap_that_is_not_tanh_is_caught(models, monkeypatch):
    """If the pre-cap hook did not hold what the cap is applied to, refuse."""
    import interp.attribution.residual as residual

    monkeypatch.setattr(residual, "soft_cap", lambda model: 2 * SMALL_CAP)
    with pytest.raises(AttributionError, match="soft-capping is not"):
        logit_attribution(models["gemma2_capped"], tokens_for(models["gemma2"]), ANSWER)


# ---------------------------------------------------------------- logit lens == transformers


@pytest.mark.parametrize("name", ARCHS)
def test_logit_lens_last_row_is_the_transformers_output(name, models, hf):
    model, (_, capped) = models[name], hf[name]
    tokens = tokens_for(model, seed=4)
    logits = hf_logits(capped, tokens)[-1]
    lens = logit_lens(model, tokens, ANSWER, wrong=WRONG, k=3)
    last = lens.iloc[-1]
    assert abs(last["answer_logit"] - float(logits[ANSWER])) <= IDENTITY_ATOL
    assert abs(last["logit_diff"] - float(logits[ANSWER] - logits[WRONG])) <= IDENTITY_ATOL
    assert [last[f"top{i}_id"] for i in (1, 2, 3)] == logits.topk(3).indices.tolist()
    assert last["answer_prob"] == pytest.approx(float(logits.softmax(-1)[ANSWER]), abs=AGREE_ATOL)


@pytest.mark.parametrize("name", RMS_ARCHS)
def test_logit_lens_embed_row_by_hand(name, models, hf):
    """Row 0: HF's (scaled) embedding through HF's own final RMSNorm, lm_head and cap."""
    model, (_, capped) = models[name], hf[name]
    tokens = tokens_for(model, seed=5)
    with torch.no_grad():
        x = capped.model.embed_tokens(tokens)[0, -1]
        logits = capped.lm_head(capped.model.norm(x)).double()
    cap = getattr(capped.config, "final_logit_softcapping", None)
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    lens = logit_lens(model, tokens, ANSWER, k=1)
    assert lens.iloc[0]["answer_logit"] == pytest.approx(float(logits[ANSWER]), abs=AGREE_ATOL)
    assert lens.iloc[0]["top1_id"] == int(logits.argmax())


# ---------------------------------------------------------------- folding == transformers


@pytest.mark.parametrize("name", ARCHS)
def test_folding_keeps_the_transformers_log_probs(name, hf, folded):
    _, capped = hf[name]
    model = folded[name]
    generator = torch.Generator().manual_seed(6)
    tokens = torch.randint(1, int(model.cfg.d_vocab), (2, 20), generator=generator)
    with torch.inference_mode():
        ours = model(tokens, return_type="logits").double().log_softmax(-1)
    with torch.no_grad():
        theirs = capped(tokens).logits.double().log_softmax(-1)
    bound = LOGPROB_ATOL + LOGPROB_RTOL * float(theirs.abs().max())
    assert float((ours - theirs).abs().max()) <= bound


@pytest.mark.parametrize("name", RMS_ARCHS)
def test_rmsnorm_fold_folds_the_pre_norms_and_centres_nothing(name, models, folded):
    model, fold = models[name], folded[name]
    d_model = int(model.cfg.d_model)
    pre_norms = [block.ln1 for block in fold.blocks] + [block.ln2 for block in fold.blocks]
    ones = torch.ones(d_model, dtype=torch.float64)
    for norm in pre_norms + [fold.ln_final]:
        assert torch.equal(effective_weight(norm, d_model), ones)
        assert not effective_bias(norm, d_model).any()
    # the original's norms were far from the identity, so the fold moved something
    assert not torch.allclose(effective_weight(model.ln_final, d_model), ones, atol=0.1)
    info = fold_info(fold)
    assert not info.center_unembed and not info.unembed_mean.any()
    posts = {
        f"blocks.{i}.{n}" for i in range(int(model.cfg.n_layers)) for n in ("ln1_post", "ln2_post")
    }
    assert set(info.kept) == (posts if name.startswith("gemma2") else set())
    # W_U carries ln_final's weight: folded W_U == w_eff[:, None] * original W_U
    expected = effective_weight(model.ln_final, d_model)[:, None] * model.W_U.detach().double()
    assert torch.allclose(fold.W_U.detach().double(), expected, atol=1e-6)


def test_rmsnorm_fold_can_centre_the_unembedding_when_asked(models, hf):
    """Centring is exact for log-probs on an RMSNorm model too; the mean comes back as a row."""
    model, (raw, _) = models["llama"], hf["llama"]
    fold = fold_layernorm(model, center_unembed=True)
    assert fold_info(fold).center_unembed
    tokens = tokens_for(model, seed=7)
    frame = logit_attribution(fold, tokens, ANSWER)
    assert "mean_logit" in set(frame["component"])
    assert abs(total(frame) - float(hf_logits(raw, tokens)[-1, ANSWER])) <= IDENTITY_ATOL


def test_rmsnorm_model_is_left_unchanged(models):
    model = models["gemma"]
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    fold_layernorm(model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert not model._weights_processed


def test_layernorm_post_norm_is_refused(models, monkeypatch):
    """Only RMSNorm post-norms are decomposed; a LayerNorm there is refused in one line."""
    import interp.attribution.residual as residual

    monkeypatch.setattr(residual, "is_rms", lambda norm: False)
    with pytest.raises(AttributionError, match="normalises its attn output with a LayerNorm"):
        logit_attribution(fold_layernorm(models["gemma2"]), tokens_for(models["gemma2"]), ANSWER)


@pytest.mark.parametrize("name", ["llama", "gemma2_capped"])
def test_cli_total_is_the_transformers_logit_difference(name, dirs, models, hf, tmp_path):
    import pandas as pd

    from interp.cli import main

    prompt = "When Mary and John went to the store, John gave a drink to"
    out = tmp_path / "out"
    assert (
        main(
            [
                "attribute",
                "--model",
                str(dirs[name]),
                "--prompt",
                prompt,
                "--answer",
                " Mary",
                "--wrong",
                " John",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    frame = pd.read_csv(out / "attribution.csv")
    model, (raw, _) = models[name], hf[name]
    tokens = model.to_tokens(prompt)
    mary, john = (int(model.to_tokens(w, prepend_bos=False)[0, 0]) for w in (" Mary", " John"))
    logits = hf_logits(raw, tokens)
    expected = float(logits[-1, mary] - logits[-1, john])
    assert (
        abs(frame[frame["component"] == "total"]["contribution"].item() - expected) <= IDENTITY_ATOL
    )
    report = (out / "report.html").read_text(encoding="utf-8")
    assert ("before soft-capping" in report) == (name == "gemma2_capped")
