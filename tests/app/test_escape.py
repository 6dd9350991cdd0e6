"""Untrusted text stays text: Markdown, Plotly and terminal escaping, and the `check` output and resume hint.

The Markdown escaping is checked with a real CommonMark parser (markdown-it-py
with GFM autolinks); the browser test checks Streamlit's own renderer.
"""

from __future__ import annotations

import html
import json
import re
import shlex
import subprocess
import sys
import unicodedata
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from runwatch.app import charts, escape, views
from runwatch.data.store import Store
from tests.app.conftest import HOSTILE_PATH, hostile_lines, write_jsonl_run

GFM = MarkdownIt("gfm-like")
PAYLOADS = [
    "[click](http://evil.example/x)", "![img](http://evil.example/i.png)", "<img src=http://evil.example/h.png>",
    "<a href='http://evil.example'>a</a>", "`tick``", "http://evil.example www.evil.example", "&lt;b&gt; &amp;",
    "back\\slash", "# heading\n- list\n\n    code", "*em* _u_ ~~s~~ **b**", ":red[x] :material/warning: $x^2$",
    "a|b\n|---|", "line\rover\x1b[2Kwrite\x08", "\u202eevil\u202c", "<script>alert(1)</script>", HOSTILE_PATH,
]


def _flat(text: str) -> str:
    return "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in text)


def _only_text(rendered: str) -> str:
    """The text of a rendering that must be one plain paragraph; fails on any other element."""
    body = rendered.strip()
    assert body.startswith("<p>") and body.endswith("</p>"), body
    inner = body[3:-4]
    assert "<" not in inner, f"an element was produced: {inner}"
    return html.unescape(inner).replace(escape.WORD_JOINER, "")  # invisible: what the reader sees


