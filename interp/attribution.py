"""Direct logit attribution and the logit lens, as exact decompositions.

**Direct logit attribution.** The final residual stream ``x`` at the answer position is a sum of
what each component wrote: the token (and positional) embedding, every attention head
(``z @ W_O``), each layer's attention bias ``b_O``, and each MLP. The final LayerNorm divides the
centred stream by one scale ``s`` per position; *freezing* that scale at its value in the run makes
the logit linear in the components::

    logit[t] = sum_c (c - mean(c)) / s · W_U[:, t]  +  b_U[t]  (+ mean_logit)

This is exact only once the final LayerNorm's weight and bias are folded into ``W_U``/``b_U``
(TransformerLens's ``logit_attrs`` on an unfolded model silently drops them), so it is computed on
the copy :func:`interp.layernorm.fold_layernorm` returns. That copy's unembedding is centred, which
lowers every logit at a position by their mean over the vocabulary; for a single logit that mean
is added back as the named term ``mean_logit`` so that ``total`` equals the ORIGINAL model's
logit. For a logit difference it cancels and is left out.

Every result is checked before it is returned: the rows must add up to the logit (difference)
the models really produce, or :class:`AttributionError` is raised.

**Logit lens.** The accumulated residual stream after the embeddings and after each block is read
through the model's own final LayerNorm (statistics recomputed for each layer) and unembedding;
the last row is the model's output, which is checked.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from interp.caching import Prompt, run_cached, to_tokens
from interp.layernorm import fold_info, fold_layernorm, is_folded

__all__ = [
    "AttributionError",
    "TokenError",
    "COMPONENTS",
    "heads_table",
    "logit_attribution",
    "logit_lens",
    "resolve_token",
    "top_contributors",
]

# row kinds, in the order they appear; "total" is the sum of all others
COMPONENTS = ("embed", "pos_embed", "head", "attn_bias", "mlp", "neuron", "mlp_bias",
              "unembed_bias", "mean_logit", "total")
# The rows must add up to the logit the model computes. float32 activations summed in float64
# agree with a float32 forward pass to ~1e-6 on logits of order 1; rounding grows with the
# logits' size, hence the relative part. A real mistake (an unfolded LayerNorm) is ~0.1.
IDENTITY_ATOL = 1e-4
IDENTITY_RTOL = 1e-5
# The components must add up to the final residual stream (same float32 reasoning, on d_model).
RESID_ATOL = 1e-4
RESID_RTOL = 1e-5


class AttributionError(RuntimeError):
    """A decomposition failed its identity check; the numbers would be wrong, so none are given."""


class TokenError(ValueError):
    """An answer that is not exactly one token of the model's vocabulary."""


def _decode(model, token_id: int) -> str:
    return model.tokenizer.decode([token_id]) if model.tokenizer is not None else str(token_id)


def resolve_token(model, token: str | int, *, role: str = "answer") -> int:
    """The vocabulary id of a single-token ``token`` (text, or an id that is checked)."""
    d_vocab = int(model.cfg.d_vocab)
    if isinstance(token, bool) or not isinstance(token, (str, numbers.Integral)):
        raise TokenError(f"the {role} must be text or a token id, not {type(token).__name__}")
    if isinstance(token, numbers.Integral):
        token = int(token)
        if not 0 <= token < d_vocab:
            raise TokenError(f"the {role} id {token} is outside the vocabulary [0, {d_vocab - 1}]")
        return token
    if not token:
        raise TokenError(f"the {role} is empty; pass a single-token {role} such as ' Paris'")
    if model.tokenizer is None:
        raise TokenError(f"this model has no tokenizer; pass the {role} as a token id")
    ids = model.to_tokens(token, prepend_bos=False, truncate=False)[0].tolist()
    if len(ids) != 1:
        pieces = [_decode(model, i) for i in ids]
        raise TokenError(f"{token!r} tokenises to {len(ids)} tokens {pieces}; pass a "
                         f"single-token {role}")
    return int(ids[0])


def _single_prompt(model, prompt: Prompt) -> Tensor:
    tokens = to_tokens(model, prompt)
    if tokens.shape[0] != 1:
        raise ValueError(f"pass one prompt, not a batch of {tokens.shape[0]}")
    return tokens


