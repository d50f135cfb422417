"""Build small, seeded, GPT-2-shaped (and rotary GPT-NeoX) checkpoints offline for tests.

Everything a test loads is written here with ``save_pretrained``: config, safetensors
weights, and a byte-level BPE tokenizer trained with the ``tokenizers`` library.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    PreTrainedTokenizerFast,
)

SPECIAL = "<|endoftext|>"
CORPUS = [
    "When Mary and John went to the store, John gave a drink to Mary.",
    "The cat sat on the mat. The dog sat on the log. A bird sat on a branch.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
    "Induction heads copy the token that followed an earlier copy of the current token.",
    "Ünïcödé, emoji 🙂 and <html> & 'quotes' \"double\" are just bytes to a byte-level BPE.",
]


def make_tokenizer(
    vocab_size: int = 400, corpus: list[str] | None = None
) -> PreTrainedTokenizerFast:
    """A byte-level BPE (any string tokenises) with ``<|endoftext|>`` as id 0."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator((corpus or CORPUS) * 20, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIAL, eos_token=SPECIAL, unk_token=SPECIAL
    )


def make_checkpoint(
    directory: Path,
    *,
    arch: str = "gpt2",
    seed: int = 0,
    n_layers: int = 2,
    n_heads: int = 4,
    d_model: int = 64,
    n_ctx: int = 64,
    vocab_size: int = 400,
    randomize_ln: bool = True,
    with_tokenizer: bool = True,
    corpus: list[str] | None = None,
    d_vocab: int | None = None,
) -> Path:
    """Write a random checkpoint to ``directory`` and return it.

    ``corpus`` trains the tokenizer (default: a few mixed sentences). ``randomize_ln`` draws
    LayerNorm weights and biases away from (1, 0) so that folding and
    attribution tests really exercise them; biases everywhere are random for the same reason.
    ``d_vocab`` widens the model's vocabulary beyond the tokenizer's (GPT-2's 50257, say).
    """
    torch.manual_seed(seed)
    tokenizer = make_tokenizer(vocab_size, corpus)
    vocab = max(len(tokenizer), d_vocab or 0)
    if arch == "gpt2":
        config = GPT2Config(
            vocab_size=vocab,
            n_positions=n_ctx,
            n_embd=d_model,
            n_layer=n_layers,
            n_head=n_heads,
            bos_token_id=0,
            eos_token_id=0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        model = GPT2LMHeadModel(config)
    elif arch == "neox":
        config = GPTNeoXConfig(
            vocab_size=vocab,
            max_position_embeddings=n_ctx,
            hidden_size=d_model,
            num_hidden_layers=n_layers,
            num_attention_heads=n_heads,
            intermediate_size=4 * d_model,
            rotary_pct=1.0,
            use_parallel_residual=False,
            bos_token_id=0,
            eos_token_id=0,
            tie_word_embeddings=False,
        )
        model = GPTNeoXForCausalLM(config)
    else:
        raise ValueError(f"arch must be 'gpt2' or 'neox', got {arch!r}")
    with torch.no_grad():
        for name, param in model.named_parameters():
            is_norm = "ln" in name or "layernorm" in name or "norm" in name
            if is_norm and name.endswith("weight") and randomize_ln:
                param.copy_(1 + 0.3 * torch.randn_like(param))
            elif name.endswith("bias") and (randomize_ln or not is_norm):
                param.copy_(0.1 * torch.randn_like(param))
    model.eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    if with_tokenizer:
        tokenizer.save_pretrained(directory)
    return directory


def make_parallel_neox(directory: Path) -> Path:
    """Pythia's layout: parallel attention and MLP, partial rotary, random LayerNorms."""
    torch.manual_seed(1)
    tokenizer = make_tokenizer()
    config = GPTNeoXConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        rotary_pct=0.25,
        use_parallel_residual=True,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=False,
    )
    model = GPTNeoXForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.copy_(1 + 0.3 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
