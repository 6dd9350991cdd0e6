"""Overview page: every run under the root, worst health first; one click opens a run.

Re-runs itself every few seconds (a fragment), re-querying only what a new
flush changed, so a run that stops updating turns "stalled" on screen. The
first analysis of many large runs is spread over several ticks (a time
budget per tick), so the table appears at once and health fills in.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from runwatch.app import escape, state, views

RUN_PAGE = "screens/run.py"
ANALYSIS_BUDGET_S = 2.0  # detector time per tick before the page is drawn with what it has


def _judge_all(root_dir: str, sigs: dict[str, tuple[float, int]], names: list[str]) -> tuple[dict, dict, list[str]]:
    reports, errors, pending = {}, {}, []
    t0 = time.perf_counter()
    for name in names:
        report, error, waiting = state.report_for(root_dir, name, compute=time.perf_counter() - t0 < ANALYSIS_BUDGET_S,
                                                  sig=sigs.get(name, (0.0, 0)))
        if waiting:
            pending.append(name)
        elif error:
            errors[name] = error
        else:
            reports[name] = report
    return reports, errors, pending


@st.fragment(run_every=state.LIVE_SECONDS)
def overview(root_dir: str) -> None:
    sigs = state.signatures(root_dir)
    runs, unreadable = state.run_summaries(root_dir, sigs)
    if not runs:
        st.info(f"No runs under {escape.markdown(root_dir)} yet. Record one with `Monitor`, run `runwatch demo`, "
                "or use the Import page.")
        return
    reports, errors, pending = _judge_all(root_dir, sigs, [r["run"] for r in runs if r["run"] not in unreadable])
    errors.update(unreadable)
    rows = views.overview_rows(runs, reports, errors, now=time.time(), pending=pending)
    _banner(rows)
    table = pd.DataFrame(rows)
    # A coloured label per health (a one-item list column) instead of a pandas Styler: the Styler
    # renders every cell on every tick and was half of an idle overview's CPU.
    table["health"] = [[h] for h in table["health"]]
    event = st.dataframe(
        table, key="overview_table", hide_index=True,
        on_select="rerun", selection_mode="single-row",
        column_order=["health", "run", "what", "open findings", "last step", "tokens", "updated", "segments"],
        column_config={
            "health": st.column_config.MultiselectColumn("health", width="small", options=list(views.HEALTH_COLORS),
                                                         color=list(views.HEALTH_COLORS.values())),
            "run": st.column_config.TextColumn("run", width="medium"),
            "what": st.column_config.TextColumn("open findings (kinds)", width="medium"),
            "open findings": st.column_config.NumberColumn("# open", format="%d", width="small"),
            "last step": st.column_config.NumberColumn("last step", format="%d"),
            "tokens": st.column_config.NumberColumn("tokens", format="compact"),
            "updated": st.column_config.DatetimeColumn("last update", format="distance"),
            "segments": st.column_config.NumberColumn("segments", format="%d", width="small"),
        },
    )
    st.caption(f"Worst first; click a header to sort, a row to open the run. Refreshes every {state.LIVE_SECONDS:.0f} s."
               + (f" Analysing {len(pending)} run(s)…" if pending else ""))
    selected = event.selection.rows if event is not None else []
    if selected:
        st.switch_page(RUN_PAGE, query_params={"run": rows[selected[0]]["run"]})


def _banner(rows: list[dict]) -> None:
    """The 3 a.m. line: how many runs are in each state, and links to the ones that need someone."""
    counts = pd.Series([r["health"] for r in rows]).value_counts()
    st.markdown("#### " + " &nbsp; ".join(f"{views.health_label(h)} **{n}**" for h, n in counts.items()))
    urgent = [r for r in rows if r["health"] in ("action needed", "stalled", "error")]
    if not urgent:
        st.success("No run needs action.")
        return
    cols = st.columns(min(len(urgent), 4))
    for i, r in enumerate(urgent[:8]):
        with cols[i % len(cols)]:
            st.page_link(RUN_PAGE, label=escape.markdown(f"{r['run']} — {r['health']}"), query_params={"run": r["run"]},
                         icon=":material/warning:")


st.title("runwatch · overview")
try:
    overview(str(state.root()))
except ValueError as err:
    st.error(escape.markdown(err))
