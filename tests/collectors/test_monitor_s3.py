"""``Monitor`` on an object-store root: shipped through a real S3 server stopped and restarted mid-run.

Real tiny-GPT training on CPU, moto's S3 server in this process (stopped and
started on the same port: an outage). Nothing the writer wrote is lost or
written twice, events always arrive, the training loop never waits on the
network, and a spool that outgrows its bound drops the oldest metrics parts
and counts them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

from runwatch.app.tinygpt import TinyGPT, TinyGPTConfig, synthetic_batches, train_step
from runwatch.collectors.monitor import Monitor, MonitorConfig
from runwatch.collectors.uploader import UploaderConfig
from runwatch.data.objstore import ObjectRoot
from runwatch.data.store import Store
from tests.s3server import MotoS3

FAST = UploaderConfig(retry_initial_seconds=0.1, retry_max_seconds=0.5, poll_seconds=0.1)
SCRIPT = Path(__file__).with_name("train_script.py")


class Trainer:
    """A tiny GPT and its optimizer; ``train(mon, steps)`` runs real steps and returns the slowest Monitor call."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.cfg = TinyGPTConfig(d_model=16, num_layers=1)
        self.model = TinyGPT(self.cfg)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.batches = synthetic_batches(self.cfg, batch_size=2)

    def train(self, mon: Monitor, steps: range) -> float:
        slowest = 0.0
        for step in steps:
            loss, grad_norm = train_step(self.model, self.opt, next(self.batches))
            t0 = time.perf_counter()
            mon.step(step, loss=loss, grad_norm=grad_norm, lr=1e-3, tokens=(step + 1) * 64)
            slowest = max(slowest, time.perf_counter() - t0)
        return slowest


def _wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def _spooled_parts(spool: Path) -> list[Path]:
    return sorted(p for p in spool.rglob("*") if p.name.startswith(("metrics-", "events-")))


def test_shipping_survives_a_server_stop_and_restart(tmp_path: Path, moto_s3: MotoS3, s3_root: str) -> None:
    trainer, spool = Trainer(), tmp_path / "spool"
    mon = Monitor(s3_root, "gpt", model=trainer.model, spool=spool, upload=FAST,
                  config=MonitorConfig(flush_every_steps=10, flush_every_seconds=3600))
    trainer.train(mon, range(60))
    _wait(lambda: mon.num_uploaded_parts >= 1 and not _spooled_parts(spool))
    moto_s3.stop()
    try:
        shipped = mon.num_uploaded_parts
        slowest = trainer.train(mon, range(60, 120))
        mon.checkpoint(119, "ck/119.pt")
        _wait(lambda: len(_spooled_parts(spool)) >= 2)  # the writer keeps writing into the spool
        time.sleep(1.0)  # several failed tries with back-off
        assert mon.num_uploaded_parts == shipped
        assert slowest < 0.5, f"a Monitor call took {slowest:.3f} s during the outage: it waited on the network"
    finally:
        moto_s3.start()
    trainer.train(mon, range(120, 180))
    mon.close()
    assert mon.num_dropped_rows == 0 and mon.num_errors == 0
    uploader = mon._uploader
    assert _spooled_parts(spool) == [], f"{uploader.num_failures} failed tries, last: {uploader.last_error}"
    with Store(s3_root) as store:
        steps = store.rows("gpt", rank=None)["step"].to_pylist()
        events = store.events("gpt").to_pylist()
        meta = store.meta("gpt")
    assert sorted(steps) == list(range(180)), "nothing lost, nothing twice"
    assert [(e["event"], e["step"]) for e in events] == [("checkpoint", 119)]
    assert meta["finished"] is True
    keys = ObjectRoot(s3_root).listing()
    assert not [k for k in keys if k.endswith("_writer.json")], "the claim ends with the Monitor"


