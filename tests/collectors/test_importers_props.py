"""Property tests: no input crashes a parser; it parses or raises a clear ValueError."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runwatch.collectors.importers import (
    auto,
    csv_log,
    deepspeed,
    fairseq_text,
    hf_trainer,
    jsonl,
    llmc,
    megatron,
    megatron_golden,
    metaseq,
    modded_nanogpt,
    nanogpt,
    stepcount,
    tensorboard,
    wandb,
)

# Fragments of real lines, so generated text reaches deep into each parser, mixed with junk.
FRAGMENTS = [
    "s:", "trl:", "tel:", "lr:", "norm:", "step:", "/100 ", "train_loss:", "val_loss:", "train_time:", "ms",
    "step_avg:", " iteration ", "[default7]:", " | ", "lm loss: ", "loss scale: ", "grad norm: ", "consumed samples: ",
    "elapsed time per iteration (ms): ", "validation loss at iteration ", "saving checkpoint at iteration ", " to /ck",
    "OVERFLOW! Rank 0 Skipping step. Attempted loss scale: ", ", reducing to ", "[2023-04-18 01:46:53,259] ",
    "[Rank 0] step=", ", skipped=", ", lr=[", "]", "| INFO | train_inner | ", '{"num_updates": ', '"loss": ', "}",
    "step,loss,found_inf\n", "_step,_timestamp,loss\n", '{"lm loss": {"values": {"1": ', '"nan"', "1", "12", "3.5",
    "nan", "inf", "-1e9", "1e400", "abc", ",", ":", "\n", "\t", " ", "é", "\x00", "brain.Event:2",
    "iter ", ": loss ", ", time ", "ms, mfu ", "%", "step 3: train loss ", ", val loss ", "saving checkpoint to out",
    "{'loss': ", "{'eval_loss': ", "'grad_norm': ", "tensor(", "'", "{'train_runtime': ", '"log_history": [',
    " samples/sec: ", "approx flops per GPU: ", "TFLOPS", "lm_loss: ", "validation results at iteration ",
    "| epoch 001", ":    100 / 377 ", "loss=", ", num_updates=", " | num_updates ", " | valid on 'valid' subset",
    "| WARNING: overflow detected, setting loss scale to: ", "2020-10-01 12:00:00 | INFO | train_inner | ", "\r",
    "Saved checkpoint c.pt (epoch 1 @ 5 updates)", "Loaded checkpoint c.pt (epoch 1 @ 5 updates)", "0%",
    # Line kinds read since issue 8: llm.c eval lines, timing-only modded-nanogpt lines, named/test validation
    # sets, DeepSpeed's other overflow spellings, tqdm bars, HF checkpoint and resume lines, nanoGPT resumes.
    "s:250 eval:", " tok:", "step:1/10 train_time:", "step_avg:", "validation-wiki loss at iteration ",
    " on validation set", " on test set", "OVERFLOW! Rank 3 Skipping step.", " Skipping step.",
    "[deepspeed] fp16 dynamic loss scale overflow! Skipping step. Attempted loss scale: ",
    "Overflow detected. Skipping step. Attempted loss scale: ", ", but hysteresis is 2",
    "  5%|▌         | ", "/200 [00:01<00:09,  1.50s/it]", "\x1b[A", "Saving model checkpoint to out/checkpoint-",
    "Continuing training from global step ", "Resuming training from out", "Saving model checkpoint: out/global_step",
]
MODULES = [llmc, modded_nanogpt, nanogpt, hf_trainer, megatron, megatron_golden, deepspeed, metaseq, fairseq_text,
           csv_log, wandb, tensorboard, jsonl]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8), st.binary(max_size=4)), max_size=40),
       skip=st.booleans())
def test_no_input_crashes_the_parser(module, parts: list[str | bytes], skip: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input.log"
        # Raw bytes too: invalid UTF-8 must give a clear error (or be skipped), never a crash.
        path.write_bytes(b"".join(p if isinstance(p, bytes) else p.encode("utf-8", errors="replace") for p in parts))
        try:
            parsed = module.parse([path], skip_bad_lines=skip)
        except ValueError as err:
            assert str(err)  # a clear message, never an empty one
            return
        assert parsed.metrics.schema.field("step").type == pa.int64()
        assert parsed.metrics["step"].null_count == 0


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=8)), max_size=60), skip=st.booleans())
def test_no_input_crashes_auto(parts: list[str], skip: bool) -> None:
    """Every sniffer, every reading, the join: a result in the record's schema or a clear ValueError."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "input.log"
        path.write_text("".join(parts), encoding="utf-8", errors="replace")
        try:
            name, parsed = auto.read([path], skip_bad_lines=skip)
        except ValueError as err:
            assert str(err)
            return
        assert name and parsed.metrics["step"].null_count == 0
        if parsed.positions is not None:
            assert len(parsed.positions) == parsed.metrics.num_rows
        if "segment" in parsed.metrics.column_names:
            assert parsed.metrics["segment"].null_count == 0


