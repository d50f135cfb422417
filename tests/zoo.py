"""Tiny random checkpoints of the architectures users open, and hand-set toy models.

``make_zoo_checkpoint(directory, arch)`` writes a 2-layer, d_model 64 model of ``arch`` (one of
``ZOO_ARCHS``) with ``save_pretrained`` plus a small byte-level BPE tokenizer, so that
``interp.load_model(directory)`` loads it offline exactly as it would a real checkpoint. Norm
weights are drawn far from 1 and every bias (norms included) is random, so that an analysis
that forgets a norm weight or a bias fails its identity test instead of passing by luck.

Toy models (``make_toy_checkpoint``, ``attn_only_model``) are GPT-2 checkpoints with weights set
by hand: exactly-zero heads, a vocabulary of a few dozen tokens, no BOS token, tied embeddings.

``Zoo(root)`` writes each of these checkpoints once and loads it once (``interp.load_model`` and
plain ``transformers``); the session fixture ``zoo`` in conftest.py shares one across test files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTJConfig,
    GPTJForCausalLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    OPTConfig,
    OPTForCausalLM,
    PhiConfig,
    PhiForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from tests.checkpoints import make_tokenizer

__all__ = [
    "ZOO_ARCHS",
    "RMSNORM_ARCHS",
    "GQA_ARCHS",
    "PARALLEL_ARCHS",
    "make_zoo_checkpoint",
    "make_toy_checkpoint",
    "zero_heads",
    "toy_tokenizer",
    "attn_only_model",
    "TOY_KINDS",
    "Zoo",
]

D_MODEL, N_HEADS, N_LAYERS, N_CTX = 64, 4, 2, 64
NORM_SPREAD = 0.5  # norm weights 1 + 0.5 N(0,1): far from 1, rarely near 0
BIAS_SPREAD = 0.1


def _common(vocab: int, **extra) -> dict:
    # initializer_range 0.2 (not 0.02): logits of a few units, so mismatches are visible
    return dict(vocab_size=vocab, bos_token_id=0, eos_token_id=0, initializer_range=0.2, **extra)


def _gpt2(vocab: int, **o):
    o = {"n_layer": N_LAYERS, **o}  # n_layer=3: free layers on both sides of a constrained one
    return GPT2LMHeadModel(
        GPT2Config(
            **_common(vocab),
            n_positions=N_CTX,
            n_embd=D_MODEL,
            n_head=N_HEADS,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **o,
        )
    )


def _neox(parallel: bool):
    def build(vocab: int, **o):
        return GPTNeoXForCausalLM(
            GPTNeoXConfig(
                **_common(vocab),
                max_position_embeddings=N_CTX,
                hidden_size=D_MODEL,
                num_hidden_layers=N_LAYERS,
                num_attention_heads=N_HEADS,
                intermediate_size=4 * D_MODEL,
                rotary_pct=0.25,
                use_parallel_residual=parallel,
                tie_word_embeddings=False,
                **o,
            )
        )

    return build


def _llama_like(config_cls, model_cls, **defaults):
    def build(vocab: int, **o):
        kw = dict(
            max_position_embeddings=N_CTX,
            hidden_size=D_MODEL,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=N_HEADS,
            num_key_value_heads=2,
            intermediate_size=2 * D_MODEL,
            tie_word_embeddings=False,
            **defaults,
        )
        kw.update(o)
        return model_cls(config_cls(**_common(vocab), **kw))

    return build


def _opt(vocab: int, **o):
    return OPTForCausalLM(
        OPTConfig(
            **_common(vocab),
            pad_token_id=1,
            hidden_size=D_MODEL,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=N_HEADS,
            ffn_dim=4 * D_MODEL,
            max_position_embeddings=N_CTX,
            word_embed_proj_dim=D_MODEL,
            dropout=0.0,
            attention_dropout=0.0,
            **o,
        )
    )


def _gptj(vocab: int, **o):
    return GPTJForCausalLM(
        GPTJConfig(
            **_common(vocab),
            n_positions=N_CTX,
            n_embd=D_MODEL,
            n_layer=N_LAYERS,
            n_head=N_HEADS,
            rotary_dim=8,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=False,
            **o,
        )
    )


def _phi(vocab: int, **o):
    return PhiForCausalLM(
        PhiConfig(
            **_common(vocab),
            hidden_size=D_MODEL,
            num_hidden_layers=N_LAYERS,
            num_attention_heads=N_HEADS,
            intermediate_size=4 * D_MODEL,
            max_position_embeddings=N_CTX,
            partial_rotary_factor=0.5,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attention_dropout=0.0,
            **o,
        )
    )


BUILDERS: dict[str, Callable[..., torch.nn.Module]] = {
    "gpt2": _gpt2,
    "gpt_neox": _neox(parallel=False),
    "gpt_neox_parallel": _neox(parallel=True),
    "llama": _llama_like(LlamaConfig, LlamaForCausalLM),
    "qwen2": _llama_like(Qwen2Config, Qwen2ForCausalLM),
    "gemma2": _llama_like(
        Gemma2Config,
        Gemma2ForCausalLM,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=N_CTX,
        final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0,
    ),
    "mistral": _llama_like(MistralConfig, MistralForCausalLM, sliding_window=None),
    "opt": _opt,
    "gptj": _gptj,
    "phi": _phi,
}
ZOO_ARCHS: tuple[str, ...] = tuple(BUILDERS)
RMSNORM_ARCHS = ("llama", "qwen2", "gemma2", "mistral")
GQA_ARCHS = ("llama", "qwen2", "gemma2", "mistral")  # 4 query heads share 2 key/value heads
PARALLEL_ARCHS = ("gpt_neox_parallel", "gptj", "phi")


def _randomise(model: torch.nn.Module) -> None:
    """Norm weights far from 1 (Gemma's (1 + w) norms: w far from 0), random biases."""
    gemma = type(model).__name__.startswith("Gemma")
    with torch.no_grad():
        for name, param in model.named_parameters():
            is_norm = "norm" in name or "ln_" in name  # ln_1/ln_f, *layernorm, *layer_norm
            if is_norm and name.endswith("weight"):
                noise = NORM_SPREAD * torch.randn_like(param)
                param.copy_(noise if gemma else 1 + noise)
            elif name.endswith("bias"):
                param.copy_(BIAS_SPREAD * torch.randn_like(param))


def make_zoo_checkpoint(
    directory: Path,
    arch: str,
    *,
    seed: int = 0,
    vocab_size: int = 300,
    tokenizer: PreTrainedTokenizerFast | None = None,
    **overrides,
) -> Path:
    """Write a tiny random ``arch`` checkpoint (weights + tokenizer) to ``directory``.

    ``overrides`` go to the architecture's config (``num_key_value_heads=4``, say).
    """
    if arch not in BUILDERS:
        raise ValueError(f"arch must be one of {', '.join(ZOO_ARCHS)}, got {arch!r}")
    torch.manual_seed(seed)
    tokenizer = tokenizer if tokenizer is not None else make_tokenizer(vocab_size)
    model = BUILDERS[arch](len(tokenizer), **overrides)
    _randomise(model)
    model.eval()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# ---------------------------------------------------------------- toy models (hand-set weights)

TOY_WORDS = [f"w{i}" for i in range(38)]  # with the specials: a 40-token vocabulary


def toy_tokenizer(*, bos: bool = True) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of 40 tokens (``<eos>``, ``<unk>`` and ``w0`` ... ``w37``).

    With ``bos=False`` it has no BOS token at all (``tokenizer.bos_token is None``).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<eos>": 0, "<unk>": 1} | {w: i + 2 for i, w in enumerate(TOY_WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    kw = dict(bos_token="<eos>") if bos else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>", **kw)


