"""The faults of an ordinary week, with real processes: a receiver down then back, a worker
killed (before or after the receiver answered) or stopped, PostgreSQL and Redis restarted under
a running worker, an endpoint changed while its backlog is in flight, two workers on one
failing endpoint. Each test asserts recovery (the work gets done, with no one restarting
anything) and what a receiver can rely on: nothing lost, and a request that arrives twice is
one that was in flight when its worker died.

The slow-DNS test is at the end: it runs the sender inside a network namespace of its own
(`unshare -rn`), where a DNS server and an HTTPS receiver on a public address are the test's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
import redis
from rq import Queue
from sqlalchemy import func, select

from app import create_app
from extensions import db
from models import DeliveryLease, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from services.api_keys import create_api_key
from services.brands import create_brand
from tests import test_webhook_delivery as delivery
from tests.private_servers import PrivatePostgres, PrivateRedis
from tests.receiver import Reply, expected_signature
from tests.test_webhook_delivery import Api, logs, poll, publish
from tests.worker_process import WorkerProcess
from workers.connection import QUEUES

api = delivery.api
workers = delivery.workers
start_worker = delivery.start_worker

ROOT = Path(__file__).resolve().parent.parent


def publish_many(app, brand: str, count: int, start: int = 0) -> list[str]:
    """`count` events in one transaction; the ids of all their deliveries."""
    published = publish(app, brand, *(("deal.completed", {"n": n}) for n in range(start, count)))
    return [delivery_id for _, ids in published for delivery_id in ids]


def statuses(app, delivery_ids: list[str]) -> Counter:
    with app.app_context():
        found = db.session.execute(
            select(WebhookDelivery.status).where(WebhookDelivery.id.in_(delivery_ids))
        ).all()
        db.session.remove()
    return Counter(row.status for row in found)


def wait_all_delivered(app, delivery_ids, *, timeout: float, workers=()) -> float:
    """Seconds until every delivery is `delivered`."""
    started = time.monotonic()
    poll(
        lambda: statuses(app, delivery_ids),
        lambda counted: counted["delivered"] == len(delivery_ids),
        timeout=timeout,
        what=f"{len(delivery_ids)} deliveries delivered",
        worker=workers[0] if workers else None,
    )
    return time.monotonic() - started


def leased(app, delivery_ids: list[str]) -> set[str]:
    """The deliveries a worker holds now (an attempt in flight or not yet recorded)."""
    with app.app_context():
        held = set(
            db.session.scalars(
                select(DeliveryLease.delivery_id).where(DeliveryLease.delivery_id.in_(delivery_ids))
            )
        )
        db.session.remove()
    return held


def seconds_until_leases_lapse(app, delivery_ids: list[str]) -> float:
    with app.app_context():
        seconds = db.session.scalar(
            select(func.extract("epoch", func.max(DeliveryLease.leased_until) - func.now())).where(
                DeliveryLease.delivery_id.in_(delivery_ids)
            )
        )
        db.session.remove()
    return max(0.0, float(seconds or 0))


def attempts_logged(app, delivery_ids: list[str]) -> Counter:
    with app.app_context():
        rows = db.session.scalars(
            select(WebhookAttempt.delivery_id).where(WebhookAttempt.delivery_id.in_(delivery_ids))
        ).all()
        db.session.remove()
    return Counter(rows)


# ---------------------------------------------------------------------------------------------
# A receiver down, then back


def test_a_receiver_failing_then_hanging_past_the_breaker_gets_its_backlog_when_back(
    app, api, brand, receivers, start_worker
):
    """500s, then a hang, long past the breaker's threshold: once the receiver answers again
    the same worker delivers the whole backlog (the last round's engine never did)."""
    outage = threading.Event()
    receiver = receivers(Reply(status=500))
    endpoints = [api.register(f"{receiver.url}/{n}", events=["deal.completed"]) for n in range(4)]
    worker = start_worker(
        WEBHOOK_TIMEOUT="1", WEBHOOK_RETRY_SCHEDULE="1,1,1,2,2,2,3,3,3,3,3,3,3,3,3,3"
    )
    delivery_ids = publish_many(app, brand, 10)  # 40 deliveries

    poll(
        lambda: [api.endpoint(e["id"])["consecutiveFailures"] for e in endpoints],
        lambda failures: min(failures) >= 5,
        timeout=30,
        what="every endpoint past the breaker's threshold",
        worker=worker,
    )
    receiver.default = Reply(hold=outage)  # now it hangs: every attempt times out
    hung_from = len(receiver.received)
    receiver.wait_for(hung_from + 4, timeout=20)
    receiver.default = Reply()  # back
    outage.set()
    back_at = time.monotonic()

    wait_all_delivered(app, delivery_ids, timeout=60, workers=[worker])
    assert worker.process.poll() is None, "the worker was not restarted"
    recovered_in = time.monotonic() - back_at
    assert recovered_in < 30, (recovered_in, logs(worker))
    assert all(api.endpoint(e["id"])["consecutiveFailures"] == 0 for e in endpoints)


# ---------------------------------------------------------------------------------------------
# A worker killed, or stopped


def test_a_worker_killed_with_attempts_in_flight_is_replaced_and_delivery_resumes_in_seconds(
    app, api, brand, receivers, start_worker
):
    receiver = receivers(Reply(delay=0.3))
    for number in range(4):
        api.register(f"{receiver.url}/{number}", events=["deal.completed"])
    delivery_ids = publish_many(app, brand, 60)  # 240 deliveries, 8 in flight at a time
    doomed = start_worker()
    receiver.wait_for(20, timeout=30)
    doomed.kill()
    in_flight_at_kill = leased(app, delivery_ids)
    assert in_flight_at_kill, "nothing was in flight at the kill"
    received_at_kill = len(receiver.received)
    # The dead worker's leases hold every endpoint's slots until they lapse.
    lapsed_at = time.monotonic() + seconds_until_leases_lapse(app, delivery_ids)

    time.sleep(2)
    successor = start_worker()
    started_at = successor.wait_started()
    first_new = receiver.wait_for(received_at_kill + 1, timeout=15)[received_at_kill]
    # From the later of the successor's start and the lapse: within a round or two.
    resumed_in = first_new.received_at - max(started_at, lapsed_at)
    assert resumed_in < 3, (resumed_in, logs(successor))

    wait_all_delivered(app, delivery_ids, timeout=90, workers=[successor])
    counts = Counter(r.delivery_id for r in receiver.received)
    assert set(counts) == set(delivery_ids)  # nothing lost
    assert receiver.overlaps() == [], logs(doomed, successor)  # never on the wire twice at once
    # Every receipt is a logged attempt (a loaded machine's 1 s timeouts are retried, and
    # logged), or the one the kill cut short before its record: no unexplained copy.
    for delivery_id, received in counts.items():
        if received > 1:
            explained = api.delivery(delivery_id)["attemptCount"] + (
                delivery_id in in_flight_at_kill
            )
            assert received <= explained, (delivery_id, logs(doomed, successor))


def test_a_worker_killed_after_the_receiver_answered_and_before_the_record(
    app, api, brand, receivers, start_worker
):
    receiver = receivers()
    endpoint = api.register(receiver.url, events=["deal.completed"])
    receiver.secrets = [endpoint["signingSecret"]]
    doomed = start_worker(FAILPOINTS="delivery.before_record=exit")
    [(_, [delivery_id])] = publish(app, brand, ("deal.completed", {"n": 1}))
    receiver.wait_for(1, timeout=15)
    doomed.process.wait(15)
    assert doomed.process.returncode == 70  # the failpoint's exit: answered, not recorded
    assert receiver.wait_answered(1, timeout=5) == [delivery_id]
    assert api.delivery(delivery_id)["attemptCount"] == 0

    successor = start_worker()  # takes it once the dead worker's lease lapses
    detail = api.wait_delivery(delivery_id, "delivered", timeout=20, worker=successor)
    first, second = receiver.wait_for(2)
    assert first.delivery_id == second.delivery_id == delivery_id  # the receiver dedupes on it
    assert first.body == second.body and second.signature_valid
    assert detail["attemptCount"] == len(detail["attempts"]) == 1


def test_sigterm_with_100_in_flight_finishes_and_records_them_all(
    app, api, brand, receivers, start_worker
):
    # Held until the signal: on a loaded machine the 100 arrive over seconds, and none may
    # have ended before the last one starts.
    gate = threading.Event()
    receiver = receivers(Reply(hold=gate))
    api.register(receiver.url, events=["deal.completed"])
    delivery_ids = publish_many(app, brand, 100)
    stopping = start_worker(WEBHOOK_ENDPOINT_CONCURRENCY="100", WEBHOOK_TIMEOUT="20")
    receiver.wait_for(100, timeout=30)
    assert receiver.in_flight == 100
    stopping.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)  # the signal taken while all 100 are on the wire
    gate.set()
    stopping.process.wait(20 + 5)

    assert stopping.process.returncode == 0, logs(stopping)
    assert statuses(app, delivery_ids) == Counter(delivered=100), logs(stopping)
    assert attempts_logged(app, delivery_ids) == Counter(dict.fromkeys(delivery_ids, 1))
    assert leased(app, delivery_ids) == set()
    assert len(receiver.received) == 100  # nothing sent after the signal


