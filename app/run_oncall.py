"""The run page's on-call sections: findings in full (with who is on each), acknowledge, silence.

Streamlit code for ``screens/run.py``. Every finding's message is shown
whole (wrapped text, not a table cell cut at its width), escaped as
Markdown. An acknowledgement and a silence are events written into the
run's record (``oncall.py``), so ``runwatch check``, ``watch`` and every other
dashboard see them; who acts is the logged-in user when there is a login,
else the name typed once per session.
"""

from __future__ import annotations

import time

import streamlit as st

from runwatch.app import escape, lazy, views
from runwatch.app.oncall import OnCall, ack_text, silence_text, write_ack, write_silence

SILENCE_CHOICES = {"1 hour": 3600, "4 hours": 4 * 3600, "12 hours": 12 * 3600, "1 day": 86400, "3 days": 3 * 86400}


def _who() -> str | None:
    """Who is acting: the login's address, else the name typed on this page."""
    try:
        if st.user.is_logged_in:
            return str(st.user.get("email") or st.user.get("name") or "") or None
    except (AttributeError, KeyError):  # no login configured
        pass
    name = st.session_state.get("oncall_name", "")
    return name.strip() or None


def name_input() -> None:
    """Where who acts is typed, once per page (nothing to type when a login says who)."""
    try:
        if st.user.is_logged_in:
            return
    except (AttributeError, KeyError):
        pass
    st.text_input("your name (recorded with what you do here)", key="oncall_name", placeholder="e.g. alice")


def _finding_line(f: object, oncall: OnCall) -> str:
    """Markdown: severity, kind, steps, status and the whole message, escaped."""
    status = views.finding_status(f)
    color = views.SEVERITY_COLORS.get(f.severity, "gray") if status == "OPEN" else "gray"
    head = (f":{color}[**{escape.markdown(f.severity)}**] **{escape.markdown(f.kind.replace('_', ' '))}** "
            f"· segment {f.segment} · steps {f.onset_step:,}–{f.end_step:,} · {status.lower()}"
            + (" · needs action" if f.needs_action and status == "OPEN" else ""))
    line = f"{head}  \n{escape.markdown(f.message)}"
    ack = oncall.ack_for(f)
    if ack is not None:
        line += f"  \n:green[✓ {escape.markdown(ack_text(ack))}]"
    return line


def _record(write, root_dir: str, run: str, note_key: str, **kwargs: object) -> None:
    """A button's callback: write the event before the page reruns (so the rerun shows it), or say why not.

    The note is read here, from its input's state, so a note typed just before the click is the one kept.
    """
    who = _who()
    if who is None:
        st.session_state["_oncall_error"] = "Type your name first: what you record here says who did it."
        return
    if "seconds" in kwargs:  # a silence: from the click, not from when the page was drawn
        kwargs["until"] = time.time() + float(kwargs.pop("seconds"))
    try:
        write(root_dir, run, by=who, note=st.session_state.get(note_key) or "", **kwargs)
    except (ValueError, RuntimeError, OSError) as err:
        st.session_state["_oncall_error"] = f"Not recorded: {err}"


def _write_ack(root_dir: str, run: str, *, finding: object, **kwargs: object) -> object:
    return write_ack(root_dir, run, finding, **kwargs)


def _show_error() -> None:
    error = st.session_state.pop("_oncall_error", None)
    if error:
        st.error(escape.markdown(error))


def _ack_form(root_dir: str, run: str, f: object, segment: int, i: int) -> None:
    with st.popover("acknowledge", key=f"ack_pop_{i}"):
        st.text_input("note (what you are doing about it)", key=f"ack_note_{i}")
        st.button("acknowledge", key=f"ack_{i}", type="primary", on_click=_record,
                  args=(_write_ack, root_dir, run, f"ack_note_{i}"), kwargs={"finding": f, "segment": segment})


def findings_section(root_dir: str, run: str, findings: list, oncall: OnCall, segment: int) -> None:
    """Open findings in view with an acknowledge button each; closed ones one click away."""
    current = [f for f in findings if getattr(f, "open", False)]
    history = [f for f in findings if not getattr(f, "open", False)]
    st.markdown(f"#### Open findings ({len(current)})")
    if current:
        name_input()
        _show_error()
    for i, f in enumerate(sorted(current, key=lambda f: f.onset_step)):
        with st.container(border=True, key=f"finding_{i}"):
            left, right = st.columns([6, 1], vertical_alignment="center")
            left.markdown(_finding_line(f, oncall))
            if oncall.ack_for(f) is None:
                with right:
                    _ack_form(root_dir, run, f, segment, i)
    if history:
        with st.expander(f"history: {len(history)} closed finding(s)"):
            for f in sorted(history, key=lambda f: f.onset_step, reverse=True):
                st.markdown(_finding_line(f, oncall))


def silence_banner(oncall: OnCall, now: float) -> None:
    silence = oncall.silenced(now)
    if silence is not None:
        st.info(f":material/notifications_off: Alerts {escape.markdown(silence_text(silence))}", icon=None)


def silence_section(root_dir: str, run: str, oncall: OnCall, *, step: int, segment: int, ask_name: bool) -> None:
    """Silence the run's alerts for a while, or end a silence early (``ask_name``: the page has not asked yet)."""
    now = time.time()
    current = oncall.silenced(now)
    body = lazy.opened("silence alerts" if current is None else "alerts are silenced", key="silence_open")
    if body is None:
        return
    with body:
        if ask_name:
            name_input()
        choice = st.selectbox("for", list(SILENCE_CHOICES), index=1, key="silence_for")
        st.text_input("why (maintenance, known issue, ...)", key="silence_note")
        cols = st.columns(2)
        common = {"step": step, "segment": segment}
        cols[0].button("silence alerts", key="silence_button", type="primary", on_click=_record,
                       args=(write_silence, root_dir, run, "silence_note"),
                       kwargs={"seconds": SILENCE_CHOICES[choice], **common})
        if current is not None:
            cols[1].button("end the silence now", key="silence_end", on_click=_record,
                           args=(write_silence, root_dir, run, "silence_note"), kwargs={"seconds": 0, **common})
        _show_error()
