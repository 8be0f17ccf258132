"""scripts/webhook_receiver.py, the receiver the README tells developers to run, accepts what the
service signs and refuses anything else, and prints each delivery on a line of its own."""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from models.credentials import SIGNING_SECRET_PREFIX, generate_secret, generate_signing_secret
from services.signing import delivery_headers, sign
from tests.ports import free_port

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "webhook_receiver.py"
spec = importlib.util.spec_from_file_location("webhook_receiver", SCRIPT)
receiver_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(receiver_script)

SECRET = "whsec_local-development-secret"
BODY = b'{"id":"evt_1","type":"webhook.test"}'


def test_a_signature_made_by_the_service_verifies():
    now = int(time.time())
    assert receiver_script.signature_ok(SECRET, str(now), sign(SECRET, now, BODY), BODY)


def test_a_changed_body_another_secret_or_an_old_timestamp_is_refused():
    now = int(time.time())
    good = sign(SECRET, now, BODY)
    assert not receiver_script.signature_ok(SECRET, str(now), good, BODY + b" ")
    assert not receiver_script.signature_ok("whsec_other", str(now), good, BODY)
    old = now - 600
    assert not receiver_script.signature_ok(SECRET, str(old), sign(SECRET, old, BODY), BODY)


def _headers(secret: str, body: bytes, previous: str | None = None) -> dict[str, str]:
    return delivery_headers(
        secret=secret,
        previous_secret=previous,
        timestamp=int(time.time()),
        raw_body=body,
        event_name="webhook.test",
        event_id="evt_1",
        delivery_id="whd_1",
    )


def test_both_signature_headers_verify_with_a_secret_of_either_format():
    """Standard Webhooks' header too, keyed by the secret's format (CONTRACT 12.1): a base64
    secret's 32 bytes, an older secret's whole string; during an overlap either secret."""
    new, older = generate_signing_secret(), generate_secret(SIGNING_SECRET_PREFIX)
    for secret, other in ((new, older), (older, new)):
        for headers in (_headers(secret, BODY), _headers(other, BODY, previous=secret)):
            assert receiver_script.signatures_ok(secret, headers, BODY)
            standard_only = {k: v for k, v in headers.items() if not k.startswith("X-Service")}
            assert receiver_script.signatures_ok(secret, standard_only, BODY)
        assert not receiver_script.signatures_ok(secret, _headers(other, BODY), BODY)
        assert not receiver_script.signatures_ok(secret, _headers(secret, BODY), BODY + b" ")
        # One good header does not cover a bad one: each header present must verify.
        good, bad = _headers(secret, BODY), _headers(other, BODY)
        for header in ("webhook-signature", "X-Service-Signature"):
            assert not receiver_script.signatures_ok(secret, good | {header: bad[header]}, BODY)
        assert not receiver_script.signatures_ok(secret, {"webhook-id": "evt_1"}, BODY)
    # A base64 secret's webhook-signature is keyed with its bytes, not the string.
    keyed_with_the_string = _headers(new, BODY)
    keyed_with_the_string["webhook-signature"] = sign_standard_with_key(
        new.encode(), "evt_1", keyed_with_the_string["webhook-timestamp"], BODY
    )
    assert not receiver_script.signatures_ok(new, keyed_with_the_string, BODY)


def sign_standard_with_key(key: bytes, message_id: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(key, f"{message_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def test_concurrent_deliveries_print_one_whole_line_each(tmp_path):
    """The script as the README runs it, 40 deliveries arriving at once: each is one line, whole
    (its event, its delivery id, its verdict and its body), none cut into another."""
    port = free_port()
    log = tmp_path / "receiver.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), str(port)],
            env={"PATH": os.environ["PATH"], "WEBHOOK_SECRET": SECRET, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    listening = f"listening on http://127.0.0.1:{port}/hooks\n"
    try:
        deadline = time.monotonic() + 60  # a loaded machine starts Python slowly
        while log.read_text() != listening and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()
            time.sleep(0.05)
        assert log.read_text() == listening, log.read_text()
        bodies = {
            f"whd_{number}": json.dumps(
                {"id": f"evt_{number}", "type": "deal.completed", "data": {"note": "Ọjà " * 200}}
            ).encode()
            for number in range(40)
        }
        start = threading.Barrier(len(bodies))

        def deliver(delivery_id: str) -> int:
            now = int(time.time())
            body = bodies[delivery_id]
            headers = {
                "Content-Type": "application/json",
                "X-Service-Event": "deal.completed",
                "X-Service-Delivery": delivery_id,
                "X-Service-Timestamp": str(now),
                "X-Service-Signature": sign(SECRET, now, body),
            }
            start.wait()
            url = f"http://127.0.0.1:{port}/hooks"
            return requests.post(url, data=body, headers=headers, timeout=10).status_code

        with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
            assert set(pool.map(deliver, bodies)) == {200}
    finally:
        process.terminate()
        process.wait(timeout=10)

    output = log.read_text()
    lines = output.removeprefix(listening).splitlines()
    assert len(lines) == len(bodies), output
    printed = {}
    for line in lines:
        match = re.fullmatch(r"deal\.completed (whd_\d+) \(signature OK\) (\{.*\})", line)
        assert match, line
        printed[match[1]] = json.loads(match[2])
    assert printed == {delivery_id: json.loads(body) for delivery_id, body in bodies.items()}
