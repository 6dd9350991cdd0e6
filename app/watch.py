"""``runwatch watch``: follow every live run under a root and message the on-call engineer about findings.

Long-running (a systemd service): a ``RunFollower`` tails the root with
watchdog (inotify; ``--poll`` for network filesystems), or lists an
object-store root every ``--poll`` seconds (default 10), and judges each run
with the streaming analyser when its files change, and every ``--interval``
seconds for stalls (silence has no file event). Each new finding that needs
attention is one message, each resolution another (``alerts.AlertBook``:
deduplicated, with a cool-down); a ``notify.Sender`` thread delivers them, so
a notifier that is down never holds up the watching, and the state file keeps
what is undelivered.

``--once`` (cron): one pass with ``judge_run`` over the live runs, those
with an open alert and those written since the last pass, delivery with a few retries, the state saved; exit 0 all
healthy, 1 a run needs action (or stalled), 2 an error. The state file
(``--state``, default ``ROOT/watch-state.json``: beside the runs, outside
every ``**/*.parquet`` glob; for an object-store root a local path must be
given) makes a cron job page once per finding, not once
per pass. One watch per state file at a time (an exclusive lock).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runwatch.app.alerts import AlertBook, AlertConfig
from runwatch.app.follow import RunFollower
from runwatch.app.judge import is_live, judge_run
from runwatch.app.notify import Notifier, Sender, backoff, deliver_due
from runwatch.app.oncall import read_oncall
from runwatch.data.roots import is_url
from runwatch.data.store import Store, StoreError
from runwatch.detectors.advisor import checkpoints_from_events

EXIT_OK, EXIT_ACTION, EXIT_ERROR = 0, 1, 2
STATE_NAME = "watch-state.json"
ONCE_ATTEMPTS = 3
"""Delivery attempts per message within one ``--once`` pass (1 s, then 2 s apart); the rest wait for the next."""


@dataclass(kw_only=True, frozen=True)
class WatchConfig:
    """``runwatch watch``'s settings, as the command line gives them."""

    root: Path | str
    """The runwatch root to follow: a directory, or an object-store URL."""
    notify: tuple[str, ...] = ()
    """apprise URLs to message (none: judge and keep the state only)."""
    once: bool = False
    """One pass, then exit (cron)."""
    state: Path | None = None
    """The state file (default ``ROOT/watch-state.json``)."""
    interval_s: float = 5.0
    """How often runs without new files are judged again (a stall makes no file event)."""
    poll_s: float | None = None
    """Poll the root every N seconds instead of inotify (network filesystems, where inotify sees nothing); how
    often an object-store root is listed (default ``RunFollower.LISTING_SECONDS``)."""
    resync_s: float = 300.0
    """How often every run's directory is listed anyway (a dropped file event is caught by then)."""
    alerts: AlertConfig = AlertConfig()

    def __post_init__(self) -> None:
        if isinstance(self.root, Path) and not self.root.is_dir():
            raise ValueError(f"{self.root}: no such directory (expected a runwatch root)")
        if isinstance(self.root, str) and self.state is None:
            raise ValueError(f"--root {self.root}: an object-store root needs --state PATH (a local file: the alerts "
                             "sent and waiting are kept on this machine, not in the bucket)")
        if not self.interval_s > 0 or not self.resync_s > 0 or (self.poll_s is not None and not self.poll_s > 0):
            raise ValueError("--interval, --poll and the resync period must be > 0 seconds")

    @property
    def state_path(self) -> Path:
        return self.state if self.state is not None else self.root / STATE_NAME


@contextmanager
def state_lock(path: Path) -> Iterator[None]:
    """Hold the state file's lock (one watch per state), or fail at once naming the file."""
    try:
        import fcntl
    except ImportError:  # no advisory locks (Windows): run one watch per state by hand
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            raise RuntimeError(f"{path}: another runwatch watch holds this state file") from err
        yield


def _watched(meta: dict) -> bool:
    """Archived imports are not on call; recorded runs are."""
    return not str(meta.get("source") or "").startswith("import")


def _written_since(store: Store, run: str, since: float | None) -> bool:
    """Whether a run's files changed since the last pass (None: there was none, and an ended run is history, not
    news): one that ended between two passes is judged once on its last rows, which may hold what ended it."""
    updated = store.last_update(run)
    return since is not None and updated is not None and updated >= since


def run_once(cfg: WatchConfig, book: AlertBook, notifier: Notifier, out=sys.stdout, err=sys.stderr) -> int:
    """One pass for cron; see the module docstring."""
    judged, action, errors = 0, 0, 0
    reopen, since, started = book.open_runs(), book.last_pass, time.time()
    with Store(cfg.root) as store:
        for run in store.run_names():
            try:
                meta = store.meta(run)
                if not _watched(meta) or not store.has_run(run):
                    continue
                events = store.events(run)
                if run not in reopen and not is_live(meta, events) and not _written_since(store, run, since):
                    continue
                report = judge_run(store, run)
                oncall = read_oncall(events)
            except (ValueError, OSError, StoreError) as exc:
                errors += 1
                print(f"runwatch watch: {run}: {exc}", file=err)
                continue
            judged += 1
            action += report.health in ("action needed", "stalled")
            book.update(run, report, oncall=oncall, checkpoints=checkpoints_from_events(events), meta=meta)
    book.last_pass = started  # what was written after this pass began is judged at the next one
    lock = threading.Lock()
    sent = deliver_due(book, notifier, lock, force=True)
    for attempt in range(1, ONCE_ATTEMPTS):
        if not book.outbox:
            break
        time.sleep(backoff(attempt))
        sent += deliver_due(book, notifier, lock, force=True)
    book.save(cfg.state_path)
    print(f"runwatch watch: {judged} run(s) judged, {action} need action; {sent} message(s) delivered, "
          f"{len(book.outbox)} waiting", file=out)
    if book.outbox:
        print(f"runwatch watch: {len(book.outbox)} message(s) could not be delivered; kept in {cfg.state_path} "
              "for the next pass", file=err)
    return EXIT_ERROR if errors else EXIT_ACTION if action else EXIT_OK


