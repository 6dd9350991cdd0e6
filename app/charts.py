"""ECharts options for the run page and Compare: bucket envelopes in, a JSON-ready option dict out.

Pure functions (no Streamlit, no store). Stacked panels share one x axis
(step, tokens or wall-clock time): a grid per panel, zoomed together (wheel
or slider on the client; a box selection re-queries at full resolution).
Streamlit ships ECharts in a chunk a quarter the size of Plotly's, which is
most of what a first visit waits for (``bench/browser_speed.py``).

Every text that reaches the option passes ``escape.echarts`` here; none is
ever used as a ``formatter`` template. The main line is solid; an abandoned
branch is dimmed, labelled from its cut (``segment_cuts``), and kept out of
the y range, which follows the main line: a branch's blow-up beyond it is
stated in words on the panel instead of flattening the healthy curve.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa

from runwatch.app import escape, series

MAIN_COLOR = "#1f4e79"
BRANCH_COLOR = "#8a96a3"
VALIDATION_COLOR = "#d35400"
NONFINITE_COLOR = "#c0392b"
ADVISED_COLOR = "#1e8449"
SEVERITY_COLORS = {"critical": "#e74c3c", "warning": "#f39c12", "info": "#3498db", "history": "#95a5a6"}
CLOSED_COLOR = "#95a5a6"
"""Every closed finding is shaded alike, whatever its kind: grey, lighter than an open one."""
MARK_STYLE = {"checkpoint": ("triangle", "#2c3e50"), "resume": ("diamond", "#8e44ad"), "advised": ("pin", ADVISED_COLOR),
              "ack": ("circle", "#16a085"), "silence": ("rect", "#7f8c8d")}
RUN_COLORS = ("#1f4e79", "#d35400", "#27ae60", "#8e44ad", "#c0392b", "#16a085", "#7f8c8d", "#2c3e50", "#b7950b",
              "#2e86c1")
X_TITLES = {"step": "step", "tokens": "tokens", "time": "wall-clock time (UTC)"}
VALIDATION_LOSS = re.compile(r"^(?:val|test)_(?:.+_)?loss$")
"""Validation or test loss columns (``val_loss``, ``val_NAME_loss``, ``test_loss``): drawn on the loss panel."""

PANEL_HEIGHT, PANEL_GAP, TOP, STRIP_HEIGHT, BOTTOM = 150, 46, 64, 34, 78


@dataclass(frozen=True)
class Chart:
    """An ECharts option, the height (px) its stacked grids need, and what it shows in words."""

    option: dict
    height: int
    summary: str = ""
    """The chart in one line of text (panels, lines, off-scale peaks, findings, the advised checkpoint): its
    accessible description, which a screen reader reads in place of the canvas."""


@dataclass(frozen=True)
class Panel:
    """One stacked chart of the run page."""

    column: str
    title: str
    log_y: bool = False
    """Log scale unless the viewer says otherwise."""


PANELS: tuple[Panel, ...] = (
    Panel("loss", "loss"),
    Panel("grad_norm", "grad norm"),
    Panel("lr", "learning rate"),
    Panel("loss_scale", "loss scale", log_y=True),
    Panel("act_norm", "final-layer act norm"),
    Panel("step_time", "step time (s)"),
)
PANEL_COLUMNS: tuple[str, ...] = tuple(p.column for p in PANELS)


@dataclass(frozen=True)
class View:
    """How the viewer looks at the run: the x axis, which panels on a log scale, the x range in view."""

    x: str = "step"
    """'step', 'tokens' or 'time' (unix seconds, drawn as UTC wall-clock)."""
    log: frozenset[str] = frozenset(p.column for p in PANELS if p.log_y)
    """Columns drawn on a log y axis."""
    x_range: tuple[float, float] | None = None
    """The x range in view (x units), or None for everything."""
    overlays: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Panel column -> other columns drawn on it (validation loss on the loss panel)."""


