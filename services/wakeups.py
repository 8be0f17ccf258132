"""Wake-ups through PostgreSQL: "a brand has new events (and perhaps deliveries due)".

Publishing side: `note_published(brand_id)` is called in the transaction that wrote an event
or a delivery (services/events.py). Once that transaction commits, the brand ids go to this
process's notifier thread, which sends them as one `NOTIFY brand_api_wakeups` on its own
connection, coalescing the commits made while it was busy. The committing request never waits
for it, and NOTIFY's commit-time lock (every notifying transaction of a database takes it in
turn) stays off the request's own commit.

Listening side: one `WakeupListener` per process holds a connection that LISTENs and hands
each notification to its subscribers (the delivery loop, long-polling event readers).

A wake-up is a hint, never the record. A notification lost (the process died between its
commit and the notify, the listener was reconnecting) costs its readers one poll interval: each
of them reads the database again on a timer of its own, and after a reconnect the listener
tells its subscribers "anything may have happened" (`None`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable

import psycopg
from flask import Flask, current_app
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from extensions import db

log = logging.getLogger("brand_api.wakeups")

CHANNEL = "brand_api_wakeups"
# session.info key under which the brands to notify are collected until the commit.
_NOTED = "brand_api_brands_to_notify"
# NOTIFY payloads must stay under 8000 bytes; brand ids are about 30 characters.
PAYLOAD_MAX_BYTES = 7000
# The notifier's rest between two rounds: what commits meanwhile goes out in one NOTIFY.
NOTIFY_ROUND_PAUSE_SECONDS = 0.005
RECONNECT_MAX_SECONDS = 5.0

# What a subscriber is called with: the brands notified, or None for "anything".
Subscriber = Callable[[frozenset[str] | None], None]


def note_published(brand_id: str) -> None:
    """The current transaction wrote an event or a delivery of the brand: notify after COMMIT."""
    db.session.info.setdefault(_NOTED, set()).add(brand_id)


def install() -> None:
    """Hand noted brands to the notifier after each commit (once per process: the listener is
    on SQLAlchemy's Session class, shared by every app in it)."""
    if not event.contains(Session, "after_commit", _after_commit):
        event.listen(Session, "after_commit", _after_commit)
        event.listen(Session, "after_soft_rollback", _after_rollback)


def _after_commit(session: Session) -> None:
    brand_ids = session.info.pop(_NOTED, None)
    if brand_ids:
        notifier().add(session.get_bind().engine, brand_ids)


def _after_rollback(session: Session, previous_transaction) -> None:
    session.info.pop(_NOTED, None)


_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


def payloads(brand_ids: Iterable[str]) -> list[str]:
    """The brand ids as space-separated NOTIFY payloads, each under PAYLOAD_MAX_BYTES."""
    chunks: list[str] = []
    current = ""
    for brand_id in sorted(set(brand_ids)):
        if current and len(current) + 1 + len(brand_id) > PAYLOAD_MAX_BYTES:
            chunks.append(current)
            current = ""
        current = f"{current} {brand_id}" if current else brand_id
    if current:
        chunks.append(current)
    return chunks


def send_now(engine: Engine, brand_ids: Iterable[str]) -> None:
    """NOTIFY the brands on a connection of `engine`'s pool, outside any transaction."""
    chunks = payloads(brand_ids)
    if not chunks:
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        for payload in chunks:
            connection.execute(_NOTIFY, {"channel": CHANNEL, "payload": payload})


class Notifier:
    """One thread per process that sends the wake-ups committed transactions asked for."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._pending: dict[Engine, set[str]] = {}
        self._busy = False
        self._thread: threading.Thread | None = None

    def add(self, engine: Engine, brand_ids: Iterable[str]) -> None:
        with self._changed:
            self._pending.setdefault(engine, set()).update(brand_ids)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="wakeups", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every wake-up added so far was sent (or given up); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._pending or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
        return True

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._pending:
                    self._changed.wait()
                batch, self._pending = self._pending, {}
                self._busy = True
            try:
                for engine, brand_ids in batch.items():
                    send_now(engine, brand_ids)
            except Exception as error:  # a hint lost: the readers' own polls cover it
                log.warning("could not send a wake-up (%s); readers poll", type(error).__name__)
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()
            time.sleep(NOTIFY_ROUND_PAUSE_SECONDS)


class WakeupListener:
    """One connection per process that LISTENs and passes each wake-up to its subscribers, on
    its own thread (a subscriber must return at once: hand the news to a loop or a waiter)."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wakeup-listener", daemon=True)
        self._thread.start()

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Call `subscriber` on every wake-up from now on; returns what unsubscribes it."""
        with self._lock:
            self._subscribers.append(subscriber)

        def unsubscribe() -> None:
            with self._lock:
                if subscriber in self._subscribers:
                    self._subscribers.remove(subscriber)

        return unsubscribe

    def wait_listening(self, timeout: float) -> bool:
        """True once the listener is connected and LISTENing (tests, start-up)."""
        return self._listening.wait(timeout)

    def _tell(self, brand_ids: frozenset[str] | None) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            try:
                subscriber(brand_ids)
            except Exception:
                log.exception("a wake-up subscriber failed")

    def _run(self) -> None:
        pause = 0.2
        lost = False
        while True:
            try:
                with psycopg.connect(
                    self._conninfo, autocommit=True, application_name=_connection_name()
                ) as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self._listening.set()
                    pause = 0.2
                    if lost:
                        self._tell(None)  # what was notified while away is unknown
                    for notify in connection.notifies():
                        self._tell(frozenset(notify.payload.split()))
            except Exception as error:
                self._listening.clear()
                if not lost:
                    log.warning(
                        "wake-up listener lost its connection (%s); reconnecting",
                        type(error).__name__,
                    )
                lost = True
                self._tell(None)
                time.sleep(pause)
                pause = min(pause * 2, RECONNECT_MAX_SECONDS)


def _connection_name() -> str:
    return f"brand-api pid={os.getpid()} listener"


def conninfo_for(engine: Engine) -> str:
    """A libpq URL for psycopg from the SQLAlchemy engine's URL."""
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


_notifier = Notifier()
_listeners: dict[str, WakeupListener] = {}
_listeners_lock = threading.Lock()


def notifier() -> Notifier:
    return _notifier


def listener_for(app: Flask | None = None) -> WakeupListener:
    """This process's listener for the app's database, started on first use."""
    app = app or current_app._get_current_object()  # type: ignore[attr-defined]  # a LocalProxy
    with app.app_context():
        conninfo = conninfo_for(db.engine)
    with _listeners_lock:
        listener = _listeners.get(conninfo)
        if listener is None:
            listener = _listeners[conninfo] = WakeupListener(conninfo)
        return listener


def _fresh_after_fork() -> None:
    # A forked child (a gunicorn worker) has none of its parent's threads, and a lock taken in
    # the parent at the fork would stay taken: it starts with its own notifier and listeners.
    global _notifier, _listeners, _listeners_lock
    _notifier = Notifier()
    _listeners = {}
    _listeners_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_after_fork)
