"""Tell Streamlit's browser code where this server's API is, so a page's first visit does not probe a wrong one.

A page at ``/run`` does not say whether the app lives at ``/`` (and ``run`` is
a page) or at ``/run`` (a path prefix). Streamlit's browser code tries both:
``/run/_stcore/health`` first, which is a 404 here, then, after a 100 ms
retry delay, ``/_stcore/health``, and only then opens its WebSocket. Every
visit to a page other than the overview paid that (``bench/browser_speed.py``:
the second health check ~130 ms after the first, before the WebSocket).

The pages' URL paths are known, so a small script in each HTML page's head
drops a trailing page name from the address and hands the rest to Streamlit
as ``window.__streamlit.BACKEND_BASE_URL`` (its hook for hosts that embed it):
one probe, of the right base. A path prefix in front of the pages (a reverse
proxy serving the dashboard under ``/runwatch/``) is kept, since only a page
name is dropped. A global a host already set is left as it is.
"""

from __future__ import annotations

import gzip
import json

from runwatch.app.pages import URL_PATHS


def head_script(url_paths: tuple[str, ...] = URL_PATHS) -> bytes:
    """The ``<script>`` put first in each page's ``<head>`` (before Streamlit's own module script reads the global)."""
    return (
        "<script>(() => {const pages = " + json.dumps(list(url_paths)) + ";"
        "let p = location.pathname.replace(/\\/+$/, ''); const last = p.slice(p.lastIndexOf('/') + 1);"
        "if (pages.includes(last)) p = p.slice(0, p.length - last.length).replace(/\\/+$/, '');"
        "window.__streamlit = Object.assign({BACKEND_BASE_URL: location.origin + p}, window.__streamlit || {});"
        "})();</script>"
    ).encode()


class BackendBase:
    """ASGI middleware: ``head_script`` into every HTML page Streamlit serves (not into assets or the API).

    The page arrives gzipped when the browser accepts it; it is unpacked, given
    the script and sent as it is (a few kB, once per visit). Its ETag stays:
    every copy of the page a browser gets under it is the same.
    """

    def __init__(self, app, script: bytes | None = None) -> None:
        self.app = app
        self.script = head_script() if script is None else script

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start: dict | None = None
        body: list[bytes] = []

        async def rewritten(message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                if any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in headers):
                    start = message  # held until the whole page is here
                    return
            elif message["type"] == "http.response.body" and start is not None:
                body.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                await self._send_page(start, b"".join(body), send)
                return
            await send(message)

        await self.app(scope, receive, rewritten)

    async def _send_page(self, start: dict, page: bytes, send) -> None:
        if not page:  # a HEAD request: the GET's headers, less the length and encoding the GET's page will not have
            drop = (b"content-length", b"content-encoding")
            await send({**start, "headers": [(k, v) for k, v in start.get("headers", []) if k.lower() not in drop]})
            await send({"type": "http.response.body", "body": page})
            return
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        encoding = next((v for k, v in headers if k.lower() == b"content-encoding"), b"identity")
        if encoding.lower() == b"gzip":
            page = gzip.decompress(page)
            headers = [(k, v) for k, v in headers if k.lower() != b"content-encoding"]
        elif encoding.lower() != b"identity":  # an encoding this cannot unpack: the page as it came
            await send({**start, "headers": headers + [(b"content-length", str(len(page)).encode())]})
            await send({"type": "http.response.body", "body": page})
            return
        at = page.lower().find(b"<head>")
        if at >= 0:
            page = page[:at + 6] + self.script + page[at + 6:]
        await send({**start, "headers": headers + [(b"content-length", str(len(page)).encode())]})
        await send({"type": "http.response.body", "body": page})
