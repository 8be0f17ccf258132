"""Operational events (CONTRACT 8.5), through a real worker: `webhook.endpoint_failing` once
when an endpoint's failures in a row first reach half the disable threshold (again only after a
success resets the count), `webhook.endpoint_disabled` once when the service disables it
(repeated failures or 410 Gone), each to the brand's other active endpoints subscribed to it,
never to the endpoint it is about, and not when the brand disables one by hand. Each carries the
attempt that made it (CONTRACT 13.4), as the endpoint's dashboard page shows it."""

from __future__ import annotations

import time

import pytest

from models.event_catalog import sample_data
from tests import test_webhook_delivery as delivery
from tests.dashboard import sign_in
from tests.receiver import Receiver, Reply
from tests.test_webhook_delivery import logs, poll, publish

api = delivery.api
workers = delivery.workers
start_worker = delivery.start_worker

OPERATIONAL = ["webhook.endpoint_failing", "webhook.endpoint_disabled"]


@pytest.fixture
def watcher() -> Receiver:
    """The brand's other endpoint, subscribed to the operational events."""
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def failing() -> Receiver:
    server = Receiver()
    yield server
    server.close()


def operational(receiver: Receiver) -> list[dict]:
    return [r.json for r in receiver.received if r.json["type"] in OPERATIONAL]


def settle(seconds: float = 1.5) -> None:
    """Give a worker time to send what it would send (for checks that nothing more comes)."""
    time.sleep(seconds)


def test_failing_then_disabled_each_arrive_once_at_the_other_endpoints(
    app, api, brand, watcher, failing, start_worker, client, write_key
):
    own = start_worker(
        WEBHOOK_DISABLE_FAILURES="4",
        WEBHOOK_DISABLE_WINDOW="0",
        WEBHOOK_RETRY_SCHEDULE="1,1,1,1,1",
        WEBHOOK_ENDPOINT_CONCURRENCY="1",
    )
    watching = api.register(watcher.url, events=OPERATIONAL)
    watcher.secrets = [watching["signingSecret"]]
    # The failing endpoint subscribes to them too: it must not hear about itself.
    sick = api.register(failing.url, events=["deal.completed", *OPERATIONAL])
    # An answer longer than an alert carries (the log keeps more of it).
    answer = ("upstream down; " * 120).encode()
    failing.default = Reply(status=500, body=answer)
    [(published, [sent])] = publish(app, brand, ("deal.completed", {"n": 1}))

    disabled = poll(
        lambda: api.endpoint(sick["id"]),
        lambda e: not e["isActive"],
        timeout=30,
        what="the failing endpoint disabled",
        worker=own,
    )
    events = poll(
        lambda: operational(watcher),
        lambda found: len(found) >= 2,
        timeout=15,
        what="both operational events",
        worker=own,
    )
    settle()
    events = operational(watcher)
    assert [e["type"] for e in events] == OPERATIONAL, logs(own)  # each once, in order
    failing_event, disabled_event = events
    # The one delivery to the sick endpoint failed each time: its attempts 2 and 4 made them.
    attempts = api.delivery(sent)["attempts"]
    stored = attempts[1]["responseBody"]
    assert len(stored) > 1024
    assert attempts[3]["responseBody"] == stored
    last_attempt = {
        "deliveryId": sent,
        "eventId": published,
        "eventType": "deal.completed",
        "httpStatus": 500,
        "error": "HTTP 500",
        "responseBody": stored[:1024],  # CONTRACT 13.4: the first 1,024 characters as stored
    }
    assert failing_event["data"] == {
        "endpointId": sick["id"],
        "url": failing.url,
        "consecutiveFailures": 2,  # half of 4
        "lastError": "HTTP 500",
        "disabledAt": None,
        "lastAttempt": last_attempt,
    }
    assert disabled_event["data"]["lastAttempt"] == last_attempt
    assert disabled_event["data"]["endpointId"] == sick["id"]
    assert disabled_event["data"]["consecutiveFailures"] == 4
    assert disabled_event["data"]["lastError"] == "HTTP 500"
    assert disabled_event["data"]["disabledAt"] == disabled["disabledAt"]
    assert disabled_event["brandId"] == brand
    for event in events:  # the catalogue's samples (on /docs) have the real events' fields
        assert set(event["data"]) == set(sample_data(event["type"]))
    assert all(r.signature_valid for r in watcher.received)
    assert operational(failing) == []

    # The endpoint's page says the same under its state.
    sign_in(client, write_key)
    page = client.get(f"/dashboard/endpoints/{sick['id']}").get_data(as_text=True)
    notice = page.split("data-last-failure", 1)[1].split("</section>", 1)[0]
    assert sent in notice and "deal.completed" in notice and "HTTP 500" in notice
    assert stored[:1024] in notice and stored[:1025] not in notice


def test_failing_is_announced_again_only_after_a_success(
    app, api, brand, watcher, failing, start_worker
):
    own = start_worker(
        WEBHOOK_DISABLE_FAILURES="4",
        WEBHOOK_DISABLE_WINDOW="3600",  # never disabled in this test
        WEBHOOK_RETRY_SCHEDULE="1,1,1,1,1,1",
        WEBHOOK_ENDPOINT_CONCURRENCY="1",
    )
    api.register(watcher.url, events=OPERATIONAL)
    sick = api.register(failing.url, events=["deal.completed"])
    # Two failures (failing), two more (still failing: no second event), then a success,
    # then two failures again (failing again).
    failing.reply_with(*[Reply(status=503)] * 4, Reply(), *[Reply(status=503)] * 2)
    publish(app, brand, ("deal.completed", {"n": 1}))
    failing.wait_for(5, timeout=30)
    publish(app, brand, ("deal.completed", {"n": 2}))
    failing.wait_for(8, timeout=30)
    poll(
        lambda: operational(watcher),
        lambda found: len(found) >= 2,
        timeout=15,
        what="the second failing event",
        worker=own,
    )
    settle()
    events = operational(watcher)
    assert [e["type"] for e in events] == ["webhook.endpoint_failing"] * 2, logs(own)
    assert {e["data"]["endpointId"] for e in events} == {sick["id"]}
    assert api.endpoint(sick["id"])["isActive"]


def test_a_410_is_announced_as_disabled_and_a_manual_disable_is_not(
    app, api, brand, watcher, failing, start_worker
):
    own = start_worker()
    api.register(watcher.url, events=OPERATIONAL)
    gone = api.register(failing.url, events=["deal.completed"])
    failing.default = Reply(status=410)
    publish(app, brand, ("deal.completed", {"n": 1}))
    [event] = poll(
        lambda: operational(watcher),
        lambda found: len(found) >= 1,
        timeout=15,
        what="the disabled event",
        worker=own,
    )
    assert event["type"] == "webhook.endpoint_disabled"
    assert event["data"]["endpointId"] == gone["id"]
    assert "410" in event["data"]["lastError"]
    assert event["data"]["lastAttempt"]["httpStatus"] == 410
    assert event["data"]["lastAttempt"]["error"] == event["data"]["lastError"]
    assert event["data"]["lastAttempt"]["responseBody"] == "ok"  # the receiver's answer

    by_hand = api.register(f"{failing.url}/other", events=["deal.completed"])
    api.call("PATCH", f"webhook/{by_hand['id']}/update-endpoint", json={"isActive": False})
    settle()
    assert len(operational(watcher)) == 1  # the brand knows what it did itself
