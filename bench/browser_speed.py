"""Run-page speed in the browser: real Chromium from navigation to charts drawn, on a 1M-step run.

The server-side figure (``bench/dashboard_speed.py``) leaves out what the on-call
engineer waits for: Streamlit's page load, the WebSocket round trips, the
figure's JSON crossing to the browser and Plotly drawing it. This bench
writes the 1M-step run of ``dashboard_speed.py`` (two segments with an
abandoned branch, a one-step spike, a NaN), serves it with ``runwatch
dashboard`` from each interpreter or checkout given (main's code and this
one, taking turns round by round on the same root), and times, in headless
Debian Chromium:

- **cold**: a fresh server (no cached query, figure or judgement) and a fresh
  browser context (empty HTTP cache), navigating straight to the run page;
- **warm**: the same server and browser context, a second navigation to the
  same page (what every later visit, or a reload, costs).

"Charts drawn" is the first moment (checked every 25 ms) at which the main
line is on screen in at least four panels: Plotly's line paths (main's
charts) or the main line's colour in four separate bands of the ECharts
canvas (this branch's); a script injected before the page loads watches for
it, so the time is the page's own ``performance.now()`` (zero at navigation
start), not the test driver's polling. "Judgement shown" is when
the run's health word ("● action needed", ...) is in the page's heading (the detectors' verdict).

    .venv/bin/python bench/browser_speed.py --python /work/main/.venv/bin/python --python .venv/bin/python
    .venv/bin/python bench/browser_speed.py --checkout ../anchor --checkout . --rounds 3

``--checkout DIR`` serves the code of that directory (a worktree, or a
``git archive`` of a commit) with this interpreter and its packages: the
server's ``PYTHONPATH`` gets a ``runwatch`` folder linking to DIR's stage
folders, ahead of the editable install (which points at one checkout only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dashboard_speed import synthetic_run  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu"]
MIN_PANELS = 4
"""Panels whose main line must be drawn before the page counts as ready (loss, grad norm, LR, act norm, ...)."""

# Runs in the page before any of its scripts: records the first moment at which the main line is drawn in
# MIN_PANELS separate panels (Plotly: a line path with points in each subplot; ECharts, a canvas: rows of pixels
# in the main line's colour, in separate bands), and when a health verdict is in the page's heading.
WATCH_SCRIPT = """
(() => {
  const need = %d, main = [0x1f, 0x4e, 0x79];
  // When Streamlit's WebSocket opens: what its page load and its search for the server's API cost.
  const Socket = window.WebSocket;
  window.WebSocket = function (...args) {
    const ws = new Socket(...args);
    ws.addEventListener('open', () => { if (window.__socketAt === undefined) window.__socketAt = performance.now(); });
    return ws;
  };
  window.WebSocket.prototype = Socket.prototype;
  Object.assign(window.WebSocket, Socket);
  function plotlyPanels() {
    const axes = new Set();
    document.querySelectorAll('.js-plotly-plot .scatterlayer .trace').forEach(t => {
      const p = t.querySelector('path.js-line');
      const sub = t.closest('.subplot');
      if (p && sub && (p.getAttribute('d') || '').length > 200) axes.add(sub.className.baseVal);
    });
    return axes.size;
  }
  function canvasPanels() {
    // Reading a canvas back costs the page's main thread: look only once ECharts has an option set.
    if (!document.querySelector('[data-testid=stEChartsChart][aria-busy=false]')) return 0;
    let best = 0;
    for (const c of document.querySelectorAll('canvas')) {
      if (c.width < 400 || c.height < 300) continue;
      let data;
      try { data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; } catch (e) { continue; }
      let bands = 0, gap = 99, rowsInBand = 0;
      for (let y = 0; y < c.height; y++) {
        let hit = 0;
        for (let x = 0; x < c.width && hit < 3; x += 2) {
          const i = 4 * (y * c.width + x);
          if (Math.abs(data[i] - main[0]) < 14 && Math.abs(data[i + 1] - main[1]) < 14
              && Math.abs(data[i + 2] - main[2]) < 14 && data[i + 3] > 200) hit++;
        }
        if (hit >= 3) { if (gap > 20) { bands++; } gap = 0; } else { gap++; }
      }
      best = Math.max(best, bands);
    }
    return best;
  }
  const charts = setInterval(() => {
    if (plotlyPanels() >= need || canvasPanels() >= need) {
      window.__chartsAt = performance.now();
      clearInterval(charts);
    }
  }, 25);
  const verdict = setInterval(() => {
    const heads = [...document.querySelectorAll('h2')].map(h => h.innerText).join(' ');
    if (/\\u25cf (healthy|watching|unresolved|action needed|stalled)/.test(heads)) {
      window.__judgedAt = performance.now();
      clearInterval(verdict);
    }
  }, 20);
})();
""" % MIN_PANELS


STAGES = ("app", "collectors", "data", "detectors", "economics")


@dataclass(frozen=True)
class Side:
    """One server to time: an interpreter, and the checkout whose code it serves (None: what it imports)."""

    python: str
    checkout: Path | None = None

    def env(self, links: Path) -> dict[str, str]:
        """The server's environment: with a checkout, ``links/runwatch/<stage>`` -> ``checkout/<stage>`` first."""
        env = dict(os.environ)
        if self.checkout is None:
            return env
        package = links / "runwatch"
        package.mkdir(parents=True, exist_ok=True)
        for stage in STAGES:
            link = package / stage
            if not link.is_symlink():
                link.symlink_to(self.checkout.resolve() / stage)
        env["PYTHONPATH"] = os.pathsep.join([str(links)] + [p for p in [env.get("PYTHONPATH")] if p])
        return env


