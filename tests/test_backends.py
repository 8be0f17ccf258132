"""The test run's own servers (tests/backends.py): an embedded PostgreSQL outlives the other
pytest sessions on the machine, and a database that dies mid-run stops the run with its cause.

Both start servers of their own (an embedded PostgreSQL, and a whole inner pytest run on
embedded servers), whatever backends this run uses."""

from __future__ import annotations

import functools
import multiprocessing
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

from tests.backends import PRIVATE_DIRECTORY_PREFIX, create_database, start_embedded_postgres
from workers.embedded_postgres import _ensure_system_user

REPO = Path(__file__).resolve().parent.parent
SESSION_TIMEOUT = 240


def run_pytest(args: list[str], *, cwd: Path, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SESSION_TIMEOUT,
        check=False,
    )


def pytest_root(tmp_path: Path) -> Path:
    """`pytest-of-<user>`, the directory every pytest session of this user shares."""
    return next(parent for parent in tmp_path.parents if parent.name.startswith("pytest-of-"))


def test_an_embedded_server_outlives_another_pytest_session_on_the_machine(tmp_path):
    cleanups: list = []
    try:
        postgres = start_embedded_postgres(cleanups)
        create_database(postgres, cleanups)  # dropped below WITH (FORCE), as every run's is

        # Another session, as a teammate's or a second `make test` would start: any session that
        # uses tmp_path sets pytest-of-<user> to 0700, which once cut the server off its data.
        second = tmp_path / "second-session"
        second.mkdir()
        (second / "pytest.ini").write_text("[pytest]\n")
        (second / "test_second.py").write_text(
            "def test_writes_a_file(tmp_path):\n    (tmp_path / 'x').write_text('x')\n"
        )
        result = run_pytest(["-q", str(second)], cwd=second)
        assert result.returncode == 0, result.stdout + result.stderr
        assert stat.S_IMODE(pytest_root(tmp_path).stat().st_mode) == 0o700

        # A checkpoint opens global/pg_control by its full path: what PANICked before.
        with postgres.connect_maintenance() as connection:
            connection.execute("CHECKPOINT")
        drop_database = cleanups.pop()
        drop_database()
        assert postgres.health_problem() is None
        with postgres.connect_maintenance() as connection:
            assert connection.execute("SELECT 1").fetchone() == (1,)
    finally:
        for cleanup in reversed(cleanups):
            with suppress(Exception):
                cleanup()


INNER_RUN = """
import os
import signal

from workers.embedded_redis import wait_for_pid_exit


def test_the_database_goes_away(backends):
    pid = backends.postgres.server.pid
    os.kill(pid, signal.SIGQUIT)  # PostgreSQL's immediate shutdown: it says so in its log
    assert wait_for_pid_exit(pid, 30)


def test_a_later_test_needs_the_database(app, brand):
    pass


def test_another_later_test_needs_the_database(app, brand):
    pass
"""


def test_a_database_that_dies_mid_run_stops_the_run_with_its_cause_once(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(INNER_RUN)
    result = run_pytest(
        [
            *("-p", "tests.conftest", "-c", str(tmp_path / "pytest.ini")),
            *("--rootdir", str(tmp_path), "-q", str(tmp_path / "test_inner.py")),
        ],
        cwd=REPO,
        env={"BRAND_TEST_BACKENDS": "embedded"},
    )
    output = result.stdout + result.stderr
    kept = re.search(r"log kept in (\S+)/postgres/log\)", output)
    if kept and Path(kept[1]).name.startswith(PRIVATE_DIRECTORY_PREFIX):
        shutil.rmtree(kept[1], ignore_errors=True)  # kept for a reader; this test read it
    assert result.returncode != 0, output
    assert "The embedded PostgreSQL of this run" in output, output
    assert "has died" in output and "immediate shutdown request" in output, output
    assert "Stopping the run" in output, output
    # One error (the first test that needed it), not one per test left.
    assert re.search(r"\b1 passed, 1 error\b", output), output
    assert "test_another_later_test_needs_the_database" not in output, output


def _make_user_slowly(record: str, username: str) -> None:
    with open(record, "a") as log:
        log.write(f"start {time.monotonic()}\n")
    time.sleep(0.3)  # useradd's read, then its write: another process must not come between
    with open(record, "a") as log:
        log.write(f"end {time.monotonic()}\n")


def _start_first_server(record: str) -> None:
    _ensure_system_user(functools.partial(_make_user_slowly, record))


def test_first_starts_on_a_new_machine_make_the_server_user_one_at_a_time(tmp_path):
    """A new machine's first `make test` starts four embedded servers at once, as root, and
    each would run `useradd` for the server's user: two at once left a data directory owned
    by a uid that no longer existed, and every test of that session failed at initdb. The
    processes take turns (the real useradd is not run here: it would change the machine)."""
    record = tmp_path / "record"
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_start_first_server, args=(str(record),)) for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    steps = [line.split() for line in record.read_text().splitlines()]
    assert [kind for kind, _ in steps] == ["start", "end"] * 4  # never two inside at once
