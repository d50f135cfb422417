"""What a graph says about its top prediction, in sentences a page can show.

:func:`read_prediction` names the most probable logit, lists its strongest direct inputs (the
graph's own entries, row = that logit) and says whether the step is an induction step: the
predicted token already followed an earlier copy of the last token in the prompt
(``... A B ... A`` → ``B``). It then gives the share of the logit's direct input (by
``|A|``) that comes from the earlier ``B``'s position, against the last position: a copy
shows as input read *from where ``B`` was*; a prediction made from the last position's own
features shows as little input from there. Every number is read from the
adjacency; nothing is assumed about the model.
"""

from __future__ import annotations

from collections.abc import Sequence

from interp.graphs.graph import AttributionGraph

__all__ = ["induction_sources", "read_prediction"]


def induction_sources(tokens: Sequence[int], predicted: int) -> list[int]:
    """Positions ``p`` where ``tokens[p] == predicted`` and ``tokens[p - 1]`` is the last token
    (``p`` before the last position): where an induction head would copy ``predicted`` from."""
    last = len(tokens) - 1
    return [p for p in range(1, last) if tokens[p] == predicted and tokens[p - 1] == tokens[last]]


def _label(node, token_strings: Sequence[str]) -> str:
    pos = int(node.pos)
    where = f"position {pos} ({token_strings[pos]!r})"
    if node.kind == "feature":
        return f"layer-{int(node.layer)} feature {int(node.feature)} at {where}"
    if node.kind == "error":
        return f"layer-{int(node.layer)} error at {where}"
    if node.kind == "token":
        return f"token at {where}"
    return f"logit {int(node.token_id)}"


def read_prediction(
    graph: AttributionGraph,
    token_strings: Sequence[str],
    logit_strings: Sequence[str],
    top: int = 5,
) -> list[str]:
    """Sentences on the graph's most probable logit (module docstring).

    Args:
        token_strings: the prompt's tokens as text ``[pos]``.
        logit_strings: the logit nodes' tokens as text, in the graph's logit order.
        top: how many of the logit's strongest inputs to name.
    """
    nodes = graph.nodes
    logits = nodes.index[nodes["kind"] == "logit"]
    if len(logits) == 0:
        return ["The graph has no logit node."]
    index = int(logits[0])  # logits are in descending probability
    target = nodes.iloc[index]
    predicted = int(target.token_id)
    name = logit_strings[0]
    lines = [f"The model predicts {name!r} (p = {float(target.probability):.2f})."]
    row = graph.adjacency[index].double()  # [node]: the logit's direct inputs
    total = float(row.abs().sum())
    if total == 0.0:
        lines.append("Nothing in the graph feeds this logit directly: its inputs are all zero.")
        return lines
    order = row.abs().argsort(descending=True)[:top].tolist()
    named = [f"{_label(nodes.iloc[j], token_strings)} ({float(row[j]):+.2f})" for j in order]
    lines.append("Its strongest direct inputs: " + "; ".join(named) + ".")
    tokens = [int(t) for t in graph.tokens]
    sources = induction_sources(tokens, predicted)
    if not sources:
        lines.append(
            f"Not an induction step: {name!r} never follows an earlier copy of the last token "
            f"{token_strings[-1]!r} in the prompt."
        )
        return lines
    pos = nodes["pos"].to_numpy()
    for p in sources:
        share = float(row[pos == p].abs().sum()) / total
        last = float(row[pos == len(tokens) - 1].abs().sum()) / total
        lines.append(
            f"The prompt sets up an induction step: {token_strings[p - 1]!r} was followed by "
            f"{name!r} at position {p}, and the prompt ends on {token_strings[-1]!r} again. Of "
            f"the logit's direct input (by |weight|), {share:.0%} comes from position {p}, "
            f"where {name!r} was (read there by attention, frozen at this prompt), and "
            f"{last:.0%} from the last position."
        )
    return lines
