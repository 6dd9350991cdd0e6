"""Streamlit entry script of the on-call dashboard: page setup and navigation only.

Started by ``runwatch dashboard`` (see ``serve.py``); each page lives in
``screens/`` and reads the root from ``RUNWATCH_ROOT``. (Not ``pages/``: a
folder of that name beside the entry script switches Streamlit to its older
folder-based navigation and bypasses this script.)
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

HERE = Path(__file__).parent

st.set_page_config(page_title="runwatch", page_icon=":material/monitor_heart:", layout="wide")

PAGES = [
    st.Page(HERE / "screens" / "overview.py", title="Overview", icon=":material/monitor_heart:", url_path="overview", default=True),
    st.Page(HERE / "screens" / "run.py", title="Run", icon=":material/show_chart:", url_path="run"),
    st.Page(HERE / "screens" / "compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
    st.Page(HERE / "screens" / "import_log.py", title="Import", icon=":material/upload_file:", url_path="import_log"),
]

st.navigation(PAGES, position="top").run()
