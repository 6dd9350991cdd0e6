"""``runwatch watch`` on an object-store root: runs shipped to a real S3 API (moto's server) by ``Monitor``.

An object store sends no file events: the watch lists the bucket every
``--poll`` seconds and reads only the parts of runs whose listing changed.
The streaming judgement equals ``judge_run`` over the bucket; the service
pages once when a NaN run lands and once when its rollback resolves it,
and ``--once`` (cron) pages once per finding across passes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from runwatch.app.follow import RunFollower
from runwatch.app.judge import judge_run
from runwatch.data.store import Store
from tests.app.webhook import Webhook, is_nan_page, is_nan_title, nan_titles, train_run
from tests.s3server import MotoS3

RUNWATCH = [sys.executable, "-m", "runwatch.app.cli"]


def _findings(report) -> list[tuple]:
    return [(f.kind, f.segment, f.rank, f.onset_step, f.open) for f in report.findings]


def test_the_follower_reads_a_bucket_by_listing_and_equals_judge_run(moto_s3: MotoS3, tmp_path: Path) -> None:
    root, ckpt = f"s3://{moto_s3.bucket()}/runs", tmp_path / "ckpt"
    train_run(root, "gpt", 60, nan_at=45, ckpt_dir=ckpt)
    follower = RunFollower(root, poll_seconds=0.2)
    follower.start()
    try:
        assert set(follower.runs) == {"gpt"}
        with Store(root) as store:
            assert _findings(follower.report("gpt")) == _findings(judge_run(store, "gpt"))
        assert any(f.kind == "nan" and f.open for f in follower.report("gpt").findings)
        assert follower.changes(timeout=1.0) == set()  # nothing new: a listing, no part read again

        train_run(root, "gpt", 30, resume=(40, ckpt / "gpt-40.pt"))  # the rollback lands in the bucket
        changed: set[str] = set()
        deadline = time.time() + 20
        while "gpt" not in changed and time.time() < deadline:
            changed |= follower.changes(timeout=0.5)
        assert changed == {"gpt"} and follower.num_rebuilds == 0  # only the new parts were read
        with Store(root) as store:
            expected = judge_run(store, "gpt")
        got = follower.report("gpt")
        assert _findings(got) == _findings(expected) and got.health == expected.health
        assert not any(f.kind == "nan" and f.open for f in got.findings)
    finally:
        follower.stop()


def test_the_service_pages_once_and_resolves_on_a_bucket(moto_s3: MotoS3, tmp_path: Path) -> None:
    root, ckpt, state = f"s3://{moto_s3.bucket()}/runs", tmp_path / "ckpt", tmp_path / "watch-state.json"
    train_run(root, "healthy", 60, ckpt_dir=ckpt)
    hook = Webhook().start()
    proc = subprocess.Popen([*RUNWATCH, "watch", "--root", root, "--notify", hook.url, "--state", str(state),
                             "--poll", "0.5", "--interval", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ))
    try:
        time.sleep(4)  # up, and the bucket listed once
        landed = time.time()
        train_run(root, "gpt", 60, nan_at=45, ckpt_dir=ckpt)
        (alert,) = hook.wait_for(1, timeout=60, where=is_nan_page)
        assert alert["body"]["title"] == "[runwatch] ACTION gpt: nan" and alert["at"] > landed
        assert "onset: step 45" in alert["body"]["message"]
        train_run(root, "gpt", 30, resume=(40, ckpt / "gpt-40.pt"))
        hook.wait_for(2, timeout=60, where=is_nan_page)
        time.sleep(2)  # more listings and ticks: nothing is sent twice
        assert nan_titles(hook) == ["[runwatch] ACTION gpt: nan", "[runwatch] RESOLVED gpt: nan"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        hook.stop()
    assert proc.returncode == 0 and "listing every 0.5 s" in out and "Traceback" not in out, out
    saved = json.loads(state.read_text())
    others = [t for t in hook.titles() if not is_nan_title(t)]  # a loaded machine's slowdown pages, if any
    resolved = sum(t.startswith("[runwatch] RESOLVED") for t in others)
    assert saved["counters"]["alerts"] == 1 + len(others) - resolved and saved["counters"]["resolves"] == 1 + resolved
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in state.read_text() + out  # no credential printed or stored


def test_once_on_a_bucket_pages_once_per_finding(moto_s3: MotoS3, tmp_path: Path) -> None:
    root, ckpt, state = f"s3://{moto_s3.bucket()}/runs", tmp_path / "ckpt", tmp_path / "state.json"
    train_run(root, "gpt", 60, nan_at=45, ckpt_dir=ckpt)
    hook = Webhook().start()
    try:
        for _ in range(2):
            out = subprocess.run([*RUNWATCH, "watch", "--root", root, "--once", "--notify", hook.url, "--state",
                                  str(state)], capture_output=True, text=True, timeout=180, env=dict(os.environ))
            assert out.returncode == 1, out.stdout + out.stderr
        assert nan_titles(hook) == ["[runwatch] ACTION gpt: nan"]
    finally:
        hook.stop()


def test_ack_and_silence_on_a_bucket_reach_check_and_watch(moto_s3: MotoS3, tmp_path: Path) -> None:
    """The on-call events are written to an object-store root as to a directory (one PUT of a new events part,
    under the run's lock): ``check`` shows the ack, and ``watch --once`` pages neither the acknowledged run nor
    the silenced one."""
    root, ckpt = f"s3://{moto_s3.bucket()}/runs", tmp_path / "ckpt"
    train_run(root, "acked", 60, nan_at=45, ckpt_dir=ckpt)
    train_run(root, "muted", 60, nan_at=45, ckpt_dir=ckpt, seed=1)
    env = dict(os.environ)  # the moto fixture put its endpoint and keys there

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*RUNWATCH, *args], capture_output=True, text=True, timeout=180, env=env)

    ack = cli("ack", "--root", root, "--run", "acked", "--kind", "nan", "--by", "ana", "--note", "on it")
    assert ack.returncode == 0, ack.stderr
    assert cli("silence", "--root", root, "--run", "muted", "--for", "1h", "--by", "bo").returncode == 0
    check = cli("check", "--root", root, "--run", "acked")
    assert check.returncode == 1 and "acknowledged by ana" in check.stdout, check.stdout + check.stderr
    hook = Webhook().start()
    try:
        once = cli("watch", "--root", root, "--once", "--notify", hook.url, "--state", str(tmp_path / "state.json"))
        assert once.returncode == 1, once.stderr
        assert nan_titles(hook) == []
    finally:
        hook.stop()
