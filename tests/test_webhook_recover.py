"""Recover (CONTRACT 8.3): after an outage, one call sends again every failed delivery of an
endpoint in a window, once, in the order they were first created, through a real worker."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from tests import test_webhook_delivery as delivery
from tests.helpers import assert_error
from tests.receiver import Reply
from tests.test_webhook_delivery import logs, publish

api = delivery.api
workers = delivery.workers
start_worker = delivery.start_worker


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def recover(api, endpoint_id: str, **body) -> dict:
    return api.call("POST", f"webhook/{endpoint_id}/recover", 202, json=body)


def test_a_recover_after_an_outage_sends_each_failed_event_once_more(
    app, api, brand, receiver, start_worker
):
    own = start_worker(WEBHOOK_RETRY_SCHEDULE="1", WEBHOOK_ENDPOINT_CONCURRENCY="1")
    endpoint = api.register(receiver.url, events=["deal.completed"])
    receiver.secrets = [endpoint["signingSecret"]]
    started = datetime.now(UTC) - timedelta(seconds=1)
    # The outage: every attempt fails, and each delivery gives up after its one retry.
    receiver.default = Reply(status=503)
    published = publish(app, brand, *(("deal.completed", {"n": n}) for n in range(5)))
    event_ids = [event_id for event_id, _ in published]
    failed_ids = [ids[0] for _, ids in published]
    for delivery_id in failed_ids:
        api.wait_delivery(delivery_id, "failed", timeout=20, worker=own)
    # Meanwhile one delivered later on its own: not recovered.
    receiver.default = Reply()
    [(_, [fine])] = publish(app, brand, ("deal.completed", {"n": "fine"}))
    api.wait_delivery(fine, "delivered", worker=own)
    during_outage = len(receiver.received)

    answer = recover(api, endpoint["id"], since=iso(started))
    assert answer == {"endpointId": endpoint["id"], "queued": 5}
    again = recover(api, endpoint["id"], since=iso(started))  # at once: nothing twice
    assert again["queued"] == 0

    recovered = receiver.wait_for(during_outage + 5)[during_outage:]
    assert [r.json["id"] for r in recovered] == event_ids  # each once, in creation order
    assert all(r.signature_valid for r in recovered)
    assert not set(r.delivery_id for r in recovered) & set(failed_ids)  # new deliveries
    for request in recovered:
        api.wait_delivery(request.delivery_id, "delivered", worker=own)
    # The originals stay failed; the log keeps both.
    assert {api.delivery(d)["status"] for d in failed_ids} == {"failed"}
    assert recover(api, endpoint["id"], since=iso(started))["queued"] == 0
    delivery.no_more_requests(receiver, during_outage + 5, within=1.5)
    counts = Counter(r.json["id"] for r in receiver.received[during_outage:])
    assert set(counts.values()) == {1}, logs(own)


def test_recover_skips_what_was_redelivered_and_what_is_outside_the_window(
    app, api, brand, receiver, start_worker
):
    own = start_worker(WEBHOOK_RETRY_SCHEDULE="1")
    endpoint = api.register(receiver.url, events=["deal.completed"])
    receiver.default = Reply(status=500)
    first = publish(app, brand, ("deal.completed", {"n": 1}))[0][1][0]
    api.wait_delivery(first, "failed", timeout=20, worker=own)
    middle = datetime.now(UTC)
    second, third = (ids[0] for _, ids in publish(app, brand, *[("deal.completed", {})] * 2))
    for delivery_id in (second, third):
        api.wait_delivery(delivery_id, "failed", timeout=20, worker=own)
    receiver.default = Reply()
    redelivered = api.call("POST", f"webhook/deliveries/{third}/redeliver", 202)["deliveryId"]
    api.wait_delivery(redelivered, "delivered", worker=own)

    # From the middle: the first is too early, the third was redelivered already.
    assert recover(api, endpoint["id"], since=iso(middle))["queued"] == 1
    # Up to the middle: only the first.
    since = iso(middle - timedelta(minutes=5))
    assert recover(api, endpoint["id"], since=since, until=iso(middle))["queued"] == 1
    assert recover(api, endpoint["id"], since=since)["queued"] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "since"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-11-20T08:00:00"}, "since"),  # no offset: which 08:00?
        ({"since": "15 days ago"}, "since"),
    ],
)
def test_recover_refuses_a_bad_body(api, receiver, body, field):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    response = api.client.post(
        f"/api/v1/brand/{api.brand}/webhook/{endpoint['id']}/recover",
        headers={"X-Api-Key": api.key},
        json=body,
    )
    payload = assert_error(response, 400, "VALIDATION_ERROR")
    assert field in payload["errors"]


def test_recover_refuses_a_window_it_cannot_serve(api, receiver):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    now = datetime.now(UTC)
    path = f"/api/v1/brand/{api.brand}/webhook/{endpoint['id']}/recover"
    headers = {"X-Api-Key": api.key}
    for body, field in [
        ({"since": iso(now - timedelta(days=15))}, "since"),
        ({"since": iso(now + timedelta(hours=1))}, "since"),
        ({"since": iso(now - timedelta(hours=2)), "until": iso(now - timedelta(hours=3))}, "until"),
    ]:
        response = api.client.post(path, headers=headers, json=body)
        assert field in assert_error(response, 400, "VALIDATION_ERROR")["errors"], body


def test_recover_on_a_disabled_or_foreign_endpoint_is_not_found(
    api, receiver, make_brand, make_key, client
):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    since = iso(datetime.now(UTC) - timedelta(hours=1))
    api.call("PATCH", f"webhook/{endpoint['id']}/update-endpoint", json={"isActive": False})
    response = api.client.post(
        f"/api/v1/brand/{api.brand}/webhook/{endpoint['id']}/recover",
        headers={"X-Api-Key": api.key},
        json={"since": since},
    )
    assert_error(response, 404, "NOT_FOUND")
    other = make_brand("Other Foods")
    response = client.post(
        f"/api/v1/brand/{other}/webhook/{endpoint['id']}/recover",
        headers={"X-Api-Key": make_key(other)},
        json={"since": since},
    )
    assert_error(response, 404, "NOT_FOUND")
