"""Scaling out (issue 35): API processes and workers run as separate processes against one
PostgreSQL and one Redis, the way separate machines run them. A backlog is delivered once each,
every worker takes part, and a worker killed midway (even holding leases it never used) leaves
nothing stranded."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import requests
from prometheus_client import CollectorRegistry, multiprocess
from sqlalchemy import func, select

from extensions import db
from models import WebhookDelivery
from tests.receiver import Receiver, Reply
from tests.server_process import ServerProcess
from tests.test_webhook_delivery import Api, poll, publish
from tests.worker_process import WorkerProcess

BRANDS = 3
ENDPOINTS_PER_BRAND = 4
POSTBACKS = 60  # per brand, through the two API processes in turn


def attempts_of(directory: Path) -> float:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    return sum(
        sample.value
        for family in registry.collect()
        if family.name == "brand_api_webhook_attempts"
        for sample in family.samples
        if sample.name.endswith("_total")
    )


def pending(app) -> int:
    with app.app_context():
        count = db.session.scalar(select(func.count()).where(WebhookDelivery.status == "pending"))
        db.session.remove()
    return count


def test_two_api_processes_and_three_workers_deliver_a_backlog_once_each(
    app, app_environ, client, make_brand, make_key, tmp_path
):
    receiver = Receiver()
    # Answers wait at this gate until every worker holds attempts: a worker whose interpreter
    # starts late on a loaded machine would otherwise find the backlog already delivered.
    gate = threading.Event()
    receiver.default = Reply(delay=0.02, hold=gate)
    servers: list[ServerProcess] = []
    workers: list[WorkerProcess] = []
    try:
        keys = {}
        for number in range(BRANDS):
            brand = make_brand(f"Scale {number}")
            keys[brand] = make_key(brand)
            api = Api(client, brand, keys[brand])
            for _ in range(ENDPOINTS_PER_BRAND):
                api.register(receiver.url, events=["conversion.recorded"])
        servers = [ServerProcess(app_environ, workers=1, threads=4) for _ in range(2)]

        def post_all(brand: str) -> None:
            session = requests.Session()
            for n in range(POSTBACKS):
                server = servers[n % 2]
                answer = session.post(
                    f"{server.url}/api/v1/brand/{brand}/conversion/record-postback",
                    json={"eventType": "purchase", "valueMinor": n},
                    headers={"X-Api-Key": keys[brand], "Idempotency-Key": f"scale-{brand}-{n:06d}"},
                    timeout=30,
                )
                assert answer.status_code == 201, answer.text

        # The backlog, through both API processes at once.
        posters = [threading.Thread(target=post_all, args=(brand,)) for brand in keys]
        for poster in posters:
            poster.start()
        for poster in posters:
            poster.join(120)
        expected = BRANDS * POSTBACKS * ENDPOINTS_PER_BRAND
        assert pending(app) == expected
        directories = []
        for number in range(3):
            directory = tmp_path / f"metrics-{number}"
            directory.mkdir()
            directories.append(directory)
            # Eight attempts at a time each: no worker can hold every endpoint's slots, so
            # the work is shared (with room for all, one fast worker may rightly do it alone).
            # The timeout outlasts the gate: an attempt that timed out while held there would
            # be sent again and counted as a duplicate the kill did not cause.
            workers.append(
                WorkerProcess(
                    app_environ,
                    PROMETHEUS_MULTIPROC_DIR=str(directory),
                    WEBHOOK_CONCURRENCY="8",
                    WEBHOOK_TIMEOUT="20",
                )
            )
        # Three workers of 8 slots, each taking at most its share (one of an endpoint's two
        # slots once all three are live) of the 12 endpoints: at least 20 requests held at the
        # gate, which two workers' 16 slots cannot make.
        for worker in workers:
            worker.wait_started()
        poll(
            lambda: len(receiver.received),
            lambda count: count >= 20,
            timeout=15,  # within the attempts' timeout
            what="every worker's first attempts",
        )
        gate.set()
        # Midway, one worker dies without a word.
        poll(
            lambda: len(receiver.received),
            lambda count: count >= expected // 3,
            timeout=60,
            what="a third of the deliveries",
        )
        workers[0].kill()
        # Read after the kill: its metrics files outlive it, and an attempt it counted between
        # a read and the kill would be delivered yet in nobody's share.
        killed_sent = attempts_of(directories[0])
        poll(lambda: pending(app), lambda left: left == 0, timeout=90, what="nothing pending")

        with app.app_context():
            statuses = Counter(db.session.scalars(select(WebhookDelivery.status)))
            delivery_ids = set(db.session.scalars(select(WebhookDelivery.id)))
            db.session.remove()
        assert statuses == {"delivered": expected}
        received = Counter(request.delivery_id for request in receiver.received)
        assert set(received) == delivery_ids  # every one arrived
        # Only what the killed worker had on the wire may have arrived twice.
        twice = [d for d, n in received.items() if n > 1]
        assert len(twice) <= 8, twice
        # Every worker took part; the survivors carried the rest.
        shares = [killed_sent, attempts_of(directories[1]), attempts_of(directories[2])]
        assert all(share > 0 for share in shares), shares
        assert sum(shares) >= expected
    finally:
        receiver.close()
        for worker in workers:
            worker.stop()
        for server in servers:
            server.stop()


def test_a_worker_killed_holding_leases_it_never_used_strands_nothing(
    app, app_environ, brand, make_key, client
):
    receiver = Receiver()
    dying = survivor = None
    try:
        api = Api(client, brand, make_key(brand))
        api.register(receiver.url, events=["deal.completed"])
        published = publish(app, brand, *(("deal.completed", {"n": n}) for n in range(6)))
        # It claims (its leases commit) and dies before it starts a single attempt.
        dying = WorkerProcess(app_environ, FAILPOINTS="delivery.after_claim=exit")
        assert dying.process.wait(30) == 70
        assert receiver.received == []
        started = time.monotonic()
        survivor = WorkerProcess(app_environ)
        for _, [delivery_id] in published:
            api.wait_delivery(delivery_id, "delivered", timeout=30, worker=survivor)
        # Within the lease (WEBHOOK_TIMEOUT 1 s + 5 s) and a round, not a sweep's minutes.
        assert time.monotonic() - started < 15
        assert Counter(r.delivery_id for r in receiver.received).most_common(1)[0][1] == 1
    finally:
        receiver.close()
        for worker in (dying, survivor):
            if worker is not None:
                worker.stop()
