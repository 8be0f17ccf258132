"""scripts/webhook_receiver.py, the receiver the README tells developers to run, accepts what the
service signs and refuses anything else."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

from services.signing import sign

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
