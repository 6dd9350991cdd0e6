#!/usr/bin/env bash
# Set up a fresh machine and run runwatch's main job or its tests.
#   ./bootstrap.sh demo [ARGS]   install, record the demo runs, serve the dashboard
#   ./bootstrap.sh test [ARGS]   install (Chromium too), run the test suite
set -euo pipefail
cd "$(dirname "$0")"
mode=${1:-}
case $mode in demo|test) shift ;; *) echo "usage: $0 demo|test [args]" >&2; exit 2 ;; esac

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
pip() { .venv/bin/python -m pip -q --disable-pip-version-check "$@"; }
# torch: keep one that is already there; otherwise the pinned CPU build (on our
# machines it lies on local disk; an unpinned request can pull a multi-GB CUDA build).
.venv/bin/python -c "import torch" 2>/dev/null || pip install "torch==2.13.0"

if [ "$mode" = demo ]; then
  pip install -e ".[torch]"
  exec .venv/bin/runwatch demo "$@"
fi

pip install -e ".[torch,test]"
if ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -q && apt-get install -y -q chromium) >/dev/null
  else
    echo "note: Debian's chromium is not installed; the browser test will be skipped (sudo apt-get install chromium)" >&2
  fi
fi
# Spark (check --all --engine spark) runs on a JVM: Debian's headless JRE, like Chromium.
if ! command -v java >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -q && apt-get install -y -q default-jre-headless) >/dev/null
  else
    echo "note: no Java runtime; the Spark test will be skipped (sudo apt-get install default-jre-headless)" >&2
  fi
fi
# Two test files at a time (pytest-xdist; a file's tests stay on one worker, so its module fixtures are made
# once): most of the suite waits on subprocesses, servers and a browser, so on 2 cores it takes ~8.5 minutes
# instead of ~14. Pass -n 0 to run it in one process.
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
