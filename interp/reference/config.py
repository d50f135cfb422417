"""The reference GPT-2's configuration, and the check that a model really is a GPT-2.

The reference implements GPT-2 and nothing else: learned absolute positional embeddings
added to the token embeddings, pre-LayerNorm blocks (attention, then MLP, each added to the
residual stream), a GELU-tanh MLP, and attention scaled by ``1/sqrt(d_head)``. A model that
differs in any of these (rotary GPT-NeoX, such as the bundled model; parallel attention and
MLP; RMSNorm; exact GELU) is refused with :class:`UnsupportedArchitectureError` rather than
reproduced wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["GELU_TANH_NAMES", "ReferenceConfig", "UnsupportedArchitectureError", "refusal_message"]

# the names TransformerLens and transformers give GPT-2's tanh-approximated GELU
GELU_TANH_NAMES = ("gelu_new", "gelu_pytorch_tanh")


class UnsupportedArchitectureError(ValueError):
    """The model is not a GPT-2, so the reference cannot reproduce it."""


def refusal_message(what: str, problems: list[str]) -> str:
    """The one-line refusal for a model that is not a GPT-2, naming what differs."""
    return (
        f"the reference implements GPT-2 only (learned absolute positional embeddings, "
        f"LayerNorm, GELU-tanh MLP, attention then MLP in sequence), and {what} is not one: "
        f"{'; '.join(problems)}. Study this model with the hooked model itself "
        "(interp.load_model); the reference cannot serve as its oracle."
    )


@dataclass(frozen=True)
class ReferenceConfig:
    """Sizes of a GPT-2. GPT-2 small: 768, 12, 64, 3072, 12, 1024, 50257, 1e-5."""

    d_model: int  # width of the residual stream, which every layer reads and writes
    n_heads: int  # attention heads per layer, each moving information on its own
    d_head: int  # width of one head's queries, keys and values (d_model / n_heads in GPT-2)
    d_mlp: int  # width of the MLP's hidden layer (4 * d_model in GPT-2)
    n_layers: int  # number of blocks (attention + MLP) stacked on the residual stream
    n_ctx: int  # most positions: W_pos has one row per position, so no prompt can be longer
    d_vocab: int  # tokens the model reads (rows of W_E) and predicts (columns of W_U)
    eps: float = 1e-5  # added to the variance inside LayerNorm's sqrt: no division by zero

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "eps":
                if not (isinstance(value, int | float) and value > 0):
                    raise ValueError(f"eps must be a positive number, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{f.name} must be a positive integer, got {value!r}")

    @classmethod
    def gpt2_small(cls) -> ReferenceConfig:
        """GPT-2 small's sizes (124M parameters), for building a randomly initialised copy."""
        return cls(
            d_model=768,
            n_heads=12,
            d_head=64,
            d_mlp=3072,
            n_layers=12,
            n_ctx=1024,
            d_vocab=50257,
            eps=1e-5,
        )

    @classmethod
    def from_hf_config(cls, config: dict, *, what: str = "this checkpoint") -> ReferenceConfig:
        """Read a transformers ``config.json`` (as a dict); refuse anything but GPT-2."""
        model_type = config.get("model_type")
        if model_type != "gpt2":
            kind = {
                "gpt_neox": "GPT-NeoX with rotary positions",
                "gptj": "GPT-J with rotary positions",
                "llama": "Llama with rotary positions and RMSNorm",
            }.get(model_type, "")
            raise UnsupportedArchitectureError(
                refusal_message(
                    what, [f"its model_type is {model_type!r}" + (f" ({kind})" if kind else "")]
                )
            )
        problems = []
        act = config.get("activation_function", "gelu_new")
        if act not in GELU_TANH_NAMES:
            problems.append(f"its MLP activation is {act!r}, not GPT-2's 'gelu_new'")
        if not config.get("scale_attn_weights", True):
            problems.append("it does not scale attention scores by 1/sqrt(d_head)")
        if config.get("scale_attn_by_inverse_layer_idx", False):
            problems.append("it also scales attention scores by 1/(layer + 1)")
        if config.get("add_cross_attention", False):
            problems.append("it has cross-attention layers")
        if problems:
            raise UnsupportedArchitectureError(refusal_message(what, problems))
        d_model, n_heads = int(config["n_embd"]), int(config["n_head"])
        if d_model % n_heads:
            raise UnsupportedArchitectureError(
                refusal_message(what, [f"n_embd {d_model} is not a multiple of n_head {n_heads}"])
            )
        return cls(
            d_model=d_model,
            n_heads=n_heads,
            d_head=d_model // n_heads,
            d_mlp=int(config.get("n_inner") or 4 * d_model),
            n_layers=int(config["n_layer"]),
            n_ctx=int(config["n_positions"]),
            d_vocab=int(config["vocab_size"]),
            eps=float(config.get("layer_norm_epsilon", 1e-5)),
        )
