"""The one place that signs webhooks (CONTRACT 6.1).

The signature is HMAC-SHA256, keyed with the endpoint's signing secret (the whole `whsec_…`
string, as UTF-8), over `{timestamp}.{rawBody}`: the timestamp is inside the MAC, so a captured
delivery cannot be replayed later with a fresh `X-Service-Timestamp`.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Service-Signature"
TIMESTAMP_HEADER = "X-Service-Timestamp"
EVENT_HEADER = "X-Service-Event"
DELIVERY_HEADER = "X-Service-Delivery"
USER_AGENT = "BrandAPI-Webhooks/1"


def sign(secret: str, timestamp: int, raw_body: bytes) -> str:
    """`sha256=<hex>` of `{timestamp}.{rawBody}`."""
    mac = hmac.new(secret.encode(), b"%d." % timestamp + raw_body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def delivery_headers(
    *, secret: str, timestamp: int, raw_body: bytes, event_name: str, delivery_id: str
) -> dict[str, str]:
    """The five headers of CONTRACT 6.1 (and a User-Agent) for one attempt."""
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, raw_body),
        EVENT_HEADER: event_name,
        DELIVERY_HEADER: delivery_id,
    }
