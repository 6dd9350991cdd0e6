"""Import page: load an archived training log into the root, with the importers that exist.

A path must resolve to a file under the root (the dashboard reads nothing
outside it); an upload is written to a temporary folder under its own name
first, and errors name the uploaded file, never that folder. Errors from the
parser name the file and line and are shown escaped (they quote the log), in
the page's own terms (its labels, not the command line's flags). Replacing
an existing run needs its name typed again. The page says which root it
writes to.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import streamlit as st

from runwatch.app import escape, state, views
from runwatch.app.views import resolve_under_root
from runwatch.collectors.importers import FORMATS, import_logs
from runwatch.data.storage import check_run_name, run_exists


def _run_import(root_dir: str, fmt: str, path: Path, run: str, skip_bad: bool, replace: bool,
                shown_as: dict[str, str]) -> None:
    try:
        result = import_logs(fmt, [path], root_dir, run, skip_bad_lines=skip_bad, replace=replace)
    except (ValueError, OSError, RuntimeError) as err:
        st.error(f"Import failed, nothing was written: {escape.markdown(views.page_terms(err, shown_as))}")
        return
    st.success(f"Imported {result.num_rows:,} rows and {result.num_events} events into run "
               f"{escape.markdown(result.run)} ({result.num_segments} segment(s); skipped {result.num_skipped} bad line(s)).")
    for note in result.notes:
        st.warning(escape.markdown(views.page_terms(note, shown_as)))
    st.page_link("screens/run.py", label=escape.markdown(f"Open {result.run}"), query_params={"run": result.run})


def _replace_confirmed(root_dir: str, run: str, replace: bool) -> bool:
    """Overwriting a run destroys its data: only with the run's name typed again."""
    try:
        exists = bool(run) and run_exists(root_dir, check_run_name(run))
    except ValueError:
        return True  # an invalid name: the import refuses it with its own message
    if not (replace and exists):
        return True
    st.warning(f"Run {escape.markdown(run)} exists. Importing with replace deletes its recorded data "
               "and puts this log in its place.")
    typed = st.text_input("type the run name to confirm the replacement", key="import_confirm")
    return typed == run


def import_page(root_dir: str) -> None:
    fmt = st.selectbox("format", ["auto", *FORMATS], key="import_format")
    source = st.radio("source", ["path under the root", "upload"], horizontal=True, key="import_source")
    if source == "upload":
        upload = st.file_uploader("log file", key="import_upload")
        given = None
    else:
        given = st.text_input("path (relative to the root, or absolute inside it)", key="import_path")
        upload = None
    run = st.text_input("run name", key="import_run")
    skip_bad = st.checkbox("skip bad lines (and report how many)", key="import_skip_bad")
    replace = st.checkbox("replace the run if it exists", key="import_replace")
    confirmed = _replace_confirmed(root_dir, run, replace)
    if not st.button("import", key="import_button", type="primary"):
        return
    if not run:
        st.error("Give the run a name.")
        return
    if not confirmed:
        st.error("Not imported: type the run's name in the confirmation box to replace it.")
        return
    with tempfile.TemporaryDirectory(prefix="runwatch-upload-") as tmp:
        try:
            if upload is not None:
                name = views.upload_name(upload.name)
                path = Path(tmp) / name
                path.write_bytes(upload.getvalue())
                shown_as = {str(path): name, str(path.resolve()): name, tmp: "(upload)"}
            elif given:
                path = resolve_under_root(root_dir, given)
                shown_as = {}
            else:
                st.error("Give a path or upload a file.")
                return
        except ValueError as err:
            st.error(escape.markdown(err))
            return
        _run_import(root_dir, fmt, path, run, skip_bad, replace, shown_as)


st.title("runwatch · import an archived log")
try:
    root = state.root()
    st.caption(f"Imports into the dashboard's root: {escape.markdown(root)}"
               + ("" if root.is_dir() else " (created by the first import)"))
    import_page(str(root))
except ValueError as err:
    st.error(escape.markdown(err))
