"""Sparse dictionaries: the one core that SAEs (``interp.saes``) and transcoders
(``interp.transcoders``) are formats and hooks over.

- :mod:`~.activations`: the activation functions, one meaning each (``relu``, ``jumprelu``,
  ``topk``, ``batchtopk``; ``floor`` says whether the ReLU of SAELens is applied);
- :mod:`~.core`: :class:`Dictionary`, an encoder, an activation, a decoder and maybe a skip;
- :class:`FeatureEdit`: set or scale one feature of a transcoder layer or an SAE (defined in
  the engine, :mod:`interp.engine.feature_edit`, which applies it);
- :mod:`~.data`: what dictionaries train on (:class:`TokenRows`) and read
  (:func:`activations_at`); :mod:`~.files`: their weight files (:func:`read_tensors`);
- :mod:`~.training`: the one training loop (per-kind losses: SAE, per-layer, skip and
  cross-layer transcoders) and :mod:`~.evaluation`: the held-out figures' tally.

It imports only the foundation, the models and the engine.

The names are imported on first use, so importing the package costs nothing.
"""

from __future__ import annotations

from interp.foundation.doors import exports, lazy_package

_EXPORTS = exports(
    __name__,
    {
        ".activations": ("ACTIVATIONS", "activate"),
        ".core": ("Dictionary", "decoder_flag"),
        "interp.engine.feature_edit": ("FeatureEdit",),
        ".data": ("TokenRows", "activations_at"),
        ".files": ("read_tensors",),
    },
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_package(__name__, _EXPORTS)
