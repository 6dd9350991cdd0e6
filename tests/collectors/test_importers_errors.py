"""Malformed lines, --skip-bad-lines, segments on restart, TensorBoard/W&B/CSV/fairseq and the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from runwatch.collectors.importers import (
    LogFormatError,
    csv_log,
    deepspeed,
    detect_format,
    import_logs,
    jsonl,
    llmc,
    megatron,
    megatron_golden,
    metaseq,
    modded_nanogpt,
    tensorboard,
    wandb,
)
from runwatch.data.store import Store
from tests.realruns import REALRUNS

MEG = (" iteration {step:8d}/    1000 | consumed samples: {s:12d} | elapsed time per iteration (ms): 1000.0 |"
       " learning rate: 1.000E-04 | global batch size:     4 | lm loss: {loss} | loss scale: 4096.0 |"
       " grad norm: 1.5 | number of skipped iterations:   0 | number of nan iterations:   0 |")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("module, text, line, expected", [
    (llmc, "s:0 trl:2.0 lr:0.1 norm:1.0\ns:1 trl:abc lr:0.1 norm:1.0\n", 2, "llm.c line"),
    (llmc, "s:0 trl:2.0\ns:1 xyz=3\n", 2, "llm.c line"),
    (llmc, "s:0 trl:2.0\ns:1 eval:\n", 2, "llm.c line"),
    (modded_nanogpt, "step:1/10 train_loss:2.0 train_time:10ms step_avg:nanms\nstep:2/10 train_loss:x1 train_time:20ms step_avg:10ms\n", 2, "modded-nanogpt line"),
    (megatron, "noise\n" + MEG.format(step=1, s=4, loss="2.0") + "\n iteration  abc/ 100 | lm loss: 1.0 |\n", 3, "iteration N/ M"),
    (megatron, MEG.format(step=1, s=4, loss="2.0") + "\n" + MEG.format(step=2, s=8, loss="2.0x") + "\n", 2, "key: number"),
    (metaseq, '2021-01-01 00:00:00 | INFO | train_inner | {"num_updates": "1", "loss": "2"}\n'
              '2021-01-01 00:00:01 | INFO | train_inner | {"num_updates": "2", "loss": \n', 2, "train_inner"),
    (deepspeed, "[2023-04-18 01:46:59,142] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[1e-05], mom=[]\n"
                "[2023-04-18 01:47:00,000] [INFO] [x] [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: abc\n", 2, "Attempted loss scale"),
    (csv_log, "step,loss\n1,2.0\n2,oops\n", 3, "number for 'loss'"),
    (megatron_golden, '{"lm loss": {"start_step": 1, "end_step": 2, "step_interval": 1,\n "values": {"1": 2.0, "2": [1]}}}\n', 1, "number or"),
])
def test_malformed_line_names_file_and_line(tmp_path: Path, module, text: str, line: int, expected: str) -> None:
    path = _write(tmp_path, "bad.log", text)
    with pytest.raises(LogFormatError) as err:
        module.parse([path])
    assert err.value.line == line and expected in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("module, text", [
    (llmc, "hello\nworld\n"), (modded_nanogpt, "hello\n"), (megatron, "hello\nsetting iteration to 3\n"),
    (deepspeed, "hello\n"), (metaseq, "hello\n"), (csv_log, "step,loss\n"),
])
def test_nothing_recognised_is_an_error(tmp_path: Path, module, text: str) -> None:
    with pytest.raises(LogFormatError, match="found|no data"):
        module.parse([_write(tmp_path, "x.log", text)])


def test_skip_bad_lines_counts(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.log", "s:0 trl:2.0\ns:1 trl:nope\ns:2 trl:1.5\ns:3 ???\n")
    parsed = llmc.parse([path], skip_bad_lines=True)
    assert parsed.num_skipped == 2 and parsed.metrics["step"].to_pylist() == [0, 2]
    text = "".join(line + "\n" for line in [MEG.format(step=1, s=4, loss="2.0"), MEG.format(step=2, s=8, loss="bad"),
                                             MEG.format(step=3, s=12, loss="1.9")])
    parsed = megatron.parse([_write(tmp_path, "m.log", text)], skip_bad_lines=True)
    assert parsed.num_skipped == 1 and parsed.metrics["step"].to_pylist() == [1, 3]


def test_restart_becomes_segments_in_store(tmp_path: Path) -> None:
    lines = [MEG.format(step=s, s=4 * s, loss="2.0") for s in (10, 20, 30)]
    lines += ["successfully loaded checkpoint from /ckpt at iteration 20"]
    lines += [MEG.format(step=s, s=4 * s, loss="1.9") for s in (30, 40)]
    path = _write(tmp_path, "restart.log", "\n".join(lines) + "\n")
    result = import_logs("auto", [path], tmp_path / "store", "r")
    assert result.num_segments == 2
    with Store(tmp_path / "store") as store:
        segs = store.segments("r").to_pylist()
        assert [(s["segment"], s["first_step"], s["last_step"]) for s in segs] == [(0, 10, 30), (1, 30, 40)]
        events = store.events("r").to_pylist()
        assert [(e["event"], e["step"], e["segment"]) for e in events] == [("resume", 20, 1)]


def test_llmc_step_backwards_is_a_new_segment(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.log", "s:0 trl:3\ns:1 trl:2.9\ns:2 trl:2.8\ns:1 trl:2.85\ns:2 trl:2.7\n")
    result = import_logs("llmc", [path], tmp_path / "store", "r")
    assert result.num_segments == 2 and result.num_rows == 5


def test_megatron_ranks_dedupe_and_split(tmp_path: Path) -> None:
    same = [f"[default{r}]:" + MEG.format(step=1, s=4, loss="2.0") for r in (0, 7)]
    parsed = megatron.parse([_write(tmp_path, "a.log", "\n".join(same) + "\n")])
    assert parsed.metrics.num_rows == 1 and "rank" not in parsed.metrics.column_names
    diff = [f"[default{r}]:" + MEG.format(step=1, s=4, loss=loss) for r, loss in ((0, "2.0"), (7, "2.5"))]
    parsed = megatron.parse([_write(tmp_path, "b.log", "\n".join(diff) + "\n")])
    assert parsed.metrics["rank"].to_pylist() == [0, 7]


def test_tensorboard_restart_kept_as_segment(tmp_path: Path) -> None:
    import torch
    from torch.utils.tensorboard import SummaryWriter

    torch.set_num_threads(1)
    logdir = tmp_path / "tb"
    writer = SummaryWriter(str(logdir))
    for step in range(6):
        writer.add_scalar("train/loss", 3.0 - 0.1 * step, step)
        writer.add_scalar("grad-norm", 1.0, step)
        writer.add_scalar("learning-rate", 1e-3, step)
    for step in range(3, 8):  # restarted from a checkpoint at step 3: TensorBoard would purge 3..5
        writer.add_scalar("train/loss", 2.0 - 0.1 * step, step)
    writer.add_scalar("val/loss", 2.5, 7)
    writer.close()
    (event_file,) = list(logdir.glob("events.out.tfevents.*"))
    assert detect_format(event_file) == "tensorboard"
    result = import_logs("tensorboard", [logdir], tmp_path / "store", "tb")
    assert result.num_segments == 2 and result.num_rows == 11
    with Store(tmp_path / "store") as store:
        rows = store.rows("tb").to_pylist()
    assert [r["step"] for r in rows if r["segment"] == 1] == [3, 4, 5, 6, 7]
    assert rows[0]["grad_norm"] == 1.0 and rows[-1]["val_loss"] == 2.5
    assert sum(not r["main"] for r in rows) == 3  # the abandoned branch 3..5 is kept


def test_tensorboard_corrupt_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "events.out.tfevents.1", "not an event file at all, just text\n")
    with pytest.raises(LogFormatError):
        tensorboard.parse([path])


def _writer(logdir: Path):
    import torch
    from torch.utils.tensorboard import SummaryWriter

    torch.set_num_threads(1)
    return SummaryWriter(str(logdir))


def test_a_tag_logged_again_at_its_step_is_the_same_row_and_lightnings_lr_is_the_lr(tmp_path: Path) -> None:
    """A review's Lightning run (``TensorBoardLogger`` + ``LearningRateMonitor``, LR x50 at 400-405) imported as
    607 segments, or one per validation: Lightning logs ``epoch`` again at each validation and ``lr-AdamW`` once per
    micro-batch, each repeat read as a restart, and the unrecovered spike filed under an abandoned branch: HEALTHY.
    ``lr-AdamW`` was an extra, so no LR cause was named. TensorBoard reads a repeat at one step as that step.
    Fails on 3ae9ad4. Guard: a step that goes back is still a restart (``test_tensorboard_restart_kept_as_segment``)."""
    from tests.detectors.synth import loss_curve

    logdir = tmp_path / "lightning_logs" / "version_0"
    writer = _writer(logdir)
    loss = loss_curve(300)
    loss[201:] += 3.0
    for step in range(300):
        lr = 1e-3 * (50 if 200 <= step < 205 else 1)
        for _ in range(2):  # accumulate_grad_batches=2: the monitor logs the LR per micro-batch
            writer.add_scalar("lr-AdamW", lr, step)
        writer.add_scalar("train/loss", float(loss[step]), step)
        writer.add_scalar("epoch", step // 100, step)
        if step % 50 == 49:
            writer.add_scalar("val/loss", 2.1, step)
            writer.add_scalar("epoch", step // 100, step)  # logged again at the validation
    writer.close()
    result = import_logs("auto", [tmp_path / "lightning_logs"], tmp_path / "store", "pl")
    assert result.num_segments == 1 and result.num_rows == 300, result
    with Store(tmp_path / "store") as store:
        rows = store.rows("pl").to_pylist()
    assert rows[204]["lr"] == pytest.approx(5e-2) and rows[49]["val_loss"] == pytest.approx(2.1)
    out = _cli("check", "--root", str(tmp_path / "store"), "--run", "pl")
    assert out.returncode == 1 and "LR rose x50" in out.stdout, out.stdout


def test_a_directory_of_several_tensorboard_runs_is_refused_and_an_hparams_record_is_no_run(tmp_path: Path) -> None:
    """Keras' ``train/`` and ``validation/`` (both log ``loss``) imported as one run whose main line turned into the
    validation points at step 19, and a logdir of three experiments as one run of six segments. TensorBoard's
    run is a directory: several are refused by name, nothing written. ``SummaryWriter.add_hparams`` writes a
    subdirectory of its own (sorted first, it was segment 0 and put the run's step 0 on an abandoned branch):
    that is the run's hyperparameter record, not a run. Fails on 3ae9ad4."""
    for sub in ("train", "validation"):
        writer = _writer(tmp_path / "keras" / sub)
        for step in range(20 if sub == "train" else 4):
            writer.add_scalar("loss", 2.0 - 0.01 * step, step * (1 if sub == "train" else 5))
        writer.close()
    out = _cli("import", "auto", str(tmp_path / "keras"), "--root", str(tmp_path / "store"), "--run", "k")
    assert out.returncode == 2 and "holds 2 TensorBoard runs (train, validation)" in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and not (tmp_path / "store" / "run=k").exists()
    writer = _writer(tmp_path / "hp")
    for step in range(50):
        writer.add_scalar("train/loss", 2.0 - 0.01 * step, step)
    writer.add_hparams({"lr": 1e-3}, {"hp_metric": 1.5})
    writer.close()
    assert len(list((tmp_path / "hp").glob("*/events.out.tfevents.*"))) == 1  # add_hparams' own subdirectory
    result = import_logs("tensorboard", [tmp_path / "hp"], tmp_path / "store", "hp")
    assert result.num_segments == 1 and result.num_rows == 50


def test_a_corrupt_or_torn_tensorboard_record_is_named(tmp_path: Path) -> None:
    """With ``--skip-bad-lines`` a record corrupt in the middle said "skipped 1 bad line" while everything after it
    (the framing is lost) was gone; a torn last record was dropped without a word. Both are now named: which
    record, and how many could not be read. Fails on 3ae9ad4."""
    writer = _writer(tmp_path / "tb")
    for step in range(200):
        writer.add_scalar("train/loss", 2.0, step)
    writer.close()
    (event_file,) = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    data = event_file.read_bytes()
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / event_file.name).write_bytes(data[:-7])
    out = _cli("import", "tensorboard", str(tmp_path / "torn"), "--root", str(tmp_path / "s"), "--run", "torn")
    assert out.returncode == 0 and "the last record is cut short (a write cut short?); not read" in out.stderr
    assert "imported 199 rows" in out.stdout, out.stdout
    bad = bytearray(data)
    bad[len(data) // 2] ^= 0xFF  # one flipped byte in the middle: its record's checksum fails
    (tmp_path / "mid").mkdir()
    (tmp_path / "mid" / event_file.name).write_bytes(bytes(bad))
    out = _cli("import", "tensorboard", str(tmp_path / "mid"), "--root", str(tmp_path / "s"), "--run", "mid")
    assert out.returncode == 2 and "is corrupt; the" in out.stderr and "cannot be read either" in out.stderr
    out = _cli("import", "tensorboard", str(tmp_path / "mid"), "--root", str(tmp_path / "s"), "--run", "mid",
               "--skip-bad-lines")
    assert out.returncode == 0 and "cannot be read either" in out.stderr and "read up to it" in out.stderr, out


def test_a_wandb_export_takes_the_trainers_step(tmp_path: Path) -> None:
    """W&B's ``_step`` counts history rows: an HF run logging every 10 updates read as steps 0-32 (its fault at update
    160 "from step 16"), and each Lightning validation call shifted ``_step`` ahead of the trainer's step. The
    trainer's own step column is the step; W&B's counter stays as ``wandb_step``; the calls of one step are one
    row. Fails on 3ae9ad4."""
    lines = ["_step,_runtime,_timestamp,train/loss,train/learning_rate,train/global_step,eval/loss,media"]
    k = 0
    for update in range(10, 310, 10):
        lines.append(f"{k},{k},{1.7e9 + k},{2.0 + (5.0 if update >= 160 else 0)},1e-3,{update},,img.png")
        k += 1
        if update % 100 == 0:
            lines.append(f"{k},{k},{1.7e9 + k},,,{update},2.2,")  # the evaluation's own history row
            k += 1
    path = _write(tmp_path, "hf.csv", "\n".join(lines) + "\n")
    t = wandb.parse([path]).metrics
    assert t["step"].to_pylist() == list(range(10, 310, 10)), t["step"].to_pylist()
    assert t["val_loss"].to_pylist()[9] == 2.2 and t["loss"].to_pylist()[9] == 2.0
    assert t["wandb_step"].to_pylist()[:3] == [0, 1, 2]
    result = import_logs("wandb", [path], tmp_path / "store", "w")
    assert result.num_segments == 1
    # A TensorBoard file given as W&B said ":3: expected 1 columns (as in the header), got 2".
    writer = _writer(tmp_path / "tb")
    writer.add_scalar("loss", 1.0, 0)
    writer.close()
    (event_file,) = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    with pytest.raises(LogFormatError, match=":1: not a W&B history export"):
        wandb.parse([event_file])


def test_wandb_csv_and_parquet(tmp_path: Path) -> None:
    text = ("_step,_runtime,_timestamp,train/loss,train/grad_norm,lr,caption,val/loss\n"
            "0,1.0,1700000000,2.5,1.0,0.1,hello,\n1,2.0,1700000001,2.4,NaN,0.1,x,\n"
            "2,3.0,1700000002,2.3,1.1,0.1,,3.0\n1,9000,1700009000,2.45,1.0,0.05,,\n")
    path = _write(tmp_path, "history.csv", text)
    assert detect_format(path) == "wandb"
    parsed = wandb.parse([path])
    t = parsed.metrics
    assert t["loss"].to_pylist() == [2.5, 2.4, 2.3, 2.45] and t["time"][0].as_py() == 1700000000
    assert "caption" not in t.column_names and t["val_loss"].to_pylist() == [None, None, 3.0, None]
    pq.write_table(pacsv.read_csv(path), tmp_path / "history.parquet")
    assert detect_format(tmp_path / "history.parquet") == "wandb"
    assert wandb.parse([tmp_path / "history.parquet"]).metrics["loss"].to_pylist() == [2.5, 2.4, 2.3, 2.45]
    result = import_logs("wandb", [path], tmp_path / "store", "w")
    assert result.num_segments == 2  # the rewind to step 1


def test_csv_generic(tmp_path: Path) -> None:
    path = _write(tmp_path, "m.csv", "step,loss,grad_norm,found_inf,My Metric\n1,2.0,1.0,false,3\n2,NaN,,true,4\n")
    t = csv_log.parse([path]).metrics
    assert t["found_inf"].to_pylist() == [False, True] and t["my_metric"].to_pylist() == [3.0, 4.0]
    assert t["grad_norm"].to_pylist() == [1.0, None]


def test_fairseq_records_and_events(tmp_path: Path) -> None:
    text = ("2021-10-05 12:00:01 | INFO | fairseq.checkpoint_utils | Loaded checkpoint ck/last.pt (epoch 1 @ 0 updates)\n"
            '2021-10-05 12:01:00 | INFO | train_inner | {"epoch": 1, "loss": "9.1", "wps": "12000", "num_updates": "100",'
            ' "lr": "0.0001", "gnorm": "1.23", "loss_scale": "64", "actv_norm": "50"}\n'
            '2021-10-05 12:02:30 | INFO | valid | {"epoch": 1, "valid_loss": "8.2", "valid_num_updates": "100"}\n'
            "2021-10-05 12:02:40 | INFO | fairseq.checkpoint_utils | Saved checkpoint ck/c_1_100.pt (epoch 1 @ 100 updates,"
            " score 8.2) (writing took 12.5 seconds)\n")
    path = _write(tmp_path, "train.log", text)
    assert detect_format(path) == "metaseq"
    parsed = metaseq.parse([path])
    (row,) = parsed.metrics.to_pylist()
    assert (row["loss"], row["grad_norm"], row["loss_scale"], row["act_norm"], row["val_loss"]) == (9.1, 1.23, 64, 50, 8.2)
    assert [(e["event"], e["step"]) for e in parsed.events] == [("resume", 0), ("checkpoint", 100)]
    assert parsed.events[1]["write_seconds"] == 12.5


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runwatch.app.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_import_ok_and_bad_file(tmp_path: Path) -> None:
    good = _write(tmp_path, "good.log", "s:0 tel:3.0\ns:0 trl:3.1 lr:0.1 norm:1.0\ns:1 trl:3.0 lr:0.1 norm:0.9\n")
    ok = _cli("import", "auto", str(good), "--root", str(tmp_path / "store"), "--run", "good")
    assert ok.returncode == 0, ok.stderr
    assert "imported 2 rows" in ok.stdout
    bad = _write(tmp_path, "bad.log", "s:0 trl:3.1\ns:1 trl:3.0\ns:2 trl:x\n")
    res = _cli("import", "auto", str(bad), "--root", str(tmp_path / "store"), "--run", "bad")
    assert res.returncode == 2 and f"{bad}:3" in res.stderr
    assert not (tmp_path / "store" / "run=bad").exists()
    res = _cli("import", "llmc", str(bad), "--root", str(tmp_path / "store"), "--run", "bad", "--skip-bad-lines")
    assert res.returncode == 0 and "skipped 1 bad line" in res.stdout
    with Store(tmp_path / "store") as store:
        assert store.rows("bad").num_rows == 2 and pa.types.is_floating(store.rows("bad")["loss"].type)


# A line is complete only with its newline: a job killed mid-write leaves its last line cut, often mid-number.
CUT_LAST_LINES = [
    (llmc, "s:0 trl:11.0 lr:0.0001 norm:1.0\ns:1 trl:10.9 lr:0.0001 norm:1.0\n", "s:2 trl:1"),  # of 10.8
    (megatron, MEG.format(step=1, s=4, loss="2.0") + "\n" + MEG.format(step=2, s=8, loss="1.9") + "\n",
     MEG.format(step=3, s=12, loss="1.8").split("loss scale:")[0] + "loss scale: 4"),  # of 4096.0
    (csv_log, "step,loss,loss_scale\n1,2.5,4096\n2,2.4,4096\n", "3,2.3,4"),
    (jsonl, '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.4}\n', '{"step": 3, "loss": 2.3'),  # its JSON unfinished
]


@pytest.mark.parametrize("module, complete, cut", CUT_LAST_LINES)
def test_a_last_line_without_its_newline_is_not_read(tmp_path: Path, module, complete: str, cut: str) -> None:
    """Fails on 8db45ea: the cut line landed as a row (``loss scale: 4`` for 4096.0, ``trl:1`` for 10.8)."""
    path = _write(tmp_path, "x.log", complete + cut)
    with pytest.warns(RuntimeWarning, match=rf"{path}:{complete.count(chr(10)) + 1}: the last line has no newline"):
        parsed = module.parse([path])
    assert parsed.metrics.num_rows == 2 and 3 not in parsed.metrics["step"].to_pylist()


def test_a_jsonl_last_line_without_its_newline_is_read_when_its_json_is_whole(tmp_path: Path) -> None:
    """A JSON value closes itself: a file written without a final newline loses nothing (a user's
    ``"\\n".join(json.dumps(row) ...)``), while a malformed whole line is still an error naming it."""
    path = _write(tmp_path, "a.jsonl", '{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.4}')
    assert jsonl.parse([path]).metrics["step"].to_pylist() == [1, 2]
    bad = _write(tmp_path, "b.jsonl", '{"step": 1, "loss": 2.5}\n[1, 2]')
    with pytest.raises(LogFormatError, match=r"b.jsonl:2: expected a JSON object"):
        jsonl.parse([bad])


@pytest.mark.skipif(not (REALRUNS / "msft-megatron-ds-gpt3-125m-fp16" / "raw.log").is_file(), reason="needs realruns")
def test_a_real_log_cut_mid_line_imports_healthy_and_says_so(tmp_path: Path) -> None:
    """A user's report: Microsoft's Megatron-DeepSpeed 125M log (fp16, loss scale 16384 throughout; it ends in a
    SIGTERM) cut inside iteration 2000's line at ``loss scale: 1``. On 8db45ea the import took 1 for the scale and
    ``check`` said ACTION: "loss scale collapsed 16384 -> 1 ... it did not recover", with rollback advice. Now the cut
    line is not read, the import says which line, and the run is healthy (exit 0)."""
    raw = (REALRUNS / "msft-megatron-ds-gpt3-125m-fp16" / "raw.log").read_bytes()
    at = raw.index(b" iteration     2000/")
    cut = raw[:at] + raw[at:raw.index(b"loss scale: 1", at) + len(b"loss scale: 1")]
    path = tmp_path / "cut.log"
    path.write_bytes(cut)
    store = str(tmp_path / "store")
    res = _cli("import", "megatron", str(path), "--root", store, "--run", "cut")
    line = cut.count(b"\n") + 1
    assert res.returncode == 0 and "imported 199 rows" in res.stdout, res.stderr
    assert res.stderr.strip() == \
        f"runwatch: note: {path}:{line}: the last line has no newline (a write cut short?); not read"
    assert import_logs("megatron", [path], tmp_path / "store", "again").notes == \
        (f"{path}:{line}: the last line has no newline (a write cut short?); not read",)
    check = _cli("check", "--root", store, "--run", "cut")
    assert check.returncode == 0 and "HEALTHY" in check.stdout, check.stdout
