"""The production stack of deploy/, for real (issue 42): Debian's nginx from deploy/nginx.conf in
front of two gunicorn processes (PROXY_HOPS=1), PgBouncer from deploy/pgbouncer.ini in
transaction mode in front of the test database (DATABASE_POOLER=pgbouncer), and two delivery
workers (`flask worker`) through the same pool. Through nginx: postbacks, their deliveries to a
real receiver while a worker is killed (SIGKILL) midway, a long-poll woken by a postback, and
the dashboard sign-in, whose throttle counts the client's own address.

Everything runs on free ports on 127.0.0.1 as the current user (tests/deploy_stack.py starts
nginx and PgBouncer, as bench/admission.py --through-nginx does). Without the two binaries the
test skips on a laptop and fails under BRAND_STACK_TESTS=required (CI: .ci/run installs Debian's
`nginx` and `pgbouncer` first).
"""

from __future__ import annotations

import os
import re
import threading
from collections import Counter

import psycopg
import pytest
import requests
from sqlalchemy import func, select

from config import DEFAULT_ENDPOINT_CONCURRENCY
from extensions import db
from models import Conversion, WebhookDelivery
from tests.deploy_stack import binary, client_from, nginx_in_front_of, pgbouncer_in_front_of
from tests.receiver import Receiver, Reply
from tests.server_process import ServerProcess
from tests.test_webhook_delivery import poll
from tests.worker_process import WorkerProcess

POSTBACKS = 40
# One client address for the throttle test, another that must not share its count: both are
# on the loopback network (127.0.0.0/8), which nginx sees as the peer and gunicorn does not.
THROTTLED_CLIENT = "127.0.0.2"
OTHER_CLIENT = "127.0.0.3"
FAILED_SIGN_INS_ALLOWED = 3


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
