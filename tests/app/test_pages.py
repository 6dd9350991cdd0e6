"""Every page through Streamlit's AppTest over a real store written by Monitor (the shortened demo)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from runwatch.app.state import ROOT_ENV
from runwatch.data.record import metrics_table
from runwatch.data.storage import StagedWrite
from tests.app.conftest import shown, spike_lines, write_jsonl_run

ENTRY = Path(__file__).resolve().parents[2] / "app" / "dashboard.py"


def open_page(monkeypatch: pytest.MonkeyPatch, root: Path, page: str, **query: str) -> AppTest:
    monkeypatch.setenv(ROOT_ENV, str(root))
    at = AppTest.from_file(str(ENTRY), default_timeout=180)
    for key, value in query.items():
        at.query_params[key] = value
    at.switch_page(f"screens/{page}.py")
    return at.run()


def no_errors(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def markdown(at: AppTest) -> str:
    return shown("\n".join(m.value for m in at.markdown))


def test_overview_lists_runs_with_health(monkeypatch: pytest.MonkeyPatch, demo_root: Path) -> None:
    at = open_page(monkeypatch, demo_root, "overview")
    no_errors(at)
    table = at.dataframe(key="overview_table").value
    assert {"demo-diverged", "demo-rollback"} <= set(table["run"])  # the browser test adds a live run
    health = dict(zip(table["run"], (h[0] for h in table["health"])))  # a one-item label list per run
    assert health["demo-diverged"] in ("action needed", "stalled")  # an unrecovered loss, then the trainer stopped
    what = dict(zip(table["run"], table["what"]))
    assert "divergence" in what["demo-diverged"]  # caught as such, whichever health the timing shows
    # Rolled back and finished: not stalled, no action needed. (Its step times are real wall time: on a loaded
    # machine a slowdown can be open at its end, which a finished run reads as "unresolved".)
    assert health["demo-rollback"] in ("healthy", "watching", "unresolved")
    assert table["run"].iloc[0] == "demo-diverged"  # worst first
    assert "action needed" in markdown(at) or "stalled" in markdown(at)


def chart_option(at: AppTest) -> dict:
    """The option of the page's (last drawn) ECharts chart, as the browser receives it."""
    return json.loads(at.get("echarts_chart")[-1].proto.spec)


def test_run_page_with_rollback_card(monkeypatch: pytest.MonkeyPatch, demo_root: Path) -> None:
    at = open_page(monkeypatch, demo_root, "run", run="demo-diverged")
    no_errors(at)
    text = markdown(at)
    assert "demo-diverged" in text and "Rollback advice" in text and "Roll back to checkpoint @ step" in text
    assert any("--resume " in c.value for c in at.code)
    assert at.radio(key="x").options == ["step", "tokens", "wall-clock"]
    assert "#### Open findings" in text and "needs action" in text  # open alarms first, in view, in full
    titles = [t["text"] for t in chart_option(at)["title"]]
    assert "learning rate" in titles and "loss scale (log)" in titles  # the LR jump that caused it is on screen
    advised = [m for s in chart_option(at)["series"] for m in s.get("markLine", {}).get("data", [])
               if m.get("name", "").startswith("roll back here")]
    assert advised  # the advised checkpoint is marked on the chart
    for x in ("tokens", "time"):
        at.radio(key="x").set_value(x).run()
        no_errors(at)
        assert chart_option(at)["xAxis"][0]["type"] == ("time" if x == "time" else "value")
    at.number_input(key="from").set_value(100).run()
    at.number_input(key="to").set_value(200).run()
    no_errors(at)
    [link] = [b.proto.url for b in at.get("link_button") if b.proto.label == "link to this view"]
    assert "from=100" in link and "to=200" in link and "run=demo-diverged" in link


