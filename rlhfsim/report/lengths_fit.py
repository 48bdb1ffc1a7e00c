"""The imported length distribution beside its parametric fits: a pure function from records to a plotly
Figure (``lengths_figure``) and a self-contained HTML page around it (``lengths_report_html``).

Records: ``LengthRecords`` (the response lengths, the summary and the fits of ``rlhfsim.lengths.fit``, and
the fitted curves on a grid). Left: histogram of the lengths (density) with the lognormal and Pareto
pdfs. Right: the empirical survival function P(L > x) with the fitted ones on log-log axes, where tails
show. plotly is imported here only; the simulator never imports this module.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import plotly.offline
from plotly.subplots import make_subplots

FIT_COLOURS = {"lognormal": "#f58518", "pareto": "#54a24b"}


@dataclass(frozen=True)
class LengthRecords:
    """What the figure shows: observed ``lengths``, their ``summary``, the ``fits`` and the fitted
    ``curves`` (pdf, sf per fit) on ``grid``."""

    source: str
    lengths: tuple[int, ...]
    summary: dict
    fits: dict
    grid: tuple[float, ...]
    curves: dict


def lengths_figure(rec: LengthRecords) -> go.Figure:
    """Histogram with fitted pdfs, and survival functions on log-log axes (module docstring)."""
    x = np.asarray(rec.lengths, dtype=float)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("response lengths (density)", "P(length > x), log-log"))
    fig.add_trace(go.Histogram(x=x, histnorm="probability density", name="imported", marker_color="#4c78a8",
                               opacity=0.6, nbinsx=min(80, max(10, int(np.sqrt(x.size))))), row=1, col=1)
    xs = np.sort(x)
    sf = 1.0 - np.arange(1, xs.size + 1) / xs.size
    keep = sf > 0
    fig.add_trace(go.Scatter(x=xs[keep], y=sf[keep], mode="lines", line={"shape": "hv", "color": "#4c78a8"},
                             name="imported (empirical)"), row=1, col=2)
    for name, c in rec.curves.items():
        f = rec.fits[name]
        label = f"{name} fit (KS {f['ks']:.3f})"
        fig.add_trace(go.Scatter(x=rec.grid, y=c["pdf"], mode="lines", name=label, line={"color": FIT_COLOURS[name]},
                                 legendgroup=name), row=1, col=1)
        fig.add_trace(go.Scatter(x=rec.grid, y=c["sf"], mode="lines", name=label, showlegend=False,
                                 line={"color": FIT_COLOURS[name], "dash": "dash"}, legendgroup=name), row=1, col=2)
    fig.update_xaxes(title_text="tokens", row=1, col=1)
    fig.update_xaxes(title_text="tokens", type="log", row=1, col=2)
    fig.update_yaxes(type="log", row=1, col=2)
    s = rec.summary
    fig.update_layout(template="plotly_white", height=460,
                      title={"text": html.escape(f"{rec.source}: {s['n']} responses, median {s['median']:.0f}, "
                                                 f"p99 {s['p99']:.0f}, max {s['max']:.0f} "
                                                 f"({100 * s['capped_fraction']:.0f}% at the max)", quote=False)})
    return fig


def lengths_report_html(rec: LengthRecords) -> str:
    """One self-contained page: the figure, the summary and the fits as scenario blocks."""
    div = plotly.offline.plot(lengths_figure(rec), output_type="div", include_plotlyjs=True)
    rows = "".join(f"<tr><td>{html.escape(n)}</td><td><code>{html.escape(json.dumps(f['dist']))}</code></td>"
                   f"<td>{f['ks']:.4f}</td><td>{f['loglik']:.1f}</td></tr>" for n, f in rec.fits.items())
    summ = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.4g}</td></tr>" for k, v in rec.summary.items())
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(rec.source)}</title></head>"
            f"<body style='font-family: system-ui, sans-serif; max-width: 1300px; margin: 24px auto'>"
            f"<h1>Imported response lengths</h1><p>{html.escape(rec.source)}</p>{div}"
            f"<h2>Summary</h2><table border='1' cellpadding='4'>{summ}</table>"
            f"<h2>Fits (paste into workload.response_length)</h2><table border='1' cellpadding='4'>"
            f"<tr><th>fit</th><th>scenario block</th><th>KS statistic</th><th>log-likelihood</th></tr>{rows}</table>"
            f"</body></html>")
