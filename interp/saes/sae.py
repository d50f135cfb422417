"""A sparse autoencoder (or transcoder) at one hook of a model, computed as SAELens 6 does.

With ``x`` the activation the SAE reads (one head's slice when ``hook_head_index`` is set,
the heads flattened into one vector when ``reshape_activations == "hook_z"``), the input is
``s = norm_in(x) - b_dec`` (``- b_dec`` only when ``apply_b_dec_to_input``), where
``norm_in`` is the identity, ``x * sqrt(d_in) / |x|`` (``constant_norm_rescale``) or
``(x - mean) / (std + 1e-5)`` (``layer_norm``, ``std`` unbiased). With ``h = s W_enc + b_enc``:

- ``standard``, ``jumprelu``, ``topk``, ``batchtopk``: ``f = act(h)``, the activation of
  :mod:`interp.dictionaries.activations` (``standard`` is ``relu``) with SAELens's ``floor``;
  for ``topk`` with ``rescale_acts_by_decoder_norm``, of ``h * |W_dec[j]|``;
- ``gated``: ``f = (s W_enc + b_gate > 0) * ReLU(s (W_enc * exp(r_mag)) + b_mag)``.

The reconstruction is ``norm_out(f W_dec + b_dec)`` (``f / |W_dec[j]|`` first when rescaled),
``norm_out`` undoing ``norm_in`` with the input's own statistics. A transcoder (an
``output_hook_name``) reads one hook and writes another: no ``norm_out``, and ``forward`` adds
``x W_skip^T`` when it has a skip connection. The maps are those of
:class:`interp.dictionaries.Dictionary`; this class adds the hook, the input normalisation and
gating. The tests transcribe each formula independently (tests/saes/test_sae_saelens.py);
benchmarks/bench_saes.py compares with SAELens itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from jaxtyping import Float
from torch import Tensor

from interp.dictionaries.core import Dictionary

__all__ = ["ARCHITECTURES", "NORMALIZATIONS", "SAE"]

ARCHITECTURES = ("standard", "gated", "jumprelu", "topk", "batchtopk")  # the encoders interp runs
NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")  # computed at run time
LAYER_NORM_EPS = 1e-5  # SAELens's run_time_activation_ln_in


class SAE(Dictionary, torch.nn.Module):
    """A sparse autoencoder at one hook of a model, SAELens conventions.

    Parameters as :class:`~interp.dictionaries.Dictionary`'s (``d_sae`` its ``d_dict``; a
    ``gated`` SAE has ``b_gate``, ``r_mag``, ``b_mag [d_sae]`` in place of ``b_enc``), where
    ``d_out == d_in`` except for transcoders. ``hook_name`` is a TransformerLens hook name
    such as ``"blocks.1.hook_resid_pre"``; ``cfg`` is the saved config as read (kept, written
    back by :meth:`save`); ``source`` says which library's folder it came from.
    """

    def __init__(
        self,
        W_enc: Float[Tensor, "d_in d_sae"],
        b_enc: Float[Tensor, " d_sae"] | None,
        W_dec: Float[Tensor, "d_sae d_out"],
        b_dec: Float[Tensor, " d_out"],
        *,
        architecture: str = "standard",
        hook_name: str,
        threshold: Float[Tensor, " d_sae"] | None = None,
        k: float | None = None,
        apply_b_dec_to_input: bool = False,
        rescale_acts_by_decoder_norm: bool = False,
        normalize_activations: str = "none",
        gate: dict[str, Tensor] | None = None,
        hook_head_index: int | None = None,
        reshape_activations: str = "none",
        output_hook_name: str | None = None,
        W_skip: Float[Tensor, "d_out d_in"] | None = None,
        cfg: dict | None = None,
        source: str = "saelens",
    ):
        torch.nn.Module.__init__(self)
        _check(architecture, normalize_activations, reshape_activations)
        d_in, d_sae = W_enc.shape
        if (architecture == "gated") != (gate is not None) or (architecture == "gated") == (
            b_enc is not None
        ):
            raise ValueError("a gated SAE has b_gate, r_mag, b_mag instead of b_enc; others b_enc")
        for name, tensor in (gate or {}).items():
            if tuple(tensor.shape) != (d_sae,):
                raise ValueError(f"SAE {name} has shape {tuple(tensor.shape)}, expected ({d_sae},)")
        if output_hook_name is None and W_dec.shape[-1] != d_in:
            raise ValueError(
                f"an SAE writes what it reads: W_dec's width {W_dec.shape[-1]} != d_in {d_in}"
            )
        if apply_b_dec_to_input and W_dec.shape[-1] != d_in:
            raise ValueError("apply_b_dec_to_input needs d_out == d_in")

        def param(t):
            return None if t is None else torch.nn.Parameter(t)

        activation = "relu" if architecture in ("standard", "gated") else architecture
        Dictionary.__init__(
            self, param(W_enc), param(b_enc), param(W_dec), param(b_dec), activation=activation,
            threshold=param(threshold), k=k, W_skip=param(W_skip), what="SAE", width="d_sae",
        )  # fmt: skip
        gates = ("b_gate", "r_mag", "b_mag")  # a gated SAE's; None for the others
        self.b_gate, self.r_mag, self.b_mag = (param((gate or {}).get(n)) for n in gates)
        # SAELens's batchtopk training state (not used to encode), kept so that save writes it
        self.register_buffer("topk_threshold", None)
        self.architecture, self.hook_name = architecture, hook_name
        self.apply_b_dec_to_input = bool(apply_b_dec_to_input)
        self.rescale_acts_by_decoder_norm = bool(rescale_acts_by_decoder_norm)
        self.normalize_activations = normalize_activations
        self.hook_head_index = hook_head_index
        self.reshape_activations = reshape_activations
        self.output_hook_name = output_hook_name
        self.d_sae = self.d_dict
        self.cfg, self.source = dict(cfg or {}), source

    def __repr__(self) -> str:
        extra = f", k={self.k}" if self.k is not None else ""
        extra += f", writes {self.output_hook_name}" if self.output_hook_name else ""
        return (
            f"SAE({self.architecture}, {self.hook_name}, d_in={self.d_in}, "
            f"d_sae={self.d_sae}{extra})"
        )

    def _flat(self, x: Tensor) -> Tensor:
        x = x.to(self.W_enc.dtype)
        return x.flatten(-2) if self.reshape_activations == "hook_z" else x

    def _stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The scale (and shift) ``norm_in`` applies to ``x`` (already flat)."""
        if self.normalize_activations == "constant_norm_rescale":
            return (self.d_in**0.5) / x.norm(dim=-1, keepdim=True), torch.zeros(())
        mean = x.mean(dim=-1, keepdim=True)
        return (x - mean).std(dim=-1, keepdim=True), mean

    def sae_input(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_in"]:
        """What the encoder multiplies: ``norm_in(x) - b_dec`` (module docstring)."""
        x = self._flat(x)
        if self.normalize_activations != "none":
            scale, mean = self._stats(x)
            rescale = self.normalize_activations == "constant_norm_rescale"
            x = x * scale if rescale else (x - mean) / (scale + LAYER_NORM_EPS)
        return x - self.b_dec if self.apply_b_dec_to_input else x

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_sae"]:
        """Feature activations of ``x`` (the formulas of the module docstring)."""
        s = self.sae_input(x)
        if self.architecture == "gated":
            active = (s @ self.W_enc + self.b_gate > 0).to(s.dtype)
            return active * torch.relu(s @ (self.W_enc * self.r_mag.exp()) + self.b_mag)
        h = self.pre_activations(s)
        if self.rescale_acts_by_decoder_norm and self.k is not None:  # topk, batchtopk
            h = h * self.W_dec.norm(dim=-1)
        return self.activate(h)

    def decode(
        self, acts: Float[Tensor, "... d_sae"], x: Tensor | None = None
    ) -> Float[Tensor, "... d_out"]:
        """``norm_out(acts W_dec + b_dec)``. ``x``, the input ``acts`` came from, gives the
        statistics ``norm_out`` needs and the heads' shape for ``hook_z``; required when the
        SAE normalizes its input."""
        if self.rescale_acts_by_decoder_norm:
            acts = acts * (1 / self.W_dec.norm(dim=-1))
        out = Dictionary.decode(self, acts)
        if self.output_hook_name is not None:
            return out  # SAELens's transcoders decode without norm_out or reshaping
        if self.normalize_activations != "none":
            if x is None:
                raise ValueError(
                    f"this SAE normalizes its input ({self.normalize_activations}); pass "
                    "decode(acts, x) with the activation acts came from"
                )
            scale, shift = self._stats(self._flat(x))
            rescale = self.normalize_activations == "constant_norm_rescale"
            out = out / scale if rescale else out * scale + shift
        if self.reshape_activations == "hook_z" and x is not None:
            out = out.unflatten(-1, x.shape[-2:])
        return out

    def reconstruct(
        self, acts: Float[Tensor, "... d_sae"], x: Tensor
    ) -> Float[Tensor, "... d_out"]:
        """``decode(acts, x)``, plus ``x W_skip^T`` when the SAE has a skip connection."""
        out = self.decode(acts, x)
        return out if self.W_skip is None else out + self.skip(x)

    def forward(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        """``reconstruct(encode(x), x)``: what the SAE writes for ``x``."""
        return self.reconstruct(self.encode(x), x)

    def splice(self, x: Tensor, *, use_error_term: bool = True) -> tuple[Tensor, Tensor]:
        """The hook's activation with the SAE's part replaced by its reconstruction (plus
        the error when ``use_error_term``), and the features ``[... d_sae]``."""
        if self.output_hook_name is not None:
            raise ValueError(
                f"this transcoder reads {self.hook_name} and writes {self.output_hook_name}; "
                "it is not spliced at one hook (use its encode and forward)"
            )
        part = x[..., self.hook_head_index, :] if self.hook_head_index is not None else x
        width = part.shape[-2:].numel() if self.reshape_activations == "hook_z" else None
        width = part.shape[-1] if width is None or part.ndim < 2 else width
        if width != self.d_in:
            raise ValueError(
                f"the SAE at {self.hook_name} takes d_in={self.d_in}, but this model's "
                f"activation there has width {width}; load an SAE trained on this model"
            )
        acts = self.encode(part)
        recon = self.reconstruct(acts, part).to(x.dtype)
        new = recon + (part - recon) if use_error_term else recon
        if self.hook_head_index is None:
            return new, acts
        out = x.clone()
        out[..., self.hook_head_index, :] = new
        return out, acts

    def save(self, folder: str | Path) -> None:
        """Write ``cfg.json`` and ``sae_weights.safetensors`` in SAELens 6's format, every
        flag written out (so SAELens and interp read the same SAE back)."""
        from safetensors.torch import save_file

        from interp.saes.saelens_config import saelens_config

        text = json.dumps(saelens_config(self), indent=2) + "\n"  # refusals before any write
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        names = ("W_enc", "b_enc", "W_dec", "b_dec", "threshold", "b_gate", "r_mag", "b_mag")
        tensors = {n: getattr(self, n) for n in (*names, "W_skip", "topk_threshold")}
        save_file(
            {n: t.detach().contiguous().cpu() for n, t in tensors.items() if t is not None},
            str(folder / "sae_weights.safetensors"),
        )
        (folder / "cfg.json").write_text(text, encoding="utf-8")


def _check(architecture: str, normalize: str, reshape: str) -> None:
    if architecture not in ARCHITECTURES:
        raise ValueError(
            f"unknown SAE architecture {architecture!r}; interp runs {', '.join(ARCHITECTURES)}"
        )
    if normalize not in NORMALIZATIONS:
        raise ValueError(
            f"normalize_activations={normalize!r} is not one interp computes "
            f"({', '.join(NORMALIZATIONS)})"
        )
    if reshape not in ("none", "hook_z"):
        raise ValueError(f"reshape_activations={reshape!r} is not 'none' or 'hook_z'")
