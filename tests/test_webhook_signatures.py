"""What a receiver verifies, end to end: real deliveries from a real worker are accepted by the
official `standardwebhooks` library (CONTRACT 8.1), and a rotation with an overlap keeps a
receiver with the old secret and one with the new secret verifying every delivery until the
overlap ends, and only the new one after it (CONTRACT 8.2)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from standardwebhooks import Webhook, WebhookVerificationError

from extensions import db
from models import WebhookEndpoint
from tests import test_webhook_delivery as delivery
from tests.receiver import Received, expected_signature
from tests.test_webhook_delivery import logs, parse_time, publish

api = delivery.api
workers = delivery.workers
worker = delivery.worker
start_worker = delivery.start_worker


def verifies(secret: str, request: Received) -> bool:
    """Both ways a receiver can check a delivery with `secret`: our header with hand-written
    HMAC code, and Standard Webhooks' with the official library. They must agree."""
    ours = request.headers["X-Service-Signature"].split(", ")
    timestamp = request.headers["X-Service-Timestamp"]
    by_hand = expected_signature(secret, timestamp, request.body) in ours
    try:
        Webhook(secret.encode()).verify(request.body, request.headers)
        by_library = True
    except WebhookVerificationError:
        by_library = False
    assert by_hand == by_library, (secret, request.headers)
    return by_hand


def test_the_standard_webhooks_library_verifies_real_deliveries(app, api, brand, receiver, worker):
    endpoint = api.register(receiver.url, events=["deal.completed", "escrow.released"])
    secret = endpoint["signingSecret"]
    published = publish(app, brand, ("deal.completed", {"n": 1}), ("escrow.released", {"n": 2}))

    received = receiver.wait_for(2)
    for request in received:
        event = Webhook(secret.encode()).verify(request.body, request.headers)
        assert event["id"] in {event_id for event_id, _ in published}
        assert request.headers["webhook-id"] == request.headers["X-Service-Delivery"]
        assert request.headers["webhook-timestamp"] == request.headers["X-Service-Timestamp"]
        assert request.headers["webhook-signature"].startswith("v1,")
        with pytest.raises(WebhookVerificationError):
            Webhook(b"whsec_someone_else").verify(request.body, request.headers)
        tampered = request.body.replace(b'"n":', b'"m":')
        with pytest.raises(WebhookVerificationError):
            Webhook(secret.encode()).verify(tampered, request.headers)


def test_rotation_with_an_overlap_keeps_both_receivers_verifying_until_it_ends(
    app, api, brand, receiver, worker
):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    old_secret = endpoint["signingSecret"]
    rotated = api.call(
        "POST",
        f"webhook/{endpoint['id']}/rotate-secret",
        json={"overlapSeconds": 4},
    )
    new_secret = rotated["signingSecret"]
    ends = parse_time(rotated["previousSecretExpiresAt"])
    assert timedelta(seconds=3) < ends - datetime.now(UTC) <= timedelta(seconds=4)
    assert (
        api.endpoint(endpoint["id"])["previousSecretExpiresAt"]
        == rotated["previousSecretExpiresAt"]
    )

    publish(app, brand, *(("deal.completed", {"n": n}) for n in range(3)))
    during = receiver.wait_for(3)
    assert datetime.now(UTC) < ends, "the overlap ended before the deliveries: retry slower"
    for request in during:
        # a receiver not yet given the new secret, and one already switched, both accept it
        assert verifies(old_secret, request) and verifies(new_secret, request)
        assert request.headers["X-Service-Signature"].count("sha256=") == 2
        assert len(request.headers["webhook-signature"].split(" ")) == 2

    time.sleep(max(0.0, (ends - datetime.now(UTC)).total_seconds()) + 0.5)
    publish(app, brand, ("deal.completed", {"n": 3}))
    [*_, after] = receiver.wait_for(4)
    assert verifies(new_secret, after) and not verifies(old_secret, after)
    assert api.endpoint(endpoint["id"])["previousSecretExpiresAt"] is None
    # The worker's sweep destroys the old secret's ciphertext once the overlap is over.
    deadline = time.monotonic() + 10
    while True:
        with app.app_context():
            kept = db.session.scalar(
                select(WebhookEndpoint.previous_secret_ciphertext).where(
                    WebhookEndpoint.id == endpoint["id"]
                )
            )
        if kept is None:
            break
        assert time.monotonic() < deadline, logs(worker)
        time.sleep(0.2)


def test_rotation_without_an_overlap_stops_the_old_secret_at_once(
    app, api, brand, receiver, worker
):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    old_secret = endpoint["signingSecret"]
    rotated = api.call("POST", f"webhook/{endpoint['id']}/rotate-secret")
    assert rotated["previousSecretExpiresAt"] is None
    publish(app, brand, ("deal.completed", {"n": 1}))
    [request] = receiver.wait_for(1)
    assert verifies(rotated["signingSecret"], request) and not verifies(old_secret, request)
    assert request.headers["X-Service-Signature"].count("sha256=") == 1


def test_a_rotation_during_an_overlap_drops_the_oldest_secret(app, api, brand, receiver, worker):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    first = endpoint["signingSecret"]
    second = api.call(
        "POST", f"webhook/{endpoint['id']}/rotate-secret", json={"overlapSeconds": 3600}
    )["signingSecret"]
    third = api.call(
        "POST", f"webhook/{endpoint['id']}/rotate-secret", json={"overlapSeconds": 3600}
    )["signingSecret"]
    publish(app, brand, ("deal.completed", {"n": 1}))
    [request] = receiver.wait_for(1)
    assert verifies(third, request) and verifies(second, request)
    assert not verifies(first, request)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"overlapSeconds": -1}, "overlapSeconds"),
        ({"overlapSeconds": 604801}, "overlapSeconds"),
        ({"overlapSeconds": "3600"}, "overlapSeconds"),
        ({"overlapSeconds": 1.5}, "overlapSeconds"),
        ({"overlap": 3600}, "overlap"),
    ],
)
def test_a_bad_overlap_is_refused_and_changes_nothing(app, api, brand, receiver, body, field):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    with app.app_context():
        before = db.session.get(WebhookEndpoint, endpoint["id"]).secret_ciphertext
    response = api.client.post(
        f"/api/v1/brand/{brand}/webhook/{endpoint['id']}/rotate-secret",
        headers={"X-Api-Key": api.key},
        json=body,
    )
    assert response.status_code == 400
    payload = response.get_json()
    assert payload["errorCode"] == "VALIDATION_ERROR" and field in payload["errors"]
    with app.app_context():
        assert db.session.get(WebhookEndpoint, endpoint["id"]).secret_ciphertext == before
