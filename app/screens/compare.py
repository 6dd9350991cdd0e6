"""Compare page: several runs' main lines overlaid by tokens (by step when a run lacks tokens).

The before/after view of a fix: the rolled-back run against the original, or
two configurations side by side. Each run keeps one colour whatever else is
selected (its place among all the root's runs; where more runs than colours make two picked runs share
one, the later takes a free colour), the selection lives in the
URL (``?runs=a&runs=b``, so the view can be shared), and each run's findings
are bands in its colour.
"""

from __future__ import annotations

import streamlit as st

from runwatch.app import charts, escape, lifecycle, state, views
from runwatch.app.run_charts import x_of_step

COMPARE_COLUMNS = ("loss", "grad_norm", "lr", "loss_scale", "act_norm")


def _bands(root_dir: str, run: str, sig: tuple[float, int], to_x) -> list[dict]:
    report, _ = state.peek_report(root_dir, run, sig)
    if report is None:
        report, _, _ = state.report_for(root_dir, run, sig=sig)
    segments = state.load_segments(root_dir, run, sig)
    abandoned = {s["segment"]: s["abandoned_from"] for s in segments if s["abandoned_from"] is not None}
    findings = list(getattr(report, "findings", []) or [])
    return views.finding_bands(findings, lifecycle.main_last_step(segments) or 0, to_x, abandoned)


@st.fragment(run_every=state.LIVE_SECONDS)
def compare(root_dir: str) -> None:
    if not state.root_exists(root_dir):
        st.info(state.how_to_fill(root_dir))
        return
    sigs = state.signatures(root_dir)
    runs, unreadable = state.run_summaries(root_dir, sigs)
    names = [r["run"] for r in runs if r["run"] not in unreadable]
    if not names:
        st.info(state.how_to_fill(root_dir))
        return
    picked = st.multiselect("runs", names, default=names[: min(3, len(names))], key="runs", bind="query-params",
                            max_selections=len(charts.RUN_COLORS),
                            help=f"Up to {len(charts.RUN_COLORS)} runs, each in a colour of its own.")
    if not picked:
        st.info("Pick one or more runs to overlay.")
        return
    colors = charts.run_colors([r["run"] for r in runs], picked)
    # Tokens put runs with different batch sizes on one axis; fall back to step if any run lacks them.
    with_tokens = all("tokens" in state.load_columns(root_dir, n, sigs[n]) for n in picked)
    x = "tokens" if with_tokens else "step"
    if not with_tokens:
        st.caption("Some selected runs record no tokens: overlaying by step.")
    tables = {name: state.load_series(root_dir, name, sigs[name], COMPARE_COLUMNS, x, None, None) for name in picked}
    # The lines first, then the bands, only while a run has never been judged: the page reruns every few seconds,
    # and a placeholder emptied and drawn twice on each rerun made the chart blink without its bands.
    judged = all(state.peek_report(root_dir, name, sigs[name])[0] is not None for name in picked)
    slot = st if judged else st.empty()
    if not judged:
        chart = charts.compare_chart(tables, COMPARE_COLUMNS, colors=colors, x=x)
        slot.echarts_chart(chart.option, height=chart.height, alt="Runs overlaid")
    bands = {}
    for name in picked:
        to_x = x_of_step(root_dir, name, sigs[name], x)
        bands[name] = _bands(root_dir, name, sigs[name], to_x)
    chart = charts.compare_chart(tables, COMPARE_COLUMNS, colors=colors, x=x, bands_by_run=bands)
    slot.echarts_chart(chart.option, height=chart.height, key="compare_chart", alt="Runs overlaid with findings")


st.title("runwatch · compare")
try:
    compare(str(state.root()))
except ValueError as err:
    st.error(escape.markdown(err))
