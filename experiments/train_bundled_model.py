"""Train the small model that `interp` ships as its offline default ("tiny-induction").

Run:  python experiments/train_bundled_model.py [--out DIR] [--seed 0] [--steps N] [--smoke]

No machine here can download GPT-2, so the project trains its own model, on CPU, from
text every Python installation already has: the standard library's own ``.py`` source,
found at run time through `sysconfig`. Every step has two halves: stdlib text
(next-token prediction over random windows), and synthetic ``a + a`` sequences of
random ordinary tokens (with and without a leading BOS, repeat length drawn per batch,
4..80) where the repeated copy is scored (and the first copy with a small weight).

Architecture (why rotary): GPT-2-shaped models with learned absolute positions, trained
for minutes, learned shortcuts ("attend N back" heads, duplicate-token heads plus a
positional smear) instead of induction. With rotary positions, which enter only queries
and keys, a 2-layer 4-head model forms the textbook circuit: a previous-token head in
layer 0 and induction heads in layer 1 that K-compose with it.

Why the embeddings are tied for the first 1200 steps (then untied; the saved model is
an ordinary untied GPTNeoXForCausalLM): with a 2k vocabulary in 64 dimensions and
separate embedding and unembedding, the copying half of the circuit must be learned
token by token: the phase change came at ~1800 steps on synthetic data alone and not
within 1400-2500 steps mixed with text. With shared weights it comes at ~800-1000 steps.

Outputs, in --out: config.json, model.safetensors, tokenizer files, training_log.csv
(loss and per-head scores over steps) and TRAINING.json (settings, wall time and the
figures of experiments/measure_bundled_model.py measured on the saved checkpoint).
The phase-change figure (an SVG) goes to --figure.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# BPE training is multi-threaded; its merges are still deterministic, but stay polite
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from jaxtyping import Int  # noqa: E402
from measure_bundled_model import (  # noqa: E402
    format_report,
    half_losses,
    head_scores,
    measure,
)
from torch import Tensor  # noqa: E402
from tqdm import tqdm  # noqa: E402

from interp.dictionaries.data import repeated_random_tokens, stdlib_sources  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "interp" / "bundled" / "tiny-induction"
DEFAULT_FIGURE = REPO / "docs" / "img" / "bundled_model_training.svg"
EOT = "<|endoftext|>"


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 1800
    vocab_size: int = 2048  # BPE merges + 256 bytes + EOT; small keeps embed/unembed cheap
    max_text_chars: int = 12_000_000  # the whole filtered stdlib is ~11M characters
    d_model: int = 64
    n_layers: int = 2  # induction needs two: previous-token head, then induction head
    n_heads: int = 4
    d_mlp: int = 256
    init_range: float = 0.02  # std of every weight at init (HF's default is 0.02)
    n_ctx: int = 256  # rotary has no table; this only bounds what configs promise
    text_len: int = 128  # window length of text batches
    text_batch: int = 16
    synth_tokens: int = 2048  # per synthetic batch; the batch size follows the repeat length
    rep_len_min: int = 4
    rep_len_max: int = 80  # covers the detector's 10..60 with margin on both sides
    bos_prob: float = 0.5  # the detector uses [BOS]+a+a, NeoX users feed a+a
    first_copy_weight: float = 0.05  # see synthetic_loss
    # embedding and unembedding share one matrix until this step (see tie_embeddings)
    tie_until: int = 1200
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.01
    eval_every: int = 100
    eval_batch: int = 16
    # fixed for reproducibility; 1 because two OpenMP threads spin on a busy 2-core machine
    # (7-14x the CPU time per step)
    threads: int = 1

    def __post_init__(self) -> None:
        if self.n_layers < 2:
            raise ValueError(
                f"n_layers={self.n_layers}: an induction circuit needs at least 2 layers"
            )
        if 2 * self.rep_len_max + 1 > self.n_ctx or self.text_len > self.n_ctx:
            raise ValueError(
                f"sequences longer than n_ctx={self.n_ctx}; lower rep_len_max or text_len"
            )


# every stage once, at a quarter of the batch: the script's end-to-end check, not a model
SMOKE = dict(
    steps=30,
    tie_until=15,
    vocab_size=512,
    max_text_chars=300_000,
    eval_every=10,
    eval_batch=8,
    text_batch=4,
    synth_tokens=512,
)


def train_tokenizer(texts: list[str], vocab_size: int, n_ctx: int, out: Path):
    """Byte-level BPE (any string encodes), saved and reloaded as PreTrainedTokenizerFast.

    The reload matters: an in-memory PreTrainedTokenizerFast lacks name_or_path, which
    TransformerBridge reads.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],  # first, so its id is 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        unk_token=EOT,
        clean_up_tokenization_spaces=False,  # else decode(encode(" .")) loses the space
        model_max_length=n_ctx,
    )
    fast.save_pretrained(out)
    return PreTrainedTokenizerFast.from_pretrained(out)