@settings(max_examples=100, deadline=None)
@given(gaps=st.lists(st.integers(1, 20), min_size=1, max_size=8),
       overflows=st.lists(st.tuples(st.floats(0.01, 0.99), st.integers(0, 7)), max_size=12),
       timed=st.booleans())
def test_overflows_land_between_their_counters(gaps: list[int], overflows: list[tuple[float, int]], timed: bool) -> None:
    """An overflow printed between counters a and b takes a step in (a, b], each after the one before it."""
    steps = np.cumsum(gaps)
    # Counter k at position k; with timestamps, one second per step.
    anchors = [(float(k), int(s), float(s) if timed else None) for k, s in enumerate(steps)]
    over = []
    for frac, gap in overflows:
        k = min(gap, len(steps) - 1)
        t = steps[k] + frac * (steps[k + 1] - steps[k]) if k + 1 < len(steps) else steps[k] + frac
        over.append((k + frac, float(t) if timed else None))
    over.sort()
    placed = deepspeed._overflow_steps(over, anchors)
    assert len(placed) == len(over)
    for (pos, _), step in zip(over, placed):
        k = int(pos)
        lo = steps[k]
        hi = steps[k + 1] if k + 1 < len(steps) else None
        room = (hi - lo) if hi is not None else None
        in_gap = [p for p, _ in over if int(p) == k]
        if room is None or len(in_gap) <= room:
            assert lo < step and (hi is None or step <= hi)
    for k in set(int(p) for p, _ in over):
        mine = [s for (p, _), s in zip(over, placed) if int(p) == k]
        assert mine == sorted(mine)


@settings(max_examples=100, deadline=None)
@given(counters=st.lists(st.tuples(st.floats(0, 100), st.integers(0, 1000)), max_size=20),
       lines=st.lists(st.floats(0, 100), max_size=20))
def test_a_dict_takes_a_counter_next_to_it(counters: list[tuple[float, int]], lines: list[float]) -> None:
    """A line's counter lies between its neighbouring lines, and no counter places two lines."""
    counters.sort()
    at = np.array(sorted(set(lines)))
    pos = np.array([p for p, _ in counters], dtype=float)
    steps = np.array([s for _, s in counters], dtype=np.int64)
    index = stepcount.counter_of_lines(pos, at)
    for i, k in enumerate(index):
        lo = at[i - 1] if i else -np.inf
        hi = at[i + 1] if i + 1 < len(at) else np.inf
        assert k == -1 or lo < pos[k] < hi
    used = index[index >= 0]
    assert len(set(used.tolist())) == len(used)
    got = stepcount.step_of_lines(pos, steps, at)
    assert [int(s) for s in got] == [int(steps[k]) if k >= 0 else -1 for k in index]


@settings(max_examples=50, deadline=None)
@given(steps=st.lists(st.integers(0, 10**6), min_size=1, max_size=30),
       losses=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none()), min_size=30, max_size=30))
def test_llmc_round_trip(steps: list[int], losses: list[float | None]) -> None:
    """What llm.c prints, the parser reads back: every step and loss, NaN as NaN."""
    lines = [f"s:{s} trl:{x!r}" if x is not None else f"s:{s} tel:1.0" for s, x in zip(steps, losses)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "a.log"
        path.write_text("\n".join(lines) + "\n")
        t = llmc.parse([path]).metrics
    got = [(r["step"], r["loss"]) for r in t.to_pylist() if r["loss"] is not None]
    want = [(s, x) for s, x in zip(steps, losses) if x is not None]
    assert len(got) == len(want)
    for (gs, gx), (ws, wx) in zip(got, want):
        assert gs == ws and (gx == wx or (gx != gx and wx != wx))
