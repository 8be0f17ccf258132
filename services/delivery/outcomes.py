"""What an attempt is and what came of it, the retry policy (CONTRACT 1, 6.2, 8.6), and the times
that bound a delivery round and its leases (docs/delivery.md, "Times and limits")."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from models.webhook_delivery import ERROR_MAX_LENGTH

JITTER = 0.10  # retries land within ±10% of the schedule (CONTRACT 6.2)
# A receiver's Retry-After is honoured up to this (CONTRACT 8.6).
RETRY_AFTER_MAX_SECONDS = 3600
GONE_REASON = "The receiver answered 410 Gone"
# What the log keeps of an outcome that could not be stored as the receiver sent it.
UNSTORABLE = "The receiver's answer could not be stored; its status is kept"
# A failure of the worker's own, not of the receiver (the transport writes it, health reads it).
OWN_FAULT = "Not sent: this worker"

# Each statement of a round, at most; a lock is skipped where it can be, else waited this long.
STATEMENT_TIMEOUT_SECONDS = 2.0
LOCK_TIMEOUT_SECONDS = 1.0
# A longer round has its socket shut: a half-open connection, where no server timeout fires.
ROUND_DEADLINE_SECONDS = 4.0
# After a round the database refused (an outage), the next waits this long.
DATABASE_RETRY_SECONDS = 1.0
# An attempt starts within this long of the claim that leased it, or not at all.
START_WINDOW_SECONDS = 2.0
# The longest an ended attempt's record waits: the round under way, then its own statement.
RECORD_SLACK_SECONDS = ROUND_DEADLINE_SECONDS + STATEMENT_TIMEOUT_SECONDS


@dataclass(frozen=True)
class RetryPolicy:
    """CONTRACT section 1: WEBHOOK_RETRY_SCHEDULE, WEBHOOK_DISABLE_FAILURES/_WINDOW, and the
    timeout that bounds an attempt, the breaker's pause and the lease."""

    schedule: tuple[int, ...]
    disable_failures: int
    disable_window: timedelta
    timeout: float = 10.0

    @classmethod
    def from_settings(cls, settings) -> RetryPolicy:
        return cls(
            schedule=settings.webhook_retry_schedule,
            disable_failures=settings.webhook_disable_failures,
            disable_window=timedelta(seconds=settings.webhook_disable_window),
            timeout=settings.webhook_timeout,
        )

    @property
    def lease(self) -> timedelta:
        """A claim's lease: its attempt starts, ends and is recorded before the lease ends, so no
        other worker takes the delivery while it may be on the wire or unrecorded."""
        return timedelta(seconds=START_WINDOW_SECONDS + self.timeout + RECORD_SLACK_SECONDS)

    def retry_delay(
        self, attempt_number: int, outcome: AttemptOutcome, rng: random.Random | None = None
    ) -> tuple[float | None, float | None]:
        """(seconds to the next attempt, seconds before which none may start: a Retry-After),
        or Nones for a success or after the last attempt."""
        if outcome.succeeded or attempt_number > len(self.schedule):
            return None, None
        delay = self.schedule[attempt_number - 1] * (rng or random).uniform(1 - JITTER, 1 + JITTER)
        asked = None
        if outcome.retry_after_seconds is not None:
            asked = min(outcome.retry_after_seconds, RETRY_AFTER_MAX_SECONDS)
            delay = max(delay, asked)
        return delay, asked


@dataclass(frozen=True)
class Attempt:
    """One attempt to make now: a leased delivery and its endpoint as committed at the claim."""

    delivery_id: str
    brand_id: str
    endpoint_id: str
    event_id: str
    event_name: str
    attempt_number: int
    body: bytes
    url: str
    secret_ciphertext: str
    # The secret before it, while a rotation's overlap lasts at the claim (it signs too).
    previous_secret_ciphertext: str | None
    token: str
    # time.monotonic() after which this attempt must not start (its claim's start window).
    start_by: float = float("inf")
    # The endpoint was failing at the claim: its success is news for its health.
    endpoint_failing: bool = False
    # CONTRACT 13.6: the endpoint takes a `traceparent`; the event's, which the attempt joins.
    trace_context: bool = False
    traceparent: str | None = None


@dataclass(frozen=True)
class AttemptTimings:
    """Where an attempt's time went (CONTRACT 12.5), in milliseconds; None for a step not made."""

    dns_ms: int | None = None
    connect_ms: int | None = None
    tls_ms: int | None = None
    first_byte_ms: int | None = None


@dataclass(frozen=True)
class AttemptOutcome:
    """What happened, every string already safe to store (services/delivery/answers.py)."""

    requested_at: datetime
    duration_ms: int
    request_headers: dict[str, str]
    http_status: int | None = None
    error: str | None = None
    response_body: str | None = None
    response_headers: dict[str, str] | None = None
    remote_address: str | None = None
    timings: AttemptTimings = AttemptTimings()
    # What the receiver asked for: a later retry (429/503 Retry-After), or no more (410 Gone).
    retry_after_seconds: float | None = None
    gone: bool = False

    @property
    def succeeded(self) -> bool:
        return self.error is None and self.http_status is not None and 200 <= self.http_status < 300

    @property
    def kind(self) -> str:
        """succeeded, http_error, timeout, not_sent or network_error: for metrics, whose labels
        must be few. The sender's errors start with the words this reads (transport.py)."""
        if self.succeeded:
            return "succeeded"
        if self.http_status is not None:
            return "http_error"
        error = self.error or ""
        if error.startswith("Timed out"):
            return "timeout"
        if error.startswith("Not sent"):
            return "not_sent"
        return "network_error"

    @property
    def counts_against_endpoint(self) -> bool:
        """A failure of this worker's own (it could not decrypt the secret, it ran out of file
        descriptors) is retried on the schedule but says nothing of the receiver."""
        return not self.succeeded and not (self.error or "").startswith(OWN_FAULT)

    @property
    def error_text(self) -> str | None:
        """What the log keeps of a failure (every failed attempt says why)."""
        if self.succeeded:
            return None
        error = self.error or f"HTTP {self.http_status}"
        return error[:ERROR_MAX_LENGTH]

    def reduced(self) -> AttemptOutcome:
        """Nothing of the receiver's but its status: what is stored when the whole cannot be."""
        return AttemptOutcome(
            requested_at=self.requested_at,
            duration_ms=self.duration_ms,
            request_headers={},
            http_status=self.http_status,
            error=None if self.succeeded else UNSTORABLE,
            response_body=None if self.succeeded else "",
            retry_after_seconds=self.retry_after_seconds,
            gone=self.gone,
        )


def not_sent(why: str, requested_at: datetime) -> AttemptOutcome:
    """An attempt that never reached the wire, for a reason of this worker's."""
    return AttemptOutcome(requested_at=requested_at, duration_ms=0, request_headers={}, error=why)


@dataclass(frozen=True)
class Recorded:
    """What became of an attempt's result: `kept` (written, with its endpoint's run of failures
    as the record read it), `carried` (its rows were locked: next round), or neither (its lease
    was another worker's by then, or it could not be stored at all)."""

    status: str
    retry_at: datetime | None = None
    kept: bool = True
    carried: bool = False
    reduced: bool = False
    consecutive_failures: int = 0
    probing: bool = False