def build_model(cfg: TrainConfig, tokenizer):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    eot = tokenizer.convert_tokens_to_ids(EOT)
    hf_cfg = GPTNeoXConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.d_model,
        num_attention_heads=cfg.n_heads,
        num_hidden_layers=cfg.n_layers,
        intermediate_size=cfg.d_mlp,
        max_position_embeddings=cfg.n_ctx,
        rotary_pct=1.0,  # every query/key dimension rotates: positions live only in QK
        use_parallel_residual=False,  # sequential blocks, like GPT-2: attn then MLP
        tie_word_embeddings=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        bos_token_id=eot,
        eos_token_id=eot,
        initializer_range=cfg.init_range,
    )
    hf_cfg._attn_implementation = "eager"  # output_attentions for the per-head log
    return GPTNeoXForCausalLM(hf_cfg)


class Batches:
    """Seeded batch source: text windows and synthetic repeats from one torch.Generator."""

    def __init__(
        self, cfg: TrainConfig, text_ids: Int[Tensor, " n_tokens"], d_vocab: int, bos_id: int
    ):
        self.cfg, self.text_ids, self.d_vocab, self.bos_id = cfg, text_ids, d_vocab, bos_id
        self.gen = torch.Generator().manual_seed(cfg.seed + 1)

    def text(self, batch: int) -> Int[Tensor, "batch pos"]:
        n = self.cfg.text_len
        starts = torch.randint(0, len(self.text_ids) - n, (batch,), generator=self.gen)
        return torch.stack([self.text_ids[s : s + n] for s in starts.tolist()])

    def synthetic(self) -> tuple[Int[Tensor, "batch pos"], int]:
        """(tokens, position where the second copy starts): [BOS] + a + a or a + a."""
        cfg = self.cfg
        rep_len = int(torch.randint(cfg.rep_len_min, cfg.rep_len_max + 1, (1,), generator=self.gen))
        has_bos = bool(torch.rand(1, generator=self.gen) < cfg.bos_prob)
        batch = max(8, cfg.synth_tokens // (2 * rep_len + 1))
        bos_id = self.bos_id if has_bos else None
        tokens = repeated_random_tokens(self.d_vocab, rep_len, batch, self.gen, bos_id=bos_id)
        return tokens, int(has_bos) + rep_len


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


@torch.no_grad()
def evaluate(
    model, cfg: TrainConfig, val_ids: Tensor, d_vocab: int, bos_id: int
) -> dict[str, float]:
    """Held-out text loss, repeated/first-half loss and per-head scores on fixed batches."""
    model.eval()
    gen = torch.Generator().manual_seed(12345)  # the same eval batches at every step
    row: dict[str, float] = {}
    ind_sum = prev_sum = 0.0
    firsts, seconds = [], []
    rep_lens = (10, 30, 60)
    for rep_len in rep_lens:
        tokens = repeated_random_tokens(d_vocab, rep_len, cfg.eval_batch, gen, bos_id=bos_id)
        out = model(tokens, output_attentions=True)
        scores = [head_scores(a, rep_len, True) for a in out.attentions]
        ind_sum = ind_sum + torch.stack([s[0] for s in scores])
        prev_sum = prev_sum + torch.stack([s[1] for s in scores])
        first, second = half_losses(out.logits, tokens, rep_len, True)
        firsts.append(first)
        seconds.append(second)
    n = cfg.text_len
    starts = torch.linspace(0, len(val_ids) - n - 1, cfg.eval_batch).long().tolist()
    text = torch.stack([val_ids[s : s + n] for s in starts])
    row["val_text_loss"] = model(text, labels=text).loss.item()
    row["loss_first_half"] = sum(firsts) / len(firsts)
    row["loss_repeated_half"] = sum(seconds) / len(seconds)
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            row[f"induction_{layer}.{head}"] = (ind_sum[layer, head] / len(rep_lens)).item()
            row[f"prev_token_{layer}.{head}"] = (prev_sum[layer, head] / len(rep_lens)).item()
    model.train()
    return row


def tie_embeddings(model) -> None:
    """Share one matrix between embedding and unembedding (for the first phase only).

    With separate matrices, copying a token (the induction head's OV circuit) must be
    learned token by token: 2k unembedding rows aligned with 2k embedding rows in 64
    dimensions. Shared, any OV close to a positive multiple of the identity copies every
    token at once. Measured: the phase change came at ~900 steps tied, against ~1800
    (synthetic data only) or not within 1400-2500 (mixed with text) untied.
    """
    model.get_output_embeddings().weight = model.get_input_embeddings().weight


def untie_embeddings(model, opt: torch.optim.Optimizer) -> None:
    """Give the unembedding its own copy of the shared matrix and its Adam state, so the
    text objective can specialise it; the model computes the same function at the switch."""
    shared = model.get_input_embeddings().weight
    own = torch.nn.Parameter(shared.detach().clone())
    model.get_output_embeddings().weight = own
    group = next(g for g in opt.param_groups if any(p is shared for p in g["params"]))
    opt.add_param_group({**{k: v for k, v in group.items() if k != "params"}, "params": [own]})
    opt.state[own] = {
        k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state.get(shared, {}).items()
    }


def synthetic_loss(
    model, tokens: Int[Tensor, "batch pos"], second: int, first_weight: float
) -> Tensor:
    """Loss on the repeated copy's predictable tokens (a[1:] given a[:-1]), plus
    first_weight times the same predictions on the first copy.

    The first copy is random: the best prediction there is "any ordinary token". A small
    weight on it keeps the model calibrated on text it has never seen (without it, the
    model confidently copies earlier tokens everywhere, ~16 nats on a random first half).
    The unpredictable a[0] of the second copy is never scored.
    """
    rep_len = tokens.shape[1] - second  # second = has_bos + rep_len
    first = second - rep_len
    hidden = model.gpt_neox(tokens).last_hidden_state[:, first:-1]  # [batch 2*rep_len-1 d_model]
    logits = model.get_output_embeddings()(hidden)
    targets = tokens[:, first + 1 :]
    repeated = F.cross_entropy(logits[:, rep_len:].flatten(0, 1), targets[:, rep_len:].flatten())
    if first_weight == 0:
        return repeated
    novel = F.cross_entropy(
        logits[:, : rep_len - 1].flatten(0, 1), targets[:, : rep_len - 1].flatten()
    )
    return repeated + first_weight * novel


def train(
    cfg: TrainConfig, out: Path, log_path: Path
) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Tokenizer, model, training loop; saves the checkpoint into out and the log (CSV,
    one row per evaluation, written as it goes) to log_path. Returns (log, timings)."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    # CPU kernels are already deterministic at a fixed thread count; filling every new
    # tensor with NaN (the default under deterministic mode) only costs time
    torch.utils.deterministic.fill_uninitialized_memory = False
    wall0, cpu0 = time.perf_counter(), time.process_time()
    out.mkdir(parents=True, exist_ok=True)

    texts = stdlib_sources(cfg.max_text_chars, cfg.seed)
    n_val = max(1, len(texts) // 50)  # whole files held out: no window overlaps training
    tokenizer = train_tokenizer(texts[n_val:], cfg.vocab_size, cfg.n_ctx, out)
    eot = tokenizer.convert_tokens_to_ids(EOT)

    def ids_of(chunk: list[str]) -> Tensor:
        # the backend encoder: whole files are far longer than the model's context
        encoded = tokenizer.backend_tokenizer.encode_batch(chunk, add_special_tokens=False)
        return torch.tensor([i for e in encoded for i in [*e.ids, eot]])

    train_ids, val_ids = ids_of(texts[n_val:]), ids_of(texts[:n_val])
    model = build_model(cfg, tokenizer)
    if cfg.tie_until > 0:
        tie_embeddings(model)
    d_vocab = model.config.vocab_size
    batches = Batches(cfg, train_ids, d_vocab, eot)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.98),
    )
    log: list[dict[str, float]] = []
    with log_path.open("w", newline="") as f:
        writer = None
        bar = tqdm(range(cfg.steps + 1), desc="train", unit="step")
        for step in bar:
            if step % cfg.eval_every == 0 or step == cfg.steps:
                row = {
                    "step": step,
                    "wall_s": time.perf_counter() - wall0,
                    "cpu_s": time.process_time() - cpu0,
                }
                row.update(evaluate(model, cfg, val_ids, d_vocab, eot))
                log.append(row)
                if writer is None:
                    writer = csv.DictWriter(f, fieldnames=list(row))
                    writer.writeheader()
                writer.writerow(
                    {k: (f"{v:.5g}" if isinstance(v, float) else v) for k, v in row.items()}
                )
                f.flush()  # readable while a long run goes on
                best = max(v for k, v in row.items() if k.startswith("induction_1."))
                bar.set_postfix(
                    text=f"{row['val_text_loss']:.2f}",
                    rep=f"{row['loss_repeated_half']:.2f}",
                    ind=f"{best:.2f}",
                )
            if step == cfg.steps:
                break
            if step == cfg.tie_until and cfg.tie_until > 0:
                untie_embeddings(model, opt)
            for group in opt.param_groups:
                group["lr"] = lr_at(step, cfg)
            text = batches.text(cfg.text_batch)
            tokens, second = batches.synthetic()
            loss = model(text, labels=text).loss + synthetic_loss(
                model, tokens, second, cfg.first_copy_weight
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

    if model.get_output_embeddings().weight is model.get_input_embeddings().weight:
        untie_embeddings(model, opt)  # the saved architecture is always untied
    timings = {"wall_s": time.perf_counter() - wall0, "cpu_s": time.process_time() - cpu0}
    model.save_pretrained(out, safe_serialization=True)
    (out / "model.safetensors").chmod(0o644)  # saved owner-only; it is package data
    return log, timings


def _el(tag: str, body: object = None, **attrs) -> str:
    """One SVG element; attribute names use _ for - (stroke_width -> stroke-width)."""
    attributes = " ".join(f'{k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f"<{tag} {attributes}/>" if body is None else f"<{tag} {attributes}>{body}</{tag}>"


def training_svg(log: list[dict[str, float]], title: str, untie_step: int | None = None) -> str:
    """A hand-written SVG of the phase change: repeated-half and held-out text loss (left
    axis), best layer-1 induction and layer-0 previous-token scores (right axis, 0..1),
    against step. No plotting dependency; a few KB."""
    w, h, left, right, top, bottom = 660, 360, 60, 60, 40, 50
    ph = h - top - bottom
    steps = [r["step"] for r in log]

    def best(r, prefix):
        return max(v for k, v in r.items() if k.startswith(prefix))

    series = [  # (values, axis, colour, dash, label)
        ([r["loss_repeated_half"] for r in log], "loss", "#1f77b4", "", "repeated-half loss"),
        ([r["val_text_loss"] for r in log], "loss", "#7f7f7f", "5,4", "held-out text loss"),
        ([best(r, "induction_1.") for r in log], "score", "#d62728", "", "best L1 induction score"),
        (
            [best(r, "prev_token_0.") for r in log],
            "score",
            "#ff7f0e",
            "2,3",
            "best L0 prev-token score",
        ),
    ]
    y_max = math.ceil(max(max(v) for v, axis, *_ in series if axis == "loss"))

    def sx(step: float) -> float:
        return left + (w - left - right) * step / max(steps)

    sy = {"loss": lambda v: top + ph * (1 - v / y_max), "score": lambda v: top + ph * (1 - v)}
    mid = top + ph / 2
    parts = [
        _el("rect", width=w, height=h, fill="white"),
        _el("text", title, x=w / 2, y=22, text_anchor="middle", font_size=14),
        _el("path", d=f"M{left},{top}V{h - bottom}H{w - right}V{top}", fill="none", stroke="black"),
        _el("text", "training step", x=w / 2, y=h - 12, text_anchor="middle"),
        _el(
            "text",
            "loss (nats)",
            transform=f"translate(16 {mid}) rotate(-90)",
            text_anchor="middle",
        ),
        _el(
            "text", "score", transform=f"translate({w - 14} {mid}) rotate(90)", text_anchor="middle"
        ),
    ]
    for i in range(5):
        step, loss, score = round(max(steps) * i / 4), y_max * i / 4, i / 4
        parts.append(
            _el("text", step, x=f"{sx(step):.1f}", y=h - bottom + 16, text_anchor="middle")
        )
        y_loss, y_score = sy["loss"](loss) + 4, sy["score"](score) + 4
        parts.append(_el("text", f"{loss:.1f}", x=left - 6, y=f"{y_loss:.1f}", text_anchor="end"))
        parts.append(_el("text", f"{score:.2f}", x=w - right + 6, y=f"{y_score:.1f}"))
    if untie_step is not None and 0 < untie_step < max(steps):
        x = f"{sx(untie_step):.1f}"
        line = dict(stroke="#999", stroke_dasharray="1,3")
        parts.append(_el("line", x1=x, y1=top, x2=x, y2=h - bottom, **line))
        parts.append(_el("text", "embeddings untied", x=float(x) + 4, y=top + 14, fill="#666"))
    for i, (values, axis, colour, dash, label) in enumerate(series):
        style = dict(stroke=colour, stroke_width=2, **({"stroke_dasharray": dash} if dash else {}))
        points = " ".join(
            f"{sx(s):.1f},{sy[axis](v):.1f}" for s, v in zip(steps, values, strict=True)
        )
        parts.append(_el("polyline", fill="none", points=points, **style))
        # legend: a right-hand band that the curves cross only before the phase change
        x, y = w - right - 200, top + 0.4 * ph + 16 * i
        parts.append(_el("line", x1=x, y1=y - 4, x2=x + 22, y2=y - 4, **style))
        parts.append(_el("text", label, x=x + 27, y=y))
    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}"'
    head += ' font-family="sans-serif" font-size="12">'
    return "\n".join([head, *parts, "</svg>"]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="checkpoint folder")
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--steps", type=int, default=None, help=f"default {TrainConfig.steps}")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny settings that run in well under a minute"
    )
    parser.add_argument(
        "--figure",
        type=Path,
        default=None,
        help=f"SVG path (default {DEFAULT_FIGURE.relative_to(REPO)}; with --smoke, inside --out)",
    )
    parser.add_argument(
        "--no-measure", action="store_true", help="skip measuring the saved checkpoint"
    )
    args = parser.parse_args(argv)

    overrides = dict(SMOKE) if args.smoke else {}
    if args.steps is not None:
        overrides["steps"] = args.steps
    cfg = TrainConfig(seed=args.seed, **overrides)
    figure = args.figure or (args.out / "training_curve.svg" if args.smoke else DEFAULT_FIGURE)

    log, timings = train(cfg, args.out, args.out / "training_log.csv")
    figure.parent.mkdir(parents=True, exist_ok=True)
    figure.write_text(
        training_svg(log, f"tiny-induction training (seed {cfg.seed})", cfg.tie_until)
    )
    print(
        f"trained {cfg.steps} steps in {timings['wall_s']:.0f} s wall,"
        f" {timings['cpu_s']:.0f} s CPU; checkpoint in {args.out}"
    )

    meta = {
        "name": "tiny-induction",
        "architecture": "GPTNeoXForCausalLM, rotary (rotary_pct=1.0), sequential residual",
        "config": dataclasses.asdict(cfg),
        "train_wall_seconds": round(timings["wall_s"], 1),
        "train_cpu_seconds": round(timings["cpu_s"], 1),
        "machine": f"{platform.machine()}, torch {torch.__version__}, {cfg.threads} threads",
        "python_stdlib": f"Python {platform.python_version()}",
        "final_log_row": log[-1],
    }
    if not args.no_measure:
        figures = measure(args.out, seed=0)
        print(format_report(figures))
        meta["measured"] = figures
    (args.out / "TRAINING.json").write_text(json.dumps(meta, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
