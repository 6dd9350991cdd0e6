"""A real local HTTP server that receives ``runwatch watch``'s JSON webhook (apprise's ``json://``), and real runs.

``Webhook`` listens on 127.0.0.1, records every POST body with the time it
arrived, and can be stopped and started again on the same port (the notifier
is down, then back). ``train_run`` records a tiny GPT under ``Monitor``: a real
NaN (a NaN gradient that poisons the weights) and a real rollback resume.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches, train_step
from runwatch.collectors import Monitor
from runwatch.collectors.monitor import MonitorConfig

CFG = TinyGPTConfig(d_model=16, num_layers=1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Webhook:
    """The receiving end of ``json://127.0.0.1:PORT/hook``."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.received: list[dict] = []  # {"at": arrival time, "path", "body": the JSON apprise posted}
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.port}/hook"

    def start(self) -> "Webhook":
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with hook._lock:
                    hook.received.append({"at": time.time(), "path": self.path, "body": body})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def titles(self) -> list[str]:
        with self._lock:
            return [r["body"]["title"] for r in self.received]

    def wait_for(self, count: int, timeout: float = 60.0, where: Callable[[dict], bool] | None = None) -> list[dict]:
        """The messages received (those ``where`` accepts, when given) once there are ``count`` of them."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self._lock:
                got = [r for r in self.received if where is None or where(r)]
            if len(got) >= count:
                return got
            time.sleep(0.05)
        raise AssertionError(f"expected {count} message(s) within {timeout} s, got {self.titles()}")


def is_nan_title(title: str) -> bool:
    """A page about a NaN. A run trained here is timed by real wall time, so on a loaded machine it can also get a
    slowdown page; tests about a NaN's paging judge the NaN's pages (and count any others)."""
    return title.endswith(": nan")


def is_nan_page(message: dict) -> bool:
    return is_nan_title(message["body"]["title"])


def nan_titles(hook: Webhook) -> list[str]:
    """The titles of the NaN's pages, in the order received."""
    return [t for t in hook.titles() if is_nan_title(t)]


def train_run(root: Path, run: str, steps: int, *, nan_at: int | None = None, resume: tuple[int, Path] | None = None,
              ckpt_dir: Path | None = None, save_every: int = 20, finished: bool = False, seed: int = 0) -> Monitor:
    """Train a tiny GPT for ``steps`` steps under ``Monitor`` (a NaN gradient at ``nan_at`` poisons the
    weights for good; ``resume``: (step, checkpoint) to restart from, as a new segment)."""
    torch.manual_seed(seed)
    model = TinyGPT(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    start = 0
    if resume is not None:
        start = resume[0] + 1
        state = torch.load(resume[1])
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    batches = synthetic_batches(CFG, batch_size=4, seed=seed)
    for _ in range(start):  # the data position a resume restarts from (the same data stream, not a new one)
        next(batches)
    mon = Monitor(root, run, model=model, activation_module=model.blocks[-1],
                  resume_step=None if resume is None else resume[0],
                  resume_checkpoint=None if resume is None else str(resume[1]),
                  config=MonitorConfig(flush_every_steps=25, flush_every_seconds=0.2, heartbeat_seconds=0.5))
    for step in range(start, start + steps):
        def poison(module: torch.nn.Module, step: int = step) -> None:
            if step == nan_at:
                next(module.parameters()).grad.fill_(float("nan"))
        loss, grad_norm = train_step(model, opt, next(batches), after_backward=poison)
        mon.step(step, loss=loss, grad_norm=grad_norm, lr=3e-3)
        if ckpt_dir is not None and step % save_every == 0 and step > start:
            path = ckpt_dir / f"{run}-{step}.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
            mon.checkpoint(step, path, write_seconds=0.01)
    mon.close(finished=finished)  # not finished: the run stays live (a crashed job that did not say it ended)
    return mon