def _position(pos: int, n_pos: int) -> int:
    if not -n_pos <= pos < n_pos:
        raise ValueError(f"pos {pos} is out of range for a prompt of {n_pos} tokens")
    return pos % n_pos


def _has_pos_embed(model) -> bool:
    return getattr(model.cfg, "positional_embedding_type", None) == "standard"


@dataclass(frozen=True)
class _Target:
    answer: int
    wrong: int | None

    def direction(self, W_U: Float[Tensor, "d_model d_vocab"]) -> Float[Tensor, " d_model"]:
        d = W_U[:, self.answer].double()
        return d if self.wrong is None else d - W_U[:, self.wrong].double()

    def read(self, logits: Float[Tensor, " d_vocab"]) -> float:
        value = logits[self.answer].double()
        return float(value if self.wrong is None else value - logits[self.wrong].double())


def _components(folded, tokens: Tensor, pos: int, *, neurons: bool):
    """Raw residual-stream writes at ``pos``: labels, stacked vectors, the frozen final-LN
    scale, the final residual stream, and the folded model's logits there."""
    cfg = folded.cfg
    n_layers, n_heads = int(cfg.n_layers), int(cfg.n_heads)
    has_mlp = not getattr(cfg, "attn_only", False)
    hooks = ["hook_embed", "ln_final.hook_scale", f"blocks.{n_layers - 1}.hook_resid_post"]
    hooks += ["hook_pos_embed"] if _has_pos_embed(folded) else []
    if has_mlp:
        hooks += [f"blocks.{layer}.hook_mlp_out" for layer in range(n_layers)]
        hooks += [f"blocks.{layer}.mlp.hook_post" for layer in range(n_layers)] if neurons else []
    run = run_cached(folded, tokens, head_outputs=True, hooks=hooks)

    def at(name: str) -> Tensor:
        return run[name][0, pos].double()

    labels: list[tuple] = [("embed", None, None, None)]
    vectors: list[Tensor] = [at("hook_embed")[None]]
    if _has_pos_embed(folded):
        labels.append(("pos_embed", None, None, None))
        vectors.append(at("hook_pos_embed")[None])
    heads = run.head_outputs()[:, 0, pos].double()  # [layer head d_model]
    b_O = folded.b_O.detach().double()
    if has_mlp:
        W_out, b_out = folded.W_out.detach().double(), folded.b_out.detach().double()
    for layer in range(n_layers):
        labels += [("head", layer, head, None) for head in range(n_heads)]
        vectors.append(heads[layer])
        labels.append(("attn_bias", layer, None, None))
        vectors.append(b_O[layer][None])
        if not has_mlp:
            continue
        mlp_out = at(f"blocks.{layer}.hook_mlp_out")
        if not neurons:
            labels.append(("mlp", layer, None, None))
            vectors.append(mlp_out[None])
            continue
        post = at(f"blocks.{layer}.mlp.hook_post")  # [d_mlp]
        per_neuron = post[:, None] * W_out[layer]  # [d_mlp d_model]
        _check_sum(per_neuron.sum(0) + b_out[layer], mlp_out, f"layer {layer}'s neurons + b_out",
                   "its MLP output")
        labels += [("neuron", layer, None, n) for n in range(per_neuron.shape[0])]
        labels.append(("mlp_bias", layer, None, None))
        vectors += [per_neuron, b_out[layer][None]]
    stack = torch.cat(vectors)  # [component d_model]
    x = at(f"blocks.{n_layers - 1}.hook_resid_post")
    _check_sum(stack.sum(0), x, "the components", "the final residual stream")
    scale = float(run["ln_final.hook_scale"][0, pos, 0])
    return labels, stack, scale, x, run.logits[0, pos]


def _check_sum(total: Tensor, reference: Tensor, what: str, against: str) -> None:
    error = float((total - reference).abs().max())
    bound = RESID_ATOL + RESID_RTOL * float(reference.abs().max())
    if not error <= bound:
        raise AttributionError(f"{what} add up to {against} only within {error:.3g} (allowed "
                               f"{bound:.3g}); this architecture's residual stream is not the sum "
                               "interp decomposes, so no attribution is given")


def _check_identity(total: float, reference: float, logits: Tensor, against: str) -> float:
    error = abs(total - reference)
    bound = IDENTITY_ATOL + IDENTITY_RTOL * float(logits.abs().max())
    if not error <= bound:
        raise AttributionError(f"the attributions add up to {total:.6g} but {against} is "
                               f"{reference:.6g} (error {error:.3g} > {bound:.3g}); refusing to "
                               "return numbers that do not add up")
    return error


