"""`advise` on imported records: exact figures from JSONL runs with known times, and the real restart histories
in ../shared/realruns (see their SOURCE.md): what the record gives, and null where it cannot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from runwatch.app.advise import checkpoint_advice
from runwatch.collectors.importers import import_logs
from runwatch.data.store import Store
from tests.realruns import BLOCKS

needs_realruns = pytest.mark.skipif(not BLOCKS.is_dir(), reason=f"real logs not found at {BLOCKS}")
T0 = 1.7e9


def _import(tmp_path: Path, run: str, lines: list[dict]) -> Path:
    path = tmp_path / f"{run}.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    import_logs("jsonl", [path], tmp_path / "root", run)
    return tmp_path / "root"


def _advice(root: Path, run: str, **kw: object) -> dict:
    with Store(root) as store:
        return checkpoint_advice(store, run, **kw).to_dict()


def _loss(step: int) -> float:
    return 2.0 + math.exp(-step / 80)


def test_a_stall_is_an_interruption_and_its_time_is_lost(tmp_path: Path) -> None:
    """0.1 s steps, a 0.5 s save every 50 steps, and one 60 s pause after step 150."""
    lines, t = [], T0
    for s in range(300):
        t += 0.1 if s else 0.0
        t += 60.0 if s == 151 else 0.0
        t += 0.5 if s and (s - 1) % 50 == 0 and s > 1 else 0.0  # the save after step s-1 delays row s
        lines.append({"step": s, "time": t, "loss": _loss(s), "grad_norm": 1.0})
        if s and s % 50 == 0:
            lines.append({"event": "checkpoint", "step": s, "path": f"ckpt/{s}.pt", "bytes": 1000 + s,
                          "write_seconds": 0.5})
    d = _advice(_import(tmp_path, "paused", lines), "paused")
    wall = 29.9 + 60.0 + 5 * 0.5
    assert d["checkpoint_seconds"] == 0.5 and d["checkpoint_bytes"] == 1150
    assert d["interruptions"] == 1 and d["lost_steps"] == 0
    assert d["lost_hours"] == pytest.approx(60.0 / 3600, rel=1e-6)
    assert d["mtbf_hours"] == pytest.approx(wall / 3600, rel=1e-6)
    assert d["goodput"] == pytest.approx((wall - 60.0 - 5 * 0.5) / wall, rel=1e-6)
    assert d["cadence"]["current_minutes"] == pytest.approx(50 * 0.1 / 60, rel=1e-6)
    assert d["cadence"]["young_minutes"] == pytest.approx(math.sqrt(2 * 0.5 * wall) / 60, rel=1e-6)


def test_a_resume_with_skipped_batches(tmp_path: Path) -> None:
    """Crash after step 180, 30 s down, resume from checkpoint 100 skipping batches 101-110."""
    lines = []
    for s in range(181):
        lines.append({"step": s, "time": T0 + 0.1 * s + (0.5 if s > 100 else 0.0), "loss": _loss(s), "segment": 0})
        if s == 100:
            lines.append({"event": "checkpoint", "step": 100, "path": "ckpt/100.pt", "write_seconds": 0.5})
    crash = T0 + 0.1 * 180 + 0.5
    lines.append({"event": "resume", "step": 100, "segment": 1, "checkpoint": "ckpt/100.pt",
                  "skip_batches": [101, 110]})
    lines += [{"step": s, "time": crash + 30.0 + 0.1 * (s - 110), "loss": _loss(s), "segment": 1}
              for s in range(111, 300)]
    d = _advice(_import(tmp_path, "resumed", lines), "resumed")
    assert d["interruptions"] == 1 and d["lost_steps"] == 80
    # The 80 replaced steps (0.1 s each) and 30 s down; the checkpoint at 100 is kept on the main line.
    assert d["lost_hours"] * 3600 == pytest.approx(80 * 0.1 + 30.0, abs=1e-6)
    wall = crash + 30.0 + 0.1 * 189 - T0
    assert d["goodput"] == pytest.approx((wall - 38.0 - 0.5) / wall, rel=1e-6)


def test_a_record_without_a_clock_or_checkpoints_gives_nulls(tmp_path: Path) -> None:
    lines = [{"step": s, "loss": _loss(s)} for s in range(200)]
    d = _advice(_import(tmp_path, "bare", lines), "bare", mtbf_hours=24.0)
    assert d["checkpoint_seconds"] is None and d["checkpoint_bytes"] is None
    assert d["interruptions"] == 0 and d["lost_steps"] == 0 and d["lost_hours"] == 0.0
    assert d["goodput"] is None and d["mtbf_hours"] == 24.0  # given; no checkpoint cost, so no interval
    assert d["cadence"] == {"young_minutes": None, "daly_minutes": None, "current_minutes": None}
    assert d["retention"]["keep_last"] is None and d["retention"]["every_nth"] is None
    assert d["retention"]["milestones"] is None and "not measured" in d["retention"]["reason"]


@needs_realruns
def test_bloom_tr1_13b_checkpoint_save_time(tmp_path: Path) -> None:
    """tr1-13B: `save-checkpoint: 57514.53` ms after the save at iteration 33241, then the job exits."""
    import_logs("megatron", [BLOCKS / "tr1-13B-base__chronicles__L207-216.log"], tmp_path, "tr1-13B")
    d = _advice(tmp_path, "tr1-13B")
    assert d["checkpoint_seconds"] == pytest.approx(57.51453)
    assert d["checkpoint_bytes"] is None and d["interruptions"] == 0
    assert d["mtbf_hours"] is None and d["goodput"] is None  # Megatron lines carry no wall clock
    assert d["cadence"] == {"young_minutes": None, "daly_minutes": None, "current_minutes": None}
    given = _advice(tmp_path, "tr1-13B", mtbf_hours=24.0)["cadence"]
    assert given["young_minutes"] == pytest.approx(math.sqrt(2 * 57.51453 * 86400) / 60)  # 52.5 min
    assert given["daly_minutes"] == pytest.approx(51.9, abs=0.05)
    assert given["current_minutes"] is None  # one checkpoint: no interval


@needs_realruns
def test_bloom_reshaping_restarts(tmp_path: Path) -> None:
    """BLOOM-176B resumed at iteration 94768 seven times under different TP/PP topologies."""
    blocks = sorted(BLOCKS.glob("tr11-176B-ml__reshaping-log__*.log"), key=lambda p: int(p.stem.split("__L")[1].split("-")[0]))
    import_logs("megatron", blocks, tmp_path, "bloom-reshape")
    with Store(tmp_path) as store:
        advice = checkpoint_advice(store, "bloom-reshape")
    d = advice.to_dict()
    assert d["interruptions"] == 6
    assert [r.lost_steps for r in advice.measured.restarts] == [2, 1, 3, 2, 2, 3]
    assert d["lost_steps"] == 13
    # Seconds per iteration are logged, but not when each attempt started: no wall time, no downtime.
    assert d["lost_hours"] is None and d["mtbf_hours"] is None and d["goodput"] is None
    assert d["checkpoint_seconds"] is None and d["retention"]["milestones"] is None


@pytest.mark.parametrize(("field", "value", "message"), [
    ("write_seconds", "slow", "'write_seconds' must be a finite number >= 0 or null, got 'slow'"),
    ("write_seconds", -1.0, "'write_seconds' must be a finite number >= 0 or null, got -1.0"),
    ("bytes", 1.5, "'bytes' must be an integer >= 0, got 1.5"),
])
def test_checkpoint_fields_of_the_jsonl_contract_are_checked(tmp_path: Path, field: str, value: object,
                                                           message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n"
                    + json.dumps({"event": "checkpoint", "step": 1, "path": "c", field: value}) + "\n")
    with pytest.raises(ValueError, match=f"bad.jsonl:2: {message}"):
        import_logs("jsonl", [path], tmp_path / "root", "bad")
    assert not (tmp_path / "root" / "run=bad").exists()  # nothing of it lands