def zero_heads(
    model: GPT2LMHeadModel,
    *,
    ov: dict[int, list[int]] = {},  # noqa: B006 (read, never changed)
    v: dict[int, list[int]] = {},  # noqa: B006
    qk: dict[int, list[int]] = {},  # noqa: B006
) -> None:
    """Zero heads of a GPT-2 in place: ``ov`` zeroes W_O rows, ``v`` W_V (and b_V),
    ``qk`` both W_Q and W_K (and their biases), each ``{layer: [heads]}``."""
    d_model = model.config.n_embd
    d_head = d_model // model.config.n_head
    with torch.no_grad():
        for which, spec in (("o", ov), ("v", v), ("qk", qk)):
            for layer, heads in spec.items():
                attn = model.transformer.h[layer].attn
                for h in heads:
                    cols = slice(h * d_head, (h + 1) * d_head)
                    if which == "o":
                        attn.c_proj.weight[cols, :] = 0
                    else:
                        # c_attn is Conv1D [d_model, 3 d_model]: q | k | v blocks
                        parts = (2,) if which == "v" else (0, 1)
                        for p in parts:
                            block = slice(p * d_model + h * d_head, p * d_model + (h + 1) * d_head)
                            attn.c_attn.weight[:, block] = 0
                            attn.c_attn.bias[block] = 0


