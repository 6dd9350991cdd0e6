"""Name the browser chunks every run page needs with the page itself, so they load while the server reads the run.

Streamlit's browser fetches a chart's code (its ECharts chunk, 1.2 MB, and the
Arrow helpers beside it, 0.7 MB) only once the chart's message arrives: on a
first visit that is after the server has read the run, and the fetch and
compile then sit between the data and the drawing (``bench/browser_speed.py``).
A ``Link: <...>; rel=modulepreload`` header on every HTML page lets the
browser fetch and compile them at once, from this same server.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

PRELOADED_CHUNKS = ("EChartsChart", "arrowFormatUtils")
"""Streamlit's chunk names (without their content hash) of the run page's chart code."""


def chunk_links(static: Path = Path(st.__file__).resolve().parent / "static" / "static" / "js") -> str:
    """A ``Link`` header value preloading ``PRELOADED_CHUNKS`` as this Streamlit build names them (none when a
    build names them differently: a preload is a hint, and the page works without it)."""
    found = [p.name for stem in PRELOADED_CHUNKS for p in sorted(static.glob(f"{stem}.*.js"))[:1]]
    return ", ".join(f"<./static/js/{name}>; rel=modulepreload" for name in found)


class PreloadChunks:
    """ASGI middleware: adds ``chunk_links`` to every HTML page Streamlit serves (not to assets or the API)."""

    def __init__(self, app, links: str | None = None) -> None:
        self.app = app
        self.links = (chunk_links() if links is None else links).encode("latin-1")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not self.links:
            await self.app(scope, receive, send)
            return

        async def with_links(message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in headers):
                    message = {**message, "headers": headers + [(b"link", self.links)]}
            await send(message)

        await self.app(scope, receive, with_links)
