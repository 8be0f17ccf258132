"""The pool pings a connection at checkout only after it sat idle (services/connections.py,
`ping_when_idle`): one that died meanwhile is replaced without failing the request, and one used
a moment ago goes out at once, without the round trip that was a sixth of a refused key's CPU."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from extensions import db
from services import connections
from services.connections import ping_when_idle


@pytest.fixture
def engine(app):
    with app.app_context():
        url = db.engine.url
    engine = create_engine(url, pool_size=1, max_overflow=0)
    ping_when_idle(engine)
    pings = []
    real_ping = engine.dialect.do_ping
    engine.dialect.do_ping = lambda dbapi_connection: pings.append(1) or real_ping(dbapi_connection)
    engine.pings = pings
    yield engine
    engine.dispose()


def backend_pid(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(text("SELECT pg_backend_pid()")).scalar_one()


def terminate(engine, pid: int) -> None:
    killer = create_engine(engine.url, poolclass=None)
    try:
        with killer.begin() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    finally:
        killer.dispose()


def test_a_connection_that_died_while_idle_is_replaced_at_checkout(engine, monkeypatch):
    monkeypatch.setattr(connections, "PING_AFTER_IDLE_SECONDS", 0.2)
    first = backend_pid(engine)
    terminate(engine, first)
    time.sleep(0.3)
    # The checkout's ping finds it dead; the pool connects anew and the statement runs.
    assert backend_pid(engine) != first
    assert engine.pings


def test_a_connection_used_a_moment_ago_goes_out_without_a_ping(engine):
    backend_pid(engine)
    engine.pings.clear()
    for _ in range(5):
        backend_pid(engine)
    assert engine.pings == []
