"""A real `flask worker` in its own process, for webhook tests: started with the run's database
and Redis and short retry settings, stopped (or SIGKILLed) by the test."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
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
