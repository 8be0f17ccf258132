"""The postback's two hot statements run on psycopg directly (services.psycopg_direct): an error
there must look exactly like one from SQLAlchemy, so the error handlers answer as they do for any
other statement, and a lost connection must never go back into the pool.

PostgreSQL only, as the module is: the PostgreSQL run of `make test` (CI runs both) covers it."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy.exc
from sqlalchemy import Integer, bindparam, create_engine, text

from extensions import db
from services.psycopg_direct import fetch_first_on_psycopg, psycopg_sql

SECRET_LOOKING = "svc_live_not-a-real-key-but-never-echo-it"


@pytest.fixture
def on_postgresql(app):
    with app.app_context():
        yield
        db.session.remove()


def test_a_statement_runs_in_the_sessions_transaction(on_postgresql):
    connection = db.session.connection()
    connection.execute(text("CREATE TEMPORARY TABLE scratch (n int) ON COMMIT DROP"))
    connection.execute(text("INSERT INTO scratch VALUES (41)"))
    row = fetch_first_on_psycopg(
        connection, "UPDATE scratch SET n = n + %(step)s RETURNING n", {"step": 1}
    )
    assert row == (42,)
    # The session sees the driver's write: one transaction, not two.
    assert db.session.execute(text("SELECT n FROM scratch")).scalar() == 42
    assert fetch_first_on_psycopg(connection, "SELECT n FROM scratch WHERE n < 0", {}) is None


def test_psycopg_sql_writes_placeholders_and_doubles_percent_signs():
    statement = text("SELECT CAST(:value AS int) % 7").bindparams(bindparam("value", type_=Integer))
    assert psycopg_sql(statement) == "SELECT CAST(%(value)s::INTEGER AS int) %% 7"


def test_a_driver_error_is_sqlalchemys_and_hides_the_parameters(on_postgresql):
    connection = db.session.connection()
    with pytest.raises(sqlalchemy.exc.DataError) as raised:
        fetch_first_on_psycopg(
            connection,
            "SELECT length(%(secret)s::text) / %(zero)s::int",
            {"secret": SECRET_LOOKING, "zero": 0},
        )
    error = raised.value
    assert isinstance(error.orig, psycopg.errors.DivisionByZero)
    assert not error.connection_invalidated
    assert SECRET_LOOKING not in str(error) and SECRET_LOOKING not in repr(error)
    # The transaction is aborted, as after any failed statement; rolling back recovers it.
    db.session.rollback()
    assert fetch_first_on_psycopg(db.session.connection(), "SELECT 1", {}) == (1,)


def test_a_connection_lost_midway_is_invalidated_and_not_reused(on_postgresql):
    connection = db.session.connection()
    backend_pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    killer = create_engine(db.engine.url)
    try:
        with killer.begin() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend_pid})
    finally:
        killer.dispose()

    with pytest.raises(sqlalchemy.exc.OperationalError) as raised:
        fetch_first_on_psycopg(connection, "SELECT 1", {})
    # The flag the error handler reads to answer 503 SERVICE_UNAVAILABLE (blueprints.errors).
    assert raised.value.connection_invalidated
    assert connection.invalidated
    db.session.rollback()
    # The next statement gets a new connection from the pool, not the dead one.
    fresh = db.session.connection()
    assert fresh.exec_driver_sql("SELECT pg_backend_pid()").scalar() != backend_pid
