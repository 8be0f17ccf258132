"""The one place that signs webhooks (CONTRACT 6.1, 8.1, 8.2 and 12.1).

Two signatures of every delivery, both HMAC-SHA256 with the endpoint's signing secret:

- ours, `X-Service-Signature: sha256=<hex>` over `{timestamp}.{rawBody}`, keyed with the whole
  `whsec_…` string as UTF-8 bytes, whatever its format;
- Standard Webhooks' (standardwebhooks.com), `webhook-signature: v1,<base64>` over
  `{webhook-id}.{webhook-timestamp}.{rawBody}`, keyed as their libraries key it: with the 32
  bytes a `whsec_` + base64 secret encodes, so `Webhook(secret)` verifies with the secret as
  issued. A secret issued before (base62) keys it with the whole string, as it always did, until
  the endpoint's secret is rotated (models/credentials.standard_signing_key).

The timestamp is inside both MACs, so a captured delivery cannot be replayed later with a fresh
one. During a rotation's overlap each header carries one signature per secret, newest first.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from models.credentials import standard_signing_key

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
    """Standard Webhooks' `v1,<base64>` of `{webhook-id}.{webhook-timestamp}.{rawBody}`, keyed
    by the secret's format (each secret of a rotation's overlap by its own)."""
    message = message_id.encode() + b".%d." % timestamp + raw_body
    mac = hmac.new(standard_signing_key(secret), message, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def delivery_headers(
    *,
    secret: str,
    timestamp: int,
    raw_body: bytes,
    event_name: str,
    event_id: str,
    delivery_id: str,
    previous_secret: str | None = None,
) -> dict[str, str]:
    """The headers of one attempt (CONTRACT 6.1, 8.1 and 12.1, and a User-Agent), signed with
    `secret` and, during a rotation's overlap, with `previous_secret` after it. `webhook-id` is
    the event's id, the same on every send of the event (a retry, a redelivery, a recover), as
    Standard Webhooks receivers deduplicate on it; `X-Service-Delivery` tells deliveries apart."""
    secrets = [secret] if previous_secret is None else [secret, previous_secret]
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: ", ".join(sign(key, timestamp, raw_body) for key in secrets),
        EVENT_HEADER: event_name,
        DELIVERY_HEADER: delivery_id,
        STANDARD_ID_HEADER: event_id,
        STANDARD_TIMESTAMP_HEADER: str(timestamp),
        STANDARD_SIGNATURE_HEADER: " ".join(
            sign_standard(key, event_id, timestamp, raw_body) for key in secrets
        ),
    }