def test_run_page_shows_segments_of_a_rollback(monkeypatch: pytest.MonkeyPatch, demo_root: Path) -> None:
    at = open_page(monkeypatch, demo_root, "run", run="demo-rollback")
    no_errors(at)
    assert not [d for d in at.dataframe if "abandoned from" in d.value.columns]  # made once the expander opens
    at.session_state["segments_open"] = True
    at.run()
    [segments] = [d.value for d in at.dataframe if "abandoned from" in d.value.columns]
    assert segments["segment"].tolist() == [0, 1] and segments["abandoned from"].iloc[0].startswith("step 121 ")
    assert all(str(t).endswith(" UTC") for t in segments["started"])  # readable times, not unix seconds
    assert "finished" in markdown(at)  # the rolled-back run recorded its own end


@pytest.mark.parametrize("name", ["../etc", "run=x/../../y", "a b", ".hidden"])
def test_run_page_refuses_names_that_leave_the_root(monkeypatch: pytest.MonkeyPatch, demo_root: Path, name: str) -> None:
    at = open_page(monkeypatch, demo_root, "run", run=name)
    assert not at.exception
    assert any("invalid run name" in shown(e.value) for e in at.error)


def test_unknown_run_is_an_error_naming_the_runs_and_the_url_stays(monkeypatch: pytest.MonkeyPatch,
                                                                   demo_root: Path) -> None:
    at = open_page(monkeypatch, demo_root, "run", run="no-such-run")
    assert not at.exception
    [error] = [shown(e.value) for e in at.error]
    assert "no run named 'no-such-run'" in error and "demo-diverged" in error and "demo-rollback" in error
    assert at.query_params["run"] in ("no-such-run", ["no-such-run"])  # never silently switched to another run
    assert not at.get("echarts_chart")


