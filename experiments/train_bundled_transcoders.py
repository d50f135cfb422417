"""Train the transcoder set that `interp` ships ("tiny-induction-transcoders"): one per-layer
transcoder on every MLP of the bundled model (``blocks.L.mlp.hook_in`` -> ``mlp.hook_out``).

Run:  python experiments/train_bundled_transcoders.py [--out DIR] [--seed 0] [--steps N] [--smoke]

It calls ``interp.train_transcoder`` on the bundled model's own training mix (standard-library
source and ``a + a`` repeats of random tokens, texts=None), on one CPU thread with
deterministic algorithms: the same seed gives byte-identical weights. Outputs, in --out:
``config.yaml`` and ``layer_{l}.safetensors`` (circuit-tracer's format), ``training_log.csv``
(the report's history) and ``TRAINING.json`` (settings, wall time and the held-out figures
per layer: FVU, L0, dead features).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from interp.models.loading import load_model  # noqa: E402
from interp.transcoders.train import EVAL_TOKENS, train_transcoder  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "interp" / "bundled" / "tiny-induction-transcoders"
MODEL = "tiny-induction"


@dataclasses.dataclass(frozen=True)
class TranscoderConfig:
    seed: int = 0
    d_tc: int = 512  # 2x d_mlp; 2 x 512 x 64 float32 weights per layer: 262 KB on disk
    kind: str = "per-layer"
    activation: str = "topk"  # a fixed L0, as the bundled SAE (whose topk beat L1 there)
    k: int = 16
    steps: int = 2000
    batch_tokens: int = 1024
    lr: float = 1e-3
    threads: int = 1  # fixed for reproducibility (and polite on a shared 2-core machine)


SMOKE = dict(steps=40, d_tc=64, k=4, batch_tokens=256)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="transcoder folder")
    parser.add_argument("--seed", type=int, default=TranscoderConfig.seed)
    parser.add_argument("--steps", type=int, default=None, help=f"default {TranscoderConfig.steps}")
    parser.add_argument("--smoke", action="store_true", help="a run of a few seconds")
    args = parser.parse_args(argv)
    overrides = dict(SMOKE) if args.smoke else {}
    if args.steps is not None:
        overrides["steps"] = args.steps
    cfg = TranscoderConfig(seed=args.seed, **overrides)

    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    cpu0 = time.process_time()
    model = load_model(MODEL, device="cpu")
    tc, report = train_transcoder(
        model,
        d_tc=cfg.d_tc,
        kind=cfg.kind,
        activation=cfg.activation,
        k=cfg.k,
        steps=cfg.steps,
        batch_tokens=cfg.batch_tokens,
        lr=cfg.lr,
        seed=cfg.seed,
        name=args.out.name,
        out=args.out,
    )
    cpu_s = time.process_time() - cpu0
    for path in args.out.iterdir():
        path.chmod(0o644)  # safetensors saves owner-only; this is package data
    report.history.to_csv(args.out / "training_log.csv", index=False, float_format="%.5g")
    figures = report.figures.round({"fvu": 4, "l0": 3, "dead_fraction": 4})
    meta = {
        "name": args.out.name,
        "model": MODEL,
        "hooks": "blocks.L.mlp.hook_in -> blocks.L.mlp.hook_out",
        "config": dataclasses.asdict(cfg),
        "train_wall_seconds": round(report.seconds, 1),
        "train_cpu_seconds": round(cpu_s, 1),
        "machine": f"{platform.machine()}, torch {torch.__version__}, {cfg.threads} threads",
        "python_stdlib": f"Python {platform.python_version()}",
        "eval_tokens": EVAL_TOKENS,
        "figures": figures.to_dict(orient="records"),
    }
    (args.out / "TRAINING.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"trained {report.steps} steps ({report.tokens} tokens) in {report.seconds:.0f} s")
    print(figures.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