def make_toy_checkpoint(
    directory: Path,
    *,
    seed: int = 0,
    bos: bool = True,
    tied: bool = False,
    small_vocab: bool = True,
    ov_zero: dict[int, list[int]] | None = None,
    v_zero: dict[int, list[int]] | None = None,
    qk_zero: dict[int, list[int]] | None = None,
    n_ctx: int = N_CTX,
) -> Path:
    """A GPT-2 toy: 40-token vocabulary (``small_vocab``), optionally no BOS token, tied
    embeddings, and heads zeroed exactly (see :func:`zero_heads`)."""
    torch.manual_seed(seed)
    tokenizer = toy_tokenizer(bos=bos) if small_vocab else make_tokenizer(300)
    cfg = dict(
        vocab_size=len(tokenizer),
        n_positions=n_ctx,
        n_embd=D_MODEL,
        n_layer=N_LAYERS,
        n_head=N_HEADS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        eos_token_id=0,
        tie_word_embeddings=tied,
        initializer_range=0.2,
    )
    cfg["bos_token_id"] = 0 if bos else None
    model = GPT2LMHeadModel(GPT2Config(**cfg))
    _randomise(model)
    zero_heads(model, ov=ov_zero or {}, v=v_zero or {}, qk=qk_zero or {})
    model.eval()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


# named toy checkpoints (keyword arguments of make_toy_checkpoint); all have a 40-token vocabulary
TOY_KINDS: dict[str, dict] = {
    "toy_small_vocab": {},
    "toy_no_bos": {"bos": False},
    "toy_tied": {"tied": True},
    # L0H1: W_O zero; L1H2: W_V zero (OV circuit exactly zero); L1H3: W_Q and W_K zero
    "toy_zero_heads": {"ov_zero": {0: [1]}, "v_zero": {1: [2]}, "qk_zero": {1: [3]}},
}


def attn_only_model(
    *,
    seed: int = 0,
    n_layers: int = N_LAYERS,
    bos: bool = True,
    normalization_type: str | None = "LN",
):
    """An attention-only TransformerLens-native bridge (``boot_native``, ``attn_only=True``)
    on the 40-token toy tokenizer; random LayerNorm weights and biases like the zoo.
    ``normalization_type=None``: no norm at all, as in many hand-set and compiled circuits."""
    import tempfile

    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    # an in-memory tokenizer lacks name_or_path, which TransformerLens needs: save and reload
    tok_dir = tempfile.mkdtemp(prefix="toy-tokenizer-")
    toy_tokenizer(bos=bos).save_pretrained(tok_dir)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    cfg = TransformerBridgeConfig(
        d_model=D_MODEL,
        d_head=D_MODEL // N_HEADS,
        n_layers=n_layers,
        n_ctx=N_CTX,
        n_heads=N_HEADS,
        d_vocab=len(tokenizer),
        attn_only=True,
        normalization_type=normalization_type,
        seed=seed,
        tokenizer_prepends_bos=bos,
    )
    bridge = TransformerBridge.boot_native(cfg, tokenizer=tokenizer)
    torch.manual_seed(seed)
    _randomise(bridge)
    bridge.eval()
    return bridge


# ---------------------------------------------------------------- written and loaded once


class Zoo:
    """Zoo and toy checkpoints, each written, loaded and opened in transformers at most once.

    ``name`` is one of ``ZOO_ARCHS`` (``overrides`` go to its config, as in
    :func:`make_zoo_checkpoint`) or of ``TOY_KINDS`` (``overrides`` add keyword arguments of
    :func:`make_toy_checkpoint`). Equal ``(name, overrides)`` give the same directory, the same
    loaded model and the same transformers model: shared, so callers must not modify them
    (hooks removed before returning are fine). A test that mutates a model loads its own from
    :meth:`directory`.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self._directories: dict[tuple, Path] = {}
        self._models: dict[tuple, object] = {}
        self._hf: dict[tuple, torch.nn.Module] = {}

    @staticmethod
    def _key(name: str, overrides: dict) -> tuple:
        return (name, *sorted(overrides.items()))

    def directory(self, name: str, **overrides) -> Path:
        key = self._key(name, overrides)
        if key not in self._directories:
            folder = self.root / "-".join([name, *(f"{k}={v}" for k, v in key[1:])])
            if name in TOY_KINDS:
                make_toy_checkpoint(folder, **TOY_KINDS[name], **overrides)
            else:
                make_zoo_checkpoint(folder, name, **overrides)
            self._directories[key] = folder
        return self._directories[key]

    def model(self, name: str, **overrides):
        """``interp.load_model`` of the checkpoint, on the CPU."""
        from interp import load_model

        key = self._key(name, overrides)
        if key not in self._models:
            self._models[key] = load_model(self.directory(name, **overrides), device="cpu")
        return self._models[key]

    def hf(self, name: str, **overrides) -> torch.nn.Module:
        """Plain transformers (``AutoModelForCausalLM``, eager attention, eval mode)."""
        from transformers import AutoModelForCausalLM

        key = self._key(name, overrides)
        if key not in self._hf:
            self._hf[key] = AutoModelForCausalLM.from_pretrained(
                self.directory(name, **overrides), attn_implementation="eager"
            ).eval()
        return self._hf[key]
