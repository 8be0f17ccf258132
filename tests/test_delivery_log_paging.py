"""Paging the delivery log (SPEC fetchWebhookDeliveries, CONTRACT 3): `page`/`limit` and the
`after` cursor, with every filter and both orders, over a log in every state a delivery can be
in, made the way the service makes it (publish_event; the worker's own claim_attempts and
record_attempts: delivered, failed, retrying, on the wire, waiting).

The filters are checked against what they always meant, the record's own columns: each list is
compared with the same rows selected by `status` (and the other columns) straight from the
table, whichever index the service reads them from.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from extensions import db
from models import WebhookDelivery
from models.columns import new_id, utcnow
from services import pagination
from services.delivery.outcomes import AttemptOutcome, RetryPolicy
from services.delivery.queue import claim_attempts, record_attempts
from services.events import publish_event
from services.webhook_endpoints import current_url_policy, register_endpoint
from tests.helpers import assert_error, assert_success

EVENTS = ["deal.completed", "escrow.held"]
FINAL = RetryPolicy(schedule=(), disable_failures=1000, disable_window=timedelta(hours=1))
RETRY = RetryPolicy(schedule=(3600,), disable_failures=1000, disable_window=timedelta(hours=1))
META = {"page", "limit", "total", "totalPages", "hasNext", "totalExact", "nextAfter"}


def _register(brand_id: str, url: str) -> str:
    return register_endpoint(
        brand_id=brand_id, url=url, events=EVENTS, policy=current_url_policy()
    ).id


def _publish(brand_id: str, count: int, start) -> list[str]:
    """`count` events a second apart from `start`, names alternating; their deliveries."""
    ids = []
    for n in range(count):
        published = publish_event(
            brand_id=brand_id,
            name=EVENTS[n % 2],
            data={"dealId": f"deal_{n}"},
            now=start + timedelta(seconds=n),
        )
        ids.extend(published.delivery_ids)
    return ids


def _attempt(outcomes: dict[str, str]) -> None:
    """Lease every due delivery, as a worker's claim does, and record an attempt for those in
    `outcomes` ("delivered", "failed" for good, or "retrying"); the others stay leased, on the
    wire."""
    claimed = claim_attempts(
        slots=1000, endpoint_limit=1000, token="pagingtest", lease=FINAL.lease, now=utcnow()
    )
    for policy, wanted in ((FINAL, ("delivered", "failed")), (RETRY, ("retrying",))):
        results = [
            (
                attempt,
                AttemptOutcome(
                    requested_at=utcnow(),
                    duration_ms=12,
                    request_headers={"Content-Type": "application/json"},
                    http_status=200 if outcomes[attempt.delivery_id] == "delivered" else 503,
                ),
            )
            for attempt in claimed.attempts
            if outcomes.get(attempt.delivery_id) in wanted
        ]
        if results:
            record_attempts(results, policy=policy)


@pytest.fixture
def log(app, brand, make_brand) -> dict:
    """The brand's log: two endpoints, 15 events (30 deliveries, two of them made in the same
    moment each time) delivered, failed, retrying, on the wire and waiting; 8 of them waiting
    still, published after the round of attempts. Another brand has deliveries too."""
    with app.test_request_context():
        first = _register(brand, "https://hooks.brand-example.invalid/a")
        second = _register(brand, "https://hooks.brand-example.invalid/b")
        other = make_brand("Other")
        _register(other, "https://hooks.brand-example.invalid/other")
        start = utcnow() - timedelta(minutes=10)
        attempted = _publish(brand, 11, start)
        _publish(other, 3, start)
        fates = ["delivered", "failed", "retrying", "delivered", "on the wire"]
        outcomes = {delivery: fates[n % len(fates)] for n, delivery in enumerate(attempted)}
        _attempt(outcomes)
        _publish(brand, 4, start + timedelta(minutes=1))
        db.session.commit()
        event_id = db.session.scalar(
            select(WebhookDelivery.event_id).where(WebhookDelivery.id == attempted[7])
        )
    return {"endpoints": (first, second), "other": other, "event_id": event_id}


def _expected(app, brand_id: str, sort_order: str, **where) -> list[str]:
    """The brand's delivery ids matching `where` (column: value; `retrying`: the record's
    rule), straight from the table, in the list's order."""
    with app.app_context():
        query = select(WebhookDelivery).where(WebhookDelivery.brand_id == brand_id)
        retrying = where.pop("retrying", None)
        for column, value in where.items():
            query = query.where(getattr(WebhookDelivery, column) == value)
        rows = [
            row
            for row in db.session.scalars(query)
            if retrying is None or row.is_retrying == retrying
        ]
    rows.sort(key=lambda row: (row.created_at, row.id), reverse=sort_order == "desc")
    return [row.id for row in rows]


