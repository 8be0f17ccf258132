"""Wake-ups through PostgreSQL: "a brand has new events (and perhaps deliveries due)".

Publishing side: every statement that writes an event also sends `NOTIFY brand_api_wakeups`
with the brand's id, in the same transaction (services/events.py builds it into the statement:
no extra round trip). PostgreSQL delivers it when, and only if, that transaction commits.

Listening side: one `WakeupListener` per process holds a connection that LISTENs and hands
each notification to its subscribers (the delivery loop, long-polling event readers).

A wake-up is a hint, never the record. One missed (the listener was reconnecting) costs its
readers one poll interval: each of them reads the database again on a timer of its own, and
after a reconnect the listener tells its subscribers "anything may have happened" (`None`).

Why inside the transaction: a NOTIFY sent afterwards from a thread of the publishing process
(this module's first version) costs a transaction of its own per round; at the postback
benchmark's rate those rounds took a tenth of the machine and its p99 past 600 ms. Inside, it
is part of a commit that happens anyway.

Except a postback's (`wake_after_commit`): at a notifying commit PostgreSQL takes one lock for
the whole server (every database) and holds it until the commit is on disk, so notifying
commits flush the WAL one at a time instead of together, and a slow flush holds all of them
(issue 42: a quarter of the busy samples of the postbacks' stalls waited on that lock, more on
the flush; docs/benchmarks.md, "Postbacks tail"). A postback's transaction commits without
it, and its wake-up follows on the same connection in a transaction of its own that does not
wait for the disk: the lock is then held for microseconds. Lost (the process died between the
two, or PostgreSQL crashed before the wake-up reached the disk), it costs what a missed
wake-up costs, above.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import cast

import psycopg
from flask import Flask, current_app
from sqlalchemy import Connection, text
from sqlalchemy.engine import Engine, make_url

from extensions import db
from services.connections import KEEPALIVES, shut_if_stuck
from services.psycopg_direct import commit_on_psycopg

log = logging.getLogger("brand_api.wakeups")

CHANNEL = "brand_api_wakeups"
RECONNECT_MAX_SECONDS = 5.0
# With no notification for this long, the listener checks its connection answers, within the
# deadline after it.
HEALTH_CHECK_SECONDS = 5.0
HEALTH_CHECK_DEADLINE_SECONDS = 5.0
# For statements that publish: `NOTIFY_BRAND_SQL.format(brand=<SQL expression>)`.
NOTIFY_BRAND_SQL = f"pg_notify('{CHANNEL}', {{brand}})"

# What a subscriber is called with: the brands notified, or None for "anything".
Subscriber = Callable[[frozenset[str] | None], None]


def notify_brand(brand_id: str) -> None:
    """Wake the brand's readers when the current transaction commits (for writes that do not
    publish through services/events.py's statements: a redelivery)."""
    db.session.execute(_NOTIFY, {"brand_id": brand_id})


_NOTIFY = text(f"SELECT {NOTIFY_BRAND_SQL.format(brand=':brand_id')}")

# Brands to wake once the connection's transaction has committed (its `info` lives as long as
# the database connection); sent by `send_wakeups_at_commit`, dropped at a rollback.
_WAKE_AFTER_COMMIT = "brand_api_wake_after_commit"
_WAKE = (
    "SELECT set_config('synchronous_commit', 'off', true), "  # noqa: S608 - constant SQL
    + NOTIFY_BRAND_SQL.format(brand="brand")
    + " FROM unnest(CAST(%s AS text[])) AS brand"
)


def wake_after_commit(connection: Connection, brand_id: str) -> None:
    """Wake the brand's readers after the transaction on `connection` commits, not in it (the
    module's doc says why): for the hottest publisher, a postback."""
    connection.info.setdefault(_WAKE_AFTER_COMMIT, set()).add(brand_id)


def send_wakeups_at_commit(connection: Connection) -> None:
    """The engine's `commit` event: commit, then send the wake-ups asked for, in a transaction
    of their own that does not wait for the disk. A failure of the commit is raised; one of the
    wake-ups only logged (the data is committed, and a wake-up is a hint)."""
    brands = connection.info.pop(_WAKE_AFTER_COMMIT, None)
    if not brands:
        return
    commit_on_psycopg(connection)
    raw = cast(psycopg.Connection, connection.connection.driver_connection)
    try:
        with raw.pipeline():  # one exchange: BEGIN, the NOTIFYs, COMMIT
            raw.execute(_WAKE, [sorted(brands)])
            raw.commit()
    except psycopg.Error as error:
        log.warning("wake-up after commit not sent (%s); readers poll", type(error).__name__)
        try:
            raw.rollback()
        except psycopg.Error:
            connection.invalidate(error)


