"""Hand-built ground-truth circuits for circuit discovery (issue 20): models whose true edges
are known by construction, a task each, and an exact hook-level edge-patching oracle.

``chain_model(saturated=False)`` returns ``(model, task, true_edges)``: a 2-layer,
attention-only TransformerLens-native bridge without norms (``boot_native``,
``normalization_type=None``), 3 heads per layer, on the 40-token word-level toy tokenizer
(tests/zoo.py), every weight set by hand (the few "random" ones from a seeded generator).

The residual stream (``d_model`` 136) has four orthogonal subspaces of one-hot directions:
``T`` (``TOK``, dims 0-39, the current token's identity), ``P`` (``PREV``, 40-79, the
previous token's identity), ``O`` (``OUT``, 80-119, output: ``W_U`` reads only ``O``,
``W_U[80 + t, t] = 1``) and ``POS`` (120-135, the position). ``W_E[t] = T_t``,
``W_pos[p] = POS_p``. Every bias is 0.

- **L0H0, previous-token head.** Query and key read only ``POS``; the score of position ``p``
  on ``p - 1`` is 200 after the ``1/sqrt(d_head)`` scale and 0 elsewhere, so its attention is
  one-hot on ``p - 1`` in float32 (``exp(-200)`` underflows to 0; position 0 sees only
  itself). Its OV copies ``T_t`` to ``P_t``: at position ``p`` it writes ``P_{tok[p-1]}``.
- **L1H0, induction head.** The query reads ``T`` (``T_t -> s * w_t``) and ``POS`` (every
  position -> ``s/2 * w_sink``); the key reads ``P`` (``P_t -> w_t``) and ``POS_0`` (``->
  w_sink``). So position ``j`` scores ``s`` when the token before it equals the current
  token (K-composition with L0H0) and position 0 scores ``s/2`` (an attention sink, so that
  attention has somewhere to go when nothing matches). The value reads ``T`` and the output
  writes ``4 O_t``: the attended token's unembedding direction, 4 logits per unit of attention.
  ``s = 4`` (``chain_model()``: soft attention) or ``s = 40`` (``saturated=True``: the
  attention is one-hot to ~``exp(-20)`` in both runs).
- **L0H1, L1H1, positional decoys.** Query, key and value read only ``POS`` (L1H1 also ``O``,
  which before layer 1 holds only L0H1's output); they write fixed random directions into
  ``O``, changing the logits by the same amount in every run.
- **L0H2, L1H2, silent heads.** Random query, key and value over the whole stream, ``W_O = 0``.

The task (``TASK_ROWS`` rows of 8 token ids): clean ``[x x a b x x x a]`` with the pair ``a b``
at a row-dependent position ``k`` in 1..5 (fillers ``x`` are distinct tokens, never ``a``, ``b``,
``c`` or ``wrong``), answer ``b``, wrong a token absent from the prompt; the corrupted prompt
replaces the ``a`` at ``k`` (the token before the first ``b``) by ``c``. In the clean run the
last position (token ``a``) finds the key at ``k + 1`` that says "previous token ``a``" and
copies ``b``; in the corrupted run no key says so and L1H0 attends to the sink (token ``x``).

The metric is ``logit[b] - logit[wrong]`` at the last position. Clean and corrupted differ
only in the embedding at position ``k`` (``T_a`` vs ``T_c``) and what it causes. Under
denoising edge patching (the corrupted run, one edge's sender given its clean value in that
reader's input only, everything downstream recomputed):

- ``embed->L0H0.v``: L0H0 then writes ``P_a`` at ``k + 1``, L1H0's key there matches, and the
  clean answer is copied (recovered ~1). ``L0H0->L1H0.k``: the same key, directly (~1).
  ``L1H0->logits``: the clean head output itself (exactly 1).
- The embedding difference is zero on ``POS``, so ``embed->L0H0.q/.k`` (and L0H1's, L1H1's
  readers, which read ``POS`` too) get no change. ``embed->L1H0.k`` is zero: the key reads
  ``P`` and ``POS_0``, the embedding has no ``P``. ``embed->L1H0.q`` changes the query only at
  ``k``, and an attention-only layer 1 at ``k`` feeds only position ``k``'s logits, not the last
  one's. ``embed->L1H0.v`` changes the value at ``k`` by ``T_a - T_c``, which moves only the
  logits of ``a`` and ``c``, neither of which is ``b`` or ``wrong``. ``embed->logits``: ``W_U``
  reads only ``O``, and the embedding has none.
- ``L0H0->L1H0.q/.v``, ``L0H0->L1H1.*`` and ``L0H0->logits``: L0H0 writes only ``P``, which
  none of them reads.
- Every edge out of L0H1 or L1H1: their inputs are ``POS`` (and L0H1's output), equal in
  every run, so their clean and corrupted outputs are equal. Every edge out of L0H2 or L1H2:
  their output is exactly 0. Every edge into L0H2 or L1H2: whatever they read, they write 0.

So exactly ``TRUE_EDGES`` have nonzero effect, and patching them together recovers 1 (the
last one alone already does). With ``saturated=True`` the gradient of the metric through
L1H0's key is ~``s exp(-s/2)`` in both runs, so attribution patching (the gradient at the key
input times L0H0's clean - corrupted output) misses ``L0H0->L1H0.k``, which exact patching
finds; the gradient into ``embed->L0H0.v`` flows through that key too and is missed alike.
tests/edge_oracle.py computes exact edge patching and attribution patching of any edge,
``embed`` included, with plain hooks.
"""

