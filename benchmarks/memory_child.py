"""What the memory benchmarks' fresh processes share (bench_graph_memory.py,
bench_attention_memory.py): freed memory handed back at once, random ReLU transcoders with a
share of features active, the peak of one call (host VmHWM or CUDA's allocator), and running
a point in a child process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_at_once(threshold: int = 2**20) -> None:
    """glibc's ``M_MMAP_THRESHOLD`` fixed: freed tensors of ``threshold`` bytes or more go back
    to the system at once, so the resident size is the use (what interp does under
    ``max_bytes``: 1 MiB, an attribution graph ``interp.graphs.budget.FREED_AT``)."""
    import ctypes

    ctypes.CDLL("libc.so.6").mallopt(-3, int(threshold))


def random_transcoders(
    n: int, d: int, d_tc: int, kind: str, name: str, active: float = 0.01, gen=None
):
    """ReLU transcoders on ``n`` layers of width ``d``, each feature active on about ``active``
    of the positions of a unit-variance residual (thresholds from the normal quantile), drawn
    from ``gen`` (default: a generator seeded 0)."""
    import torch

    from interp.transcoders.transcoder import TranscoderSet

    gen = torch.Generator().manual_seed(0) if gen is None else gen
    z = torch.distributions.Normal(0, 1).icdf(torch.tensor(1 - active)).item()
    cross = kind == "cross-layer"
    W_dec = [
        torch.randn(d_tc, n - lay, d, generator=gen) / d_tc**0.5
        if cross
        else torch.randn(d_tc, d, generator=gen) / d_tc**0.5
        for lay in range(n)
    ]
    return TranscoderSet(
        [torch.randn(d_tc, d, generator=gen) / d**0.5 for _ in range(n)],
        [torch.full((d_tc,), -z) for _ in range(n)],
        W_dec,
        [torch.zeros(d) for _ in range(n)],
        kind=kind,
        name=name,
    )


def gpt2_graph_case(spec: dict, name: str, active: float = 0.01):
    """The model, per-layer transcoders and prompt of a graph bench's child: a random GPT-2
    checkpoint (``spec``'s layers, d_model, heads; written once into ``spec["dir"]``), random
    ReLU transcoders (``spec["d_tc"]`` wide, ``active`` of features firing) and ``spec["n_pos"]``
    tokens (BOS id 0, then seeded ids), on ``spec["device"]``."""
    import torch

    import interp
    from tests.checkpoints import make_checkpoint

    n, d, heads = spec["layers"], spec["d_model"], spec["heads"]
    folder = Path(spec["dir"]) / f"model{n}_{d}_{heads}"
    if not (folder / "config.json").exists():
        make_checkpoint(folder, arch="gpt2", n_layers=n, n_heads=heads, d_model=d,
                        n_ctx=2048, vocab_size=1000)  # fmt: skip
    model = interp.load_model(folder, device=spec["device"])
    gen = torch.Generator().manual_seed(0)
    tc = random_transcoders(n, d, spec["d_tc"], "per-layer", name, active, gen)
    tokens = torch.cat([torch.zeros(1, dtype=torch.long),
                        torch.randint(1, 400, (spec["n_pos"] - 1,), generator=gen)])  # fmt: skip
    return model, tc.to(spec["device"]), tokens


def _rss() -> dict[str, int]:
    lines = Path("/proc/self/status").read_text().splitlines()
    pairs = (line.split(":", 1) for line in lines)
    return {k: int(v.split()[0]) * 1024 for k, v in pairs if k in ("VmRSS", "VmHWM")}


class Peak:
    """The peak of what a call adds: on CUDA ``max_memory_allocated`` less what was allocated
    at :meth:`start`; on the host VmHWM (reset through ``/proc/self/clear_refs``) less the
    resident size at :meth:`start`."""

    def __init__(self, device: str) -> None:
        self.cuda = str(device).startswith("cuda")

    def start(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")
            self.before = _rss()["VmRSS"]

    def stop(self) -> int:
        import torch

        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.before
        return _rss()["VmHWM"] - self.before


def run_child(script: str, spec: dict) -> dict:
    """``python script --child SPEC`` in a fresh process (the caller's PYTHONPATH kept after
    the repository's); its ``RESULT {json}`` line."""
    rest = os.environ.get("PYTHONPATH")  # where the machine's own packages may come from
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *([rest] if rest else [])]))
    out = subprocess.run(
        [sys.executable, script, "--child", json.dumps(spec)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"point {spec} failed:\n{out.stderr[-3000:]}")
