"""Endpoint health, in one place: counting an endpoint's failed attempts, how many attempts it
may have in flight while it fails, disabling it (by its owner, or by the service after a long
run of failures or a 410 Gone) and re-enabling it (CONTRACT 4, 6.2 and 8.6).

The API and the dashboard (update-endpoint) and the worker (after each attempt) all go through
these functions, so "disabled" always means the same state: `disabled_at` and a reason set,
every pending delivery ended `failed`, and the failure count kept for the record until the
endpoint is re-enabled with a clean one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import update

from extensions import db
from models import WebhookEndpoint
from services.deliveries import fail_pending_deliveries

# An endpoint whose last this many attempts failed in a row is probed with one attempt at a time
# (a half-open circuit breaker), whatever WEBHOOK_ENDPOINT_CONCURRENCY allows a healthy one: a
# receiver that hangs holds one slot, not all of them, and one that is down is not hammered.
PROBING_AFTER_FAILURES = 3


def slot_limit(consecutive_failures: int, endpoint_limit: int) -> int:
    """Attempts an endpoint may have in flight across all workers, given its run of failures.
    (The claim's SQL applies the same rule with PROBING_AFTER_FAILURES.)"""
    return 1 if consecutive_failures >= PROBING_AFTER_FAILURES else endpoint_limit


@dataclass(frozen=True)
class FailureRun:
    """An endpoint's current run of consecutive failed attempts, as it stands after one more."""

    consecutive_failures: int
    failing_since: datetime
    is_open: bool


def count_failure(endpoint_id: str, failed_at: datetime) -> FailureRun:
    """One more failed attempt in the endpoint's run (which starts at `failed_at` if new)."""
    row = db.session.execute(
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == endpoint_id)
        .values(
            consecutive_failures=WebhookEndpoint.consecutive_failures + 1,
            failing_since=db.func.coalesce(WebhookEndpoint.failing_since, failed_at),
        )
        .returning(
            WebhookEndpoint.consecutive_failures,
            WebhookEndpoint.failing_since,
            WebhookEndpoint.is_active,
        )
        .execution_options(synchronize_session=False)
    ).one()
    return FailureRun(row.consecutive_failures, row.failing_since, row.is_active)


def count_success(endpoint_id: str) -> None:
    """A successful attempt ends the endpoint's run of failures."""
    db.session.execute(
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == endpoint_id, WebhookEndpoint.consecutive_failures != 0)
        .values(consecutive_failures=0, failing_since=None)
        .execution_options(synchronize_session=False)
    )


def disable_if_failing_too_long(
    endpoint_id: str,
    run: FailureRun,
    *,
    disable_failures: int,
    disable_window: timedelta,
    now: datetime,
) -> bool:
    """Disable the endpoint when its run of failures is both long enough and old enough
    (CONTRACT 6.2: 15 failures in a minute's outage do not disable it, three days do); True
    when this call disabled it."""
    if (
        not run.is_open
        or run.consecutive_failures < disable_failures
        or run.failing_since > now - disable_window
    ):
        return False
    return disable_endpoint(
        endpoint_id,
        reason=(
            f"{run.consecutive_failures} consecutive failed attempts since "
            f"{run.failing_since:%Y-%m-%d %H:%M} UTC"
        ),
        now=now,
    )


def disable_endpoint(endpoint_id: str, *, reason: str, now: datetime) -> bool:
    """Disable an open endpoint and end its pending deliveries `failed` (leased ones too: their
    worker's late result is discarded); False when it was already disabled or deleted."""
    disabled = db.session.execute(
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == endpoint_id, WebhookEndpoint.is_active)
        .values(disabled_at=now, disabled_reason=reason, updated_at=now)
        .returning(WebhookEndpoint.id)
        .execution_options(synchronize_session=False)
    ).first()
    if disabled is None:
        return False
    fail_pending_deliveries(endpoint_id, error=f"Endpoint disabled: {reason}")
    return True


def enable_endpoint(endpoint_id: str, *, now: datetime) -> bool:
    """Re-enable a disabled endpoint with a clean failure count; False when it was not
    disabled (or is deleted)."""
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
            updated_at=now,
        )
        .returning(WebhookEndpoint.id)
        .execution_options(synchronize_session=False)
    ).first()
    return enabled is not None
