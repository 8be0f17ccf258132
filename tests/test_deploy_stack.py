"""The production stack of deploy/, for real (issue 42): Debian's nginx from deploy/nginx.conf in
front of two gunicorn processes (PROXY_HOPS=1), PgBouncer from deploy/pgbouncer.ini in
transaction mode in front of the test database (DATABASE_POOLER=pgbouncer), and two delivery
workers (`flask worker`) through the same pool. Through nginx: postbacks, their deliveries to a
real receiver while a worker is killed (SIGKILL) midway, a long-poll woken by a postback, and
the dashboard sign-in, whose throttle counts the client's own address.

Everything runs on free ports on 127.0.0.1 as the current user (nginx with `-p`, PgBouncer as
PostgreSQL's account when we are root, since it refuses to run as root). Without the two
binaries the test skips on a laptop and fails under BRAND_STACK_TESTS=required (CI: .ci/run
installs Debian's `nginx` and `pgbouncer` first).
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
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
import requests
from requests.adapters import HTTPAdapter
from sqlalchemy import func, select

from config import DEFAULT_ENDPOINT_CONCURRENCY
from extensions import db
from models import Conversion, WebhookDelivery
from tests.receiver import Receiver, Reply
from tests.server_process import ServerProcess
from tests.test_webhook_delivery import poll
from tests.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
POSTBACKS = 40
# One client address for the throttle test, another that must not share its count: both are
# on the loopback network (127.0.0.0/8), which nginx sees as the peer and gunicorn does not.
THROTTLED_CLIENT = "127.0.0.2"
OTHER_CLIENT = "127.0.0.3"
FAILED_SIGN_INS_ALLOWED = 3


def binary(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(path) for path in (Path("/usr/sbin") / name,) if path.exists()), None
    )


def require_stack() -> tuple[str, str]:
    nginx, pgbouncer = binary("nginx"), binary("pgbouncer")
    missing = [name for name, path in (("nginx", nginx), ("pgbouncer", pgbouncer)) if not path]
    if missing:
        problem = f"{' and '.join(missing)} not installed"
        if os.environ.get("BRAND_STACK_TESTS") == "required":
            pytest.fail(f"BRAND_STACK_TESTS=required but {problem}", pytrace=False)
        pytest.skip(
            f"the deployment stack test needs Debian's nginx and pgbouncer: {problem}. "
            "Enable it with `sudo apt-get install nginx pgbouncer`"
        )
    assert nginx and pgbouncer
    return nginx, pgbouncer


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def render(template: Path, **values: str) -> str:
    """The template with each `${NAME}` filled in; a name left over is a mistake here."""
    text = template.read_text()
    for name, value in values.items():
        text = text.replace("${" + name + "}", value)
    left = re.findall(r"\$\{[A-Z_]+\}", text)
    assert not left, f"{template.name}: no value for {left}"
    return text


def wait_for_port(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"exited {process.returncode}:\n{log.read_text(errors='replace')}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    pytest.fail(f"nothing listening on {port}:\n{log.read_text(errors='replace')}")


@contextlib.contextmanager
def running(argv: list[str], log: Path, port: int, **options) -> Iterator[subprocess.Popen]:
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
    port = free_port()
    run_dir.mkdir()
    (run_dir / "userlist.txt").write_text(f'"{user}" ""\n')
    config = run_dir / "pgbouncer.ini"
    config.write_text(
        render(
            DEPLOY / "pgbouncer.ini",
            PG_HOST=database.hostname or "127.0.0.1",
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
        argv = [pgbouncer, "-u", account.pw_name, str(config)]
    with running(argv, run_dir / "pgbouncer.out", port):
        yield f"postgresql://{user}@127.0.0.1:{port}/brand"


def _let_through(path: Path) -> None:
    """Every directory above `path` searchable by another account (pytest's are 0700)."""
    for parent in path.parents:
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


def failed_sign_in(session: requests.Session, front: str, forged_for: str | None = None) -> int:
    """A sign-in with a wrong key, as a browser posts the form: the answer's status."""
    form = session.get(f"{front}/dashboard/sign-in", timeout=30)
    assert form.status_code in (200, 429), form.text
    token = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert token, form.text
    headers = {"X-Forwarded-For": forged_for} if forged_for else {}
    answer = session.post(
        f"{front}/dashboard/sign-in",
        data={"csrf_token": token.group(1), "apiKey": "brand_sk_wrong", "next": ""},
        headers=headers,
        allow_redirects=False,
        timeout=30,
    )
    return answer.status_code


def test_the_deploy_stack_carries_postbacks_deliveries_long_polls_and_sign_ins(
    app, app_environ, make_brand, make_key, tmp_path
):
    nginx, pgbouncer = require_stack()
    receiver = Receiver()
    # Each answer takes a moment, so that a worker killed midway has attempts on the wire.
    receiver.default = Reply(delay=0.2)
    brand = make_brand("Stack")
    key = make_key(brand)
    api = f"/api/v1/brand/{brand}"
    servers: list[ServerProcess] = []
    workers: list[WorkerProcess] = []
    try:
        with pgbouncer_in_front_of(app_environ["DATABASE_URL"], pgbouncer, tmp_path / "pgb") as (
            pooled_url
        ):
            environ = {
                **app_environ,
                "DATABASE_URL": pooled_url,
                "DATABASE_POOLER": "pgbouncer",
                "DATABASE_DIRECT_URL": app_environ["DATABASE_URL"],
                "PROXY_HOPS": "1",
                "SIGN_IN_FAILURES_PER_ADDRESS": f"{FAILED_SIGN_INS_ALLOWED}/minute",
            }
            # Behind the pool the app sets nothing for a session: PgBouncer turns JIT off on
            # every server connection instead (its connect_query).
            with psycopg.connect(pooled_url, autocommit=True) as pooled:
                assert pooled.execute("SHOW jit").fetchone() == ("off",)
            # Two API machines of one process each, gunicorn.conf.py's threads.
            servers = [ServerProcess(environ, workers=1, threads=None) for _ in range(2)]
            with nginx_in_front_of([s.url for s in servers], nginx, tmp_path / "nginx") as front:
                session = requests.Session()
                session.headers["X-Api-Key"] = key
                endpoint = session.post(
                    f"{front}{api}/webhook/register-endpoint",
                    json={"url": receiver.url, "events": ["conversion.recorded"]},
                    timeout=30,
                )
                assert endpoint.status_code == 201, endpoint.text

                # A long-poll, waiting before anything is published: the first postback wakes it
                # (its server hears of it through LISTEN on its direct connection).
                long_poll: dict = {}

                def wait_for_events() -> None:
                    answer = session.get(
                        f"{front}{api}/event/fetch-events", params={"wait": 25}, timeout=60
                    )
                    long_poll["status"] = answer.status_code
                    long_poll["events"] = answer.json()["data"]["events"]

                waiting = threading.Thread(target=wait_for_events)
                waiting.start()

                workers = [WorkerProcess(environ) for _ in range(2)]
                for worker in workers:
                    worker.wait_started()

                answers = []
                for n in range(POSTBACKS):
                    answers.append(
                        session.post(
                            f"{front}{api}/conversion/record-postback",
                            json={"eventType": "purchase", "valueMinor": 100 + n},
                            headers={"Idempotency-Key": f"stack-order-{n:06d}"},
                            timeout=30,
                        )
                    )
                    if n == POSTBACKS // 4:
                        # Midway through the deliveries, one worker dies without a word.
                        poll(
                            lambda: len(receiver.received),
                            lambda count: count >= 3,
                            timeout=30,
                            what="the first deliveries",
                            worker=workers[0],
                        )
                        workers[0].kill()
                assert [a.status_code for a in answers] == [201] * POSTBACKS, [
                    a.text for a in answers if a.status_code != 201
                ]
                # A retried postback (same Idempotency-Key) is answered as a replay, recorded once.
                again = session.post(
                    f"{front}{api}/conversion/record-postback",
                    json={"eventType": "purchase", "valueMinor": 100},
                    headers={"Idempotency-Key": "stack-order-000000"},
                    timeout=30,
                )
                replayed, first = again.json()["data"], answers[0].json()["data"]
                assert again.status_code == 200, again.text
                assert replayed["replay"] is True
                assert replayed["conversionId"] == first["conversionId"]

                waiting.join(60)
                assert long_poll["status"] == 200
                assert long_poll["events"], "the long-poll ended without the event"

                # Every delivery arrives; the survivor carries what the killed worker held.
                def pending() -> int:
                    with app.app_context():
                        count = db.session.scalar(
                            select(func.count()).where(WebhookDelivery.status != "delivered")
                        )
                        db.session.remove()
                    return count

                poll(pending, lambda left: left == 0, timeout=90, what="every delivery made")
                with app.app_context():
                    conversions = db.session.scalar(select(func.count(Conversion.id)))
                    deliveries = set(db.session.scalars(select(WebhookDelivery.id)))
                    db.session.remove()
                assert conversions == POSTBACKS
                assert len(deliveries) == POSTBACKS
                received = Counter(request.delivery_id for request in receiver.received)
                assert set(received) == deliveries  # nothing lost
                # Nothing sent twice but what the killed worker had on the wire (at most the
                # endpoint's slots): the same delivery, same webhook-id, which a receiver's
                # deduplication drops.
                twice = [delivery for delivery, times in received.items() if times > 1]
                assert len(twice) <= DEFAULT_ENDPOINT_CONCURRENCY, twice

                # The dashboard sign-in counts failures per client address: nginx's peer address
                # is the client's, and a client's own X-Forwarded-For changes nothing.
                throttled = client_from(THROTTLED_CLIENT)
                statuses = [
                    failed_sign_in(throttled, front, forged_for=f"10.9.9.{n}")
                    for n in range(FAILED_SIGN_INS_ALLOWED + 1)
                ]
                assert statuses == [303] * FAILED_SIGN_INS_ALLOWED + [429], statuses
                assert failed_sign_in(client_from(OTHER_CLIENT), front) == 303
                # And the access log names the client, not nginx.
                signed_in_lines = [
                    line
                    for server in servers
                    for line in server.output().splitlines()
                    if "path=/dashboard/sign-in" in line and "method=POST" in line
                ]
                assert signed_in_lines
                assert all(
                    f"client={THROTTLED_CLIENT} " in line or f"client={OTHER_CLIENT} " in line
                    for line in signed_in_lines
                ), signed_in_lines
    finally:
        receiver.close()
        for worker in workers:
            worker.stop()
        for server in servers:
            server.stop()
