"""Real logs from other teams (../shared/realruns) against the events their SOURCE.md names.

Each case imports one real file with ``runwatch import FORMAT`` and runs
``runwatch check --json`` on it, both as real subprocesses of the installed
CLI, then asks one question of the JSON: did runwatch report this event (a
finding of the expected kind whose onset lies in the stated step range), or,
for the healthy stretches, did it stay quiet? ``python bench/eval_detectors.py
--realruns`` prints the README table; tests/detectors/test_realruns.py asserts
the same cases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REALRUNS = Path(os.environ.get("RUNWATCH_REALRUNS", Path(__file__).resolve().parents[3] / "shared" / "realruns"))
if not REALRUNS.is_dir():
    REALRUNS = Path("/work/shared/realruns")
BLOCKS = "bigscience-chronicles-excerpts/blocks"


@dataclass(frozen=True)
class RealCase:
    """One event (or one healthy stretch) in one real file."""

    name: str
    event: str  # what SOURCE.md says, in a few words
    fmt: str
    path: str  # relative to REALRUNS
    kind: str  # finding kind expected, or the kind that must NOT appear
    lo: int = 0  # expected onset range (inclusive)
    hi: int = 10**12
    expect: bool = True  # True: a finding must be there; False: none may be
    actionable_only: bool = False  # for negatives: only findings that need action count


CASES: tuple[RealCase, ...] = (
    RealCase("bloom-spike", "BLOOM-176B loss spike, grad norm 0.24 -> 960 (31214-31250)", "megatron",
             f"{BLOCKS}/tr11-176B-ml__chronicles__L202-213.log", "spike", 31214, 31219),
    RealCase("ds-rm-collapse", "DeepSpeed-Chat reward model: loss scale 512 -> 8 (steps ~480-560)", "deepspeed",
             "deepspeed-chat-opt/step2_reward_model_finetuning__opt-350m_globalBatchSize-64.log",
             "scaler_collapse", 470, 570),
    RealCase("golden-h100-slowdown", "Megatron-LM golden H100: 4x iteration time at 2100-2300", "megatron-golden",
             "megatron-lm-gpt3-15b-8t/raw_dgx_h100.json", "slowdown", 2001, 2100),
    RealCase("tr8-exp1-spike", "tr8-104B Exp 1: loss 6.44 -> 11.42 at 7010", "megatron",
             f"{BLOCKS}/tr8-104B-wide__chronicles__L24-31.log", "spike", 7000, 7010),
    RealCase("tr8-exp11-spike", "tr8-104B Exp 11: loss 3.11 -> 7.71 at 11447", "megatron",
             f"{BLOCKS}/tr8-104B-wide__chronicles__L638-643.log", "spike", 11440, 11447),
    RealCase("tr8-exp12-spike", "tr8-104B Exp 12: grad norm to 3.27M, loss 3.32 -> 7.60 (8738-8743)", "megatron",
             f"{BLOCKS}/tr8-104B-wide__chronicles__L923-934.log", "spike", 8730, 8743),
    RealCase("tr1-13b-spike", "tr1-13B: loss 2.77 -> 7.34 at 29050, loss scale 65536 -> 4096", "megatron",
             f"{BLOCKS}/tr1-13B-base__chronicles__L162-176.log", "spike", 29040, 29050),
    RealCase("llmc-no-action", "llm.c GPT-2 124M: healthy, two isolated grad-norm blips", "llmc",
             "llmc-gpt2-124m/raw.log", "any", expect=False, actionable_only=True),
    RealCase("golden-a100-no-spike", "Megatron-LM golden A100: no spikes (data bumps <= +0.09)", "megatron-golden",
             "megatron-lm-gpt3-15b-8t/raw_lts_dgx_a100.json", "spike", expect=False),
    RealCase("msft-125m-no-collapse", "Megatron-DS 125M fp16: loss scale doubles every 500 steps", "megatron",
             "msft-megatron-ds-gpt3-125m-fp16/raw.log", "scaler_collapse", expect=False),
    RealCase("ds-sft-sawtooth", "DeepSpeed-Chat SFT: periodic single overflows after calibration", "deepspeed",
             "deepspeed-chat-opt/step1_supervised_finetuning__opt-1.3b-globalBatchSize128.log",
             "scaler_collapse", lo=100, expect=False),
    RealCase("modded-no-action", "modded-nanogpt 1.5B: noisy per-step loss, healthy", "modded-nanogpt",
             "modded-nanogpt-1p5b/raw.log", "any", expect=False, actionable_only=True),
)


def runwatch_cli(*args: str) -> subprocess.CompletedProcess:
    """The installed CLI as a real subprocess (one thread for torch-free numpy work is plenty)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "runwatch.app.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def import_case(case: RealCase, root: Path) -> None:
    res = runwatch_cli("import", case.fmt, str(REALRUNS / case.path), "--root", str(root), "--run", case.name)
    if res.returncode != 0:
        raise RuntimeError(f"runwatch import {case.fmt} {case.path} failed: {res.stderr.strip()[-500:]}")


def check_case(case: RealCase, root: Path) -> dict:
    """`runwatch check --json` on the imported case; exactly one JSON object on stdout."""
    res = runwatch_cli("check", "--root", str(root), "--run", case.name, "--json")
    if res.returncode not in (0, 1):
        raise RuntimeError(f"runwatch check {case.name} exited {res.returncode}: {res.stderr.strip()[-500:]}")
    report = json.loads(res.stdout)
    report["exit_status"] = res.returncode
    return report


def relevant(case: RealCase, report: dict) -> list[dict]:
    """Findings that answer the case: the expected kind with onset in range (or any actionable one)."""
    out = []
    for f in report["findings"]:
        if case.kind != "any" and f["kind"] != case.kind:
            continue
        # Older JSON without needs_action: a self-recovered spike is not actionable.
        if case.actionable_only and not f.get("needs_action", f.get("self_recovered") is not True):
            continue
        if case.lo <= f["onset_step"] <= case.hi:
            out.append(f)
    return out


def passed(case: RealCase, report: dict) -> bool:
    hits = relevant(case, report)
    if case.expect:
        return bool(hits)
    if case.actionable_only:
        return not hits and report.get("rollback") is None
    return not hits


def realruns_table(root: Path) -> str:
    """Import and check every case; the README table as markdown."""
    lines = ["| event (SOURCE.md) | file | expected | caught | onset found |", "|---|---|---|---|---|"]
    for case in CASES:
        try:
            import_case(case, root)
            report = check_case(case, root)
            ok, hits = passed(case, report), relevant(case, report)
        except (RuntimeError, ValueError) as err:
            ok, hits = False, []
            print(f"{case.name}: {err}", file=sys.stderr)
        what = "actionable" if case.kind == "any" else case.kind
        want = f"{case.kind} onset {case.lo}-{case.hi}" if case.expect else f"no {what} finding"
        if case.expect:
            found = ", ".join(str(f["onset_step"]) for f in hits) or "-"
            caught = "yes" if ok else "no"
        else:
            found = ", ".join(f"{f['kind']}@{f['onset_step']}" for f in hits) or "-"
            caught = "quiet (right)" if ok else "false alarm"
        lines.append(f"| {case.event} | `{case.path.split('/')[-1]}` ({case.fmt}) | {want} | {caught} | {found} |")
    return "\n".join(lines) + "\n"
