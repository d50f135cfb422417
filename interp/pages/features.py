"""The page of ``interp features``: for each top SAE feature, its figures, its logit effects,
its top-activating contexts (tokens shaded by the feature's activation) and a histogram of its
nonzero activations. Every token string is text (escaped), never markup."""

from __future__ import annotations

import plotly.graph_objects as go

from interp.pages.html import Report
from interp.pages.plot_style import theme

__all__ = ["features_report"]


def _histogram(counts, edges, feature: int) -> go.Figure:
    centres = (edges[:-1] + edges[1:]) / 2
    fig = go.Figure(go.Bar(x=centres.tolist(), y=counts.tolist(), marker_color="#d97706"))
    fig.update_layout(
        template=theme(),
        height=220,
        margin=dict(l=50, r=20, t=40, b=40),
        title=dict(text=f"feature {feature}: nonzero activations"),
        xaxis_title="activation",
        yaxis_title="tokens",
        bargap=0.05,
    )
    return fig


def features_report(title: str, summary, info: dict) -> str:
    """The HTML page of a :class:`interp.saes.features.FeatureSummary`; ``info``: what was
    scanned (shown as text: model, SAE, tokens)."""
    report = Report(title)
    lines = [f"{key}: {value}" for key, value in info.items()]
    lines.append(
        f"{summary.n_tokens} tokens scanned; {summary.n_dead} features never fired on them. "
        "Features ranked by their mean activation over all tokens (frequency x mean_act)."
    )
    report.add_text("\n".join(lines))
    report.add_table(summary.table, caption="top features", max_rows=len(summary.table) or 1)
    for row in summary.table.itertuples(index=False):
        j = int(row.feature)
        report.add_heading(f"Feature {j}")
        report.add_text(
            f"fires on {row.frequency:.2%} of tokens, mean {row.mean_act:.3f} when active, "
            f"max {row.max_act:.3f}\n"
            f"promotes: {row.top_promoted}\nsuppresses: {row.top_suppressed}"
        )
        contexts = summary.contexts[j]
        report.add_tokens(
            [(c.tokens, c.activations, c.center) for c in contexts],
            caption="top-activating contexts: shade = activation (outlined: the top token); "
            "hover a token for its value",
        )
        counts, edges = summary.histograms[j]
        report.add_figure(_histogram(counts, edges, j))
    return report.to_html()
