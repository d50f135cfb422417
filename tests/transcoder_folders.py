"""Random transcoder sets and circuit-tracer folders for tests (the one builder, shared).

``random_transcoders(model, kind=..., activation=...)`` draws a seeded set that fits ``model``
(its layer count and width) with a share of features active on typical inputs; with
``skip=True`` each layer has a ``W_skip``. ``make_transcoder_folder(directory, model, ...)``
writes one as circuit-tracer does (``config.yaml`` and safetensors files) and returns the path.
Weights are written from these tensors with ``safetensors`` directly (``write_raw_folder``) as
well as through ``TranscoderSet.save``, so the loader is tested against files it did not write.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml
from safetensors.torch import save_file

__all__ = ["random_transcoders", "make_transcoder_folder", "write_raw_folder"]


def _weights(model, *, kind, d_tc, activation, skip, k, seed, dtype=torch.float32) -> dict:
    n_layers, d_model = int(model.cfg.n_layers), int(model.cfg.d_model)
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    out = {k_: [] for k_ in ("W_enc", "b_enc", "W_dec", "b_dec")}
    out["threshold"] = [] if activation == "jumprelu" else None
    out["W_skip"] = [] if skip else None
    for layer in range(n_layers):
        # the MLP input has norm ~ sqrt(d_model) (a norm's output): pre-activations ~ N(0, 1)
        out["W_enc"].append(randn(d_tc, d_model, scale=d_model**-0.5))
        out["b_enc"].append(randn(d_tc, scale=0.5) - 0.3)
        dec_shape = (d_tc, d_model) if kind == "per-layer" else (d_tc, n_layers - layer, d_model)
        out["W_dec"].append(randn(*dec_shape, scale=d_tc**-0.5))
        out["b_dec"].append(randn(d_model, scale=0.1))
        if activation == "jumprelu":
            out["threshold"].append(torch.rand(d_tc, generator=gen).to(dtype) * 0.5)
        if skip:
            out["W_skip"].append(randn(d_model, d_model, scale=0.3 * d_model**-0.5))
    return out | {"k": k if activation == "topk" else None}


def random_transcoders(
    model,
    *,
    kind: str = "per-layer",
    d_tc: int = 32,
    activation: str = "relu",
    skip: bool = False,
    k: int = 6,
    seed: int = 0,
    input_hook: str = "mlp.hook_in",
    output_hook: str = "mlp.hook_out",
    name: str = "random-transcoders",
):
    """A seeded random :class:`interp.transcoders.TranscoderSet` fitting ``model``."""
    from interp.transcoders.transcoder import TranscoderSet

    w = _weights(model, kind=kind, d_tc=d_tc, activation=activation, skip=skip, k=k, seed=seed)
    return TranscoderSet(
        w["W_enc"],
        w["b_enc"],
        w["W_dec"],
        w["b_dec"],
        kind=kind,
        activation=activation,
        threshold=w["threshold"],
        k=w["k"],
        W_skip=w["W_skip"],
        input_hook=input_hook,
        output_hook=output_hook,
        name=name,
    )


def write_raw_folder(directory: Path, tc) -> Path:
    """Write ``tc`` in circuit-tracer's layout with ``safetensors`` and ``yaml`` directly
    (the layout circuit-tracer 0.5's ``to_safetensors`` writes, not interp's writer)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "model_kind": "transcoder_set" if tc.kind == "per-layer" else "cross_layer_transcoder",
        "feature_input_hook": tc.feature_input_hook,
        "feature_output_hook": tc.feature_output_hook,
        "scan": tc.name,
    }
    if tc.activation == "topk":
        config |= {"activation": "topk", "k": tc.k}
    for layer in range(tc.n_layers):
        if tc.kind == "per-layer":
            d = {"W_enc": tc.W_enc(layer), "W_dec": tc.W_dec(layer)}
            d |= {"b_enc": tc.b_enc(layer), "b_dec": tc.b_dec(layer)}
            if tc.threshold(layer) is not None:
                d["activation_function.threshold"] = tc.threshold(layer)
            if tc.W_skip(layer) is not None:
                d["W_skip"] = tc.W_skip(layer)
            save_file(
                {a: b.contiguous() for a, b in d.items()}, directory / f"layer_{layer}.safetensors"
            )
        else:
            d = {f"W_enc_{layer}": tc.W_enc(layer), f"b_enc_{layer}": tc.b_enc(layer)}
            d[f"b_dec_{layer}"] = tc.b_dec(layer)
            if tc.threshold(layer) is not None:
                d[f"threshold_{layer}"] = tc.threshold(layer)
            save_file(d, directory / f"W_enc_{layer}.safetensors")
            save_file(
                {f"W_dec_{layer}": tc.W_dec(layer).contiguous()},
                directory / f"W_dec_{layer}.safetensors",
            )
    (directory / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return directory


def make_transcoder_folder(directory: Path, model, **kwargs) -> Path:
    """Write ``random_transcoders(model, **kwargs)`` to ``directory`` as circuit-tracer does."""
    return write_raw_folder(directory, random_transcoders(model, **kwargs))