class Watcher:
    """The long-running watch: file events and ticks in, alerts out (see the module docstring)."""

    def __init__(self, cfg: WatchConfig, book: AlertBook, notifier: Notifier) -> None:
        self.cfg, self.book = cfg, book
        self.lock = threading.RLock()
        self.follower = RunFollower(cfg.root, poll_seconds=cfg.poll_s)
        self.sender = Sender(book, notifier, self.lock, on_change=self.save)
        self._stop = threading.Event()
        self.num_judgements = 0

    def save(self) -> None:
        with self.lock:
            self.book.save(self.cfg.state_path)

    def judge(self, runs: set[str], now: float | None = None) -> int:
        """Judge the runs with the streaming analyser and queue their messages; returns how many."""
        queued = 0
        for run in sorted(runs):
            fr = self.follower.runs.get(run)
            if fr is None or not _watched(fr.meta) or run in self.follower.errors:
                continue
            report = self.follower.report(run, now)
            self.num_judgements += 1
            with self.lock:
                queued += self.book.update(run, report, now, read_oncall(fr.analyzer.events), meta=fr.meta,
                                           checkpoints=self.follower.checkpoints(run))
        with self.lock:
            self.book.last_pass = time.time() if now is None else now  # every change so far is judged
        if queued:
            self.save()  # before sending: a crash now loses nothing
            self.sender.wake()
        return queued

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self.sender.start()
        self.follower.start()
        # At start, as a cron pass: the runs that can still stall, those with an alert open, and those written
        # since the last pass of this state; a run that ended before is history (a fresh state: every ended one).
        with Store(self.cfg.root) as store:
            self.judge({r for r in self.follower.runs if self.follower.is_live(r) or r in self.book.open_runs()
                        or _written_since(store, r, self.book.last_pass)})
        next_tick = time.monotonic() + self.cfg.interval_s
        next_resync = time.monotonic() + self.cfg.resync_s
        listing_error = None
        while not self._stop.is_set():
            changed = self.follower.changes(timeout=max(next_tick - time.monotonic(), 0.0))
            if self.follower.listing_error != listing_error:  # an object store's outage, said once, and its end
                listing_error = self.follower.listing_error
                print(f"runwatch watch: {listing_error or 'listing works again'}", file=sys.stderr, flush=True)
            if time.monotonic() >= next_resync:
                changed |= self.follower.resync()
                next_resync = time.monotonic() + self.cfg.resync_s
            if time.monotonic() >= next_tick:
                # Silence has no file event: every run that can still stall, or has an alert open, is judged.
                changed |= {r for r, fr in self.follower.runs.items() if fr.meta.get("finished") is not True}
                changed |= self.book.open_runs() & set(self.follower.runs)
                next_tick = time.monotonic() + self.cfg.interval_s
            self.judge(changed)
        self.follower.stop()
        self.sender.stop()
        self.save()


def build_config(args: argparse.Namespace) -> WatchConfig:
    root = args.root if is_url(args.root) else Path(args.root).expanduser().resolve()
    return WatchConfig(root=root, notify=tuple(args.notify or ()), once=args.once,
                       state=Path(args.state).expanduser() if args.state else None, interval_s=args.interval,
                       poll_s=args.poll, alerts=AlertConfig(cooldown_s=args.cooldown, dashboard_url=args.dashboard_url))


def main(args: argparse.Namespace) -> int:
    """Entry point of ``runwatch watch``."""
    cfg = build_config(args)
    notifier = Notifier(cfg.notify)
    with state_lock(cfg.state_path):
        book = AlertBook.load(cfg.state_path, cfg.alerts, cfg.notify)
        if cfg.once:
            return run_once(cfg, book, notifier)
        watcher = Watcher(cfg, book, notifier)
        # systemd stops a service with SIGTERM: finish the current pass and save the state.
        signal.signal(signal.SIGTERM, lambda signum, frame: watcher.stop())
        how = ("listing every %g s" % (cfg.poll_s or RunFollower.LISTING_SECONDS) if isinstance(cfg.root, str)
               else "polling every %g s" % cfg.poll_s if cfg.poll_s else "inotify")
        print(f"runwatch watch: following {cfg.root} ({how}), "
              f"{len(cfg.notify)} target(s), state {cfg.state_path}; Ctrl-C stops it", flush=True)
        try:
            watcher.run()
        except KeyboardInterrupt:
            watcher.stop()
            watcher.save()
        return EXIT_OK
