"""The bundled "tiny-induction" checkpoint: it loads offline, tokenises anything, and
contains a real induction head. Scores here are computed independently of
experiments/measure_bundled_model.py, from the attention patterns alone."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "interp" / "bundled" / "tiny-induction"
REP_LENS = (10, 30, 60)
MAX_BYTES = 10 * 1024 * 1024  # the package ships this folder; keep wheels small
ATOL_LOGITS = 1e-4  # float32, two layers: the bridge reorders a few matmuls
ATOL_SCORES = 1e-5  # one 16-dim dot product in float32
STRINGS = [
    "",
    "def f(x):\n    return x ** 2  # square\n",
    "  leading and trailing spaces  ",
    "tabs\tand\r\nwindows newlines\n\n",
    "héllo wörld, naïve café",
    "東京 and 北京; Ελληνικά; русский; עברית; العربية",
    "emoji 🙂👍🏽 and a zero-width joiner 👩\u200d💻",
    "</script><script>alert(1)</script>",
    "nul \x00 and control \x07 characters",
    "<|endoftext|> looks special",
]


def _boot(folder: Path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: everything is local
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(str(folder), device="cpu")


@pytest.fixture(scope="module")
def bridge():
    return _boot(BUNDLED)


def _repeated(d_vocab: int, rep_len: int, bos: int, batch: int = 24, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed + rep_len)
    half = torch.randint(1, d_vocab, (batch, rep_len), generator=gen)  # id 0 is <|endoftext|>
    return torch.cat([torch.full((batch, 1), bos), half, half], dim=1)


def _patterns(bridge, tokens: torch.Tensor) -> torch.Tensor:
    """[layer batch head q_pos k_pos]"""
    _, cache = bridge.run_with_cache(
        tokens, names_filter=lambda name: name.endswith("attn.hook_pattern")
    )
    return torch.stack(
        [cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(bridge.cfg.n_layers)]
    )


def _induction_scores(pattern: torch.Tensor, rep_len: int) -> torch.Tensor:
    """[layer head]: mean attention from each second-copy position q to q - (rep_len - 1)."""
    queries = torch.arange(1 + rep_len, 1 + 2 * rep_len)  # the second copy, after BOS
    keys = queries - (rep_len - 1)  # the token after the earlier copy of the current token
    return pattern[..., queries, keys].mean(dim=(1, -1))


def test_checkpoint_is_complete_and_small():
    names = {p.name for p in BUNDLED.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    total = sum(p.stat().st_size for p in BUNDLED.iterdir() if p.is_file())
    assert total <= MAX_BYTES, f"bundled checkpoint is {total / 1e6:.1f} MB; the limit is 10 MB"
    config = json.loads((BUNDLED / "config.json").read_text())
    assert config["model_type"] == "gpt_neox"
    assert config["num_hidden_layers"] >= 2


def test_loads_offline_with_hf_logits(bridge):
    from transformers import GPTNeoXForCausalLM

    hf = GPTNeoXForCausalLM.from_pretrained(BUNDLED).eval()
    tokens = bridge.to_tokens("import os\nfor name in os.listdir('.'):\n    print(name)\n")
    with torch.no_grad():
        expected = hf(tokens).logits
        got = bridge(tokens, return_type="logits")
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=ATOL_LOGITS), (got - expected).abs().max()


def test_load_model_by_short_name(bridge):
    from interp import load_model

    model = load_model("tiny-induction")
    tokens = bridge.to_tokens("class Foo:\n    def __init__(self):\n        pass\n")
    with torch.no_grad():
        # log-probs, not logits: a loader may fold LayerNorm and centre the unembedding,
        # which shifts each position's logits by a constant
        got = F.log_softmax(model(tokens, return_type="logits"), dim=-1)
        expected = F.log_softmax(bridge(tokens, return_type="logits"), dim=-1)
    assert torch.allclose(got, expected, atol=ATOL_LOGITS), (got - expected).abs().max()


@pytest.mark.parametrize("text", STRINGS)
def test_tokenizer_round_trips(bridge, text):
    tok = bridge.tokenizer
    ids = tok.encode(text, add_special_tokens=False)
    assert all(0 <= i < bridge.cfg.d_vocab for i in ids)
    assert tok.decode(ids) == text


def test_special_tokens_inside_vocabulary(bridge):
    tok = bridge.tokenizer
    config = json.loads((BUNDLED / "config.json").read_text())
    assert tok.bos_token == tok.eos_token == "<|endoftext|>"
    assert config["bos_token_id"] == config["eos_token_id"] == tok.bos_token_id
    assert 0 <= tok.bos_token_id < config["vocab_size"]


@pytest.mark.parametrize("rep_len", REP_LENS)
def test_induction_head_and_previous_token_head(bridge, rep_len):
    tokens = _repeated(bridge.cfg.d_vocab, rep_len, bridge.tokenizer.bos_token_id)
    with torch.no_grad():
        pattern = _patterns(bridge, tokens)
        logits = bridge(tokens, return_type="logits")
    induction = _induction_scores(pattern, rep_len)
    assert induction[1].max() >= 0.7, f"layer-1 induction scores {induction[1].tolist()}"
    previous = pattern.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(1, -1))  # [layer head]
    assert previous[0].max() >= 0.5, f"layer-0 previous-token scores {previous[0].tolist()}"

    nll = -F.log_softmax(logits[:, :-1], dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    first = nll[:, 1:rep_len].mean()  # a[0..L-2] -> a[1..L-1]
    repeated = nll[:, 1 + rep_len : 2 * rep_len].mean()  # the same predictions, second copy
    assert repeated <= 0.25 * first, (first.item(), repeated.item())


def test_rotary_matrix_reproduces_attention_scores(bridge):
    """The weight-level QK of the docs and composition scores: score(q, k) is
    q R(q_pos - k_pos) k / sqrt(d_head), with q and k as hook_q/hook_k give them (unrotated)."""
    spec = importlib.util.spec_from_file_location(
        "measure_bundled_model", REPO / "experiments" / "measure_bundled_model.py"
    )
    measure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(measure)

    theta = json.loads((BUNDLED / "config.json").read_text())["rope_parameters"]["rope_theta"]
    tokens = bridge.to_tokens("for i in range(10):\n    total += i")
    keep = ("attn.hook_q", "attn.hook_k", "attn.hook_attn_scores")
    _, cache = bridge.run_with_cache(tokens, names_filter=lambda name: name.endswith(keep))
    for layer in range(bridge.cfg.n_layers):
        q = cache[f"blocks.{layer}.attn.hook_q"][0]  # [pos head d_head]
        k = cache[f"blocks.{layer}.attn.hook_k"][0]
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"][0]  # [head q_pos k_pos]
        n_pos, _, d_head = q.shape
        for i in range(n_pos):
            for j in range(i + 1):  # the causal part; the rest is masked
                rot = measure.rotary_matrix(i - j, d_head, theta)
                dense = torch.einsum("he,ef,hf->h", q[i], rot, k[j]) / d_head**0.5
                torch.testing.assert_close(scores[:, i, j], dense, atol=ATOL_SCORES, rtol=0)


@pytest.mark.slow
def test_training_script_smoke(tmp_path, fork_server):
    """The script as a process of its own (forked from the warm server: tests/forked.py)."""
    from tests.forked import python, served_env

    out = tmp_path / "tiny"
    script = REPO / "experiments" / "train_bundled_model.py"
    proc = subprocess.run(
        python(fork_server, str(script), "--smoke", "--out", str(out)),
        capture_output=True,
        text=True,
        env=served_env(),
        timeout=600,  # the smoke run takes well under a minute on an idle machine
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "training_log.csv").read_text().count("\n") >= 3
    assert (out / "training_curve.svg").read_text().startswith("<svg")
    meta = json.loads((out / "TRAINING.json").read_text())
    assert meta["config"]["steps"] > 0
    assert "induction_score_by_head" in meta["measured"]

    model = _boot(out)
    text = "héllo 🙂\n    return x"
    assert model.tokenizer.decode(model.tokenizer.encode(text, add_special_tokens=False)) == text
    logits = model(model.to_tokens(text), return_type="logits")
    assert torch.isfinite(logits).all()
