"""Text from outside is data: one escaping function per place it is shown.

Run names from the URL, checkpoint paths and notes from events, finding
messages and evidence built from them, and error text quoting a log line all
come from files or URLs someone else wrote. Each output that interprets text
gets exactly one function here, and every page, figure and terminal view
calls it instead of formatting raw strings:

- ``markdown``: Streamlit Markdown (``st.markdown``, ``st.error``/``warning``/
  ``info``/``success``, ``st.caption``, widget and metric labels, page-link
  labels), which would otherwise turn ``[x](url)`` into a link,
  ``![x](url)`` into an image the browser fetches, a backtick into a broken
  code span and ``:red[..]`` into a directive.
- ``echarts``: text in an ECharts option (panel titles, series and mark
  names, tooltip items). ECharts draws it on a canvas as plain text and its
  default tooltips HTML-escape it, so markup is already inert; what is left is
  layout: a newline or a control character would split or hide a label.
- ``terminal``: text printed by the CLI, where an ESC or CSI sequence could
  move the cursor, erase the line or retitle the window, and a newline or a
  bidi override could forge a line the reader trusts.

- ``notification``: the title and body ``runwatch watch`` hands to apprise. Sent
  as plain text, but chat targets render it: Discord turns ``[x](url)`` into a
  link and ``@here`` into a ping of everyone (a review: a checkpoint path carried
  both, and an ESC, into Discord's ``content`` as they were). Lines are kept.

Shell command lines are the fifth sink: they are quoted where they are built
(``runwatch.detectors.advisor.resume_hint``, with ``shlex.quote``).
"""

from __future__ import annotations

import re
import unicodedata

# Every ASCII punctuation character can be backslash-escaped in CommonMark, and
# an escaped one is always literal: no link, image, emphasis, code span, HTML,
# entity, table cell, heading, list or Streamlit directive (:red[..],
# :material/x:, $math$) can start from it, and GFM's bare-URL autolinks need an
# unescaped "://" or "www.".
_MARKDOWN_SPECIAL = re.compile(r"""([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])""")
# Line breaks, tabs, leading spaces and other controls would start a new block
# (a heading, a list, an indented code block) or hide text: every run of them
# becomes one space, as HTML would show it anyway.
_CONTROL_OR_SEPARATOR = frozenset({"Cc", "Cf", "Zl", "Zp"})
_WHITESPACE = re.compile(r"\s+")
# Streamlit's Markdown also turns bare URLs and e-mail addresses into links after
# the escapes are resolved (mdast's GFM autolink transform works on plain text),
# so an invisible WORD JOINER (U+2060) goes where those patterns hinge: after
# "http:" and "https:" before "//", between "www" and ".", after "@". The text
# reads the same; nothing matches.
_AUTOLINK_HINGE = re.compile(r"(?i)(?<=https:)(?=//)|(?<=http:)(?=//)|(?<=www)(?=\.)|(?<=@)")
WORD_JOINER = "\u2060"


def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) in _CONTROL_OR_SEPARATOR


def markdown(text: object) -> str:
    """``text`` as literal characters inside Streamlit Markdown, on one line."""
    flat = "".join(" " if _is_control(ch) else ch for ch in str(text))
    unlinked = _AUTOLINK_HINGE.sub(WORD_JOINER, _WHITESPACE.sub(" ", flat).strip())
    return _MARKDOWN_SPECIAL.sub(r"\\\1", unlinked)


def echarts(text: object) -> str:
    """``text`` as one literal line in an ECharts option (never used as a ``formatter`` template)."""
    flat = "".join(" " if _is_control(ch) else ch for ch in str(text))
    return _WHITESPACE.sub(" ", flat).strip()


def terminal(text: object) -> str:
    """``text`` safe to print: every control, format and line-separator character shown as an escape.

    ESC (and with it every CSI/OSC sequence), carriage return, backspace,
    newline, DEL, C1 controls and Unicode bidi overrides become visible
    ``\\x1b``-style escapes, so one field prints as one inert line. Callers
    join their own lines with newlines after escaping each field.
    """
    out = []
    for ch in str(text):
        if _is_control(ch):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


# Where chat Markdown and mentions hinge: a masked link's "](" and an image's "![", "@" (Discord's @everyone/@here,
# Slack's and Discord's <@id>, <!channel>, <#id>), "<!" and "<#". An invisible WORD JOINER breaks each; reads the same.
_CHAT_HINGE = re.compile(r"(?<=\])(?=\()|(?<=!)(?=\[)|(?<=@)|(?<=<)(?=[!#@])")


def notification(text: object) -> str:
    """``text`` (a title or a multi-line body) inert in any notification target: control and format characters
    other than newlines shown as spaces, chat links, images and mentions broken by an invisible joiner."""
    lines = ("".join(" " if _is_control(ch) else ch for ch in line) for line in str(text).split("\n"))
    return "\n".join(_CHAT_HINGE.sub(WORD_JOINER, line) for line in lines)
