"""load_model: local checkpoints through the hub code path, bundled names, and bad input."""

from __future__ import annotations

import shutil
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from interp import ModelLoadError, load_model
from interp.models.loading import resolve_source
from tests.checkpoints import make_checkpoint

ATOL = 1e-5  # float32, same weights, eager attention on both sides


def test_local_checkpoint_matches_transformers(gpt2_dir, gpt2_model):
    hf = AutoModelForCausalLM.from_pretrained(gpt2_dir, attn_implementation="eager").eval()
    tokens = gpt2_model.to_tokens("The cat sat on the mat.")
    with torch.no_grad():
        expected = hf(tokens).logits
    assert torch.allclose(gpt2_model(tokens), expected, atol=ATOL)


def test_local_checkpoint_uses_its_own_tokenizer(gpt2_dir, gpt2_model):
    tok = AutoTokenizer.from_pretrained(gpt2_dir)
    text = "Ünïcödé and <html>"
    assert len(gpt2_model.tokenizer) == len(tok)
    ids = gpt2_model.to_tokens(text, prepend_bos=False)[0].tolist()
    assert ids == tok(text)["input_ids"]


def test_rotary_checkpoint_loads(neox_model):
    assert neox_model.cfg.positional_embedding_type == "rotary"
    assert not neox_model.training


def test_string_path_and_pathlike_agree(gpt2_dir):
    assert resolve_source(str(gpt2_dir)) == resolve_source(gpt2_dir) == ("local", str(gpt2_dir))


def test_hub_names_resolve_to_hub():
    assert resolve_source("gpt2") == ("hub", "gpt2")
    assert resolve_source("EleutherAI/pythia-70m") == ("hub", "EleutherAI/pythia-70m")


def test_offline_hub_name_fails_fast_with_advice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match="save_pretrained"):
        load_model("gpt2-medium-not-cached-here")
    assert time.perf_counter() - start < 10  # no retry loop


def test_unreachable_hub_fails_fast(monkeypatch):
    import interp.models.loading as loading

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(loading, "_hub_is_offline", lambda: False)
    monkeypatch.setattr(loading, "_hub_reachable", lambda: False)
    with pytest.raises(ModelLoadError, match="cannot be reached"):
        load_model("gpt2")


def test_directory_without_tokenizer_is_refused(tmp_path):
    directory = make_checkpoint(tmp_path / "no-tok", with_tokenizer=False)
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        load_model(directory)


def test_directory_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(tmp_path)


def test_missing_directory(tmp_path):
    with pytest.raises(ModelLoadError, match="no such directory|not a directory"):
        load_model(str(tmp_path / "missing" / "dir"))


def test_config_without_weights(tmp_path, gpt2_dir):
    target = tmp_path / "config-only"
    target.mkdir()
    shutil.copy(gpt2_dir / "config.json", target)
    with pytest.raises(ModelLoadError, match="no weights"):
        load_model(target)


def test_pickled_weights_refused_unless_allowed(tmp_path, gpt2_dir, gpt2_model):
    target = tmp_path / "pickled"
    target.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(gpt2_dir / name, target)
    hf = AutoModelForCausalLM.from_pretrained(gpt2_dir)
    torch.save(hf.state_dict(), target / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickled"):
        load_model(target)
    trusted = load_model(target, allow_pickle=True, device="cpu")
    tokens = gpt2_model.to_tokens("pickles")
    assert torch.allclose(trusted(tokens), gpt2_model(tokens), atol=ATOL)


def test_empty_name():
    with pytest.raises(ModelLoadError, match="empty"):
        load_model("  ")


def test_named_bridge_arguments_reach_transformer_lens():
    # load_model names n_ctx / hf_config_overrides instead of a bare **kwargs: they must arrive
    model = load_model("tiny-induction", device="cpu", n_ctx=64)
    assert model.cfg.n_ctx == 64
    model = load_model(
        "tiny-induction", device="cpu", hf_config_overrides={"max_position_embeddings": 128}
    )
    assert model.cfg.n_ctx == 128
