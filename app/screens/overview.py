"""Overview page: every run under the root, worst health first; one click opens a run.

Re-runs itself every few seconds (a fragment), re-querying only what a new
flush changed, so a run that stops updating turns "stalled" on screen.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from runwatch.app import state, views

RUN_PAGE = "screens/run.py"


@st.fragment(run_every=state.LIVE_SECONDS)
def overview(root_dir: str) -> None:
    runs = state.load_runs(root_dir, state.signature(root_dir))
    if not runs:
        st.info(f"No runs under `{root_dir}` yet. Record one with `Monitor`, run `runwatch demo`, "
                "or use the Import page.")
        return
    reports, errors = {}, {}
    for r in runs:
        report, error = state.report_or_error(root_dir, r["run"])
        if error:
            errors[r["run"]] = error
        else:
            reports[r["run"]] = report
    rows = views.overview_rows(runs, reports, errors, now=time.time())
    _banner(rows)
    table = pd.DataFrame(rows)
    event = st.dataframe(
        table, key="overview_table", hide_index=True, on_select="rerun", selection_mode="single-row",
        column_config={
            "health": st.column_config.TextColumn("health", width="medium"),
            "run": st.column_config.TextColumn("run", width="medium"),
            "last step": st.column_config.NumberColumn("last step", format="%d"),
            "updated": st.column_config.DatetimeColumn("last update", format="distance"),
            "idle": None,
            "tokens": st.column_config.NumberColumn("tokens", format="compact"),
            "open findings": st.column_config.NumberColumn("open findings", format="%d"),
            "what": st.column_config.TextColumn("what", width="large"),
            "segments": st.column_config.NumberColumn("segments", format="%d"),
        },
    )
    st.caption("Click a row to open the run. Sorted worst first; click a header to sort. "
               f"Refreshes every {state.LIVE_SECONDS:.0f} s.")
    selected = event.selection.rows if event is not None else []
    if selected:
        st.switch_page(RUN_PAGE, query_params={"run": rows[selected[0]]["run"]})


def _banner(rows: list[dict]) -> None:
    """The 3 a.m. line: which runs need someone now, as links."""
    urgent = [r for r in rows if r["health"].split(" ", 1)[1] in ("action needed", "stalled", "error")]
    counts = pd.Series([r["health"] for r in rows]).value_counts()
    st.markdown("  ·  ".join(f"**{n}** {label}" for label, n in counts.items()))
    if not urgent:
        st.success("All runs healthy or being watched.")
        return
    cols = st.columns(min(len(urgent), 4))
    for i, r in enumerate(urgent[:8]):
        with cols[i % len(cols)]:
            st.page_link(RUN_PAGE, label=f"{r['health']}: {r['run']}", query_params={"run": r["run"]})


st.title("runwatch · overview")
try:
    overview(str(state.root()))
except ValueError as err:
    st.error(str(err))
