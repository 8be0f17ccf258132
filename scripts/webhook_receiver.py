"""A webhook receiver for local development: prints each delivery on one line (its event, its
delivery id, whether its signatures verify, its body) and answers 200 (400 to a bad signature).

    WEBHOOK_SECRET=whsec_… python scripts/webhook_receiver.py [PORT]   # default 8000

Register it with `"url": "http://127.0.0.1:8000/hooks"` (development allows http to 127.0.0.1).
It checks both signatures a delivery carries: `X-Service-Signature` and Standard Webhooks'
`webhook-signature`, keyed by the secret's format (CONTRACT 12.1), so a secret of either format
works. The verification below is the whole of what a production receiver needs (plus
deduplicating on the event id, `webhook-id`); see docs/webhooks.md. Standard library only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_SECONDS = 300
SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
SIGNING_KEY_BYTES = 32
BASE64_KEY_LENGTH = 44  # padded base64 of 32 bytes; older secrets are base62 of another length
BODY_SHOWN = 2000  # characters of a body that is not JSON
# Deliveries arrive on several threads at once: each line is written whole, under this lock.
_output = threading.Lock()


def fresh(timestamp: str) -> bool:
    return timestamp.isdigit() and abs(time.time() - int(timestamp)) <= TOLERANCE_SECONDS


def signature_ok(secret: str, timestamp: str, signatures: str, raw_body: bytes) -> bool:
    """X-Service-Signature, keyed with the whole secret string: one signature per signing
    secret, comma-separated during a rotation's overlap: any."""
    if not fresh(timestamp):
        return False
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + raw_body, hashlib.sha256)
    expected = "sha256=" + mac.hexdigest()
    return any(hmac.compare_digest(expected, given.strip()) for given in signatures.split(","))


def standard_signing_key(secret: str) -> bytes:
    """The key of `webhook-signature`: the 32 bytes a `whsec_` + base64 secret encodes (what
    Standard Webhooks libraries do with it); a secret issued before (base62) as a whole string."""
    encoded = secret[len(SECRET_PREFIX) :]
    if secret.startswith(SECRET_PREFIX) and len(encoded) == BASE64_KEY_LENGTH:
        try:
            key = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            key = b""
        if len(key) == SIGNING_KEY_BYTES and base64.b64encode(key).decode() == encoded:
            return key
    return secret.encode()


def standard_signature_ok(
    secret: str, message_id: str, timestamp: str, signatures: str, raw_body: bytes
) -> bool:
    """webhook-signature: `v1,` + base64 HMAC-SHA256 of `{webhook-id}.{webhook-timestamp}.{body}`,
    space-separated during a rotation's overlap: any."""
    if not message_id or not fresh(timestamp):
        return False
    message = f"{message_id}.{timestamp}.".encode() + raw_body
    mac = hmac.new(standard_signing_key(secret), message, hashlib.sha256).digest()
    expected = "v1," + base64.b64encode(mac).decode()
    return any(hmac.compare_digest(expected, given) for given in signatures.split())


def signatures_ok(secret: str, headers, raw_body: bytes) -> bool:
    """Each signature header the delivery carries verifies (at least one must be there)."""
    ours = headers.get("X-Service-Signature")
    standard = headers.get("webhook-signature")
    if ours is None and standard is None:
        return False
    if ours is not None:
        timestamp = headers.get("X-Service-Timestamp", "")
        if not signature_ok(secret, timestamp, ours, raw_body):
            return False
    if standard is not None:
        message_id = headers.get("webhook-id", "")
        timestamp = headers.get("webhook-timestamp", "")
        if not standard_signature_ok(secret, message_id, timestamp, standard, raw_body):
            return False
    return True


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        raw_body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        secret = os.environ.get("WEBHOOK_SECRET", "")
        verdict = "no WEBHOOK_SECRET set"
        if secret:
            valid = signatures_ok(secret, self.headers, raw_body)
            verdict = "signature OK" if valid else "SIGNATURE INVALID"
        try:
            body = json.dumps(json.loads(raw_body), ensure_ascii=False)
        except ValueError:
            body = repr(raw_body[:BODY_SHOWN])
        say(
            f"{self.headers.get('X-Service-Event')} {self.headers.get('X-Service-Delivery')}"
            f" ({verdict}) {body}"
        )
        self.send_response(200 if verdict != "SIGNATURE INVALID" else 400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format, *args) -> None:
        pass


class Server(ThreadingHTTPServer):
    # The listen backlog of a real server: with the default of 5, a burst of deliveries (a
    # worker catching up) gets connections reset.
    request_queue_size = 128
    daemon_threads = True


def say(line: str) -> None:
    """One write of the whole line, flushed: concurrent deliveries never share a line."""
    with _output:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    say(f"listening on http://127.0.0.1:{port}/hooks")
    Server(("127.0.0.1", port), Handler).serve_forever()
