"""What the benchmarks share: the app on a PostgreSQL database of their own, migrated; the
median of repeated timings; and, for those that run real servers, the child processes (stopped
whatever happens), free ports, gunicorn, percentiles and progress lines on stderr."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 25
BENCH_ENCRYPTION_KEY = "YmVuY2gtZW5jcnlwdGlvbi1rZXktMzItYnl0ZXMhISE="


def app_settings(database_url: str, redis_url: str, app_env: str = "test") -> dict[str, str]:
    """The app's settings on a bench's backends, alike for its own create_app and its children."""
    return {
        "APP_ENV": app_env,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "SECRET_KEY": "bench",
        "ENCRYPTION_KEY": BENCH_ENCRYPTION_KEY,
    }


def child_environ(settings: dict[str, str]) -> dict[str, str]:
    """`settings` as the whole environment of a child process that imports the project."""
    return {**settings, "PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)}


def median_ms(run: Callable[[], object], rounds: int = ROUNDS) -> float:
    """Median wall time of `run` in milliseconds, after one warm-up call."""
    run()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 2)


def interleaved_medians_ms(runs: dict[str, Callable[[], object]], rounds: int = ROUNDS) -> dict:
    """Median wall time in milliseconds of each of `runs`, taken in turns (one of each per round,
    after one warm-up call each): a spell of load on the shared machine then slows every case
    it meets alike, so their ratios hold even when the figures move."""
    for run in runs.values():
        run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            samples[name].append((time.perf_counter() - started) * 1000)
    return {name: round(statistics.median(values), 2) for name, values in samples.items()}


@contextmanager
def migrated_app_on_postgresql(prefix: str) -> Iterator[tuple[object, str]]:
    """(app, psycopg DSN) on a new PostgreSQL database with the migrations applied; the
    database is dropped and the Redis db flushed afterwards (tests.backends)."""
    from flask_migrate import upgrade

    from app import create_app
    from tests.backends import open_backends

    backends = open_backends()
    try:
        app = create_app(app_settings(backends.database_url, backends.redis_url))
        with app.app_context():
            upgrade()
        yield app, backends.database_url.replace("postgresql+psycopg://", "postgresql://")
    finally:
        backends.close()


def run_benchmark(prefix: str, run: Callable[[Path, Processes], dict], logs: str | None = None):
    """Run `run(workdir, processes)` in a work directory (`logs`, kept, or a temporary one),
    stop every child process it started whatever happens, and print its result as the one JSON
    line on stdout."""
    exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix=prefix) as directory:
        workdir = Path(logs or directory)
        workdir.mkdir(parents=True, exist_ok=True)
        processes = Processes(workdir)
        try:
            result = run(workdir, processes)
        finally:
            processes.stop_all()
    print(json.dumps(result), flush=True)


def log(message: str) -> None:
    """A progress line on stderr (stdout is kept for the one JSON line of the result)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C does, through every `finally` (children stopped, database
    dropped)."""

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)


class Processes:
    """The child processes of the run, stopped in reverse order at the end whatever happens."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.running: list[tuple[str, subprocess.Popen, Path]] = []
        self._started = 0  # numbers the logs: a stopped process's log is not overwritten

    def start(self, name: str, argv: list[str], env: dict[str, str], **kwargs) -> subprocess.Popen:
        """Start `argv` in its own process group, its stderr (and, unless given, its stdout) to
        `<workdir>/<name>-<n>.log`."""
        log_path = self.workdir / f"{name}-{self._started}.log"
        self._started += 1
        with open(log_path, "wb") as log_file:
            kwargs.setdefault("stdout", log_file)
            process = subprocess.Popen(
                argv, env=env, cwd=ROOT, stderr=log_file, start_new_session=True, **kwargs
            )
        self.running.append((name, process, log_path))
        return process

    def stop(self, process: subprocess.Popen) -> None:
        """SIGTERM, then SIGKILL; then the same for what is left of its process group (each
        child leads its own: gunicorn forks its workers)."""
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        for signum in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        self.running = [entry for entry in self.running if entry[1] is not process]

    def log_path_of(self, process: subprocess.Popen) -> Path | None:
        for _, candidate, path in self.running:
            if candidate is process:
                return path
        return None

    def log_of(self, process: subprocess.Popen) -> str:
        path = self.log_path_of(process)
        return path.read_text(errors="replace")[-3000:] if path is not None else ""

    def stop_all(self) -> None:
        for _, process, _ in reversed(list(self.running)):
            self.stop(process)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_gunicorn(
    processes: Processes,
    name: str,
    app_spec: str,
    env: dict[str, str],
    options: list[str],
    ready_path: str = "/healthz",
    timeout: float = 30,
) -> tuple[str, subprocess.Popen]:
    """`gunicorn app_spec --bind 127.0.0.1:<free port> *options` as a child; returns its base
    URL once GET `ready_path` answers 200."""
    port = free_port()
    process = processes.start(
        name,
        [sys.executable, "-m", "gunicorn", app_spec, "--bind", f"127.0.0.1:{port}", *options],
        env,
    )
    base = f"http://127.0.0.1:{port}"
    wait_until_serving(base, process, processes, name, ready_path=ready_path, timeout=timeout)
    return base, process


def start_make_run(
    workdir: Path,
    processes: Processes,
    database_url: str,
    redis_url: str,
    extra_env: dict[str, str] | None = None,
) -> tuple[str, subprocess.Popen]:
    """`make run` (scripts/run.py: gunicorn, 2 workers, and a delivery worker) on these
    databases and a free port, its state in `workdir`; returns its base URL once it serves."""
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(workdir)),
        **app_settings(database_url, redis_url, "development"),
        "PORT": str(port),
        "RUN_STATE_DIR": str(workdir / "run-state"),
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    supervisor = processes.start("make-run", [sys.executable, "scripts/run.py"], env)
    base = f"http://127.0.0.1:{port}"
    wait_until_serving(base, supervisor, processes, "make run", timeout=120)
    return base, supervisor


def wait_until_serving(
    base: str,
    process: subprocess.Popen,
    processes: Processes,
    name: str,
    *,
    ready_path: str = "/healthz",
    timeout: float = 30,
) -> None:
    """Until GET `ready_path` answers 200 (never through a proxy of the environment's);
    RuntimeError with the process's log when it exits or `timeout` passes first."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while True:
        try:
            with opener.open(f"{base}{ready_path}", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start:\n" + processes.log_of(process))
        time.sleep(0.1)


class HttpRequests(asyncio.Protocol):
    """The server side of a bare HTTP/1.1 keep-alive connection, for the benchmarks' asyncio
    receivers (far faster than any sender, so they never cap a figure): each request's head is
    parsed, its body kept in `self.body`, and `handle` answers it on `self.transport`, at once
    or later."""

    def __init__(self) -> None:
        self.buffer = b""
        self.body = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:  # no delayed-ACK stall on keep-alive answers (PERFORMANCE-NOTES)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].split(b"\r\n")
            headers = {}
            for line in head[1:]:
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            end = head_end + 4 + int(headers.get(b"content-length", b"0"))
            if len(self.buffer) < end:
                return
            self.body = self.buffer[head_end + 4 : end]
            self.buffer = self.buffer[end:]
            method, target, _ = head[0].split(b" ", 2)
            self.handle(method, target.decode(), headers)

    def handle(self, method: bytes, target: str, headers: dict[bytes, bytes]) -> None:
        raise NotImplementedError
