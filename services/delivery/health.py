"""Endpoint health (CONTRACT 4, 6.2, 8.5, 8.6): failure counts, the breaker's pause, disabling
(by the owner, or by the service after a long run of failures or a 410) and re-enabling. The API,
the dashboard and the worker all go through these functions, so "disabled" always means the same
state; the operational events are published in the transaction of the change they announce.
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


@dataclass
class EndpointNews:
    """What a round's attempts say of one endpoint: a success ends its run of failures (and
    brings its retries forward if it was down), the failures after it extend the run."""

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
    return {key: item for key, item in news.items() if item.failures or item.succeeded}


@dataclass(frozen=True)
class HealthApplied:
    """What a round's health step did: endpoints it disabled (for the log and metrics), and the
    news it could not write yet (their rows were locked), for the next round."""

    disabled: list[tuple[str, str]] = field(default_factory=list)
    carried: dict[str, EndpointNews] = field(default_factory=dict)


def apply_news(news: dict[str, EndpointNews], *, policy: RetryPolicy) -> HealthApplied:
    """Write each endpoint's news (the caller commits): its run of failures and the breaker's
    pause, `webhook.endpoint_failing` when the run first reaches half the disable threshold, a
    catch-up job when a down endpoint answers again, a disable on a 410 or a long old run."""
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
    # Failing (CONTRACT 8.5) at half the disable threshold, rounded up: 8 of the default 15.
    failing_at = max(1, math.ceil(policy.disable_failures / 2))
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
        why = _why_disable(item, row, policy)
        if why is not None and disable_endpoint(
            item.endpoint_id,
            reason=why[0],
            now=outcome.requested_at,
            by_service=True,
            failed=why[1],
        ):
            disabled.append((item.endpoint_id, outcome.error_text or why[0]))
    carried = {key: item for key, item in news.items() if key not in applied}
    return HealthApplied(disabled=disabled, carried=carried)


def _why_disable(
    item: EndpointNews, row, policy: RetryPolicy
) -> tuple[str, tuple[Attempt, AttemptOutcome]] | None:
    """Why the endpoint closes, and the failure that decided it: a 410 Gone at once, else a run
    both long and old enough (CONTRACT 6.2: 15 failures in a minute's outage do not)."""
    gone = [failure for failure in item.failures if failure[1].gone]
    if gone:
        return GONE_REASON, gone[0]
    last = item.failures[-1]
    if row.consecutive_failures >= policy.disable_failures and row.failing_since <= (
        last[1].requested_at - policy.disable_window
    ):
        return (
            f"{row.consecutive_failures} consecutive failed attempts since "
            f"{row.failing_since:%Y-%m-%d %H:%M} UTC",
            last,
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
    """Disable an open endpoint (False when it was not): no attempt starts from now on, and a
    job ends its pending deliveries (`first_batch`: a person's request runs the first batch).
    When the service does it, `webhook.endpoint_disabled` says so, with the `failed` attempt
    that decided it (none when the service's operators did it by hand)."""
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
    # Each ended delivery's last error in one phrase: "Endpoint disabled: The receiver answered
    # 410 Gone", "Endpoint disabled from the dashboard by key …".
    why = f"Endpoint disabled: {reason}"
    if reason.startswith("Disabled "):
        why = "Endpoint d" + reason[1:]
    close_queue(disabled.brand_id, endpoint_id, why=why, now=now, first_batch=first_batch)
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
