"""Figure builders for the dashboard: downsampled series in, ``go.Figure`` out.

Pure functions (no Streamlit, no store): every text that reaches Plotly
(hover text, trace names, annotations) passes ``escape.plotly`` here, so a
caller cannot forget it. The pages fetch per-bucket
first/min/max/last tables from ``Store.downsample_columns`` and hand them
here. Each bucket is drawn as a line through its first, min, max and last
values in x order, so a one-step spike survives any zoom level.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import pyarrow as pa
from plotly.subplots import make_subplots

from runwatch.app import escape


@dataclass(frozen=True)
class Panel:
    """One stacked chart of the run page."""

    column: str
    title: str
    log_y: bool = False


PANELS: tuple[Panel, ...] = (
    Panel("loss", "loss"),
    Panel("grad_norm", "grad norm"),
    Panel("loss_scale", "loss scale (log)", log_y=True),
    Panel("act_norm", "final-layer act norm"),
    Panel("step_time", "step time (s)"),
)

PANELS_COLUMNS: tuple[str, ...] = tuple(p.column for p in PANELS)

MAIN_COLOR = "#1f4e79"
BRANCH_COLOR = "#8a96a3"
NONFINITE_COLOR = "#c0392b"
SEVERITY_COLORS = {"critical": "#e74c3c", "warning": "#f39c12", "info": "#3498db", "history": "#95a5a6"}
RUN_COLORS = ("#1f4e79", "#d35400", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d", "#2c3e50")


def envelope(ds: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """x, y through each bucket's first, min, max and last value, in x order.

    Buckets whose values are all non-finite are skipped (they are drawn as
    markers by ``nonfinite_points``), so a NaN never bends the line.
    """
    if ds.num_rows == 0:
        return np.empty(0), np.empty(0)
    cols = {c: ds[c].to_numpy(zero_copy_only=False).astype(float) for c in
            ("x_first", "first", "x_min", "min", "x_max", "max", "x_last", "last")}
    xs = np.stack([cols["x_first"], cols["x_min"], cols["x_max"], cols["x_last"]], axis=1)
    ys = np.stack([cols["first"], cols["min"], cols["max"], cols["last"]], axis=1)
    keep = np.isfinite(ys).all(axis=1) & np.isfinite(xs).all(axis=1)
    xs, ys = xs[keep], ys[keep]
    order = np.argsort(xs, axis=1, kind="stable")
    xs, ys = np.take_along_axis(xs, order, axis=1).ravel(), np.take_along_axis(ys, order, axis=1).ravel()
    # Drop repeated points (a bucket of one row yields the same point four times).
    same = np.r_[False, (np.diff(xs) == 0) & (np.diff(ys) == 0)]
    return xs[~same], ys[~same]


def nonfinite_points(ds: pa.Table) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Where a bucket held NaN or Inf: x, a y to place the marker at, hover text."""
    if ds.num_rows == 0:
        return np.empty(0), np.empty(0), []
    counts = ds["num_nonfinite"].to_numpy(zero_copy_only=False)
    idx = np.flatnonzero(counts > 0)
    if idx.size == 0:
        return np.empty(0), np.empty(0), []
    xs = ds["x_first"].to_numpy(zero_copy_only=False).astype(float)[idx]
    ys = ds["max"].to_numpy(zero_copy_only=False).astype(float)
    finite = ys[np.isfinite(ys)]
    fallback = float(finite.max()) if finite.size else 0.0
    marker_y = np.where(np.isfinite(ys[idx]), ys[idx], fallback)
    text = [f"{int(counts[i])} non-finite value(s) near x={xs[j]:,.0f}" for j, i in enumerate(idx)]
    return xs, marker_y, text