from __future__ import annotations

import random
import tempfile

import torch

from interp import Task
from tests.zoo import toy_tokenizer

__all__ = [
    "chain_model",
    "TRUE_EDGES",
    "TASK_ROWS",
    "SEQ_LEN",
]

TRUE_EDGES = ("embed->L0H0.v", "L0H0->L1H0.k", "L1H0->logits")
TASK_ROWS, SEQ_LEN = 8, 8
N_VOCAB, N_CTX, N_HEADS, D_HEAD = 40, 16, 3, 48
TOK, PREV, OUT, POS = 0, 40, 80, 120  # first dimension of each subspace
D_MODEL = POS + N_CTX
PREV_SCORE = 200.0  # L0H0: exp(-200) is 0 in float32, so its attention is exactly one-hot
INDUCTION_SCORE = {False: 4.0, True: 40.0}  # L1H0's match score s (the sink gets s / 2)
OUT_SCALE = 4.0  # logits per unit of L1H0 attention on a token


def _boot():
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    # an in-memory tokenizer lacks name_or_path, which TransformerLens needs: save and reload
    tok_dir = tempfile.mkdtemp(prefix="circuit-tokenizer-")
    toy_tokenizer(bos=False).save_pretrained(tok_dir)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    cfg = TransformerBridgeConfig(
        d_model=D_MODEL,
        d_head=D_HEAD,
        n_layers=2,
        n_ctx=N_CTX,
        n_heads=N_HEADS,
        d_vocab=len(tokenizer),
        attn_only=True,
        normalization_type=None,
        seed=0,
        tokenizer_prepends_bos=False,
    )
    return TransformerBridge.boot_native(cfg, tokenizer=tokenizer)


def _set_head(params, layer: int, head: int, W_Q, W_K, W_V, W_O) -> None:
    """Write ``W_Q/K/V [d_model d_head]`` and ``W_O [d_head d_model]`` of one head into the
    native model's ``nn.Linear`` weights (rows ``head * d_head ...`` of q/k/v, columns of o)."""
    base = f"layers.{layer}._original_component.attn._original_component"
    rows = slice(head * D_HEAD, (head + 1) * D_HEAD)
    for name, W in (("q", W_Q), ("k", W_K), ("v", W_V)):
        params[f"{base}.{name}._original_component.weight"][rows] = W.T
    params[f"{base}.o._original_component.weight"][:, rows] = W_O.T