# ---------------------------------------------------------------------------------------------
# PostgreSQL and Redis restarted under a running worker


class PrivateWorld:
    """A brand on a PostgreSQL and a Redis of the test's own, with its API and a worker."""

    def __init__(self, app_environ: dict[str, str]) -> None:
        self.postgres = PrivatePostgres()
        self.redis = PrivateRedis()
        self.environ = {
            **app_environ,
            "DATABASE_URL": self.postgres.url,
            "REDIS_URL": self.redis.url,
        }
        self.postgres.migrate(self.environ)
        self.app = create_app(self.environ)
        with self.app.app_context():
            self.brand = create_brand(name="Private Foods", plan="growth").id
            key = create_api_key(
                brand_id=self.brand, name="k", scopes=("read", "write"), created_by="tests"
            ).secret
            db.session.commit()
        self.api = Api(self.app.test_client(), self.brand, key)
        self.workers: list[WorkerProcess] = []

    def start_worker(self, **settings: str) -> WorkerProcess:
        worker = WorkerProcess(self.environ, **settings)
        self.workers.append(worker)
        return worker

    def publish(self, count: int, start: int = 0) -> list[str]:
        return publish_many(self.app, self.brand, start + count, start)

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
        with self.app.app_context():
            db.session.remove()
            db.engine.dispose()
        self.redis.close()
        self.postgres.close()


