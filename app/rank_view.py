"""The run page's per-rank view: where each rank spends its step, findings by rank and host, the OPT checklist.

Rendered by ``screens/run.py`` under the charts, for a run with more than one
rank or a finding about one rank. The heat map is rank x step from
``Store.rank_buckets`` (each rank's time before the first collective, per
bucket of steps, min and max kept); the table lists the findings that name
a rank; a stalled or disagreeing run gets the OPT procedure as a checklist
with the exact resume command. Host names and messages come from files:
they reach the page through dataframes, code blocks and escaped markdown.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from runwatch.app import escape, fleet_views, state, views
from runwatch.data.record import rank_hosts
from runwatch.detectors.advisor import checkpoints_from_events

HEATMAP_BUCKETS = 400
TITLES = {"pre_collective": "time before the first collective (input wait + forward pass), per rank",
          "step_time": "step time per rank (the run did not time its forward passes)"}


@st.cache_data(max_entries=32, show_spinner=False)
def _buckets(root_dir: str, run: str, sig: tuple, num_buckets: int) -> tuple:
    return state.get_store(root_dir).rank_buckets(run, num_buckets)


@st.cache_data(max_entries=64, show_spinner=False)
def _ranks(root_dir: str, run: str, sig: tuple) -> list[int]:
    """The run's ranks: a DuckDB query over its metrics files (~50-70 ms for a 1M-step run), once per signature."""
    return state.get_store(root_dir).ranks(run)


def render(root_dir: str, run: str, report: object | None, sig: tuple) -> None:
    """The per-rank section of the run page (nothing for a one-rank run without rank findings)."""
    store = state.get_store(root_dir)
    ranks = _ranks(root_dir, run, sig)
    findings = list(getattr(report, "findings", []) or [])
    rows = fleet_views.rank_rows(findings)
    if len(ranks) < 2 and not rows:
        return
    meta = store.meta(run)
    latest = max((s.segment for s in getattr(report, "segments", [])), default=0)
    hosts = rank_hosts(meta, latest)
    with st.container(key="rank_view"):
        st.markdown(f"#### :material/dns: Ranks ({len(ranks)})")
        _checklist(run, report, meta, state.load_events(root_dir, run, sig))
        buckets, which = _buckets(root_dir, run, sig, HEATMAP_BUCKETS)
        colour = st.radio("colour each cell by", ["max (no slow step hidden)", "min (steady slowness)"],
                          horizontal=True, key="rank_heat_colour")
        if colour.startswith("min"):
            buckets = buckets.drop_columns(["max"]).append_column("max", buckets["min"])
        option, alt = fleet_views.heatmap_option(buckets, hosts, title=TITLES[which])
        st.echarts_chart(option, height=120 + 28 * len(ranks), key="rank_heatmap", alt=alt)
        if rows:
            st.markdown(f"**Findings by rank and host ({len(rows)})**")
            st.dataframe(pd.DataFrame(rows).style.map(views.cell_style, subset=["severity"]), hide_index=True,
                         key="rank_findings")
        else:
            st.caption("No finding names a rank: every rank is in step with the others.")


def _checklist(run: str, report: object | None, meta: dict, events: object) -> None:
    """The OPT procedure for a stalled or disagreeing run: ticked off by the on-call engineer."""
    checkpoints = checkpoints_from_events(events)
    steps = fleet_views.opt_checklist(report, meta=meta, checkpoints=checkpoints)
    if not steps:
        return
    with st.container(border=True, key="opt_checklist"):
        st.markdown("**The OPT procedure** (a hung or disagreeing node: do not just restart on it)")
        for i, step in enumerate(steps[:-1]):
            st.checkbox(escape.markdown(step), key=f"opt_step_{run}_{i}")
        st.checkbox(escape.markdown(steps[-1].split(":", 1)[0]), key=f"opt_step_{run}_resume")
        st.code(fleet_views.resume_line(report, meta, checkpoints), language="bash", wrap_lines=True)
