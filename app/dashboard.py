"""Streamlit entry script of the on-call dashboard: page setup, the login gate and navigation.

Started by ``runwatch dashboard`` (see ``serve.py`` and ``asgi.py``); each
page lives in ``screens/`` and reads the root from ``RUNWATCH_ROOT``. (Not
``pages/``: a folder of that name beside the entry script switches Streamlit
to its older folder-based navigation and bypasses this script.) Every page
run passes ``gate()`` first: the bind rule and, when configured, the login.
"""

from __future__ import annotations

import os
from pathlib import Path

import streamlit as st
from PIL import Image, ImageDraw

from runwatch.app import escape, pages
from runwatch.app.auth import AUTH_ENV, check_bind, read_auth, user_allowed

HERE = Path(__file__).parent


def gate() -> None:
    """Stop the page unless this server may show it to this visitor (see ``auth.py``)."""
    try:
        secrets = os.environ.get(AUTH_ENV)
        auth = read_auth(Path(secrets)) if secrets else None
        check_bind(str(st.get_option("server.address") or "127.0.0.1"), auth)
    except ValueError as err:  # fail closed: a misconfigured server shows nothing
        st.error(escape.markdown(err))
        st.stop()
    if auth is None:
        return
    if not st.user.is_logged_in:
        st.title("runwatch")
        st.write("Log in to see the runs.")
        st.button("Log in", key="login", type="primary", on_click=st.login,
                  args=() if auth.provider == "default" else (auth.provider,))
        st.stop()
    email = st.user.get("email")
    if not user_allowed(email, st.user.get("email_verified"), auth.allowed_users):
        st.error(f"{escape.markdown(email or 'This account')} is not allowed on this dashboard.")
        st.button("Log out", key="logout", on_click=st.logout)
        st.stop()
    with st.sidebar:
        st.caption(f"Logged in as {escape.markdown(email or st.user.get('name') or 'unknown')}")
        st.button("Log out", key="logout", on_click=st.logout)


@st.cache_resource
def favicon() -> Image.Image:
    """A heartbeat on blue, drawn here and served by this server (a Material icon favicon is fetched from Google)."""
    icon = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    draw = ImageDraw.Draw(icon)
    draw.rounded_rectangle((0, 0, 63, 63), radius=14, fill="#1f4e79")
    draw.line([(8, 34), (22, 34), (28, 18), (36, 48), (42, 30), (56, 30)], fill="white", width=5, joint="curve")
    return icon


st.set_page_config(page_title="runwatch", page_icon=favicon(), layout="wide")
gate()

PAGES = [st.Page(HERE / "screens" / p.script, title=p.title, icon=p.icon, url_path=p.url_path, default=i == 0)
         for i, p in enumerate(pages.PAGES)]

st.navigation(PAGES, position="top").run()
