"""Supervised, observable delivery (issue 34): a worker whose loop dies exits non-zero and says
why; the LISTEN connection comes back after any loss and long-poll waiters still wake; a
database connection gone half-open is noticed and replaced; no delivery is ever attempted twice
at once, however slow a round; an endpoint that answers again gets its retries within seconds;
and every loop's last round is on `GET /metrics`."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import threading
import time
from collections import defaultdict

import psycopg
import requests
from sqlalchemy import select

from extensions import db
from models import WebhookAttempt
from services.delivery.loop import EXIT_LOOP_DIED
from services.wakeups import conninfo_for
from tests.receiver import Receiver, Reply
from tests.server_process import ServerProcess
from tests.test_webhook_delivery import Api, poll, publish
from tests.worker_process import WorkerProcess


def test_a_worker_whose_loop_dies_exits_non_zero_and_says_why(app_environ):
    worker = WorkerProcess(app_environ, FAILPOINTS="delivery.loop=raise")
    try:
        status = worker.process.wait(30)
        assert status == EXIT_LOOP_DIED, worker.output()
        output = worker.output()
        assert "the webhook delivery loop died" in output
        assert "FailpointError" in output  # its traceback, for whoever reads the log
    finally:
        worker.stop()


def test_a_terminated_listen_connection_comes_back_and_waiters_still_wake(
    app, app_environ, brand, make_key
):
    key = make_key(brand, scopes=("read",))
    server = ServerProcess(app_environ, workers=1, threads=8)
    try:
        url = f"{server.url}/api/v1/brand/{brand}/event/fetch-events"
        # A first wait starts the server's listener.
        newest = requests.get(
            url, params={"wait": 1}, headers={"X-Api-Key": key}, timeout=10
        ).json()["meta"]
        with app.app_context(), psycopg.connect(conninfo_for(db.engine), autocommit=True) as admin:
            # Every listener of that server (its worker's), killed from the database's side.
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE %s",
                ("%listener",),
            ).fetchone()[0]
        assert killed >= 1
        waited = {}

        def wait_for_an_event():
            started = time.monotonic()
            answer = requests.get(
                url,
                params={"wait": 30, **({"after": newest["nextAfter"]} if newest else {})},
                headers={"X-Api-Key": key},
                timeout=40,
            )
            waited["events"] = answer.json()["data"]["events"]
            waited["seconds"] = time.monotonic() - started

        waiter = threading.Thread(target=wait_for_an_event)
        waiter.start()
        time.sleep(3)  # the waiter waits; the listener has reconnected meanwhile
        [(event_id, _)] = publish(app, brand, ("deal.completed", {"n": 1}))
        waiter.join(40)
        assert [event["id"] for event in waited["events"]] == [event_id]
        assert waited["seconds"] < 10, waited  # woken, not the whole 30 s wait
        assert "wake-up listener lost its connection" in server.output()
    finally:
        server.stop()


class FreezingProxy:
    """A TCP proxy to PostgreSQL that can stop forwarding the connections it holds without
    closing them (a half-open connection, as after a failover or a dropped NAT entry): the
    kernel still acknowledges every packet, so only a deadline of the client's notices."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.frozen: set[int] = set()
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    def freeze_all(self) -> None:
        """Every connection open now stops forwarding (in both directions); new ones work."""
        self.frozen = set(range(self.connections))

    async def _serve(self, reader, writer) -> None:
        number = self.connections
        self.connections += 1
        upstream_reader, upstream_writer = await asyncio.open_connection(
            "127.0.0.1", self.target_port
        )

        async def pump(source, sink):
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    while number in self.frozen:
                        await asyncio.sleep(3600)
                    sink.write(data)
                    await sink.drain()

        await asyncio.gather(pump(reader, upstream_writer), pump(upstream_reader, writer))


def test_a_half_open_database_connection_is_noticed_and_replaced(
    app, app_environ, brand, make_key, client, backends
):
    if backends.postgres_kind != "server":
        return  # the embedded PostgreSQL listens on a Unix socket only
    receiver = Receiver()
    worker = None
    try:
        api = Api(client, brand, make_key(brand))
        api.register(receiver.url, events=["deal.completed"])
        url = app_environ["DATABASE_URL"]
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        proxy = FreezingProxy(port)
        proxied = url.replace(f":{port}/", f":{proxy.port}/")
        worker = WorkerProcess({**app_environ, "DATABASE_URL": proxied})
        publish(app, brand, ("deal.completed", {"n": 0}))
        receiver.wait_for(1, timeout=30)
        proxy.freeze_all()
        frozen_at = time.monotonic()
        publish(app, brand, ("deal.completed", {"n": 1}))
        [_, second] = receiver.wait_for(2, timeout=45)
        assert second.received_at - frozen_at < 30, worker.output()[-3000:]
        assert "its database connection is shut and replaced" in worker.output()
    finally:
        receiver.close()
        if worker is not None:
            worker.stop()


