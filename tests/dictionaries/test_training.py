"""interp.dictionaries.training: the one loop cuts batches in order from any iterator of
buffers (a short tail dropped, no buffer drawn past the last step), its schedules are the
documented ones, and a store given to train_sae as a path trains as the opened store.
(The losses' numbers: tests/saes/test_sae_train.py, tests/transcoders/test_transcoder_train.py.)"""

from __future__ import annotations

import torch

from interp import train_sae
from interp.dictionaries.training import HISTORY_ROWS, fit, lr_scale, warmup


class _Recorded:
    """A loss that records the batches it is given: ``w · Σ batch``."""

    name, shown, penalised, coefficient = "sparsity_coefficient", ("fvu", "fvu"), True, 2.0

    def __init__(self, w):
        self.w, self.seen, self.lams = w, [], []

    def __call__(self, batch, lam, step):
        self.seen.append(batch[0].tolist())
        self.lams.append(lam)
        return self.w * batch[0].sum(), lambda: {"l0": 0.0, "fvu": 0.0}

    def project(self) -> None:
        pass


def test_batches_are_cut_in_order_and_a_short_tail_is_dropped():
    sizes, drawn = [10, 7, 4, 10], []  # the last step takes all of the third

    def buffers():
        for n in sizes:
            drawn.append(n)
            yield (torch.arange(n, dtype=torch.float32) + 100 * len(drawn),)

    w = torch.zeros((), requires_grad=True)
    loss = _Recorded(w)
    history = fit({"w": w}, loss, buffers(), steps=4, batch_tokens=4, lr=0.1, progress=False,
                  desc="test")  # fmt: skip
    first, second, third = (
        [100 * i + j for j in range(s, s + 4)] for i, s in [(1, 0), (1, 4), (2, 0)]
    )
    assert loss.seen == [first, second, third, [300, 301, 302, 303]]  # 8, 9 and 4-6 dropped
    assert drawn == [10, 7, 4]  # nothing drawn after the last step
    assert [row["step"] for row in history] == [0, 1, 2, 3]
    assert [row["sparsity_coefficient"] for row in history] == loss.lams


def test_the_schedules():
    steps = 100  # lr falls over the last 20 steps, λ rises over the first 5
    assert [lr_scale(s, steps) for s in (0, 79, 80, 90, 99)] == [1.0, 1.0, 1.0, 0.5, 0.05]
    assert [warmup(s, steps) for s in (0, 1, 4, 50)] == [0.2, 0.4, 1.0, 1.0]
    w = torch.zeros((), requires_grad=True)
    loss = _Recorded(w)
    history = fit({"w": w}, loss, iter(lambda: (torch.ones(8),), None), steps=steps,
                  batch_tokens=4, lr=0.5, progress=False, desc="test")  # fmt: skip
    assert len(history) == steps // max(1, steps // HISTORY_ROWS)
    assert [row["lr"] for row in history] == [0.5 * lr_scale(s, steps) for s in range(steps)]
    assert loss.lams == [2.0 * warmup(s, steps) for s in range(steps)]


def test_a_store_given_as_a_path_trains_as_the_opened_store(bundled_model, tmp_path):
    from interp.stores import ActivationStore
    from interp.stores.training import fill_training_store

    hook, texts = "blocks.1.hook_resid_pre", ["a b c d " * 300]
    settings = dict(d_sae=8, steps=2, batch_tokens=16, seed=0)
    fill_training_store(tmp_path / "store", bundled_model, hook, texts, progress=False, **settings)
    by_path, _ = train_sae(bundled_model, hook, texts, store=str(tmp_path / "store"),
                           progress=False, **settings)  # fmt: skip
    opened = ActivationStore(tmp_path / "store")
    by_store, _ = train_sae(bundled_model, hook, texts, store=opened, progress=False, **settings)
    for name, value in by_store.state_dict().items():
        assert torch.equal(by_path.state_dict()[name], value), name
