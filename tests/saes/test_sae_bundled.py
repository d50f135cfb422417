"""The bundled SAE (interp/bundled/tiny-induction-sae): listed by name and by ``interp
models``, small, and its training figures (TRAINING.json, docs/saes.md) equal a recomputation
from its weight file on the bundled model's held-out tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from interp.cli import main
from interp.dictionaries.data import TokenRows
from interp.models.sources import BUNDLED_DIR, bundled_models
from interp.saes.bundled import bundled_sae_info, bundled_sae_path, bundled_saes

ROOT = Path(__file__).resolve().parents[2]
NAME = "tiny-induction-sae"
FOLDER = BUNDLED_DIR / NAME
MAX_BYTES = 400_000  # "a few hundred KB at most"
ROUNDING = 1e-4  # TRAINING.json keeps 4 decimals of explained variance, 3 of L0


def test_the_bundled_sae_is_listed_by_name_and_is_not_a_model():
    assert NAME in bundled_saes()
    assert NAME not in bundled_models()
    assert bundled_sae_path(NAME) == FOLDER
    assert bundled_sae_path("tiny-induction") is None


def test_an_unknown_name_is_refused_in_one_line():
    with pytest.raises(ValueError, match="bundled SAEs: tiny-induction-sae") as info:
        bundled_sae_info("no-such-sae")
    assert "\n" not in str(info.value)


def test_interp_models_lists_the_sae_after_the_models(capsys):
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t") == ["tiny-induction", str(BUNDLED_DIR / "tiny-induction")]
    sae_line = next(line for line in lines if line.startswith(NAME + "\t"))
    name, path, what = sae_line.split("\t")
    assert path == str(FOLDER)
    assert what == "SAE of tiny-induction at blocks.1.hook_resid_pre: topk, 64 -> 512 features"


def test_the_folder_is_small_and_in_saelens_format():
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) < MAX_BYTES
    cfg = json.loads((FOLDER / "cfg.json").read_text())
    weights = load_file(FOLDER / "sae_weights.safetensors")
    assert set(weights) == {"W_enc", "b_enc", "W_dec", "b_dec"}
    assert weights["W_enc"].shape == (cfg["d_in"], cfg["d_sae"]) == (64, 512)
    assert weights["W_dec"].shape == (512, 64)
    assert (cfg["hook_name"], cfg["architecture"], cfg["k"]) == (
        "blocks.1.hook_resid_pre",
        "topk",
        16,
    )
    norms = weights["W_dec"].norm(dim=1)
    torch.testing.assert_close(norms, torch.ones_like(norms))


def test_the_training_figures_equal_a_recomputation(bundled_model):
    """From the weight file by hand (TopK of the pre-activations, in float64) on held-out
    tokens read with run_with_cache: L0, explained variance and dead features."""
    from interp.saes.train import EVAL_SEED, EVAL_TOKENS

    meta = json.loads((FOLDER / "TRAINING.json").read_text())
    cfg = json.loads((FOLDER / "cfg.json").read_text())
    w = {k: v.double() for k, v in load_file(FOLDER / "sae_weights.safetensors").items()}
    hook = cfg["hook_name"]
    rows = TokenRows(bundled_model, None, torch.Generator()).held_out(EVAL_TOKENS, EVAL_SEED)
    xs = []
    for tokens in rows:
        _, cache = bundled_model.run_with_cache(tokens, names_filter=hook)
        keep = torch.ones(tokens.shape, dtype=torch.bool)
        keep[:, 0] = tokens[:, 0] != bundled_model.tokenizer.bos_token_id
        xs.append(cache[hook][keep])
    x = torch.cat(xs).double()
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    values, index = pre.topk(cfg["k"], dim=-1)
    f = torch.zeros_like(pre).scatter(-1, index, values.clamp_min(0))
    x_hat = f @ w["W_dec"] + w["b_dec"]
    ev = 1 - ((x - x_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()
    figures = meta["figures"]
    assert figures["explained_variance"] == pytest.approx(ev.item(), abs=ROUNDING)
    assert figures["l0"] == pytest.approx((f > 0).sum(1).double().mean().item(), abs=ROUNDING)
    assert figures["dead_features"] == int(((f > 0).sum(0) == 0).sum())
    assert figures["tokens"] == meta["config"]["steps"] * meta["config"]["batch_tokens"]


def test_interp_models_lists_the_saes_without_torch():
    code = (
        "import sys; from interp.cli import main; main(['models']); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert NAME in proc.stdout


@pytest.mark.slow
def test_the_training_script_smoke(tmp_path, fork_server):
    """experiments/train_bundled_sae.py --smoke writes a folder that lists and loads (the
    script as a process of its own, forked from the warm server: tests/forked.py)."""
    from tests.forked import python, served_env

    out = tmp_path / "sae"
    script = ROOT / "experiments" / "train_bundled_sae.py"
    proc = subprocess.run(
        python(fork_server, str(script), "--smoke", "--out", str(out)),
        capture_output=True,
        text=True,
        env=served_env(),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = json.loads((out / "cfg.json").read_text())
    assert (cfg["d_sae"], cfg["k"], cfg["model_name"]) == (64, 4, "tiny-induction")
    meta = json.loads((out / "TRAINING.json").read_text())
    assert meta["figures"]["steps"] == 40
    assert set(load_file(out / "sae_weights.safetensors")) >= {"W_enc", "b_enc", "W_dec", "b_dec"}
