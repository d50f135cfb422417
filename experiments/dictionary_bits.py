"""Every SAE, transcoder and attribution-graph output of this checkout, recorded to compare two
checkouts byte for byte (the dictionary core's refactors must leave every number as it was).

    python experiments/dictionary_bits.py record OUT.pt     # in each checkout (its PYTHONPATH)
    python experiments/dictionary_bits.py compare A.pt B.pt # exit 1 unless every byte agrees

It records 230 tensors: SAELens folders of every architecture and flag (normalisation, decoder-norm
scaling, transcoders with and without skip), sparsify, dictionary_learning and Gemma Scope
folders (features and outputs), the bundled SAE and transcoders spliced into the bundled model
(with and without the error term, with SAE and transcoder feature edits), random per-layer and
cross-layer transcoder sets of every activation (pre-activations, activations with negative
values through, features, decodes, skips, splices, a save and reload), SAELens transcoder folders
as a set, and an attribution graph's rows. Offline, CPU, about a minute.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def record() -> dict[str, torch.Tensor]:
    """Every output named above, by a name saying what it is."""
    from interp import load_model, load_sae, load_transcoders, run_cached
    from tests.sae_folders import (
        dictionary_learning_folder,
        gemmascope_folder,
        saelens_folder,
        sparsify_folder,
    )
    from tests.transcoder_folders import random_transcoders

    torch.manual_seed(0)

    out: dict[str, torch.Tensor] = {}
    tmp = Path(tempfile.mkdtemp())
    g = torch.Generator().manual_seed(1)
    x64 = torch.randn(3, 5, 64, generator=g) * 2
    x64[0, 0] *= 40  # big values, for layer_norm/constant_norm

    CASES = [
        ("standard", {}),
        ("standard", {"apply_b_dec_to_input": False}),
        ("gated", {}),
        ("jumprelu", {}),
        ("topk", {}),
        ("topk", {"rescale_acts_by_decoder_norm": True}),
        ("batchtopk", {}),
        ("batchtopk", {"k": 6.5}),
        ("standard", {"normalize_activations": "constant_norm_rescale"}),
        ("standard", {"normalize_activations": "layer_norm"}),
        ("jumprelu", {"normalize_activations": "layer_norm"}),
        (
            "topk",
            {
                "normalize_activations": "constant_norm_rescale",
                "rescale_acts_by_decoder_norm": True,
            },
        ),
        ("transcoder", {}),
        ("skip_transcoder", {}),
        ("jumprelu_transcoder", {}),
        ("jumprelu_skip_transcoder", {}),
    ]
    for i, (arch, flags) in enumerate(CASES):
        kw = {"d_out": 48, "hook": "blocks.1.ln2.hook_normalized"} if "transcoder" in arch else {}
        saelens_folder(tmp / f"s{i}", arch, flags=flags, **kw)
        sae = load_sae(tmp / f"s{i}")
        f = sae.encode(x64)
        out[f"saelens{i}.f"] = f
        out[f"saelens{i}.fwd"] = sae(x64)
        out[f"saelens{i}.dec"] = sae.decode(f, x64)
        if "transcoder" not in arch:
            new, acts = sae.splice(x64, use_error_term=False)
            out[f"saelens{i}.splice"] = new
            new, acts = sae.splice(x64, use_error_term=True)
            out[f"saelens{i}.splice_err"] = new

    for i, (kw) in enumerate([{}, {"transcode": True}, {"transcode": True, "skip": True}]):
        sparsify_folder(tmp / f"sp{i}", **kw)
        sae = load_sae(tmp / f"sp{i}" / "layers.1")
        out[f"sparsify{i}.f"] = sae.encode(x64)
        out[f"sparsify{i}.fwd"] = sae(x64)
    for cls in [
        "AutoEncoder",
        "AutoEncoderNew",
        "GatedAutoEncoder",
        "JumpReluAutoEncoder",
        "AutoEncoderTopK",
        "BatchTopKSAE",
        "MatryoshkaBatchTopKSAE",
    ]:
        dictionary_learning_folder(tmp / cls, cls)
        sae = load_sae(tmp / cls)
        out[f"dl.{cls}.f"] = sae.encode(x64)
        out[f"dl.{cls}.fwd"] = sae(x64)
    path, _ = gemmascope_folder(tmp / "gs")
    sae = load_sae(path)
    out["gs.f"] = sae.encode(x64)
    out["gs.fwd"] = sae(x64)

    model = load_model("tiny-induction")
    prompt = "x = len(self); y = len(args) + 1"
    bsae = load_sae("tiny-induction-sae")
    run = run_cached(model, prompt, saes=[bsae])
    out["bundled_sae.logits"] = run.logits
    out["bundled_sae.acts"] = run[f"{bsae.hook_name}.hook_sae_acts"]
    run = run_cached(model, prompt, saes=[bsae], use_error_term=False)
    out["bundled_sae.logits_noerr"] = run.logits
    from interp.saes.interventions import ablate_feature, patch_feature

    acts = out["bundled_sae.acts"]
    feat = int(acts[0, -1].argmax())
    out["sae_edit.ablate"] = run_cached(
        model, prompt, interventions=[ablate_feature(bsae, feat)]
    ).logits
    out["sae_edit.ablate_pos"] = run_cached(
        model, prompt, interventions=[ablate_feature(bsae, feat, pos=-1)]
    ).logits
    out["sae_edit.patch"] = run_cached(
        model, prompt, interventions=[patch_feature(bsae, feat, acts[..., feat] * 3, pos=-2)]
    ).logits

    btc = load_transcoders("tiny-induction-transcoders")
    run = run_cached(model, prompt, transcoders=btc)
    out["bundled_tc.logits"] = run.logits
    for layer in range(btc.n_layers):
        out[f"bundled_tc.acts{layer}"] = run[f"blocks.{layer}.hook_transcoder_acts"]
    from interp import FeatureEdit

    a0 = run["blocks.0.hook_transcoder_acts"][0]
    pos, f0 = (int(i) for i in torch.nonzero(a0[1:])[0])
    edits = [FeatureEdit(0, f0, pos + 1, value=0.0), FeatureEdit(1, 3, None, scale=2.0)]
    out["tc_edit.logits"] = run_cached(model, prompt, transcoders=btc, feature_edits=edits).logits
    out["tc_edit.noerr"] = run_cached(
        model, prompt, transcoders=btc, feature_edits=edits, use_error_term=False
    ).logits

    g = torch.Generator().manual_seed(2)
    xm = torch.randn(2, 7, int(model.cfg.d_model), generator=g) * 3
    for kind in ("per-layer", "cross-layer"):
        for act in ("relu", "jumprelu", "topk"):
            for skip in (False, True) if kind == "per-layer" else (False,):
                tc = random_transcoders(model, kind=kind, activation=act, skip=skip, d_tc=40)
                name = f"tc.{kind}.{act}.{skip}"
                accs = []
                for layer in range(tc.n_layers):
                    h = tc.pre_activations(xm, layer)
                    out[f"{name}.pre{layer}"] = h
                    out[f"{name}.act{layer}"] = tc.activate(h - 0.4, layer)  # negatives through
                    a = tc.encode(xm, layer)
                    accs.append(a)
                    out[f"{name}.enc{layer}"] = a
                    out[f"{name}.skip{layer}"] = tc.skip(xm, layer)
                for layer in range(tc.n_layers):
                    out[f"{name}.dec{layer}"] = tc.decode(
                        accs if kind == "cross-layer" else accs[layer], layer
                    )
                run = run_cached(model, prompt, transcoders=tc, use_error_term=False)
                out[f"{name}.splice_logits"] = run.logits
                tc.save(tmp / name)
                back = load_transcoders(tmp / name)
                out[f"{name}.reload_enc0"] = back.encode(xm, 0)

    # SAELens transcoder folders as a set (jumprelu thresholds, some negative)
    for arch in ("transcoder", "jumprelu_skip_transcoder"):
        folders = []
        for layer in range(2):
            p = tmp / f"set-{arch}" / f"l{layer}"
            saelens_folder(
                p,
                arch,
                d_in=64,
                d_sae=48,
                d_out=64,
                seed=layer,
                hook=f"blocks.{layer}.ln2.hook_normalized",
                metadata={"hook_name_out": f"blocks.{layer}.hook_mlp_out"},
            )
            folders.append(p)
        tc = load_transcoders(folders)
        for layer in range(2):
            out[f"slset.{arch}.enc{layer}"] = tc.encode(x64, layer)
            out[f"slset.{arch}.dec{layer}"] = tc.decode(tc.encode(x64, layer), layer) + tc.skip(
                x64, layer
            )

    # an attribution graph on the bundled model and transcoders
    from interp import attribution_graph

    graph = attribution_graph(model, prompt, btc)
    out["graph.rows"] = graph.rows
    out["graph.row_nodes"] = graph.row_nodes
    out["graph.logit_probabilities"] = graph.logit_probabilities
    for col in graph.nodes.columns:
        try:
            out[f"graph.nodes.{col}"] = torch.tensor(graph.nodes[col].to_numpy())
        except Exception:
            pass

    return {k: v.detach().clone() for k, v in out.items()}


def compare(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """One line per tensor whose bytes differ (or that only one side has)."""
    problems = [f"{k}: only on one side" for k in sorted(set(a) ^ set(b))]
    for k in sorted(set(a) & set(b)):
        x, y = a[k].contiguous(), b[k].contiguous()
        if x.shape != y.shape or x.dtype != y.dtype:
            problems.append(f"{k}: {tuple(x.shape)} {x.dtype} vs {tuple(y.shape)} {y.dtype}")
        elif not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
            diff = (x.double() - y.double()).abs().max() if x.is_floating_point() else "-"
            problems.append(f"{k}: bytes differ (values equal: {torch.equal(x, y)}, max {diff})")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "record":
        out = record()
        torch.save(out, argv[1])
        print(f"recorded {len(out)} tensors in {argv[1]}")  # noqa: T201
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        a, b = torch.load(argv[1]), torch.load(argv[2])
        problems = compare(a, b)
        print("\n".join(problems + [f"{len(a)} tensors compared, {len(problems)} differ"]))  # noqa: T201
        return 1 if problems else 0
    print(__doc__)  # noqa: T201
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
