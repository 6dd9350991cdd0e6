"""The JSONL import contract: round trip, segments, events, errors that name the line, nothing partial."""

from __future__ import annotations

import json
import math
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.collectors.importers import import_logs
from runwatch.collectors.importers.base import LogFormatError
from runwatch.collectors.importers.jsonl import parse
from runwatch.data.store import Store

finite_or_not = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none())


def _write(path, lines):
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=40, deadline=None)
@given(st.lists(st.fixed_dictionaries(
    {"loss": finite_or_not, "grad_norm": finite_or_not, "loss_scale": finite_or_not, "lr": finite_or_not},
    optional={"found_inf": st.booleans(), "tokens": st.integers(0, 2**40), "my_metric": st.floats()}), min_size=1, max_size=30))
def test_round_trip_keeps_every_value_including_nan_and_inf(tmp_path_factory, records):
    tmp = tmp_path_factory.mktemp("rt")
    lines = [{"step": i, **r} for i, r in enumerate(records)]
    _write(tmp / "in.jsonl", lines)
    import_logs("jsonl", [tmp / "in.jsonl"], tmp / "root", "r")
    with Store(tmp / "root") as store:
        got = store.rows("r").sort_by("step").to_pylist()
    assert len(got) == len(lines)
    for want, row in zip(lines, got):
        for key in ("loss", "grad_norm", "loss_scale", "lr", "found_inf", "tokens", "my_metric"):
            if key in want:
                assert _same(want[key], row[key]), (key, want[key], row[key])
            elif key in row:
                assert row[key] is None


def test_backward_step_and_resume_make_segments(tmp_path):
    lines = [{"step": s, "loss": 2.0} for s in range(0, 10)]
    lines += [{"event": "checkpoint", "step": 4, "path": "ckpt/4"}]
    lines += [{"step": s, "loss": 1.9} for s in range(5, 8)]  # goes back: new segment
    lines += [{"event": "resume", "step": 7, "checkpoint": "ckpt/7", "skip_batches": [8, 9]}]
    lines += [{"step": s, "loss": 1.8} for s in range(8, 12)]  # a resume line also starts one
    result = import_logs("jsonl", [_write(tmp_path / "a.jsonl", lines)], tmp_path / "root", "r")
    assert result.num_segments == 3
    with Store(tmp_path / "root") as store:
        segs = store.segments("r").to_pylist()
        events = store.events("r").to_pylist()
    assert [(s["first_step"], s["last_step"], s["abandoned_from"]) for s in segs] == [(0, 9, 5), (5, 7, None), (8, 11, None)]
    resume = next(e for e in events if e["event"] == "resume")
    assert resume["segment"] == 2 and json.loads(resume["payload"])["skip_batches"] == [8, 9]
    assert next(e for e in events if e["event"] == "checkpoint")["segment"] == 0


