"""Overview page: every run under the root, worst health first; a click on a row opens the run.

Re-runs itself every few seconds (a fragment), re-querying only what a new
flush changed, so a run that stops updating turns "stalled" on screen. The
first analysis of many large runs is spread over several ticks (a time
budget per tick), so the table appears at once and health fills in. On a
phone the table keeps the columns that matter first (health, state, run).
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from runwatch.app import escape, lifecycle, state, views

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


def _open_selected() -> None:
    """A click on a cell (or a row's box): remember which run; the page opens it on an app rerun.

    ``st.switch_page`` from inside the ticking fragment runs the run page but
    leaves the browser's URL on the overview, so the switch happens at the
    top of the page script instead.
    """
    event = st.session_state.get("overview_table")
    selection = (event or {}).get("selection", {}) if event is not None else {}
    rows = list(selection.get("rows", [])) + [cell[0] for cell in selection.get("cells", [])]
    shown = st.session_state.get("_overview_runs", [])
    if rows and rows[0] < len(shown):
        st.session_state["_open_run"] = shown[rows[0]]


@st.fragment(run_every=state.LIVE_SECONDS)
def overview(root_dir: str) -> None:
    if not state.root_exists(root_dir):
        st.info(state.how_to_fill(root_dir))
        return
    sigs = state.signatures(root_dir)
    runs, unreadable = state.run_summaries(root_dir, sigs)
    if not runs:
        st.info(state.how_to_fill(root_dir))
        return
    reports, errors, pending = _judge_all(root_dir, sigs, [r["run"] for r in runs if r["run"] not in unreadable])
    errors.update(unreadable)
    rows = views.overview_rows(runs, reports, errors, now=time.time(), pending=pending)
    _banner(rows)
    table = pd.DataFrame(rows)
    st.session_state["_overview_runs"] = [r["run"] for r in rows]
    # A coloured label per health (a one-item list column) instead of a pandas Styler: the Styler
    # renders every cell on every tick and was half of an idle overview's CPU.
    table["health"] = [[h] for h in table["health"]]
    table["state"] = [[s] for s in table["state"]]
    st.dataframe(
        table, key="overview_table", hide_index=True, on_select=_open_selected,
        selection_mode=["single-cell", "single-row"],
        column_order=["health", "state", "run", "what", "open findings", "last step", "updated", "tokens", "alerts",
                      "segments"],
        column_config={
            "health": st.column_config.MultiselectColumn("health", width=120, options=list(views.HEALTH_COLORS),
                                                         color=list(views.HEALTH_COLORS.values())),
            "state": st.column_config.MultiselectColumn("state", width="small", options=list(lifecycle.STATES),
                                                        color=[lifecycle.STATE_COLORS[s] for s in lifecycle.STATES]),
            "run": st.column_config.TextColumn("run", width="medium"),
            "what": st.column_config.TextColumn("open findings (kinds)", width="medium"),
            "open findings": st.column_config.NumberColumn("# open", format="%d", width="small"),
            "last step": st.column_config.NumberColumn("last step", format="%d"),
            "updated": st.column_config.DatetimeColumn("last update", format="distance",
                                                       help="the run's own clock: its newest logged time"),
            "tokens": st.column_config.NumberColumn("tokens", format="compact"),
            "alerts": st.column_config.TextColumn("alerts", width="small"),
            "segments": st.column_config.NumberColumn("segments", format="%d", width="small"),
        },
    )
    st.caption(f"Worst first; click a header to sort, a row to open the run. Refreshes every {state.LIVE_SECONDS:.0f} s."
               + (f" Analysing {len(pending)} run(s)…" if pending else ""))
    if st.session_state.get("_open_run") is not None:
        st.rerun(scope="app")


def _banner(rows: list[dict]) -> None:
    """The 3 a.m. line: how many runs are in each state, and links to the ones that need someone."""
    counts = pd.Series([r["health"] for r in rows]).value_counts()
    st.markdown("#### " + " &nbsp; ".join(f"{views.health_label(h)} **{n}**" for h, n in counts.items()))
    needy = [r for r in rows if r["health"] in ("action needed", "stalled", "error")]
    urgent = [r for r in needy if r["paging"]]
    quiet = [r["run"] for r in needy if not r["paging"]]
    if quiet:
        st.caption(escape.markdown(f"Someone is on it (acknowledged or silenced): {', '.join(quiet)}"))
    if not urgent:
        if not quiet:
            st.success("No run needs action.")
        return
    cols = st.columns(min(len(urgent), 4))
    for i, r in enumerate(urgent[:8]):
        with cols[i % len(cols)]:
            st.page_link(RUN_PAGE, label=escape.markdown(f"{r['run']} — {r['health']}"), query_params={"run": r["run"]},
                         icon=":material/warning:")


if (target := st.session_state.pop("_open_run", None)) is not None:
    st.switch_page(RUN_PAGE, query_params={"run": target})
st.title("runwatch · overview")
try:
    overview(str(state.root()))
except ValueError as err:
    st.error(escape.markdown(err))
