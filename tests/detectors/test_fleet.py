"""The fleet detectors on synthetic ranks: straggler, rank disagreement, per-rank NaN and stalls; live == offline.

The 2-rank torchrun jobs (tests/collectors/test_fleet_torchrun.py) are the real thing; these tables pin the
rules (who is named, when nothing is) on shapes a real job rarely hits: three or more ranks, a dead heartbeat,
a NaN on one rank's shard.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from runwatch.detectors.analysis import analyze
from runwatch.detectors.config import DetectorConfig, StallConfig
from runwatch.detectors.fleet_analysis import FleetStreamingAnalyzer, analyze_fleet
from runwatch.detectors.rank_disagreement import odd_ones_out
from tests.detectors.synth import events_table, grad_curve, loss_curve

T0 = 1.7e9
STEP_S = 0.1


def fleet_rows(num_ranks: int = 2, n: int = 600, *, slow: dict[int, tuple[int, float]] | None = None,
               seed: int = 0, pause: tuple[int, int, float] | None = None, grad_shift: dict | None = None,
               nan_at: dict[int, int] | None = None, segment: int = 0,
               burst: tuple[int, int, int, float] | None = None) -> pa.Table:
    """Rows of ``num_ranks`` synchronous ranks like ``Store.rows(run, rank=None)``.

    ``slow``: rank -> (from step, extra forward seconds); ``pause``: (rank, before step, seconds) of input
    wait; ``grad_shift``: rank -> (from step, factor); ``nan_at``: rank -> step with a NaN loss; ``burst``:
    (rank, from step, to step, extra forward seconds), a neighbour's burst on that rank's host.
    """
    rng = np.random.default_rng(seed)
    steps = np.arange(n)
    fwd = rng.lognormal(np.log(0.03), 0.05, (n, num_ranks))
    data = rng.lognormal(np.log(0.002), 0.2, (n, num_ranks))
    for r, (start, extra) in (slow or {}).items():
        fwd[start:, r] += extra
    if burst is not None:
        r, lo, hi, extra = burst
        fwd[lo:hi, r] += extra
    if pause is not None:
        r, at, seconds = pause
        data[at, r] += seconds
    pre = fwd + data
    # Synchronous: every step lasts as long as the slowest rank's part before the collective plus the rest.
    per_step = pre.max(axis=1) + rng.lognormal(np.log(STEP_S - 0.032), 0.05, n)
    times = T0 + np.cumsum(per_step)
    grad = grad_curve(n, seed=seed + 1)
    tables = []
    for r in range(num_ranks):
        loss = loss_curve(n, seed=seed + 10 + r)
        g = grad.copy()
        if grad_shift and r in grad_shift:
            start, factor = grad_shift[r]
            g[start:] *= factor
        if nan_at and r in nan_at:
            loss[nan_at[r]] = np.nan
        tables.append(pa.table({"step": steps, "time": times, "loss": loss, "grad_norm": g,
                                "forward_time": fwd[:, r], "data_time": data[:, r],
                                "segment": pa.array(np.full(n, segment, np.int32)),
                                "rank": pa.array(np.full(n, r, np.int32)), "main": np.ones(n, bool)}))
    return pa.concat_tables(tables)


def meta_for(num_ranks: int, replicated: bool = False) -> dict:
    return {"host": "node-a", "replicated_grads": replicated,
            "hosts": {"0": {str(r): f"node-{'ab'[r % 2]}{r}" for r in range(num_ranks)}}}


def kinds(report, kind: str) -> list:
    return [f for f in report.findings if f.kind == kind]


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_a_slow_rank_is_the_straggler_named_with_its_host(num_ranks: int) -> None:
    rows = fleet_rows(num_ranks, slow={1: (200, 0.02)})
    report = analyze_fleet(rows, meta=meta_for(num_ranks))
    found = kinds(report, "straggler")
    assert [(f.rank, f.host) for f in found] == [(1, "node-b1")]
    f = found[0]
    assert 192 <= f.onset_step <= 232 and f.evidence["section"] == "forward"
    assert f.evidence["cost"] == pytest.approx(0.02 / 0.12, rel=0.25) and f.severity == "warning"
    # The anchor (nvidia-resiliency-ext's score < 0.75) also calls a 60% slower forward pass a straggler.
    assert f.evidence["anchor_flags"] and f.evidence["score"] < 0.75
    assert f.to_dict()["rank"] == 1 and f.to_dict()["host"] == "node-b1"


def test_a_small_straggler_the_anchor_misses_is_found() -> None:
    """8% of the step lost (BLOOM lost 5%): nvidia-resiliency-ext's 0.75 score threshold does not see it."""
    rows = fleet_rows(2, slow={0: (100, 0.008)}, n=800)
    found = kinds(analyze_fleet(rows, meta=meta_for(2)), "straggler")
    assert [f.rank for f in found] == [0]
    assert found[0].severity == "info" and not found[0].evidence["anchor_flags"]


