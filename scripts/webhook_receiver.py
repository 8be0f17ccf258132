"""A webhook receiver for local development: prints each delivery and whether its signature
verifies, and answers 200.

    WEBHOOK_SECRET=whsec_… python scripts/webhook_receiver.py [PORT]   # default 8000

Register it with `"url": "http://127.0.0.1:8000/hooks"` (development allows http to 127.0.0.1).
The verification below is the whole of what a production receiver needs (plus deduplicating on
X-Service-Delivery); see docs/webhooks.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_SECONDS = 300


def signature_ok(secret: str, timestamp: str, signatures: str, raw_body: bytes) -> bool:
    """One signature per signing secret, comma-separated during a rotation's overlap: any."""
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > TOLERANCE_SECONDS:
        return False
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + raw_body, hashlib.sha256)
    expected = "sha256=" + mac.hexdigest()
    return any(hmac.compare_digest(expected, given.strip()) for given in signatures.split(","))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        raw_body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        secret = os.environ.get("WEBHOOK_SECRET", "")
        verdict = "no WEBHOOK_SECRET set"
        if secret:
            valid = signature_ok(
                secret,
                self.headers.get("X-Service-Timestamp", ""),
                self.headers.get("X-Service-Signature", ""),
                raw_body,
            )
            verdict = "signature OK" if valid else "SIGNATURE INVALID"
        print(
            f"{self.headers.get('X-Service-Event')} {self.headers.get('X-Service-Delivery')}"
            f" ({verdict})"
        )
        try:
            print(json.dumps(json.loads(raw_body), indent=2))
        except ValueError:
            print(raw_body[:500])
        self.send_response(200 if verdict != "SIGNATURE INVALID" else 400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format, *args) -> None:
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    print(f"listening on http://127.0.0.1:{port}/hooks")
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
