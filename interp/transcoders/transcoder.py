"""Transcoders: sparse features that read an MLP's input and write its output, in
circuit-tracer's conventions.

A *per-layer* set has one transcoder per layer ``l``: with ``x`` the MLP's input (the hook
``input_hook(l)``), the pre-activation is ``h = x @ W_enc(l).T + b_enc(l)`` and the features
``f = act(h)``, ``relu``, ``jumprelu`` or ``topk`` of :mod:`interp.dictionaries.activations`
without SAELens's ``floor`` (circuit-tracer's: a negative JumpReLU threshold lets negative
values through, and TopK keeps the ``k`` largest of ``h`` as they are). Each layer is an
:class:`interp.dictionaries.Dictionary` (:attr:`TranscoderSet.layers`).

It writes ``f @ W_dec(l) + b_dec(l)`` (plus ``x @ W_skip(l).T`` for a skip transcoder) where
the MLP wrote (``output_hook(l)``). A *cross-layer* transcoder (CLT) has the same encoders,
but feature ``(s, i)`` writes into the MLP output of every layer ``l >= s`` with its decoder
row ``W_dec(s)[i, l - s]`` (``W_dec(s)`` is ``[d_tc, n_layers - s, d_model]``): layer ``l``'s
output is ``sum_{s <= l} f_s @ W_dec(s)[:, l - s] + b_dec(l)``.

These are circuit-tracer 0.5's ``SingleLayerTranscoder``/``TranscoderSet`` and
``CrossLayerTranscoder`` (``encode_layer``, ``decode``, ``compute_skip``); the loader
(:mod:`interp.transcoders.loading`) reads and writes their folders.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from jaxtyping import Float
from torch import Tensor

from interp.dictionaries.core import Dictionary
from interp.transcoders.files import write_folder

__all__ = ["ACTIVATIONS", "INPUT_HOOKS", "KINDS", "OUTPUT_HOOKS", "TranscoderSet"]

# the activations of interp.dictionaries a transcoder set holds (circuit-tracer has no BatchTopK)
ACTIVATIONS = ("relu", "jumprelu", "topk")
KINDS = ("per-layer", "cross-layer")  # one transcoder per layer, or one CLT
# where in a block a transcoder may read and write (circuit-tracer's names = the bridge's);
# ln2.hook_normalized: the MLP's norm before its weight and bias, what a HookedTransformer with
# fold_ln hands its MLP (SAELens's GPT-2 transcoders read it)
INPUT_HOOKS = (
    "mlp.hook_in", "hook_mlp_in", "hook_resid_mid", "ln2.hook_out", "ln2.hook_normalized",
)  # fmt: skip
OUTPUT_HOOKS = ("mlp.hook_out", "hook_mlp_out")  # where they may write


class TranscoderSet:
    """Every layer's transcoder (or one cross-layer transcoder), with where it reads and writes.

    Args:
        W_enc, b_enc, W_dec, b_dec: one tensor per layer (shapes in the module docstring).
        kind: ``"per-layer"`` or ``"cross-layer"``.
        activation: ``"relu"``, ``"jumprelu"`` (needs ``threshold``) or ``"topk"`` (needs ``k``).
        threshold: JumpReLU thresholds ``[d_tc]`` per layer.
        W_skip: skip matrices ``[d_model d_model]`` per layer (per-layer sets only), or None.
        input_hook, output_hook: circuit-tracer's hook names inside a block
            (``"mlp.hook_in"``, ``"hook_resid_mid"``; ``"mlp.hook_out"``, ``"hook_mlp_out"``).
        name: what the set is called (its folder's name, or circuit-tracer's ``scan``).
    """

    def __init__(
        self,
        W_enc: Sequence[Tensor],
        b_enc: Sequence[Tensor],
        W_dec: Sequence[Tensor],
        b_dec: Sequence[Tensor],
        *,
        kind: str = "per-layer",
        activation: str = "relu",
        threshold: Sequence[Tensor] | None = None,
        k: int | None = None,
        W_skip: Sequence[Tensor] | None = None,
        input_hook: str = "mlp.hook_in",
        output_hook: str = "mlp.hook_out",
        name: str = "transcoders",
    ):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if kind == "cross-layer" and W_skip is not None:
            raise ValueError("cross-layer transcoders with W_skip are not supported")
        n_layers = len(W_enc)
        if n_layers == 0:
            raise ValueError("a transcoder set needs at least one layer")
        d_tc, d_model = W_enc[0].shape
        self._W_enc, self._b_enc = list(W_enc), list(b_enc)
        self._W_dec, self._b_dec = list(W_dec), list(b_dec)
        self._threshold = None if threshold is None else list(threshold)
        self._W_skip = None if W_skip is None else list(W_skip)
        self.kind, self.activation, self.k = kind, activation, k
        self.n_layers, self.d_tc, self.d_model = n_layers, int(d_tc), int(d_model)
        self.feature_input_hook, self.feature_output_hook = input_hook, output_hook
        self.name = name
        self._build()

    def _build(self) -> None:
        """:attr:`layers` from the weights, each shape checked (a CLT layer's own decoder is
        its ``W_dec[:, 0]``; the later layers' are read by :meth:`decode`)."""
        self.layers: list[Dictionary] = []
        for layer in range(self.n_layers):
            W_enc, W_dec = self._W_enc[layer], self._W_dec[layer]
            cross = self.kind == "cross-layer"
            dec = (self.d_tc, *((self.n_layers - layer,) if cross else ()), self.d_model)
            want = {"W_enc": (W_enc, (self.d_tc, self.d_model)), "W_dec": (W_dec, dec)}
            for name, (tensor, shape) in want.items():
                if tuple(tensor.shape) != shape:
                    raise ValueError(
                        f"transcoder layer {layer}: {name} has shape {tuple(tensor.shape)}, "
                        f"expected {shape}"
                    )
            self.layers.append(Dictionary(
                W_enc.T, self._b_enc[layer], W_dec[:, 0] if cross else W_dec,
                self._b_dec[layer], activation=self.activation, threshold=self.threshold(layer),
                k=self.k, floor=False, W_skip=self.W_skip(layer), what=f"transcoder layer {layer}",
                width="d_tc",
            ))  # fmt: skip

    # ------------------------------------------------------------------ weights per layer

    def W_enc(self, layer: int) -> Float[Tensor, "d_tc d_model"]:
        return self._W_enc[layer]

    def b_enc(self, layer: int) -> Float[Tensor, " d_tc"]:
        return self._b_enc[layer]

    def W_dec(self, layer: int) -> Tensor:
        """``[d_tc d_model]`` (per-layer) or ``[d_tc n_layers-layer d_model]`` (cross-layer)."""
        return self._W_dec[layer]

    def b_dec(self, layer: int) -> Float[Tensor, " d_model"]:
        return self._b_dec[layer]

    def threshold(self, layer: int) -> Float[Tensor, " d_tc"] | None:
        return None if self._threshold is None else self._threshold[layer]

    def W_skip(self, layer: int) -> Float[Tensor, "d_model d_model"] | None:
        return None if self._W_skip is None else self._W_skip[layer]

    @property
    def has_skip(self) -> bool:
        return self._W_skip is not None

    def decoder_rows(self, layer: int, features: Tensor, out_layer: int) -> Tensor:
        """Decoder rows ``[n d_model]`` of ``features`` of source ``layer`` into the MLP output
        of ``out_layer`` (== ``layer`` for a per-layer set)."""
        if self.kind == "per-layer":
            if out_layer != layer:
                raise ValueError("a per-layer transcoder writes only into its own layer")
            return self._W_dec[layer][features]
        return self._W_dec[layer][features, out_layer - layer]

    def input_hook(self, layer: int) -> str:
        """The bridge hook the layer's features read (``blocks.{layer}.mlp.hook_in``)."""
        return f"blocks.{layer}.{self.feature_input_hook}"

    def output_hook(self, layer: int) -> str:
        """The bridge hook the layer's reconstruction replaces (``blocks.{layer}.mlp.hook_out``)."""
        return f"blocks.{layer}.{self.feature_output_hook}"

    # ------------------------------------------------------------------ the maps

    def pre_activations(
        self, x: Float[Tensor, "... d_model"], layer: int
    ) -> Float[Tensor, "... d_tc"]:
        return self.layers[layer].pre_activations(x)

    def activate(self, h: Float[Tensor, "... d_tc"], layer: int) -> Float[Tensor, "... d_tc"]:
        """The activation function on pre-activations ``h`` of ``layer``."""
        return self.layers[layer].activate(h)

    def encode(self, x: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_tc"]:
        """Feature activations of ``layer`` from its MLP input ``x``."""
        return self.layers[layer].encode(x)

    def decode(self, acts, layer: int) -> Float[Tensor, "... d_model"]:
        """The reconstruction of ``layer``'s MLP output, skip term not included.

        ``acts``: per-layer, that layer's features ``[... d_tc]``; cross-layer, a sequence
        (or stacked tensor) whose entry ``s`` holds layer ``s``'s features for every
        ``s <= layer`` (later entries are not read)."""
        if self.kind == "per-layer":
            return self.layers[layer].decode(acts)
        out = self._b_dec[layer]
        for source in range(layer + 1):
            W = self._W_dec[source][:, layer - source]
            out = out + acts[source].to(W.dtype) @ W
        return out

    def skip(self, x: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_model"]:
        """The skip term ``x @ W_skip.T`` (zeros without one)."""
        if self._W_skip is None:
            return torch.zeros_like(x)
        return self.layers[layer].skip(x).to(x.dtype)

    # ------------------------------------------------------------------ housekeeping

    def to(self, device=None, dtype: torch.dtype | None = None) -> TranscoderSet:
        """A copy on ``device`` / in ``dtype`` (this set is left as it is)."""

        def move(ts):
            return None if ts is None else [t.to(device=device, dtype=dtype) for t in ts]

        new = object.__new__(TranscoderSet)
        new.__dict__.update(self.__dict__)
        for attr in ("_W_enc", "_b_enc", "_W_dec", "_b_dec", "_threshold", "_W_skip"):
            setattr(new, attr, move(getattr(self, attr)))
        new._build()
        return new

    @property
    def dtype(self) -> torch.dtype:
        return self._W_enc[0].dtype

    @property
    def device(self) -> torch.device:
        return self._W_enc[0].device

    def save(self, path: str | Path) -> Path:
        """Write the set as a circuit-tracer folder (``config.yaml`` and safetensors files)."""
        return write_folder(self, path)

    def __repr__(self) -> str:
        extra = f", k={self.k}" if self.k is not None else ""
        skip = ", skip" if self.has_skip else ""
        return (
            f"TranscoderSet({self.name!r}, {self.kind}, {self.n_layers} layers, d_model "
            f"{self.d_model}, d_tc {self.d_tc}, {self.activation}{extra}{skip}, reads "
            f"{self.feature_input_hook}, writes {self.feature_output_hook})"
        )
