"""The ASGI app ``runwatch dashboard`` serves: Streamlit's ``st.App`` for ``dashboard.py`` behind a host guard.

``serve.py`` runs ``streamlit run asgi.py``; Streamlit finds ``app`` below and
serves it with its own server. ``auth.HostGuard`` runs before every Streamlit
route: a request whose ``Host`` is not one this dashboard is reached by, or
a WebSocket whose ``Origin`` is another site, is refused before Streamlit
sees it. That is what stops DNS rebinding (a page on evil.example whose name
now resolves to 127.0.0.1 sends ``Host: evil.example``) and cross-site
WebSocket hijacking (a page elsewhere opening ``ws://127.0.0.1:8501``).
Streamlit's own XSRF token and CORS check stay on behind it.
``preload.PreloadChunks`` names the chart code with every page, so a first visit fetches it while the
server reads the run; ``backend_base.BackendBase`` tells the page where the server's API is, so it does not
probe a wrong address first.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import streamlit as st
from starlette.middleware import Middleware

from runwatch.app.auth import ALLOWED_HOSTS_ENV, HostGuard
from runwatch.app.backend_base import BackendBase
from runwatch.app.preload import PreloadChunks


def allowed_hosts_from_env() -> list[str]:
    value = os.environ.get(ALLOWED_HOSTS_ENV, "")
    hosts = [h.strip() for h in value.split(",") if h.strip()]
    if not hosts:
        raise RuntimeError(f"{ALLOWED_HOSTS_ENV} is not set: start the dashboard with `runwatch dashboard`")
    return hosts


# What the pages import (pandas, DuckDB, the detectors: about a second on a small machine), imported while the
# server starts rather than by the first page visit, which would otherwise wait for it before its first chart.
PAGE_MODULES = ("pandas", "runwatch.app.state", "runwatch.app.run_charts", "runwatch.app.rank_view",
                "runwatch.app.run_oncall", "runwatch.app.checkpoint_panel", "runwatch.collectors.importers")
for _name in PAGE_MODULES:
    importlib.import_module(_name)

app = st.App(Path(__file__).resolve().parent / "dashboard.py",
             middleware=[Middleware(HostGuard, allowed_hosts=allowed_hosts_from_env()), Middleware(PreloadChunks),
                         Middleware(BackendBase)])
