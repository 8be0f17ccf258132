"""Webhook delivery end to end, as a brand observes it: real `flask worker` processes deliver to a
real HTTP receiver that checks signatures with its own HMAC code, and the delivery log is read
back through the API (CONTRACT 6.1-6.3).

Most tests share one fast worker (retries after 1 s, 1 s timeout, sweeps every second). A test
that needs other settings, or several workers, stops the shared one first (`start_worker`), since
workers share the Redis queue; the next test that wants the shared worker starts it again.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest

from config import DEFAULT_ENDPOINT_CONCURRENCY
from extensions import db
from services.events import publish_event
from tests.helpers import EVENT_ENVELOPE_KEYS, assert_error, assert_success
from tests.receiver import Receiver, Reply, expected_signature
from tests.worker_process import WorkerProcess, workers_started_by_test

DEAL_DATA = {"id": "deal_1", "status": "completed", "agreedAmountMinor": 45000000}


# ---------------------------------------------------------------------------------------------
# Workers


class Workers:
    """The module's shared fast worker, started on demand and stopped for tests with their own."""

    def __init__(self, environ: dict[str, str]) -> None:
        self.environ = environ
        self.shared: WorkerProcess | None = None

    def start_shared(self) -> WorkerProcess:
        if self.shared is None or self.shared.process.poll() is not None:
            self.shared = WorkerProcess(self.environ)
        return self.shared

    def stop_shared(self) -> None:
        if self.shared is not None:
            self.shared.stop()
            self.shared = None


@pytest.fixture(scope="module")
def workers(app, app_environ) -> Iterator[Workers]:
    pool = Workers(app_environ)
    yield pool
    pool.stop_shared()


@pytest.fixture
def worker(workers) -> WorkerProcess:
    """The shared fast worker (see the module docstring)."""
    return workers.start_shared()


@pytest.fixture
def start_worker(workers, app_environ) -> Iterator[Callable[..., WorkerProcess]]:
    """Start workers of the test's own (the shared one is stopped first); stopped afterwards."""
    workers.stop_shared()
    with workers_started_by_test(app_environ) as start:
        yield start


def logs(*processes: WorkerProcess) -> str:
    return "\n".join(f"--- worker {p.pid} ---\n{p.output()}" for p in processes)


# ---------------------------------------------------------------------------------------------
# The API, as a brand calls it


class Api:
    def __init__(self, client, brand: str, key: str) -> None:
        self.client = client
        self.brand = brand
        self.key = key

    def call(self, method: str, path: str, status: int = 200, **kwargs) -> dict:
        response = self.client.open(
            f"/api/v1/brand/{self.brand}/{path}",
            method=method,
            headers={"X-Api-Key": self.key},
            **kwargs,
        )
        return assert_success(response, status)

    def register(self, url: str, events: list[str] | None = None, **options) -> dict:
        """An endpoint; `options` are more fields of the request (`ordering="subject"`)."""
        body = (
            {"url": url, **options} if events is None else {"url": url, "events": events, **options}
        )
        return self.call("POST", "webhook/register-endpoint", 201, json=body)

    def send_test(self, endpoint_id: str) -> str:
        return self.call("POST", f"webhook/{endpoint_id}/send-test", 202)["deliveryId"]

    def delivery(self, delivery_id: str) -> dict:
        return self.call("GET", f"webhook/deliveries/{delivery_id}")

    def deliveries(self, **query) -> tuple[list[dict], dict]:
        response = self.client.get(
            f"/api/v1/brand/{self.brand}/webhook/fetch-deliveries",
            query_string=query,
            headers={"X-Api-Key": self.key},
        )
        data = assert_success(response)
        return data["deliveries"], response.get_json()["meta"]

    def endpoint(self, endpoint_id: str) -> dict:
        endpoints = self.call("GET", "webhook/fetch-endpoints")["endpoints"]
        [found] = [e for e in endpoints if e["id"] == endpoint_id]
        return found

    def wait_delivery(
        self,
        delivery_id: str,
        until: str | Callable[[dict], bool],
        *,
        timeout: float = 15.0,
        worker: WorkerProcess | None = None,
    ) -> dict:
        wanted = (lambda d: d["status"] == until) if isinstance(until, str) else until
        return poll(
            lambda: self.delivery(delivery_id),
            wanted,
            timeout=timeout,
            what=f"delivery {delivery_id} reaching {until}",
            worker=worker,
        )


