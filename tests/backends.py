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

The embedded servers keep their files in a directory of the run's own (`private_directory`),
never under pytest's base temp directory: as root, the embedded PostgreSQL runs as a user of its
own and reaches its data through the directories above it, which the package opens to others
(o+rx); every other pytest session that starts on the machine sets its `pytest-of-<user>`
directory back to 0700, and the server's next checkpoint then PANICs on `global/pg_control`
("Permission denied") and cannot restart. A server that dies all the same is reported once, by
`health_problem`, so the run can stop with the cause instead of erroring every test after it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psycopg
import redis

from workers.embedded_postgres import EmbeddedPostgres
from workers.embedded_redis import EmbeddedRedis, pid_alive

PG_HOST = os.environ.get("TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("TEST_PG_PORT", "5432"))
PG_MAINTENANCE_DB = os.environ.get("TEST_PG_DATABASE", "test")
REDIS_HOST = os.environ.get("TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("TEST_REDIS_PORT", "6379"))
CLAIM_KEY = "brand-api-test:claimed-by"
PRIVATE_DIRECTORY_PREFIX = "brand-api-test-"
# What the last lines of a PostgreSQL log say when the server went away.
_DEATH_NOTICE = re.compile(r"PANIC:|FATAL:|shutdown request|terminated by signal|shut down")
_LOG_PREFIX = re.compile(r"^\S+ \S+ \S+ \[\d+\] ")  # "2026-11-25 17:50:49.682 UTC [18555] "


class PostgresServer(Protocol):
    """Where test databases are made: the machine's server or an embedded one."""

    def connect_maintenance(self) -> psycopg.Connection: ...

    def url(self, database: str) -> str: ...

    def health_problem(self) -> str | None: ...


@dataclass
class Backends:
    database_url: str
    redis_url: str
    postgres_kind: str  # "server" or "embedded"
    redis_kind: str  # "server" or "embedded"
    postgres: PostgresServer
    _cleanups: list = field(default_factory=list)
    redis_server: EmbeddedRedis | None = None

    def health_problem(self) -> str | None:
        """Why the run cannot go on (a server it uses is gone), in one paragraph; else None."""
        problem = self.postgres.health_problem()
        if (
            problem is None
            and self.redis_server is not None
            and not pid_alive(self.redis_server.pid)
        ):
            problem = f"The embedded Redis of this run (pid {self.redis_server.pid}) has died."
        if problem is None and self.redis_server is None:
            try:
                redis.Redis.from_url(self.redis_url, socket_connect_timeout=3).ping()
            except redis.RedisError as error:
                problem = f"Redis at {self.redis_url} stopped answering: {error}"
        return problem

    def close(self) -> None:
        for cleanup in reversed(self._cleanups):
            with suppress(Exception):
                cleanup()


def choose() -> str:
    mode = os.environ.get("BRAND_TEST_BACKENDS", "auto")
    if mode not in {"auto", "services", "embedded"}:
        raise RuntimeError(f"BRAND_TEST_BACKENDS must be auto, services or embedded, not {mode}")
    return mode


def private_directory(purpose: str) -> Path:
    """A new directory of this process's own for a test server's files, outside pytest's base
    temp directory (see the module's docstring); whoever asks removes it."""
    return Path(tempfile.mkdtemp(prefix=f"{PRIVATE_DIRECTORY_PREFIX}{purpose}-"))


def open_backends() -> Backends:
    mode = choose()
    pg_user = None if mode == "embedded" else _postgres_user()
    redis_databases = None if mode == "embedded" else _redis_databases()
    if mode == "services" and (pg_user is None or redis_databases is None):
        raise RuntimeError(
            "BRAND_TEST_BACKENDS=services but PostgreSQL on "
            f"{PG_HOST}:{PG_PORT} or Redis on {REDIS_HOST}:{REDIS_PORT} is not reachable"
        )
    cleanups: list = []
    redis_server = None
    try:
        if pg_user is not None:
            postgres: PostgresServer = MachinePostgres(pg_user)
            postgres_kind = "server"
        else:
            postgres = start_embedded_postgres(cleanups)
            postgres_kind = "embedded"
        database_url = create_database(postgres, cleanups)
        if redis_databases is not None:
            redis_url = _claim_redis_db(redis_databases, cleanups)
            redis_kind = "server"
        else:
            redis_server = _start_embedded_redis(cleanups)
            redis_url = f"{redis_server.url}?db=0"
            redis_kind = "embedded"
    except BaseException:
        for cleanup in reversed(cleanups):
            with suppress(Exception):
                cleanup()
        raise
    return Backends(
        database_url, redis_url, postgres_kind, redis_kind, postgres, cleanups, redis_server
    )


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

    def health_problem(self) -> str | None:
        try:
            with psycopg.connect(_pg_dsn(self.user, PG_MAINTENANCE_DB), connect_timeout=3):
                return None
        except psycopg.Error as error:
            return f"PostgreSQL on {PG_HOST}:{PG_PORT} stopped answering: {error}".strip()


class EmbeddedTestPostgres:
    """An embedded server of the run's own, in a fresh directory of its own."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.data_dir = directory / "postgres"
        self.server = EmbeddedPostgres(self.data_dir)

    def connect_maintenance(self) -> psycopg.Connection:
        return self.server.connect(autocommit=True)

    def url(self, database: str) -> str:
        return self.server.url(database)

    def health_problem(self) -> str | None:
        if pid_alive(self.server.pid):
            try:
                with self.server.connect(connect_timeout=3):
                    return None
            except psycopg.Error as error:
                state = f"is running but refuses connections ({error})"
        else:
            state = "has died"
        return (
            f"The embedded PostgreSQL of this run (pid {self.server.pid}) {state}; its log "
            f"says: {self.last_words()} (log kept in {self.data_dir / 'log'})"
        )

    def last_words(self) -> str:
        """The log's lines about the server going away, else its last line."""
        try:
            lines = (self.data_dir / "log").read_text(errors="replace").splitlines()
        except OSError as error:
            return f"(its log cannot be read: {error})"
        ready = [i for i, line in enumerate(lines) if "ready to accept connections" in line]
        since_ready = lines[ready[-1] + 1 :] if ready else lines
        notices = [_LOG_PREFIX.sub("", line) for line in since_ready if _DEATH_NOTICE.search(line)]
        return " / ".join(notices[:3] or lines[-1:]) or "(an empty log)"

    def remove(self) -> None:
        died = self.health_problem() is not None
        self.server.stop()
        if not died:  # a server that died keeps its log for whoever reads the run's message
            shutil.rmtree(self.directory, ignore_errors=True)


def start_embedded_postgres(cleanups: list) -> EmbeddedTestPostgres:
    """An embedded PostgreSQL in a private directory; `cleanups` gets what stops and removes it."""
    directory = private_directory("postgres")
    try:
        postgres = EmbeddedTestPostgres(directory)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
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


def _redis_databases() -> int | None:
    """How many dbs the machine's Redis has, or None when it does not answer."""
    try:
        probe = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_connect_timeout=2)
        probe.ping()
        # redis-py types a reply of its synchronous client as possibly awaitable.
        return int(probe.config_get("databases").get("databases", 16))  # type: ignore[union-attr]
    except redis.RedisError:
        return None


def _claim_redis_db(databases: int, cleanups: list) -> str:
    """The highest-numbered empty db, claimed with a key of ours; sessions starting together
    (pytest-xdist's workers, a teammate's run) each take a different one."""
    token = f"{os.getpid()}:{uuid.uuid4()}"
    for number in range(databases - 1, 0, -1):
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=number)
        if client.dbsize() != 0 or not client.set(CLAIM_KEY, token, nx=True):
            continue
        if client.dbsize() != 1:  # something else wrote there meanwhile: not ours to flush
            client.delete(CLAIM_KEY)
            continue

        def release(client: redis.Redis = client) -> None:
            # Ours since we claimed it empty; flush only while our claim still stands.
            if client.get(CLAIM_KEY) == token.encode():
                client.flushdb()

        cleanups.append(release)
        return f"redis://{REDIS_HOST}:{REDIS_PORT}/{number}"
    raise RuntimeError(f"every Redis db on {REDIS_HOST}:{REDIS_PORT} is in use by another run")


def _start_embedded_redis(cleanups: list) -> EmbeddedRedis:
    directory = private_directory("redis")
    cleanups.append(lambda: shutil.rmtree(directory, ignore_errors=True))
    server = EmbeddedRedis(directory / "redis.db")
    cleanups.append(server.stop)
    return server
