"""The ``cfg.json`` SAELens 6 reads an interp :class:`~interp.saes.sae.SAE` back from.

Apart from :mod:`interp.saes.saelens` (the reader) so that ``SAE.save`` can write it without
the SAE module importing its reader.
"""

from __future__ import annotations

__all__ = ["SAELENS_ARCHITECTURES", "SAELENS_VERSION", "saelens_config"]

SAELENS_VERSION = "6.54.12"  # written into saved configs: the version whose formulas these are
# SAELens architecture -> (interp architecture, transcoder?, skip connection?)
SAELENS_ARCHITECTURES = {
    "standard": ("standard", False, False),
    "gated": ("gated", False, False),
    "jumprelu": ("jumprelu", False, False),
    "topk": ("topk", False, False),
    "batchtopk": ("batchtopk", False, False),  # a training checkpoint: SAELens's BatchTopK
    "transcoder": ("standard", True, False),
    "skip_transcoder": ("standard", True, True),
    "jumprelu_transcoder": ("jumprelu", True, False),
    "jumprelu_skip_transcoder": ("jumprelu", True, True),
}


def saelens_config(sae) -> dict:
    """The ``cfg.json`` SAELens 6 reads ``sae`` back from, every flag written out."""
    shape = (sae.architecture, sae.output_hook_name is not None, sae.W_skip is not None)
    arch = next((name for name, key in SAELENS_ARCHITECTURES.items() if key == shape), None)
    if arch is None:
        raise ValueError(
            f"SAELens has no {sae.architecture} "
            f"{'transcoder' if shape[1] else 'SAE'}{' with a skip connection' if shape[2] else ''}"
            f"; this {sae.source} SAE cannot be saved in SAELens's format"
        )
    if arch == "batchtopk" and getattr(sae, "topk_threshold", None) is None:
        raise ValueError(
            "SAELens's batchtopk SAE (BatchTopKTrainingSAE) cannot load without its "
            "topk_threshold, which this SAE does not have; it cannot be saved in SAELens's format"
        )
    meta = dict(sae.cfg.get("metadata") or {})
    meta |= {"hook_name": sae.hook_name, "hook_head_index": sae.hook_head_index,
             "sae_lens_version": SAELENS_VERSION}  # fmt: skip
    if sae.output_hook_name is not None:
        meta["hook_name_out"] = sae.output_hook_name
    dtype = str(sae.W_enc.dtype).removeprefix("torch.")
    cfg = {k: v for k, v in sae.cfg.items() if k not in ("hook_name", "hook_point", "k")}
    cfg |= {
        "architecture": arch, "d_in": sae.d_in, "d_sae": sae.d_sae, "dtype": dtype,
        "apply_b_dec_to_input": sae.apply_b_dec_to_input,
        "normalize_activations": sae.normalize_activations,
        "reshape_activations": sae.reshape_activations, "metadata": meta,
    }  # fmt: skip
    if sae.k is not None:
        cfg |= {"k": sae.k, "rescale_acts_by_decoder_norm": sae.rescale_acts_by_decoder_norm}
    if sae.output_hook_name is not None:
        cfg["d_out"] = sae.d_out
    return cfg