def test_a_block_in_which_the_others_were_slowed_too_does_not_move_the_onset() -> None:
    """A CI run on a loaded 2-core machine dated a straggler from step 100 at step 192: in one block a
    neighbour's burst slowed the other rank as much, so that block was not slow, and only the run of slow blocks
    after it counted. The stretch goes on through fewer than ``recovery_blocks`` normal blocks, as an episode
    does."""
    rows = fleet_rows(2, slow={1: (192, 0.02)}, burst=(0, 256, 288, 0.02), n=800)
    found = kinds(analyze_fleet(rows, meta=meta_for(2)), "straggler")
    assert [(f.rank, f.onset_step) for f in found] == [(1, 192)]
    assert found[0].evidence["detected_step"] == 383  # opened by three slow blocks in a row, as before


@pytest.mark.parametrize("seed", range(6))
def test_healthy_ranks_raise_no_fleet_finding(seed: int) -> None:
    rows = fleet_rows(3, seed=seed, n=1200)
    report = analyze_fleet(rows, meta=meta_for(3, replicated=True))
    assert not kinds(report, "straggler") and not kinds(report, "rank_disagreement")


def test_the_odd_replica_is_the_suspect_when_a_majority_agrees() -> None:
    rows = fleet_rows(3, grad_shift={2: (300, 1.0 + 1e-3)})
    found = kinds(analyze_fleet(rows, meta=meta_for(3, replicated=True)), "rank_disagreement")
    assert [(f.rank, f.onset_step, f.needs_action, f.evidence["majority"]) for f in found] == [(2, 300, True, True)]
    assert found[0].evidence["num_disagreements"] == 300
    assert analyze_fleet(rows, meta=meta_for(3)).health == "healthy"  # not replicated (FSDP, ZeRO): not judged


def test_two_replicas_that_disagree_are_both_named() -> None:
    rows = fleet_rows(2, grad_shift={1: (250, 1.01)})
    report = analyze_fleet(rows, meta=meta_for(2, replicated=True))
    found = kinds(report, "rank_disagreement")
    assert [(f.rank, f.evidence["majority"]) for f in found] == [(0, False), (1, False)]
    assert report.health == "action needed" and "no majority" in found[0].message


def test_a_disagreeing_replica_is_rolled_back_without_its_device_and_skips_no_batches() -> None:
    """A review's advice for a replica off by 0.1% was "restart ... and skip batches 0-199": every replica read
    the same batches, one device computed them wrong. The advice names the suspect device and skips nothing."""
    rows = fleet_rows(3, grad_shift={2: (300, 1.0 + 1e-3)})
    events = events_table([{"event": "checkpoint", "step": s, "payload": {"path": f"ck/{s}.pt"}}
                           for s in (100, 200, 290)])
    rb = analyze_fleet(rows, events, meta=meta_for(3, replicated=True)).rollback
    assert rb is not None and rb.checkpoint_step == 290 and rb.skip_batches is None, rb
    assert "without the suspect device (rank 2 on node-a2)" in rb.actions[0] and "skip none" in rb.actions[0]
    assert rb.evidence["resume_hint"] == "--resume ck/290.pt"


def test_rounding_differences_are_not_disagreement() -> None:
    rows = fleet_rows(2, grad_shift={1: (0, 1.0 + 3e-6)})
    assert not kinds(analyze_fleet(rows, meta=meta_for(2, replicated=True)), "rank_disagreement")


@pytest.mark.parametrize(("values", "odd", "majority"), [
    ([1.0, 1.0, 1.0], [], True),
    ([1.0, 1.0, 2.0], [2], True),
    ([1.0, 2.0], [0, 1], False),
    ([np.nan, 1.0, 1.0], [0], True),
    ([np.inf, np.inf, np.inf], [], True),
    ([1.0, 2.0, 3.0, 1.0], [0, 1, 2, 3], False),
    ([5.0, 5.0 * (1 + 1e-6), 5.0], [], True),
])
def test_odd_ones_out(values: list[float], odd: list[int], majority: bool) -> None:
    assert odd_ones_out(np.array(values), 1e-4) == (odd, majority)