@pytest.fixture
def private_world(app_environ):
    world = PrivateWorld(app_environ)
    yield world
    world.close()


def test_postgresql_restarted_under_a_running_worker(private_world, receivers):
    world = private_world
    receiver = receivers(Reply(delay=0.05))
    world.api.register(receiver.url, events=["deal.completed"])
    worker = world.start_worker()
    before = world.publish(20)
    receiver.wait_for(5, timeout=20)

    world.postgres.stop()  # every connection of the worker and of the API is cut
    time.sleep(1)
    world.postgres.start()
    with world.app.app_context():
        db.engine.dispose()  # the test's own pool: its connections died with the server
    after = world.publish(20, start=20)

    wait_all_delivered(world.app, before + after, timeout=60, workers=[worker])
    assert worker.process.poll() is None
    counts = Counter(r.delivery_id for r in receiver.received)
    assert set(counts) == set(before + after)
    assert max(counts.values()) == 1, logs(worker)


def test_redis_stopped_under_a_running_worker_while_events_are_published(private_world, receivers):
    world = private_world
    receiver = receivers()
    world.api.register(receiver.url, events=["deal.completed"])
    worker = world.start_worker()
    first = world.publish(5)
    wait_all_delivered(world.app, first, timeout=20, workers=[worker])

    world.redis.stop()
    during = world.publish(20, start=5)
    wait_all_delivered(world.app, during, timeout=30, workers=[worker])  # no Redis needed

    world.redis.start()  # RQ's part comes back by itself
    queue = Queue(QUEUES[0], connection=redis.Redis.from_url(world.redis.url))
    job = queue.enqueue("json.dumps", {"after": "restart"})
    poll(
        lambda: job.get_status(refresh=True),
        lambda status: status == "finished",
        timeout=30,
        what="a job queued after Redis came back",
        worker=worker,
    )
    assert worker.process.poll() is None
    assert Counter(r.delivery_id for r in receiver.received) == Counter(
        dict.fromkeys(first + during, 1)
    )


# ---------------------------------------------------------------------------------------------
# An endpoint changed while its backlog is in flight


def test_a_rotation_signs_every_attempt_that_starts_after_its_answer(
    app, api, brand, receivers, start_worker
):
    receiver = receivers(Reply(delay=0.2))
    endpoint = api.register(receiver.url, events=["deal.completed"])
    old_secret = endpoint["signingSecret"]
    worker = start_worker()
    publish_many(app, brand, 60)
    receiver.wait_for(6, timeout=20)

    rotated = api.call("POST", f"webhook/{endpoint['id']}/rotate-secret")
    answered_at = time.monotonic()
    receiver.wait_for(20, timeout=30)

    def signed_with_old(request) -> bool:
        given = request.headers["X-Service-Signature"]
        timestamp = request.headers["X-Service-Timestamp"]
        return given == expected_signature(old_secret, timestamp, request.body)

    late = [r for r in receiver.received if r.received_at > answered_at and signed_with_old(r)]
    # Only the attempts already started (at most the endpoint's two slots), and none later.
    assert len(late) <= 2, (len(late), logs(worker))
    assert all(r.received_at - answered_at < 0.5 for r in late), logs(worker)
    new_secret = rotated["signingSecret"]
    after = [r for r in receiver.received if r.received_at > answered_at + 0.5]
    assert after and all(
        r.headers["X-Service-Signature"]
        == expected_signature(new_secret, r.headers["X-Service-Timestamp"], r.body)
        for r in after
    )