def forget_wakeups(connection: Connection) -> None:
    """The engine's `rollback` event: nothing was committed, nobody is woken."""
    if not connection.invalidated:  # an invalidated one's database connection is gone, info too
        connection.info.pop(_WAKE_AFTER_COMMIT, None)


class WakeupListener:
    """One connection per process that LISTENs and passes each wake-up to its subscribers, on
    its own thread (a subscriber must return at once: hand the news to a loop or a waiter)."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self._listening = threading.Event()
        self._stopping = threading.Event()
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

    def stop(self) -> None:
        """Listen no more and say nothing of the connection's end (a test session about to drop
        its database). Returns at once: the thread ends when its connection next answers or
        fails, within HEALTH_CHECK_SECONDS."""
        self._stopping.set()

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
        while not self._stopping.is_set():
            try:
                with psycopg.connect(
                    psycopg.conninfo.make_conninfo(
                        self._conninfo, application_name=_connection_name("listener"), **KEEPALIVES
                    ),
                    autocommit=True,
                ) as connection:
                    connection.execute(f"LISTEN {CHANNEL}")
                    self._listening.set()
                    pause = 0.2
                    # Whatever was notified while away is unknown: every subscriber reads again
                    # (long-poll waiters included), as after any reconnection.
                    self._tell(None)
                    self._listen(connection)
                    self._listening.clear()  # stopped, before the connection closes
            except Exception as error:
                self._listening.clear()
                if self._stopping.is_set():
                    return
                log.warning(
                    "wake-up listener lost its connection (%s); reconnecting in %gs",
                    type(error).__name__,
                    pause,
                )
                self._tell(None)
                time.sleep(pause)
                pause = min(pause * 2, RECONNECT_MAX_SECONDS)

    def _listen(self, connection: psycopg.Connection) -> None:
        """Pass on notifications until the connection fails. When none came for a while, the
        connection is asked something, under a deadline: one gone half-open (a failover, a
        network that dropped it silently) answers nothing, and is then shut and replaced."""
        while not self._stopping.is_set():
            for notify in connection.notifies(timeout=HEALTH_CHECK_SECONDS):
                self._tell(frozenset(notify.payload.split()))
            with shut_if_stuck(connection, HEALTH_CHECK_DEADLINE_SECONDS):
                connection.execute("SELECT 1")


def _connection_name(role: str) -> str:
    return f"brand-api pid={os.getpid()} {role}"


def conninfo_for(engine: Engine) -> str:
    """A libpq URL for psycopg from the SQLAlchemy engine's URL."""
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


def direct_conninfo(database_url: str) -> str:
    """A libpq URL for psycopg from a SQLAlchemy URL (`postgresql+psycopg://`)."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


_listeners: dict[str, WakeupListener] = {}
_listeners_lock = threading.Lock()


def listener_for(app: Flask | None = None) -> WakeupListener:
    """This process's listener for the app's database, started on first use."""
    app = app or current_app._get_current_object()  # type: ignore[attr-defined]  # a LocalProxy
    # PostgreSQL itself: a LISTEN belongs to a session, which a transaction pool does not keep.
    conninfo = direct_conninfo(app.extensions["settings"].database_direct_url)
    with _listeners_lock:
        listener = _listeners.get(conninfo)
        if listener is None:
            listener = _listeners[conninfo] = WakeupListener(conninfo)
        return listener


def stop_listeners() -> None:
    """Stop every listener of this process; the next `listener_for` starts a new one."""
    with _listeners_lock:
        stopping = list(_listeners.values())
        _listeners.clear()
    for listener in stopping:
        listener.stop()


def _fresh_after_fork() -> None:
    # A forked child (a gunicorn worker) has none of its parent's threads, and a lock taken in
    # the parent at the fork would stay taken: it starts with listeners of its own.
    global _listeners, _listeners_lock
    _listeners = {}
    _listeners_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_after_fork)
