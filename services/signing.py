"""The one place that signs webhooks (CONTRACT 6.1, 8.1 and 8.2).

Two signatures of every delivery, both HMAC-SHA256 keyed with the endpoint's signing secret (the
whole `whsec_…` string, as UTF-8 bytes):

- ours, `X-Service-Signature: sha256=<hex>` over `{timestamp}.{rawBody}`;
- Standard Webhooks' (standardwebhooks.com), `webhook-signature: v1,<base64>` over
  `{webhook-id}.{webhook-timestamp}.{rawBody}`, so that a receiver can verify with the official
  `standardwebhooks` libraries instead of hand-written HMAC code.

The timestamp is inside both MACs, so a captured delivery cannot be replayed later with a fresh
one. During a rotation's overlap each header carries one signature per secret, newest first.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

SIGNATURE_HEADER = "X-Service-Signature"
TIMESTAMP_HEADER = "X-Service-Timestamp"
EVENT_HEADER = "X-Service-Event"
DELIVERY_HEADER = "X-Service-Delivery"
STANDARD_ID_HEADER = "webhook-id"
STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SIGNATURE_HEADER = "webhook-signature"
USER_AGENT = "BrandAPI-Webhooks/1"


def sign(secret: str, timestamp: int, raw_body: bytes) -> str:
    """`sha256=<hex>` of `{timestamp}.{rawBody}`."""
    mac = hmac.new(secret.encode(), b"%d." % timestamp + raw_body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def sign_standard(secret: str, message_id: str, timestamp: int, raw_body: bytes) -> str:
    """Standard Webhooks' `v1,<base64>` of `{webhook-id}.{webhook-timestamp}.{rawBody}`."""
    message = message_id.encode() + b".%d." % timestamp + raw_body
    mac = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def delivery_headers(
    *,
    secret: str,
    timestamp: int,
    raw_body: bytes,
    event_name: str,
    delivery_id: str,
    previous_secret: str | None = None,
) -> dict[str, str]:
    """The headers of one attempt (CONTRACT 6.1 and 8.1, and a User-Agent), signed with
    `secret` and, during a rotation's overlap, with `previous_secret` after it."""
    secrets = [secret] if previous_secret is None else [secret, previous_secret]
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: ", ".join(sign(key, timestamp, raw_body) for key in secrets),
        EVENT_HEADER: event_name,
        DELIVERY_HEADER: delivery_id,
        STANDARD_ID_HEADER: delivery_id,
        STANDARD_TIMESTAMP_HEADER: str(timestamp),
        STANDARD_SIGNATURE_HEADER: " ".join(
            sign_standard(key, delivery_id, timestamp, raw_body) for key in secrets
        ),
    }
