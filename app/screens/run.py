"""Run page: one run in depth — health, the rollback card, stacked charts, findings.

Charts come from DuckDB-downsampled buckets (first/min/max/last), so spikes
stay visible; the zoom inputs (or a box selection on the chart) re-query just
that range, at full resolution once it holds fewer rows than buckets.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from runwatch.app import escape, rank_view, state, views
from runwatch.app.checkpoint_panel import checkpoint_panel


def _pick_run(root_dir: str) -> str | None:
    run = state.selected_run(root_dir)
    if run is not None:
        return run
    names = sorted(state.signatures(root_dir))
    if not names:
        st.info(f"No runs under {escape.markdown(root_dir)} yet.")
        return None
    choice = st.selectbox("run", names, key="run_select")
    st.query_params["run"] = choice
    return choice


def _apply_box_selection() -> None:
    """A box drawn on the chart (box-select tool) becomes the zoom range before the inputs render."""
    chart = st.session_state.get("run_chart")
    boxes = (chart or {}).get("selection", {}).get("box", []) if isinstance(chart, dict) else []
    if not boxes or "x" not in boxes[0]:
        return
    x0, x1 = sorted(float(v) for v in boxes[0]["x"][:2])
    if st.session_state.get("_applied_box") != (x0, x1):
        st.session_state["_applied_box"] = (x0, x1)
        st.session_state["zoom_lo"], st.session_state["zoom_hi"] = x0, x1


def _header(run: str, report: object | None, error: str | None, info: dict) -> None:
    health = report.health if report is not None else "error"
    st.markdown(f"## {views.health_label(health)} &nbsp; {escape.markdown(run)}")
    cols = st.columns(4)
    cols[0].metric("last step", f"{info.get('last_step', 0):,}")
    last = info.get("last_update")
    cols[1].metric("last update", views.ago(None if last is None else time.time() - last))
    cols[2].metric("tokens", views.human_count(info.get("tokens")))
    cols[3].metric("open findings", len(views.open_findings(report)) if report is not None else "-")
    if error:
        st.error(f"Could not analyse this run: {escape.markdown(error)}")


def _rollback_card(run: str, report: object, meta: dict) -> None:
    rollback = getattr(report, "rollback", None)
    if rollback is None:
        return
    with st.container(border=True, key="rollback_card"):
        st.markdown("#### :material/history: Rollback advice")
        left, right = st.columns([1, 1])
        with left:
            for line in views.rollback_lines(rollback):
                st.markdown(line)
        with right:
            st.caption("Resume recipe (copy button at the top right)")
            st.code(views.resume_command(run, rollback, meta), language="bash", wrap_lines=True)
        evidence = views.evidence_rows(getattr(rollback, "evidence", {}))
        if evidence:
            with st.expander("evidence"):
                st.dataframe(pd.DataFrame(evidence), hide_index=True)


def _controls(has_tokens: bool) -> tuple[str, float | None, float | None]:
    left, mid, right, reset = st.columns([2, 2, 2, 1], vertical_alignment="bottom")
    x = left.radio("x axis", ["step", "tokens"] if has_tokens else ["step"], horizontal=True, key="x_axis")
    if st.session_state.get("_zoom_axis") != x:  # units changed: the old range means nothing now
        st.session_state["_zoom_axis"] = x
        st.session_state["zoom_lo"] = st.session_state["zoom_hi"] = None
    lo = mid.number_input(f"zoom from ({x})", value=None, key="zoom_lo", placeholder="start")
    hi = right.number_input(f"zoom to ({x})", value=None, key="zoom_hi", placeholder="end")
    if reset.button("full range", key="zoom_reset"):
        st.session_state["_applied_box"] = None
        st.session_state.pop("zoom_lo", None), st.session_state.pop("zoom_hi", None)
        st.rerun(scope="fragment")
    if lo is not None and hi is not None and hi <= lo:
        st.warning("zoom: 'to' must be after 'from'; showing the full range")
        return x, None, None
    return x, lo, hi


def _charts(root_dir: str, run: str, report: object | None, sig: tuple[float, int]) -> None:
    has_tokens = "tokens" in state.load_columns(root_dir, run, sig)
    _apply_box_selection()
    x, lo, hi = _controls(has_tokens)
    fig = state.run_chart(root_dir, run, sig, x, lo, hi, state.report_stamp(root_dir, run), report)
    st.plotly_chart(fig, key="run_chart", on_select="rerun", selection_mode="box",
                    config={"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d"]})


def _findings(findings: list) -> None:
    """Open alarms in view; closed ones (recovered, rolled back, old) one click away."""
    rows = views.findings_rows(findings)
    current = [r for r in rows if r["status"] == "OPEN"]
    history = [r for r in rows if r["status"] != "OPEN"]
    st.markdown(f"#### Open findings ({len(current)})")
    if current:
        st.dataframe(pd.DataFrame(current).style.map(views.cell_style, subset=["severity"]), hide_index=True,
                     key="findings_table")
    if history:
        with st.expander(f"history: {len(history)} closed finding(s)"):
            st.dataframe(pd.DataFrame(history).style.map(views.cell_style, subset=["severity"]), hide_index=True,
                         key="history_table")


@st.fragment(run_every=state.LIVE_SECONDS)
def run_page(root_dir: str) -> None:
    run = _pick_run(root_dir)
    if run is None:
        return
    sig = state.signature(root_dir, run)
    report, error, _ = state.report_for(root_dir, run, sig=sig, detail=True)
    info, unreadable = state.run_summary(root_dir, run, sig)
    _header(run, report, error or unreadable, info)
    if report is not None:
        _rollback_card(run, report, state.get_store(root_dir).meta(run))
    _charts(root_dir, run, report, sig)
    rank_view.render(root_dir, run, report, sig)
    if report is not None and report.findings:
        _findings(report.findings)
    if report is not None:
        checkpoint_panel(root_dir, run, report, sig)
    with st.expander("segments"):
        st.dataframe(pd.DataFrame(state.load_segments(root_dir, run, sig)), hide_index=True)


try:
    run_page(str(state.root()))
except ValueError as err:
    st.error(escape.markdown(err))
