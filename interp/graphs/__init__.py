"""Attribution graphs: a prompt's local replacement model, the direct effects between its
transcoder features, errors, tokens and logits, and the method's pruning and scores.

The door: :func:`attribution_graph` (one prompt; :func:`estimate_graph_bytes` its memory) gives an
:class:`AttributionGraph`; :func:`interp.graphs.task_graph.task_graph` a :class:`TaskGraph` over
a task's rows (not a name here: the module of that name would hide it);
:func:`graphs_of_prompts` / :func:`iter_graphs` one graph per prompt; :func:`graph_scores` the
method's scores; :func:`head_loadings`, :func:`qk_attribution` and :func:`attention_pairs` the
attention inside a graph; :func:`feature_intervention` and :func:`frozen_feature_run` the
interventions its edges predict; :func:`frontend_json` circuit-tracer's file.
"""

from __future__ import annotations

from interp.foundation.doors import exports, lazy_package

# public name -> its module, imported on first use (importing the package stays cheap)
_EXPORTS = exports(
    __name__,
    {
        ".attribute": ("attribution_graph", "estimate_graph_bytes"),
        ".graph": ("AttributionGraph",),
        ".task_graph": ("TaskGraph",),
        ".many": ("graphs_of_prompts", "iter_graphs"),
        ".influence": ("graph_scores",),
        ".heads": ("head_loadings",),
        ".qk": ("qk_attribution", "attention_pairs"),
        ".interventions": ("feature_intervention", "frozen_feature_run", "FeatureRun", "FrozenRun"),
        ".frontend": ("frontend_json",),
    },
)

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_package(__name__, _EXPORTS)
