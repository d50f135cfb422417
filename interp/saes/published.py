"""The SAE formats ``load_sae`` reads, and published repositories in each (no torch: the
``interp models`` command lists them without loading anything).

The repositories are those SAELens 6.54's ``pretrained_saes.yaml`` loads with the matching
converter (SAELens's own format, ``gemma_2``, ``dictionary_learning_1``), plus EleutherAI's
sparsify releases; ``load_sae("owner/repo/subfolder")`` fetches one SAE of them.
"""

from __future__ import annotations

__all__ = ["FORMATS", "PUBLISHED"]

# format -> the files that make a folder one (checked in this order: SAELens before sparsify)
FORMATS = {
    "saelens": ("cfg.json", "sae_weights.safetensors"),
    "sparsify": ("cfg.json", "sae.safetensors"),
    "dictionary_learning": ("ae.pt", "config.json"),
    "gemmascope": ("params.npz",),
}

# format -> (what interp computes, published repositories in it)
PUBLISHED = {
    "saelens": (
        "standard, gated, jumprelu, topk, batchtopk; SAELens transcoders",
        ("jbloom/GPT2-Small-SAEs-Reformatted", "jbloom/GPT2-Small-OAI-v5-32k-resid-post-SAEs "
         "(and the other OAI v5 32k/128k resid-mid, attn-out, mlp-out sets)",
         "neuronpedia/gpt2-small__res_*-ajt", "ctigges/pythia-70m-deduped__{res,att,mlp}-"
         "sm_processed", "jbloom/Gemma-2b-IT-Residual-Stream-SAEs",
         "chanind/gemma-2-2b-batch-topk-matryoshka-saes-w-32k-l0-40",
         "JoshEngels/Mistral-7B-Residual-Stream-SAEs", "Juliushanhanhan/llama-3-8b-it-res"),
    ),
    "sparsify": (
        "topk (SAEs, transcoders, skip connections)",
        ("EleutherAI/sae-llama-3-8b-32x", "EleutherAI/sae-llama-3-8b-32x-v2",
         "EleutherAI/sae-llama-3.1-8b-32x", "EleutherAI/sae-llama-3.1-8b-64x",
         "EleutherAI/sae-pythia-160m-32x"),
    ),
    "dictionary_learning": (
        "AutoEncoder, AutoEncoderNew, GatedAutoEncoder, JumpReluAutoEncoder, AutoEncoderTopK, "
        "BatchTopKSAE, MatryoshkaBatchTopKSAE",
        ("canrager/lm_sae", "adamkarvonen/saebench_gemma-2-2b_width-2pow12_date-0108",
         "canrager/saebench_gemma-2-2b_width-2pow14_date-1109",
         "andyrdt/saes-llama-3.1-8b-instruct", "andyrdt/saes-qwen2.5-7b-instruct"),
    ),
    "gemmascope": (
        "jumprelu (residual stream, MLP out, attention hook_z)",
        ("google/gemma-scope-2b-pt-res", "google/gemma-scope-2b-pt-mlp",
         "google/gemma-scope-2b-pt-att", "google/gemma-scope-9b-pt-res",
         "google/gemma-scope-9b-pt-mlp", "google/gemma-scope-9b-pt-att",
         "google/gemma-scope-9b-it-res", "google/gemma-scope-27b-pt-res"),
    ),
}  # fmt: skip