def poll(fetch, until, *, timeout: float, what: str, worker: WorkerProcess | None = None):
    """Fetch until `until(value)` or the deadline; the last value and the log on failure."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if until(value):
            return value
        if time.monotonic() > deadline:
            log = logs(worker) if worker is not None else ""
            raise AssertionError(f"timed out waiting for {what}; last: {value}\n{log}")
        time.sleep(0.03)


@pytest.fixture
def api(client, brand, write_key) -> Api:
    return Api(client, brand, write_key)


def publish(app, brand: str, *events: tuple[str, dict]) -> list[tuple[str, list[str]]]:
    """Publish events in one transaction, as the platform does; [(event id, delivery ids)]."""
    with app.app_context():
        published = [publish_event(brand_id=brand, name=n, data=d) for n, d in events]
        ids = [(p.event.id, list(p.delivery_ids)) for p in published]
        db.session.commit()  # the commit queues the drain
    return ids


def publish_one(app, brand: str, name: str = "deal.completed", data=None) -> tuple[str, str]:
    [(event_id, [delivery_id])] = publish(app, brand, (name, data or DEAL_DATA))
    return event_id, delivery_id


def no_more_requests(receiver: Receiver, count: int, within: float) -> None:
    """The receiver gets no request beyond `count` within a bounded wait."""
    try:
        receiver.wait_for(count + 1, timeout=within)
    except AssertionError:
        return
    extra = [(r.delivery_id, r.headers.get("X-Service-Event")) for r in receiver.received[count:]]
    raise AssertionError(f"unexpected request(s) beyond the first {count}: {extra}")


def parse_time(value: str) -> datetime:
    assert value.endswith("Z"), value
    return datetime.fromisoformat(value)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def other_receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


# ---------------------------------------------------------------------------------------------
# 1. Success on the first attempt


def test_first_attempt_success_is_signed_and_logged(app, api, brand, receiver, worker):
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    receiver.reply_with(Reply(status=200, body=b'{"received":true}'))
    before = int(time.time())

    event_id, delivery_id = publish_one(app, brand)

    [request] = receiver.wait_for(1, timeout=15)
    assert request.signature_valid, request.headers
    assert request.path == "/hooks"
    headers = request.headers
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Service-Event"] == "deal.completed"
    assert headers["X-Service-Delivery"] == delivery_id
    assert re.fullmatch(r"sha256=[0-9a-f]{64}", headers["X-Service-Signature"])
    timestamp = headers["X-Service-Timestamp"]
    assert timestamp.isdigit() and before - 1 <= int(timestamp) <= time.time() + 1
    assert headers["X-Service-Signature"] == expected_signature(
        endpoint["signingSecret"], timestamp, request.body
    )
    body = request.json
    assert set(body) == set(EVENT_ENVELOPE_KEYS)
    assert body["id"] == event_id and event_id.startswith("evt_")
    assert body["subject"] == {"type": "deal", "id": DEAL_DATA["id"]}
    assert body["sequence"] == 1
    assert body["type"] == "deal.completed"
    assert body["brandId"] == brand
    assert body["apiVersion"] == "1"
    assert body["data"] == DEAL_DATA
    parse_time(body["createdAt"])

    detail = api.wait_delivery(delivery_id, "delivered", worker=worker)
    assert detail["httpStatus"] == 200
    assert detail["attemptCount"] == 1
    assert detail["lastError"] is None
    assert detail["nextRetryAt"] is None
    assert detail["deliveredAt"] is not None
    assert detail["eventId"] == event_id
    assert detail["endpointId"] == endpoint["id"]
    assert detail["payload"] == body
    [attempt] = detail["attempts"]
    assert attempt["attemptNumber"] == 1
    assert attempt["httpStatus"] == 200
    assert attempt["error"] is None
    assert attempt["responseBody"] == '{"received":true}'
    assert isinstance(attempt["durationMs"], int) and 0 <= attempt["durationMs"] < 1000
    parse_time(attempt["requestedAt"])
    assert attempt["requestHeaders"]["X-Service-Delivery"] == delivery_id
    assert attempt["requestHeaders"]["X-Service-Signature"] == headers["X-Service-Signature"]
    assert endpoint["signingSecret"] not in str(detail)
    no_more_requests(receiver, 1, within=1.0)


def test_response_body_is_kept_to_its_first_2_kib(app, api, brand, receiver, worker):
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    answer = (b"0123456789abcdef" * 400)[:5000]
    receiver.reply_with(Reply(status=200, body=answer))

    _, delivery_id = publish_one(app, brand)

    detail = api.wait_delivery(delivery_id, "delivered", worker=worker)
    [attempt] = detail["attempts"]
    assert attempt["httpStatus"] == 200
    assert attempt["responseBody"] == answer[:2048].decode()
    assert len(attempt["responseBody"].encode()) == 2048


# ---------------------------------------------------------------------------------------------
# 2-6. Retries and the ways an attempt fails


def test_500_then_200_retries_the_same_delivery(app, api, brand, receiver, worker):
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    receiver.reply_with(Reply(status=500, body=b"boom"))

    _, delivery_id = publish_one(app, brand)

    pending = api.wait_delivery(delivery_id, lambda d: d["attemptCount"] >= 1, worker=worker)
    assert pending["status"] == "pending", pending
    assert pending["attemptCount"] == 1
    assert pending["httpStatus"] == 500
    assert pending["lastError"] == "HTTP 500"
    assert pending["nextRetryAt"] is not None
    wait = parse_time(pending["nextRetryAt"]) - parse_time(pending["attempts"][0]["requestedAt"])
    assert 0.8 <= wait.total_seconds() <= 2.5, pending  # schedule 1 s, ±10% jitter

    detail = api.wait_delivery(delivery_id, "delivered", worker=worker)
    first, second = receiver.wait_for(2)
    assert first.delivery_id == second.delivery_id == delivery_id
    assert first.signature_valid and second.signature_valid
    assert first.body == second.body
    assert second.received_at - first.received_at >= 0.8
    assert detail["attemptCount"] == 2
    assert detail["httpStatus"] == 200
    assert detail["lastError"] is None
    assert detail["nextRetryAt"] is None
    assert [a["attemptNumber"] for a in detail["attempts"]] == [1, 2]
    assert detail["attempts"][0]["httpStatus"] == 500
    assert detail["attempts"][0]["error"] == "HTTP 500"
    assert detail["attempts"][0]["responseBody"] == "boom"
    assert detail["attempts"][1]["httpStatus"] == 200
    assert detail["attempts"][1]["error"] is None


def test_always_failing_delivery_fails_after_the_last_attempt(app, api, brand, receiver, worker):
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    receiver.reply_with(*[Reply(status=500)] * 10)

    _, delivery_id = publish_one(app, brand)

    detail = api.wait_delivery(delivery_id, "failed", worker=worker)
    assert detail["attemptCount"] == 3  # schedule 1,1: the first attempt and two retries
    assert detail["lastError"] == "HTTP 500"
    assert detail["httpStatus"] == 500
    assert detail["nextRetryAt"] is None
    assert detail["deliveredAt"] is None
    assert [a["attemptNumber"] for a in detail["attempts"]] == [1, 2, 3]
    assert all(a["error"] == "HTTP 500" for a in detail["attempts"])
    requests = receiver.wait_for(3)
    assert [r.delivery_id for r in requests] == [delivery_id] * 3
    assert all(r.signature_valid for r in requests)
    no_more_requests(receiver, 3, within=1.2)


def test_redirect_is_not_followed_and_counts_as_a_failure(app, api, brand, receiver, worker):
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    elsewhere = f"http://127.0.0.1:{receiver.port}/redirected"
    receiver.reply_with(Reply(status=302, headers={"Location": elsewhere}))

    _, delivery_id = publish_one(app, brand)

    detail = api.wait_delivery(delivery_id, "delivered", worker=worker)
    first, second = detail["attempts"]
    assert first["httpStatus"] == 302
    assert first["error"].startswith("HTTP 302")
    assert "redirect" in first["error"].lower()
    assert second["httpStatus"] == 200 and second["error"] is None
    assert detail["attemptCount"] == 2
    assert [r.path for r in receiver.received] == ["/hooks", "/hooks"]


def test_receiver_slower_than_the_timeout_fails_the_attempt(app, api, brand, receiver, worker):
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    receiver.reply_with(Reply(delay=2.5))

    _, delivery_id = publish_one(app, brand)

    detail = api.wait_delivery(delivery_id, "delivered", worker=worker)
    first, second = detail["attempts"]
    assert "timed out" in first["error"].lower(), first
    assert first["httpStatus"] is None
    assert 900 <= first["durationMs"] < 2500, first
    assert second["httpStatus"] == 200
    requests = receiver.wait_for(2)
    assert {r.delivery_id for r in requests} == {delivery_id}


def test_connection_refused_is_reported(app, api, brand, worker):
    endpoint = api.register(f"http://127.0.0.1:{closed_port()}/hooks")

    _, delivery_id = publish_one(app, brand)

    detail = api.wait_delivery(delivery_id, lambda d: d["attemptCount"] >= 1, worker=worker)
    assert detail["lastError"] == "Connection refused"
    assert detail["httpStatus"] is None
    first = detail["attempts"][0]
    assert first["error"] == "Connection refused"
    assert first["httpStatus"] is None
    assert first["responseBody"] is None
    assert api.endpoint(endpoint["id"])["consecutiveFailures"] >= 1


# ---------------------------------------------------------------------------------------------
# 8-12. What the brand does with its endpoints


def test_rotated_secret_signs_later_deliveries(app, api, brand, receiver, worker):
    endpoint = api.register(receiver.url)
    old_secret = endpoint["signingSecret"]
    receiver.secrets = [old_secret]
    _, before = publish_one(app, brand)
    [first] = receiver.wait_for(1)
    assert first.delivery_id == before and first.signature_valid

    rotated = api.call("POST", f"webhook/{endpoint['id']}/rotate-secret")
    assert rotated["id"] == endpoint["id"]
    new_secret = rotated["signingSecret"]
    assert new_secret and new_secret != old_secret

    _, after_rotation = publish_one(app, brand)
    second = receiver.wait_for(2)[1]
    assert second.delivery_id == after_rotation
    assert not second.signature_valid  # the receiver still knows only the old secret
    timestamp = second.headers["X-Service-Timestamp"]
    signature = second.headers["X-Service-Signature"]
    assert signature == expected_signature(new_secret, timestamp, second.body)
    assert signature != expected_signature(old_secret, timestamp, second.body)

    receiver.secrets = [new_secret]
    _, later = publish_one(app, brand)
    third = receiver.wait_for(3)[2]
    assert third.delivery_id == later and third.signature_valid
    api.wait_delivery(later, "delivered", worker=worker)


def test_deleting_an_endpoint_fails_its_pending_deliveries(app, api, brand, receiver, start_worker):
    # A timeout longer than the test: the attempts in flight are still held at the delete.
    worker = start_worker(WEBHOOK_TIMEOUT="10")
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    release = threading.Event()
    in_flight = DEFAULT_ENDPOINT_CONCURRENCY  # the worker runs with the default
    receiver.reply_with(*(Reply(hold=release) for _ in range(in_flight)))
    try:
        published = publish(
            app, brand, *(("deal.completed", {"n": n}) for n in range(in_flight + 1))
        )
        delivery_ids = [ids[0] for _, ids in published]
        # The endpoint's slots are all in flight (held), the last delivery is due and waits
        # its turn.
        held = receiver.wait_for(in_flight)
        deleted = api.call("DELETE", f"webhook/{endpoint['id']}/delete-endpoint")
        assert deleted["id"] == endpoint["id"]
    finally:
        release.set()

    assert {request.delivery_id for request in held} == set(delivery_ids[:in_flight])
    # The one waiting its turn ends failed (the worker's bulk job), never attempted.
    waiting = poll(
        lambda: api.delivery(delivery_ids[-1]),
        lambda detail: detail["status"] != "pending",
        timeout=10,
        what="the queued delivery of the deleted endpoint, ended",
        worker=worker,
    )
    assert waiting["status"] == "failed" and waiting["attempts"] == [], waiting
    assert waiting["nextRetryAt"] is None
    assert "deleted" in waiting["lastError"].lower(), waiting

    # The attempts in flight are recorded when they end: the log says what the receiver got
    # (a success is `delivered`, a failure stays `failed`).
    def settled_as_its_attempt(detail) -> bool:
        if len(detail["attempts"]) != 1:
            return False
        succeeded = detail["attempts"][0]["error"] is None
        return detail["status"] == ("delivered" if succeeded else "failed")

    for delivery_id in delivery_ids[:in_flight]:
        detail = poll(
            lambda d=delivery_id: api.delivery(d),
            settled_as_its_attempt,
            timeout=10,
            what=f"the attempt of {delivery_id} in flight at the delete, recorded",
            worker=worker,
        )
        assert detail["nextRetryAt"] is None
    # Nothing more reaches the receiver for them: not the waiting delivery, not a retry.
    try:
        no_more_requests(receiver, in_flight, within=2.0)
    except AssertionError as error:
        raise AssertionError(
            f"after the endpoint was deleted (deliveries {delivery_ids}): {error}\n{logs(worker)}"
        ) from None


def test_redeliver_sends_the_same_event_as_a_new_delivery(app, api, brand, receiver, worker):
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    event_id, original = publish_one(app, brand)
    api.wait_delivery(original, "delivered", worker=worker)

    again = api.call("POST", f"webhook/deliveries/{original}/redeliver", 202)["deliveryId"]

    assert again.startswith("whd_") and again != original
    first, second = receiver.wait_for(2)
    assert second.delivery_id == again
    assert second.signature_valid
    assert second.json["id"] == event_id
    assert second.body == first.body
    assert second.headers["X-Service-Event"] == "deal.completed"
    detail = api.wait_delivery(again, "delivered", worker=worker)
    assert detail["eventId"] == event_id
    assert detail["endpointId"] == endpoint["id"]
    assert detail["attemptCount"] == 1
    listed, meta = api.deliveries(endpointId=endpoint["id"])
    assert meta["total"] == 2
    assert {d["id"] for d in listed} == {original, again}
    assert {d["eventId"] for d in listed} == {event_id}


def test_endpoints_receive_only_their_subscribed_events(
    app, api, brand, receiver, other_receiver, worker
):
    deals = api.register(receiver.url, events=["deal.completed"])
    money = api.register(other_receiver.url, events=["escrow.released", "conversion.recorded"])
    receiver.secrets = [deals["signingSecret"]]
    other_receiver.secrets = [money["signingSecret"]]

    published = publish(
        app,
        brand,
        ("deal.completed", {"n": 1}),
        ("escrow.released", {"n": 2}),
        ("campaign.published", {"n": 3}),
        ("conversion.recorded", {"n": 4}),
    )

    assert [len(ids) for _, ids in published] == [1, 1, 0, 1]
    for _, ids in published:
        for delivery_id in ids:
            api.wait_delivery(delivery_id, "delivered", worker=worker)
    assert [r.headers["X-Service-Event"] for r in receiver.wait_for(1)] == ["deal.completed"]
    assert sorted(r.headers["X-Service-Event"] for r in other_receiver.wait_for(2)) == [
        "conversion.recorded",
        "escrow.released",
    ]
    assert all(r.signature_valid for r in receiver.received + other_receiver.received)
    listed, meta = api.deliveries(endpointId=deals["id"])
    assert meta["total"] == 1 and listed[0]["eventName"] == "deal.completed"
    _, meta = api.deliveries(eventName="campaign.published")
    assert meta["total"] == 0

    # The test ping reaches an endpoint whatever its subscriptions.
    ping = api.send_test(deals["id"])
    requests = receiver.wait_for(2)
    assert requests[1].delivery_id == ping
    assert requests[1].signature_valid
    assert requests[1].headers["X-Service-Event"] == "webhook.test"
    assert requests[1].json["type"] == "webhook.test"
    assert requests[1].json["data"]["endpointId"] == deals["id"]
    assert requests[1].json["data"]["message"]
    api.wait_delivery(ping, "delivered", worker=worker)
    assert len(other_receiver.received) == 2


def test_consecutive_failures_count_attempts_and_reset_on_success(
    app, api, brand, receiver, worker
):
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    receiver.reply_with(Reply(status=500), Reply(status=503))
    assert endpoint["consecutiveFailures"] == 0

    _, delivery_id = publish_one(app, brand)

    seen: list[int] = []

    def observe():
        seen.append(api.endpoint(endpoint["id"])["consecutiveFailures"])
        return api.delivery(delivery_id)

    detail = poll(
        observe,
        lambda d: d["status"] != "pending",
        timeout=15,
        what="the delivery to finish",
        worker=worker,
    )
    assert detail["status"] == "delivered"
    assert detail["attemptCount"] == 3
    assert [a["error"] for a in detail["attempts"]] == ["HTTP 500", "HTTP 503", None]
    assert 1 in seen and 2 in seen, seen
    assert max(seen) == 2, seen
    assert api.endpoint(endpoint["id"])["consecutiveFailures"] == 0


# ---------------------------------------------------------------------------------------------
# 7. Disabling an endpoint after repeated failures (from here on, tests run their own workers)


def test_endpoint_is_disabled_after_the_threshold_and_can_be_re_enabled(
    app, api, brand, receiver, start_worker
):
    # One attempt at a time: a success in flight beside the third failure would reset the run.
    own = start_worker(
        WEBHOOK_DISABLE_FAILURES="3", WEBHOOK_DISABLE_WINDOW="0", WEBHOOK_ENDPOINT_CONCURRENCY="1"
    )
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    receiver.reply_with(*[Reply(status=500)] * 3)

    published = publish(app, brand, *[("deal.completed", {"n": n}) for n in range(5)])
    delivery_ids = [ids[0] for _, ids in published]

    disabled = poll(
        lambda: api.endpoint(endpoint["id"]),
        lambda e: not e["isActive"],
        timeout=15,
        what="the endpoint being disabled",
        worker=own,
    )
    assert disabled["disabledAt"] is not None
    assert disabled["consecutiveFailures"] == 3
    assert "3 consecutive failed attempts" in disabled["disabledReason"]
    details = [api.wait_delivery(d, "failed", worker=own) for d in delivery_ids]
    assert sum(d["attemptCount"] for d in details) == 3
    never_tried = [d for d in details if d["attemptCount"] == 0]
    assert len(never_tried) == 2
    assert all("disabled" in d["lastError"].lower() for d in never_tried)
    assert len(receiver.received) == 3
    # A disabled endpoint takes no test ping.
    response = api.client.post(
        f"/api/v1/brand/{brand}/webhook/{endpoint['id']}/send-test",
        headers={"X-Api-Key": api.key},
    )
    assert_error(response, 404, "NOT_FOUND")

    enabled = api.call(
        "PATCH", f"webhook/{endpoint['id']}/update-endpoint", json={"isActive": True}
    )
    assert enabled["isActive"] is True
    assert enabled["consecutiveFailures"] == 0
    assert enabled["disabledAt"] is None

    _, delivery_id = publish_one(app, brand)
    detail = api.wait_delivery(delivery_id, "delivered", worker=own)
    assert detail["attemptCount"] == 1
    requests = receiver.wait_for(4)
    assert requests[3].delivery_id == delivery_id and requests[3].signature_valid
    assert api.endpoint(endpoint["id"])["consecutiveFailures"] == 0
    # The deliveries that failed with the endpoint stay failed.
    assert all(api.delivery(d)["status"] == "failed" for d in delivery_ids)


def test_failures_younger_than_the_window_do_not_disable(app, api, brand, receiver, start_worker):
    # The receiver answers at once; a loaded machine must not turn its 500s into timeouts.
    own = start_worker(
        WEBHOOK_DISABLE_FAILURES="3", WEBHOOK_DISABLE_WINDOW="3600", WEBHOOK_TIMEOUT="10"
    )
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    receiver.reply_with(*[Reply(status=500)] * 20)

    published = publish(app, brand, *[("deal.completed", {"n": n}) for n in range(4)])

    state = poll(
        lambda: api.endpoint(endpoint["id"]),
        lambda e: e["consecutiveFailures"] >= 4,
        timeout=15,
        what="four failed attempts",
        worker=own,
    )
    assert state["isActive"] is True
    assert state["disabledAt"] is None
    assert state["disabledReason"] is None
    for _, [delivery_id] in published:
        detail = api.delivery(delivery_id)
        assert detail["status"] == "pending", detail  # retrying, not failed by a disable
        assert detail["lastError"] == "HTTP 500"
        assert detail["nextRetryAt"] is not None
    assert api.endpoint(endpoint["id"])["isActive"] is True


# ---------------------------------------------------------------------------------------------
# 13. The address is checked again at every attempt


def test_attempt_to_a_local_address_is_refused_in_production(
    app, api, brand, receiver, start_worker
):
    # Registered while the app runs as `test` (local receivers allowed there)...
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]
    # ...then attempted by a production worker, where they are not.
    production = start_worker(APP_ENV="production")

    _, delivery_id = publish_one(app, brand)

    detail = api.wait_delivery(delivery_id, lambda d: d["attemptCount"] >= 1, worker=production)
    assert detail["lastError"].startswith("Not sent:"), detail
    [attempt] = detail["attempts"][:1]
    assert attempt["error"].startswith("Not sent:"), attempt
    assert attempt["httpStatus"] is None
    assert receiver.received == []


# ---------------------------------------------------------------------------------------------
# 14. Two workers at once


def test_two_workers_deliver_every_delivery_exactly_once(app, api, brand, receiver, start_worker):
    one = start_worker()
    two = start_worker()
    endpoint = api.register(receiver.url)
    receiver.secrets = [endpoint["signingSecret"]]

    delivery_ids: list[str] = []
    for batch in range(40):  # separate commits, so that drains overlap
        published = publish(
            app, brand, *[("deal.completed", {"n": batch * 5 + i}) for i in range(5)]
        )
        delivery_ids += [ids[0] for _, ids in published]
    assert len(set(delivery_ids)) == 200

    try:
        requests = receiver.wait_for(200, timeout=40)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{logs(one, two)}") from None
    poll(
        lambda: api.deliveries(status="delivered", limit=1),
        lambda found: found[1]["total"] == 200,
        timeout=15,
        what="200 delivered deliveries",
    )
    no_more_requests(receiver, 200, within=1.5)
    counts = Counter(r.delivery_id for r in receiver.received)
    duplicates = {d: n for d, n in counts.items() if n > 1}
    assert not duplicates, f"received more than once: {duplicates}\n{logs(one, two)}"
    assert set(counts) == set(delivery_ids)
    assert all(r.signature_valid for r in requests)
    _, pending = api.deliveries(status="pending", limit=1)
    _, failed = api.deliveries(status="failed", limit=1)
    assert pending["total"] == 0 and failed["total"] == 0
