"""Sections made only when they are opened.

A collapsed ``st.expander`` still renders its body in the browser: every
widget, Markdown block and chart inside it is built while the page's main
thread is drawing the run's charts (``bench/browser_speed.py``). An expander
that reruns the page when it is toggled, and whose body is written only when
it is open, costs a closed page one header.
"""

from __future__ import annotations

import streamlit as st


def opened(label: str, key: str):
    """The expander's body when it is open, else None (its open state survives reruns under ``key``)."""
    expander = st.expander(label, key=key, on_change="rerun")
    return expander if expander.open else None