def test_a_nan_on_one_rank_alone_names_that_rank() -> None:
    rows = fleet_rows(4, nan_at={3: 400})
    report = analyze_fleet(rows, meta=meta_for(4))
    nans = kinds(report, "nan")
    assert [(f.rank, f.host, f.onset_step) for f in nans] == [(3, "node-b3", 400)]
    # Rank 0 alone (what every judgement read before) sees nothing.
    assert not kinds(analyze(rows.filter(pa.compute.equal(rows["rank"], 0))), "nan")


def test_an_incident_on_every_rank_is_one_finding_about_the_run() -> None:
    rows = fleet_rows(2, nan_at={0: 400, 1: 400})
    nans = kinds(analyze_fleet(rows, meta=meta_for(2)), "nan")
    assert [(f.rank, f.host) for f in nans] == [(None, None)]


def test_a_single_rank_run_is_judged_as_before() -> None:
    rows = fleet_rows(1, nan_at={0: 300}, slow={0: (100, 0.05)})
    offline = analyze(rows)
    fleet = analyze_fleet(rows)
    assert fleet.findings == offline.findings and fleet.rollback == offline.rollback
    assert all(f.rank is None for f in fleet.findings)


def test_a_finished_pause_names_the_rank_that_held_the_others() -> None:
    rows = fleet_rows(2, pause=(1, 300, 45.0))
    stalls = kinds(analyze_fleet(rows, meta=meta_for(2)), "stall")
    assert [(f.rank, f.onset_step, f.end_step) for f in stalls] == [(1, 299, 300)]
    assert "rank 1 held the others up" in stalls[0].message
    assert stalls[0].evidence["pre_collective_s"]["1"] > 45


def test_an_evaluation_with_its_duration_is_not_a_stall() -> None:
    rows = fleet_rows(1, pause=(0, 300, 45.0))
    rows = rows.drop_columns(["data_time"])  # the pause shows only in wall time
    ev = events_table([{"event": "note", "step": 299, "payload": {"kind": "eval", "seconds": 45.5}}])
    assert kinds(analyze_fleet(rows), "stall")
    assert not kinds(analyze_fleet(rows, ev), "stall")


def _live(rows: pa.Table, num_ranks: int, heartbeats: dict, now: float, cfg: DetectorConfig) -> list:
    return kinds(analyze_fleet(rows, now=now, meta=meta_for(num_ranks), config=cfg, heartbeats=heartbeats), "stall")


LIVE = DetectorConfig(stall=StallConfig(live_min_seconds=5.0))


def _rank_1_behind(beat_after: float, others_after: float) -> tuple[pa.Table, float, dict]:
    """Three ranks at step 399: rank 1 recorded it, ranks 0 and 2 went on into the next forward pass and finished
    it ``others_after`` seconds later (then wait in the collective); every heartbeat written ``beat_after`` s on."""
    rows = fleet_rows(3, n=400)
    last = float(rows["time"].to_numpy().max())
    beat = {"time": last + beat_after, "every_s": 10.0, "step": 399}
    ahead = {**beat, "phase": "backward", "phase_time": last + others_after}
    return rows, last, {(0, 0): ahead, (0, 1): {**beat, "phase": "step", "phase_time": last}, (0, 2): ahead}


def test_live_hang_names_the_rank_behind_and_the_ranks_waiting_for_it() -> None:
    rows, last, heartbeats = _rank_1_behind(29.0, 0.04)
    found = _live(rows, 3, heartbeats, last + 30.0, LIVE)
    assert [(f.rank, f.host, f.evidence["waiting_ranks"]) for f in found] == [(1, "node-b1", [0, 2])]
    assert found[0].needs_action and found[0].severity == "critical" and "wait for it" in found[0].message
    assert not _live(rows, 3, heartbeats, last + 3.0, LIVE)  # inside the rule's wait: nothing yet


def test_ranks_stopped_just_after_the_holder_wait_for_it_before_they_pass_the_live_floor() -> None:
    """The waiting ranks' last sign of progress (the forward pass they finished) comes after the holder's, so
    there is a window where only the holder is past the live floor. The others are not progressing in it: they
    stopped by their own rhythm (10 steps' wait), and they wait for the holder (a CI run caught that window
    and named rank 1 with nobody waiting)."""
    rows, last, heartbeats = _rank_1_behind(6.0, 1.5)
    found = _live(rows, 3, heartbeats, last + 6.0, LIVE)  # rank 1 silent 6 s (> 5), ranks 0 and 2 4.5 s
    assert [(f.rank, f.evidence["waiting_ranks"]) for f in found] == [(1, [0, 2])]
    assert "rank(s) 0, 2 wait for it" in found[0].message


