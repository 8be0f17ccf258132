"""deploy/'s stack on this machine, for the stack test (tests/test_deploy_stack.py) and the
admission bench through nginx (bench/admission.py --through-nginx): PgBouncer from
deploy/pgbouncer.ini and nginx from deploy/nginx.conf, each rendered into a run directory of its
own and started on a free port of 127.0.0.1 as the current user (nginx with `-p`; PgBouncer as
PostgreSQL's account when we are root, since it refuses to run as root), and clients from other
loopback addresses (127.0.0.0/8), which nginx sees as clients of their own.

Each `..._in_front_of` is a context manager: the process runs inside it and is stopped when it
ends. A process that exits at start, or never listens, raises `StackError` with its log.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import pwd
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import requests
from requests.adapters import HTTPAdapter

from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
START_TIMEOUT = 20.0


class StackError(RuntimeError):
    """nginx or PgBouncer did not start: the message has its log."""


def binary(name: str) -> str | None:
    """The program's path (Debian installs both under /usr/sbin, often not on a user's PATH)."""
    return shutil.which(name) or next(
        (str(path) for path in (Path("/usr/sbin") / name,) if path.exists()), None
    )


def render(template: Path, **values: str) -> str:
    """The template with each `${NAME}` filled in; a name left over is a mistake here."""
    text = template.read_text()
    for name, value in values.items():
        text = text.replace("${" + name + "}", value)
    left = re.findall(r"\$\{[A-Z_]+\}", text)
    if left:
        raise ValueError(f"{template.name}: no value for {left}")
    return text


def wait_for_port(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StackError(f"exited {process.returncode}:\n{log.read_text(errors='replace')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise StackError(f"nothing listening on {port}:\n{log.read_text(errors='replace')}")


@contextlib.contextmanager
def running(argv: list[str], log: Path, port: int, **options) -> Iterator[subprocess.Popen]:
    """`argv` in a session of its own, its output appended to `log`, once it listens on `port`;
    SIGTERM (then SIGKILL) on the way out."""
    with log.open("ab") as output:
        process = subprocess.Popen(
            argv, stdout=output, stderr=subprocess.STDOUT, start_new_session=True, **options
        )
    try:
        wait_for_port(port, process, log)
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


@contextlib.contextmanager
def pgbouncer_in_front_of(database_url: str, pgbouncer: str, run_dir: Path) -> Iterator[str]:
    """PgBouncer from deploy/pgbouncer.ini before the database at `database_url`: the URL of
    the same database through it."""
    database = urlsplit(database_url)
    user = database.username or getpass.getuser()
    # An embedded PostgreSQL (a laptop's `make test`) is reached by its socket's directory,
    # given as `?host=`: PgBouncer takes a directory as its host the same way.
    socket_dir = parse_qs(database.query).get("host", [None])[0]
    host = database.hostname or socket_dir or "127.0.0.1"
    port = free_port()
    run_dir.mkdir()
    (run_dir / "userlist.txt").write_text(f'"{user}" ""\n')
    config = run_dir / "pgbouncer.ini"
    config.write_text(
        render(
            DEPLOY / "pgbouncer.ini",
            PG_HOST=host,
            PG_PORT=str(database.port or 5432),
            PG_DATABASE=database.path.lstrip("/"),
            LISTEN_ADDR="127.0.0.1",
            LISTEN_PORT=str(port),
            RUN_DIR=str(run_dir),
            # The test database trusts 127.0.0.1, as CI's PostgreSQL does.
            AUTH_TYPE="trust",
            ADMIN_USER=user,
        )
    )
    argv = [pgbouncer, str(config)]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root: it switches to another account (PostgreSQL's, or
        # nobody), which must own what it writes.
        account = next(
            (entry for entry in pwd.getpwall() if entry.pw_name == "postgres"),
            pwd.getpwnam("nobody"),
        )
        for path in (run_dir, *run_dir.iterdir()):
            os.chown(path, account.pw_uid, account.pw_gid)
        _let_through(run_dir)
        if socket_dir:
            _let_through(Path(socket_dir))
        argv = [pgbouncer, "-u", account.pw_name, str(config)]
    with running(argv, run_dir / "pgbouncer.out", port):
        yield f"postgresql://{user}@127.0.0.1:{port}/brand"


def _let_through(directory: Path) -> None:
    """`directory` and every one above it searchable by another account (pytest's are 0700)."""
    for parent in (directory, *directory.parents):
        if parent == Path("/"):
            break
        mode = parent.stat().st_mode
        if not mode & 0o001:
            os.chmod(parent, mode | 0o001)


@contextlib.contextmanager
def nginx_in_front_of(upstreams: list[str], nginx: str, run_dir: Path) -> Iterator[str]:
    """nginx from deploy/nginx.conf before the gunicorn servers at `upstreams`: its URL."""
    port = free_port()
    run_dir.mkdir()
    config = run_dir / "nginx.conf"
    config.write_text(
        render(
            DEPLOY / "nginx.conf",
            NGINX_USER=getpass.getuser(),
            RUN_DIR=str(run_dir),
            LISTEN=f"127.0.0.1:{port}",
            UPSTREAM_SERVERS="\n        ".join(
                f"server {urlsplit(url).netloc};" for url in upstreams
            ),
        )
    )
    argv = [
        *(nginx, "-p", str(run_dir), "-c", str(config), "-e", str(run_dir / "error.log")),
        *("-g", "daemon off;"),
    ]
    with running(argv, run_dir / "nginx.out", port):
        yield f"http://127.0.0.1:{port}"


class FromAddress(HTTPAdapter):
    """Connections from `address` (on the loopback network): a client of its own to nginx."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.address, 0)
        super().init_poolmanager(*args, **kwargs)


def client_from(address: str) -> requests.Session:
    session = requests.Session()
    session.mount("http://", FromAddress(address))
    return session
