"""How a store is filled and read (issue 40): one forward pass for every hook; a part written
pass by pass as the activations come; each shard's job carrying only its own rows; training
stores keyed by a hash of their texts; ``max_bytes`` checked before any work for every kind of
store; several hooks read together, token for token; a transcoder trained from a store; and
(slow) the peak memory of a whole SAE and transcoder training from a store 100x ``max_bytes``,
measured in a fresh process."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import interp.engine.cache
from interp import train_sae, train_transcoder
from interp.dictionaries.data import activations_at
from interp.foundation.executors import InlineExecutor
from interp.stores import fill_store
from interp.stores.activations import ROWS_PER_PASS
from interp.stores.training import fill_training_store

ROOT = Path(__file__).resolve().parents[2]
HOOK = "blocks.1.hook_resid_pre"
OTHER = "blocks.0.hook_resid_post"
MLP = [f"blocks.{n}.mlp.{side}" for n in (0, 1) for side in ("hook_in", "hook_out")]
REPLAY = dict(d_sae=8, steps=2, batch_tokens=16, seed=0)


def random_rows(n_rows: int, n_pos: int, seed: int) -> torch.Tensor:
    """Token rows without BOS (id 0 is the bundled tokenizer's special token)."""
    return torch.randint(1, 500, (n_rows, n_pos), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def forwards(monkeypatch):
    """The model's forward passes, counted (``calls[0]``); ``during`` runs before each."""
    calls, during = [0], []
    real = interp.engine.cache.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        for check in during:
            check(calls[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(interp.engine.cache, "forward", counted)
    return calls, during


def test_one_forward_pass_per_batch_of_rows_for_every_hook(tmp_path, bundled_model, forwards):
    calls, _ = forwards
    rows = random_rows(2 * ROWS_PER_PASS + 5, 16, 0)
    store = fill_store(tmp_path / "s", bundled_model, [HOOK, OTHER], rows, progress=False)
    assert calls[0] == 3  # 133 rows, 64 a pass: 3 passes for both hooks (was 6: one per hook)
    for hook in (HOOK, OTHER):  # against an independent computation, one hook at a time
        direct = activations_at(bundled_model, hook, list(rows.split(ROWS_PER_PASS)))
        assert np.array_equal(store.part(0, hook), direct.numpy())


def test_a_part_is_written_pass_by_pass_and_appears_whole_or_not_at_all(
    tmp_path, bundled_model, forwards
):
    _, during = forwards
    rows = random_rows(3 * ROWS_PER_PASS, 8, 1)
    seen = []

    def look(call: int) -> None:  # before pass `call`: what is on disk of the part so far
        partial = list(tmp_path.glob("s/.part-00000-*/*.npy"))
        seen.append({p.name: p.stat().st_size for p in partial})
        if call == 3:
            raise RuntimeError("the worker dies in its third pass")

    during.append(look)
    with pytest.raises(RuntimeError, match="third pass"):
        fill_store(tmp_path / "s", bundled_model, [HOOK], rows, progress=False)
    header = 128  # numpy's .npy header for these shapes
    per_pass = ROWS_PER_PASS * 8  # tokens of one pass (no BOS in these rows)
    assert seen[0] == {}  # nothing before the first pass
    first = {f"{HOOK}.npy": header + per_pass * 64 * 4, "tokens.npy": header + per_pass * 8}
    assert seen[1] == first
    assert seen[2][f"{HOOK}.npy"] == header + 2 * per_pass * 64 * 4  # appended, not held
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["run.json"]  # no part, no temp


class Recording(InlineExecutor):
    """The in-process executor, keeping every job it was sent."""

    def __init__(self):
        self.sent = []

    def submit(self, job, index: int, count: int) -> None:
        self.sent.append((index, job))
        super().submit(job, index, count)


def test_each_shard_is_sent_only_its_own_rows(tmp_path, bundled_model):
    rows = random_rows(64, 32, 2)
    executor = Recording()
    store = fill_store(tmp_path / "s", bundled_model, [HOOK], rows, shards=3, executor=executor,
                       progress=False)  # fmt: skip
    slices = {0: rows[:22], 1: rows[22:44], 2: rows[44:]}
    assert sorted(i for i, _ in executor.sent) == [0, 1, 2]
    for index, job in executor.sent:
        assert torch.equal(torch.as_tensor(job.rows), slices[index])
        assert len(pickle.dumps(job)) < rows.numel() * 8 / 2  # not the whole array
        assert np.array_equal(store.tokens(index), slices[index].flatten().numpy())


def test_texts_of_equal_count_and_length_are_other_runs(tmp_path, bundled_model):
    one = ["the cat sat on the mat and the dog ran " * 120]
    two = ["the dog sat on the mat and the cat ran " * 120]
    assert len(one[0]) == len(two[0]) and one != two
    fill_training_store(tmp_path / "t", bundled_model, HOOK, one, progress=False, **REPLAY)
    with pytest.raises(ValueError, match="another run .*differ in texts"):
        fill_training_store(tmp_path / "t", bundled_model, HOOK, two, progress=False, **REPLAY)


def test_max_bytes_is_refused_before_any_work_for_every_kind_of_store(
    tmp_path, bundled_model, forwards
):
    calls, _ = forwards
    replay = fill_training_store(tmp_path / "r", bundled_model, HOOK, progress=False, **REPLAY)
    plain = fill_store(tmp_path / "p", bundled_model, [HOOK, *MLP], random_rows(8, 16, 3),
                       progress=False)  # fmt: skip
    calls[0] = 0
    sae = dict(d_sae=8, architecture="topk", k=2, steps=2, batch_tokens=16, progress=False)
    with pytest.raises(ValueError, match="replayed whole .*raise max_bytes"):
        train_sae(bundled_model, HOOK, store=replay, max_bytes=10_000, **sae)
    with pytest.raises(ValueError, match="max_bytes 10,000 is too small"):
        train_sae(bundled_model, HOOK, store=plain, max_bytes=10_000, **sae)
    tc = dict(d_tc=8, steps=2, batch_tokens=16, progress=False)
    with pytest.raises(ValueError, match="max_bytes 10,000 is too small"):
        train_transcoder(bundled_model, store=plain, max_bytes=10_000, **tc)
    with pytest.raises(ValueError, match="filled with fill_training_store for an SAE"):
        train_transcoder(bundled_model, store=replay, **tc)
    with pytest.raises(ValueError, match="pass store= as well"):
        train_transcoder(bundled_model, max_bytes=10**6, **tc)
    assert calls[0] == 0  # every refusal came before the model ran
    # a budget that holds the replay is taken, and the SAE is the one trained in memory
    # (the whole call is in the budget: the SAE's state with the bundled mix's token ids, a
    # step, the evaluation: budget.py)
    stored, _ = train_sae(bundled_model, HOOK, store=replay, max_bytes=16 * 2**20, **sae, seed=0)
    memory, _ = train_sae(bundled_model, HOOK, **sae, seed=0)
    assert torch.equal(stored.W_dec, memory.W_dec)


def test_several_hooks_are_read_token_for_token(tmp_path, bundled_model):
    store = fill_store(tmp_path / "s", bundled_model, MLP[:2], random_rows(20, 16, 4), shards=2,
                       progress=False)  # fmt: skip
    parts = [zip(store.part(k, MLP[0]), store.part(k, MLP[1]), strict=True) for k in range(2)]
    stored = sorted((a.tobytes(), b.tobytes()) for part in parts for a, b in part)
    gen = torch.Generator().manual_seed(0)
    batches = store.batches(MLP[:2], 32, generator=gen, max_bytes=10**6)
    seen = torch.cat([next(batches) for _ in range(len(store) // 32)])  # one epoch: 320 tokens
    assert seen.shape == (len(store), 2, 64)
    pairs = sorted((row[0].numpy().tobytes(), row[1].numpy().tobytes()) for row in seen)
    assert pairs == stored  # every token once, its two hooks' rows together


@pytest.mark.slow
def test_a_transcoder_trains_from_a_store(tmp_path, bundled_model):
    store = fill_store(tmp_path / "s", bundled_model, MLP, random_rows(64, 64, 5), progress=False)
    args = dict(d_tc=32, steps=150, batch_tokens=64, progress=False, max_bytes=16 * 2**20)
    tc, report = train_transcoder(bundled_model, store=store, **args)
    again, _ = train_transcoder(bundled_model, store=store, **args)
    assert torch.equal(tc.W_dec(1), again.W_dec(1))  # the same seed, the same shuffles
    assert report.history["loss"].iloc[-1] < report.history["loss"].iloc[0] / 2
    assert (report.figures["fvu"] < 1).all()  # held-out MLP outputs: better than their mean


@pytest.mark.slow
def test_training_from_a_store_100x_max_bytes_peaks_under_it_in_a_fresh_process():
    script = ROOT / "benchmarks" / "bench_store_memory.py"
    argv = [sys.executable, str(script), "--max-bytes", "10MiB", "--ratio", "100", "--steps",
            "100", "--copies", "100"]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [r["kind"] for r in rows] == ["sae", "transcoder"], out.stderr[-2000:]
    for r in rows:
        assert r["store_bytes"] >= 100 * r["max_bytes"]
        assert r["reader"] < r["max_bytes"] - r["state"] - r["step"]  # the training's own first
        assert 0 < r["reading"] < r["reader"], r  # measured: VmHWM of the reading alone
        assert 0 < r["steps"] <= r["max_bytes"], r  # the steps, the reading among them
        assert 0 < r["whole"] <= r["max_bytes"], r  # the whole call, measured
    assert out.returncode == 0
