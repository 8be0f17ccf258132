"""The PostgreSQL and Redis a test run uses, and how it gives them back.

`BRAND_TEST_BACKENDS` chooses:
- `auto` (default): PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379 when they answer,
  else an embedded PostgreSQL and the embedded Redis (a newcomer's laptop);
- `services`: PostgreSQL and Redis, and fail if either is missing (what CI runs first);
- `embedded`: the embedded PostgreSQL and Redis even when the services exist (CI's second run).

Either way the suite runs on PostgreSQL, the one database the service supports. It never
touches data it did not create: it makes a database of its own (dropped at the end) and claims
a Redis db number only when that db is empty (flushed at the end). An embedded PostgreSQL gets
a fresh data directory, and is stopped and removed at the end.
"""

from __future__ import annotations

import os
import secrets
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psycopg
import redis

from services.wakeups import notifier
from workers.embedded_postgres import EmbeddedPostgres
from workers.embedded_redis import EmbeddedRedis

PG_HOST = os.environ.get("TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("TEST_PG_PORT", "5432"))
PG_MAINTENANCE_DB = os.environ.get("TEST_PG_DATABASE", "test")
REDIS_HOST = os.environ.get("TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("TEST_REDIS_PORT", "6379"))
CLAIM_KEY = "brand-api-test:claimed-by"


class PostgresServer(Protocol):
    """Where test databases are made: the machine's server or an embedded one."""

    def connect_maintenance(self) -> psycopg.Connection: ...

    def url(self, database: str) -> str: ...


@dataclass
class Backends:
    database_url: str
    redis_url: str
    postgres_kind: str  # "server" or "embedded"
    redis_kind: str  # "server" or "embedded"
    postgres: PostgresServer
    _cleanups: list = field(default_factory=list)

    def close(self) -> None:
        # Wake-ups this process still holds go out first, while their database exists.
        notifier().flush(timeout=10)
        for cleanup in reversed(self._cleanups):
            with suppress(Exception):
                cleanup()


def choose() -> str:
    mode = os.environ.get("BRAND_TEST_BACKENDS", "auto")
    if mode not in {"auto", "services", "embedded"}:
        raise RuntimeError(f"BRAND_TEST_BACKENDS must be auto, services or embedded, not {mode}")
    return mode


def open_backends(workdir: Path) -> Backends:
    mode = choose()
    pg_user = None if mode == "embedded" else _postgres_user()
    redis_db = None if mode == "embedded" else _claimable_redis()
    if mode == "services" and (pg_user is None or redis_db is None):
        raise RuntimeError(
            "BRAND_TEST_BACKENDS=services but PostgreSQL on "
            f"{PG_HOST}:{PG_PORT} or Redis on {REDIS_HOST}:{REDIS_PORT} is not reachable"
        )
    cleanups: list = []
    try:
        if pg_user is not None:
            postgres: PostgresServer = MachinePostgres(pg_user)
            postgres_kind = "server"
        else:
            postgres = _start_embedded_postgres(workdir, cleanups)
            postgres_kind = "embedded"
        database_url = create_database(postgres, cleanups)
        if redis_db is not None:
            redis_url = _claim_redis_db(redis_db, cleanups)
            redis_kind = "server"
        else:
            redis_url = _start_embedded_redis(workdir, cleanups)
            redis_kind = "embedded"
    except BaseException:
        for cleanup in reversed(cleanups):
            with suppress(Exception):
                cleanup()
        raise
    return Backends(database_url, redis_url, postgres_kind, redis_kind, postgres, cleanups)


@contextmanager
def scratch_database(backends: Backends) -> Iterator[str]:
    """A second, empty database on the same server (for migration tests), dropped afterwards."""
    cleanups: list = []
    url = create_database(backends.postgres, cleanups)
    try:
        yield url
    finally:
        for cleanup in cleanups:
            cleanup()


def create_database(postgres: PostgresServer, cleanups: list) -> str:
    name = f"brand_api_test_{os.getpid()}_{secrets.token_hex(4)}"
    with postgres.connect_maintenance() as connection:
        connection.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with postgres.connect_maintenance() as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    cleanups.append(drop)
    return postgres.url(name)


@dataclass(frozen=True)
class MachinePostgres:
    """The PostgreSQL server the machine runs (CI's, or a developer's own)."""

    user: str

    def connect_maintenance(self) -> psycopg.Connection:
        return psycopg.connect(_pg_dsn(self.user, PG_MAINTENANCE_DB), autocommit=True)

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@{PG_HOST}:{PG_PORT}/{database}"


class EmbeddedTestPostgres:
    """An embedded server of the run's own, in a fresh data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.server = EmbeddedPostgres(data_dir)

    def connect_maintenance(self) -> psycopg.Connection:
        return self.server.connect(autocommit=True)

    def url(self, database: str) -> str:
        return self.server.url(database)

    def remove(self) -> None:
        self.server.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _start_embedded_postgres(workdir: Path, cleanups: list) -> EmbeddedTestPostgres:
    postgres = EmbeddedTestPostgres(workdir / "postgres")
    cleanups.append(postgres.remove)
    return postgres


def _postgres_user() -> str | None:
    for user in (os.environ.get("TEST_PG_USER"), "postgres", "root"):
        if not user:
            continue
        try:
            with psycopg.connect(_pg_dsn(user, PG_MAINTENANCE_DB), connect_timeout=3):
                return user
        except psycopg.Error:
            continue
    return None


def _pg_dsn(user: str, dbname: str) -> str:
    return f"host={PG_HOST} port={PG_PORT} user={user} dbname={dbname}"


def _claimable_redis() -> int | None:
    """The highest-numbered empty Redis db, or None when Redis does not answer."""
    try:
        probe = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_connect_timeout=2)
        probe.ping()
        # redis-py types a reply of its synchronous client as possibly awaitable.
        databases = int(probe.config_get("databases").get("databases", 16))  # type: ignore[union-attr]
    except redis.RedisError:
        return None
    for number in range(databases - 1, 0, -1):
        if redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=number).dbsize() == 0:
            return number
    return None


def _claim_redis_db(number: int, cleanups: list) -> str:
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=number)
    token = f"{os.getpid()}:{uuid.uuid4()}"
    if not client.set(CLAIM_KEY, token, nx=True) or client.dbsize() != 1:
        raise RuntimeError(f"Redis db {number} was taken while claiming it; run the tests again")

    def release() -> None:
        # Ours since we claimed it empty; flush only while our claim still stands.
        if client.get(CLAIM_KEY) == token.encode():
            client.flushdb()

    cleanups.append(release)
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{number}"


def _start_embedded_redis(workdir: Path, cleanups: list) -> str:
    server = EmbeddedRedis(workdir / "redis.db")
    cleanups.append(server.stop)
    return f"{server.url}?db=0"
