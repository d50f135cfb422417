"""SAELens transcoders on ``blocks.L.ln2.hook_normalized`` -> ``blocks.L.hook_mlp_out`` (how
SAELens's published GPT-2 transcoders read and write) run by SAELens 6 on TransformerLens 3's
HookedTransformer against interp's splice on the TransformerBridge; and, on every zoo
architecture with a separate MLP norm, the bridge's ``ln2.hook_normalized`` against the
HookedTransformer's.

The HookedTransformer is loaded as SAELens loads it (``from_pretrained`` with its defaults
``fold_ln``, ``center_writing_weights``, ``center_unembed``): its ``ln2`` is then an ``LNPre``
(``RMSNormPre``) whose ``hook_normalized`` is what its MLP reads, the norm's weight folded into
``W_in``. The bridge is not folded; its ``ln2.hook_normalized`` is the same value before the
weight and bias. TransformerLens 3 and 4 live in different environments, so this runs three times:

    python experiments/transcoders_vs_saelens_normalized.py write DIR    # interp's Python
    python experiments/transcoders_vs_saelens_normalized.py saelens DIR  # sae-lens 6 + TL 3
    python experiments/transcoders_vs_saelens_normalized.py compare DIR  # interp's Python

``write`` saves tiny random zoo checkpoints (tests/zoo.py) under DIR (whose path must not name
llama or gemma: TransformerLens 3 reads a local model's architecture from its path when it does).
``saelens`` builds a ``transcoder`` and a ``jumprelu_skip_transcoder`` per GPT-2 layer with
SAELens's own classes (seeded random weights, thresholds of both signs), saves each with
``save_model`` and loads it back with ``SAE.load_from_disk``; then runs the replacement model:
at each layer the features are ``sae.encode`` of ``ln2.hook_normalized`` and ``hook_mlp_out`` is
replaced by ``sae.forward`` of it. ``compare`` loads the folders with ``load_transcoders``, runs
``run_cached(..., transcoders=tc, use_error_term=False)`` and prints the largest differences of
features, reconstructions and log-probabilities (the HookedTransformer's centred unembedding
moves each position's logits by a constant).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# a model folder's name must not contain llama or gemma (module docstring)
MODELS = {"gpt2": "m-gpt2", "llama": "m-lm", "qwen2": "m-qw", "gemma2": "m-g2", "mistral": "m-mi"}
SAE_ARCHS = ("transcoder", "jumprelu_skip_transcoder")
TOKENS = [0, 5, 17, 33, 99, 12, 7, 5, 17, 40, 41, 42, 250, 3, 8, 64]
D_SAE = 96


def write(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.zoo import make_zoo_checkpoint

    for arch, folder in MODELS.items():
        make_zoo_checkpoint(out / folder, arch)
    print(f"zoo checkpoints {', '.join(MODELS)} written to {out}")


def _sae(layer: int, arch: str, d_model: int):
    from sae_lens.saes.sae import SAE

    cfg = {"architecture": arch, "d_in": d_model, "d_sae": D_SAE, "d_out": d_model,
           "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": False,
           "metadata": {"hook_name": f"blocks.{layer}.ln2.hook_normalized",
                        "hook_name_out": f"blocks.{layer}.hook_mlp_out"}}  # fmt: skip
    sae = SAE.from_dict(cfg)
    g = torch.Generator().manual_seed(100 * SAE_ARCHS.index(arch) + layer)
    with torch.no_grad():
        for name, p in sae.named_parameters():
            scale = p.shape[0] ** -0.5 if p.ndim == 2 else 0.3  # thresholds of both signs
            p.copy_(torch.randn(p.shape, generator=g) * scale - (0.2 if name == "b_enc" else 0))
    return sae


def _tl3_folder(out: Path, folder: str) -> Path:
    """A copy of the checkpoint whose config.json has GPT-2's ``n_ctx`` (transformers 5 dropped
    it; TransformerLens 3 reads it)."""
    import json
    import shutil

    local = out / "tl3" / folder
    shutil.copytree(out / folder, local, dirs_exist_ok=True)
    config = json.loads((local / "config.json").read_text())
    if "n_positions" in config:
        config["n_ctx"] = config["n_positions"]
    (local / "config.json").write_text(json.dumps(config))
    return local


def _gemma2(hf):
    """The zoo's Gemma 2 in TransformerLens 3: its config for google/gemma-2-2b, resized, then
    loaded as ``from_pretrained`` does (``fold_ln``, centred writing weights and unembedding)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions.gemma import convert_gemma_weights

    c = hf.config
    cfg = HookedTransformerConfig(
        d_model=c.hidden_size, d_head=c.head_dim, n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size, n_layers=c.num_hidden_layers, n_ctx=c.max_position_embeddings,
        eps=c.rms_norm_eps, d_vocab=c.vocab_size, act_fn=c.hidden_activation,
        normalization_type="RMS", rotary_base=10000.0, positional_embedding_type="rotary",
        rotary_dim=c.head_dim, use_attn_scale=True, attn_scale=c.query_pre_attn_scalar**0.5,
        n_key_value_heads=c.num_key_value_heads, window_size=c.sliding_window,
        use_local_attn=True, attn_types=["local", "global"], attn_scores_soft_cap=50.0,
        output_logits_soft_cap=30.0, gated_mlp=True, final_rms=True,
        use_normalization_before_and_after=True, original_architecture="Gemma2ForCausalLM",
        device="cpu",
    )  # fmt: skip
    model = HookedTransformer(cfg)
    model.load_and_process_state_dict(convert_gemma_weights(hf, cfg), fold_ln=True)
    return model