def panels_for(columns: Sequence[str], extras: Sequence[str] = ()) -> list[Panel]:
    """The standard panels the run has data for, then the chosen extras (each its own panel)."""
    have = set(columns)
    out = [p for p in PANELS if p.column in have or p.column == "step_time"]
    return out + [Panel(c, escape.echarts(c)) for c in extras if c in have and c not in PANEL_COLUMNS]


def extra_columns(columns: Sequence[str], record: Sequence[str]) -> list[str]:
    """Columns a run records beyond the record and the standard panels (validation loss aside): selectable."""
    skip = set(record) | set(PANEL_COLUMNS) | {"run", "segment", "rank"}
    return sorted(c for c in columns if c not in skip and not VALIDATION_LOSS.match(c))


def _axis_x(values: np.ndarray | float, x: str) -> np.ndarray | float:
    """ECharts time axes take milliseconds."""
    return values * 1000.0 if x == "time" else values


def _points(xs: np.ndarray, ys: np.ndarray, x: str) -> list[list[float | None]]:
    xs = _axis_x(np.asarray(xs, float), x)
    ys = np.asarray(ys, float)
    out = np.stack([xs, ys], axis=1).tolist()
    for i in np.flatnonzero(~np.isfinite(ys)):  # a gap (JSON has no NaN)
        out[i][1] = None
    return out


