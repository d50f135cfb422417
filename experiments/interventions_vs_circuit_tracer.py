"""interp's feature_intervention against circuit-tracer 0.5.0's
``ReplacementModel.feature_intervention`` on the same checkpoint, transcoders, tokens and edits:
the logits and the feature activations, constrained to each layer range and propagating.

circuit-tracer needs TransformerLens < 4, so this runs in two environments:

    python experiments/interventions_vs_circuit_tracer.py write DIR   # interp's environment
    python experiments/interventions_vs_circuit_tracer.py compare DIR # circuit-tracer's

``write`` saves a random 3-layer GPT-2 (tests/zoo.py), a per-layer skip transcoder folder and a
cross-layer one, and interp's runs of every case; ``compare`` loads the same files into
circuit-tracer (experiments/graph_vs_circuit_tracer.py's loader), runs each case and prints the
largest differences. Position 0 is left out of the activations: circuit-tracer zeroes them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

TOKENS = [0, 5, 17, 33, 99, 12, 7, 5, 17, 40, 41, 42]
KINDS = ("per-layer", "cross-layer")
N_LAYERS = 3
# (constrained_layers, freeze_attention); None: no layer constrained (propagating)
CASES = [(None, False), (None, True), (range(0, 3), True), (range(1, 3), True),
         (range(0, 2), True), (range(1, 2), True)]  # fmt: skip


def _edits(acts: torch.Tensor, layers: range | None) -> list[tuple[int, int, int, float]]:
    """``(layer, pos, feature, value)``: the first allowed layer's most active feature at
    position 4 zeroed, and the last allowed layer's feature 3 at position 9 set to 2."""
    allowed = range(N_LAYERS) if layers is None else layers
    first, last = allowed[0], allowed[-1]
    return [(first, 4, int(acts[first, 4].argmax()), 0.0), (last, 9, 3, 2.0)]


def write(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from interp import FeatureEdit, feature_intervention, load_model, run_cached
    from tests.transcoder_folders import random_transcoders, write_raw_folder
    from tests.zoo import make_zoo_checkpoint

    model = load_model(make_zoo_checkpoint(out / "model", "gpt2", n_layer=N_LAYERS), device="cpu")
    tokens = torch.tensor(TOKENS)
    results = {}
    for kind in KINDS:
        tc = random_transcoders(model, kind=kind, d_tc=64, seed=1, skip=kind == "per-layer")
        write_raw_folder(out / kind, tc)
        clean = run_cached(model, tokens[None], transcoders=tc)
        acts = torch.stack([clean[f"blocks.{lay}.hook_transcoder_acts"][0] for lay in range(3)])
        for layers, freeze in CASES:
            edits = _edits(acts, layers)
            fe = [FeatureEdit(lay, f, p, value=v) for lay, p, f, v in edits]
            run = feature_intervention(
                model, tokens, tc, fe, constrained_layers=layers, freeze_attention=freeze
            )
            key = (kind, None if layers is None else tuple(layers), freeze)
            results[key] = {"edits": edits, "logits": run.logits, "acts": run.activations,
                            "clean": clean.logits[0]}  # fmt: skip
    torch.save(results, out / "interp_runs.pt")
    print(f"interp: {len(results)} runs written to {out}")


def compare(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from graph_vs_circuit_tracer import _model

    ours = torch.load(out / "interp_runs.pt", weights_only=False)
    worst, metrics = 0.0, []
    for kind in KINDS:
        (out / "transcoders").unlink(missing_ok=True)
        (out / "transcoders").symlink_to(out / kind)  # where _model reads them
        model, _ = _model(out, kind, "mlp.hook_in")
        for (k, layers, freeze), run in ours.items():
            if k != kind:
                continue
            logits, acts = model.feature_intervention(
                torch.tensor(TOKENS), run["edits"], freeze_attention=freeze,
                constrained_layers=None if layers is None else range(layers[0], layers[-1] + 1),
            )  # fmt: skip
            d_logit = (logits[0] - run["logits"]).abs().max().item()
            d_act = (acts[:, 1:] - run["acts"][:, 1:]).abs().max().item()
            moved = (run["logits"] - run["clean"]).abs().max().item()
            worst = max(worst, d_logit, d_act)
            metrics.append({"kind": kind, "constrained": layers, "freeze_attention": freeze,
                            "logit_diff": d_logit, "largest_logit": logits.abs().max().item(),
                            "act_diff": d_act, "largest_act": acts.abs().max().item(),
                            "moved": moved})  # fmt: skip
            print(f"{kind:11} constrained {str(layers):9} freeze_attention {freeze!s:5}: "
                  f"logits differ by {d_logit:.2g} (largest {logits.abs().max().item():.3g}), "
                  f"activations by {d_act:.2g} (largest {acts.abs().max().item():.3g}); "
                  f"the edits move the logits by up to {moved:.3g}")  # fmt: skip
    print(f"largest difference over every case: {worst:.2g}")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, where = sys.argv[1], Path(sys.argv[2])
    write(where) if mode == "write" else compare(where)
