"""interp's load_transcoders on SAELens transcoder folders against SAELens 6 itself: the
features and outputs of each layer, for SAELens's four transcoder architectures.

SAELens and interp live in different environments, so this runs twice:

    python experiments/transcoders_vs_saelens.py saelens DIR   # a Python with sae-lens 6
    python experiments/transcoders_vs_saelens.py interp DIR    # interp's

``saelens`` builds each architecture with SAELens's own classes (``SAE.from_dict``) for layers
0-2, fills it with seeded random numbers (thresholds of both signs), saves it with
``save_model`` into ``DIR/{arch}/layer_{l}``, loads it back with ``SAE.load_from_disk`` and
saves an input, its features (``encode``) and output (``forward``, the skip term included);
``interp`` loads ``DIR/{arch}`` with ``load_transcoders`` and prints the largest differences.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ARCHS = ("transcoder", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder")
N_LAYERS, D_MODEL, D_SAE, ROWS = 3, 64, 96, 512


def saelens(out: Path) -> None:
    from sae_lens.saes.sae import SAE

    for arch in ARCHS:
        for layer in range(N_LAYERS):
            cfg = {"architecture": arch, "d_in": D_MODEL, "d_sae": D_SAE, "d_out": D_MODEL,
                   "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": False,
                   "metadata": {"hook_name": f"blocks.{layer}.mlp.hook_in",
                                "hook_name_out": f"blocks.{layer}.hook_mlp_out"}}  # fmt: skip
            sae = SAE.from_dict(cfg)
            g = torch.Generator().manual_seed(100 * ARCHS.index(arch) + layer)
            with torch.no_grad():
                for _, p in sae.named_parameters():
                    scale = p.shape[0] ** -0.5 if p.ndim == 2 else 0.3  # thresholds of both signs
                    p.copy_(torch.randn(p.shape, generator=g) * scale)
            folder = out / arch / f"layer_{layer}"
            sae.save_model(str(folder))
            loaded = SAE.load_from_disk(str(folder))
            x = torch.randn(ROWS, D_MODEL, generator=g) * 1.5
            with torch.no_grad():
                saved = {"x": x, "features": loaded.encode(x), "out": loaded(x)}
            save_file(saved, str(out / arch / f"saelens_{layer}.safetensors"))
    print(f"SAELens: {len(ARCHS)} architectures x {N_LAYERS} layers written to {out}")


def interp(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from interp import load_transcoders

    worst, metrics = 0.0, []
    for arch in ARCHS:
        tc = load_transcoders(out / arch)
        d_feat = d_out = largest = 0.0
        active, same_active = [], True
        for layer in range(N_LAYERS):
            ref = load_file(out / arch / f"saelens_{layer}.safetensors")
            feats = tc.encode(ref["x"], layer)
            recon = tc.decode(feats, layer) + tc.skip(ref["x"], layer)
            d_feat = max(d_feat, (feats - ref["features"]).abs().max().item())
            d_out = max(d_out, (recon - ref["out"]).abs().max().item())
            same = torch.equal(feats > 0, ref["features"] > 0)
            same_active &= same
            largest = max(largest, ref["out"].abs().max().item())
            active.append(f"{(ref['features'] > 0).float().mean().item():.2f}{'' if same else '!'}")
        worst = max(worst, d_feat, d_out)
        metrics.append({"architecture": arch, "feature_diff": d_feat, "output_diff": d_out,
                        "same_active": same_active, "largest_output": largest})  # fmt: skip
        print(f"{arch:25} {tc!r}\n{'':25} features differ by {d_feat:.2g}, outputs by "
              f"{d_out:.2g}; active fraction per layer {', '.join(active)}")  # fmt: skip
    print(f"largest difference: {worst:.2g}")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, where = sys.argv[1], Path(sys.argv[2])
    saelens(where) if mode == "saelens" else interp(where)
