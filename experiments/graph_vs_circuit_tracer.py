"""interp's attribution graph against circuit-tracer 0.5.0's on the same model, transcoders and
tokens: same features, same logits, the entries, the scores and the pruned nodes and edges.

circuit-tracer needs TransformerLens < 4, so this runs in two environments:

    python experiments/graph_vs_circuit_tracer.py write DIR [--kind cross-layer]  # interp's
        [--positions 64 --d-tc 256 --input-hook ln2.hook_normalized] [--cap 1000]
    python experiments/graph_vs_circuit_tracer.py compare DIR                     # c.-tracer's

``write`` saves a tiny random GPT-2 (tests/zoo.py), a random transcoder folder and interp's graph
into DIR; ``compare`` loads the same checkpoint into circuit-tracer's
``TransformerLensReplacementModel`` (weights by TransformerLens 3's ``convert_gpt2_weights``),
runs its ``attribute``, ``prune_graph`` and ``compute_graph_scores`` and prints the comparison.
circuit-tracer has error nodes at position 0 (always zero); they are dropped before comparing.
``--cap`` builds both graphs under ``max_feature_nodes`` (features ranked by influence in rounds
of 4 x 64), so that the same features say the two rankings chose alike.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

TOKENS = [0, 5, 17, 33, 99, 12, 7, 5, 17, 40, 41, 42]


def _tokens(out: Path) -> list[int]:
    """The case's tokens: TOKENS, or ``n_pos`` seeded ones (``write --positions``)."""
    path = out / "tokens.pt"
    return torch.load(path).tolist() if path.exists() else TOKENS


def write(
    out: Path, kind: str, n_pos: int | None = None, d_tc: int = 64, hook: str = "mlp.hook_in",
    cap: int | None = None,
) -> None:  # fmt: skip
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from interp import attribution_graph, load_model
    from tests.transcoder_folders import random_transcoders, write_raw_folder
    from tests.zoo import make_zoo_checkpoint

    model = load_model(make_zoo_checkpoint(out / "model", "gpt2"), device="cpu")
    tc = random_transcoders(
        model, kind=kind, d_tc=d_tc, seed=1, skip=kind == "per-layer", input_hook=hook
    )
    write_raw_folder(out / "transcoders", tc)
    if n_pos is not None:
        gen = torch.Generator().manual_seed(0)
        torch.save(
            torch.cat(
                [
                    torch.zeros(1, dtype=torch.long),
                    torch.randint(1, 290, (n_pos - 1,), generator=gen),
                ]
            ),
            out / "tokens.pt",
        )
    attribution_graph(model, torch.tensor(_tokens(out))[:4], tc)  # warm up
    start = time.perf_counter()
    g = attribution_graph(model, torch.tensor(_tokens(out)), tc, max_feature_nodes=cap)
    print(f"interp: {g.info['active_features']} features, {time.perf_counter() - start:.2f} s")
    p = g.prune()
    torch.save(
        {
            "kind": kind,
            "input_hook": hook,
            "cap": cap,
            "adjacency": g.adjacency,
            "features": torch.tensor(
                g.nodes[g.nodes.kind == "feature"][["layer", "pos", "feature"]].to_numpy()
            ),
            "logit_ids": g.logit_token_ids,
            "scores": g.scores(),
            "kept": p.kept_nodes,
            "kept_edges": p.kept_edges,
        },
        out / "interp_graph.pt",
    )


def _model(out: Path, kind: str, hook: str):
    from circuit_tracer.replacement_model.replacement_model_transformerlens import (
        TransformerLensReplacementModel,
    )
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    hf = AutoModelForCausalLM.from_pretrained(out / "model").eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer, d_model=c.n_embd, d_head=c.n_embd // c.n_head, n_heads=c.n_head,
        d_mlp=4 * c.n_embd, d_vocab=c.vocab_size, n_ctx=c.n_positions, act_fn="gelu_new",
        normalization_type="LN", eps=c.layer_norm_epsilon, model_name="zoo-gpt2", device="cpu",
    )  # fmt: skip
    tok = PreTrainedTokenizerFast(tokenizer_file=str(out / "model" / "tokenizer.json"))
    tok.save_pretrained(out / "tokenizer")  # TransformerLens needs name_or_path
    tok = PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")
    model = TransformerLensReplacementModel(cfg, tokenizer=tok)
    model.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    folder = out / "transcoders"
    # TransformerLens 3 records ln2.hook_normalized before the norm's weight, as the bridge does
    hooks = dict(feature_input_hook=hook, feature_output_hook="mlp.hook_out")
    if kind == "per-layer":
        from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set

        paths = {i: str(folder / f"layer_{i}.safetensors") for i in range(c.n_layer)}
        tcs = load_transcoder_set(paths, scan="x", device=torch.device("cpu"), dtype=torch.float32,
                                  lazy_encoder=False, lazy_decoder=False, **hooks)  # fmt: skip
    else:
        from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

        tcs = load_clt(str(folder), scan="x", device=torch.device("cpu"), dtype=torch.float32,
                       lazy_decoder=False, **hooks)  # fmt: skip
    model._configure_replacement_model(tcs)
    return model, c.n_layer