def test_last_step_is_the_main_lines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A rollback still catching up: the abandoned branch reached 500, the main line is at 399."""
    root = tmp_path / "root"
    root.mkdir()
    lines = spike_lines(501, spike_at=-1)
    lines.append({"event": "resume", "step": 300, "checkpoint": "ckpt/300.pt"})
    lines += [dict(line, time=line["time"] + 100) for line in spike_lines(400, spike_at=-1)[301:]]
    write_jsonl_run(root, "catching-up", lines)
    at = open_page(monkeypatch, root, "run", run="catching-up")
    no_errors(at)
    metric = next(m for m in at.metric if m.label == "last step (main line)")
    assert metric.value == "399"
    overview = open_page(monkeypatch, root, "overview")
    assert overview.dataframe(key="overview_table").value["last step"].tolist() == [399]


def test_compare_page(monkeypatch: pytest.MonkeyPatch, demo_root: Path) -> None:
    at = open_page(monkeypatch, demo_root, "compare")
    no_errors(at)
    assert {"demo-diverged", "demo-rollback"} <= set(at.multiselect(key="runs").value)
    colors = {s["name"]: s["lineStyle"]["color"] for s in chart_option(at)["series"] if s["type"] == "line" and s["data"]}
    bands = [a[0]["name"] for s in chart_option(at)["series"] for a in s.get("markArea", {}).get("data", [])]
    assert any(b.startswith("demo-diverged: divergence") for b in bands)  # each run's findings, in its colour
    at.multiselect(key="runs").set_value(["demo-rollback"]).run()
    no_errors(at)
    alone = {s["name"]: s["lineStyle"]["color"] for s in chart_option(at)["series"] if s["type"] == "line" and s["data"]}
    assert alone == {"demo-rollback": colors["demo-rollback"]}  # the same colour whatever else is selected


def _import(at: AppTest, path: str, run: str) -> AppTest:
    at.text_input(key="import_path").set_value(path)
    at.text_input(key="import_run").set_value(run)
    return at.button(key="import_button").click().run()


def test_import_page(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "archive").mkdir(parents=True)
    good = root / "archive" / "old.jsonl"
    good.write_text("\n".join(json.dumps(line) for line in spike_lines(50, spike_at=20)) + "\n")
    bad = root / "archive" / "bad.jsonl"
    bad.write_text('{"step": 0, "loss": 1.0}\n{"step": "one"}\n')
    (tmp_path / "outside.jsonl").write_text(good.read_text())
    at = open_page(monkeypatch, root, "import_log")
    no_errors(at)
    from runwatch.collectors.importers import FORMATS

    assert at.selectbox(key="import_format").options == ["auto", *FORMATS]
    at = _import(at, "archive/old.jsonl", "old-run")
    no_errors(at)
    assert any("Imported 50 rows" in shown(s.value) for s in at.success)
    assert (root / "run=old-run").is_dir()
    at = _import(at, "archive/bad.jsonl", "bad-run")
    assert any("bad.jsonl:2" in shown(e.value) for e in at.error)  # the parser's file:line, shown as is
    assert not (root / "run=bad-run").exists()
    cut = root / "archive" / "cut.log"  # a job killed mid-write: its last line cut short, mid-number
    cut.write_text("s:0 trl:11.0 lr:0.0001 norm:1.0\ns:1 trl:10.9 lr:0.0001 norm:1.0\ns:2 trl:1")
    at = _import(at, "archive/cut.log", "cut-run")
    no_errors(at)
    assert any("Imported 2 rows" in shown(s.value) for s in at.success)
    assert [shown(w.value) for w in at.warning] == [f"{cut}:3: the last line has no newline (a write cut short?); "
                                                    "not read"]
    at = _import(at, "../outside.jsonl", "escaped")
    assert any("outside the dashboard root" in shown(e.value) for e in at.error)
    at = _import(at, "archive/old.jsonl", "../evil")
    assert any("invalid run name" in shown(e.value) for e in at.error)
    assert not (tmp_path / "evil").exists() and not (tmp_path / "run=evil").exists()
    assert any(f"Imports into the dashboard's root: {root}" in shown(c.value) for c in at.caption)
    at = _import(at, "archive/old.jsonl", "old-run")  # exists: the error speaks of the page's fields, not flags
    [exists] = [shown(e.value) for e in at.error]
    assert "already exists" in exists and "run name" in exists and "replace the run if it exists" in exists
    assert "--" not in exists, exists


def test_live_update_reaches_the_overview(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    write_jsonl_run(root, "first", spike_lines(100, spike_at=-1))
    at = open_page(monkeypatch, root, "overview")
    assert at.dataframe(key="overview_table").value["run"].tolist() == ["first"]
    write_jsonl_run(root, "second", spike_lines(120, spike_at=-1))
    at.run()  # what the fragment's timer does every few seconds
    assert sorted(at.dataframe(key="overview_table").value["run"]) == ["first", "second"]


@pytest.mark.parametrize("page", ["overview", "run", "compare"])
def test_a_missing_or_empty_root_says_how_to_fill_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     page: str) -> None:
    for root in (tmp_path / "missing", tmp_path):
        at = open_page(monkeypatch, root, page)
        no_errors(at)
        [info] = [shown(i.value) for i in at.info]
        assert f"No runs under {root}" in info and "runwatch demo" in info and "Import" in info
        assert ("does not exist yet" in info) == (not root.exists())


def test_silent_run_turns_stalled_unless_it_said_it_finished(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    t0 = time.time() - 1800  # steps every 0.1 s, the last one about half an hour ago
    rows = metrics_table(spike_lines(200, spike_at=-1, t0=t0))
    with StagedWrite(root) as staged:  # what a live Monitor leaves behind when its trainer dies
        for run in ("died", "done"):
            staged.add_metrics(run, 0, 0, rows)
            staged.add_run_meta(run, {"precision": "float32"})
        staged.add_events("done", 0, 0, [{"event": "note", "step": 199, "time": t0 + 20, "status": "finished"}])
    write_jsonl_run(root, "archived", spike_lines(200, spike_at=-1, t0=t0))  # an import is history, not live
    at = open_page(monkeypatch, root, "overview")
    no_errors(at)
    table = at.dataframe(key="overview_table").value
    health = dict(zip(table["run"], (h[0] for h in table["health"])))  # a one-item label list per run
    assert health["died"] == "stalled"
    assert health["done"] in ("healthy", "watching") and health["archived"] in ("healthy", "watching")
