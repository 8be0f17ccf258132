"""At least once (CONTRACT 6.2): Redis down when an event is recorded, or a worker SIGKILLed
mid-attempt, delays a delivery but never loses it. Each test runs its own worker processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from app import create_app
from extensions import db
from services.events import publish_event
from tests.helpers import assert_success
from tests.receiver import Reply
from tests.worker_process import WorkerProcess, workers_started_by_test

UNREACHABLE_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
def start_worker(app_environ) -> Iterator[Callable[..., WorkerProcess]]:
    with workers_started_by_test(app_environ) as start:
        yield start


def call(client, brand: str, key: str, method: str, path: str, status: int = 200, **kw) -> dict:
    response = client.open(
        f"/api/v1/brand/{brand}/{path}", method=method, headers={"X-Api-Key": key}, **kw
    )
    return assert_success(response, status)


def wait_for_delivery(client, brand, key, delivery_id, status, *, timeout, worker) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        detail = call(client, brand, key, "GET", f"webhook/deliveries/{delivery_id}")
        if detail["status"] == status:
            return detail
        if time.monotonic() > deadline:
            raise AssertionError(
                f"delivery {delivery_id} not {status}: {detail}\n{worker.output()}"
            )
        time.sleep(0.05)


def test_event_recorded_while_redis_is_down_is_delivered_later(
    app, app_environ, brand, write_key, receiver, start_worker
):
    offline = create_app({**app_environ, "REDIS_URL": UNREACHABLE_REDIS})
    client = offline.test_client()
    try:
        started = time.monotonic()
        endpoint = call(
            client,
            brand,
            write_key,
            "POST",
            "webhook/register-endpoint",
            201,
            json={"url": receiver.url},
        )
        receiver.secrets = [endpoint["signingSecret"]]
        ping = call(client, brand, write_key, "POST", f"webhook/{endpoint['id']}/send-test", 202)
        with offline.app_context():
            published = publish_event(brand_id=brand, name="deal.completed", data={"n": 1})
            [event_delivery] = published.delivery_ids
            db.session.commit()  # Redis is unreachable: nothing needs it
        assert time.monotonic() - started < 3.0, "recording events waited on the dead Redis"
    finally:
        with offline.app_context():
            db.session.remove()
            db.engine.dispose()
    delivery_ids = {ping["deliveryId"], event_delivery}
    for delivery_id in delivery_ids:
        detail = call(client, brand, write_key, "GET", f"webhook/deliveries/{delivery_id}")
        assert detail["status"] == "pending" and detail["attemptCount"] == 0

    worker = start_worker()  # it finds them due in the database

    requests = receiver.wait_for(2, timeout=15)
    assert {r.delivery_id for r in requests} == delivery_ids, worker.output()
    assert all(r.signature_valid for r in requests)
    assert {r.headers["X-Service-Event"] for r in requests} == {"webhook.test", "deal.completed"}
    for delivery_id in delivery_ids:
        detail = wait_for_delivery(
            client, brand, write_key, delivery_id, "delivered", timeout=10, worker=worker
        )
        assert detail["attemptCount"] == 1


def test_worker_killed_mid_attempt_is_redelivered_by_another(
    app, client, brand, write_key, receiver, start_worker
):
    endpoint = call(
        client,
        brand,
        write_key,
        "POST",
        "webhook/register-endpoint",
        201,
        json={"url": receiver.url},
    )
    receiver.secrets = [endpoint["signingSecret"]]
    release = threading.Event()
    receiver.reply_with(Reply(hold=release))
    doomed = start_worker()
    try:
        with app.app_context():
            [delivery_id] = publish_event(
                brand_id=brand, name="deal.completed", data={"n": 1}
            ).delivery_ids
            db.session.commit()
        [held] = receiver.wait_for(1, timeout=15)
        doomed.kill()  # mid-attempt: the request is still being held open
    finally:
        release.set()
    assert held.delivery_id == delivery_id
    detail = call(client, brand, write_key, "GET", f"webhook/deliveries/{delivery_id}")
    assert detail["status"] == "pending", detail
    assert detail["attemptCount"] == 0, detail

    successor = start_worker()  # it takes the delivery once the dead worker's lease lapses

    try:
        first, second = receiver.wait_for(2, timeout=25)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{doomed.output()}\n{successor.output()}") from None
    assert second.delivery_id == first.delivery_id == delivery_id
    assert second.signature_valid
    assert second.body == first.body
    detail = wait_for_delivery(
        client, brand, write_key, delivery_id, "delivered", timeout=10, worker=successor
    )
    assert detail["attempts"][-1]["httpStatus"] == 200
    assert detail["attemptCount"] == len(detail["attempts"]) == 1
    assert len(receiver.received) == 2
