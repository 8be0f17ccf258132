"""Endpoint health, in one place: counting an endpoint's failed attempts, the breaker's pause,
disabling it (by its owner, or by the service after a long run of failures or a 410 Gone) and
re-enabling it (CONTRACT 4, 6.2, 8.5 and 8.6).

The API and the dashboard (update-endpoint) and the worker (after each round's record) all go
through these functions, so "disabled" always means the same state: `disabled_at` and a reason
set, and an `end_pending` job (bulk.py) that ends every pending delivery `failed` in batches,
while no attempt starts. The two operational events of CONTRACT 8.5 are published here too, in
the transaction of the change they announce.

A round never waits for an endpoint row: it locks the rows it changes with SKIP LOCKED, and
what it could not apply (someone is changing that endpoint) it applies next round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select, text, update

from extensions import db
from models import WebhookEndpoint
from models.bulk_job import CATCH_UP, END_PENDING
from models.webhook_delivery import LAST_ATTEMPT_BODY_CHARS
from models.webhook_endpoint import endpoint_is_open_sql
from schemas.events import event_data
from services.delivery.bulk import request_job
from services.delivery.outcomes import GONE_REASON, Attempt, AttemptOutcome, Recorded, RetryPolicy
from services.delivery.queue import PROBING_AFTER_FAILURES
from services.events import publish_event

ENDPOINT_FAILING = "webhook.endpoint_failing"
ENDPOINT_DISABLED = "webhook.endpoint_disabled"


def failing_threshold(disable_failures: int) -> int:
    """The run of failed attempts at which an endpoint is failing (CONTRACT 8.5): half the
    disable threshold, rounded up (8 of the default 15)."""
    return max(1, math.ceil(disable_failures / 2))


@dataclass
class EndpointNews:
    """What a round's attempts say of one endpoint: a success ends its run of failures (and
    brings its retries forward if it was down); the failures after its last success extend the
    run; a 410 closes it."""

    endpoint_id: str
    succeeded: bool = False
    was_down: bool = False
    failures: list[tuple[Attempt, AttemptOutcome]] = field(default_factory=list)

    def merge(self, later: EndpointNews) -> EndpointNews:
        if later.succeeded:
            return EndpointNews(
                self.endpoint_id, True, self.was_down or later.was_down, later.failures
            )
        return EndpointNews(
            self.endpoint_id, self.succeeded, self.was_down, self.failures + later.failures
        )

    @property
    def needs_writing(self) -> bool:
        return bool(self.failures) or self.was_down or self.succeeded


def news_of(
    results: Sequence[tuple[Attempt, AttemptOutcome]], recorded: Sequence[Recorded]
) -> dict[str, EndpointNews]:
    """The news of each endpoint whose results were written, in the order they finished. A
    success is news only for an endpoint that was failing; a worker's own fault is none."""
    news: dict[str, EndpointNews] = {}
    for (attempt, outcome), result in zip(results, recorded, strict=True):
        if not result.kept:
            continue
        item = news.setdefault(attempt.endpoint_id, EndpointNews(attempt.endpoint_id))
        if outcome.succeeded:
            if result.consecutive_failures or result.probing or item.failures:
                item.succeeded = True
                item.was_down = item.was_down or result.probing
                item.failures = []
        elif outcome.counts_against_endpoint:
            item.failures.append((attempt, outcome))
    return {key: item for key, item in news.items() if item.needs_writing}


@dataclass(frozen=True)
class HealthApplied:
    """What a round's health step did: endpoints it disabled (for the log and metrics), and the
    news it could not write yet (their rows were locked), for the next round."""

    disabled: list[tuple[str, str]] = field(default_factory=list)
    carried: dict[str, EndpointNews] = field(default_factory=dict)


