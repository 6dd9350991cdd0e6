"""Fixtures for the dashboard tests: a real demo store (tiny GPT trained under Monitor) and small stores.

The demo store is made once per session with a shortened plan: the same
faults (a recovered spike, an LR jump that sticks for > 200 steps, a rollback
restart with skipped batches), fewer steps and a smaller batch.
"""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest

from runwatch.collectors.importers import import_logs


def shown(markdown_text: str) -> str:
    """What a reader sees of escaped Markdown source: the backslash escapes removed (``escape.markdown``)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown_text).replace("\u2060", "")


TEST_PLAN_KW = dict(num_steps=300, checkpoint_every=40, bad_batches=(70, 73), lr_jump_at=130,
                    stop_after_jump=215, rollback_after_jump=30, skip_batches=10, batch_size=8)


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from runwatch.app.demo import DemoPlan, record_demo

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("demo")
    record_demo(root, DemoPlan(**TEST_PLAN_KW), runs=("demo-diverged", "demo-rollback"), progress_out=io.StringIO())
    return root


def write_jsonl_run(root: Path, run: str, lines: list[dict], name: str = "log.jsonl") -> Path:
    """Import ``lines`` (JSONL contract) as ``run`` under ``root``; returns the log path."""
    path = root.parent / f"{root.name}-{run}-{name}"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    import_logs("jsonl", [path], root, run)
    return path


def spike_lines(num_steps: int, spike_at: int, *, nan_at: int | None = None, t0: float = 1.7e9) -> list[dict]:
    """A smooth loss curve with one one-step spike (and optionally one NaN)."""
    lines = []
    for s in range(num_steps):
        loss = 2.0 + math.exp(-s / (num_steps / 4)) + (30.0 if s == spike_at else 0.0)
        if s == nan_at:
            loss = float("nan")
        lines.append({"step": s, "time": t0 + 0.1 * s, "tokens": 1024 * (s + 1), "loss": loss, "grad_norm": 1.0,
                      "loss_scale": 65536.0, "lr": 1e-3})
    return lines


HOSTILE_PATH = ("ck/[click](http://evil.example/link)![img](http://evil.example/md.png)"
                "<img src=http://evil.example/html.png><b id=pwn>bold</b>`tick`$(touch x)\x1b[2K.pt")
"""A checkpoint path written by an attacker: Markdown link and image, HTML, a backtick, a command
substitution and an erase-line sequence. Every surface must show it as text and run none of it."""


def hostile_lines(path: str = HOSTILE_PATH, num_steps: int = 300, nan_from: int = 260) -> list[dict]:
    """A run that needs a rollback (the loss turns NaN and stays so) past checkpoints saved at ``path``."""
    lines: list[dict] = []
    for s in range(num_steps):
        loss = 2.0 + math.exp(-s / 75) + 0.01 * math.sin(s)
        lines.append({"step": s, "time": 1.7e9 + 0.1 * s, "tokens": 1024 * (s + 1),
                      "loss": float("nan") if s >= nan_from else loss, "grad_norm": 1.0 + 0.01 * math.cos(s),
                      "loss_scale": 65536.0, "lr": 1e-3})
        if s % 50 == 0 and s > 0:
            lines.append({"event": "checkpoint", "step": s, "path": path})
    return lines


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc=None, timeout_s: float = 90.0) -> None:
    """Until ``url`` answers (any status), or fail with the process's output if it exited."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                pytest.fail(f"{proc.args} exited: {proc.stdout.read() if proc.stdout else ''}")
            time.sleep(0.25)
    pytest.fail(f"{url} did not answer in {timeout_s:.0f} s")