def _fetch(client, brand_id: str, key: str, **query):
    return client.get(
        f"/api/v1/brand/{brand_id}/webhook/fetch-deliveries",
        query_string=query,
        headers={"X-Api-Key": key},
    )


def _page(client, brand_id: str, key: str, **query) -> tuple[list[str], dict]:
    response = _fetch(client, brand_id, key, **query)
    data = assert_success(response)
    return [item["id"] for item in data["deliveries"]], response.get_json()["meta"]


def _filters(log: dict) -> list[tuple[dict, dict]]:
    """(query, the columns it means) for every filter and some of their combinations."""
    first, second = log["endpoints"]
    return [
        ({}, {}),
        ({"status": "failed"}, {"status": "failed"}),
        ({"status": "pending"}, {"status": "pending"}),
        ({"status": "delivered"}, {"status": "delivered"}),
        ({"retrying": "true"}, {"retrying": True}),
        ({"retrying": "false"}, {"retrying": False}),
        ({"status": "pending", "retrying": "false"}, {"status": "pending", "retrying": False}),
        ({"eventName": "escrow.held"}, {"event_name": "escrow.held"}),
        ({"eventId": log["event_id"]}, {"event_id": log["event_id"]}),
        ({"endpointId": first}, {"endpoint_id": first}),
        ({"status": "failed", "endpointId": second}, {"status": "failed", "endpoint_id": second}),
        ({"status": "pending", "endpointId": first}, {"status": "pending", "endpoint_id": first}),
        ({"retrying": "true", "endpointId": second}, {"retrying": True, "endpoint_id": second}),
        (
            {"eventName": "deal.completed", "endpointId": first},
            {"event_name": "deal.completed", "endpoint_id": first},
        ),
    ]


