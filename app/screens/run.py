"""Run page: one run in depth — its state and health, the rollback card, the charts, the findings.

The charts come first on a first visit: they are drawn from the store while
the run's judgement is looked up, and the detectors (seconds on a run of
millions of steps) run only after them; the verdict, the rollback card and
the finding bands then fill in. Each section is a function of its own module
(``run_charts``, ``run_oncall``) so the page stays a list of sections.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from runwatch.app import escape, lazy, lifecycle, rank_view, run_charts, run_oncall, state, views
from runwatch.app.checkpoint_panel import checkpoint_panel
from runwatch.app.oncall import read_oncall


def _pick_run(root_dir: str) -> str | None:
    """The run in the URL; an unknown one is an error naming the runs there (the URL is left as it is)."""
    name = st.query_params.get("run")
    if name:
        problem = state.check_run(root_dir, name)
        if problem is None:
            return name
        st.error(escape.markdown(problem))
        _run_links(root_dir)
        return None
    names = sorted(state.signatures(root_dir)) if state.root_exists(root_dir) else []
    if not names:
        st.info(state.how_to_fill(root_dir))
        return None
    choice = st.selectbox("run", names, index=None, placeholder="pick a run", key="run_select")
    if choice is not None:
        st.query_params["run"] = choice
    return choice


def _run_links(root_dir: str) -> None:
    names = sorted(state.signatures(root_dir)) if state.root_exists(root_dir) else []
    cols = st.columns(4)
    for i, name in enumerate(names[:12]):
        cols[i % 4].page_link("screens/run.py", label=escape.markdown(name), query_params={"run": name})


def _header(slot: object, run: str, info: dict, report: object | None, error: str | None, judging: bool) -> None:
    """The 3 a.m. line: health (or that it is being judged), state, run; then the numbers."""
    health = report.health if report is not None else ("error" if error else None)
    run_state = lifecycle.run_state(info.get("base_state", "live"), health)
    with slot.container():
        verdict = (views.health_label(lifecycle.display_health(health, run_state)) if health is not None
                   else ":gray[⏳ judging…]")
        st.markdown(f"## {verdict} &nbsp; {lifecycle.state_label(run_state)} &nbsp; {escape.markdown(run)}")
        cols = st.columns(4)
        last_step = info.get("last_step")
        cols[0].metric("last step (main line)", "-" if last_step is None else f"{last_step:,}")
        last = info.get("last_update")
        cols[1].metric("last update", views.ago(None if last is None else time.time() - last),
                       help="the run's own clock: its newest logged time" + (" (an archived log's last time)"
                                                                           if run_state == "archived" else ""))
        cols[2].metric("tokens", views.human_count(info.get("tokens")))
        cols[3].metric("open findings", len(views.open_findings(report)) if report is not None else "-")
        if judging and report is not None:
            st.caption("Judging the latest data…")
        if error:
            st.error(f"Could not analyse this run: {escape.markdown(error)}")


def _rollback_card(slot: object, run: str, report: object, meta: dict) -> None:
    rollback = getattr(report, "rollback", None)
    if rollback is None:
        slot.empty()
        return
    with slot.container(border=True, key="rollback_card"):
        st.markdown("#### :material/history: Rollback advice")
        left, right = st.columns([1, 1])
        with left:
            for line in views.rollback_lines(rollback):
                st.markdown(line)
        with right:
            st.caption("Resume recipe: the shell command (copy button at the top right) ...")
            st.code(views.resume_command(run, rollback, meta), language="bash", wrap_lines=True)
            st.caption("... and, in the training script, the resume that runwatch records")
            st.code(views.monitor_call(run, rollback, meta), language="python", wrap_lines=True)
        evidence = views.evidence_rows(getattr(rollback, "evidence", {}))
        if evidence:
            with st.expander("evidence"):
                st.dataframe(pd.DataFrame(evidence), hide_index=True)


def _segments(segments: list[dict]) -> None:
    # Made only once opened: a closed table would still load the browser's data grid (a large script chunk).
    body = lazy.opened(f"segments ({len(segments)})", key="segments_open")
    if body is not None:
        with body:
            st.dataframe(pd.DataFrame(views.segment_rows(segments)), hide_index=True, key="segments_table")


@st.fragment(run_every=state.LIVE_SECONDS)
def run_page(root_dir: str) -> None:
    run = _pick_run(root_dir)
    if run is None:
        return
    sig = state.signature(root_dir, run)
    report, fresh = state.peek_report(root_dir, run, sig, detail=True)
    oncall = read_oncall(state.load_events(root_dir, run, sig))
    info, unreadable = state.run_summary(root_dir, run, sig)
    meta = state.get_store(root_dir).meta(run)
    columns = state.load_columns(root_dir, run, sig)
    if fresh:
        # The judgement is at hand (every rerun but a first visit's): each section is written once, in place.
        # An open page reruns every few seconds, and a placeholder emptied at the top of a rerun stays collapsed
        # until it is filled again, jumping everything below it by its height (the rollback card's: ~640 px).
        _header(st, run, info, report, unreadable, judging=False)
        with st.container():
            run_oncall.silence_banner(oncall, time.time())
        if report is not None:
            _rollback_card(st, run, report, meta)
        request = run_charts.controls(root_dir, run, sig, columns)
        run_charts.draw(st, root_dir, run, sig, request, report, oncall)
    else:  # the charts first; then the detectors, and the verdict, the card and the bands fill in
        header, silenced, card = st.empty(), st.container(), st.empty()
        request = run_charts.controls(root_dir, run, sig, columns)
        chart = st.empty()
        run_charts.draw(chart, root_dir, run, sig, request, report, oncall, interactive=False)
        _header(header, run, info, report, unreadable, judging=True)
        report, error, _ = state.report_for(root_dir, run, sig=sig, detail=True)
        run_charts.draw(chart, root_dir, run, sig, request, report, oncall)
        _header(header, run, info, report, error or unreadable, judging=False)
        with silenced:
            run_oncall.silence_banner(oncall, time.time())
        if report is not None:
            _rollback_card(card, run, report, meta)
    # A link, not st.code: a code block loads the browser's syntax highlighter (half a second of the page's
    # main thread for its grammars, on every visit) while the chart is being drawn. A link button, not a
    # Markdown link: no Markdown on these pages holds a link (tests/app/test_security_browser.py).
    st.link_button("link to this view", run_charts.page_link(run, request.steps, request.x),
                   help="The run at this step range and x axis: open it, or copy it (right-click, Copy link).")
    rank_view.render(root_dir, run, report, sig)
    segments = state.load_segments(root_dir, run, sig)
    latest = max(s["segment"] for s in segments)
    findings = list(getattr(report, "findings", []) or [])
    if findings:
        run_oncall.findings_section(root_dir, run, findings, oncall, latest)
    if report is not None:
        checkpoint_panel(root_dir, run, report, sig)
    _segments(segments)
    asked = any(getattr(f, "open", False) for f in findings)
    run_oncall.silence_section(root_dir, run, oncall, step=info.get("last_step") or 0, segment=latest,
                               ask_name=not asked)


try:
    run_page(str(state.root()))
except ValueError as err:
    st.error(escape.markdown(err))
