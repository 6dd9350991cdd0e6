"""Compare page: several runs' main lines overlaid by tokens (by step when a run lacks tokens).

The before/after view of a fix: the rolled-back run against the original, or
two configurations side by side.
"""

from __future__ import annotations

import streamlit as st

from runwatch.app import escape, figures, state

COMPARE_COLUMNS = ("loss", "grad_norm", "loss_scale", "act_norm")


@st.fragment(run_every=state.LIVE_SECONDS)
def compare(root_dir: str) -> None:
    sigs = state.signatures(root_dir)
    runs, unreadable = state.run_summaries(root_dir, sigs)
    names = [r["run"] for r in runs if r["run"] not in unreadable]
    if len(names) < 1:
        st.info(f"No runs under {escape.markdown(root_dir)} yet.")
        return
    picked = st.multiselect("runs", names, default=names[: min(3, len(names))], key="compare_runs")
    if not picked:
        st.info("Pick one or more runs to overlay.")
        return
    # Tokens put runs with different batch sizes on one axis; fall back to step if any run lacks them.
    with_tokens = all(next((r.get("tokens") for r in runs if r["run"] == n), None) is not None for n in picked)
    x = "tokens" if with_tokens else "step"
    if not with_tokens:
        st.caption("Some selected runs record no tokens: overlaying by step.")
    series = {}
    for name in picked:
        if x == "tokens" and "tokens" not in state.load_columns(root_dir, name, sigs[name]):
            continue
        series[name] = state.load_series(root_dir, name, sigs[name], COMPARE_COLUMNS, x, None, None)
    st.plotly_chart(figures.compare_figure(series, COMPARE_COLUMNS, x_title=x), key="compare_chart",
                    config={"displaylogo": False})


st.title("runwatch · compare")
try:
    compare(str(state.root()))
except ValueError as err:
    st.error(escape.markdown(err))