@pytest.mark.parametrize("sort_order", ["desc", "asc"])
def test_pages_list_every_matching_delivery_once_in_order_with_every_filter(
    app, client, brand, read_key, log, sort_order
):
    for query, meaning in _filters(log):
        expected = _expected(app, brand, sort_order, **meaning)
        walked, page = [], 1
        while True:
            ids, meta = _page(
                client, brand, read_key, sortOrder=sort_order, limit=3, page=page, **query
            )
            assert {k: meta[k] for k in ("page", "limit", "total", "totalPages")} == {
                "page": page,
                "limit": 3,
                "total": len(expected),
                "totalPages": -(-len(expected) // 3),
            }, query
            assert meta["totalExact"] is True
            walked += ids
            if not meta["hasNext"]:
                break
            page += 1
        assert walked == expected, query
    # Each state is in the log, so every filter above was tried on rows it must keep and drop.
    statuses = {
        s for s in ("failed", "pending", "delivered") if _expected(app, brand, "asc", status=s)
    }
    assert statuses == {"failed", "pending", "delivered"}
    assert _expected(app, brand, "asc", retrying=True)


@pytest.mark.parametrize("sort_order", ["desc", "asc"])
def test_after_lists_every_matching_delivery_once_in_order_with_every_filter(
    app, client, brand, read_key, log, sort_order
):
    for query, meaning in _filters(log):
        expected = _expected(app, brand, sort_order, **meaning)
        walked, after = [], None
        while True:
            cursor = {} if after is None else {"after": after}
            ids, meta = _page(
                client, brand, read_key, sortOrder=sort_order, limit=4, **cursor, **query
            )
            assert set(meta) >= META and meta["cursorExpired"] is False
            # `meta` counts what follows the cursor.
            assert meta["total"] == len(expected) - len(walked), query
            assert meta["hasNext"] is (len(walked) + len(ids) < len(expected)), query
            walked += ids
            assert meta["nextAfter"] == (ids[-1] if ids else after)
            if not ids:
                break
            after = meta["nextAfter"]
        assert walked == expected, query


@pytest.mark.parametrize("sort_order", ["desc", "asc"])
def test_after_neither_repeats_nor_skips_when_deliveries_arrive_meanwhile(
    app, client, brand, read_key, log, sort_order
):
    before = _expected(app, brand, sort_order)
    walked, after, added = [], None, []
    while True:
        cursor = {} if after is None else {"after": after}
        ids, meta = _page(client, brand, read_key, sortOrder=sort_order, limit=4, **cursor)
        if not ids:
            break
        walked += ids
        after = meta["nextAfter"]
        if len(added) < 8:  # new deliveries at the newest end, while the walk goes on
            with app.test_request_context():
                added += _publish(brand, 2, utcnow())
                db.session.commit()
    assert len(walked) == len(set(walked))
    if sort_order == "desc":
        assert walked == before  # the new ones are ahead of where the walk began
    else:
        assert walked == before + _expected(app, brand, "asc")[len(before) :]
        assert set(walked[len(before) :]) == set(added)


def test_deep_pages_past_the_counted_rows_are_exact_and_say_how_far_they_counted(
    app, client, brand, read_key, log, monkeypatch
):
    """Beyond COUNT_LIMIT rows past the start, a page is its own count: `total` is what is
    known to exist (the rows before the page, the page, and one more if `hasNext`)."""
    monkeypatch.setattr(pagination, "COUNT_LIMIT", 5)
    expected = _expected(app, brand, "desc")
    pages = -(-len(expected) // 3)
    ids, meta = _page(client, brand, read_key, limit=3)
    assert (ids, meta["total"], meta["totalExact"], meta["hasNext"]) == (
        expected[:3],
        5,
        False,
        True,
    )
    walked = ids
    for page in range(2, pages + 1):
        ids, meta = _page(client, brand, read_key, limit=3, page=page)
        walked += ids
        last = page == pages
        assert meta["hasNext"] is not last
        assert meta["totalExact"] is last
        assert meta["total"] == (len(expected) if last else page * 3)
    assert walked == expected
    ids, meta = _page(client, brand, read_key, limit=3, page=pages + 2)
    assert ids == [] and (meta["total"], meta["totalExact"], meta["hasNext"]) == (
        len(expected),
        True,
        False,
    )


def test_after_of_another_brand_or_of_no_delivery_is_not_found(app, client, brand, read_key, log):
    with app.app_context():
        foreign = db.session.scalar(
            select(WebhookDelivery.id).where(WebhookDelivery.brand_id == log["other"])
        )
    for after in (foreign, new_id("whd")):
        assert_error(_fetch(client, brand, read_key, after=after), 404, "NOT_FOUND")
        assert_error(
            _fetch(client, brand, read_key, after=after, status="failed"), 404, "NOT_FOUND"
        )
    body = assert_error(_fetch(client, brand, read_key, after="evt_01"), 400, "VALIDATION_ERROR")
    assert "after" in body["errors"]


def test_after_a_delivery_retention_deleted_goes_on_from_when_it_was_made(
    app, client, brand, read_key, log
):
    deleted = new_id("whd", at=utcnow() - timedelta(days=40))
    ids, meta = _page(client, brand, read_key, after=deleted, sortOrder="asc", limit=100)
    assert ids == _expected(app, brand, "asc")
    assert meta["cursorExpired"] is True and meta["nextAfter"] == ids[-1]
    ids, meta = _page(client, brand, read_key, after=deleted)
    assert ids == [] and meta["cursorExpired"] is True and meta["nextAfter"] == deleted


def test_the_document_states_the_cursor_and_the_meta(client):
    spec = client.get("/api/v1/openapi.json").get_json()
    operation = spec["paths"]["/brand/{brandId}/webhook/fetch-deliveries"]["get"]
    query = {p["name"]: p for p in operation["parameters"] if p["in"] == "query"}
    assert query["after"]["schema"]["pattern"] == "^whd_[0-9a-z]{1,36}$"
    assert "nextAfter" in query["after"]["description"]
    assert "404" in operation["responses"]
    assert "after" in operation["description"] and "page 500" in operation["description"]
    schemas = spec["components"]["schemas"]
    envelope = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    properties = schemas[envelope.split("/")[-1]]["properties"]
    meta = schemas[properties["meta"]["$ref"].split("/")[-1]]
    assert set(meta["properties"]) == META | {"cursorExpired"}
    assert {"page", "limit", "total", "totalPages", "hasNext"} <= set(meta.get("required", []))
