"""Acknowledge and silence: events in the run's record, seen by `check`, the dashboard and the alert rule."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runwatch.app import oncall
from runwatch.app.check import check_with_oncall, format_report
from runwatch.data.store import Store
from tests.app.conftest import hostile_lines, shown, write_jsonl_run
from tests.app.test_pages import no_errors, open_page

RUNWATCH = [sys.executable, "-m", "runwatch.app.cli"]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A run whose loss turns NaN and stays so: an open finding that needs action."""
    root = tmp_path / "root"
    root.mkdir()
    write_jsonl_run(root, "nan", hostile_lines(path="ck/step.pt"))
    return root


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*RUNWATCH, *args], capture_output=True, text=True, timeout=180)


def test_ack_and_silence_are_events_check_shows(root: Path) -> None:
    report, before = check_with_oncall(root, "nan")
    [finding] = [f for f in report.findings if f.open]
    assert before.ack_for(finding) is None and oncall.alertable(report.findings, before, time.time()) == [finding]
    out = _cli("ack", "--root", str(root), "--run", "nan", "--kind", finding.kind, "--by", "alice",
               "--note", "rolling back to 250")
    assert out.returncode == 0, out.stderr
    check = _cli("check", "--root", str(root), "--run", "nan")
    assert check.returncode == 1  # someone is on it; the run still needs the action
    assert "acknowledged by alice" in check.stdout and "rolling back to 250" in check.stdout
    report, after = check_with_oncall(root, "nan")
    assert after.ack_for(finding).by == "alice" and oncall.alertable(report.findings, after, time.time()) == []

    assert _cli("silence", "--root", str(root), "--run", "nan", "--for", "2h", "--by", "bob",
                "--note", "maintenance").returncode == 0
    as_json = json.loads(_cli("check", "--root", str(root), "--run", "nan", "--json").stdout)
    assert as_json["silence"]["by"] == "bob" and as_json["silence"]["until"] > time.time() + 7000
    [acked] = [f for f in as_json["findings"] if f["ack"]]
    assert acked["ack"]["by"] == "alice" and acked["kind"] == finding.kind
    _, silenced = check_with_oncall(root, "nan")
    assert silenced.silenced(time.time()) is not None and silenced.silenced(time.time() + 3 * 3600) is None
    # Lifted from the command line: --for 0 (a review found it refused, "must be positive", with no other way).
    lifted = _cli("silence", "--root", str(root), "--run", "nan", "--for", "0", "--by", "bob", "--note", "back on")
    assert lifted.returncode == 0 and "silence lifted by bob" in lifted.stdout, lifted.stderr
    assert check_with_oncall(root, "nan")[1].silenced(time.time() + 1) is None


def test_the_latest_ack_and_silence_win_and_a_silence_can_end_early(root: Path) -> None:
    report, _ = check_with_oncall(root, "nan")
    [finding] = [f for f in report.findings if f.open]
    with Store(root) as store:
        segment = max(store.segments("nan")["segment"].to_pylist())
    t0 = time.time()
    oncall.write_ack(root, "nan", finding, by="alice", note="first", segment=segment, now=t0)
    oncall.write_ack(root, "nan", finding, by="carol", note="taking over", segment=segment, now=t0 + 60)
    oncall.write_silence(root, "nan", until=t0 + 3600, by="bob", step=299, segment=segment, now=t0 + 1)
    oncall.write_silence(root, "nan", until=t0 + 2, by="bob", note="back on", step=299, segment=segment, now=t0 + 2)
    _, state = check_with_oncall(root, "nan")
    assert state.ack_for(finding).by == "carol"
    assert state.silenced(t0 + 3) is None  # ended early by the later silence
    text = format_report("nan", report, state, now=t0 + 3)
    assert "acknowledged by carol" in text and "silenced" not in text