def test_a_url_change_moves_every_attempt_that_starts_after_its_answer(
    app, api, brand, receivers, start_worker
):
    old, new = receivers(Reply(delay=0.2)), receivers()
    endpoint = api.register(old.url, events=["deal.completed"])
    worker = start_worker()
    delivery_ids = publish_many(app, brand, 40)
    old.wait_for(6, timeout=20)

    api.call("PATCH", f"webhook/{endpoint['id']}/update-endpoint", json={"url": new.url})
    answered_at = time.monotonic()

    wait_all_delivered(app, delivery_ids, timeout=60, workers=[worker])
    late = [r for r in old.received if r.received_at > answered_at]
    assert len(late) <= 2 and all(r.received_at - answered_at < 0.5 for r in late), logs(worker)
    assert {r.delivery_id for r in old.received} | {r.delivery_id for r in new.received} == set(
        delivery_ids
    )


def test_disable_then_enable_with_a_backlog_in_flight_sends_nothing_unlogged(
    app, api, brand, receivers, start_worker
):
    receiver = receivers(Reply(delay=0.3))
    endpoint = api.register(receiver.url, events=["deal.completed"])
    first, second = start_worker(), start_worker()
    delivery_ids = publish_many(app, brand, 40)
    receiver.wait_for(4, timeout=20)

    path = f"webhook/{endpoint['id']}/update-endpoint"
    api.call("PATCH", path, json={"isActive": False})
    api.call("PATCH", path, json={"isActive": True})
    delivery_ids += publish_many(app, brand, 10, start=40)

    poll(
        lambda: statuses(app, delivery_ids),
        lambda counted: counted["pending"] == 0,
        timeout=60,
        what="nothing pending",
        worker=first,
    )
    time.sleep(1)  # anything still on the wire would arrive now
    sent = Counter(r.delivery_id for r in receiver.received)
    logged = attempts_logged(app, delivery_ids)
    assert sent == logged, logs(first, second)  # every request is an attempt in the log
    assert receiver.max_in_flight <= 2, logs(first, second)  # the limit held throughout
    # After the enable, nothing of the disabled backlog was sent again.
    assert max(sent.values()) == 1


# ---------------------------------------------------------------------------------------------
# Two workers, one failing endpoint


def test_two_workers_share_one_failing_endpoints_breaker(app, api, brand, receivers, start_worker):
    receiver = receivers(Reply(status=500))
    endpoint = api.register(receiver.url, events=["deal.completed"])
    publish_many(app, brand, 20)
    settings = {"WEBHOOK_TIMEOUT": "4", "WEBHOOK_RETRY_SCHEDULE": "1,1,1,1,1,1,1,1,1,1"}
    first, second = start_worker(**settings), start_worker(**settings)
    requests = receiver.wait_for(8, timeout=40)
    assert api.endpoint(endpoint["id"])["consecutiveFailures"] >= 7

    # From the third failure in a row on, one attempt at a time, after a pause of 1, 2, 4 s
    # (at most the timeout) from the last failure, whichever worker makes it: however the first
    # attempts paired up, the fourth request on waits 2 s, and each after it 4 s.
    gaps = [later.received_at - earlier.received_at for earlier, later in pairwise(requests[3:8])]
    minimums = (2, 4, 4, 4)
    assert all(gap >= 0.9 * least for gap, least in zip(gaps, minimums, strict=True)), (
        gaps,
        logs(first, second),
    )
    assert receiver.max_in_flight <= 2
    with app.app_context():
        pause_until = db.session.scalar(
            select(WebhookEndpoint.next_probe_at).where(WebhookEndpoint.id == endpoint["id"])
        )
    assert pause_until is not None


# ---------------------------------------------------------------------------------------------
# Slow DNS for one brand


def test_slow_name_lookups_hold_only_their_own_attempts(tmp_path):
    """8 names whose DNS answers after 6 s beside 20 that answer at once: the healthy ones
    deliver at once, the slow ones fail on their own deadline (the last round's engine shared
    8 lookup threads, and all 20 healthy attempts failed behind them)."""
    if subprocess.run(["unshare", "-rn", "true"], check=False).returncode != 0:
        pytest.fail("this test needs unprivileged network namespaces (unshare -rn)")
    result = subprocess.run(
        ["unshare", "-rn", sys.executable, "-m", "tests.slow_dns_probe", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    healthy, slow = report["healthy"], report["slow"]
    assert len(healthy) == 20 and len(slow) == 8
    assert all(h["status"] == 200 and h["error"] is None for h in healthy), healthy
    assert max(h["seconds"] for h in healthy) < 2.0, healthy
    # Each slow one fails on its own, on c-ares's timeout or the lookup's own deadline.
    assert all(s["status"] is None and s["error"].startswith("Not sent") for s in slow), slow
    assert all("resolve" in s["error"] or "looking up" in s["error"] for s in slow), slow