def test_a_full_spool_drops_the_oldest_metrics_parts_and_never_events(tmp_path: Path, moto_s3: MotoS3,
                                                                      s3_root: str) -> None:
    ObjectRoot(s3_root, create=True)
    trainer, spool = Trainer(), tmp_path / "spool"
    moto_s3.stop()
    try:
        mon = Monitor(s3_root, "full", model=trainer.model, spool=spool,
                      upload=UploaderConfig(max_spool_bytes=12_000, retry_initial_seconds=0.1,
                                            retry_max_seconds=0.3, poll_seconds=0.1),
                      config=MonitorConfig(flush_every_steps=5, flush_every_seconds=3600))
        for block in range(10):
            trainer.train(mon, range(block * 10, block * 10 + 10))
            mon.checkpoint(block * 10 + 9, f"ck/{block}.pt")
            mon.flush()
            time.sleep(0.1)
        _wait(lambda: mon.num_dropped_parts > 0)
    finally:
        moto_s3.start()
    mon.close()
    with Store(s3_root) as store:
        steps = store.rows("full", rank=None)["step"].to_pylist()
        events = store.events("full").to_pylist()
    assert [e["step"] for e in events] == [b * 10 + 9 for b in range(10)], "events are never dropped"
    assert len(steps) == len(set(steps)) == 100 - mon.num_dropped_rows > 0
    assert steps == sorted(steps) and steps[-1] == 99, "the oldest parts went, the newest stayed"


def test_a_killed_trainers_spool_is_shipped_by_the_next_monitor(tmp_path: Path, moto_s3: MotoS3,
                                                                  s3_root: str) -> None:
    ObjectRoot(s3_root, create=True)
    spool = tmp_path / "spool"
    moto_s3.stop()
    try:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "--root", s3_root, "--name", "k", "--steps", "200",
                                 "--flush-every", "5", "--sleep", "0.02", "--spool", str(spool)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            if line.strip() == "step 60":
                break
        time.sleep(0.3)
        proc.kill()
        proc.wait(timeout=30)
        written = sorted(s for p in _spooled_parts(spool) if p.suffix == ".parquet"
                         for s in pq.read_table(p, columns=["step"])["step"].to_pylist())
        assert len(written) >= 50 and written == list(range(len(written)))
    finally:
        moto_s3.start()
    mon = Monitor(s3_root, "k", spool=spool, upload=FAST)  # a restart of the same job, same spool
    mon.step(1000, loss=1.0)
    mon.close()
    assert _spooled_parts(spool) == []
    with Store(s3_root) as store:
        rows = store.rows("k", rank=None).to_pylist()
    assert sorted(r["step"] for r in rows if r["segment"] == 0) == written, "the killed run's parts, once each"
    assert [r["step"] for r in rows if r["segment"] == 1] == [1000]


def test_a_part_written_during_the_last_upload_pass_is_shipped_at_close(tmp_path: Path, monkeypatch,
                                                                         moto_s3: MotoS3, s3_root: str) -> None:
    """Every upload pass is slow (0.5 s after it lists the spool), so close() lands while one is running: the
    writer's last part arrives after that pass listed the spool. The uploader must make one more pass once it
    knows the writer is done. Fails on the commit before this test (the last part stayed in the spool, no
    error; seen as a flaky browser test on a loaded machine)."""
    from runwatch.collectors.uploader import Uploader

    ship = Uploader._ship_all

    def slow_pass(self: Uploader) -> None:
        ship(self)
        time.sleep(0.5)

    monkeypatch.setattr(Uploader, "_ship_all", slow_pass)
    trainer, spool = Trainer(), tmp_path / "spool"
    mon = Monitor(s3_root, "slow", model=trainer.model, spool=spool,
                  upload=UploaderConfig(retry_initial_seconds=0.1, retry_max_seconds=0.5, poll_seconds=0.01),
                  config=MonitorConfig(flush_every_steps=10, flush_every_seconds=3600))
    trainer.train(mon, range(25))  # two parts flushed during training, the last 5 rows at close
    mon.close()
    assert not _spooled_parts(spool) and mon.num_uploaded_parts >= 3
    with Store(s3_root) as store:
        assert store.rows("slow")["step"].to_pylist() == list(range(25))