@pytest.mark.parametrize("line, error", [
    ({"event": "ack", "step": 5, "by": "a"}, "an ack needs 'finding'"),
    ({"event": "ack", "step": 5, "finding": {"kind": "spike", "segment": -1, "onset_step": 5}, "by": "a"}, "finding"),
    ({"event": "ack", "step": 5, "finding": {"kind": "spike", "segment": 0, "onset_step": 5}}, "needs 'by'"),
    ({"event": "silence", "step": 5, "by": "a", "until": "tomorrow"}, "'until'"),
    ({"event": "silence", "step": 5, "by": "a", "until": 1e9, "note": 3}, "'note' must be a string"),
])
def test_jsonl_contract_checks_the_oncall_events(tmp_path: Path, line: dict, error: str) -> None:
    log = tmp_path / "in.jsonl"
    log.write_text(json.dumps({"step": 0, "loss": 1.0}) + "\n" + json.dumps(line) + "\n")
    out = _cli("import", "jsonl", str(log), "--root", str(tmp_path / "root"), "--run", "r")
    assert out.returncode == 2 and "in.jsonl:2" in out.stderr and error in out.stderr


def test_jsonl_import_carries_acks_and_silences(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    lines = hostile_lines(path="ck/step.pt")
    lines.append({"event": "ack", "step": 260, "time": 1.7e9 + 30, "by": "dave", "note": "known bad shard",
                  "finding": {"kind": "nan", "segment": 0, "onset_step": 260}})
    lines.append({"event": "silence", "step": 299, "time": 1.7e9 + 31, "until": 4e9, "by": "dave"})
    write_jsonl_run(root, "imported", lines)
    with Store(root) as store:
        state = oncall.read_oncall(store.events("imported"))
    assert state.acks[("nan", 0, 260)].note == "known bad shard" and state.silenced(time.time()).by == "dave"


def test_acknowledge_and_silence_from_the_run_page(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    before = open_page(monkeypatch, root, "overview")
    assert any("nan" in shown(p.label) for p in before.get("page_link"))  # the banner calls for someone
    at = open_page(monkeypatch, root, "run", run="nan")
    no_errors(at)
    at.button(key="ack_0").click().run()
    assert any("Type your name" in shown(e.value) for e in at.error)  # an ack says who
    at.text_input(key="oncall_name").set_value("erin").run()
    at.text_input(key="ack_note_0").set_value("on it").run()
    at.button(key="ack_0").click().run()
    no_errors(at)
    assert "acknowledged by erin" in shown("\n".join(m.value for m in at.markdown))
    marks = [m for s in json.loads(at.get("echarts_chart")[-1].proto.spec)["series"] if s["name"] == "ack"
             for m in s["data"]]
    assert marks and "acknowledged by erin" in marks[0]["name"] and "on it" in marks[0]["name"]
    at.session_state["silence_open"] = True  # the silence form is made once its section is opened
    at.run()
    at.selectbox(key="silence_for").set_value("1 hour").run()
    at.button(key="silence_button").click().run()
    no_errors(at)
    assert any("silenced until" in shown(i.value) and "erin" in shown(i.value) for i in at.info)
    at.run()  # the chart of the next run of the page marks the silence where it was set (the run's last step)
    marks = [m for s in json.loads(at.get("echarts_chart")[-1].proto.spec)["series"] if s["name"] == "silence"
             for m in s["data"]]
    assert marks and "silenced until" in marks[0]["name"] and "erin" in marks[0]["name"], marks
    overview = open_page(monkeypatch, root, "overview")
    row = overview.dataframe(key="overview_table").value.iloc[0]
    assert row["alerts"].startswith("silenced until") and "1 acknowledged" in row["what"]
    # The alert rule (oncall.alertable): someone is on it, so the banner no longer calls for the run.
    assert not any("nan" in shown(p.label) for p in overview.get("page_link"))
    assert any("Someone is on it" in shown(c.value) and "nan" in shown(c.value) for c in overview.caption)


def test_a_recent_finding_that_came_back_is_listed_as_recent_not_open() -> None:
    """A review's case (Microsoft's Megatron-DS 125M log): the last of its checkpoint pauses, "it resumed", was
    listed under "open:" because it ended within the recent window. A finding that came back by itself and needs
    nothing keeps its ``open`` flag (the run watches a while) but is listed apart from what is still going on."""
    from runwatch.detectors.analysis import analyze
    from tests.detectors.synth import grad_curve, loss_curve, rows_table

    n = 600
    loss, grad = loss_curve(n), grad_curve(n)
    loss[560:566] += 1.5  # a spike near the end that comes straight back
    grad[560:566] *= 8
    report = analyze(rows_table(list(range(n)), loss=loss, grad_norm=grad))
    [spike] = [f for f in report.findings if f.kind == "spike"]
    assert spike.open and spike.self_recovered and not spike.needs_action, spike
    lines = format_report("r", report).splitlines()
    assert "open:" not in lines and lines[1] == "recent (came back by itself):", lines
    assert lines[2].startswith(f"  [{spike.severity}] spike seg 0 steps 560-"), lines


def test_a_spike_that_came_back_resolves_though_a_slowdown_overlaps_it() -> None:
    """A review's case (``runwatch watch``): a slowdown from 391 and a spike at 400-404 on the same run; the spike
    was paged, came back, and its RESOLVED never came: any open finding over its steps counted as having taken
    its place ("superseded"). Only another reading of the same observations takes a finding's place (a spike
    that became a divergence); a slowdown is another incident, and a divergence over the spike still takes it."""
    from runwatch.app.alerts import AlertBook
    from runwatch.detectors.analysis import Report
    from runwatch.detectors.finding import Finding

    def finding(kind: str, onset: int, end: int, recovered: bool | None) -> Finding:
        return Finding(kind=kind, onset_step=onset, end_step=end, peak_step=onset, segment=0, severity="warning",
                       self_recovered=recovered, needs_action=False, evidence={}, message=f"{kind} from {onset}")

    def report(*found: Finding) -> Report:
        return Report(findings=list(found), segments=[], rollback=None, health="watching")

    slow = finding("slowdown", 391, 700, None)
    for later, resolved in ((finding("spike", 400, 405, True), True), (finding("divergence", 400, 700, None), False)):
        book = AlertBook(targets=["hook"])
        assert book.update("r", report(slow, finding("spike", 400, 404, None)), now=0.0) == 2  # both paged
        book.update("r", report(slow, later), now=60.0)
        [spike] = [a for a in book.alerts.values() if a["kind"] == "spike"]
        assert spike["status"] == ("resolved" if resolved else "superseded"), spike
        assert book.counters["resolves"] == int(resolved)


def test_a_stall_page_resumes_from_the_runs_newest_checkpoint() -> None:
    """A review's case: a live run that stopped after checkpoints 50-250 was paged with "python train.py  # no
    checkpoint recorded: resume from your newest one"; the dashboard's checklist named the checkpoint. The watcher
    now hands the run's checkpoints and command to the message, as the dashboard does."""
    from runwatch.app.alerts import AlertBook
    from runwatch.detectors.analysis import Report
    from runwatch.detectors.finding import Finding

    stall = Finding(kind="stall", onset_step=300, end_step=300, peak_step=300, segment=0, severity="critical",
                    self_recovered=None, needs_action=True, evidence={"live": True}, message="no step for 9 min")
    report = Report(findings=[stall], segments=[], rollback=None, health="stalled")
    checkpoints = [{"step": s, "path": f"ckpt/step{s}.pt", "deleted": False} for s in range(50, 300, 50)]
    book = AlertBook(targets=["hook"])
    assert book.update("r", report, now=0.0, checkpoints=checkpoints, meta={"command": "torchrun train.py"}) == 1
    body = book.outbox[0]["body"]
    assert "torchrun train.py --resume ckpt/step250.pt" in body and "no checkpoint recorded" not in body, body