def _weights(saturated: bool) -> dict:
    """Every head's ``(W_Q, W_K, W_V, W_O)`` by ``(layer, head)``; see the module docstring."""
    gen = torch.Generator().manual_seed(0)
    scale = D_HEAD**0.5  # TransformerLens divides scores by sqrt(d_head)

    def zeros(*shape):
        return torch.zeros(*shape)

    def rand(*shape, std=0.3):
        return torch.randn(*shape, generator=gen) * std

    heads = {}
    # L0H0: previous-token head; query at position p -> u_{p-1}, key at position j -> u_j
    Q, K, V, W_O = zeros(D_MODEL, D_HEAD), zeros(D_MODEL, D_HEAD), zeros(D_MODEL, D_HEAD), None
    for p in range(1, N_CTX):
        Q[POS + p, p - 1] = PREV_SCORE * scale
    for j in range(N_CTX):
        K[POS + j, j] = 1.0
    V[TOK : TOK + N_VOCAB, :N_VOCAB] = torch.eye(N_VOCAB)
    W_O = zeros(D_HEAD, D_MODEL)
    W_O[:N_VOCAB, PREV : PREV + N_VOCAB] = torch.eye(N_VOCAB)
    heads[0, 0] = (Q, K, V, W_O)
    # L1H0: induction head; query T_t -> s w_t and every position -> s/2 w_sink (dimension 40)
    s, sink = INDUCTION_SCORE[saturated] * scale, N_VOCAB
    Q, K, V = zeros(D_MODEL, D_HEAD), zeros(D_MODEL, D_HEAD), zeros(D_MODEL, D_HEAD)
    Q[TOK : TOK + N_VOCAB, :N_VOCAB] = s * torch.eye(N_VOCAB)
    Q[POS : POS + N_CTX, sink] = s / 2
    K[PREV : PREV + N_VOCAB, :N_VOCAB] = torch.eye(N_VOCAB)
    K[POS, sink] = 1.0
    V[TOK : TOK + N_VOCAB, :N_VOCAB] = torch.eye(N_VOCAB)
    W_O = zeros(D_HEAD, D_MODEL)
    W_O[:N_VOCAB, OUT : OUT + N_VOCAB] = OUT_SCALE * torch.eye(N_VOCAB)
    heads[1, 0] = (Q, K, V, W_O)
    for layer in (0, 1):
        # positional decoy: reads POS (layer 1 also OUT), writes random directions into OUT
        reads = list(range(POS, D_MODEL)) + (list(range(OUT, OUT + N_VOCAB)) if layer else [])
        Q, K, V = zeros(D_MODEL, D_HEAD), zeros(D_MODEL, D_HEAD), zeros(D_MODEL, D_HEAD)
        for W in (Q, K, V):
            W[reads] = rand(len(reads), D_HEAD, std=1.0)
        W_O = zeros(D_HEAD, D_MODEL)
        W_O[:, OUT : OUT + N_VOCAB] = rand(D_HEAD, N_VOCAB, std=0.05)
        heads[layer, 1] = (Q, K, V, W_O)
        # silent head: reads everything, writes nothing
        heads[layer, 2] = (*(rand(D_MODEL, D_HEAD) for _ in range(3)), zeros(D_HEAD, D_MODEL))
    return heads


def _task(seed: int = 0) -> Task:
    """``TASK_ROWS`` rows ``[x.. a b x.. a] -> b`` (wrong: absent), corrupted ``a`` -> ``c``."""
    rng = random.Random(seed)
    ids = list(range(2, N_VOCAB))  # w0 ... w37, not <eos>/<unk>
    records = []
    for row in range(TASK_ROWS):
        a, b, c, wrong, *fill = rng.sample(ids, 4 + SEQ_LEN - 3)
        k = 1 + row % 5  # where the pair a b starts: 1 .. 5
        clean = fill[:k] + [a, b] + fill[k : SEQ_LEN - 3] + [a]
        corrupted = clean[:k] + [c] + clean[k + 1 :]
        records.append({"clean": clean, "corrupted": corrupted, "answer": b, "wrong": wrong})
    return Task.from_records(records)


def chain_model(*, saturated: bool = False):
    """``(model, task, true_edges)``: the hand-set previous-token -> induction chain (module
    docstring). ``saturated=True``: L1H0's attention is one-hot to ~exp(-20) in both runs."""
    model = _boot()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.zero_()
        params["tok_embed._original_component.weight"][:, TOK : TOK + N_VOCAB] = torch.eye(N_VOCAB)
        params["pos._original_component.weight"][:, POS:] = torch.eye(N_CTX)
        params["head._original_component.weight"][:, OUT : OUT + N_VOCAB] = torch.eye(N_VOCAB)
        for (layer, head), W in _weights(saturated).items():
            _set_head(params, layer, head, *W)
    model.eval()
    return model, _task(), TRUE_EDGES
