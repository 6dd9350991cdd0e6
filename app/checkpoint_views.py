"""Pure builders for the run page's checkpoint panel: the figures as text, and the what-if plot.

No Streamlit here. The panel shows what ``runwatch advise`` prints: the same
``CheckpointAdvice`` and the same wording of each figure (``figure_text``).
The what-if plots the expected hours lost per day (redone work, restarts and
checkpoint writes; Daly's model, ``economics.cadence``) against the
checkpoint interval for a given MTBF and checkpoint cost, with the current,
Young's and Daly's intervals marked, and the cost per day on a second axis.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from runwatch.economics.advice import CheckpointAdvice
from runwatch.economics.cadence import daly_interval, interval_grid, lost_hours_per_day, young_interval
from runwatch.economics.retention import ordinal

CURVE_COLOR = "#1f4e79"
MARKS = {"current": ("#c0392b", "solid"), "Young": ("#7f8c8d", "dot"), "Daly": ("#27ae60", "dash")}


def figure_text(value: float | None, unit: str = "", digits: int = 3) -> str:
    """One figure as the CLI and the panel print it; 'unknown' where the record cannot give it."""
    if value is None:
        return "unknown"
    # Large figures in full (1,200 s, not 1.2e+03 s); others to `digits` significant digits.
    return f"{value:,.0f}{unit}" if abs(value) >= 10 ** digits else f"{value:.{digits}g}{unit}"


def size_text(num_bytes: int | None) -> str:
    if num_bytes is None:
        return "unknown"
    for suffix, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= size:
            return f"{num_bytes / size:.3g} {suffix}"
    return f"{num_bytes} B"


def metric_rows(advice: CheckpointAdvice) -> list[tuple[str, str]]:
    """(label, value) of every figure of ``advise --json``, in its order."""
    d = advice.to_dict()
    cadence = d["cadence"]
    return [
        ("checkpoint cost", figure_text(d["checkpoint_seconds"], " s")),
        ("checkpoint size", size_text(d["checkpoint_bytes"])),
        ("MTBF", figure_text(d["mtbf_hours"], " h")),
        ("interruptions", str(d["interruptions"])),
        ("lost steps", str(d["lost_steps"])),
        ("lost hours", figure_text(d["lost_hours"], " h")),
        ("goodput", figure_text(d["goodput"])),
        ("current interval", figure_text(cadence["current_minutes"], " min")),
        ("Young", figure_text(cadence["young_minutes"], " min")),
        ("Daly", figure_text(cadence["daly_minutes"], " min")),
    ]


def retention_line(advice: CheckpointAdvice) -> str:
    """The ladder in one line; a tier the record cannot size says so."""
    r = advice.retention
    marks = "milestones at steps " + ", ".join(map(str, r.milestones)) if r.milestones else "no milestones"
    if r.keep_last is None or r.every_nth is None:
        return f"last k and every Nth: not sized (see why); {marks}"
    return f"keep the last {r.keep_last}, every {ordinal(r.every_nth)} older, {marks}"


def whatif_figure(delta: float, mtbf: float, *, current: float | None = None, restart: float = 0.0,
                  cost_per_hour: float | None = None) -> go.Figure:
    """Expected hours lost per day against the checkpoint interval (seconds in, minutes on the axis)."""
    young, daly = young_interval(delta, mtbf), daly_interval(delta, mtbf)
    grid = interval_grid([young, daly, current])
    hours = np.asarray(lost_hours_per_day(grid, delta, mtbf, restart))
    fig = go.Figure()
    hover = "interval %{x:.3g} min<br>lost %{y:.3g} h/day"
    if cost_per_hour is not None:
        hover += "<br>$%{customdata:,.2f}/day"
    fig.add_trace(go.Scatter(x=grid / 60.0, y=hours, mode="lines", name="expected hours lost per day",
                             line={"color": CURVE_COLOR, "width": 2.5},
                             customdata=hours * (cost_per_hour or 0.0), hovertemplate=hover + "<extra></extra>"))
    top = float(np.nanmax(hours[np.isfinite(hours)])) if np.isfinite(hours).any() else 24.0
    for name, seconds in (("current", current), ("Young", young), ("Daly", daly)):
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            continue
        at = float(lost_hours_per_day(seconds, delta, mtbf, restart))
        color, dash = MARKS[name]
        text = f"{name} {seconds / 60:.3g} min: {at:.3g} h/day"
        if cost_per_hour is not None:
            text += f" (${at * cost_per_hour:,.2f}/day)"
        fig.add_trace(go.Scatter(x=[seconds / 60.0] * 2, y=[0.0, top], mode="lines", name=text,
                                 line={"color": color, "dash": dash, "width": 2}, hoverinfo="name"))
    fig.update_layout(
        height=360, margin={"l": 60, "r": 70, "t": 40, "b": 50}, template="plotly_white",
        title={"text": f"what if: MTBF {mtbf / 3600:.3g} h, checkpoint {delta:.3g} s, restart {restart:.3g} s",
               "font": {"size": 14}},
        xaxis={"title": "checkpoint interval (min of training)", "type": "log"},
        yaxis={"title": "hours lost per day", "range": [0.0, top * 1.05]},
        legend={"orientation": "h", "y": -0.25})
    if cost_per_hour is not None:
        # The same curve priced: a second axis whose range is the first one's times the hourly cost.
        fig.update_layout(yaxis2={"title": "cost per day ($)", "overlaying": "y", "side": "right",
                                  "range": [0.0, top * 1.05 * cost_per_hour], "showgrid": False})
        fig.add_trace(go.Scatter(x=[grid[0] / 60.0], y=[0.0], yaxis="y2", showlegend=False, hoverinfo="skip",
                                 mode="markers", marker={"opacity": 0}))
    return fig
