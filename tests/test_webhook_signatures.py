"""What a receiver verifies, end to end: real deliveries from a real worker are accepted by the
official `standardwebhooks` library given the signing secret exactly as issued (CONTRACT 8.1 and
12.1), and a rotation with an overlap keeps a receiver with the old secret and one with the new
secret verifying every delivery until the overlap ends, and only the new one after it (CONTRACT
8.2). A secret issued before secrets were base64 goes on signing as it did until rotated."""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib.util
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from standardwebhooks import Webhook, WebhookVerificationError

from extensions import db
from models import WebhookEndpoint, credentials
from services.secret_box import secret_box
from services.signing import delivery_headers
from tests import test_webhook_delivery as delivery
from tests.receiver import Received, expected_signature
from tests.test_webhook_delivery import logs, parse_time, publish

api = delivery.api
workers = delivery.workers
worker = delivery.worker
start_worker = delivery.start_worker

ROOT = Path(__file__).resolve().parent.parent
# What register and rotate issue (CONTRACT 12.1): `whsec_` + padded base64 of 32 bytes.
ISSUED_SECRET = re.compile(r"whsec_[A-Za-z0-9+/]{43}=")


def library_verifies(webhook: Webhook, request: Received) -> bool:
    try:
        webhook.verify(request.body, request.headers)
    except WebhookVerificationError:
        return False
    return True


def verifies(secret: str, request: Received, *, issued_before: bool = False) -> bool:
    """Both ways a receiver can check a delivery with `secret`: our header with hand-written
    HMAC code (keyed with the whole string), and Standard Webhooks' with the official library,
    given the secret as issued, or as bytes for a secret issued before. They must agree."""
    ours = request.headers["X-Service-Signature"].split(", ")
    timestamp = request.headers["X-Service-Timestamp"]
    by_hand = expected_signature(secret, timestamp, request.body) in ours
    by_library = library_verifies(Webhook(secret.encode() if issued_before else secret), request)
    assert by_hand == by_library, (secret, request.headers)
    return by_hand


def older_secret() -> str:
    """A signing secret as they were issued before CONTRACT 12.1: `whsec_` + 32 base62 + a
    6-character checksum, the minting API keys still use."""
    secret = credentials.generate_secret(credentials.SIGNING_SECRET_PREFIX)
    assert re.fullmatch(r"whsec_[0-9A-Za-z]{38}", secret)
    return secret


def made_before(app, endpoint_id: str, secret: str) -> None:
    """The endpoint as one registered before this change: its secret, of the older format,
    encrypted with the app's secret box as register did."""
    with app.app_context():
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_id)
            .values(secret_ciphertext=secret_box().encrypt(secret))
        )
        db.session.commit()


def test_the_standard_webhooks_library_verifies_real_deliveries_with_the_secret_as_issued(
    app, api, brand, receiver, worker
):
    endpoint = api.register(receiver.url, events=["deal.completed", "escrow.released"])
    secret = endpoint["signingSecret"]
    assert ISSUED_SECRET.fullmatch(secret), secret
    key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    assert len(key) == 32
    receiver.secrets = [secret]
    published = publish(app, brand, ("deal.completed", {"n": 1}), ("escrow.released", {"n": 2}))

    received = receiver.wait_for(2)
    for request in received:
        # The secret string exactly as issued, as the library's own docs show it.
        event = Webhook(secret).verify(request.body, request.headers)
        assert event["id"] in {event_id for event_id, _ in published}
        # The event's id, the same on every send of it (CONTRACT 12.1); deliveries differ.
        assert request.headers["webhook-id"] == event["id"]
        assert request.headers["X-Service-Delivery"].startswith("whd_")
        assert request.headers["webhook-timestamp"] == request.headers["X-Service-Timestamp"]
        # webhook-signature is keyed with the 32 bytes, by hand as by the library...
        message = f"{event['id']}.{request.headers['webhook-timestamp']}.".encode() + request.body
        mac = hmac.new(key, message, hashlib.sha256).digest()
        assert request.headers["webhook-signature"] == "v1," + base64.b64encode(mac).decode()
        # ...not with the string any more; X-Service-Signature still is (CONTRACT 6.1).
        assert not library_verifies(Webhook(secret.encode()), request)
        timestamp = request.headers["X-Service-Timestamp"]
        assert request.headers["X-Service-Signature"] == expected_signature(
            secret, timestamp, request.body
        )
        assert request.signature_valid  # tests/receiver.py's own check of X-Service-Signature
        with pytest.raises(WebhookVerificationError):
            Webhook(credentials.generate_signing_secret()).verify(request.body, request.headers)
        tampered = request.body.replace(b'"n":', b'"m":')
        with pytest.raises(WebhookVerificationError):
            Webhook(secret).verify(tampered, request.headers)


