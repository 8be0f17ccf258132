"""The delivery log (SPEC sections 4 and 6, CONTRACT 4 and 6): fan-out of published events,
fetch-deliveries with its filters, paging and sorting, one delivery's detail, and redeliver."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import update

from extensions import db
from models import WebhookDelivery
from models.columns import utcnow
from services.events import publish_event
from tests.delivery_states import settle
from tests.helpers import EVENT_ENVELOPE_KEYS, assert_error, assert_success
from tests.receiver import Reply
from tests.worker_process import WorkerProcess

HOOK_URL = "https://hooks.brand-example.invalid/x"
DELIVERY_FIELDS = {
    "id",
    "endpointId",
    "eventId",
    "eventName",
    "status",
    "retrying",
    "httpStatus",
    "attemptCount",
    "lastError",
    "deliveredAt",
    "nextRetryAt",
    "createdAt",
    "heldBehind",
}
ATTEMPT_FIELDS = {"attemptNumber", "requestedAt", "durationMs", "httpStatus", "error"}


def base(brand_id: str) -> str:
    return f"/api/v1/brand/{brand_id}/webhook"


def key_header(secret: str) -> dict:
    return {"X-Api-Key": secret}


def register(client, brand_id: str, key: str, url: str = HOOK_URL, events=None) -> str:
    body = {"url": url} if events is None else {"url": url, "events": events}
    response = client.post(
        f"{base(brand_id)}/register-endpoint", json=body, headers=key_header(key)
    )
    return assert_success(response, 201)["id"]


def publish(app, brand_id: str, name: str = "deal.completed", data=None, now=None) -> list[str]:
    with app.app_context():
        published = publish_event(
            brand_id=brand_id, name=name, data=data if data is not None else {"x": 1}, now=now
        )
        db.session.commit()
        return published.delivery_ids


def fetch(client, brand_id: str, key: str, **query):
    return client.get(
        f"{base(brand_id)}/fetch-deliveries", query_string=query, headers=key_header(key)
    )


def fetch_page(client, brand_id: str, key: str, **query) -> tuple[list[dict], dict]:
    response = fetch(client, brand_id, key, **query)
    data = assert_success(response)
    return data["deliveries"], response.get_json()["meta"]


def contract_meta(meta: dict) -> dict:
    """The paging fields CONTRACT section 3 promises (the service may add more)."""
    return {name: meta.get(name) for name in ("page", "limit", "total", "totalPages", "hasNext")}


def ids(client, brand_id: str, key: str, **query) -> list[str]:
    return [item["id"] for item in fetch_page(client, brand_id, key, **query)[0]]


def detail(client, brand_id: str, key: str, delivery_id: str) -> dict:
    response = client.get(f"{base(brand_id)}/deliveries/{delivery_id}", headers=key_header(key))
    return assert_success(response)


def redeliver(client, brand_id: str, key: str, delivery_id: str):
    return client.post(
        f"{base(brand_id)}/deliveries/{delivery_id}/redeliver", headers=key_header(key)
    )


def set_active(client, brand_id: str, key: str, endpoint_id: str, active: bool) -> None:
    response = client.patch(
        f"{base(brand_id)}/{endpoint_id}/update-endpoint",
        json={"isActive": active},
        headers=key_header(key),
    )
    assert_success(response)


@pytest.fixture
def timeline(app, client, brand, write_key) -> list[str]:
    """Five deliveries of `brand`, one second apart, oldest first."""
    register(client, brand, write_key)
    start = utcnow() - timedelta(minutes=5)
    return [publish(app, brand, now=start + timedelta(seconds=second))[0] for second in range(5)]


# --- fan-out -----------------------------------------------------------------------------------


def test_an_event_reaches_every_active_subscribed_endpoint_once(app, client, brand, write_key):
    first = register(client, brand, write_key, events=["deal.completed"])
    second = register(client, brand, write_key, events=["deal.completed", "escrow.held"])
    register(client, brand, write_key, events=["escrow.held"])
    disabled = register(client, brand, write_key, events=["deal.completed"])
    set_active(client, brand, write_key, disabled, False)

    delivery_ids = publish(app, brand, "deal.completed")
    listed, meta = fetch_page(client, brand, write_key)
    assert sorted(item["id"] for item in listed) == sorted(delivery_ids)
    assert sorted(item["endpointId"] for item in listed) == sorted([first, second])
    assert len({item["eventId"] for item in listed}) == 1
    assert meta["total"] == 2


def test_an_event_of_another_brand_is_not_delivered_here(app, client, brand, write_key, make_brand):
    register(client, brand, write_key)
    other = make_brand("Other")
    assert publish(app, other, "deal.completed") == []
    assert ids(client, brand, write_key) == []


# --- fetchWebhookDeliveries --------------------------------------------------------------------


def test_an_empty_log_is_a_success(client, brand, read_key):
    listed, meta = fetch_page(client, brand, read_key)
    assert listed == []
    assert meta["page"] == 1
    assert meta["limit"] == 20
    assert meta["total"] == 0
    assert meta["hasNext"] is False


def test_a_delivery_record_has_every_field(app, client, brand, write_key, read_key):
    endpoint = register(client, brand, write_key)
    [delivery_id] = publish(app, brand, "conversion.recorded")
    [item], _ = fetch_page(client, brand, read_key)
    assert set(item) == DELIVERY_FIELDS
    assert item["id"] == delivery_id
    assert item["id"].startswith("whd_")
    assert item["endpointId"] == endpoint
    assert item["eventId"].startswith("evt_")
    assert item["eventName"] == "conversion.recorded"
    assert item["status"] == "pending"
    assert item["httpStatus"] is None
    assert item["attemptCount"] == 0
    assert item["lastError"] is None
    assert item["deliveredAt"] is None
    assert item["createdAt"].endswith("Z")


def test_the_log_is_newest_first_by_default(client, brand, read_key, timeline):
    assert ids(client, brand, read_key) == list(reversed(timeline))
    assert ids(client, brand, read_key, sortOrder="desc") == list(reversed(timeline))


def test_sort_order_asc_is_oldest_first(client, brand, read_key, timeline):
    listed, _ = fetch_page(client, brand, read_key, sortOrder="asc")
    assert [item["id"] for item in listed] == timeline
    created = [item["createdAt"] for item in listed]
    assert created == sorted(created)


def test_paging_walks_the_whole_log_once(client, brand, read_key, timeline):
    first, meta = fetch_page(client, brand, read_key, limit=2)
    assert contract_meta(meta) == {
        "page": 1,
        "limit": 2,
        "total": 5,
        "totalPages": 3,
        "hasNext": True,
    }
    second, meta = fetch_page(client, brand, read_key, limit=2, page=2)
    assert meta["hasNext"] is True
    third, meta = fetch_page(client, brand, read_key, limit=2, page=3)
    assert contract_meta(meta) == {
        "page": 3,
        "limit": 2,
        "total": 5,
        "totalPages": 3,
        "hasNext": False,
    }
    walked = [item["id"] for item in first + second + third]
    assert walked == list(reversed(timeline))
    beyond, meta = fetch_page(client, brand, read_key, limit=2, page=4)
    assert beyond == []
    assert meta["total"] == 5
    assert meta["hasNext"] is False


def test_the_default_page_size_is_20_and_100_is_allowed(app, client, brand, write_key):
    register(client, brand, write_key)
    for _ in range(21):
        publish(app, brand)
    listed, meta = fetch_page(client, brand, write_key)
    assert len(listed) == 20
    assert meta["total"] == 21
    assert meta["hasNext"] is True
    listed, meta = fetch_page(client, brand, write_key, limit=100)
    assert len(listed) == 21
    assert meta["hasNext"] is False


def test_filters_by_status_event_and_endpoint(app, client, brand, write_key, read_key):
    kept = register(client, brand, write_key, events=["deal.completed", "escrow.held"])
    dropped = register(client, brand, write_key, events=["deal.completed"])
    [kept_deal, dropped_deal] = publish(app, brand, "deal.completed")
    [kept_escrow] = publish(app, brand, "escrow.held")
    set_active(client, brand, write_key, dropped, False)  # its pending delivery fails

    assert ids(client, brand, read_key, status="failed") == [dropped_deal]
    assert sorted(ids(client, brand, read_key, status="pending")) == sorted(
        [kept_deal, kept_escrow]
    )
    assert ids(client, brand, read_key, status="delivered") == []
    assert ids(client, brand, read_key, eventName="escrow.held") == [kept_escrow]
    assert sorted(ids(client, brand, read_key, eventName="deal.completed")) == sorted(
        [kept_deal, dropped_deal]
    )
    assert ids(client, brand, read_key, eventName="webhook.test") == []
    assert sorted(ids(client, brand, read_key, endpointId=kept)) == sorted([kept_deal, kept_escrow])
    assert ids(client, brand, read_key, endpointId=dropped) == [dropped_deal]
    combined = ids(client, brand, read_key, endpointId=kept, eventName="deal.completed")
    assert combined == [kept_deal]
    _, meta = fetch_page(client, brand, read_key, status="pending")
    assert meta["total"] == 2


def test_retrying_finds_the_pending_deliveries_whose_endpoint_is_failing(
    app, client, brand, write_key, read_key
):
    """A failing delivery stays `pending` for up to a day: `status=failed` does not find it,
    `retrying=true` does, and says so on each record."""
    register(client, brand, write_key)
    failing, waiting, settled = publish(app, brand), publish(app, brand), publish(app, brand)
    with app.app_context():
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == failing[0])
            .values(
                attempt_count=2,
                http_status=503,
                last_error="HTTP 503",
                next_attempt_at=utcnow() + timedelta(minutes=30),
            )
        )
        settle(settled, "failed", attempt_count=8, last_error="HTTP 503")
        db.session.commit()

    assert ids(client, brand, read_key, status="failed") == settled
    assert ids(client, brand, read_key, retrying="true") == failing
    assert ids(client, brand, read_key, status="pending", retrying="false") == waiting
    assert sorted(ids(client, brand, read_key, retrying="false")) == sorted(waiting + settled)
    records = {item["id"]: item for item in fetch_page(client, brand, read_key)[0]}
    assert records[failing[0]]["retrying"] is True
    assert records[failing[0]]["status"] == "pending"  # CONTRACT 6.2: the status is kept
    assert records[failing[0]]["nextRetryAt"].endswith("Z")
    assert records[waiting[0]]["retrying"] is False
    assert records[settled[0]]["retrying"] is False
    assert detail(client, brand, read_key, failing[0])["retrying"] is True


def test_filtering_by_an_unknown_or_foreign_endpoint_finds_nothing(
    app, client, brand, write_key, make_brand, make_key
):
    register(client, brand, write_key)
    publish(app, brand)
    other = make_brand("Other")
    other_endpoint = register(client, other, make_key(other))
    publish(app, other)
    assert ids(client, brand, write_key, endpointId="whe_doesnotexist") == []
    assert ids(client, brand, write_key, endpointId=other_endpoint) == []


def test_the_log_shows_only_the_calling_brands_deliveries(
    app, client, brand, write_key, make_brand, make_key
):
    register(client, brand, write_key)
    mine = publish(app, brand)
    other = make_brand("Other")
    register(client, other, make_key(other))
    publish(app, other)
    assert ids(client, brand, write_key) == mine


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"page": "0"}, "page"),
        ({"page": "-1"}, "page"),
        ({"page": "abc"}, "page"),
        ({"page": "1.5"}, "page"),
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"status": "done"}, "status"),
        ({"status": ""}, "status"),
        ({"retrying": "sometimes"}, "retrying"),
        ({"eventName": "deal.finished"}, "eventName"),
        ({"sortOrder": "newest"}, "sortOrder"),
        ({"color": "blue"}, "color"),
        ({"sort_order": "asc"}, "sort_order"),
    ],
)
def test_bad_query_parameters_are_rejected(client, brand, read_key, query, field):
    response = fetch(client, brand, read_key, **query)
    body = assert_error(response, 400, "VALIDATION_ERROR")
    assert field in body["errors"], body


# --- fetchWebhookDelivery ----------------------------------------------------------------------


def test_a_delivery_shows_its_payload_and_no_attempts_yet(app, client, brand, write_key, read_key):
    endpoint = register(client, brand, write_key)
    data = {"id": "deal_1", "status": "completed", "agreedAmountMinor": 450000}
    [delivery_id] = publish(app, brand, "deal.completed", data=data)
    shown = detail(client, brand, read_key, delivery_id)
    assert set(shown) == DELIVERY_FIELDS | {"attempts", "payload"}
    assert shown["id"] == delivery_id
    assert shown["endpointId"] == endpoint
    assert shown["status"] == "pending"
    assert shown["attempts"] == []
    payload = shown["payload"]
    assert set(payload) == set(EVENT_ENVELOPE_KEYS)
    assert payload["id"] == shown["eventId"]
    assert payload["id"].startswith("evt_")
    assert payload["type"] == "deal.completed"
    assert payload["brandId"] == brand
    assert payload["apiVersion"] == "1"
    assert payload["data"] == data
    assert payload["createdAt"].endswith("Z")


def test_an_unknown_delivery_is_not_found(client, brand, read_key):
    response = client.get(
        f"{base(brand)}/deliveries/whd_doesnotexist", headers=key_header(read_key)
    )
    assert_error(response, 404, "NOT_FOUND")


def test_another_brands_delivery_is_not_found(app, client, make_brand, make_key, brand, read_key):
    other = make_brand("Other")
    register(client, other, make_key(other))
    [foreign] = publish(app, other)
    response = client.get(f"{base(brand)}/deliveries/{foreign}", headers=key_header(read_key))
    assert_error(response, 404, "NOT_FOUND")
    assert_error(redeliver(client, brand, make_key(brand), foreign), 404, "NOT_FOUND")


# --- redeliverWebhook --------------------------------------------------------------------------


def test_redeliver_queues_a_new_delivery_of_the_same_event(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    [original] = publish(app, brand, "deal.completed", data={"n": 7})
    response = redeliver(client, brand, write_key, original)
    queued = assert_success(response, 202)
    assert set(queued) == {"deliveryId"}
    assert queued["deliveryId"].startswith("whd_")
    assert queued["deliveryId"] != original

    first = detail(client, brand, write_key, original)
    again = detail(client, brand, write_key, queued["deliveryId"])
    assert again["eventId"] == first["eventId"]
    assert again["endpointId"] == endpoint
    assert again["eventName"] == "deal.completed"
    assert again["status"] == "pending"
    assert again["attemptCount"] == 0
    assert again["payload"] == first["payload"]
    assert first["status"] == "pending"
    assert sorted(ids(client, brand, write_key)) == sorted([original, queued["deliveryId"]])


def test_redeliver_of_a_failed_delivery_after_re_enabling(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    [original] = publish(app, brand)
    set_active(client, brand, write_key, endpoint, False)
    assert detail(client, brand, write_key, original)["status"] == "failed"
    assert_error(redeliver(client, brand, write_key, original), 404, "NOT_FOUND")

    set_active(client, brand, write_key, endpoint, True)
    queued = assert_success(redeliver(client, brand, write_key, original), 202)
    assert detail(client, brand, write_key, queued["deliveryId"])["status"] == "pending"
    assert detail(client, brand, write_key, original)["status"] == "failed"


def test_redeliver_goes_only_to_the_original_endpoint(app, client, brand, write_key):
    first = register(client, brand, write_key)
    second = register(client, brand, write_key)
    [to_first, _] = sorted(
        publish(app, brand),
        key=lambda delivery: detail(client, brand, write_key, delivery)["endpointId"] != first,
    )
    queued = assert_success(redeliver(client, brand, write_key, to_first), 202)
    assert ids(client, brand, write_key, endpointId=first)[0] == queued["deliveryId"]
    assert len(ids(client, brand, write_key, endpointId=second)) == 1


def test_redeliver_after_the_endpoint_is_deleted_is_not_found(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    [original] = publish(app, brand)
    client.delete(f"{base(brand)}/{endpoint}/delete-endpoint", headers=key_header(write_key))
    assert_error(redeliver(client, brand, write_key, original), 404, "NOT_FOUND")
    assert ids(client, brand, write_key) == [original]


def test_redeliver_of_an_unknown_delivery_is_not_found(client, brand, write_key):
    assert_error(redeliver(client, brand, write_key, "whd_doesnotexist"), 404, "NOT_FOUND")


def test_redeliver_needs_write_scope(app, client, brand, write_key, read_key):
    register(client, brand, write_key)
    [original] = publish(app, brand)
    assert_error(redeliver(client, brand, read_key, original), 403, "FORBIDDEN")
    assert ids(client, brand, write_key) == [original]


# --- the log after real attempts ---------------------------------------------------------------


def wait_for(client, brand_id, key, delivery_id, done, timeout=20.0) -> dict:
    """Poll the delivery until `done(detail)` or the deadline; the last detail seen."""
    deadline = time.monotonic() + timeout
    while True:
        shown = detail(client, brand_id, key, delivery_id)
        if done(shown) or time.monotonic() > deadline:
            return shown
        time.sleep(0.05)


def test_the_log_records_a_failed_attempt_and_the_successful_retry(
    app_environ, client, brand, write_key, receiver
):
    endpoint = register(client, brand, write_key, url=receiver.url, events=["deal.completed"])
    receiver.reply_with(Reply(status=500, body=b"receiver exploded"))
    worker = WorkerProcess(app_environ)
    try:
        queued = assert_success(
            client.post(
                f"{base(brand)}/{endpoint}/send-test",
                headers=key_header(write_key),
            ),
            202,
        )
        delivery_id = queued["deliveryId"]
        after_failure = wait_for(
            client, brand, write_key, delivery_id, lambda shown: shown["attemptCount"] >= 1
        )
        delivered = wait_for(
            client, brand, write_key, delivery_id, lambda shown: shown["status"] != "pending"
        )
    finally:
        worker.stop()
    output = worker.output()

    assert after_failure["attemptCount"] >= 1, output
    if after_failure["status"] == "pending":
        assert after_failure["httpStatus"] == 500
        assert after_failure["lastError"]
        assert after_failure["nextRetryAt"] is not None
        assert after_failure["retrying"] is True

    assert delivered["status"] == "delivered", output
    assert delivered["attemptCount"] == 2
    assert delivered["httpStatus"] == 200
    assert delivered["deliveredAt"].endswith("Z")
    assert delivered["nextRetryAt"] is None
    assert delivered["retrying"] is False
    failed, succeeded = delivered["attempts"]
    assert set(failed) >= ATTEMPT_FIELDS
    assert [failed["attemptNumber"], succeeded["attemptNumber"]] == [1, 2]
    assert failed["httpStatus"] == 500
    assert failed["responseBody"] == "receiver exploded"
    assert succeeded["httpStatus"] == 200
    assert succeeded["requestedAt"] > failed["requestedAt"]
    assert [request.delivery_id for request in receiver.received] == [delivery_id] * 2

    listed = ids(client, brand, write_key, status="delivered")
    assert listed == [delivery_id]


def test_event_id_finds_an_events_deliveries_and_redeliveries(app, client, brand, write_key):
    register(client, brand, write_key)
    register(client, brand, write_key)
    first = publish(app, brand, now=utcnow() - timedelta(minutes=10))
    publish(app, brand)
    again = assert_success(redeliver(client, brand, write_key, first[0]), 202)["deliveryId"]
    event_id = detail(client, brand, write_key, first[0])["eventId"]
    assert sorted(ids(client, brand, write_key, eventId=event_id)) == sorted([*first, again])
    assert ids(client, brand, write_key, eventId=event_id, endpointId="whe_none") == []
    assert ids(client, brand, write_key, eventId="evt_01jd3kw3x5y7z9a1b3c5d7e9f1") == []
    response = fetch(client, brand, write_key, eventId=first[0])  # a delivery id, not an event's
    assert "eventId" in assert_error(response, 400, "VALIDATION_ERROR")["errors"]


def test_event_id_of_another_brands_event_finds_nothing(
    app, client, brand, write_key, make_brand, make_key
):
    other = make_brand("Other")
    register(client, other, make_key(other))
    [theirs] = publish(app, other)
    event_id = detail(client, other, make_key(other), theirs)["eventId"]
    assert ids(client, brand, write_key, eventId=event_id) == []
