"""The run page's charts: the view controls, the step range (inputs, box selection, the URL), the chart.

Streamlit code for ``screens/run.py``, kept in its own module so that other
sections of the run page merge cleanly. The step range is the one zoom
state: the "from"/"to" inputs, a box drawn on the chart and the page URL
(``?run=NAME&from=A&to=B``, the copyable link) all set it, in steps whatever
the x axis; "full range" clears it and every client-side zoom with it. A
range re-queries the store at full resolution (``Store.downsample_columns``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

import pyarrow as pa
import streamlit as st

from runwatch.app import charts, escape, lifecycle, series, state, views
from runwatch.app.oncall import OnCall, ack_text, silence_text
from runwatch.data.record import METRIC_COLUMNS

X_LABELS = {"step": "step", "tokens": "tokens", "time": "wall-clock"}


@dataclass(frozen=True)
class Request:
    """What the viewer asked to see."""

    x: str
    log: frozenset[str]
    extras: tuple[str, ...]
    steps: tuple[int, int] | None
    """The step range in view (inclusive), or None for the whole run."""
    generation: int
    """Bumped by "full range" and by a box selection: a new chart, with no client zoom or box left on it."""


def _int_param(name: str) -> int | None:
    try:
        return int(st.query_params.get(name, ""))
    except ValueError:
        return None


def _start_run(run: str, xs: list[str]) -> None:
    """A run opened (or switched to) by URL: its view starts from the URL's x axis and step range.

    The widgets are bound to the URL (``bind="query-params"``), so a reload or
    a copied link restores them; this only keeps one run's range from carrying
    over to the next run opened in the same tab.
    """
    if st.session_state.get("_chart_run") == run:
        return
    st.session_state["_chart_run"] = run
    x = st.query_params.get("x")
    st.session_state["x"] = x if x in xs else "step"
    st.session_state["from"], st.session_state["to"] = _int_param("from"), _int_param("to")
    st.session_state.setdefault("_chart_generation", 0)


def _full_range() -> None:
    """The "full range" button: no range in the inputs (nor the URL), a fresh chart with no client zoom."""
    st.session_state["from"] = st.session_state["to"] = None
    st.session_state["_chart_generation"] = st.session_state.get("_chart_generation", 0) + 1


def _x_choices(columns: list[str]) -> list[str]:
    return ["step"] + [x for x in ("tokens", "time") if x in columns]


def _apply_box(root_dir: str, run: str, sig: tuple[float, int]) -> None:
    """A range drawn on the chart (its box-select tool) becomes the step range, before the inputs render."""
    key = f"run_chart_{st.session_state.get('_chart_generation', 0)}"
    chart = st.session_state.get(key)
    areas = (chart or {}).get("selection", {}).get("areas", []) if chart is not None else []
    ranges = [a.get("coordRange") or a.get("range") for a in areas if isinstance(a, dict)]
    ranges = [r for r in ranges if isinstance(r, list) and len(r) == 2 and all(isinstance(v, (int, float)) for v in r)]
    if not ranges:
        return
    x = st.session_state.get("x", "step")
    x0, x1 = sorted(float(v) / (1000.0 if x == "time" else 1.0) for v in ranges[0])
    to_step = step_of_x(root_dir, run, sig, x)
    st.session_state["from"], st.session_state["to"] = int(to_step(x0)), int(round(to_step(x1)))
    st.session_state["_chart_generation"] = st.session_state.get("_chart_generation", 0) + 1


def step_of_x(root_dir: str, run: str, sig: tuple[float, int], x: str):
    """x (tokens, time) -> step along the main line (identity for step)."""
    if x == "step":
        return float
    steps = state.load_series(root_dir, run, sig, ("step",), x, None, None).get("step")
    main = series.main_part(steps) if steps is not None else pa.table({"first": [], "x_first": []})
    return series.x_mapper(main["first"].to_numpy(zero_copy_only=False), main["x_first"].to_numpy(zero_copy_only=False))


def x_of_step(root_dir: str, run: str, sig: tuple[float, int], x: str):
    """step -> x (tokens, time) along the main line (identity for step)."""
    if x == "step":
        return float
    steps = state.load_series(root_dir, run, sig, ("step",), x, None, None).get("step")
    main = series.main_part(steps) if steps is not None else pa.table({"first": [], "x_first": []})
    return series.step_mapper(main["first"].to_numpy(zero_copy_only=False),
                              main["x_first"].to_numpy(zero_copy_only=False))


def controls(root_dir: str, run: str, sig: tuple[float, int], columns: list[str]) -> Request:
    """The controls above the chart; returns what they ask for and keeps the URL in step with it."""
    xs = _x_choices(columns)
    _start_run(run, xs)
    _apply_box(root_dir, run, sig)
    top = st.columns([2, 3], vertical_alignment="bottom")
    x = top[0].radio("x axis", xs, horizontal=True, key="x", format_func=X_LABELS.get, bind="query-params")
    drawn = [p for p in charts.panels_for(columns) if p.column in columns or p.column == "step_time"]
    extra_options = charts.extra_columns(columns, METRIC_COLUMNS)
    extras = top[1].multiselect("more charts (the run's own metrics)", extra_options, key=f"extras_{run}",
                                placeholder="add a chart") if extra_options else []
    titles = {p.column: p.title for p in drawn} | {c: c for c in extras}
    key = f"log_{run}"
    if key in st.session_state:  # a chart removed from "more charts" leaves the log choices
        st.session_state[key] = [c for c in st.session_state[key] or [] if c in titles]
    else:
        st.session_state[key] = [p.column for p in drawn if p.log_y]
    log = st.pills("log scale (per chart)", list(titles), selection_mode="multi", key=key,
                       format_func=lambda c: escape.markdown(titles.get(c, c))) or []
    lo_col, hi_col, reset_col = st.columns([2, 2, 1], vertical_alignment="bottom")
    lo = lo_col.number_input("from step", value=None, step=1, key="from", placeholder="first step",
                             bind="query-params")
    hi = hi_col.number_input("to step", value=None, step=1, key="to", placeholder="last step", bind="query-params")
    reset_col.button("full range", key="zoom_reset", on_click=_full_range, use_container_width=True)
    steps = None
    if lo is not None and hi is not None:
        if hi <= lo:
            st.warning("The step range is inverted ('to' is not after 'from'): showing the full range. "
                       "**full range** clears it.")
        else:
            steps = (int(lo), int(hi))
    return Request(x=x, log=frozenset(log), extras=tuple(extras), steps=steps,
                   generation=st.session_state.get("_chart_generation", 0))


def page_link(run: str, steps: tuple[int, int] | None, x: str) -> str:
    """An absolute link to this run's page at this step range (the server's own address, as the browser sees it)."""
    query = {"run": run, **({"x": x} if x != "step" else {}), **({"from": steps[0], "to": steps[1]} if steps else {})}
    try:
        base = urlsplit(st.context.url)
        origin = f"{base.scheme}://{base.netloc}"
    except (AttributeError, ValueError):
        origin = ""
    return f"{origin}/run?{urlencode(query)}"


def draw(slot: object, root_dir: str, run: str, sig: tuple[float, int], request: Request, report: object | None,
         oncall: OnCall, *, interactive: bool = True) -> None:
    """The chart into ``slot`` (``st`` itself, or a ``st.empty`` on a first visit), with the findings when ``report``
    is given.

    ``interactive=False``: a display-only first draw (no box selection) that a
    second, interactive draw replaces in the same script run once the run is
    judged (one keyed chart per run of the page).
    """
    chart = build(root_dir, run, sig, request, report, oncall)
    alt = f"Charts of run {escape.echarts(run)}: {chart.summary}"
    if interactive:
        slot.echarts_chart(chart.option, height=chart.height, key=f"run_chart_{request.generation}",
                           on_select="rerun", alt=alt)
    else:
        slot.echarts_chart(chart.option, height=chart.height, alt=alt)


def build(root_dir: str, run: str, sig: tuple[float, int], request: Request, report: object | None,
          oncall: OnCall) -> charts.Chart:
    stamp = state.report_stamp(root_dir, run) if report is not None else 0.0
    return _build(root_dir, run, sig, request, stamp, _oncall_stamp(oncall), report, oncall)


def _oncall_stamp(oncall: OnCall) -> tuple:
    return (tuple(sorted((k, a.time) for k, a in oncall.acks.items())), tuple(s.time for s in oncall.silences))


@st.cache_resource(max_entries=16, show_spinner=False)
def _build(root_dir: str, run: str, sig: tuple[float, int], request: Request, report_stamp: float,
           oncall_stamp: tuple, _report: object | None, _oncall: OnCall) -> charts.Chart:
    """The chart, rebuilt only when the files, the view, the report or the acks changed (an open page ticks
    every few seconds; this keeps an idle tab from rebuilding thousands of points each time)."""
    columns = state.load_columns(root_dir, run, sig)
    panels = charts.panels_for(columns, request.extras)
    overlays = {"loss": tuple(c for c in columns if charts.VALIDATION_LOSS.match(c))}
    to_x = x_of_step(root_dir, run, sig, request.x)
    x_range = (to_x(request.steps[0]), to_x(request.steps[1])) if request.steps else None
    wanted = tuple(dict.fromkeys([p.column for p in panels] + list(overlays["loss"])))
    tables = state.load_series(root_dir, run, sig, wanted, request.x, *(x_range or (None, None)))
    segments = state.load_segments(root_dir, run, sig)
    abandoned = {s["segment"]: s["abandoned_from"] for s in segments if s["abandoned_from"] is not None}
    last_step = lifecycle.main_last_step(segments) or 0
    events = state.load_events(root_dir, run, sig)
    findings = list(getattr(_report, "findings", []) or [])
    marks = [{**m, "kind": kind} for kind in ("checkpoint", "resume") for m in views.event_marks(events, kind, to_x)]
    marks += [{"x": to_x(a.onset_step), "kind": "ack", "text": f"{a.kind} seg {a.segment} @ {a.onset_step:,}: "
               + ack_text(a)} for a in _oncall.acks.values()]
    marks += [{"x": to_x(s.step), "kind": "silence", "text": silence_text(s)} for s in _oncall.silences]
    rollback = getattr(_report, "rollback", None)
    step = getattr(rollback, "checkpoint_step", None)
    advised = None if step is None else {"x": to_x(step), "text": f"roll back here: checkpoint @ step {int(step):,}"}
    view = charts.View(x=request.x, log=request.log, x_range=x_range, overlays=overlays)
    return charts.run_chart(tables, panels, view=view, abandoned_from=abandoned, marks=marks, advised=advised,
                            bands=views.finding_bands(findings, last_step, to_x, abandoned, _oncall.ack_for))
