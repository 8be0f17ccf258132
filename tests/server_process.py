"""A real gunicorn server of the app in its own process group, for tests that need what the
Flask test client cannot give: concurrent requests on several worker processes, a worker that
dies or hangs in the middle of a request (services.failpoints), and a real TCP client.

Started with the run's database and Redis (a test's `app_environ`) plus any settings the test
adds; gunicorn binds port 0 and the port it got is read from its log, so two servers never race
for a port. `stop()` ends the whole group, whatever state it is in.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
_LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")


class ServerProcess:
    def __init__(
        self,
        environ: dict[str, str],
        *,
        workers: int = 2,
        threads: int | None = 8,
        worker_class: str | None = "gthread",
        port: int = 0,
        **settings: str,
    ) -> None:
        """`threads` and `worker_class` None: gunicorn.conf.py's, as `make run` and production
        have them. `port` 0: a free one."""
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the process
            prefix="gunicorn-", suffix=".log", delete=False
        )
        env = {**environ, **settings, "PATH": os.environ["PATH"]}
        self._final_output: str | None = None
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "app:create_app()",
                "--bind",
                f"127.0.0.1:{port}",
                "--workers",
                str(workers),
                *(("--threads", str(threads)) if threads is not None else ()),
                *(("--worker-class", worker_class) if worker_class is not None else ()),
                "--graceful-timeout",
                "2",
                "--config",
                str(ROOT / "gunicorn.conf.py"),
                *_control_socket_args(),
            ],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            # Its own process group: stop() and kill() reach the arbiter and every worker.
            start_new_session=True,
        )
        try:
            self.port = self._wait_until_serving()
        except BaseException:
            self.stop()
            raise
        self.url = f"http://127.0.0.1:{self.port}"

    def _wait_until_serving(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT
        port = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited at start:\n{self.output()}")
            if port is None:
                found = _LISTENING.search(self.output())
                port = int(found.group(1)) if found else None
            if port is not None:
                with contextlib.suppress(requests.RequestException):
                    if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).ok:
                        return port
            time.sleep(0.05)
        raise RuntimeError(
            f"gunicorn did not serve /healthz in {START_TIMEOUT} s:\n{self.output()}"
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def pids(self) -> set[int]:
        """The arbiter's and every worker's pid: the processes of its group."""
        return {pid for pid, (pgid, _, _) in process_table().items() if pgid == self.process.pid}

    def kill(self) -> None:
        """SIGKILL to the arbiter and its workers."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_TIMEOUT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(STOP_TIMEOUT)
        self.kill()  # whatever of the group is left (a worker stuck in a request)
        self.log.close()
        if self._final_output is None:
            self._final_output = self.output()  # what it said, to its last line
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)

    def output(self) -> str:
        if self._final_output is not None:
            return self._final_output
        return Path(self.log.name).read_text(errors="replace")


def process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (pgid, session id, command line) of every process we can see."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp session ...
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry.name)] = (int(fields[2]), int(fields[3]), cmdline.strip())
    return table


def _control_socket_args() -> list[str]:
    """gunicorn 25.1+ opens a control socket at one path per user by default; two servers (or a
    developer's `make run`) would take it from each other. Nothing here uses it."""
    try:
        major, minor = (int(part) for part in importlib.metadata.version("gunicorn").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return []
    return ["--no-control-socket"] if (major, minor) >= (25, 1) else []
