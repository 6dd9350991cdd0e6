"""The ``runwatch`` command line.

Each subcommand parses into plain arguments and calls one function; errors in
user input (bad paths, bad logs, bad names), unreadable data and a busy run
print one line and exit 2, never a traceback (exit 1 is reserved for
"action needed" from ``check``). ``RUNWATCH_DEBUG=1`` shows the traceback of
an unexpected error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence

from runwatch.app.escape import terminal

EXIT_OK, EXIT_ACTION, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own exit code for usage errors is 2 as well
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"runwatch: error: {message}\n")


def _cmd_import(args: argparse.Namespace) -> int:
    from runwatch.app.progress import Progress, reading
    from runwatch.collectors.importers import import_logs

    size = sum(os.path.getsize(p) for p in args.paths if os.path.isfile(p))
    progress = Progress(size, f"importing {terminal(args.run)}")  # shown only when it takes a while
    try:
        with reading(args.paths, progress):
            result = import_logs(args.format, args.paths, args.root, args.run,
                                 skip_bad_lines=args.skip_bad_lines, replace=args.replace)
    except BaseException:
        progress.close()  # the bar's line ends before the error is printed
        raise
    progress.close(f"{result.num_rows:,} rows")
    print(f"imported {result.num_rows} rows and {result.num_events} events into run {result.run!r} "
          f"({result.num_segments} segment{'s' if result.num_segments != 1 else ''}) under {args.root}")
    if args.skip_bad_lines:
        print(f"skipped {result.num_skipped} bad line{'s' if result.num_skipped != 1 else ''}")
    for note in result.notes:
        print(f"runwatch: note: {one_line(note)}", file=sys.stderr)
    return EXIT_OK


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _cmd_runs(args: argparse.Namespace) -> int:
    from runwatch.app import lifecycle
    from runwatch.data import Store

    with Store(args.root) as store:
        rows = [r if r["error"] else lifecycle.as_listed(r, store) for r in store.runs().to_pylist()]
    errors = [r["error"] for r in rows if r["error"]]
    for error in errors:  # every other run still lists; the broken one is named with its file
        print(f"runwatch: error: {one_line(error)}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, default=str))
        return EXIT_USAGE if errors else EXIT_OK
    if not rows:
        print(f"no runs under {args.root}")
        return EXIT_OK
    now = time.time()
    header = ("run", "state", "last step", "segments", "ranks", "rows", "tokens", "updated")

    def cell(value: object) -> str:  # an unreadable run has no counts: a dash, as every other unknown
        return "-" if value is None else str(value)

    lines = [header] + [
        (r["run"], r.get("state") or "-", "unreadable" if r["error"] else cell(r["last_step"]), cell(r["num_segments"]),
         cell(r["num_ranks"]), cell(r["num_rows"]), "-" if r["tokens"] is None else f"{r['tokens']:,}",
         _ago(None if r["last_update"] is None else now - r["last_update"]))
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
    return EXIT_USAGE if errors else EXIT_OK


def _cmd_compact(args: argparse.Namespace) -> int:
    from runwatch.data import compact

    result = compact(args.root, args.run)
    print(f"compacted {result.files_before} files into {result.files_after}"
          + (f" ({result.live_partitions} partitions still being written were left as they are)"
             if result.live_partitions else ""))
    for line in result.busy:
        print(f"runwatch: error: {line}", file=sys.stderr)
    return EXIT_USAGE if result.busy else EXIT_OK


def _cmd_manifests(args: argparse.Namespace) -> int:
    from runwatch.data.manifests import SYMLINK_DIR, write_manifests

    num = write_manifests(args.root)
    print(f"wrote {num} manifest{'s' * (num != 1)} under {str(args.root).rstrip('/')}/{SYMLINK_DIR}/")
    return EXIT_OK


def _delegate(module: str, function: str = "main"):
    """A subcommand implemented in another module of the app, imported only when used."""

    def run(args: argparse.Namespace) -> int:
        return getattr(importlib.import_module(module), function)(args)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="runwatch", description="Training-health observability for PyTorch runs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    def root_arg(p: argparse.ArgumentParser, required: bool = True) -> None:
        p.add_argument("--root", required=required,
                       help="runwatch store root: a directory of run=<id>/..., or an object-store URL (s3://bucket/prefix)")

    p = sub.add_parser("import", help="import an archived run log into the store",
                       description="Parse a training log and store it as a run. Nothing lands unless the whole file parses.")
    p.add_argument("format", help="log format, or 'auto' to detect it from the content")
    p.add_argument("paths", nargs="+", metavar="PATH", help="log file(s), read in the order given")
    root_arg(p)
    p.add_argument("--run", required=True, help="name of the run to create")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip malformed lines and report how many")
    p.add_argument("--replace", action="store_true", help="replace the run if it already exists")
    p.set_defaults(func=_cmd_import)

    p = sub.add_parser("runs", help="list the runs under a root", description="List every run under ROOT.")
    root_arg(p)
    p.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    p.set_defaults(func=_cmd_runs)

    p = sub.add_parser("compact", help="merge small Parquet parts", description="Merge each partition's small files into one; query results are unchanged.")
    root_arg(p)
    p.add_argument("--run", help="only this run (default: every run)")
    p.set_defaults(func=_cmd_compact)

    p = sub.add_parser("manifests", help="write symlink manifests for Trino/Athena",
                       description="List each partition's committed Parquet parts in ROOT/_symlink/ (Hive's "
                                   "SymlinkTextInputFormat), for engines that read whole directories.")
    root_arg(p)
    p.set_defaults(func=_cmd_manifests)

    p = sub.add_parser("check", help="run the detectors and print findings and rollback advice",
                       description="Judge a run: findings, segments and rollback advice. Exit 0 healthy, 1 action needed, 2 usage or data error.")
    root_arg(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="run to check")
    which.add_argument("--all", action="store_true",
                       help="judge every run (exit 1 if any needs action) and store each run's findings beside it")
    p.add_argument("--json", action="store_true",
                   help="print exactly one JSON object on stdout (with --all: a list of them, one per run)")
    p.add_argument("--engine", choices=("local", "spark"), default="local",
                   help="with --all: a process pool on this machine (default) or Spark (pip install 'runwatch[spark]')")
    p.add_argument("--workers", type=int, help="with --all --engine local: processes (default: the usable cores)")
    p.add_argument("--master", help="with --engine spark: the Spark master (default: $SPARK_MASTER, else local[*])")
    p.add_argument("--now", type=float, metavar="UNIX_SECONDS",
                   help="judge as of this time (whether a live run has stalled; default: the clock)")
    p.set_defaults(func=_delegate("runwatch.app.check"))

    p = sub.add_parser("advise", help="checkpoint cost, interruptions, lost work, cadence and retention",
                       description="What checkpoints and interruptions cost a run, from its own record, and the "
                                   "checkpoint interval (Young, Daly) and retention ladder to use.")
    root_arg(p)
    p.add_argument("--run", required=True, help="run to advise on")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    p.add_argument("--mtbf-hours", type=float, help="mean time between interruptions (default: the run's own)")
    p.add_argument("--cost-per-hour", type=float, help="what the cluster costs per hour, for the cost per day")
    p.set_defaults(func=_delegate("runwatch.app.advise"))

    p = sub.add_parser("ack", help="acknowledge a finding (check and the dashboard show who is on it)",
                       description="Record that you are on a finding: an 'ack' event in the run's record.")
    root_arg(p)
    p.add_argument("--run", required=True, help="the run")
    p.add_argument("--kind", required=True, help="the finding's kind (as `runwatch check` prints it)")
    p.add_argument("--segment", type=int, help="its segment, when several findings of the kind exist")
    p.add_argument("--onset", type=int, help="its onset step, when several findings of the kind exist")
    p.add_argument("--by", required=True, help="who acknowledges (a name or an address)")
    p.add_argument("--note", help="what you are doing about it")
    p.set_defaults(func=_delegate("runwatch.app.oncall", "main_ack"))

    p = sub.add_parser("silence", help="mute a run's alerts for a while",
                       description="Record a 'silence' event: alerts about the run stay quiet until it ends.")
    root_arg(p)
    p.add_argument("--run", required=True, help="the run")
    p.add_argument("--for", dest="duration", required=True, help="how long: 90m, 4h, 2d or seconds; 0 lifts it")
    p.add_argument("--by", required=True, help="who silences it")
    p.add_argument("--note", help="why (maintenance, known issue, ...)")
    p.set_defaults(func=_delegate("runwatch.app.oncall", "main_silence"))

    p = sub.add_parser("watch", help="follow live runs and message the on-call engineer about findings",
                       description="Follow every live run under ROOT (watchdog; an object store by listing) with the streaming analyser and send one "
                                   "message per new finding that needs attention and one when it resolves, through "
                                   "apprise. --once: one pass for cron; exit 0 healthy, 1 action needed, 2 error.")
    root_arg(p)
    p.add_argument("--notify", action="append", metavar="URL",
                   help="apprise URL to message (repeatable): json://host:port/path, slack://..., pagerduty://...")
    p.add_argument("--once", action="store_true", help="one pass, then exit (for cron)")
    p.add_argument("--state", metavar="PATH",
                   help="state file (default ROOT/watch-state.json; required, and local, for an object-store root)")
    p.add_argument("--dashboard-url", metavar="URL", help="dashboard base URL; messages link the run's page")
    p.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                   help="judge runs without new files this often, for stalls (default 5)")
    p.add_argument("--poll", type=float, metavar="SECONDS",
                   help="poll the root instead of inotify (network filesystems); how often an object-store root is "
                        "listed (default 10)")
    p.add_argument("--cooldown", type=float, default=1800.0, metavar="SECONDS",
                   help="hold back a repeat alert for the same run, kind and rank this long (default 1800)")
    p.set_defaults(func=_delegate("runwatch.app.watch"))

    p = sub.add_parser("dashboard", help="serve the on-call dashboard", description="Serve the Streamlit dashboard over ROOT.")
    root_arg(p)
    p.add_argument("--port", type=int, default=8501, help="port (default 8501)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; others need --secrets with [auth])")
    p.add_argument("--secrets", help="Streamlit secrets file whose [auth] section configures the login "
                                     "(default ./.streamlit/secrets.toml when it exists)")
    p.set_defaults(func=_delegate("runwatch.app.serve"))

    p = sub.add_parser("demo", help="train a tiny model with faults, then open the dashboard on it",
                       description="Record a real tiny CPU training run with a recovered spike, an unrecovered spike and a rollback, then serve the dashboard.")
    p.add_argument("--root", default="runwatch-demo", help="where to write the demo store (default ./runwatch-demo)")
    p.add_argument("--port", type=int, default=8501, help="dashboard port (default 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--no-dashboard", action="store_true", help="only record the demo runs")
    p.add_argument("--fresh", action="store_true", help="record the demo runs again even if ROOT has them")
    p.set_defaults(func=_delegate("runwatch.app.demo"))
    return parser


def one_line(text: object) -> str:
    """An error as one terminal line: line breaks folded, control characters escaped (file text is data)."""
    return terminal(" ".join(str(text).split()))


def _warning_line(message: Warning | str, *_: object, **__: object) -> str:
    return one_line(message) + "\n"  # warnings too are one line on a terminal


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.formatwarning = _warning_line
    try:
        return args.func(args)
    except BrokenPipeError:  # `runwatch runs | head`: the reader left, nothing is wrong
        # Point stdout at devnull so the flush at exit does not raise again (Python's documented recipe).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (ValueError, OSError, RuntimeError, ArithmeticError) as err:
        # Bad input, a data error or a busy run: one clear line, no traceback (errors quote log lines: escaped).
        print(f"runwatch: error: {one_line(err)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # a bug: still one line and exit 2, never exit 1 ("action needed")
        if os.environ.get("RUNWATCH_DEBUG"):
            raise
        print(f"runwatch: error: unexpected {type(err).__name__}: {one_line(err)} "
              "(set RUNWATCH_DEBUG=1 for the traceback)", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
