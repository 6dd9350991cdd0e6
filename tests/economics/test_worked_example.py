"""The README's worked example, built as a JSONL record and checked figure by figure.

10 s steps, a 60 s checkpoint (20 GB) every 100 steps; a crash after step 1180, 20 minutes down, a resume
from checkpoint 1100; the run goes on to step 2999 and its loss jumps at step 2501 (noticed late).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from runwatch.app.advise import checkpoint_advice
from runwatch.collectors.importers import import_logs
from runwatch.data.store import Store
from runwatch.economics.cadence import lost_hours_per_day

T0, STEP, SAVE, EVERY, SIZE = 1.7e9, 10.0, 60.0, 100, 20_000_000_000


def example_lines() -> list[dict]:
    rng = np.random.default_rng(0)
    lines, t = [], T0

    def row(step: int, segment: int) -> None:
        loss = 3.0 + 2.0 * math.exp(-step / 600) + rng.normal(0, 0.03) + (1.2 if step >= 2501 else 0.0)
        lines.append({"step": step, "time": t, "loss": loss, "grad_norm": float(np.exp(rng.normal(np.log(0.3), 0.08))),
                      "segment": segment})
        if step % EVERY == 0 and step:
            lines.append({"event": "checkpoint", "step": step, "path": f"ckpt/{step}", "bytes": SIZE,
                          "write_seconds": SAVE})

    for s in range(1181):
        t = T0 + STEP * s + SAVE * ((s - 1) // EVERY if s else 0)
        row(s, 0)
    crash = t
    lines.append({"event": "resume", "step": 1100, "segment": 1, "checkpoint": "ckpt/1100"})
    for s in range(1101, 3000):
        t = crash + 20 * 60 + STEP * (s - 1100) + SAVE * ((s - 1101) // EVERY)
        row(s, 1)
    return lines


@pytest.fixture(scope="module")
def advice(tmp_path_factory: pytest.TempPathFactory) -> object:
    base = tmp_path_factory.mktemp("worked")
    path = base / "worked.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in example_lines()) + "\n")
    import_logs("jsonl", [path], base / "root", "worked")
    with Store(base / "root") as store:
        return checkpoint_advice(store, "worked")


def test_measured(advice: object) -> None:
    d = advice.to_dict()
    assert d["checkpoint_seconds"] == 60.0 and d["checkpoint_bytes"] == SIZE
    assert d["interruptions"] == 1 and d["lost_steps"] == 80
    restart = advice.measured.restarts[0]
    assert restart.branch_seconds == pytest.approx(800.0) and restart.downtime_seconds == pytest.approx(1200.0)
    wall = 2999 * STEP + 29 * SAVE + 80 * STEP + 1200  # kept steps, kept saves, replaced steps, down
    assert advice.measured.wall_seconds == pytest.approx(wall) and wall == 33730
    assert d["lost_hours"] == pytest.approx(2000 / 3600)  # 0.556 h
    assert d["mtbf_hours"] == pytest.approx(wall / 3600)  # 9.37 h
    assert d["goodput"] == pytest.approx(2999 * STEP / wall)  # 0.889: only kept steps made progress


def test_cadence(advice: object) -> None:
    c = advice.to_dict()["cadence"]
    assert c["current_minutes"] == pytest.approx(1000 / 60)  # 16.7 min
    assert c["young_minutes"] == pytest.approx(math.sqrt(2 * 60 * 33730) / 60)  # 33.5 min
    assert c["daly_minutes"] == pytest.approx(32.87, abs=0.01)
    mtbf, restart = 33730.0, advice.measured.restart_seconds
    assert restart == pytest.approx(1200.0)
    now = lost_hours_per_day(1000.0, 60.0, mtbf, restart)
    best = lost_hours_per_day(c["daly_minutes"] * 60, 60.0, mtbf, restart)
    assert (round(now, 2), round(best, 2)) == (2.49, 2.19)


def test_retention(advice: object) -> None:
    r = advice.to_dict()["retention"]
    assert r["keep_last"] == 2 and r["every_nth"] == 2
    assert "from step 2501, detected at step 2516" in r["reason"] and "before step 2500" in r["reason"]
    # The latest kept healthy checkpoint at or before each 10% of 2999 steps (2500-2900 are inside the jump).
    assert r["milestones"] == [200, 500, 800, 1100, 1400, 1700, 2000, 2300, 2400]