def start_server(side: Side, root: Path, links: Path) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([side.python, "-m", "runwatch.app.cli", "dashboard", "--root", str(root), "--port",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=side.env(links))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
            return proc, url
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{side.python}: the dashboard exited with {proc.returncode}")
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{side.python}: the dashboard did not come up in 120 s")


def visit(context, url: str, timeout_s: float = 120.0) -> dict[str, float | None]:
    """Navigate a new tab to ``url``; seconds from navigation start to charts drawn, to the verdict and to the
    WebSocket's opening."""
    page = context.new_page()
    try:
        page.goto(url, wait_until="commit")
        page.wait_for_function("window.__chartsAt !== undefined", timeout=timeout_s * 1000, polling=100)
        charts = page.evaluate("window.__chartsAt") / 1000
        socket = page.evaluate("window.__socketAt")
        try:
            page.wait_for_function("window.__judgedAt !== undefined", timeout=timeout_s * 1000, polling=100)
            judged = page.evaluate("window.__judgedAt") / 1000
        except Exception:  # noqa: BLE001 - a page that never shows a verdict is reported, not fatal
            judged = None
        return {"charts_s": charts, "judged_s": judged, "socket_s": None if socket is None else socket / 1000}
    finally:
        page.close()


def measure(side: Side, root: Path, links: Path, run: str, browser) -> dict[str, dict[str, float | None]]:
    """One cold and one warm visit on a fresh server."""
    proc, url = start_server(side, root, links)
    try:
        context = browser.new_context(viewport={"width": 1400, "height": 1800})
        context.add_init_script(WATCH_SCRIPT)
        try:
            cold = visit(context, f"{url}/run?run={run}")
            warm = visit(context, f"{url}/run?run={run}")
        finally:
            context.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"cold": cold, "warm": warm}


def code_of(side: Side, links: Path) -> str:
    """Where the side's code lives, and its commit when that is a git checkout."""
    out = subprocess.run([side.python, "-c", "import runwatch.app as a; print(list(a.__path__)[0])"],
                         capture_output=True, text=True, check=True, env=side.env(links))
    app = Path(out.stdout.strip()).resolve()
    head = subprocess.run(["git", "-C", str(app), "log", "-1", "--format=%h"], capture_output=True, text=True)
    return f"{app.parent} @ {head.stdout.strip() or 'not a git checkout'}"


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def _fmt(values: list[float | None]) -> str:
    done = [v for v in values if v is not None]
    if not done:
        return "never"
    return f"**{statistics.median(done):.2f} s** ({', '.join('-' if v is None else f'{v:.2f}' for v in values)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", help="interpreter whose runwatch serves (repeatable; default: this one)")
    parser.add_argument("--checkout", action="append", type=Path,
                        help="directory whose code the (first) interpreter serves (repeatable, one side each)")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--root", help="work directory holding the run (default: a temporary one, kept only if given)")
    args = parser.parse_args()
    pythons = args.python or [sys.executable]
    sides = [Side(pythons[0], c) for c in args.checkout] if args.checkout else [Side(p) for p in pythons]
    base = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="runwatch-browser-bench-"))
    root = base / "root"
    links = Path(tempfile.mkdtemp(prefix="runwatch-browser-bench-code-"))
    if not (root / "run=big").is_dir():
        t0 = time.perf_counter()
        synthetic_run(root, "big", args.steps)
        print(f"wrote {args.steps:,} steps in {time.perf_counter() - t0:.1f} s")
    from playwright.sync_api import sync_playwright

    results = {side: {"cold": [], "warm": [], "cold_judged": [], "warm_judged": [], "warm_socket": []} for side in sides}
    names = {side: code_of(side, links / str(i)) for i, side in enumerate(sides)}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for r in range(args.rounds):
                for side in (sides if r % 2 == 0 else sides[::-1]):
                    out = measure(side, root, links / str(sides.index(side)), "big", browser)
                    for kind in ("cold", "warm"):
                        results[side][kind].append(out[kind]["charts_s"])
                        results[side][f"{kind}_judged"].append(out[kind]["judged_s"])
                    results[side]["warm_socket"].append(out["warm"]["socket_s"])
                    print(f"round {r + 1}: {names[side]}: cold charts {out['cold']['charts_s']:.2f} s "
                          f"(verdict {_s(out['cold']['judged_s'])}), warm charts {out['warm']['charts_s']:.2f} s "
                          f"(verdict {_s(out['warm']['judged_s'])})", flush=True)
        finally:
            browser.close()
    print(f"\n| server ({args.steps:,}-step run page, real Chromium) | cold: charts drawn | cold: verdict shown "
          "| warm: charts drawn | warm: verdict shown | warm: WebSocket open |\n|---|---:|---:|---:|---:|---:|")
    for side in sides:
        res = results[side]
        print(f"| {names[side]} | {_fmt(res['cold'])} | {_fmt(res['cold_judged'])} | {_fmt(res['warm'])} "
              f"| {_fmt(res['warm_judged'])} | {_fmt(res['warm_socket'])} |")


if __name__ == "__main__":
    main()
