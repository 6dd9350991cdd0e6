"""Delivering ``runwatch watch``'s messages through apprise, retried with back-off, never blocking the watching.

One apprise object per target URL (Slack, PagerDuty, Discord, e-mail, or a
plain JSON webhook: ``json://host:port/path`` posts ``{version, title,
message, type, ...}``). ``deliver_due`` tries every outbox entry that is due;
a failure keeps the entry with its next try pushed back (1, 2, 4 ... s, at
most ``MAX_BACKOFF_S``) and is counted. Nothing is ever dropped: an entry
leaves the outbox only when its target accepted it. ``Sender`` runs that in
its own thread for the long-running watch, so a notifier that is down or
slow never holds up reading files and judging runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from runwatch.app import escape
from runwatch.app.alerts import AlertBook, url_key

BASE_BACKOFF_S = 1.0
MAX_BACKOFF_S = 300.0
"""Retries of an undelivered message back off 1, 2, 4 ... seconds up to five minutes."""


class Notifier:
    """The configured targets, by the key the alert book knows them under."""

    def __init__(self, urls: Sequence[str]) -> None:
        try:
            import apprise
        except ImportError as err:  # a declared dependency; a broken install says so
            raise RuntimeError("runwatch watch needs apprise: pip install apprise") from err
        self._apprise = apprise
        self.targets: dict[str, object] = {}
        for url in urls:
            target = apprise.Apprise()
            if not target.add(url):
                # Never echo the URL back: it holds the webhook's secret.
                raise ValueError(f"--notify {_redact(url)}: not a notification URL apprise understands "
                                 "(e.g. json://host:port/path, slack://..., pagerduty://...)")
            self.targets[url_key(url)] = target

    def send(self, target: str, title: str, body: str, kind: str) -> bool:
        """One delivery attempt; True when the target accepted it."""
        notifier = self.targets.get(target)
        if notifier is None:
            return False
        types = {"failure": self._apprise.NotifyType.FAILURE, "warning": self._apprise.NotifyType.WARNING,
                 "success": self._apprise.NotifyType.SUCCESS}
        # Plain text holding text from logs and run.json: apprise escapes it for Slack, not for every target
        # (Discord renders links and mentions), so it is made inert here, once for all (``escape.notification``).
        return bool(notifier.notify(title=escape.notification(title), body=escape.notification(body),
                                    notify_type=types.get(kind, self._apprise.NotifyType.INFO),
                                    body_format=self._apprise.NotifyFormat.TEXT))


def _redact(url: str) -> str:
    scheme = url.split("://", 1)[0] if "://" in url else "?"
    return f"{scheme}://..."


def backoff(attempts: int) -> float:
    return min(BASE_BACKOFF_S * 2 ** max(attempts - 1, 0), MAX_BACKOFF_S)


def deliver_due(book: AlertBook, notifier: Notifier, lock: threading.Lock | threading.RLock, *,
                now: Callable[[], float] = time.time, force: bool = False) -> int:
    """Try each due outbox entry once (all of them with ``force``); returns how many were delivered."""
    with lock:
        due = [e for e in book.outbox if force or e["next_try"] <= now()]
    delivered = 0
    for entry in due:
        ok = notifier.send(entry["target"], entry["title"], entry["body"], entry["type"])  # outside the lock
        with lock:
            if ok:
                book.outbox = [e for e in book.outbox if e is not entry]
                book.counters["delivered"] += 1
                book.counters["delivered_after_retry"] += entry["attempts"] > 0
                delivered += 1
            else:
                entry["attempts"] += 1
                entry["next_try"] = now() + backoff(entry["attempts"])
                book.counters["failed_attempts"] += 1
    return delivered


class Sender(threading.Thread):
    """Delivers the outbox in the background; ``wake()`` when something was queued."""

    def __init__(self, book: AlertBook, notifier: Notifier, lock: threading.RLock,
                 on_change: Callable[[], None]) -> None:
        super().__init__(name="runwatch-notify", daemon=True)
        self.book, self.notifier, self.lock, self.on_change = book, notifier, lock, on_change
        self._wake = threading.Event()
        self._stopping = threading.Event()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            with self.lock:
                pending = [e["next_try"] for e in self.book.outbox]
            wait = None if not pending else max(min(pending) - time.time(), 0.0)
            self._wake.wait(timeout=wait)
            self._wake.clear()
            if self._stopping.is_set():
                return
            before = (len(self.book.outbox), self.book.counters["failed_attempts"])
            deliver_due(self.book, self.notifier, self.lock)
            if (len(self.book.outbox), self.book.counters["failed_attempts"]) != before:
                self.on_change()
