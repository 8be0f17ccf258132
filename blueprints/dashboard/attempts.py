"""One attempt as the delivery page shows it (CONTRACT 12.5): where its time went, as a bar and
as text, and the curl command that makes it again, with when its signature goes stale.

The bar's segments are sized by classes (`w-tens-3 w-units-7` is 37%, static/dashboard.css):
the CSP allows no style attribute, and the page reads the same without JavaScript. The figures
are text beside it, so a screen reader (or a person) has the milliseconds, not a picture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from models.columns import utcnow
from schemas.base import iso_timestamp
from services.attempt_replay import curl_command, sent_to_url

_REUSED = "a kept-alive connection was reused"
# How old a timestamp receivers take (SPEC 6, rule 4: "about five minutes"; the Standard Webhooks
# libraries and scripts/webhook_receiver.py: 300 s). A copied command is refused after that.
RECEIVER_TOLERANCE = timedelta(minutes=5)


@dataclass(frozen=True)
class Segment:
    key: str  # dns, connect, tls, wait or rest: the class that colours it
    label: str
    ms: int | None
    note: str = ""  # why there is no figure
    percent: int = 0

    @property
    def width_classes(self) -> str:
        return f"w-tens-{self.percent // 10} w-units-{self.percent % 10}"


@dataclass(frozen=True)
class Staleness:
    """When the attempt's signatures were made (its timestamp header) and when a receiver that
    checks timestamps stops taking them, as ISO 8601; whether that is past already."""

    signed_at: str
    expires_at: str
    expired: bool


@dataclass(frozen=True)
class AttemptRecord:
    timing: list[Segment]
    curl: str | None
    # The endpoint's URL now names another host than the attempt's `Host` did.
    url_moved: bool = False
    # The command carries the attempt's own timestamp and signatures (None: none recorded).
    staleness: Staleness | None = None


def attempt_records(detail: dict, endpoint: dict | None, body: str) -> dict[int, AttemptRecord]:
    """Each attempt of a fetchWebhookDelivery dump by its number. `endpoint` is the endpoint's
    dump (None once deleted: its URL is gone, so no curl command); `body` the event's raw body."""
    now = utcnow()
    records = {}
    for attempt in detail["attempts"]:
        curl = None
        moved = False
        if endpoint is not None:
            curl = curl_command(
                url=endpoint["url"],
                remote_address=attempt["remoteAddress"],
                request_headers=attempt["requestHeaders"],
                body=body,
            )
            moved = not sent_to_url(endpoint["url"], attempt["requestHeaders"])
        records[attempt["attemptNumber"]] = AttemptRecord(
            timing_segments(attempt), curl, moved, staleness(attempt["requestHeaders"], now)
        )
    return records


def staleness(request_headers: dict[str, str], now: datetime) -> Staleness | None:
    """When the signatures sent with these headers go stale: their `X-Service-Timestamp` (the
    same second as `webhook-timestamp`) plus RECEIVER_TOLERANCE. None without a timestamp."""
    sent = next(
        (value for name, value in request_headers.items() if name.lower() == "x-service-timestamp"),
        "",
    )
    if not sent.isdigit():
        return None
    signed_at = datetime.fromtimestamp(int(sent), UTC)
    expires_at = signed_at + RECEIVER_TOLERANCE
    return Staleness(iso_timestamp(signed_at), iso_timestamp(expires_at), now >= expires_at)


def timing_segments(attempt: dict) -> list[Segment]:
    """DNS, connect, TLS, the wait for the first byte and the rest of `durationMs`, each with
    its share of the bar in whole percent (summing to 100)."""
    timings = attempt["timings"]
    answered = timings["firstByteMs"] is not None
    connected = attempt["remoteAddress"] is not None
    reused = answered and timings["connectMs"] is None
    # A figure is missing because its step did not happen, or because the attempt failed
    # before it (the error says how); only an answered attempt tells the two apart. An attempt
    # made before these figures were kept has none, and no error either.
    unknown = "no figure: see the error" if attempt["error"] else "not recorded"
    steps = [
        Segment("dns", "DNS lookup", timings["dnsMs"], "none needed" if connected else unknown),
        Segment(
            "connect",
            "TCP connect",
            timings["connectMs"],
            _REUSED if reused else unknown,
        ),
        Segment(
            "tls",
            "TLS handshake",
            timings["tlsMs"],
            (_REUSED if reused else "none over http") if answered else unknown,
        ),
        Segment("wait", "Waiting for the first byte", timings["firstByteMs"], "no answer came"),
    ]
    measured = sum(step.ms or 0 for step in steps)
    rest = max(0, attempt["durationMs"] - measured)
    label = "Sending the request, reading the answer" if answered else "The rest, no answer"
    steps.append(Segment("rest", label, rest))
    return _with_shares(steps)


def _with_shares(segments: list[Segment]) -> list[Segment]:
    """Whole percents by largest remainder, so they add up to 100; a step that took any time
    gets at least 1 (taken from the widest), so it shows."""
    total = sum(segment.ms or 0 for segment in segments)
    if total == 0:
        return segments
    exact = [(segment.ms or 0) * 100 / total for segment in segments]
    shares = [math.floor(value) for value in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - shares[i], reverse=True)
    for index in by_remainder[: 100 - sum(shares)]:
        shares[index] += 1
    for index, segment in enumerate(segments):
        if segment.ms and shares[index] == 0:
            shares[index] = 1
            shares[shares.index(max(shares))] -= 1
    return [
        Segment(s.key, s.label, s.ms, s.note, share)
        for s, share in zip(segments, shares, strict=True)
    ]