@pytest.mark.parametrize("text", PAYLOADS)
def test_markdown_escaping_leaves_only_the_text(text: str) -> None:
    assert _only_text(GFM.render(escape.markdown(text))) == " ".join(_flat(text).split())


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1).filter(lambda t: _flat(t).split()))
def test_no_text_becomes_markdown(text: str) -> None:
    # Whitespace runs are one space (as HTML shows them), so no indentation can open a code block.
    assert _only_text(GFM.render(escape.markdown(text))) == " ".join(_flat(text).split())


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_terminal_escaping(text: str) -> None:
    for_terminal = escape.terminal(text)
    assert not any(unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") for c in for_terminal)
    assert for_terminal == text or "\\" in for_terminal


def test_terminal_shows_control_sequences_as_escapes() -> None:
    assert escape.terminal("a\x1b[2Kb\rc\nd\u202e") == "a\\x1b[2Kb\\x0dc\\x0ad\\u202e"


def test_rollback_card_escapes_path_actions_and_reason() -> None:
    rollback = SimpleNamespace(checkpoint_step=250, checkpoint_path=HOSTILE_PATH, checkpoint_missing=False,
                               skip_batches=[251, 300], actions=[f"restart from {HOSTILE_PATH}"],
                               reason=f"because [x](http://evil.example) {HOSTILE_PATH}")
    for line in views.rollback_lines(rollback):
        tags = set(re.findall(r"</?([a-zA-Z0-9]+)", GFM.render(line)))
        assert tags <= {"p", "strong", "em", "br", "ul", "li"}, tags  # the card's own emphasis, nothing else
    assert "`tick`$(touch x)" in GFM.render(views.rollback_lines(rollback)[0])  # shown, as text


@pytest.mark.parametrize("text", ["see http://evil.example/x", "HTTPS://evil.example", "www.evil.example",
                                  "mail eve@evil.example", "xmpp:eve@evil.example", "mailto:eve@evil.example"])
def test_bare_urls_and_addresses_are_not_linked(text: str) -> None:
    """Streamlit links them on the text after escapes; the Markdown must not hold the pattern at all."""
    source = escape.markdown(text)
    assert not re.search(r"(?i)https?:\\?/|www\\?\.|@[\w-]", source), source
    assert source.replace("\\", "").replace(escape.WORD_JOINER, "") == text


def _texts(value: object, path: str = "") -> list[tuple[str, str]]:
    """Every string in an ECharts option, with where it sits."""
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _texts(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [t for v in value for t in _texts(v, path)]
    return [(path, value)] if isinstance(value, str) else []


def test_chart_texts_are_one_literal_line_and_never_a_template() -> None:
    hostile = f"{HOSTILE_PATH}\n{{a|forged}} {{b}}\u202e"
    marks = [{"x": 250.0, "text": f"checkpoint @ step 250: {hostile}", "kind": "checkpoint"}]
    import pyarrow as pa

    ds = pa.table({"x_first": [0.0], "first": [1.0], "x_min": [0.0], "min": [1.0], "x_max": [1.0], "max": [1.0],
                   "x_last": [1.0], "last": [1.0], "segment": pa.array([0], pa.int32()), "main": [True],
                   "num_nonfinite": [0]})
    option = charts.run_chart({"loss": ds, hostile: ds}, charts.panels_for(["loss", hostile], [hostile]), marks=marks,
                              bands=[{"x0": 0, "x1": 1, "severity": "warning", "label": hostile}],
                              advised={"x": 0, "text": hostile}).option
    texts = _texts(option)
    shown = [t for _, t in texts if "evil.example" in t]
    assert len(shown) >= 4  # the mark, the band, the advised line, the extra panel's title
    assert all("\n" not in t and "\x1b" not in t and "\u202e" not in t for t in shown)
    # A formatter is a template ECharts expands: only our own fixed ones, never a value from outside.
    assert all(t in ("{b}",) for p, t in texts if p.endswith("formatter"))
    compare = charts.compare_chart({"<b>r</b>\nx": {"loss": ds}}, ["loss"], colors={"<b>r</b>\nx": "#000"}).option
    assert [s["name"] for s in compare["series"]] == ["<b>r</b> x"]  # literal text on a canvas, one line


@pytest.fixture
def hostile_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    write_jsonl_run(root, "hostile", hostile_lines())
    write_jsonl_run(root, "subst", hostile_lines(path="ck/$(touch x).pt"), name="subst.jsonl")
    return root


def _check(root: Path, run: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runwatch.app.cli", "check", "--root", str(root), "--run", run, *extra],
                          capture_output=True, text=True, timeout=120)


def test_check_prints_no_control_characters(hostile_root: Path) -> None:
    out = _check(hostile_root, "hostile")
    assert out.returncode == 1, out.stderr
    assert not any(unicodedata.category(c) == "Cc" and c != "\n" for c in out.stdout)
    assert "\\x1b[2K" in out.stdout  # shown, so the reader sees the path is odd
    assert all(line.startswith(("hostile:", "open:", "recent (came back by itself):", "  ", "what to do:", "segments:")) for line in out.stdout.splitlines())
    report = json.loads(_check(hostile_root, "hostile", "--json").stdout)  # JSON escapes it its own way
    assert report["rollback"]["checkpoint_path"] == HOSTILE_PATH


def test_resume_hint_is_shell_quoted(hostile_root: Path, tmp_path: Path) -> None:
    out = _check(hostile_root, "subst")
    hint = next(line.split("resume: ", 1)[1] for line in out.stdout.splitlines() if "resume: " in line)
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    # What an engineer does at 3 a.m.: paste it after their training command (printf stands in for it).
    run = subprocess.run(["bash", "-c", f"printf '%s\\n' {hint}"], cwd=sandbox, capture_output=True, text=True)
    assert run.returncode == 0 and not (sandbox / "x").exists()
    assert run.stdout.splitlines()[:2] == ["--resume", "ck/$(touch x).pt"]
    assert shlex.split(hint)[1] == "ck/$(touch x).pt"


def test_dashboard_resume_command_uses_the_same_quoting(hostile_root: Path) -> None:
    from runwatch.app.judge import judge_run

    with Store(hostile_root) as store:
        rollback = judge_run(store, "subst").rollback
    command = views.resume_command("subst", rollback, {"command": "printf '%s\\n'"})
    assert "--resume 'ck/$(touch x).pt'" in command