def compare(out: Path) -> None:
    from circuit_tracer.attribution.attribute import attribute
    from circuit_tracer.graph import compute_graph_scores, prune_graph

    ours = torch.load(out / "interp_graph.pt", weights_only=False)
    model, n_layers = _model(out, ours["kind"], ours.get("input_hook", "mlp.hook_in"))
    tokens = _tokens(out)
    attribute(torch.tensor(tokens[:4]), model, batch_size=64)  # warm up
    start = time.perf_counter()
    cap = {} if ours.get("cap") is None else {"max_feature_nodes": ours["cap"]}
    g = attribute(torch.tensor(tokens), model, batch_size=64, **cap)
    print(f"circuit-tracer: {time.perf_counter() - start:.2f} s")
    n_pos, n_f = len(tokens), len(g.selected_features)
    keep = list(range(n_f))
    keep += [n_f + lay * n_pos + p for lay in range(n_layers) for p in range(1, n_pos)]
    keep += list(range(n_f + n_layers * n_pos, g.adjacency_matrix.shape[0]))
    A = g.adjacency_matrix[keep][:, keep]
    same_features = torch.equal(g.active_features[g.selected_features].cpu(), ours["features"])
    print(
        f"kind {ours['kind']}: {n_f} features, {A.shape[0]} nodes "
        f"(interp {ours['adjacency'].shape[0]})"
    )
    print(
        "same features:",
        same_features,
        "| same logits:",
        torch.equal(g.logit_token_ids, ours["logit_ids"]),
    )
    diff = (A - ours["adjacency"]).abs().max().item()
    print(f"max |entry difference| {diff:.3g} (max |entry| {A.abs().max().item():.3g})")
    print("scores circuit-tracer", compute_graph_scores(g), "interp", ours["scores"])
    pruned = prune_graph(g)
    kept = torch.nonzero(pruned.node_mask[keep]).flatten()
    edges = pruned.edge_mask[keep][:, keep][kept][:, kept]
    print("same kept nodes:", torch.equal(kept, ours["kept"]), "| same kept edges:",
          torch.equal(edges, ours["kept_edges"]), int(edges.sum()))  # fmt: skip
    theirs_scores = dict(zip(("replacement", "completeness"), compute_graph_scores(g), strict=True))
    metrics = {
        "kind": ours["kind"], "input_hook": ours.get("input_hook", "mlp.hook_in"),
        "features": n_f, "nodes": A.shape[0], "interp_nodes": ours["adjacency"].shape[0],
        "same_features": same_features,
        "same_logits": torch.equal(g.logit_token_ids, ours["logit_ids"]),
        "entry_diff": diff, "largest_entry": A.abs().max().item(),
        "score_diff": max(abs(theirs_scores[k] - ours["scores"][k]) for k in theirs_scores),
        "same_kept_nodes": torch.equal(kept, ours["kept"]),
        "same_kept_edges": torch.equal(edges, ours["kept_edges"]),
        "kept_edges": int(edges.sum()),
    }  # fmt: skip
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))


if __name__ == "__main__":
    torch.set_num_threads(1)  # the same for both; the figures in docs/graphs.md are on one thread
    mode, where = sys.argv[1], Path(sys.argv[2])
    if mode == "write":
        opts = dict(zip(sys.argv[3::2], sys.argv[4::2], strict=False))
        n_pos = int(opts["--positions"]) if "--positions" in opts else None
        kind, d_tc = opts.get("--kind", "per-layer"), int(opts.get("--d-tc", 64))
        cap = int(opts["--cap"]) if "--cap" in opts else None
        write(where, kind, n_pos, d_tc, opts.get("--input-hook", "mlp.hook_in"), cap)
    else:
        compare(where)
