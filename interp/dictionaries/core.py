"""The one sparse dictionary: an encoder, an activation, a decoder and maybe a skip.

    h = x W_enc + b_enc          pre_activations   (W_enc [d_in d_dict])
    f = act(h)                   activate          (interp.dictionaries.activations)
    y = f W_dec + b_dec          decode            (W_dec [d_dict d_out])
      + x W_skip^T               skip              (W_skip [d_out d_in]: a skip transcoder's)

An SAE (:class:`interp.saes.sae.SAE`) is one :class:`Dictionary` that reads and writes one hook,
with SAELens's input normalisation, gating and decoder-norm scaling around these maps. A
transcoder set (:class:`interp.transcoders.TranscoderSet`) holds one per layer, reading the MLP's
input and writing its output; a cross-layer set's layer also decodes every earlier layer's
features (``TranscoderSet.decode``).

The tensors are held as given: circuit-tracer keeps ``W_enc`` as ``[d_dict d_in]``, and its set
hands the transposed view here, so each map is the operation the format's library runs, on the
same tensors, and every format keeps its numbers bit for bit.
"""

from __future__ import annotations

import re

import torch
from jaxtyping import Float
from torch import Tensor

from interp.dictionaries.activations import activate, activation_name, check_activation

__all__ = ["Dictionary", "decoder_flag", "resid_pre_layer"]


class Dictionary:
    """One dictionary's maps (module docstring). Subclasses (the SAE) may hold the tensors as
    parameters; ``b_enc`` may be None for an encoder they compute otherwise (a gated SAE's).

    Args:
        W_enc, b_enc, W_dec, b_dec: ``[d_in d_dict]``, ``[d_dict]``, ``[d_dict d_out]``,
            ``[d_out]``.
        activation: one of :data:`~interp.dictionaries.activations.ACTIVATIONS` (or an alias).
        threshold, k, floor: the activation's settings (its module docstring).
        W_skip: ``[d_out d_in]``, or None.
        what, width: how errors name the dictionary and its width (``"SAE"``, ``"d_sae"``).
    """

    def __init__(
        self,
        W_enc: Float[Tensor, "d_in d_dict"],
        b_enc: Float[Tensor, " d_dict"] | None,
        W_dec: Float[Tensor, "d_dict d_out"],
        b_dec: Float[Tensor, " d_out"],
        *,
        activation: str = "relu",
        threshold: Float[Tensor, " d_dict"] | None = None,
        k: float | None = None,
        floor: bool = True,
        W_skip: Float[Tensor, "d_out d_in"] | None = None,
        what: str = "dictionary",
        width: str = "d_dict",
    ):
        d_in, d_dict = W_enc.shape
        d_out = W_dec.shape[-1]
        shapes = {"W_dec": (W_dec, (d_dict, d_out)), "b_dec": (b_dec, (d_out,)),
                  "b_enc": (b_enc, (d_dict,)), "threshold": (threshold, (d_dict,)),
                  "W_skip": (W_skip, (d_out, d_in))}  # fmt: skip
        for name, (tensor, shape) in shapes.items():
            if tensor is not None and tuple(tensor.shape) != shape:
                raise ValueError(
                    f"{what}: {name} has shape {tuple(tensor.shape)}, expected {shape} (d_in "
                    f"{d_in}, d_dict {d_dict}, d_out {d_out})"
                )
        activation = activation_name(activation)
        check_activation(
            activation, threshold=threshold, k=k, d_dict=d_dict, what=what, width=width
        )
        self.W_enc, self.b_enc, self.W_dec, self.b_dec = W_enc, b_enc, W_dec, b_dec
        self.threshold, self.W_skip = threshold, W_skip
        self.activation, self.k, self.floor = activation, k, bool(floor)
        self.d_in, self.d_dict, self.d_out = int(d_in), int(d_dict), int(d_out)

    def pre_activations(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_dict"]:
        """``x W_enc + b_enc`` (``x`` in the weights' dtype)."""
        return x.to(self.W_enc.dtype) @ self.W_enc + self.b_enc

    def activate(self, h: Float[Tensor, "... d_dict"]) -> Float[Tensor, "... d_dict"]:
        """The activation function on pre-activations ``h``."""
        return activate(self.activation, h, threshold=self.threshold, k=self.k, floor=self.floor)

    def encode(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_dict"]:
        """The features of ``x``: ``activate(pre_activations(x))``."""
        return self.activate(self.pre_activations(x))

    def decode(self, acts: Float[Tensor, "... d_dict"]) -> Float[Tensor, "... d_out"]:
        """``acts W_dec + b_dec`` (the skip term not included)."""
        return acts.to(self.W_dec.dtype) @ self.W_dec + self.b_dec

    def skip(self, x: Float[Tensor, "... d_in"]) -> Float[Tensor, "... d_out"]:
        """``x W_skip^T`` in the weights' dtype (zeros without a skip)."""
        if self.W_skip is None:
            return torch.zeros(*x.shape[:-1], self.d_out, dtype=self.W_dec.dtype, device=x.device)
        return x.to(self.W_skip.dtype) @ self.W_skip.T

    def decoder_flag(self) -> tuple[str, object] | None:
        """:func:`decoder_flag` of this dictionary."""
        return decoder_flag(self)


def decoder_flag(dictionary) -> tuple[str, object] | None:
    """The first setting that makes ``dictionary`` write something other than ``f W_dec + b_dec``
    over its hook's whole activation (analyses that split the stream into ``f_j W_dec[j]``
    refuse it, naming the key), or None."""
    flags = {
        "normalize_activations": getattr(dictionary, "normalize_activations", "none"),
        "rescale_acts_by_decoder_norm": getattr(dictionary, "rescale_acts_by_decoder_norm", False),
        "reshape_activations": getattr(dictionary, "reshape_activations", "none"),
        "hook_head_index": getattr(dictionary, "hook_head_index", None),
        "output_hook_name": getattr(dictionary, "output_hook_name", None),
        "W_skip": "a skip connection" if getattr(dictionary, "W_skip", None) is not None else None,
    }
    return next(((k, v) for k, v in flags.items() if v not in ("none", False, None)), None)


def resid_pre_layer(sae, what: str) -> int:
    """The layer ``L`` of an SAE at ``blocks.L.hook_resid_pre``, for an analysis (``what``,
    named in the refusals) that splits the stream there into ``f_j W_dec[j]``; a ValueError
    for an SAE with a :func:`decoder_flag` or at another hook."""
    odd = decoder_flag(sae)
    if odd is not None:
        raise ValueError(
            f"{what} split the stream into f_j W_dec[j], which an SAE with "
            f"{odd[0]}={odd[1]!r} does not write; use an SAE without it"
        )
    found = re.fullmatch(r"blocks\.(\d+)\.hook_resid_pre", str(sae.hook_name))
    if found is None:
        raise ValueError(
            f"{what} take an SAE at blocks.L.hook_resid_pre (the stream the layers before L "
            f"write, which every later reader reads), not {sae.hook_name!r}"
        )
    return int(found.group(1))