def apply_news(news: dict[str, EndpointNews], *, policy: RetryPolicy) -> HealthApplied:
    """Write each endpoint's news (the caller commits): its run of failures, the breaker's pause
    before the next probe (1, 2, 4... seconds, at most the timeout), `webhook.endpoint_failing`
    when the run first reaches the failing threshold, a catch-up job when a down endpoint
    answers again, and a disable on a 410 or a run both long and old enough."""
    if not news:
        return HealthApplied()
    items = list(news.values())
    rows = db.session.execute(
        _COUNT,
        {
            "ids": [item.endpoint_id for item in items],
            "reset": [item.succeeded for item in items],
            "failures": [len(item.failures) for item in items],
            "first_failed_at": [
                item.failures[0][1].requested_at if item.failures else None for item in items
            ],
            "probing_after": PROBING_AFTER_FAILURES,
            "max_pause": policy.timeout,
        },
    ).all()
    applied = {row.id: row for row in rows}
    failing_at = failing_threshold(policy.disable_failures)
    disabled: list[tuple[str, str]] = []
    for item in items:
        row = applied.get(item.endpoint_id)
        if row is None or not row.open:
            continue
        if item.succeeded and item.was_down:
            request_job(kind=CATCH_UP, brand_id=row.brand_id, endpoint_id=item.endpoint_id)
        if not item.failures:
            continue
        _, outcome = item.failures[-1]
        if row.before < failing_at <= row.consecutive_failures:
            # The failure that brought the run to the threshold (the run before this news
            # counts unless a success in it reset the count).
            crossing = failing_at - (0 if item.succeeded else row.before) - 1
            attempt = item.failures[min(max(crossing, 0), len(item.failures) - 1)]
            _announce(ENDPOINT_FAILING, row, attempt=attempt, now=outcome.requested_at)
        reason = _why_disable(item, row, policy)
        if reason is not None and disable_endpoint(
            item.endpoint_id,
            reason=reason,
            now=outcome.requested_at,
            by_service=True,
            failed=_disabling_attempt(item),
        ):
            disabled.append((item.endpoint_id, outcome.error_text or reason))
    carried = {key: item for key, item in news.items() if key not in applied}
    return HealthApplied(disabled=disabled, carried=carried)


def _disabling_attempt(item: EndpointNews) -> tuple[Attempt, AttemptOutcome]:
    """The failure a disable is for: the 410 Gone, else the last of the run."""
    gone = [failure for failure in item.failures if failure[1].gone]
    return gone[0] if gone else item.failures[-1]


def _why_disable(item: EndpointNews, row, policy: RetryPolicy) -> str | None:
    """A 410 Gone closes the endpoint at once; otherwise a run of failures both long and old
    enough does (CONTRACT 6.2: 15 failures in a minute's outage do not, three days do)."""
    if any(outcome.gone for _, outcome in item.failures):
        return GONE_REASON
    now = item.failures[-1][1].requested_at
    if row.consecutive_failures >= policy.disable_failures and row.failing_since <= (
        now - policy.disable_window
    ):
        return (
            f"{row.consecutive_failures} consecutive failed attempts since "
            f"{row.failing_since:%Y-%m-%d %H:%M} UTC"
        )
    return None


# Each endpoint's news, for the rows no one else holds: the run reset by a success, extended by
# the failures after it; the breaker's next probe once the run is long enough (nothing starts
# before it: the claim reads it). Returns the run as it was and as it is.
_COUNT = text(
    f"""
    WITH news AS (
        SELECT * FROM unnest(CAST(:ids AS varchar[]), CAST(:reset AS boolean[]),
                             CAST(:failures AS integer[]), CAST(:first_failed_at AS timestamptz[]))
                 AS news(id, reset, failures, first_failed_at)
    ),
    locked AS MATERIALIZED (
        SELECT e.id, e.consecutive_failures AS before FROM webhook_endpoints AS e
        WHERE e.id IN (SELECT id FROM news)
        ORDER BY e.id FOR NO KEY UPDATE OF e SKIP LOCKED
    ),
    counted AS (
        SELECT news.*, locked.before,
               CASE WHEN news.reset THEN 0 ELSE locked.before END + news.failures AS run
        FROM news JOIN locked ON locked.id = news.id
    )
    UPDATE webhook_endpoints AS e
    SET consecutive_failures = counted.run,
        failing_since = CASE WHEN counted.run = 0 THEN NULL
                             WHEN counted.reset OR e.failing_since IS NULL
                             THEN counted.first_failed_at ELSE e.failing_since END,
        next_probe_at = CASE WHEN counted.run >= :probing_after
            THEN statement_timestamp() + make_interval(
                secs => least(:max_pause, power(2, counted.run - :probing_after)))
            END
    FROM counted WHERE e.id = counted.id
    RETURNING e.id, e.brand_id, e.url, e.consecutive_failures, e.failing_since, counted.before,
              {endpoint_is_open_sql("e")} AS open
    """  # noqa: S608 - constant SQL, put together at import
)