def test_live_hang_names_the_rank_whose_heartbeat_stopped() -> None:
    rows = fleet_rows(2, n=400)
    last = float(rows["time"].to_numpy().max())
    base = {"every_s": 2.0, "step": 399, "phase": "backward", "phase_time": last + 0.04}
    heartbeats = {(0, 0): {**base, "time": last + 39.0}, (0, 1): {**base, "time": last + 1.0}}
    found = _live(rows, 2, heartbeats, last + 40.0, LIVE)
    assert [(f.rank, f.evidence["not_responding"]) for f in found] == [(1, True)]
    assert "process not responding" in found[0].message


def test_live_hang_with_nothing_to_tell_ranks_apart_is_about_the_run() -> None:
    rows = fleet_rows(2, n=400)
    last = float(rows["time"].to_numpy().max())
    found = _live(rows, 2, {}, last + 40.0, LIVE)
    assert [(f.rank, f.evidence["live"]) for f in found] == [(None, True)]
    report = analyze_fleet(rows, now=last + 40.0, meta=meta_for(2), config=LIVE)
    assert report.health == "stalled"


def test_live_rule_waits_out_the_longest_checkpoint_write() -> None:
    rows = fleet_rows(1, n=400)
    last = float(rows["time"].to_numpy().max())
    ev = events_table([{"event": "checkpoint", "step": 100, "payload": {"path": "c", "write_seconds": 120.0}}])
    cfg = DetectorConfig()
    assert kinds(analyze_fleet(rows, now=last + 400, config=cfg), "stall")  # > 300 s and 10x the step
    assert not kinds(analyze_fleet(rows, ev, now=last + 400, config=cfg), "stall")  # a save may be running
    assert kinds(analyze_fleet(rows, ev, now=last + 430, config=cfg), "stall")


def _stream(rows: pa.Table, meta: dict, chunks: int, seed: int) -> FleetStreamingAnalyzer:
    rng = np.random.default_rng(seed)
    fsa = FleetStreamingAnalyzer(meta=meta)
    ranks = rows["rank"].to_numpy()
    per_rank = {int(r): rows.filter(pa.array(ranks == r)).drop_columns(["rank", "segment", "main"])
                for r in np.unique(ranks)}
    cuts = {r: np.sort(rng.choice(np.arange(1, t.num_rows), chunks, replace=False)) for r, t in per_rank.items()}
    pieces = []
    for r, t in per_rank.items():
        bounds = [0, *cuts[r].tolist(), t.num_rows]
        pieces += [(r, t.slice(a, b - a)) for a, b in zip(bounds, bounds[1:])]
    order = rng.permutation(len(pieces))
    # Each rank's flushes in order, the ranks interleaved at random (as files land from several processes).
    next_of = {r: 0 for r in per_rank}
    queues = {r: [p for q, p in pieces if q == r] for r in per_rank}
    for i in order:
        r = pieces[i][0]
        fsa.update_table(r, 0, queues[r][next_of[r]])
        next_of[r] += 1
        fsa.report()  # reports in between must not change the end result
    return fsa


@pytest.mark.parametrize("seed", range(3))
def test_streaming_equals_offline_across_ranks(seed: int) -> None:
    rows = fleet_rows(3, n=700, slow={2: (150, 0.03)}, grad_shift={1: (400, 1.01)}, nan_at={0: 500},
                      pause=(1, 600, 30.0), seed=seed)
    meta = meta_for(3, replicated=True)
    offline = analyze_fleet(rows, meta=meta)
    live = _stream(rows, meta, chunks=12, seed=seed).report()
    assert {f.kind for f in offline.findings} >= {"straggler", "rank_disagreement", "nan", "stall"}
    assert live.findings == offline.findings
    assert live.rollback == offline.rollback and live.health == offline.health


def test_check_json_carries_rank_and_host(tmp_path) -> None:
    from runwatch.app.check import run_check
    from runwatch.data.storage import StagedWrite

    rows = fleet_rows(2, nan_at={1: 300})
    with StagedWrite(tmp_path) as staged:
        for r in (0, 1):
            part = rows.filter(pa.compute.equal(rows["rank"], r)).drop_columns(["rank", "segment", "main"])
            staged.add_metrics("fleet", 0, r, part)
        staged.add_run_meta("fleet", {**meta_for(2), "source": "test", "finished": True})
    out = run_check(tmp_path, "fleet").to_dict("fleet")
    nan = [f for f in out["findings"] if f["kind"] == "nan"]
    assert [(f["rank"], f["host"]) for f in nan] == [(1, "node-b1")]
    assert all("rank" in f and "host" in f for f in out["findings"])
    json.dumps(out, allow_nan=False)