def logit_attribution(
    model,
    prompt: Prompt,
    answer: str | int,
    *,
    wrong: str | int | None = None,
    pos: int = -1,
    neurons: bool = False,
) -> pd.DataFrame:
    """Direct logit attribution of the ``answer`` logit (or ``answer - wrong``) at ``pos``.

    Args:
        model: a TransformerBridge with LayerNorm. An unfolded model is folded into a copy here
            (:func:`interp.layernorm.fold_layernorm`) and its own logits are the reference the
            rows must add up to; pass an already folded model to fold once for many calls.
        prompt: one prompt (text or token ids), tokenised like ``interp.run_cached``.
        answer: the token whose logit is decomposed: single-token text or a token id.
        wrong: a counterfactual token; the logit difference ``answer - wrong`` is decomposed.
        pos: the position whose prediction is explained (default the last).
        neurons: split each MLP row into one row per neuron plus ``mlp_bias``.

    Returns:
        DataFrame with columns ``component, layer, head, contribution`` (plus ``neuron`` when
        ``neurons``); ``layer``/``head``/``neuron`` are nullable integers, missing where they do
        not apply. Rows: ``embed``, ``pos_embed`` (learned positions only), per layer every
        ``head``, ``attn_bias`` (``b_O``, which holds the folded value biases) and ``mlp`` (or
        ``neuron`` rows and ``mlp_bias``); then ``unembed_bias``, ``mean_logit`` (single logit
        only; see the module docstring) and ``total``, which equals the original model's logit
        (difference). ``df.attrs`` records the tokens, the position, the reference value and
        the measured identity error.

    Raises:
        TokenError: ``answer``/``wrong`` is not a single token.
        AttributionError: the rows do not add up to the model's logit.
        interp.layernorm.FoldError: the model cannot be folded.
    """
    tokens = _single_prompt(model, prompt)
    target = _Target(resolve_token(model, answer),
                     None if wrong is None else resolve_token(model, wrong, role="wrong answer"))
    if target.wrong == target.answer:
        raise TokenError("the answer and the wrong token are the same token; their logit "
                         "difference is 0 by definition")
    position = _position(pos, tokens.shape[1])
    folded = model if is_folded(model) else fold_layernorm(model)
    info = fold_info(folded)

    labels, stack, scale, x, folded_logits = _components(folded, tokens, position,
                                                         neurons=neurons)
    direction = target.direction(folded.W_U.detach())
    # (c - mean c) · d == c · (d - mean d): centre the direction once instead of every vector
    contributions = stack @ (direction - direction.mean()) / scale
    b_U = folded.b_U.detach().double()
    bias = b_U[target.answer] - (0.0 if target.wrong is None else b_U[target.wrong])
    labels.append(("unembed_bias", None, None, None))
    values = contributions.tolist() + [float(bias)]
    folded_total = sum(values)
    _check_identity(folded_total, target.read(folded_logits), folded_logits,
                    "the folded model's logit")
    if target.wrong is None and info.center_unembed:
        x_hat = (x - x.mean()) / scale
        labels.append(("mean_logit", None, None, None))
        values.append(float(info.mean_logit(x_hat)))
    total = sum(values)
    if folded is model:
        reference, against = total, "the folded model's logit plus its mean"
        error = abs(folded_total - target.read(folded_logits))
    else:
        with torch.inference_mode():
            logits = model(tokens.to(model.cfg.device), return_type="logits")[0, position]
        reference, against = target.read(logits), "the model's logit"
        error = _check_identity(total, reference, logits, against)
    labels.append(("total", None, None, None))
    values.append(total)

    columns = ["component", "layer", "head"] + (["neuron"] if neurons else [])
    frame = pd.DataFrame([label[:3] + ((label[3],) if neurons else ()) for label in labels],
                         columns=columns)
    for column in columns[1:]:
        frame[column] = frame[column].astype("Int64")
    frame["contribution"] = pd.Series(values, dtype="float64")
    frame.attrs.update(answer=_decode(model, target.answer), answer_id=target.answer,
                       wrong=None if target.wrong is None else _decode(model, target.wrong),
                       wrong_id=target.wrong, pos=position, n_tokens=int(tokens.shape[1]),
                       reference=reference, reference_is=against, identity_error=error)
    return frame