def test_no_delivery_is_ever_attempted_twice_at_once_however_slow_a_round(
    app, app_environ, brand, make_key, client
):
    """Rounds made slow (a failpoint before each claim) beside a receiver slower than the
    attempt's timeout: every attempt of a delivery ends before its next begins, each is
    logged once with its own number, and the receiver never holds two of one delivery."""
    receiver = Receiver()
    receiver.default = Reply(delay=1.5)
    worker = None
    try:
        api = Api(client, brand, make_key(brand))
        api.register(receiver.url, events=["deal.completed"])
        published = publish(app, brand, *(("deal.completed", {"n": n}) for n in range(4)))
        delivery_ids = [ids[0] for _, ids in published]
        worker = WorkerProcess(
            app_environ,
            WEBHOOK_TIMEOUT="1",
            WEBHOOK_RETRY_SCHEDULE="1,1,1",
            FAILPOINTS="delivery.before_claim=sleep:1.5",
        )

        def attempts():
            with app.app_context():
                rows = db.session.scalars(
                    select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(delivery_ids))
                ).all()
                db.session.remove()
            return rows

        def each_retried(rows) -> bool:
            made = defaultdict(int)
            for attempt in rows:
                made[attempt.delivery_id] += 1
            return len(made) == len(delivery_ids) and min(made.values()) >= 2

        rows = poll(attempts, each_retried, timeout=120, what="2 attempts of each delivery")
        by_delivery = defaultdict(list)
        for attempt in rows:
            by_delivery[attempt.delivery_id].append(attempt)
        for delivery_id, made in by_delivery.items():
            made.sort(key=lambda a: a.attempt_number)
            assert [a.attempt_number for a in made] == list(range(1, len(made) + 1))
            for earlier, later in itertools.pairwise(made):
                ended = earlier.requested_at.timestamp() + earlier.duration_ms / 1000
                assert later.requested_at.timestamp() >= ended - 0.05, (delivery_id, made)
        sent = defaultdict(int)
        for request in receiver.received:
            sent[request.delivery_id] += 1
        recorded = {d: len(made) for d, made in by_delivery.items()}
        # What the receiver got is what was recorded (one in flight, not yet, at most).
        assert all(recorded.get(d, 0) <= n <= recorded.get(d, 0) + 1 for d, n in sent.items())
    finally:
        receiver.close()
        if worker is not None:
            worker.stop()


def test_an_endpoint_that_answers_again_gets_its_retries_in_seconds(
    app, app_environ, brand, make_key, client
):
    receiver = Receiver()
    receiver.default = Reply(status=503)
    worker = None
    try:
        api = Api(client, brand, make_key(brand))
        api.register(receiver.url, events=["deal.completed"])
        worker = WorkerProcess(app_environ, WEBHOOK_RETRY_SCHEDULE="3600,3600")
        published = publish(app, brand, *(("deal.completed", {"n": n}) for n in range(5)))
        waiting = [ids[0] for _, ids in published]
        for delivery_id in waiting:
            api.wait_delivery(delivery_id, lambda d: d["attemptCount"] == 1, worker=worker)
        receiver.default = Reply()  # it is back: the next event's attempt succeeds
        [(_, [fresh])] = publish(app, brand, ("deal.completed", {"n": 99}))
        started = time.monotonic()
        api.wait_delivery(fresh, "delivered", timeout=30, worker=worker)
        for delivery_id in waiting:
            api.wait_delivery(delivery_id, "delivered", timeout=15, worker=worker)
        # An hour early: brought forward by the success, not by their schedule.
        assert time.monotonic() - started < 20
    finally:
        receiver.close()
        if worker is not None:
            worker.stop()


def test_every_loops_last_round_is_on_the_metrics(app_environ, client):
    worker = WorkerProcess(app_environ)
    try:

        def ages():
            text = client.get("/metrics").get_data(as_text=True)
            return [
                line
                for line in text.splitlines()
                if line.startswith("brand_api_delivery_loop_last_round_age_seconds{")
                and f":{worker.pid}" in line
            ]

        [line] = poll(ages, bool, timeout=20, what="the worker's loop on /metrics")
        assert float(line.rsplit(" ", 1)[1]) < 5
        host = socket.gethostname()
        assert f'loop="{host}:{worker.pid}"' in line
        worker.process.terminate()
        worker.process.wait(20)
        assert ages() == []  # a clean stop takes it off
    finally:
        worker.stop()
