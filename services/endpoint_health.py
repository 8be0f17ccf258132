"""Endpoint health, in one place: counting an endpoint's failed attempts, how many attempts it
may have in flight while it fails, disabling it (by its owner, or by the service after a long
run of failures or a 410 Gone) and re-enabling it (CONTRACT 4, 6.2 and 8.6).

The API and the dashboard (update-endpoint) and the worker (after each attempt) all go through
these functions, so "disabled" always means the same state: `disabled_at` and a reason set,
every pending delivery ended `failed`, and the failure count kept for the record until the
endpoint is re-enabled with a clean one. The two operational events of CONTRACT 8.5 are
published here too, in the transaction of the change they announce: `webhook.endpoint_failing`
when a run of failures first reaches half the disable threshold, `webhook.endpoint_disabled`
when the service (not the brand) disables an endpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import case, func, select, update

from extensions import db
from models import WebhookEndpoint
from schemas.events import event_data
from services.delivery_queue import PROBING_AFTER_FAILURES, fail_pending_deliveries
from services.events import publish_event

ENDPOINT_FAILING = "webhook.endpoint_failing"
ENDPOINT_DISABLED = "webhook.endpoint_disabled"


@dataclass(frozen=True)
class FailureRun:
    """An endpoint's current run of consecutive failed attempts, as it stands after one more."""

    consecutive_failures: int
    failing_since: datetime
    is_open: bool


def failing_threshold(disable_failures: int) -> int:
    """The run of failed attempts at which an endpoint is failing (CONTRACT 8.5): half the
    disable threshold, rounded up (8 of the default 15)."""
    return max(1, math.ceil(disable_failures / 2))


def count_failure(
    endpoint_id: str,
    failed_at: datetime,
    *,
    error: str | None,
    failing_at: int,
    max_pause: float,
) -> FailureRun:
    """One more failed attempt in the endpoint's run (which starts at `failed_at` if new), and
    the breaker's pause before its next attempt once the run is long enough (at most
    `max_pause` seconds). The attempt that takes the run to `failing_at` announces
    `webhook.endpoint_failing`: one does, since each failure adds one in its own locked UPDATE,
    and a success starts the count over."""
    failures = WebhookEndpoint.consecutive_failures + 1
    pause = func.least(max_pause, func.power(2, failures - PROBING_AFTER_FAILURES))
    probing = failures >= PROBING_AFTER_FAILURES
    next_probe = func.statement_timestamp() + func.make_interval(0, 0, 0, 0, 0, 0, pause)
    row = db.session.execute(
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == endpoint_id)
        .values(
            consecutive_failures=failures,
            failing_since=db.func.coalesce(WebhookEndpoint.failing_since, failed_at),
            next_probe_at=case((probing, next_probe), else_=None),
            # Nothing starts before the probe: the claim's turn comes then (services/
            # delivery_queue.py: a pause may move it later, no publisher can change that).
            ready_at=case((probing, next_probe), else_=WebhookEndpoint.ready_at),
        )
        .returning(
            WebhookEndpoint.consecutive_failures,
            WebhookEndpoint.failing_since,
            WebhookEndpoint.is_active,
            WebhookEndpoint.brand_id,
            WebhookEndpoint.url,
        )
        .execution_options(synchronize_session=False)
    ).one()
    if row.is_active and row.consecutive_failures == failing_at:
        _announce(
            ENDPOINT_FAILING,
            row,
            endpoint_id=endpoint_id,
            last_error=error,
            disabled_at=None,
            now=failed_at,
        )
    return FailureRun(row.consecutive_failures, row.failing_since, row.is_active)


def count_success(endpoint_id: str) -> None:
    """A successful attempt ends the endpoint's run of failures, and its breaker's pause."""
    db.session.execute(
        update(WebhookEndpoint)
        .where(
            WebhookEndpoint.id == endpoint_id,
            (WebhookEndpoint.consecutive_failures != 0)
            | WebhookEndpoint.next_probe_at.is_not(None),
        )
        .values(consecutive_failures=0, failing_since=None, next_probe_at=None)
        .execution_options(synchronize_session=False)
    )


def disable_if_failing_too_long(
    endpoint_id: str,
    run: FailureRun,
    *,
    disable_failures: int,
    disable_window: timedelta,
    now: datetime,
    last_error: str | None,
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
        by_service=True,
        last_error=last_error,
    )


def disable_endpoint(
    endpoint_id: str,
    *,
    reason: str,
    now: datetime,
    by_service: bool = False,
    last_error: str | None = None,
) -> bool:
    """Disable an open endpoint and end its pending deliveries `failed` (leased ones too: their
    worker's late result is discarded); False when it was already disabled or deleted. When the
    service does it (`by_service`: failures, a 410), `webhook.endpoint_disabled` says so."""
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
    fail_pending_deliveries(endpoint_id, error=_why_not_sent(reason))
    if by_service:
        _announce(
            ENDPOINT_DISABLED,
            disabled,
            endpoint_id=endpoint_id,
            last_error=last_error,
            disabled_at=now,
            now=now,
        )
    return True


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
    endpoint_id: str,
    last_error: str | None,
    disabled_at: datetime | None,
    now: datetime,
) -> None:
    """An operational event about the endpoint, to the brand's other endpoints subscribed."""
    publish_event(
        brand_id=endpoint.brand_id,
        name=name,
        data=event_data(
            name,
            {
                "endpoint_id": endpoint_id,
                "url": endpoint.url,
                "consecutive_failures": endpoint.consecutive_failures,
                "last_error": last_error,
                "disabled_at": disabled_at,
            },
        ),
        except_endpoint_ids=[endpoint_id],
        now=now,
    )


def count_disabled_endpoints() -> int:
    """Endpoints disabled and not deleted, every brand's: a number operators watch."""
    count = db.session.execute(
        select(func.count()).where(
            WebhookEndpoint.disabled_at.is_not(None), WebhookEndpoint.deleted_at.is_(None)
        )
    ).scalar_one()
    db.session.commit()
    return count


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
            next_probe_at=None,
            updated_at=now,
        )
        .returning(WebhookEndpoint.id)
        .execution_options(synchronize_session=False)
    ).first()
    return enabled is not None