def saelens(out: Path) -> None:
    from sae_lens.saes.sae import SAE
    from transformer_lens import HookedTransformer, loading_from_pretrained
    from transformers import AutoModelForCausalLM

    # TransformerLens 3 reads a local folder's config.json only once past its list of names
    loading_from_pretrained.get_official_model_name = lambda name: name
    tokens = torch.tensor([TOKENS])
    for arch, folder in MODELS.items():
        local = _tl3_folder(out, folder)
        hf = AutoModelForCausalLM.from_pretrained(local, dtype=torch.float32)
        if arch == "gemma2":  # TransformerLens 3 knows Gemma 2 by name only
            model = _gemma2(hf)
        else:
            model = HookedTransformer.from_pretrained(str(local), hf_model=hf, device="cpu")
        names = [f"blocks.{lay}.ln2.hook_normalized" for lay in range(model.cfg.n_layers)]
        _, cache = model.run_with_cache(tokens, names_filter=lambda n, names=names: n in names)
        saved = {n: cache[n][0].contiguous() for n in names}
        save_file(saved, str(out / f"tl3_normalized_{arch}.safetensors"))
        if arch != "gpt2":
            continue
        for sae_arch in SAE_ARCHS:
            saes = []
            for layer in range(model.cfg.n_layers):
                folder_l = out / "saelens" / sae_arch / f"layer_{layer}"
                _sae(layer, sae_arch, model.cfg.d_model).save_model(str(folder_l))
                saes.append(SAE.load_from_disk(str(folder_l)))
            got: dict[str, torch.Tensor] = {}

            def read(x, hook, got=got, saes=saes):
                layer = hook.layer()
                got[f"x_{layer}"] = x
                got[f"features_{layer}"] = saes[layer].encode(x)[0]

            def write_out(y, hook, got=got, saes=saes):
                layer = hook.layer()
                got[f"recon_{layer}"] = saes[layer](got[f"x_{layer}"])
                return got[f"recon_{layer}"]

            sites = (("ln2.hook_normalized", read), ("hook_mlp_out", write_out))
            hooks = [(f"blocks.{lay}.{site}", fn) for lay in range(model.cfg.n_layers)
                     for site, fn in sites]  # fmt: skip
            with torch.no_grad():
                logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
            result = {k: v[0].contiguous() if k.startswith("recon") else v.contiguous()
                      for k, v in got.items() if not k.startswith("x_")}  # fmt: skip
            result["logprobs"] = logits[0].log_softmax(-1).contiguous()
            save_file(result, str(out / f"saelens_{sae_arch}.safetensors"))
    print(f"TransformerLens 3 + SAELens: {', '.join(MODELS)} run, folders under {out / 'saelens'}")


def compare(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from interp import load_model, load_transcoders, run_cached

    tokens = torch.tensor([TOKENS])
    metrics: dict[str, list] = {"hooks": [], "transcoders": []}
    for arch, folder in MODELS.items():
        model = load_model(out / folder, device="cpu")
        ref = load_file(out / f"tl3_normalized_{arch}.safetensors")
        mlp_in = {n: n.replace("ln2.hook_normalized", "mlp.hook_in") for n in ref}
        run = run_cached(model, tokens, hooks=list(ref) + list(mlp_in.values()))
        diff = max((run[n][0] - ref[n]).abs().max().item() for n in ref)
        other = max((run[mlp_in[n]][0] - ref[n]).abs().max().item() for n in ref)
        size = max(ref[n].abs().max().item() for n in ref)
        print(f"{arch:8} ln2.hook_normalized: bridge vs HookedTransformer (fold_ln) differ by "
              f"{diff:.2g} (largest |value| {size:.3g}; the bridge's mlp.hook_in by "
              f"{other:.2g})")  # fmt: skip
        metrics["hooks"].append({"model": arch, "diff": diff, "largest": size,
                                 "mlp_hook_in_diff": other})  # fmt: skip
    model = load_model(out / MODELS["gpt2"], device="cpu")
    for sae_arch in SAE_ARCHS:
        tc = load_transcoders(out / "saelens" / sae_arch)
        ref = load_file(out / f"saelens_{sae_arch}.safetensors")
        outs = [tc.output_hook(lay) for lay in range(tc.n_layers)]
        run = run_cached(model, tokens, transcoders=tc, use_error_term=False, hooks=outs)
        d_feat = d_recon = largest = largest_f = 0.0
        active = []
        for layer in range(tc.n_layers):
            feats = run[f"blocks.{layer}.hook_transcoder_acts"][0]
            d_feat = max(d_feat, (feats - ref[f"features_{layer}"]).abs().max().item())
            d_recon = max(d_recon, (run[outs[layer]][0] - ref[f"recon_{layer}"]).abs().max().item())
            active.append(f"{(ref[f'features_{layer}'] > 0).float().mean().item():.2f}")
            largest = max(largest, ref[f"recon_{layer}"].abs().max().item())
            largest_f = max(largest_f, ref[f"features_{layer}"].abs().max().item())
        d_logp = (run.logits[0].log_softmax(-1) - ref["logprobs"]).abs().max().item()
        print(f"{sae_arch:25} {tc!r}\n{'':25} features differ by {d_feat:.2g}, reconstructions "
              f"by {d_recon:.2g}, log-probs by {d_logp:.2g}; active fraction per layer "
              f"{', '.join(active)}")  # fmt: skip
        metrics["transcoders"].append({
            "architecture": sae_arch, "feature_diff": d_feat, "largest_feature": largest_f,
            "recon_diff": d_recon,
            "largest_recon": largest, "logprob_diff": d_logp,
            "largest_logprob": ref["logprobs"].abs().max().item(),
        })  # fmt: skip
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, where = sys.argv[1], Path(sys.argv[2])
    {"write": write, "saelens": saelens, "compare": compare}[mode](where)