def _series_traces(ds: pa.Table, abandoned_from: Mapping[int, int]) -> list[go.Scatter]:
    """The main line (solid, one legend entry) and each abandoned branch (dimmed, by segment)."""
    traces: list[go.Scatter] = []
    if ds.num_rows == 0:
        return traces
    segments = ds["segment"].to_numpy(zero_copy_only=False)
    main = ds["main"].to_numpy(zero_copy_only=False).astype(bool)
    for seg in np.unique(segments):
        for is_main in (True, False):
            part = ds.filter(pa.array((segments == seg) & (main == is_main)))
            xs, ys = envelope(part)
            if xs.size == 0:
                continue
            if is_main:
                traces.append(go.Scatter(x=xs, y=ys, mode="lines", name="main line", legendgroup="main",
                                           line={"color": MAIN_COLOR, "width": 1.6}, showlegend=False))
            else:
                start = abandoned_from.get(int(seg))
                label = f"seg {int(seg)} abandoned" + (f" @ {start:,}" if start is not None else "")
                traces.append(go.Scatter(x=xs, y=ys, mode="lines", name=label, legendgroup=f"branch{seg}",
                                           line={"color": BRANCH_COLOR, "width": 1.2, "dash": "dot"},
                                           opacity=0.55, showlegend=False))
    return traces


def run_figure(
    series: Mapping[str, pa.Table], *, x_title: str = "step",
    bands: Sequence[Mapping] = (), checkpoints: Sequence[Mapping] = (), resumes: Sequence[Mapping] = (),
    abandoned_from: Mapping[int, int] | None = None, x_range: tuple[float, float] | None = None,
    panels: Sequence[Panel] = PANELS,
) -> go.Figure:
    """Stacked panels sharing one x axis; only panels whose series has data are drawn.

    ``bands``: dicts with x0, x1, severity, label, open and optionally panels
    (findings, already in x units).
    ``checkpoints`` / ``resumes``: dicts with x and text, drawn as ticks on a
    thin strip under the charts.
    """
    abandoned_from = abandoned_from or {}
    drawn = [p for p in panels if p.column in series and series[p.column].num_rows > 0]
    has_events = bool(checkpoints or resumes)
    num_rows = len(drawn) + (1 if has_events else 0)
    if num_rows == 0:
        return _empty_figure("no chartable data in this run yet")
    heights = [1.0] * len(drawn) + ([0.22] if has_events else [])
    titles = [p.title for p in drawn] + (["checkpoints ▲  resumes ◆"] if has_events else [])
    fig = make_subplots(rows=num_rows, cols=1, shared_xaxes=True, vertical_spacing=0.035,
                        row_heights=heights, subplot_titles=titles)
    fig.update_annotations(font_size=13, x=0, xanchor="left")  # panel titles top-left, before any band label
    legend_done: set[str] = set()
    for row, panel in enumerate(drawn, start=1):
        ds = series[panel.column]
        for trace in _series_traces(ds, abandoned_from):
            if trace.legendgroup not in legend_done:
                trace.showlegend = True
                legend_done.add(trace.legendgroup)
            fig.add_trace(trace, row=row, col=1)
        nx, ny, ntext = nonfinite_points(ds)
        if nx.size:
            fig.add_trace(go.Scatter(x=nx, y=ny, mode="markers", name="NaN/Inf", legendgroup="nonfinite",
                                     showlegend="nonfinite" not in legend_done, hovertext=ntext, hoverinfo="text",
                                     marker={"symbol": "x", "size": 9, "color": NONFINITE_COLOR}), row=row, col=1)
            legend_done.add("nonfinite")
        if panel.log_y:
            fig.update_yaxes(type="log", row=row, col=1)
    if has_events:
        _add_event_strip(fig, num_rows, checkpoints, resumes)
    _add_bands(fig, bands, drawn)
    fig.update_xaxes(title_text=x_title, row=num_rows, col=1)
    if x_range is not None:
        fig.update_xaxes(range=list(x_range))
    fig.update_layout(
        height=150 + 165 * len(drawn) + (45 if has_events else 0),
        margin={"l": 60, "r": 20, "t": 50, "b": 40}, hovermode="x", dragmode="zoom",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0, "font": {"size": 12}},
        font={"size": 13},
    )
    return fig


