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

from runwatch.economics.advice import CheckpointAdvice
from runwatch.economics.cadence import daly_interval, interval_grid, lost_hours_per_day, young_interval
from runwatch.economics.retention import ordinal

CURVE_COLOR = "#1f4e79"
MARKS = {"current": ("#c0392b", "solid"), "Young": ("#7f8c8d", "dotted"), "Daly": ("#27ae60", "dashed")}


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


def whatif_chart(delta: float, mtbf: float, *, current: float | None = None, restart: float = 0.0,
                 cost_per_hour: float | None = None) -> tuple[dict, str]:
    """Expected hours lost per day against the checkpoint interval (seconds in, minutes on the axis).

    An ECharts option (the run page's one chart library: a second one would
    be megabytes more for the browser to load before the run's charts draw)
    and its one-line description, the chart's accessible text: the title,
    then each marked interval with what it loses.
    """
    young, daly = young_interval(delta, mtbf), daly_interval(delta, mtbf)
    grid = interval_grid([young, daly, current])
    hours = np.asarray(lost_hours_per_day(grid, delta, mtbf, restart), dtype=float)
    top = float(np.nanmax(hours[np.isfinite(hours)])) if np.isfinite(hours).any() else 24.0
    curve = [[float(x), float(y) if math.isfinite(y) else None] for x, y in zip(grid / 60.0, hours)]
    series: list[dict] = [{"type": "line", "name": "expected hours lost per day", "data": curve, "showSymbol": False,
                           "lineStyle": {"color": CURVE_COLOR, "width": 2.5}, "itemStyle": {"color": CURVE_COLOR},
                           "animation": False}]
    for name, seconds in (("current", current), ("Young", young), ("Daly", daly)):
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            continue
        at = float(lost_hours_per_day(seconds, delta, mtbf, restart))
        color, dash = MARKS[name]
        text = f"{name} {seconds / 60:.3g} min: {at:.3g} h/day"
        if cost_per_hour is not None:
            text += f" (${at * cost_per_hour:,.2f}/day)"
        series.append({"type": "line", "name": text, "data": [[seconds / 60.0, 0.0], [seconds / 60.0, top * 1.05]],
                       "showSymbol": False, "animation": False, "itemStyle": {"color": color},
                       "lineStyle": {"color": color, "width": 2, "type": dash}})
    title = f"what if: MTBF {mtbf / 3600:.3g} h, checkpoint {delta:.3g} s, restart {restart:.3g} s"
    y_axes = [{"type": "value", "name": "hours lost per day", "nameLocation": "middle", "nameGap": 44,
               "min": 0.0, "max": top * 1.05}]
    if cost_per_hour is not None:  # the same curve priced: a second axis, the first one's range times the cost
        y_axes.append({"type": "value", "name": "cost per day ($)", "nameLocation": "middle", "nameGap": 56,
                       "min": 0.0, "max": top * 1.05 * cost_per_hour, "splitLine": {"show": False}})
    option = {
        "animation": False, "title": {"text": title, "textStyle": {"fontSize": 14}},
        "grid": {"left": 70, "right": 80, "top": 50, "bottom": 110},
        "xAxis": {"type": "log", "name": "checkpoint interval (min of training)", "nameLocation": "middle",
                  "nameGap": 28},
        "yAxis": y_axes, "series": series, "tooltip": {"trigger": "axis"},
        "legend": {"bottom": 0, "data": [s_["name"] for s_ in series]},
    }
    alt = f"{title}. " + "; ".join(s_["name"] for s_ in series[1:]) + (
        "; cost per day ($) on the right axis" if cost_per_hour is not None else "")
    return option, alt