def test_explicit_segment_and_rank_are_kept(tmp_path):
    lines = [{"step": s, "loss": 1.0, "segment": s // 5, "rank": s % 2} for s in range(10)]
    import_logs("jsonl", [_write(tmp_path / "a.jsonl", lines)], tmp_path / "root", "r")
    with Store(tmp_path / "root") as store:
        assert store.ranks("r") == [0, 1]
        rows = store.rows("r", rank=None).to_pylist()
    assert {(r["step"], r["segment"], r["rank"]) for r in rows} == {(s, s // 5, s % 2) for s in range(10)}


@pytest.mark.parametrize("bad, expected", [
    ('{"step": 1, "loss": "high"}', "'loss' must be a number"),
    ('{"loss": 1.0}', "expected a metric line"),
    ('[1, 2]', "expected a JSON object"),
    ('{"step": 1.5}', "'step' must be an integer"),
    ('{"step": 1, "tokens": -3}', "'tokens' must be an integer >= 0"),
    ('{"step": 1E20}', "'step' must fit in 64 bits"),
    ('{"event": "boom", "step": 1}', "'event' must be one of"),
    ('{"event": "checkpoint"}', "needs a 'step'"),
    ('{"step": 1, "found_inf": "yes"}', "'found_inf' must be"),
    ('{"step": 2, "loss": 1.0', "expected one JSON object per line"),
    # json's own message ends in "at" for an open string: the column follows a colon, not a second "at"
    ('{"step": 2, "loss": "abc', r"\(Unterminated string starting at: column 21\)"),
])
def test_malformed_line_names_file_and_line_and_lands_nothing(tmp_path, bad, expected):
    path = _write(tmp_path / "in.jsonl", ['{"step": 0, "loss": 1.0}', "", bad, '{"step": 3, "loss": 1.0}'])
    with pytest.raises(LogFormatError, match=expected) as info:
        import_logs("jsonl", [path], tmp_path / "root", "r")
    assert str(info.value).startswith(f"{path}:3: ")
    assert not (tmp_path / "root").exists() or not any((tmp_path / "root").rglob("*.*"))


def test_skip_bad_lines_continues_and_counts(tmp_path):
    path = _write(tmp_path / "in.jsonl", ['{"step": 0, "loss": 1.0}', "garbage", '{"step": 1, "loss": "x"}', '{"step": 2, "loss": 0.5}'])
    result = import_logs("jsonl", [path], tmp_path / "root", "r", skip_bad_lines=True)
    assert (result.num_rows, result.num_skipped) == (2, 2)


def test_existing_run_is_not_overwritten_without_replace(tmp_path):
    path = _write(tmp_path / "in.jsonl", ['{"step": 0, "loss": 1.0}'])
    import_logs("jsonl", [path], tmp_path / "root", "r")
    with pytest.raises(ValueError, match="already exists"):
        import_logs("jsonl", [path], tmp_path / "root", "r")
    _write(path, ['{"step": 0, "loss": 7.0}', '{"step": 1, "loss": 6.0}'])
    import_logs("jsonl", [path], tmp_path / "root", "r", replace=True)
    with Store(tmp_path / "root") as store:
        assert store.rows("r")["loss"].to_pylist() == [7.0, 6.0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.text(alphabet=string.printable, max_size=40),
    st.builds(json.dumps, st.dictionaries(st.sampled_from(["step", "loss", "event", "segment", "rank", "tokens", "x"]),
                                          st.one_of(st.integers(-5, 5), st.floats(), st.text(max_size=5), st.none(),
                                                    st.lists(st.integers(), max_size=3)), max_size=4)),
), max_size=8))
def test_parser_never_crashes_on_any_input(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("fuzz") / "in.jsonl"
    path.write_text("\n".join(lines))
    try:
        parse([path])
    except LogFormatError as err:
        assert str(err).startswith(str(path))


def test_a_bad_byte_is_reported_with_its_line_and_can_be_skipped(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"step": 0, "loss": 1.0}\n\xff\xfe\n{"step": 1, "loss": 0.9}\n')
    with pytest.raises(LogFormatError, match=r"in\.jsonl:2: .*utf-8"):
        import_logs("jsonl", [path], tmp_path / "root", "r")
    result = import_logs("jsonl", [path], tmp_path / "root", "r", skip_bad_lines=True)
    assert (result.num_rows, result.num_skipped) == (2, 1)


def test_rank_is_optional_per_line(tmp_path):
    path = _write(tmp_path / "in.jsonl", [{"step": 1, "loss": 1.0, "rank": 1}, {"step": 1, "loss": 2.0}])
    import_logs("jsonl", [path], tmp_path / "root", "r")
    with Store(tmp_path / "root") as store:
        assert store.ranks("r") == [0, 1]


def test_mixed_segment_lines_name_the_offending_line(tmp_path):
    path = _write(tmp_path / "in.jsonl", [{"step": 1, "segment": 0}, {"step": 2, "segment": 0}, {"step": 3}])
    with pytest.raises(LogFormatError, match=r"in\.jsonl:3: either every metric line carries 'segment'"):
        import_logs("jsonl", [path], tmp_path / "root", "r")


def test_events_without_metrics_are_refused(tmp_path):
    path = _write(tmp_path / "in.jsonl", [{"event": "resume", "step": 5}])
    with pytest.raises(ValueError, match="at least one metric line"):
        import_logs("jsonl", [path], tmp_path / "root", "r")
    assert not (tmp_path / "root").exists()
