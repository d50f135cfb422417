"""Session-scoped, seeded, offline fixtures: tiny checkpoints written to temp dirs.

Fixtures return loaded models that tests must not modify: transforms (folding) return new
models. Build variants with ``tests.checkpoints.make_checkpoint`` in your own test module.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from interp import load_model  # noqa: E402
from tests.checkpoints import make_checkpoint  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory):
    """A 2-layer, 4-head, d_model 64 GPT-2 with random LayerNorm weights and biases."""
    return make_checkpoint(tmp_path_factory.mktemp("gpt2-tiny"), arch="gpt2")


@pytest.fixture(scope="session")
def neox_dir(tmp_path_factory):
    """A 2-layer rotary GPT-NeoX of the same size (the bundled model's architecture)."""
    return make_checkpoint(tmp_path_factory.mktemp("neox-tiny"), arch="neox")


@pytest.fixture(scope="session")
def gpt2_model(gpt2_dir):
    return load_model(gpt2_dir, device="cpu")


@pytest.fixture(scope="session")
def neox_model(neox_dir):
    return load_model(neox_dir, device="cpu")


@pytest.fixture(scope="session")
def gpt2_small_shaped_dir(tmp_path_factory):
    """GPT-2-small's shape (12 layers, 12 heads, d_model 768) with a small vocabulary."""
    return make_checkpoint(tmp_path_factory.mktemp("gpt2-small-shaped"), arch="gpt2",
                           n_layers=12, n_heads=12, d_model=768, n_ctx=128, vocab_size=1000)


@pytest.fixture(scope="session")
def gpt2_small_shaped_model(gpt2_small_shaped_dir):
    return load_model(gpt2_small_shaped_dir, device="cpu")
