"""``runwatch watch`` end to end: real runs under Monitor, the real CLI, a real HTTP server receiving the JSON webhook.

One message per finding, one when it resolves; nothing repeated inside the cool-down or across ``--once``
passes; a notifier that is down loses nothing and repeats nothing once it is back, in both modes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.app.webhook import Webhook, is_nan_page, is_nan_title, nan_titles, train_run

RUNWATCH = [sys.executable, "-m", "runwatch.app.cli"]


def _once(root: Path, hook: Webhook, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*RUNWATCH, "watch", "--root", str(root), "--once", "--notify", hook.url, *extra],
                          capture_output=True, text=True, timeout=180)


def _state(root: Path) -> dict:
    return json.loads((root / "watch-state.json").read_text())


def _nan_outbox(root: Path) -> list[dict]:
    return [entry for entry in _state(root)["outbox"] if entry["alert"].split("|")[1] == "nan"]


def test_once_passes_page_once_survive_an_outage_and_resolve(tmp_path: Path) -> None:
    root, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    hook = Webhook()  # not started: the notifier is down
    train_run(root, "gpt", 60, nan_at=45, ckpt_dir=ckpt)
    train_run(root, "healthy", 60, ckpt_dir=ckpt)
    first = _once(root, hook, "--dashboard-url", "http://dash.example:8501")
    assert first.returncode == 1, first.stderr  # action needed
    assert "could not be delivered" in first.stderr and "Traceback" not in first.stderr
    # Real wall time: on a loaded machine the runs can also get a slowdown message; the NaN's are judged here.
    (waiting,) = _nan_outbox(root)
    assert waiting["attempts"] == 3  # three tries inside the pass, then it waits in the outbox
    assert oct((root / "watch-state.json").stat().st_mode & 0o777) == "0o600"
    assert hook.url not in (root / "watch-state.json").read_text()  # the target's secret is never stored

    queued = len(_state(root)["outbox"])
    second = _once(root, hook)  # still down: the same message waits, no second copy is queued
    assert second.returncode == 1 and len(_nan_outbox(root)) == 1 and len(_state(root)["outbox"]) == queued

    hook.start()
    try:
        third = _once(root, hook)
        assert third.returncode == 1 and f"{queued} message(s) delivered, 0 waiting" in third.stdout
        (msg,) = filter(is_nan_page, hook.received)
        body = msg["body"]
        assert body["title"] == "[runwatch] ACTION gpt: nan" and body["type"] == "failure"
        assert set(body) >= {"version", "title", "message", "type"}
        text = body["message"]
        assert "onset: step 45" in text and "non-finite" in text and "resume: --resume" in text
        assert "dashboard: http://dash.example:8501/run?run=gpt" in text
        assert _state(root)["counters"]["delivered_after_retry"] == queued  # each waited out the outage

        assert _once(root, hook).returncode == 1
        assert nan_titles(hook) == ["[runwatch] ACTION gpt: nan"]  # remembered: one page per finding, not per pass

        train_run(root, "gpt", 30, resume=(40, ckpt / "gpt-40.pt"))  # the on-call engineer rolled back
        fifth = _once(root, hook)
        assert fifth.returncode == 0, fifth.stdout + fifth.stderr
        assert nan_titles(hook) == ["[runwatch] ACTION gpt: nan", "[runwatch] RESOLVED gpt: nan"]
        (resolved,) = [m for m in hook.received if m["body"]["title"] == "[runwatch] RESOLVED gpt: nan"]
        assert resolved["body"]["type"] == "success"
        assert _once(root, hook).returncode == 0 and len(nan_titles(hook)) == 2
    finally:
        hook.stop()


def test_a_finding_that_comes_back_inside_the_cooldown_is_held(tmp_path: Path) -> None:
    root, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    hook = Webhook().start()
    try:
        train_run(root, "gpt", 60, nan_at=45, ckpt_dir=ckpt)
        assert _once(root, hook).returncode == 1
        train_run(root, "gpt", 30, resume=(40, ckpt / "gpt-40.pt"), ckpt_dir=ckpt)
        assert _once(root, hook).returncode == 0
        # It happens again right after the rollback: same run, same kind, inside the half-hour cool-down.
        train_run(root, "gpt", 40, nan_at=80, resume=(60, ckpt / "gpt-60.pt"), ckpt_dir=ckpt)
        assert _once(root, hook).returncode == 1
        # (Real wall time: on a loaded machine a slowdown can be paged too; only the NaN's pages are judged here.)
        assert nan_titles(hook) == ["[runwatch] ACTION gpt: nan", "[runwatch] RESOLVED gpt: nan"]
        assert _state(root)["counters"]["held_by_cooldown"] >= 1
        # With no cool-down the second incident is its own page.
        (root / "watch-state.json").unlink()
        assert _once(root, hook, "--cooldown", "0").returncode == 1
        assert nan_titles(hook) == ["[runwatch] ACTION gpt: nan", "[runwatch] RESOLVED gpt: nan",
                                     "[runwatch] ACTION gpt: nan"]
    finally:
        hook.stop()


def _start_watch(root: Path, hook: Webhook) -> subprocess.Popen:
    return subprocess.Popen([*RUNWATCH, "watch", "--root", str(root), "--notify", hook.url, "--interval", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out


def test_the_service_sends_one_alert_and_one_resolve_and_survives_an_outage(tmp_path: Path) -> None:
    root, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    train_run(root, "healthy", 60, ckpt_dir=ckpt)
    hook = Webhook()  # down when the finding lands
    proc = _start_watch(root, hook)
    try:
        time.sleep(3)  # the watch is up and has judged what was there
        landed = time.time()
        train_run(root, "gpt", 60, nan_at=45, ckpt_dir=ckpt)
        time.sleep(4)  # it retries with back-off meanwhile
        assert hook.received == []
        hook.start()
        # Delivered by a retry (back-off at most a few seconds here). Real wall time: on a loaded machine a
        # slowdown can be paged too (a fresh-clone run beside a training job saw one first); the NaN's are judged.
        (alert,) = hook.wait_for(1, timeout=60, where=is_nan_page)
        assert alert["body"]["title"] == "[runwatch] ACTION gpt: nan" and alert["at"] > landed
        train_run(root, "gpt", 30, resume=(40, ckpt / "gpt-40.pt"))
        hook.wait_for(2, timeout=30, where=is_nan_page)
        time.sleep(3)  # more ticks and file events: nothing is sent twice
        assert nan_titles(hook) == ["[runwatch] ACTION gpt: nan", "[runwatch] RESOLVED gpt: nan"]
    finally:
        out = _stop(proc)
        hook.stop()
    state = _state(root)
    others = [t for t in hook.titles() if not is_nan_title(t)]  # a loaded machine's slowdown pages, if any
    resolved = sum(t.startswith("[runwatch] RESOLVED") for t in others)
    assert state["counters"]["alerts"] == 1 + len(others) - resolved and state["counters"]["resolves"] == 1 + resolved
    assert state["counters"]["failed_attempts"] >= 1 and state["outbox"] == []
    assert "Traceback" not in out


@pytest.mark.parametrize(("args", "message"), [
    (["--notify", "notaurl"], "not a notification URL apprise understands"),
    (["--notify", "json://127.0.0.1:1/x", "--dashboard-url", "javascript:alert(1)"], "must be an http(s) URL"),
    (["--interval", "0"], "must be > 0"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    out = subprocess.run([*RUNWATCH, "watch", "--root", str(tmp_path), "--once", *args], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_an_object_store_root_needs_a_local_state_file(tmp_path: Path) -> None:
    out = subprocess.run([*RUNWATCH, "watch", "--root", "s3://lab-runs/gpt-7b", "--once"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "needs --state PATH" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_second_watch_on_the_same_state_is_refused(tmp_path: Path) -> None:
    hook = Webhook().start()
    proc = _start_watch(tmp_path, hook)
    try:
        time.sleep(2.5)
        out = subprocess.run([*RUNWATCH, "watch", "--root", str(tmp_path), "--once"], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and "another runwatch watch holds this state file" in out.stderr
    finally:
        _stop(proc)
        hook.stop()
    assert os.path.exists(tmp_path / "watch-state.json")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*RUNWATCH, *args], capture_output=True, text=True, timeout=120)


def test_watch_pages_no_acknowledged_finding_and_nothing_while_a_run_is_silenced(tmp_path: Path) -> None:
    """The on-call rule (``oncall.alertable``) holds for ``watch`` as for the dashboard's banner: an acknowledged
    finding opens no alert, a silenced run sends nothing, and a finding still open when the silence ends pages."""
    root, ckpt = tmp_path / "runs", tmp_path / "ckpt"
    hook = Webhook().start()
    try:
        train_run(root, "acked", 60, nan_at=45, ckpt_dir=ckpt)
        train_run(root, "muted", 60, nan_at=45, ckpt_dir=ckpt, seed=1)
        ack = _cli("ack", "--root", str(root), "--run", "acked", "--kind", "nan", "--by", "ana", "--note", "rolling back")
        assert ack.returncode == 0, ack.stderr
        # Long enough that the first pass runs inside it on a loaded machine (each CLI call starts a Python;
        # with 4 s a CI run whose cores were busy paged the run after its silence had already ended).
        silence = _cli("silence", "--root", str(root), "--run", "muted", "--for", "15s", "--by", "bo")
        silenced_at = time.monotonic()  # the silence ends at most 15 s from here (the CLI set it before returning)
        assert silence.returncode == 0, silence.stderr
        assert _once(root, hook).returncode == 1  # both still need action: the exit status says so
        assert nan_titles(hook) == []
        time.sleep(max(0.0, silenced_at + 15.5 - time.monotonic()))  # the silence ends; the acknowledgement does not
        assert _once(root, hook).returncode == 1
        assert nan_titles(hook) == ["[runwatch] ACTION muted: nan"]
        assert _once(root, hook).returncode == 1 and nan_titles(hook) == ["[runwatch] ACTION muted: nan"]
    finally:
        hook.stop()


def test_a_run_that_ended_between_two_passes_is_judged_on_its_last_rows_and_history_is_not(tmp_path: Path) -> None:
    """A review's case: the service, started on a fresh state, paged a run that had ended 15 minutes earlier, while
    a cron pass on the same root judged only the live runs. Both now judge the runs that can still stall, those with
    an alert open, and those written since the last pass of the state: a run that ended before the first pass is
    history (not paged by either), and one that ended between two passes is judged once on its last rows (which a
    cron watch skipped: a NaN and the end of training between two passes were never paged)."""
    root = tmp_path / "runs"
    hook = Webhook().start()
    try:
        train_run(root, "old", 60, nan_at=45, finished=True)  # ended before anyone watched
        proc = _start_watch(root, hook)  # a fresh state
        try:
            time.sleep(3)  # the service is up and has judged what was there
        finally:
            _stop(proc)
        assert nan_titles(hook) == []
        assert _once(root, hook).returncode == 0 and nan_titles(hook) == []
        train_run(root, "late", 60, nan_at=45, finished=True)  # diverged and ended between two passes
        assert _once(root, hook).returncode == 1
        assert nan_titles(hook) == ["[runwatch] ACTION late: nan"]
        assert _once(root, hook).returncode == 1 and len(nan_titles(hook)) == 1  # once, not on every pass
    finally:
        hook.stop()


def test_text_from_a_run_reaches_every_target_inert() -> None:
    """A review's case: a checkpoint path with a Markdown link, an ``@here`` and an ESC went into Discord's
    ``content`` as it was (apprise escapes for Slack, not for Discord: a link rendered, everyone pinged). Every
    message is made inert once before apprise (``escape.notification``), here through a real HTTP receiver of
    apprise's JSON target: the text reads the same, and no link, image, mention or control character is left."""
    from runwatch.app.alerts import url_key
    from runwatch.app.notify import Notifier

    hook = Webhook().start()
    try:
        path = "ck/[click](http://evil.example/link)![img](http://evil.example/md.png) @here <!channel> <@42>\x1b[2K.pt"
        assert Notifier([hook.url]).send(url_key(hook.url), f"[runwatch] ACTION {path}", f"line one\nresume: {path}",
                                         "failure")
        (msg,) = hook.wait_for(1, timeout=30)
        title, text = msg["body"]["title"], msg["body"]["message"]
        for sent in (title, text):
            assert "](" not in sent and "![" not in sent and "@here" not in sent and "<!" not in sent, sent
            assert "<@" not in sent and "\x1b" not in sent, sent
            assert sent.replace("\u2060", "").endswith("@here <!channel> <@42> [2K.pt"), sent  # reads the same
        assert text.startswith("line one\nresume: ")  # lines kept
    finally:
        hook.stop()


def test_an_alerts_evidence_is_whole_fields_that_say_something() -> None:
    """A review's 3 a.m. page carried the evidence as JSON cut in the middle of a value (``..."lr_ratio": 4 ...``),
    nulls and falses included. It is now ``key=value`` for the fields that say something, numbers to 4 significant
    digits, a field too long for the message (a list of rejected checkpoints) left out whole and counted."""
    from runwatch.app.alerts import MAX_EVIDENCE_CHARS, _evidence

    evidence = {"rule": "shewhart", "baseline_loss": 2.345678, "lr_ratio": 49.99999, "lr_raised": True,
                "recovery_steps": None, "blip": False, "trigger_step": 305,
                "rejected_checkpoints": [{"step": s, "why": "deleted (not retained or not on disk)"} for s in range(40)]}
    text = _evidence(evidence)
    assert text == ("baseline_loss=2.346, lr_raised=True, lr_ratio=50, rule=shewhart, trigger_step=305, "
                    "(+1 more: runwatch check --json)"), text
    assert len(text) <= MAX_EVIDENCE_CHARS + 40