def disable_endpoint(
    endpoint_id: str,
    *,
    reason: str,
    now: datetime,
    by_service: bool = False,
    failed: tuple[Attempt, AttemptOutcome] | None = None,
    first_batch: bool = False,
) -> bool:
    """Disable an open endpoint: no attempt starts from now on, and an `end_pending` job ends
    its pending deliveries `failed` in batches (an attempt in flight is recorded as it ends: a
    success is `delivered`); a person's request runs the first batch itself (`first_batch`),
    the delivery round never does. False when it was already disabled or deleted. When the
    service does it (`by_service`), `webhook.endpoint_disabled` says so, with the `failed`
    attempt that decided it (the last of a long run of failures, or a 410; none when the
    service's operators did it by hand)."""
    disabled = db.session.execute(
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == endpoint_id, WebhookEndpoint.is_active)
        .values(disabled_at=now, disabled_reason=reason, updated_at=now)
        .returning(
            WebhookEndpoint.id,
            WebhookEndpoint.brand_id,
            WebhookEndpoint.url,
            WebhookEndpoint.consecutive_failures,
        )
        .execution_options(synchronize_session=False)
    ).first()
    if disabled is None:
        return False
    close_queue(
        disabled.brand_id,
        endpoint_id,
        why=_why_not_sent(reason),
        now=now,
        first_batch=first_batch,
    )
    if by_service:
        _announce(ENDPOINT_DISABLED, disabled, attempt=failed, now=now, disabled_at=now)
    return True


def close_queue(
    brand_id: str, endpoint_id: str, *, why: str, now: datetime, first_batch: bool = False
) -> None:
    """The closed endpoint's pending deliveries end `failed` with `why`, by a job."""
    request_job(
        kind=END_PENDING,
        brand_id=brand_id,
        endpoint_id=endpoint_id,
        note=why,
        now=now,
        first_batch=first_batch,
    )


def _why_not_sent(reason: str) -> str:
    """The last error of each delivery the disabling ended, in one phrase: "Endpoint disabled
    from the dashboard by key …", "Endpoint disabled: The receiver answered 410 Gone"."""
    if reason.startswith("Disabled "):
        return "Endpoint d" + reason[1:]
    return f"Endpoint disabled: {reason}"


def _announce(
    name: str,
    endpoint,
    *,
    attempt: tuple[Attempt, AttemptOutcome] | None,
    now: datetime,
    disabled_at: datetime | None = None,
) -> None:
    """An operational event about the endpoint, to the brand's other endpoints subscribed,
    with the failed `attempt` that made it (CONTRACT 13.4), if one did."""
    publish_event(
        brand_id=endpoint.brand_id,
        name=name,
        data=event_data(
            name,
            {
                "endpoint_id": endpoint.id,
                "url": endpoint.url,
                "consecutive_failures": endpoint.consecutive_failures,
                "last_error": None if attempt is None else attempt[1].error_text,
                "disabled_at": disabled_at,
                "last_attempt": None if attempt is None else _last_attempt(*attempt),
            },
        ),
        except_endpoint_ids=[endpoint.id],
        now=now,
    )


def _last_attempt(attempt: Attempt, outcome: AttemptOutcome) -> dict:
    """An alert's `lastAttempt`, by the schema's attribute names."""
    return {
        "delivery_id": attempt.delivery_id,
        "event_id": attempt.event_id,
        "event_type": attempt.event_name,
        "http_status": outcome.http_status,
        "error": outcome.error_text,
        "response_body": None
        if outcome.response_body is None
        else outcome.response_body[:LAST_ATTEMPT_BODY_CHARS],
    }


def count_disabled_endpoints() -> int:
    """Endpoints disabled and not deleted, every brand's: a number operators watch."""
    return db.session.execute(
        select(func.count()).where(
            WebhookEndpoint.disabled_at.is_not(None), WebhookEndpoint.deleted_at.is_(None)
        )
    ).scalar_one()


def enable_endpoint(endpoint_id: str, *, now: datetime) -> bool:
    """Re-enable a disabled endpoint with a clean failure count; False when it was not
    disabled (or is deleted). Its old pending deliveries still end `failed` (the job goes on)
    before anything new is attempted."""
    enabled = db.session.execute(
        update(WebhookEndpoint)
        .where(
            WebhookEndpoint.id == endpoint_id,
            WebhookEndpoint.disabled_at.is_not(None),
            WebhookEndpoint.deleted_at.is_(None),
        )
        .values(
            disabled_at=None,
            disabled_reason=None,
            consecutive_failures=0,
            failing_since=None,
            next_probe_at=None,
            updated_at=now,
        )
        .returning(WebhookEndpoint.id)
        .execution_options(synchronize_session=False)
    ).first()
    return enabled is not None


__all__ = [
    "ENDPOINT_DISABLED",
    "ENDPOINT_FAILING",
    "EndpointNews",
    "HealthApplied",
    "apply_news",
    "close_queue",
    "count_disabled_endpoints",
    "disable_endpoint",
    "enable_endpoint",
    "failing_threshold",
    "news_of",
]
