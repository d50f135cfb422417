"""A from-scratch GPT-2 in the seed notes' einsum notation: a guide to read and the toolkit's
independent oracle (see docs/reference.md).

``config`` holds the frozen sizes and the GPT-2-only check, ``model`` the modules (read it top
to bottom), ``weights`` the readers for a hooked model and a checkpoint directory.
"""

from interp.reference.config import ReferenceConfig, UnsupportedArchitectureError
from interp.reference.model import (
    GPT2,
    MLP,
    Attention,
    Block,
    Embed,
    LayerNorm,
    PosEmbed,
    Unembed,
    gelu_new,
)

# the name interp exports at top level, where a bare "GPT2" would be ambiguous
ReferenceGPT2 = GPT2

__all__ = [
    "GPT2",
    "MLP",
    "Attention",
    "Block",
    "Embed",
    "LayerNorm",
    "PosEmbed",
    "ReferenceConfig",
    "ReferenceGPT2",
    "Unembed",
    "UnsupportedArchitectureError",
    "gelu_new",
]
