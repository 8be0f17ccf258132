"""A real `flask worker` in its own process, for webhook tests: started with the run's database
and Redis and short retry settings, stopped (or SIGKILLed) by the test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Fast enough for tests, same code paths as production's hours-long schedule.
FAST_WEBHOOK_SETTINGS = {
    "WEBHOOK_RETRY_SCHEDULE": "1,1",
    "WEBHOOK_TIMEOUT": "1",
    "WEBHOOK_SWEEP_INTERVAL": "1",
}


class WorkerProcess:
    def __init__(self, environ: dict[str, str], **settings: str) -> None:
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the process
            prefix="worker-", suffix=".log", delete=False
        )
        env = {**environ, **FAST_WEBHOOK_SETTINGS, **settings, "PATH": os.environ["PATH"]}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "flask", "--app", "app", "worker"],
            env=env,
            cwd=ROOT,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            # Its own process group: kill() ends it and anything it started.
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL to the worker and its process group: no cleanup of any kind, as when the
        machine dies."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        self.kill()  # whatever of the group is left
        self.log.close()

    def output(self) -> str:
        return Path(self.log.name).read_text()

    def wait_started(self, timeout: float = 30) -> float:
        """The monotonic time by which the worker said it started (its delivery loop starts
        just before): the anchor for 'how soon' in a test, without the interpreter's start-up
        on a loaded machine in it."""
        deadline = time.monotonic() + timeout
        while "started with PID" not in self.output():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the worker did not start:\n{self.output()}")
            time.sleep(0.02)
        return time.monotonic()


@contextlib.contextmanager
def workers_started_by_test(environ: dict[str, str]) -> Iterator[Callable[..., WorkerProcess]]:
    """`start(**settings)` starts a worker; at the end all are stopped side by side (SIGTERM to
    each, so each finishes the attempts in flight), any still running after 10 s killed."""
    started: list[WorkerProcess] = []

    def start(**settings: str) -> WorkerProcess:
        process = WorkerProcess(environ, **settings)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            if process.process.poll() is None:
                process.process.send_signal(signal.SIGTERM)
        for process in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.process.wait(10)
            process.stop()
