"""Webhook endpoint routes (SPEC sections 2-4 and 6, CONTRACT 4 and 6): register, list, update,
rotate the secret, delete and send a test ping; scopes and brand ownership; secrets at rest."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from sqlalchemy import select, text

from extensions import db
from models import WebhookEndpoint
from models.columns import utcnow
from services.delivery.queue import claim_attempts
from services.events import publish_event
from services.secret_box import secret_box
from tests.bulk_jobs import run_bulk_jobs
from tests.helpers import assert_error, assert_success
from tests.receiver import expected_signature
from tests.worker_process import WorkerProcess

HOOK_URL = "https://hooks.brand-example.invalid/x"
DEFAULT_EVENTS = {"deal.completed", "conversion.recorded"}
ENDPOINT_FIELDS = {
    "id",
    "url",
    "description",
    "events",
    "isActive",
    "consecutiveFailures",
    "disabledAt",
    "disabledReason",
    "previousSecretExpiresAt",
    "ordering",
    "campaignIds",
    "maxInFlight",
    "traceContext",
    "createdAt",
}


LEASE = timedelta(seconds=30)


def base(brand_id: str) -> str:
    return f"/api/v1/brand/{brand_id}/webhook"


def key_header(secret: str) -> dict:
    return {"X-Api-Key": secret}


def register(client, brand_id: str, key: str, **body) -> dict:
    body.setdefault("url", HOOK_URL)
    response = client.post(
        f"{base(brand_id)}/register-endpoint", json=body, headers=key_header(key)
    )
    return assert_success(response, 201)


def list_endpoints(client, brand_id: str, key: str) -> list[dict]:
    response = client.get(f"{base(brand_id)}/fetch-endpoints", headers=key_header(key))
    return assert_success(response)["endpoints"]


def update(client, brand_id: str, key: str, endpoint_id: str, body):
    return client.patch(
        f"{base(brand_id)}/{endpoint_id}/update-endpoint", json=body, headers=key_header(key)
    )


def deliveries(client, brand_id: str, key: str, **query) -> list[dict]:
    response = client.get(
        f"{base(brand_id)}/fetch-deliveries", query_string=query, headers=key_header(key)
    )
    return assert_success(response)["deliveries"]


def publish(app, brand_id: str, name: str = "deal.completed", data=None) -> list[str]:
    with app.app_context():
        published = publish_event(brand_id=brand_id, name=name, data=data or {"x": 1})
        db.session.commit()
        return published.delivery_ids


def set_endpoint(app, endpoint_id: str, **columns) -> None:
    with app.app_context():
        endpoint = db.session.get(WebhookEndpoint, endpoint_id)
        for name, value in columns.items():
            setattr(endpoint, name, value)
        db.session.commit()


# --- registerWebhookEndpoint -------------------------------------------------------------------


def test_register_returns_the_endpoint_and_its_signing_secret(client, brand, write_key):
    response = client.post(
        f"{base(brand)}/register-endpoint",
        json={"url": HOOK_URL, "events": ["deal.completed", "escrow.released"]},
        headers=key_header(write_key),
    )
    data = assert_success(response, 201)
    assert data["id"].startswith("whe_")
    assert data["url"] == HOOK_URL
    assert set(data["events"]) == {"deal.completed", "escrow.released"}
    assert data["signingSecret"].startswith("whsec_")
    assert len(data["signingSecret"]) >= len("whsec_") + 24
    assert data["isActive"] is True
    assert data["consecutiveFailures"] == 0
    assert data["disabledAt"] is None
    assert data["createdAt"].endswith("Z")
    assert data["description"] is None
    assert data["droppedEvents"] == []
    assert data["maxInFlight"] is None  # WEBHOOK_ENDPOINT_CONCURRENCY applies
    assert data["traceContext"] is False
    assert set(data) == ENDPOINT_FIELDS | {"signingSecret", "droppedEvents"}


def test_register_gives_each_endpoint_its_own_id_and_secret(client, brand, write_key):
    first = register(client, brand, write_key)
    second = register(client, brand, write_key)
    assert first["id"] != second["id"]
    assert first["signingSecret"] != second["signingSecret"]


def test_register_without_events_subscribes_to_the_default_pair(client, brand, write_key):
    data = register(client, brand, write_key)
    assert set(data["events"]) == DEFAULT_EVENTS
    assert len(data["events"]) == 2


def test_register_drops_unsupported_event_names(client, brand, write_key):
    data = register(
        client, brand, write_key, events=["deal.finished", "placement.verified", "nonsense"]
    )
    assert data["events"] == ["placement.verified"]
    # Still a 201, and the answer says what was dropped (CONTRACT 10), each name once.
    assert data["droppedEvents"] == ["deal.finished", "nonsense"]


def test_register_keeps_each_event_once(client, brand, write_key):
    data = register(client, brand, write_key, events=["escrow.held", "escrow.held"])
    assert data["events"] == ["escrow.held"]
    assert data["droppedEvents"] == []


def test_register_reports_a_dropped_name_once_in_the_order_given(client, brand, write_key):
    data = register(
        client, brand, write_key, events=["escrow.relased", "deal.completed", "x", "escrow.relased"]
    )
    assert data["droppedEvents"] == ["escrow.relased", "x"]


def test_a_description_tells_two_endpoints_of_one_url_apart(client, brand, write_key):
    first = register(client, brand, write_key, description="  Orders service, production ")
    second = register(client, brand, write_key, description="Orders service, staging")
    assert first["description"] == "Orders service, production"  # trimmed
    listed = {e["id"]: e["description"] for e in list_endpoints(client, brand, write_key)}
    assert listed == {
        first["id"]: "Orders service, production",
        second["id"]: "Orders service, staging",
    }


@pytest.mark.parametrize("description", [None, "", "   "])
def test_an_empty_description_is_none(client, brand, write_key, description):
    assert register(client, brand, write_key, description=description)["description"] is None


@pytest.mark.parametrize(
    "description",
    ["x" * 201, "line one\nline two", "tab\there", "bell\x07", "next\x85line", 42, ["a"]],
)
def test_a_description_too_long_or_with_control_characters_is_refused(
    client, brand, write_key, description
):
    response = client.post(
        f"{base(brand)}/register-endpoint",
        json={"url": HOOK_URL, "description": description},
        headers=key_header(write_key),
    )
    assert "description" in assert_error(response, 400, "VALIDATION_ERROR")["errors"]
    assert list_endpoints(client, brand, write_key) == []


def test_a_description_of_200_characters_is_kept(client, brand, write_key):
    assert register(client, brand, write_key, description="é" * 200)["description"] == "é" * 200


@pytest.mark.parametrize("events", [[], ["deal.finished"], ["DEAL.COMPLETED", "x"]])
def test_register_with_no_supported_event_is_rejected(client, brand, write_key, events):
    response = client.post(
        f"{base(brand)}/register-endpoint",
        json={"url": HOOK_URL, "events": events},
        headers=key_header(write_key),
    )
    body = assert_error(response, 400, "VALIDATION_ERROR")
    assert "events" in body["errors"]
    assert list_endpoints(client, brand, write_key) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "url"),
        ({"url": 42}, "url"),
        ({"url": ""}, "url"),
        ({"url": HOOK_URL, "events": "deal.completed"}, "events"),
        ({"url": HOOK_URL, "events": [7]}, "events"),
        ({"url": HOOK_URL, "secret": "whsec_mine"}, "secret"),
        ({"url": HOOK_URL, "isActive": False}, "isActive"),
    ],
)
def test_register_rejects_a_malformed_body(client, brand, write_key, body, field):
    response = client.post(
        f"{base(brand)}/register-endpoint", json=body, headers=key_header(write_key)
    )
    errors = assert_error(response, 400, "VALIDATION_ERROR")["errors"]
    assert field in {key.split(".")[0] for key in errors}, errors
    assert list_endpoints(client, brand, write_key) == []


def test_register_rejects_a_body_that_is_not_json(client, brand, write_key):
    response = client.post(
        f"{base(brand)}/register-endpoint",
        data=b'{"url": ',
        headers={**key_header(write_key), "Content-Type": "application/json"},
    )
    assert_error(response, 400, "VALIDATION_ERROR")


def test_a_brand_may_have_twenty_endpoints_and_deleting_one_frees_a_place(client, brand, write_key):
    ids = [register(client, brand, write_key)["id"] for _ in range(20)]
    response = client.post(
        f"{base(brand)}/register-endpoint", json={"url": HOOK_URL}, headers=key_header(write_key)
    )
    # A conflict with the brand's state, not a malformed request (docs/decisions.md).
    assert_error(response, 409, "CONFLICT")
    assert len(list_endpoints(client, brand, write_key)) == 20

    deleted = client.delete(
        f"{base(brand)}/{ids[0]}/delete-endpoint", headers=key_header(write_key)
    )
    assert_success(deleted)
    register(client, brand, write_key)
    assert len(list_endpoints(client, brand, write_key)) == 20


def test_the_endpoint_limit_is_per_brand(client, brand, write_key, make_brand, make_key):
    for _ in range(20):
        register(client, brand, write_key)
    other = make_brand("Other")
    register(client, other, make_key(other))


# --- fetchWebhookEndpoints ---------------------------------------------------------------------


def test_fetch_endpoints_lists_every_field_but_the_secret(client, brand, write_key, read_key):
    registered = register(client, brand, write_key, events=["deal.accepted"])
    [listed] = list_endpoints(client, brand, read_key)
    assert set(listed) == ENDPOINT_FIELDS | {"successRate24h", "lastSuccessAt"}
    assert listed["successRate24h"] is None and listed["lastSuccessAt"] is None  # no attempt
    assert listed["id"] == registered["id"]
    assert listed["url"] == HOOK_URL
    assert listed["events"] == ["deal.accepted"]
    assert listed["isActive"] is True
    assert listed["consecutiveFailures"] == 0
    assert listed["disabledAt"] is None
    assert listed["disabledReason"] is None
    assert listed["createdAt"] == registered["createdAt"]


def test_fetch_endpoints_is_empty_for_a_new_brand(client, brand, read_key):
    assert list_endpoints(client, brand, read_key) == []


def test_fetch_endpoints_shows_only_the_calling_brands_endpoints(
    client, brand, write_key, make_brand, make_key
):
    mine = register(client, brand, write_key)
    other = make_brand("Other")
    register(client, other, make_key(other))
    assert [item["id"] for item in list_endpoints(client, brand, write_key)] == [mine["id"]]


def test_fetch_endpoints_lists_disabled_endpoints_as_inactive(app, client, brand, write_key):
    kept = register(client, brand, write_key)
    failing = register(client, brand, write_key)
    set_endpoint(
        app,
        failing["id"],
        consecutive_failures=15,
        disabled_at=utcnow(),
        disabled_reason="15 consecutive failures",
    )
    listed = {item["id"]: item for item in list_endpoints(client, brand, write_key)}
    assert listed[kept["id"]]["isActive"] is True
    assert listed[failing["id"]]["isActive"] is False
    assert listed[failing["id"]]["disabledAt"].endswith("Z")
    assert listed[failing["id"]]["disabledReason"] == "15 consecutive failures"
    assert listed[failing["id"]]["consecutiveFailures"] == 15


# --- updateWebhookEndpoint ---------------------------------------------------------------------


def test_update_changes_the_url_and_returns_the_endpoint(client, brand, write_key):
    endpoint = register(client, brand, write_key)
    new_url = "https://other-hooks.brand-example.invalid/v2"
    data = assert_success(update(client, brand, write_key, endpoint["id"], {"url": new_url}))
    assert set(data) == ENDPOINT_FIELDS | {"droppedEvents"}
    assert data["droppedEvents"] == []
    assert data["id"] == endpoint["id"]
    assert data["url"] == new_url
    assert set(data["events"]) == DEFAULT_EVENTS
    assert data["isActive"] is True
    [listed] = list_endpoints(client, brand, write_key)
    assert listed["url"] == new_url


def test_update_replaces_the_subscription(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    response = update(
        client, brand, write_key, endpoint["id"], {"events": ["escrow.released", "bogus"]}
    )
    data = assert_success(response)
    assert data["events"] == ["escrow.released"]
    assert data["droppedEvents"] == ["bogus"]
    assert publish(app, brand, "deal.completed") == []
    assert len(publish(app, brand, "escrow.released")) == 1


def test_update_sets_changes_and_removes_the_description(client, brand, write_key):
    endpoint = register(client, brand, write_key, description="Orders, production")

    def described(body) -> str | None:
        data = assert_success(update(client, brand, write_key, endpoint["id"], body))
        [listed] = list_endpoints(client, brand, write_key)
        assert listed["description"] == data["description"]
        return data["description"]

    assert described({"url": "https://hooks.brand-example.invalid/y"}) == "Orders, production"
    assert described({"description": "Orders, staging"}) == "Orders, staging"
    assert described({"description": ""}) is None
    assert described({"description": "Back"}) == "Back"
    assert described({"description": None}) is None


def test_update_with_a_bad_description_changes_nothing(client, brand, write_key):
    endpoint = register(client, brand, write_key, description="Orders")
    response = update(
        client, brand, write_key, endpoint["id"], {"url": HOOK_URL + "2", "description": "a\rb"}
    )
    assert "description" in assert_error(response, 400, "VALIDATION_ERROR")["errors"]
    [listed] = list_endpoints(client, brand, write_key)
    assert (listed["url"], listed["description"]) == (HOOK_URL, "Orders")


@pytest.mark.parametrize("events", [[], ["deal.finished"]])
def test_update_with_no_supported_event_is_rejected_and_changes_nothing(
    client, brand, write_key, events
):
    endpoint = register(client, brand, write_key)
    response = update(client, brand, write_key, endpoint["id"], {"events": events})
    assert "events" in assert_error(response, 400, "VALIDATION_ERROR")["errors"]
    [listed] = list_endpoints(client, brand, write_key)
    assert set(listed["events"]) == DEFAULT_EVENTS


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"signingSecret": "whsec_mine"},
        {"isActive": None},
        {"isActive": "maybe"},
        {"url": None},
        {"events": "deal.completed"},
    ],
)
def test_update_rejects_an_empty_or_malformed_body(client, brand, write_key, body):
    endpoint = register(client, brand, write_key)
    response = update(client, brand, write_key, endpoint["id"], body)
    assert_error(response, 400, "VALIDATION_ERROR")
    [listed] = list_endpoints(client, brand, write_key)
    assert listed["url"] == HOOK_URL
    assert listed["isActive"] is True


def test_update_is_all_or_nothing(client, brand, write_key):
    endpoint = register(client, brand, write_key)
    response = update(
        client,
        brand,
        write_key,
        endpoint["id"],
        {"url": "https://new.brand-example.invalid/", "events": ["nope"]},
    )
    assert_error(response, 400, "VALIDATION_ERROR")
    [listed] = list_endpoints(client, brand, write_key)
    assert listed["url"] == HOOK_URL


def test_disabling_sets_disabled_at_and_fails_pending_deliveries(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    other = register(client, brand, write_key)
    publish(app, brand, "deal.completed")
    data = assert_success(update(client, brand, write_key, endpoint["id"], {"isActive": False}))
    assert data["isActive"] is False
    assert data["disabledAt"].endswith("Z")
    # Who did it and where, in words the brand knows: never a route's name.
    by_key = f"by key “test key” ({write_key[:12]}…)"
    assert data["disabledReason"] == f"Disabled through the API {by_key}"

    # From the moment it is disabled no claim takes its work; a job ends it, as a worker runs it.
    with app.app_context():
        claimed = claim_attempts(slots=10, endpoint_limit=2, token="t" * 32, lease=LEASE)
        db.session.rollback()
    assert [attempt.endpoint_id for attempt in claimed.attempts] == [other["id"]]
    run_bulk_jobs(app)
    mine = deliveries(client, brand, write_key, endpointId=endpoint["id"])
    assert [item["status"] for item in mine] == ["failed"]
    assert mine[0]["lastError"] == f"Endpoint disabled through the API {by_key}"
    assert mine[0]["nextRetryAt"] is None
    theirs = deliveries(client, brand, write_key, endpointId=other["id"])
    assert [item["status"] for item in theirs] == ["pending"]


def test_a_disabled_endpoint_receives_no_new_deliveries(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    assert_success(update(client, brand, write_key, endpoint["id"], {"isActive": False}))
    assert publish(app, brand, "deal.completed") == []
    assert deliveries(client, brand, write_key) == []


def test_re_enabling_clears_disabled_at_and_the_failure_count(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    set_endpoint(
        app,
        endpoint["id"],
        consecutive_failures=15,
        disabled_at=utcnow(),
        disabled_reason="15 consecutive failures",
    )
    data = assert_success(update(client, brand, write_key, endpoint["id"], {"isActive": True}))
    assert data["isActive"] is True
    assert data["disabledAt"] is None
    assert data["disabledReason"] is None
    assert data["consecutiveFailures"] == 0
    assert len(publish(app, brand, "deal.completed")) == 1


def test_disabling_twice_keeps_the_first_disabled_at(client, brand, write_key):
    endpoint = register(client, brand, write_key)
    first = assert_success(update(client, brand, write_key, endpoint["id"], {"isActive": False}))
    second = assert_success(update(client, brand, write_key, endpoint["id"], {"isActive": False}))
    assert second["disabledAt"] == first["disabledAt"]
    assert second["isActive"] is False


def test_update_of_an_unknown_endpoint_is_not_found(client, brand, write_key):
    response = update(client, brand, write_key, "whe_doesnotexist", {"isActive": False})
    assert_error(response, 404, "NOT_FOUND")


# --- rotateWebhookSecret -----------------------------------------------------------------------


def test_rotate_secret_returns_a_new_secret_and_stores_it(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    response = client.post(
        f"{base(brand)}/{endpoint['id']}/rotate-secret", headers=key_header(write_key)
    )
    data = assert_success(response)
    assert set(data) == {"id", "signingSecret", "previousSecretExpiresAt"}
    assert data["previousSecretExpiresAt"] is None  # no overlap asked: the old one stops
    assert data["id"] == endpoint["id"]
    assert data["signingSecret"].startswith("whsec_")
    assert data["signingSecret"] != endpoint["signingSecret"]
    with app.app_context():
        stored = db.session.scalar(
            select(WebhookEndpoint.secret_ciphertext).where(WebhookEndpoint.id == endpoint["id"])
        )
        assert secret_box().decrypt(stored) == data["signingSecret"]


def test_rotate_secret_leaves_the_endpoint_otherwise_unchanged(client, brand, write_key):
    endpoint = register(client, brand, write_key, events=["deal.accepted"])
    before = list_endpoints(client, brand, write_key)
    client.post(f"{base(brand)}/{endpoint['id']}/rotate-secret", headers=key_header(write_key))
    assert list_endpoints(client, brand, write_key) == before


def test_rotate_secret_of_an_unknown_endpoint_is_not_found(client, brand, write_key):
    response = client.post(
        f"{base(brand)}/whe_doesnotexist/rotate-secret", headers=key_header(write_key)
    )
    assert_error(response, 404, "NOT_FOUND")


# --- deleteWebhookEndpoint ---------------------------------------------------------------------


def test_delete_removes_the_endpoint_from_every_route(client, brand, write_key):
    endpoint = register(client, brand, write_key)
    kept = register(client, brand, write_key)
    response = client.delete(
        f"{base(brand)}/{endpoint['id']}/delete-endpoint", headers=key_header(write_key)
    )
    assert assert_success(response) == {"id": endpoint["id"]}
    assert [item["id"] for item in list_endpoints(client, brand, write_key)] == [kept["id"]]

    path = f"{base(brand)}/{endpoint['id']}"
    headers = key_header(write_key)
    assert_error(
        update(client, brand, write_key, endpoint["id"], {"isActive": True}), 404, "NOT_FOUND"
    )
    assert_error(client.post(f"{path}/rotate-secret", headers=headers), 404, "NOT_FOUND")
    assert_error(client.delete(f"{path}/delete-endpoint", headers=headers), 404, "NOT_FOUND")
    assert_error(client.post(f"{path}/send-test", headers=headers), 404, "NOT_FOUND")


def test_delete_fails_pending_deliveries_and_keeps_them_in_the_log(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    other = register(client, brand, write_key)
    publish(app, brand, "deal.completed")
    publish(app, brand, "conversion.recorded")
    client.delete(f"{base(brand)}/{endpoint['id']}/delete-endpoint", headers=key_header(write_key))
    run_bulk_jobs(app)

    mine = deliveries(client, brand, write_key, endpointId=endpoint["id"])
    assert len(mine) == 2
    assert {item["status"] for item in mine} == {"failed"}
    assert {item["lastError"] for item in mine} == {"Endpoint deleted"}
    detail = assert_success(
        client.get(f"{base(brand)}/deliveries/{mine[0]['id']}", headers=key_header(write_key))
    )
    assert detail["status"] == "failed"
    theirs = deliveries(client, brand, write_key, endpointId=other["id"])
    assert {item["status"] for item in theirs} == {"pending"}


def test_a_deleted_endpoint_receives_no_new_deliveries(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    client.delete(f"{base(brand)}/{endpoint['id']}/delete-endpoint", headers=key_header(write_key))
    assert publish(app, brand, "deal.completed") == []


# --- sendWebhookTest ---------------------------------------------------------------------------


def test_send_test_with_a_read_key_queues_a_test_delivery(client, brand, write_key, read_key):
    endpoint = register(client, brand, write_key, events=["deal.completed"])
    other = register(client, brand, write_key, events=["webhook.test"])
    response = client.post(
        f"{base(brand)}/{endpoint['id']}/send-test", headers=key_header(read_key)
    )
    data = assert_success(response, 202)
    assert set(data) == {"deliveryId"}
    assert data["deliveryId"].startswith("whd_")

    [queued] = deliveries(client, brand, read_key)
    assert queued["id"] == data["deliveryId"]
    assert queued["endpointId"] == endpoint["id"]
    assert queued["eventName"] == "webhook.test"
    assert queued["status"] == "pending"
    assert deliveries(client, brand, read_key, endpointId=other["id"]) == []

    detail = assert_success(
        client.get(f"{base(brand)}/deliveries/{data['deliveryId']}", headers=key_header(read_key))
    )
    assert detail["payload"]["type"] == "webhook.test"
    assert detail["payload"]["data"]["endpointId"] == endpoint["id"]
    assert detail["payload"]["data"]["message"]


def test_send_test_to_a_disabled_endpoint_is_not_found(client, brand, write_key):
    endpoint = register(client, brand, write_key)
    assert_success(update(client, brand, write_key, endpoint["id"], {"isActive": False}))
    response = client.post(
        f"{base(brand)}/{endpoint['id']}/send-test", headers=key_header(write_key)
    )
    assert_error(response, 404, "NOT_FOUND")
    assert deliveries(client, brand, write_key) == []


def test_send_test_to_an_unknown_endpoint_is_not_found(client, brand, read_key):
    response = client.post(
        f"{base(brand)}/whe_doesnotexist/send-test", headers=key_header(read_key)
    )
    assert_error(response, 404, "NOT_FOUND")


# --- credentials, scopes and ownership ---------------------------------------------------------

# (method, path under /webhook with {endpoint} and {delivery}, JSON body, needs write scope)
ROUTES = [
    ("POST", "/register-endpoint", {"url": HOOK_URL}, True),
    ("GET", "/fetch-endpoints", None, False),
    ("PATCH", "/{endpoint}/update-endpoint", {"isActive": False}, True),
    ("POST", "/{endpoint}/rotate-secret", None, True),
    ("DELETE", "/{endpoint}/delete-endpoint", None, True),
    ("POST", "/{endpoint}/send-test", None, False),
    ("POST", "/{endpoint}/retry-pending", None, True),
    ("GET", "/fetch-deliveries", None, False),
    ("GET", "/deliveries/{delivery}", None, False),
    ("POST", "/deliveries/{delivery}/redeliver", None, True),
]
WRITE_ROUTES = [route for route in ROUTES if route[3]]
ENDPOINT_ROUTES = [route for route in ROUTES if "{endpoint}" in route[1]]
DELIVERY_ROUTES = [route for route in ROUTES if "{delivery}" in route[1]]


def route_id(route) -> str:
    return f"{route[0]} {route[1]}"


@pytest.fixture
def existing(app, client, brand, write_key) -> dict:
    """One endpoint of `brand` and one pending delivery to it."""
    endpoint = register(client, brand, write_key)
    [delivery] = publish(app, brand, "deal.completed")
    return {"endpoint": endpoint["id"], "delivery": delivery}


def call(client, brand_id: str, route, ids: dict, headers: dict):
    method, path, body, _ = route
    return client.open(
        base(brand_id) + path.format(**ids), method=method, json=body, headers=headers
    )


@pytest.mark.parametrize("route", WRITE_ROUTES, ids=route_id)
def test_write_routes_refuse_a_read_key(client, brand, read_key, existing, route):
    response = call(client, brand, route, existing, key_header(read_key))
    assert_error(response, 403, "FORBIDDEN")


def test_a_read_key_changes_nothing(client, brand, write_key, read_key, existing):
    before = list_endpoints(client, brand, write_key)
    for route in WRITE_ROUTES:
        call(client, brand, route, existing, key_header(read_key))
    assert list_endpoints(client, brand, write_key) == before
    assert len(deliveries(client, brand, write_key)) == 1


@pytest.mark.parametrize("route", ROUTES, ids=route_id)
def test_every_route_refuses_another_brands_key(
    client, brand, existing, make_brand, make_key, route
):
    other_key = make_key(make_brand("Other"))
    response = call(client, brand, route, existing, key_header(other_key))
    assert_error(response, 403, "FORBIDDEN")


@pytest.mark.parametrize("route", ROUTES, ids=route_id)
def test_every_route_requires_a_credential(client, brand, existing, route):
    assert_error(call(client, brand, route, existing, {}), 401, "UNAUTHORIZED")


@pytest.mark.parametrize("route", ENDPOINT_ROUTES + DELIVERY_ROUTES, ids=route_id)
def test_another_brands_endpoint_or_delivery_is_not_found(
    client, existing, make_brand, make_key, route
):
    other = make_brand("Other")
    response = call(client, other, route, existing, key_header(make_key(other)))
    assert_error(response, 404, "NOT_FOUND")


def test_another_brand_cannot_disable_or_delete_my_endpoint(
    client, brand, write_key, existing, make_brand, make_key
):
    other = make_brand("Other")
    other_key = make_key(other)
    update(client, other, other_key, existing["endpoint"], {"isActive": False})
    client.delete(
        f"{base(other)}/{existing['endpoint']}/delete-endpoint", headers=key_header(other_key)
    )
    [listed] = list_endpoints(client, brand, write_key)
    assert listed["isActive"] is True
    [delivery] = deliveries(client, brand, write_key)
    assert delivery["status"] == "pending"


# --- the signing secret ------------------------------------------------------------------------


def test_the_signing_secret_is_only_in_register_and_rotate_responses(
    app, client, brand, write_key, read_key, caplog
):
    caplog.set_level(logging.DEBUG)
    said: list[str] = []
    headers = key_header(write_key)

    def record(response):
        said.append(response.get_data(as_text=True))
        return response

    registered = register(client, brand, write_key)
    endpoint_id = registered["id"]
    path = f"{base(brand)}/{endpoint_id}"
    [delivery] = publish(app, brand, "deal.completed")
    record(client.get(f"{base(brand)}/fetch-endpoints", headers=headers))
    record(client.get(f"{base(brand)}/fetch-endpoints", headers=key_header(read_key)))
    record(update(client, brand, write_key, endpoint_id, {"events": ["deal.completed"]}))
    record(update(client, brand, write_key, endpoint_id, {"url": "ftp://x"}))
    record(client.post(f"{path}/send-test", headers=headers))
    record(client.get(f"{base(brand)}/fetch-deliveries", headers=headers))
    record(client.get(f"{base(brand)}/deliveries/{delivery}", headers=headers))
    record(client.post(f"{base(brand)}/deliveries/{delivery}/redeliver", headers=headers))
    rotated = assert_success(client.post(f"{path}/rotate-secret", headers=headers))
    record(client.post(f"{path}/rotate-secret", headers=key_header(read_key)))
    record(client.get(f"{base(brand)}/fetch-endpoints", headers=headers))
    record(update(client, brand, write_key, endpoint_id, {"isActive": False}))
    record(client.delete(f"{path}/delete-endpoint", headers=headers))
    record(client.delete(f"{path}/delete-endpoint", headers=headers))
    said.append(caplog.text)

    secrets = [registered["signingSecret"], rotated["signingSecret"]]
    for secret in secrets:
        unlisted = secret[len("whsec_") :]
        for text_said in said:
            assert unlisted not in text_said


def test_the_database_holds_the_signing_secret_only_encrypted(app, client, brand, write_key):
    registered = register(client, brand, write_key)
    rotated = assert_success(
        client.post(
            f"{base(brand)}/{registered['id']}/rotate-secret", headers=key_header(write_key)
        )
    )
    with app.app_context():
        [stored] = db.session.execute(text("select secret_ciphertext from webhook_endpoints"))
        row_text = json.dumps([str(value) for value in stored])
    for secret in (registered["signingSecret"], rotated["signingSecret"]):
        assert secret[len("whsec_") :] not in row_text


def test_deliveries_are_signed_with_the_rotated_secret_only(
    app, app_environ, client, brand, write_key, receiver
):
    registered = register(client, brand, write_key, url=receiver.url)
    rotated = assert_success(
        client.post(
            f"{base(brand)}/{registered['id']}/rotate-secret", headers=key_header(write_key)
        )
    )
    receiver.secrets = [rotated["signingSecret"]]
    worker = WorkerProcess(app_environ)
    try:
        queued = assert_success(
            client.post(
                f"{base(brand)}/{registered['id']}/send-test", headers=key_header(write_key)
            ),
            202,
        )
        [request] = receiver.wait_for(1)
    finally:
        worker.stop()
    assert request.delivery_id == queued["deliveryId"]
    assert request.signature_valid
    timestamp = request.headers["X-Service-Timestamp"]
    old = expected_signature(registered["signingSecret"], timestamp, request.body)
    assert request.headers["X-Service-Signature"] != old
