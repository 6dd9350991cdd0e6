"""`runwatch advise` and the run page's checkpoint panel on the demo (real CPU training under Monitor)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from runwatch.app import checkpoint_views as cv
from runwatch.app.advise import checkpoint_advice
from runwatch.app.cli import main
from runwatch.data.store import Store
from tests.app.conftest import TEST_PLAN_KW, spike_lines, write_jsonl_run
from tests.app.test_pages import no_errors, open_page
from tests.economics.ladder_check import all_clean, dense_only, replay

KEYS = {"checkpoint_seconds", "checkpoint_bytes", "mtbf_hours", "interruptions", "lost_steps", "lost_hours",
        "goodput", "cadence", "retention"}


def _advise_json(root: Path, run: str, *extra: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "runwatch.app.cli", "advise", "--root", str(root), "--run", run,
                          "--json", *extra], capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n") == 1  # exactly one object
    return json.loads(out.stdout)


def test_json_contract_on_the_rolled_back_demo(demo_root: Path) -> None:
    d = _advise_json(demo_root, "demo-rollback")
    assert set(d) == KEYS
    assert set(d["cadence"]) == {"young_minutes", "daly_minutes", "current_minutes"}
    assert set(d["retention"]) == {"keep_last", "every_nth", "milestones", "reason"}
    with Store(demo_root) as store:
        events = [json.loads(e["payload"]) for e in store.events("demo-rollback").to_pylist()
                  if e["event"] == "checkpoint"]
    assert d["checkpoint_seconds"] == statistics.median(e["write_seconds"] for e in events)  # the loop timed each
    assert d["checkpoint_bytes"] == round(statistics.median(e["bytes"] for e in events))
    # Segment 0 ran to step 159 (the LR jump at 130 + 30), the restart resumed from checkpoint 120.
    rollback_stop = TEST_PLAN_KW["lr_jump_at"] + TEST_PLAN_KW["rollback_after_jump"]
    assert d["lost_steps"] == rollback_stop - 1 - 120
    assert d["interruptions"] >= 1 and 0 < d["goodput"] < 1 and d["lost_hours"] > 0
    assert d["cadence"]["young_minutes"] > 0 and d["cadence"]["current_minutes"] > 0
    assert d["retention"]["keep_last"] >= 2 and d["retention"]["milestones"]


@pytest.mark.parametrize("run", ["demo-rollback", "demo-diverged"])
def test_the_demos_ladder_keeps_a_clean_checkpoint_for_every_finding(demo_root: Path, run: str) -> None:
    with Store(demo_root) as store:
        keep = checkpoint_advice(store, run).retention.keep_last
        answers = replay(store, run, dense_only(keep))
    assert keep is not None and all_clean(answers)
    assert {f.kind for f, _ in answers} & {"spike", "divergence"}


def test_human_output_and_cost(demo_root: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["advise", "--root", str(demo_root), "--run", "demo-diverged", "--mtbf-hours", "12",
                 "--cost-per-hour", "98.32"]) == 0
    text = capsys.readouterr().out
    with Store(demo_root) as store:
        advice = checkpoint_advice(store, "demo-diverged", mtbf_hours=12.0)
    for label, value in cv.metric_rows(advice)[:2]:
        assert value in text
    assert "MTBF 12 h (given)" in text and "h/day ($" in text and "keep the last" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--run", "no-such-run"], "unknown run 'no-such-run'"),
    (["--run", "demo-diverged", "--mtbf-hours", "0"], "--mtbf-hours must be a positive number"),
    (["--run", "demo-diverged", "--mtbf-hours", "nan"], "--mtbf-hours must be a positive number"),
    (["--run", "demo-diverged", "--cost-per-hour", "-1"], "--cost-per-hour must be a non-negative number"),
])
def test_bad_input_is_one_line_and_exit_2(demo_root: Path, capsys: pytest.CaptureFixture, args: list[str],
                                         message: str) -> None:
    assert main(["advise", "--root", str(demo_root), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_a_non_number_is_a_usage_error(demo_root: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["advise", "--root", str(demo_root), "--run", "demo-diverged", "--mtbf-hours", "soon"])
    assert exc.value.code == 2 and "invalid float value: 'soon'" in capsys.readouterr().err


def test_panel_shows_the_same_figures(monkeypatch: pytest.MonkeyPatch, demo_root: Path) -> None:
    at = open_page(monkeypatch, demo_root, "run", run="demo-rollback")
    no_errors(at)
    with Store(demo_root) as store:
        advice = checkpoint_advice(store, "demo-rollback")
    shown = {m.label: m.value for m in at.metric}
    for label, value in cv.metric_rows(advice):
        assert shown[label] == value
    assert cv.retention_line(advice) in [t.value for t in at.text]
    assert not [n for n in at.number_input if n.label == "MTBF (hours)"]  # the what-if is made once opened
    at.session_state["whatif_open:demo-rollback"] = True
    at.run()
    mtbf = next(n for n in at.number_input if n.label == "MTBF (hours)")
    assert mtbf.value == pytest.approx(advice.mtbf_seconds / 3600)
    assert any("what if" in (e.label or "") for e in at.expander)


def test_whatif_chart_marks_the_intervals() -> None:
    option, alt = cv.whatif_chart(300.0, 24 * 3600.0, current=3600.0, restart=600.0, cost_per_hour=100.0)
    lines = option["series"]
    names = [s["name"] for s in lines]
    current = next(s for s in lines if s["name"].startswith("current 60 min"))
    assert [p[0] for p in current["data"]] == [60.0, 60.0]
    daly = next(s for s in lines if s["name"].startswith("Daly 117 min"))
    curve = [p for p in lines[0]["data"] if p[1] is not None]
    assert min(curve, key=lambda p: p[1])[0] == pytest.approx(daly["data"][0][0], rel=0.03)
    assert any(n.startswith("Young 120 min") for n in names) and "$" in current["name"]
    assert option["yAxis"][1]["name"] == "cost per day ($)" and current["name"] in alt
    no_cost, _ = cv.whatif_chart(300.0, 86400.0)
    assert len(no_cost["yAxis"]) == 1  # no cost, no cost axis
    json.dumps(no_cost, allow_nan=False)  # what the browser gets: plain JSON


def test_panel_on_a_run_the_record_says_little_about(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No interruption (no MTBF), saves timed at 0 s: nulls shown as 'unknown', the what-if asks for inputs."""
    root = tmp_path / "root"
    root.mkdir()
    lines = spike_lines(200, spike_at=-1)
    lines += [{"event": "checkpoint", "step": s, "path": f"c/{s}", "write_seconds": 0.0} for s in (50, 100, 150)]
    write_jsonl_run(root, "quiet", lines)
    at = open_page(monkeypatch, root, "run", run="quiet")
    no_errors(at)
    shown = {m.label: m.value for m in at.metric}
    assert shown["MTBF"] == "unknown" and shown["Young"] == "unknown" and shown["checkpoint cost"] == "0 s"
    assert shown["interruptions"] == "0" and shown["current interval"] != "unknown"
    at.session_state["whatif_open:quiet"] = True
    at.run()
    assert any("needs an MTBF and a checkpoint cost" in i.value for i in at.info)