def top_contributors(frame: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The ``n`` rows with the largest absolute contribution, ``total`` excluded."""
    rows = frame[frame["component"] != "total"]
    order = rows["contribution"].abs().sort_values(ascending=False).index
    return rows.loc[order[:n]].reset_index(drop=True)


def logit_lens(
    model,
    prompt: Prompt,
    answer: str | int | None = None,
    *,
    wrong: str | int | None = None,
    pos: int = -1,
    k: int = 5,
) -> pd.DataFrame:
    """Read the residual stream after the embeddings and after each block as if it were final.

    Each state is passed through the model's own final LayerNorm (its statistics recomputed for
    that state, as the model would) and unembedding. Use the unfolded model to read the model's
    own logits; on a folded model with a centred unembedding logits are lower by their mean over
    the vocabulary, probabilities the same.

    Returns:
        DataFrame, one row per state: ``layer`` (blocks applied: 0 is the embeddings,
        ``n_layers`` the model's output), ``label`` (``embed``, ``L0``, ...), when ``answer`` is
        given ``answer_logit, answer_prob, answer_rank`` (0 = top), when ``wrong`` is given also
        ``wrong_logit, wrong_prob, logit_diff``, then ``top1_token, top1_id, top1_prob`` ... up to
        ``k``. The last row is checked against the model's logits.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    tokens = _single_prompt(model, prompt)
    answer_id = None if answer is None else resolve_token(model, answer)
    if wrong is not None and answer_id is None:
        raise ValueError("a wrong token needs an answer to compare with")
    wrong_id = None if wrong is None else resolve_token(model, wrong, role="wrong answer")
    position = _position(pos, tokens.shape[1])
    n_layers = int(model.cfg.n_layers)
    run = run_cached(model, tokens, resid=("post",), hooks=["blocks.0.hook_resid_pre"])
    states = torch.cat([run["blocks.0.hook_resid_pre"][:, position],
                        run.resid("post")[:, 0, position]])  # [layer+1 d_model]
    with torch.inference_mode():
        normed = model.ln_final(states[None])[0]
        logits = normed.double() @ model.W_U.detach().double() + model.b_U.detach().double()
    real = run.logits[0, position].double()
    error = float((logits[-1] - real).abs().max())
    bound = IDENTITY_ATOL + IDENTITY_RTOL * float(real.abs().max())
    if not error <= bound:
        raise AttributionError(f"the logit lens's last row differs from the model's logits by "
                               f"{error:.3g} (> {bound:.3g}): this model's output is not "
                               "final LayerNorm then unembedding, so the lens would mislead")
    log_probs = logits.log_softmax(-1)
    probs = log_probs.exp()
    frame = pd.DataFrame({"layer": range(n_layers + 1),
                          "label": ["embed"] + [f"L{layer}" for layer in range(n_layers)]})
    if answer_id is not None:
        frame["answer_logit"] = logits[:, answer_id].tolist()
        frame["answer_prob"] = probs[:, answer_id].tolist()
        frame["answer_rank"] = (logits > logits[:, answer_id, None]).sum(-1).tolist()
    if wrong_id is not None:
        frame["wrong_logit"] = logits[:, wrong_id].tolist()
        frame["wrong_prob"] = probs[:, wrong_id].tolist()
        frame["logit_diff"] = (logits[:, answer_id] - logits[:, wrong_id]).tolist()
    top = probs.topk(min(k, probs.shape[-1]), dim=-1)
    for i in range(top.indices.shape[1]):
        ids = top.indices[:, i].tolist()
        frame[f"top{i + 1}_token"] = [_decode(model, t) for t in ids]
        frame[f"top{i + 1}_id"] = ids
        frame[f"top{i + 1}_prob"] = top.values[:, i].tolist()
    frame.attrs.update(pos=position, identity_error=error,
                       answer=None if answer_id is None else _decode(model, answer_id),
                       wrong=None if wrong_id is None else _decode(model, wrong_id))
    return frame


def heads_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The ``head`` rows as ``layer, head, contribution`` (for a head heatmap)."""
    heads = frame[frame["component"] == "head"]
    return heads[["layer", "head", "contribution"]].astype(
        {"layer": int, "head": int}).reset_index(drop=True)

