"""The statements on the hottest paths go to psycopg directly: a postback's two (its API key's
lookup and the postback itself) and the worker's settling of successful attempts. Each runs on
the session's own connection, inside its transaction, which the caller commits as always.
Every other statement goes through SQLAlchemy.

Why: SQLAlchemy's work around each execution (an execution context, a result whose metadata is
read from `cursor.description` every time for a textual statement, row processing) was 13% of a
postback's CPU, counted in instructions with callgrind (4.27 -> 3.74 million per postback), and
the postback benchmark's latency at half load is bound by each worker's CPU
(docs/benchmarks.md, "Conversion postbacks").

What SQLAlchemy does around an execution is kept: a driver error is raised as the same
`sqlalchemy.exc.DBAPIError` subclass with its parameters hidden, and a connection lost midway is
invalidated, so the error handlers answer as they do for any other statement. A statement is
written once, as SQLAlchemy Core or `text()`, and compiled for psycopg by `psycopg_sql`. No
SQLAlchemy type processes the parameters: the caller passes what psycopg adapts as it is
(`psycopg.types.json.Json` for a JSON column, an aware datetime for a timestamp).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
import sqlalchemy.exc
from sqlalchemy import Connection
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.sql import ClauseElement

_DIALECT = psycopg_dialect()


def psycopg_sql(statement: ClauseElement) -> str:
    """`statement` as psycopg runs it on PostgreSQL (`%(name)s` placeholders, `%` doubled);
    compiled once, at import, by the module that runs it."""
    return str(statement.compile(dialect=_DIALECT))


def fetch_first_on_psycopg(
    connection: Connection, sql: str, params: Mapping[str, Any] | Sequence[Any]
) -> tuple | None:
    """Run `sql` (psycopg placeholders: `%(name)s` or `%s`) on `connection` (the session's, on
    PostgreSQL) in its transaction; its first row as a tuple, or None when it returned none."""
    return _run_on_psycopg(connection, sql, params, lambda cursor: cursor.fetchone())


def fetch_all_on_psycopg(
    connection: Connection, sql: str, params: Mapping[str, Any] | Sequence[Any]
) -> list[tuple]:
    """As `fetch_first_on_psycopg`, every row."""
    return _run_on_psycopg(connection, sql, params, lambda cursor: cursor.fetchall())


def _run_on_psycopg(connection: Connection, sql: str, params, fetch):
    dbapi_connection = connection.connection  # the pool's proxy; its transaction is the session's
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(sql, params)
        return fetch(cursor)
    except psycopg.Error as error:
        # SQLAlchemy's types name a DB-API error by a class of its own, not the driver's.
        lost = connection.dialect.is_disconnect(error, dbapi_connection, cursor)  # type: ignore[arg-type]
        if lost:
            connection.invalidate(error)
        raise sqlalchemy.exc.DBAPIError.instance(
            sql,
            params,
            error,
            psycopg.Error,
            hide_parameters=True,
            connection_invalidated=lost,
            dialect=connection.dialect,
        ) from error
    finally:
        cursor.close()
