"""Layer 4, presentation: results in, figures and pages out. Analyses never import this
package; it never recomputes an analysis.

``html`` (:class:`Report`, the self-contained page), ``assets`` and ``style`` (its inlined
scripts, CSP and style sheet), ``tokens`` (escaped token spans), ``display`` (notebook
frames), ``plotting`` with ``plot_style`` and ``plot_attribution`` (plotly figures), and one
module per analysis page: ``induction``, ``patching`` and ``patching_plots``, ``discovery``
and ``discovery_plots``, ``features``.
"""