def fmt_x(value: float, x: str) -> str:
    """An x value as the viewer reads it: a step, a token count, or a UTC time."""
    if x == "time":
        return datetime.fromtimestamp(value, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{x} {value:,.0f}"


def _grid_top(i: int) -> int:
    return TOP + i * (PANEL_HEIGHT + PANEL_GAP)


def _y_axis(i: int, log: bool, y: tuple[float, float] | None) -> dict:
    axis: dict = {"gridIndex": i, "type": "log" if log else "value", "scale": True,
                  "axisLabel": {"showMinLabel": False, "showMaxLabel": False, "fontSize": 11},
                  "splitLine": {"lineStyle": {"color": "#eceff1"}}}
    if y is not None:
        axis["min"], axis["max"] = y
        if log:
            ticks = series.log_ticks(*y)
            axis["axisLabel"] = {"customValues": ticks, "fontSize": 11}
            axis["axisTick"] = {"customValues": ticks}
    return axis


def _line(name: str, i: int, points: list, color: str, *, width: float = 1.4, opacity: float = 1.0,
          dashed: bool = False) -> dict:
    return {"type": "line", "name": name, "xAxisIndex": i, "yAxisIndex": i, "data": points, "showSymbol": False,
            "symbolSize": 3, "connectNulls": False, "animation": False,
            "lineStyle": {"color": color, "width": width, "opacity": opacity, "type": "dashed" if dashed else "solid"},
            "itemStyle": {"color": color, "opacity": opacity}, "emphasis": {"disabled": True}}


def _panel_series(i: int, panel: Panel, tables: Mapping[str, pa.Table], view: View,
                  abandoned_from: Mapping[int, int]) -> tuple[list[dict], tuple[float, float] | None, list[str]]:
    """One panel's lines (main, branches, overlays, NaN markers), its y range and its off-scale notes."""
    ds = tables[panel.column]
    log = panel.column in view.log
    overlays = [c for c in view.overlays.get(panel.column, ()) if c in tables and tables[c].num_rows]
    y = series.y_range([series.main_part(ds)] + [series.main_part(tables[c]) for c in overlays], log=log)
    out: list[dict] = []
    xs, ys = series.main_line(ds)
    if xs.size:
        out.append(_line("main line", i, _points(xs, ys, view.x), MAIN_COLOR))
    branches = series.branch_parts(ds)
    for seg, part in branches.items():
        bx, by = series.envelope(part)
        cut = abandoned_from.get(seg)  # the first abandoned step: the resume step s plus one
        name = f"seg {seg} abandoned" + (f" (resume @ {cut - 1:,})" if cut is not None else "")
        out.append(_line(name, i, _points(bx, by, view.x), BRANCH_COLOR, width=1.1, opacity=0.5, dashed=True))
    for column in overlays:
        vx, vy = series.main_line(tables[column])
        line = _line(escape.echarts(column.replace("_", " ")), i, _points(vx, vy, view.x), VALIDATION_COLOR, width=1.6)
        line.update(showSymbol=True, symbol="circle", symbolSize=5)
        out.append(line)
    nx, counts = series.nonfinite_points(ds)
    if nx.size:
        top = y[1] if y is not None else 0.0
        out.append({"type": "scatter", "name": "NaN/Inf", "xAxisIndex": i, "yAxisIndex": i, "animation": False,
                    "symbol": "path://M0,0L10,10M10,0L0,10", "symbolSize": 10, "itemStyle": {"color": NONFINITE_COLOR},
                    "tooltip": {"trigger": "item"}, "clip": False,
                    "data": [{"value": p, "name": f"{int(c)} non-finite value(s)"}
                             for p, c in zip(_points(nx, np.full(nx.size, top), view.x), counts)]})
    notes = [f"seg {o.segment} abandoned branch {'peaks at' if o.above else 'dips to'} {o.value:.4g} "
             f"({fmt_x(o.x, view.x)}): off this scale" for o in series.off_scale(branches, y)]
    return out, y, notes


def _bands_for(i: int, panel: Panel, bands: Sequence[Mapping], first_panel_of: dict[int, int], x: str,
               min_label_width: float = 0.0) -> dict:
    """The panel's finding bands (markArea) and onset edges (markLine); each band labelled on its first panel.

    A closed band narrower than ``min_label_width`` (x units) goes unlabelled: a
    run's many short closed stalls would print their names over each other
    (they are all in the findings list below the chart).
    """
    areas, edges = [], []
    for b_i, band in enumerate(bands):
        only = band.get("panels")
        if only and panel.column not in only:
            continue
        first_panel_of.setdefault(b_i, i)
        is_open = bool(band.get("open", True))
        color = SEVERITY_COLORS.get(band.get("severity", "warning"), SEVERITY_COLORS["warning"]) if is_open \
            else CLOSED_COLOR
        x0, x1 = float(band["x0"]), float(band["x1"])
        if x1 <= x0:
            x1 = x0 + max(abs(x0) * 1e-3, 1.0)  # a one-step finding still gets a visible band
        wide = is_open or x1 - x0 >= min_label_width
        label = {"show": first_panel_of[b_i] == i and wide, "position": "insideTopLeft", "color": color,
                 "fontSize": 12}
        areas.append([{"name": escape.echarts(band.get("label", "")), "xAxis": _axis_x(x0, x),
                       "itemStyle": {"color": color, "opacity": 0.2 if is_open else 0.12}, "label": label},
                      {"xAxis": _axis_x(x1, x)}])
        edges.append({"xAxis": _axis_x(x0, x), "lineStyle": {"color": color, "width": 1.5, "type": "solid"},
                      "label": {"show": False}})
    return {"markArea": {"silent": True, "data": areas}, "markLine": {"silent": True, "symbol": "none", "data": edges}}


def _carrier(i: int, marks: dict) -> dict:
    """An empty series whose marks (bands, edges, the advised checkpoint) belong to panel ``i``."""
    return {"type": "line", "name": f"marks {i}", "xAxisIndex": i, "yAxisIndex": i, "data": [], "animation": False,
            "tooltip": {"show": False}, **marks}


def _advised_line(advised: Mapping | None, x: str, label: bool) -> list[dict]:
    if not advised:
        return []
    # The line's own label is short (it runs along a panel's height); the strip's marker has the whole text.
    return [{"xAxis": _axis_x(float(advised["x"]), x), "lineStyle": {"color": ADVISED_COLOR, "width": 2, "type": "dashed"},
             "label": {"show": label, "formatter": "{b}", "position": "insideEndTop", "color": ADVISED_COLOR,
                       "fontWeight": "bold"},
             "name": "roll back here"}]


def _strip(i: int, marks: Sequence[Mapping], x: str) -> list[dict]:
    """Checkpoints, resumes, the advised checkpoint, acknowledgements and silences as markers on a thin strip."""
    out = []
    for kind, (symbol, color) in MARK_STYLE.items():
        items = [{"value": [_axis_x(float(m["x"]), x), 0], "name": escape.echarts(m["text"])}
                 for m in marks if m["kind"] == kind]
        if items:
            out.append({"type": "scatter", "name": kind, "xAxisIndex": i, "yAxisIndex": i, "data": items,
                        "symbol": symbol, "symbolSize": 16 if kind == "advised" else 10, "animation": False,
                        "itemStyle": {"color": color}, "tooltip": {"trigger": "item"}, "z": 5 if kind == "advised" else 3})
    return out


def _table_extent(tables: Mapping[str, pa.Table], columns: Sequence[str]) -> tuple[float, float] | None:
    """The x range the buckets of ``columns`` cover (x units), or None when there are none."""
    lo = [float(np.nanmin(tables[c]["x_first"].to_numpy(zero_copy_only=False))) for c in columns if tables[c].num_rows]
    hi = [float(np.nanmax(tables[c]["x_last"].to_numpy(zero_copy_only=False))) for c in columns if tables[c].num_rows]
    return (min(lo), max(hi)) if lo else None


def _x_extent(all_series: Sequence[dict]) -> tuple[float, float] | None:
    xs = [p[0] if isinstance(p, list) else p["value"][0] for s in all_series for p in s.get("data", [])]
    return (min(xs), max(xs)) if xs else None


def _titles(drawn: Sequence[Panel], view: View, notes: Sequence[list[str]]) -> list[dict]:
    titles = []
    for i, panel in enumerate(drawn):
        top = _grid_top(i) - 24
        suffix = " (log)" if panel.column in view.log else ""
        titles.append({"text": escape.echarts(panel.title) + suffix, "left": 62, "top": top,
                       "textStyle": {"fontSize": 13, "fontWeight": "bold", "color": "#31333f"}})
        if notes[i]:
            titles.append({"text": escape.echarts("; ".join(notes[i])), "right": 24, "top": top + 2,
                           "textStyle": {"fontSize": 12, "fontWeight": "normal", "color": "#5d6d7e"}})
    return titles


def run_chart(tables: Mapping[str, pa.Table], panels: Sequence[Panel], *, view: View = View(),
              bands: Sequence[Mapping] = (), marks: Sequence[Mapping] = (), advised: Mapping | None = None,
              abandoned_from: Mapping[int, int] | None = None) -> Chart:
    """The run page's option: a panel per column with data, then a strip of event markers.

    ``bands``: findings in x units (``views.finding_bands``). ``marks``: dicts
    with ``x``, ``kind`` (a key of ``MARK_STYLE``) and ``text``. ``advised``:
    the rollback checkpoint (``x``, ``text``), drawn as a line on every panel.
    """
    abandoned_from = abandoned_from or {}
    drawn = [p for p in panels if p.column in tables and tables[p.column].num_rows > 0]
    if not drawn:
        return empty_chart("no chartable data in this run yet")
    out_series, y_axes, notes, first_panel_of = [], [], [], {}
    span = view.x_range or _table_extent(tables, [p.column for p in drawn])
    min_label_width = 0.04 * (span[1] - span[0]) if span else 0.0
    for i, panel in enumerate(drawn):
        lines, y, panel_notes = _panel_series(i, panel, tables, view, abandoned_from)
        out_series += lines
        y_axes.append(_y_axis(i, panel.column in view.log, y))
        notes.append(panel_notes)
        carrier = _bands_for(i, panel, bands, first_panel_of, view.x, min_label_width)
        carrier["markLine"]["data"] += _advised_line(advised, view.x, label=i == 0)
        out_series.append(_carrier(i, carrier))
    strip = len(drawn)
    if marks or advised:
        out_series += _strip(strip, list(marks) + ([{**advised, "kind": "advised"}] if advised else []), view.x)
        y_axes.append({"gridIndex": strip, "type": "value", "min": -1, "max": 1, "show": False})
    num_grids = len(y_axes)
    extent = view.x_range if view.x_range is not None else _x_extent(out_series)
    x_axes = []
    for i in range(num_grids):
        axis = {"gridIndex": i, "type": "time" if view.x == "time" else "value", "scale": True,
                "axisLabel": {"show": i == num_grids - 1, "hideOverlap": True, "fontSize": 11},
                "axisTick": {"show": i == num_grids - 1}, "splitLine": {"show": i < len(drawn)},
                "name": X_TITLES[view.x] if i == num_grids - 1 else "", "nameLocation": "middle", "nameGap": 26}
        if extent is not None:
            axis["min"], axis["max"] = (_axis_x(float(extent[0]), view.x), _axis_x(float(extent[1]), view.x))
        x_axes.append(axis)
    grids = [{"left": 72, "right": 28, "top": _grid_top(i), "height": PANEL_HEIGHT} for i in range(len(drawn))]
    if num_grids > len(drawn):
        grids.append({"left": 72, "right": 28, "top": _grid_top(len(drawn)) - 16, "height": STRIP_HEIGHT})
    height = grids[-1]["top"] + grids[-1]["height"] + BOTTOM
    legend = sorted({s["name"] for s in out_series if s["type"] == "line" and s.get("data")}, key=_legend_order)
    summary = _summary(drawn, view, legend, notes, bands, advised)
    return Chart({
        "animation": False, "grid": grids, "xAxis": x_axes, "yAxis": y_axes, "series": out_series,
        "title": _titles(drawn, view, notes),
        "legend": {"top": 4, "left": 120, "data": legend, "textStyle": {"fontSize": 12}},
        "tooltip": {"trigger": "axis", "confine": True, "axisPointer": {"type": "line", "animation": False}},
        "axisPointer": {"link": [{"xAxisIndex": "all"}]},
        "dataZoom": [{"type": "inside", "xAxisIndex": list(range(num_grids)), "filterMode": "none"},
                     {"type": "slider", "xAxisIndex": list(range(num_grids)), "filterMode": "none", "height": 16,
                      "bottom": 8}],
        "brush": {"xAxisIndex": "all", "brushType": "lineX", "brushMode": "single", "throttleType": "debounce",
                  "throttleDelay": 400},
        "toolbox": {"left": 0, "top": 0, "feature": {"brush": {"type": ["lineX", "clear"],
                                                                 "title": {"lineX": "select a range to zoom into",
                                                                           "clear": "clear the selection"}}}},
    }, height, summary)


def _summary(drawn: Sequence[Panel], view: View, legend: Sequence[str], notes: Sequence[list[str]],
             bands: Sequence[Mapping], advised: Mapping | None) -> str:
    parts = ["charts by " + X_TITLES[view.x] + ": " + ", ".join(
        escape.echarts(p.title) + (" (log)" if p.column in view.log else "") for p in drawn)]
    parts.append("lines: " + ", ".join(legend))
    parts += [escape.echarts(n) for panel_notes in notes for n in panel_notes]
    if bands:
        parts.append("findings: " + ", ".join(
            escape.echarts(b.get("label", "")) + (" (open)" if b.get("open", True) else " (closed)") for b in bands))
    if advised:
        parts.append(escape.echarts(advised["text"]))
    return "; ".join(parts)


def _legend_order(name: str) -> tuple[int, str]:
    return (0 if name == "main line" else 2 if name.startswith("seg ") else 1, name)


def empty_chart(message: str) -> Chart:
    return Chart({"title": {"text": escape.echarts(message), "left": "center", "top": "middle",
                            "textStyle": {"fontSize": 15, "fontWeight": "normal", "color": "#5d6d7e"}},
                  "xAxis": {"show": False}, "yAxis": {"show": False}, "series": []}, 160)


COMPARE_LABEL_LINE = 14
"""Pixels between two runs' band labels on the compare chart (one line of the 12 px label font)."""


def compare_chart(tables_by_run: Mapping[str, Mapping[str, pa.Table]], columns: Sequence[str], *,
                  colors: Mapping[str, str], x: str = "tokens",
                  bands_by_run: Mapping[str, Sequence[Mapping]] | None = None) -> Chart:
    """Several runs' main lines overlaid, one panel per column; each run keeps its own colour, and its
    findings are bands in that colour, labelled with the run."""
    present = [c for c in columns if any(c in t and t[c].num_rows for t in tables_by_run.values())]
    if not present:
        return empty_chart("the selected runs have no common chartable column")
    titles = {p.column: p.title for p in PANELS}
    out_series: list[dict] = []
    for run, tables in tables_by_run.items():
        for i, column in enumerate(present):
            ds = tables.get(column)
            if ds is None or ds.num_rows == 0:
                continue
            xs, ys = series.main_line(ds)
            out_series.append(_line(escape.echarts(run), i, _points(xs, ys, x), colors[run], width=1.5))
    for k, (run, bands) in enumerate((bands_by_run or {}).items()):
        labelled = [{**b, "label": f"{run}: {b.get('label', '')}"} for b in bands]
        for i, column in enumerate(present):
            carrier = _bands_for(i, Panel(column, column), labelled, {}, x)
            for area in carrier["markArea"]["data"]:
                area[0]["itemStyle"]["color"] = colors[run]
                area[0]["label"]["color"] = colors[run]
                area[0]["label"]["show"] = i == 0
                # Each run's labels on a line of their own: two runs' findings at the same steps overlapped.
                area[0]["label"]["offset"] = [0, COMPARE_LABEL_LINE * k]
            for edge in carrier["markLine"]["data"]:
                edge["lineStyle"]["color"] = colors[run]
            out_series.append(_carrier(i, carrier))
    n = len(present)
    extent = _x_extent(out_series)
    x_axes = [{"gridIndex": i, "type": "time" if x == "time" else "value", "scale": True,
               "axisLabel": {"show": i == n - 1, "hideOverlap": True}, "name": X_TITLES[x] if i == n - 1 else "",
               "nameLocation": "middle", "nameGap": 26,
               **({"min": extent[0], "max": extent[1]} if extent else {})} for i in range(n)]
    y_axes = [{"gridIndex": i, "type": "log" if c == "loss_scale" else "value", "scale": True,
               "axisLabel": {"showMinLabel": False, "showMaxLabel": False}} for i, c in enumerate(present)]
    option = {
        "animation": False, "series": out_series, "xAxis": x_axes, "yAxis": y_axes,
        "grid": [{"left": 72, "right": 28, "top": _grid_top(i), "height": PANEL_HEIGHT} for i in range(n)],
        "title": [{"text": escape.echarts(titles.get(c, c)), "left": 62, "top": _grid_top(i) - 24,
                   "textStyle": {"fontSize": 13, "fontWeight": "bold", "color": "#31333f"}} for i, c in enumerate(present)],
        "legend": {"top": 4, "left": 0, "data": [escape.echarts(r) for r in tables_by_run]},
        "tooltip": {"trigger": "axis", "confine": True}, "axisPointer": {"link": [{"xAxisIndex": "all"}]},
        "dataZoom": [{"type": "inside", "xAxisIndex": list(range(n)), "filterMode": "none"},
                     {"type": "slider", "xAxisIndex": list(range(n)), "filterMode": "none", "height": 16, "bottom": 8}],
    }
    return Chart(option, _grid_top(n - 1) + PANEL_HEIGHT + BOTTOM)


def run_colors(all_runs: Sequence[str], picked: Sequence[str] = ()) -> dict[str, str]:
    """A colour per run from its place among all runs of the root (sorted), so a run keeps its colour
    whatever else is selected. A root has more runs than the palette has colours, so two picked runs can
    share one: the later of them (in that order) takes the first colour no picked run has, and no two
    lines of an overlay of up to ``len(RUN_COLORS)`` runs look alike."""
    order = sorted(all_runs)
    colors = {run: RUN_COLORS[i % len(RUN_COLORS)] for i, run in enumerate(order)}
    place = {run: i for i, run in enumerate(order)}
    taken: set[str] = set()
    for run in sorted((r for r in set(picked) if r in colors), key=place.__getitem__):
        if colors[run] in taken:
            colors[run] = next((c for c in RUN_COLORS if c not in taken), colors[run])
        taken.add(colors[run])
    return colors
