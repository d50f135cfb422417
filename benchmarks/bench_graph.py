"""Attribution graphs on a GPT-2-small-shaped model (12 layers, 12 heads, d_model 768, a small
vocabulary) with a 3,072-wide ReLU transcoder per layer (~1% of features active), at 16, 64 and
256 positions (the longer ones capped by ``max_feature_nodes``): interp against circuit-tracer
0.5.0 on the same checkpoint, transcoders and tokens.

circuit-tracer needs TransformerLens < 4, so the benchmark runs in two environments:

    python benchmarks/bench_graph.py interp DIR [--positions 16,64,256] [--cap 7500] [--device cuda]
        [--layers 12] [--max-bytes 3GB] [--threads 1] [--batch 64]
    /path/to/circuit-tracer-venv/bin/python benchmarks/bench_graph.py circuit-tracer DIR
        [--threads 1] [--batch 64]

``interp`` writes the checkpoint (an HF GPT-2 folder with its tokenizer), the transcoders (a
circuit-tracer folder) and each case's tokens into DIR, times ``interp.attribution_graph`` and
saves what it found (``interp.pt``: features, logits, scores, seconds, the full adjacency of the
shortest case). ``circuit-tracer`` loads the same files into circuit-tracer's
``TransformerLensReplacementModel`` (experiments/graph_vs_circuit_tracer.py's loader), times
its ``attribute`` with the same batch size and cap, and prints both side by side: seconds, the
same features and logits, the largest entry difference and the scores. Run them one after the
other on the same machine (the figures are side by side only then). circuit-tracer with a
smaller ``--batch`` than interp was asked for ranks in the same rounds (its
``update_interval`` is 4 x interp's batch / its own), so both keep the same features.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
D_TC = 3072  # GPT-2 small's d_mlp: circuit-tracer's published GPT-2 transcoders' width
ACTIVE = 0.01  # share of features active on a typical token (b_enc sets it)
BATCH = 64  # targets per backward pass, both libraries
SEED = 0
THREADS = 0  # torch's threads, both libraries (--threads; 0: torch's default)


def _transcoders(model):
    """Per-layer ReLU transcoders whose pre-activations are ~N(-2.33, 1): ~1% active."""
    from interp.transcoders.transcoder import TranscoderSet

    gen = torch.Generator().manual_seed(SEED)
    n, d = int(model.cfg.n_layers), int(model.cfg.d_model)
    z = torch.distributions.Normal(0, 1).icdf(torch.tensor(1 - ACTIVE)).item()
    return TranscoderSet(
        [torch.randn(D_TC, d, generator=gen) / d**0.5 for _ in range(n)],
        [torch.full((D_TC,), -z) for _ in range(n)],
        [torch.randn(D_TC, d, generator=gen) / D_TC**0.5 for _ in range(n)],
        [torch.randn(d, generator=gen) * 0.1 for _ in range(n)],
        name="bench-gpt2-small-relu",
    )


def run_interp(
    out: Path,
    positions: list[int],
    cap: int,
    device: str = "cpu",
    n_layers: int = 12,
    max_bytes: str | None = None,
) -> None:
    sys.path.insert(0, str(ROOT))
    from interp import attribution_graph, load_model
    from tests.checkpoints import make_checkpoint
    from tests.transcoder_folders import write_raw_folder

    torch.set_num_threads(THREADS or max(1, torch.get_num_threads()))
    model_dir = make_checkpoint(
        out / "model", arch="gpt2", n_layers=n_layers, n_heads=12, d_model=768,
        n_ctx=max(positions), vocab_size=1000,
    )  # fmt: skip
    model = load_model(model_dir, device="cpu")
    tc = _transcoders(model)
    write_raw_folder(out / "transcoders", tc)
    if device != "cpu":  # the same checkpoint and transcoders, timed on another device
        model, tc = load_model(model_dir, device=device), tc.to(device)
    attribution_graph(model, torch.tensor([0, 5, 9, 11]), tc, batch_size=BATCH)  # warm up
    results = []
    for n_pos in positions:
        gen = torch.Generator().manual_seed(n_pos)
        tokens = torch.cat(
            [torch.zeros(1, dtype=torch.long), torch.randint(1, 400, (n_pos - 1,), generator=gen)]
        )
        limit = None if n_pos <= 16 else cap
        _sync(device)
        before = _rss()
        start, cpu = time.perf_counter(), time.process_time()
        g = attribution_graph(
            model, tokens, tc, max_feature_nodes=limit, batch_size=BATCH, max_bytes=max_bytes
        )
        _sync(device)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        feats = g.nodes[g.nodes.kind == "feature"][["layer", "pos", "feature"]].to_numpy()
        results.append(
            {
                "n_pos": n_pos,
                "tokens": tokens,
                "cap": limit,
                "batch": BATCH,  # asked: interp ranks features in rounds of 4 x this
                "seconds": seconds,
                "cpu_seconds": cpu,
                "active": g.info["active_features"],
                "features": torch.tensor(feats),
                "logit_ids": g.logit_token_ids,
                "scores": g.scores(),
                "adjacency": g.adjacency if n_pos == min(positions) else None,
                "logit_rows": g.adjacency[-len(g.logit_token_ids) :],
            }
        )
        print(
            f"interp {n_pos} positions: {g.info['active_features']} active features, "
            f"{len(feats)} kept, {len(g.nodes)} nodes, {seconds:.1f} s ({cpu:.1f} s CPU), "
            f"batch {g.info['batch_size']}, peak RSS {_rss('VmHWM') / 2**30:.2f} GiB, "
            f"{(_rss('VmHWM') - before) / 2**30:.2f} GiB over the {before / 2**30:.2f} GiB "
            f"before the call (estimate {g.info['estimated_bytes'] / 2**30:.2f} GiB)",
            flush=True,
        )
    torch.save(results, out / "interp.pt")


def _rss(field: str = "VmRSS") -> int:
    """The process's resident size (``VmHWM``: its peak, reset by ``_rss()``'s caller before
    each case through ``/proc/self/clear_refs``), in bytes; 0 where /proc is absent."""
    status = Path("/proc/self/status")
    if not status.exists():
        return 0
    if field == "VmRSS":
        Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
    for line in status.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_circuit_tracer(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "experiments"))
    from circuit_tracer.attribution.attribute import attribute
    from circuit_tracer.graph import compute_graph_scores
    from graph_vs_circuit_tracer import _model

    if THREADS:
        torch.set_num_threads(THREADS)
    ours = torch.load(out / "interp.pt", weights_only=False)
    model, n_layers = _model(out, "per-layer", "mlp.hook_in")
    attribute(torch.tensor([0, 5, 9, 11]), model, batch_size=BATCH)  # warm up
    for case in ours:
        tokens, n_pos = case["tokens"], case["n_pos"]
        start, cpu = time.perf_counter(), time.process_time()
        # circuit-tracer's rounds are update_interval x its batch: the same rounds as interp's
        # (4 x the batch interp was asked for), so a smaller batch here keeps the same features
        rounds = max(1, 4 * case.get("batch", 64) // BATCH)
        g = attribute(
            tokens, model, batch_size=BATCH, max_feature_nodes=case["cap"], update_interval=rounds
        )
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        n_f = len(g.selected_features)
        keep = list(range(n_f))
        keep += [n_f + lay * n_pos + p for lay in range(n_layers) for p in range(1, n_pos)]
        keep += list(range(n_f + n_layers * n_pos, g.adjacency_matrix.shape[0]))
        A = g.adjacency_matrix[keep][:, keep]
        theirs = g.active_features[g.selected_features].cpu()
        same = {tuple(r) for r in theirs.tolist()} == {tuple(r) for r in case["features"].tolist()}
        n_logits = len(g.logit_token_ids)
        if case["adjacency"] is not None and same:
            diff = (A - case["adjacency"]).abs().max().item()
        else:  # the logit rows (every column in the same order when the features are the same)
            diff = (A[-n_logits:] - case["logit_rows"]).abs().max().item() if same else float("nan")
        print(
            f"{n_pos} positions (cap {case['cap']}): interp {case['seconds']:.1f} s "
            f"({case['cpu_seconds']:.1f} s CPU), circuit-tracer {seconds:.1f} s ({cpu:.1f} s "
            f"CPU); CPU ratio {cpu / case['cpu_seconds']:.2f} (interp / circuit-tracer "
            f"{case['cpu_seconds'] / cpu:.2f}); "
            f"{n_f} features, same features {same}, same logits "
            f"{torch.equal(g.logit_token_ids.cpu(), case['logit_ids'])}, max |entry difference| "
            f"{diff:.3g} (max |entry| {A.abs().max().item():.3g}); scores circuit-tracer "
            f"{compute_graph_scores(g)}, interp {case['scores']}",
            flush=True,
        )


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("interp", "circuit-tracer"):
        print(__doc__)  # --help, or a mode or folder missing: the usage
        sys.exit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    mode, where = sys.argv[1], Path(sys.argv[2])
    opts = dict(zip(sys.argv[3::2], sys.argv[4::2], strict=False))
    THREADS = int(opts.get("--threads", 0))  # one thread: CPU seconds that load inflates less
    BATCH = int(opts.get("--batch", BATCH))  # smaller where a library's batch does not fit
    if mode == "interp":
        where.mkdir(parents=True, exist_ok=True)
        positions = [int(p) for p in opts.get("--positions", "16,64,256").split(",")]
        run_interp(
            where,
            positions,
            int(opts.get("--cap", 7500)),
            opts.get("--device", "cpu"),
            int(opts.get("--layers", 12)),
            opts.get("--max-bytes"),
        )
    else:
        run_circuit_tracer(where)
