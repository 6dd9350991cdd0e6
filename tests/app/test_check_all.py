"""``runwatch check --all``: every run judged (local process pool and Spark local mode), findings stored.

The Spark engine reads the Parquet tree itself and must give, run by run,
exactly the object ``check --json`` prints (the local engine calls
``judge_run`` through a real ``Store``; Spark through ``FrameStore``).
The dashboard's overview then takes the stored verdicts instead of judging
archived runs again, and judges again a run whose files are newer.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from runwatch.app import state
from runwatch.app.findings import FINDINGS_FILE, detector_version, read_findings
from runwatch.collectors.importers import import_logs
from runwatch.data.record import metrics_table
from runwatch.data.storage import StagedWrite, data_files
from tests.data.helpers import run_cli

NOW = 1.7e9 + 10_000


def _lines(num_steps: int, kind: str) -> list[dict]:
    """A healthy curve, or one with a spike, a NaN, an LR-driven divergence; nulls where a field was not logged."""
    out = []
    for s in range(num_steps):
        loss = 2.0 + math.exp(-s / 200)
        grad = 1.0
        if kind == "spike" and s == 400:
            loss, grad = loss + 30.0, 50.0
        if kind == "diverge" and s >= 350:
            loss += (s - 350) * 0.05
        if kind == "nan" and s >= 450:
            loss = float("nan")
        line = {"step": s, "time": 1.7e9 + s, "tokens": 1024 * (s + 1), "loss": loss, "grad_norm": grad,
                "lr": 1e-3 * (3 if kind == "diverge" and s >= 340 else 1)}
        if s % 7 == 0:
            line.pop("grad_norm")  # null: not measured (must not turn into NaN on the way through Spark)
        out.append(line)
        if s % 100 == 99:
            out.append({"event": "checkpoint", "step": s, "path": f"ck/{s}.pt"})
    return out


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fleet") / "root"
    for i, kind in enumerate(["healthy", "spike", "diverge", "nan", "healthy", "spike"]):
        log = root.parent / f"{i}.jsonl"
        log.write_text("".join(json.dumps(line) + "\n" for line in _lines(600, kind)))
        import_logs("jsonl", [log], root, f"{kind}-{i}")
    with StagedWrite(root) as staged:  # a live run (Monitor-like, with a restart) that has stalled by NOW
        staged.add_metrics("live", 0, 0, metrics_table([{"step": s, "time": 1.7e9 + s, "loss": 1.0, "foo": 0.5}
                                                        for s in range(300)]))
        staged.add_metrics("live", 1, 0, metrics_table([{"step": s, "time": 1.7e9 + s, "loss": 1.0}
                                                        for s in range(200, 320)]))
        staged.add_events("live", 1, 0, [{"event": "resume", "step": 199}])
        staged.add_run_meta("live", {"finished": False})
    return root


def _check(root: Path, *extra: str, now: float | None = NOW) -> tuple[int, list[dict]]:
    """``check --all --json`` as of ``now`` (at ``NOW`` the live run has been silent for hours: stalled)."""
    clock = [] if now is None else ["--now", str(now)]
    out = run_cli("check", "--all", "--root", str(root), "--json", *clock, *extra, timeout=600)
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


def test_local_engine_equals_check_of_each_run_and_stores_findings(fleet: Path) -> None:
    code, results = _check(fleet, "--engine", "local", "--workers", "2")
    assert code == 1 and [r["run"] for r in results] == sorted(r["run"] for r in results)
    for result in results:
        one = run_cli("check", "--root", str(fleet), "--run", result["run"], "--json", "--now", str(NOW))
        assert result == json.loads(one.stdout), "the object check --json prints for the run, exactly"
    assert {r["health"] for r in results} == {"healthy", "action needed", "stalled"}
    assert next(r for r in results if r["run"] == "live")["health"] == "stalled"
    stored = read_findings(fleet, "spike-1")
    # The findings file holds the judgement; acknowledgements and silences are events, read fresh each time.
    result = next(r for r in results if r["run"] == "spike-1")
    judged = {**{k: v for k, v in result.items() if k != "silence"},
              "findings": [{k: v for k, v in f.items() if k != "ack"} for f in result["findings"]]}
    assert stored is not None and stored.report.to_dict("spike-1") == judged
    head = json.loads((fleet / "run=spike-1" / FINDINGS_FILE).read_text().splitlines()[0])
    assert head["detector_version"] == detector_version() and head["engine"] == "local"
    assert not list(fleet.glob(f"**/{FINDINGS_FILE}.parquet"))


def test_spark_engine_gives_the_same_findings_run_by_run(fleet: Path) -> None:
    pytest.importorskip("pyspark", reason="pip install 'runwatch[spark]'")
    if shutil.which("java") is None:
        pytest.skip("no Java runtime (apt-get install default-jre-headless)")
    _, local = _check(fleet, "--engine", "local")
    _, spark = _check(fleet, "--engine", "spark", "--master", "local[2]")
    assert [r["run"] for r in spark] == [r["run"] for r in local]
    for a, b in zip(local, spark):
        assert a == b, a["run"]
    assert {r["health"] for r in spark} == {"healthy", "action needed", "stalled"}
    head = json.loads((fleet / "run=nan-3" / FINDINGS_FILE).read_text().splitlines()[0])
    assert head["engine"] == "spark"


def test_all_and_run_are_exclusive(fleet: Path) -> None:
    out = run_cli("check", "--all", "--run", "x", "--root", str(fleet))
    assert out.returncode == 2 and "not allowed with" in out.stderr


def test_the_overview_takes_stored_verdicts_and_judges_newer_files(fleet: Path, monkeypatch) -> None:
    _check(fleet, "--engine", "local", now=None)  # judged now, as the dashboard sees it
    root_dir = str(fleet)
    state._reports().clear()
    judged = []
    real = state._judge
    monkeypatch.setattr(state, "_judge", lambda r, run: judged.append(run) or real(r, run))
    sigs = state.signatures(root_dir)
    for run, sig in sigs.items():
        report, error, pending = state.report_for(root_dir, run, sig=sig)
        assert report is not None and error is None and not pending
    assert judged == [], "every run was judged already by check --all, on these very files"
    part = data_files(fleet, "healthy-0")[0]
    with StagedWrite(fleet) as staged:  # a new part: the run's files are newer than its stored verdict
        staged.add_metrics("healthy-0", 0, 0, metrics_table([{"step": 600, "time": 1.7e9 + 600, "loss": 2.0}]))
    assert part.exists()
    state._reports().clear()
    for run, sig in state.signatures(root_dir).items():
        state.report_for(root_dir, run, sig=sig)
    assert judged == ["healthy-0"]


def test_the_line_per_run_groups_findings_as_check_does(tmp_path: Path) -> None:
    """A review's HEALTHY run printed ``open: spike@211, spike@234``: two 'info' spikes that ``check --run`` lists
    under "recent (came back by itself)". An empty root printed ``0 runs: `` where ``runs`` says there are none."""
    from runwatch.app.check_all import format_line

    def finding(kind: str, step: int, *, open_: bool, back: bool, action: bool = False) -> dict:
        return {"kind": kind, "onset_step": step, "open": open_, "self_recovered": back, "needs_action": action}

    result = {"run": "r", "health": "watching", "findings": [
        finding("nan", 90, open_=False, back=True), finding("spike", 211, open_=True, back=True),
        finding("stall", 650, open_=True, back=False), finding("scaler_collapse", 700, open_=True, back=True,
                                                                action=True)]}
    assert format_line(result) == "r: WATCHING  open: stall@650, scaler_collapse@700  recent: spike@211"
    (tmp_path / "empty").mkdir()
    out = run_cli("check", "--all", "--root", str(tmp_path / "empty"))
    assert out.returncode == 0 and out.stdout == f"no runs under {tmp_path / 'empty'}\n", out.stdout


def test_a_run_that_ended_mid_episode_is_unresolved_in_every_engine_and_in_check(tmp_path: Path) -> None:
    """The dashboard said "unresolved" for an ended run with an episode still open, ``check``, ``check --all`` and
    the JSON "watching": one run, two words. ``judge_run`` says it for all of them; the exit status stays 0."""
    log = tmp_path / "cut.jsonl"
    lines = [x for x in _lines(600, "healthy") if x["step"] < 540]  # it ends 5 steps into a spike still out
    lines += [{"step": s, "time": 1.7e9 + s, "loss": 9.0, "grad_norm": 40.0, "lr": 1e-3} for s in range(540, 545)]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    root = tmp_path / "root"
    import_logs("jsonl", [log], root, "cut")
    one = run_cli("check", "--root", str(root), "--run", "cut", "--json")
    assert one.returncode == 0 and json.loads(one.stdout)["health"] == "unresolved", one.stdout[:300]
    text = run_cli("check", "--root", str(root), "--run", "cut")
    assert text.stdout.startswith("cut: UNRESOLVED\n"), text.stdout
    code, results = _check(root, "--engine", "local", now=None)
    assert code == 0 and [r["health"] for r in results] == ["unresolved"]
