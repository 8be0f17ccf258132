"""What every database connection of the service carries so that a dead peer is noticed in
seconds, not hours (issue 34): TCP keepalives and a user timeout, given to libpq at connect (the
app's engine, the wake-up listener), and a way to shut a connection whose call is stuck on a
peer that will never answer (a connection gone half-open, where no timeout of the server's can
fire because the server never hears the question).

With the kernel's defaults a half-open connection is noticed after about two hours; with these,
an idle one within about 20 s (10 s idle, then 3 probes 3 s apart) and one waiting for an
answer to data it sent within `tcp_user_timeout`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from sqlalchemy import Engine, event, exc

if TYPE_CHECKING:  # only annotated here: app.py imports KEEPALIVES, which a command needs early
    import psycopg

log = logging.getLogger("brand_api.database")

KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
    "tcp_user_timeout": 20_000,  # milliseconds
}


# A pooled connection given back less than this long ago is handed out without a ping.
PING_AFTER_IDLE_SECONDS = 1.0


def ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection at checkout only when it has been idle for a while, in place
    of SQLAlchemy's `pool_pre_ping`, which pings at every checkout: a round trip and about a
    sixth of the CPU of a refused API key (docs/benchmarks.md, "Admission"). A connection used a
    moment ago is alive; one that died within that moment fails its request (503, as any
    connection lost midway) and SQLAlchemy then renews the whole pool."""

    @event.listens_for(engine, "connect")
    @event.listens_for(engine, "checkin")
    def _note_use(dbapi_connection, record) -> None:
        record.info["used_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_connection, record, proxy) -> None:
        if time.monotonic() - record.info.get("used_at", 0.0) < PING_AFTER_IDLE_SECONDS:
            return
        dialect = engine.dialect
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as error:
            if dialect.is_disconnect(error, dbapi_connection, None):
                raise exc.DisconnectionError() from error  # the pool connects anew and retries
            raise


def shut_socket(connection: psycopg.Connection) -> None:
    """Shut the connection's socket from any thread: a call blocked on it fails at once. A
    connection over a Unix socket (the embedded PostgreSQL) is shut the same way."""
    try:
        with socket.socket(fileno=os.dup(connection.pgconn.socket)) as duplicate:
            duplicate.shutdown(socket.SHUT_RDWR)
    except OSError:
        log.warning("could not shut a stuck database connection", exc_info=True)


@contextlib.contextmanager
def shut_if_stuck(connection: psycopg.Connection, seconds: float) -> Iterator[None]:
    """Within the block, a call on `connection` that takes longer than `seconds` has its socket
    shut (and then fails)."""
    timer = threading.Timer(seconds, shut_socket, args=(connection,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