def _add_event_strip(fig: go.Figure, row: int, checkpoints: Sequence[Mapping], resumes: Sequence[Mapping]) -> None:
    if checkpoints:
        fig.add_trace(go.Scatter(x=[c["x"] for c in checkpoints], y=[0] * len(checkpoints), mode="markers",
                                 name="checkpoint", hovertext=[escape.plotly(c["text"]) for c in checkpoints], hoverinfo="text",
                                 marker={"symbol": "triangle-up", "size": 10, "color": "#2c3e50"},
                                 showlegend=False), row=row, col=1)
    if resumes:
        fig.add_trace(go.Scatter(x=[r["x"] for r in resumes], y=[0] * len(resumes), mode="markers",
                                 name="resume", hovertext=[escape.plotly(r["text"]) for r in resumes], hoverinfo="text",
                                 marker={"symbol": "diamond", "size": 11, "color": "#8e44ad"},
                                 showlegend=False), row=row, col=1)
    fig.update_yaxes(visible=False, range=[-1, 1], fixedrange=True, row=row, col=1)


def _add_bands(fig: go.Figure, bands: Sequence[Mapping], drawn: Sequence[Panel]) -> None:
    """Findings as shaded bands with a solid onset edge, labelled once on the first panel they cover.

    A band with ``panels`` (e.g. a slowdown: step time only) is drawn on those panels alone.
    """
    for band in bands:
        rows = [i for i, p in enumerate(drawn, start=1) if not band.get("panels") or p.column in band["panels"]]
        if not rows:
            continue
        color = SEVERITY_COLORS.get(band.get("severity", "warning"), SEVERITY_COLORS["warning"])
        x0, x1 = float(band["x0"]), float(band["x1"])
        if x1 <= x0:
            x1 = x0 + max(abs(x0) * 1e-3, 1.0)  # a one-step finding still gets a visible band
        for row in rows:
            fig.add_vrect(x0=x0, x1=x1, fillcolor=color, opacity=0.18 if band.get("open", True) else 0.09,
                          line_width=0, layer="below", row=row, col=1)
            fig.add_vline(x=x0, line={"color": color, "width": 1.5}, row=row, col=1)
        fig.add_annotation(x=x0, y=1, yref="y domain", xref="x", text=escape.plotly(band.get("label", "")), showarrow=False,
                           xanchor="left", yanchor="top", font={"size": 12, "color": color}, row=rows[0], col=1)


def compare_figure(
    series_by_run: Mapping[str, Mapping[str, pa.Table]], columns: Sequence[str], *, x_title: str = "tokens",
) -> go.Figure:
    """Several runs' main lines overlaid, one panel per column."""
    present = [c for c in columns if any(c in s and s[c].num_rows for s in series_by_run.values())]
    if not present:
        return _empty_figure("the selected runs have no common chartable column")
    titles = {p.column: p.title for p in PANELS}
    fig = make_subplots(rows=len(present), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[escape.plotly(titles.get(c, c)) for c in present])
    for i, (run, series) in enumerate(series_by_run.items()):
        color = RUN_COLORS[i % len(RUN_COLORS)]
        for row, column in enumerate(present, start=1):
            ds = series.get(column)
            if ds is None or ds.num_rows == 0:
                continue
            xs, ys = envelope(ds.filter(ds["main"]))
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=escape.plotly(run), legendgroup=run, showlegend=row == 1,
                                       line={"color": color, "width": 1.5}), row=row, col=1)
    for row, column in enumerate(present, start=1):
        if column == "loss_scale":
            fig.update_yaxes(type="log", row=row, col=1)
    fig.update_xaxes(title_text=x_title, row=len(present), col=1)
    fig.update_layout(height=120 + 220 * len(present), hovermode="x",
                      margin={"l": 60, "r": 20, "t": 50, "b": 40},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0})
    return fig


def _empty_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=escape.plotly(message), showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 16})
    fig.update_layout(height=200, xaxis={"visible": False}, yaxis={"visible": False})
    return fig


def step_mapper(pairs_step: np.ndarray, pairs_x: np.ndarray) -> Callable[[float], float]:
    """A step -> x (tokens) function by interpolating the main line's (step, tokens) pairs."""
    order = np.argsort(pairs_step)
    steps, xs = np.asarray(pairs_step, float)[order], np.asarray(pairs_x, float)[order]
    if steps.size == 0:
        return lambda s: float(s)
    return lambda s: float(np.interp(float(s), steps, xs))
