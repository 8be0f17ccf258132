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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import psycopg
import sqlalchemy.exc
from psycopg.pq import ExecStatus
from sqlalchemy import Connection
from sqlalchemy.dialects.postgresql.psycopg import dialect as psycopg_dialect
from sqlalchemy.sql import ClauseElement

_DIALECT = psycopg_dialect()
TUPLES_OK = ExecStatus.TUPLES_OK


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


@dataclass(frozen=True)
class RawStatement:
    """A statement in PostgreSQL's own `$n` placeholders, made once from one written with
    psycopg's `%(name)s`: run on a RawCursor, psycopg sends it as it is. Its own conversion is
    cached only for statements under 4 KB (`MAX_CACHED_STATEMENT_LENGTH`), and the delivery
    round's are longer: parsing them at every execution cost a round 0.2 ms."""

    sql: str
    names: tuple[str, ...]

    @classmethod
    def of(cls, sql: str) -> RawStatement:
        names: list[str] = []

        def number(match: re.Match) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        return cls(re.sub(r"%\((\w+)\)s", number, sql), tuple(names))

    def values(self, params: Mapping[str, Any]) -> list[Any]:
        return [params[name] for name in self.names]


def run_pipeline(
    connection: Connection,
    statements: Sequence[tuple[RawStatement, Mapping[str, Any]]],
    *,
    commit: bool,
) -> list[list[tuple]]:
    """Run the statements on `connection` (the session's) in one exchange with the server
    (psycopg's pipeline mode), then COMMIT in the same exchange when `commit`: every row of
    each. The session's transaction is over then; a statement that fails is raised as for
    `fetch_all_on_psycopg`, the transaction left for the caller to roll back."""
    dbapi_connection = connection.connection
    raw = cast(psycopg.Connection, dbapi_connection.driver_connection)
    cursors = []
    try:
        with raw.pipeline():
            for statement, params in statements:
                cursor = psycopg.RawCursor(raw)
                cursor.execute(statement.sql, statement.values(params))
                cursors.append(cursor)
            if commit:
                raw.commit()
        return [
            cursor.fetchall() if cursor.pgresult.status == TUPLES_OK else []  # type: ignore[union-attr]
            for cursor in cursors
        ]
    except psycopg.Error as error:
        sql = "; ".join(statement.sql for statement, _ in statements)
        raise _as_sqlalchemy_error(connection, error, sql, {}, None) from error
    finally:
        for cursor in cursors:
            cursor.close()


def _run_on_psycopg(connection: Connection, sql: str, params, fetch):
    dbapi_connection = connection.connection  # the pool's proxy; its transaction is the session's
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(sql, params)
        return fetch(cursor)
    except psycopg.Error as error:
        raise _as_sqlalchemy_error(connection, error, sql, params, cursor) from error
    finally:
        cursor.close()


def commit_on_psycopg(connection: Connection) -> None:
    """Commit the transaction on `connection` now, failing as SQLAlchemy's commit would; its own
    commit afterwards finds nothing left to commit."""
    try:
        cast(psycopg.Connection, connection.connection.driver_connection).commit()
    except psycopg.Error as error:
        raise _as_sqlalchemy_error(connection, error, "COMMIT", {}, None) from error


def _as_sqlalchemy_error(connection: Connection, error: psycopg.Error, sql: str, params, cursor):
    """SQLAlchemy's types name a DB-API error by a class of its own, not the driver's; a lost
    connection is invalidated as SQLAlchemy would."""
    lost = connection.dialect.is_disconnect(error, connection.connection, cursor)  # type: ignore[arg-type]
    if lost:
        connection.invalidate(error)
    return sqlalchemy.exc.DBAPIError.instance(
        sql,
        params,
        error,
        psycopg.Error,
        hide_parameters=True,
        connection_invalidated=lost,
        dialect=connection.dialect,
    )