@pytest.mark.parametrize(
    ("document", "heading"),
    [
        ("README.md", "### Verifying deliveries with a Standard Webhooks library"),
        ("docs/webhooks.md", "### Verifying with a Standard Webhooks library"),
    ],
)
def test_the_documents_python_verifies_a_real_delivery(
    app, api, brand, receiver, worker, document, heading
):
    """The snippet as written, given `secret`, `raw_body` and `headers` (the names it uses)."""
    section = (ROOT / document).read_text().split(heading, 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "Webhook(secret)" in block and "wh.verify(raw_body, headers)" in block
    endpoint = api.register(receiver.url, events=["deal.completed"])
    [(event_id, _)] = publish(app, brand, ("deal.completed", {"n": 1}))
    [request] = receiver.wait_for(1)
    secret = endpoint["signingSecret"]
    run = {"secret": secret, "raw_body": request.body, "headers": request.headers}
    exec(block, run)  # noqa: S102 - the document's own code, against a real delivery
    assert run["event"]["id"] == event_id
    tampered = {**run, "raw_body": request.body.replace(b'"n":1', b'"n":2')}
    with pytest.raises(WebhookVerificationError):
        exec(block, tampered)  # noqa: S102


def test_an_endpoint_made_before_base64_secrets_signs_as_it_did_until_rotated(
    app, api, brand, receiver, worker
):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    older = older_secret()
    made_before(app, endpoint["id"], older)
    receiver.secrets = [older]
    publish(app, brand, ("deal.completed", {"n": 1}))
    [request] = receiver.wait_for(1)
    # Both headers keyed with the whole string, as before: the library takes it as bytes.
    assert verifies(older, request, issued_before=True)
    assert request.signature_valid
    assert not library_verifies(Webhook(older), request)  # the string would be read as base64

    # A rotation with an overlap: each secret signs by its own format, so a receiver still on
    # the older secret and one given the new secret as issued both verify each delivery.
    rotated = api.call(
        "POST", f"webhook/{endpoint['id']}/rotate-secret", json={"overlapSeconds": 3600}
    )
    new_secret = rotated["signingSecret"]
    assert ISSUED_SECRET.fullmatch(new_secret), new_secret
    publish(app, brand, ("deal.completed", {"n": 2}))
    [_, during] = receiver.wait_for(2)
    assert verifies(older, during, issued_before=True)
    assert verifies(new_secret, during)
    assert len(during.headers["webhook-signature"].split(" ")) == 2

    # Rotated again without an overlap: the older secret is gone, the library's usual call stays.
    newest = api.call("POST", f"webhook/{endpoint['id']}/rotate-secret")["signingSecret"]
    publish(app, brand, ("deal.completed", {"n": 3}))
    [*_, after] = receiver.wait_for(3)
    assert verifies(newest, after)
    assert not verifies(older, after, issued_before=True)


def test_the_two_secret_formats_are_told_apart_alike_everywhere():
    """One rule tells a base64 secret (keyed with its 32 bytes) from any other (keyed with the
    whole string): the service's, and the copies the one-file scripts carry, agree on secrets of
    both formats and on near misses, and the service signs by it."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    listen, receiver_script = load("listen"), load("webhook_receiver")
    new = [credentials.generate_signing_secret() for _ in range(200)] + [listen.new_secret()]
    old = (
        [older_secret() for _ in range(200)]
        + [
            "whsec_relayTestSecret0123456789abcdefXYZ",  # a relay's --secret: anything whsec_…
            "whsec_" + "A" * 44,  # 44 characters, but not padded base64
            "whsec_" + base64.b64encode(b"k" * 32).decode().rstrip("="),  # unpadded
            "whsec_" + base64.urlsafe_b64encode(b"\xfb" * 32).decode(),  # the url-safe alphabet
            "whsec_" + base64.b64encode(b"k" * 31).decode(),  # 44 characters, 31 bytes
            "whsec_" + base64.b64encode(b"k" * 32).decode()[:-2] + "x=",  # not canonical
            "whsec_" + base64.b64encode(b"k" * 33).decode(),  # 33 bytes
            base64.b64encode(b"k" * 32).decode(),  # no prefix
        ]
    )
    for secret in new:
        assert ISSUED_SECRET.fullmatch(secret), secret
        key = base64.b64decode(secret[len("whsec_") :])
        assert credentials.is_base64_signing_secret(secret)
        assert credentials.standard_signing_key(secret) == key
        assert listen.standard_signing_key(secret) == key
        assert receiver_script.standard_signing_key(secret) == key
    for secret in old:
        assert not credentials.is_base64_signing_secret(secret), secret
        assert credentials.standard_signing_key(secret) == secret.encode(), secret
        assert listen.standard_signing_key(secret) == secret.encode(), secret
        assert receiver_script.standard_signing_key(secret) == secret.encode(), secret
    # The service signs each of a rotation's secrets by its own format.
    body, now = b'{"id":"evt_1"}', int(time.time())
    headers = delivery_headers(
        secret=new[0],
        previous_secret=old[0],
        timestamp=now,
        raw_body=body,
        event_name="deal.completed",
        event_id="evt_1",
        delivery_id="whd_1",
    )
    assert Webhook(new[0]).verify(body, headers) == {"id": "evt_1"}
    assert Webhook(old[0].encode()).verify(body, headers) == {"id": "evt_1"}


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
