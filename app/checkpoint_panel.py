"""The run page's checkpoint panel: cost, interruptions, lost work, cadence, retention and the what-if.

Thin: the figures are ``advise.checkpoint_advice`` (what ``runwatch advise``
prints), cached on the run's file signature and the report; the wording and
the plot come from ``checkpoint_views``. Text from the record (paths in the
retention reason) is shown as plain text, never as Markdown.
"""

from __future__ import annotations

import streamlit as st

from runwatch.app import checkpoint_views as cv
from runwatch.app import lazy, state
from runwatch.economics.advice import CheckpointAdvice

MIN_INPUT = 1e-6
"""Smallest MTBF (hours) and checkpoint cost (seconds) the what-if takes: both must be positive."""


@st.cache_data(max_entries=32, show_spinner=False)
def load_advice(root_dir: str, run: str, sig: tuple[float, int], stamp: float, _report: object) -> CheckpointAdvice:
    from runwatch.app.advise import checkpoint_advice

    return checkpoint_advice(state.get_store(root_dir), run, _report)


def _whatif(run: str, advice: CheckpointAdvice) -> None:
    m = advice.measured
    left, mid, right = st.columns(3)
    mtbf_h = left.number_input("MTBF (hours)", min_value=MIN_INPUT, value=_at_least(_hours(advice.mtbf_seconds)),
                               format="%.4g", key=f"whatif_mtbf:{run}", placeholder="not measured: enter one")
    delta = mid.number_input("checkpoint cost (seconds)", min_value=MIN_INPUT, value=_at_least(m.checkpoint_seconds),
                             format="%.4g", key=f"whatif_delta:{run}", placeholder="not measured: enter one")
    cost = right.number_input("cluster cost per hour ($)", min_value=0.0, value=None, format="%.2f",
                              key=f"whatif_cost:{run}", placeholder="optional")
    if mtbf_h is None or delta is None:
        st.info("The what-if needs an MTBF and a checkpoint cost: enter the ones the record does not give.")
        return
    option, alt = cv.whatif_chart(delta, mtbf_h * 3600.0, current=m.current_seconds,
                                  restart=m.restart_seconds or 0.0, cost_per_hour=cost)
    st.echarts_chart(option, height=380, key=f"whatif_chart:{run}", alt=alt)


def _at_least(value: float | None) -> float | None:
    """A measured figure as an input's default; one below the input's floor (a save timed at 0 s) is left empty."""
    return value if value is not None and value >= MIN_INPUT else None


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600.0


def checkpoint_panel(root_dir: str, run: str, report: object, sig: tuple[float, int]) -> None:
    """Render the panel for ``run`` (its ``judge_run`` report already made by the page)."""
    try:
        advice = load_advice(root_dir, run, sig, state.report_stamp(root_dir, run), report)
    except (ValueError, RuntimeError, OSError) as err:
        st.error(f"Could not measure checkpoints: {err}")
        return
    with st.container(border=True, key="checkpoint_panel"):
        st.markdown("#### :material/save: Checkpoints and interruptions")
        rows = cv.metric_rows(advice)
        for start in (0, 5):
            for col, (label, value) in zip(st.columns(5), rows[start:start + 5]):
                col.metric(label, value)
        st.markdown("**Retention**")
        st.text(cv.retention_line(advice))
        st.text(advice.retention.reason)
        rollback = getattr(report, "rollback", None)
        if rollback is not None and rollback.checkpoint_missing:
            st.warning("checkpoint_missing: the checkpoint the rollback advice wants is no longer retained.")
        body = lazy.opened("what if: checkpoint interval vs hours and cost lost per day", key=f"whatif_open:{run}")
        if body is not None:
            with body:
                _whatif(run, advice)
