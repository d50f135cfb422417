"""Session-scoped, seeded, offline fixtures: tiny checkpoints written to temp dirs, each
written and loaded once per test run, and one headless browser.

Fixtures return loaded models that tests must not modify: transforms (folding) return new
models. A test that changes a model (``enable_compatibility_mode``, a config setting) loads
its own copy from the fixture's directory. Build variants with
``tests.checkpoints.make_checkpoint`` in your own test module. docs/testing.md has the rules.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One thread: these models are tiny, and on a 2-core machine shared with other jobs OpenMP's
# second thread mostly spins (measured: the zoo's analyses took 8 s on one thread, 65-80 s on
# two, eigvals of a 300 x 300 matrix 0.03 s against 0.2-0.8 s). Subprocesses (commands, doc
# examples) inherit it. Set INTERP_TEST_THREADS to try more.
THREADS = int(os.environ.get("INTERP_TEST_THREADS", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

import pytest  # noqa: E402
import torch  # noqa: E402

from interp import load_model  # noqa: E402
from tests.checkpoints import make_checkpoint, make_parallel_neox  # noqa: E402
from tests.optional import require_module  # noqa: E402
from tests.zoo import Zoo  # noqa: E402

torch.set_num_threads(THREADS)


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
    return make_checkpoint(
        tmp_path_factory.mktemp("gpt2-small-shaped"),
        arch="gpt2",
        n_layers=12,
        n_heads=12,
        d_model=768,
        n_ctx=128,
        vocab_size=1000,
    )


@pytest.fixture(scope="session")
def gpt2_small_shaped_model(gpt2_small_shaped_dir):
    return load_model(gpt2_small_shaped_dir, device="cpu")


@pytest.fixture(scope="session")
def gpt2_small_width_dir(tmp_path_factory):
    """GPT-2 small's width (12 heads, d_model 768, d_mlp 3072) in 2 layers: a forward pass's
    working memory is GPT-2 small's (the measured peaks of a scan or a patching grid do not grow
    with the layers), its time a sixth of it, a patching grid over every layer's a 36th."""
    return make_checkpoint(
        tmp_path_factory.mktemp("gpt2-small-width"),
        arch="gpt2",
        n_layers=2,
        n_heads=12,
        d_model=768,
        n_ctx=128,
        vocab_size=1000,
    )


@pytest.fixture(scope="session")
def gpt2_compat_model(gpt2_dir):
    """The tiny GPT-2 processed by TransformerLens itself (``enable_compatibility_mode``: its
    LayerNorms folded, in place, so a copy of its own rather than ``gpt2_model``)."""
    model = load_model(gpt2_dir, device="cpu")
    model.enable_compatibility_mode()
    return model


@pytest.fixture(scope="session")
def neox_parallel_model(tmp_path_factory):
    """Pythia's layout: parallel attention and MLP, partial rotary, random LayerNorms."""
    return load_model(make_parallel_neox(tmp_path_factory.mktemp("neox-parallel")), device="cpu")


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> Zoo:
    """The zoo's checkpoints (tests/zoo.py), each written, loaded and opened in transformers
    once for all the test files that use it: ``zoo.model("llama")``, ``zoo.hf("llama")``."""
    return Zoo(tmp_path_factory.mktemp("zoo"))


@pytest.fixture(scope="session")
def bundled_model():
    """The bundled ``tiny-induction`` model, loaded as ``load_model("tiny-induction")``."""
    return load_model("tiny-induction")


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium (tests/browser.py) for every browser test of the run: a test skips
    without one, or fails where INTERP_REQUIRE_BROWSER is set (CI). Each page opens in its own
    target, so pages share nothing but the process."""
    from tests.browser import Chromium, find_chromium

    executable = find_chromium()
    if executable is None:
        message = "headless Chromium not found: run .ci/install_chromium.sh or set INTERP_CHROMIUM"
        if os.environ.get("INTERP_REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    with Chromium(executable) as chromium:
        yield chromium


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster of 2 CPUs, started once for every test that runs shards on Ray
    (seconds to start); its workers import this checkout (PYTHONPATH). Skipped without ray,
    failed without it on CI."""
    ray = require_module("ray", "ray")
    root = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path, "OMP_NUM_THREADS": str(THREADS), "HF_HUB_OFFLINE": "1"}
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": env},
    )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def fork_server():
    """The socket of a warm fork server (tests/fork_server.py, tests/forked.py) started with
    ``served_env()``: the documents' drivers and commands, and the tests' own ``python``
    processes, are forked from it, fresh but with torch, transformers, TransformerLens and
    interp already imported."""
    import shutil
    import subprocess
    import sys
    import tempfile

    from tests.forked import FORK_SERVER, served_env

    folder = Path(tempfile.mkdtemp(prefix="interp-fork-"))  # short: a socket path has 108 bytes
    socket_path = folder / "server.sock"
    server = subprocess.Popen(
        [sys.executable, str(FORK_SERVER), "serve", str(socket_path)],
        env=served_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout.readline() == "ready\n", "the fork server did not start"
        yield socket_path
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``--dist loadfile`` (the README's command): the costliest test file first, the
    documents' examples one by one (tests/scheduling.py)."""
    if config.getoption("dist") != "loadfile":
        return None
    from tests.scheduling import CostScheduling

    return CostScheduling(config, log)
