"""The RQ job: drain one endpoint's due deliveries (see docs/webhooks.md for why a job is per
endpoint and carries a batch, not one delivery).

A drain claims a batch of due deliveries under a lease, attempts them one after another over a
kept-alive connection, records each attempt in its own short transaction, and claims again until
nothing is due or its time budget is spent; then it queues its successor, so that one busy
endpoint takes turns with the others instead of holding a worker.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from flask import current_app

from models.columns import utcnow
from services.delivery_attempts import (
    AttemptOutcome,
    Claim,
    RetryPolicy,
    autocommit_connection,
    claim_due_deliveries,
    record_attempt,
    release_deliveries,
)
from services.endpoint_urls import UrlPolicy
from services.secret_box import InvalidToken, secret_box
from workers import dispatch
from workers.transport import new_session, send_attempt

log = logging.getLogger("brand_api.webhooks")

BATCH_SIZE = 50
DRAIN_BUDGET_SECONDS = 10.0
_session = None


def drain_endpoint(endpoint_id: str) -> int:
    """Attempt the endpoint's due deliveries; how many attempts were made."""
    app = current_app._get_current_object()
    settings = app.extensions["settings"]
    policy = RetryPolicy.from_settings(settings)
    url_policy = UrlPolicy.for_environment(settings.app_env)
    timeout = settings.webhook_timeout
    # An attempt may take a connect timeout plus a read timeout; the lease covers a batch's
    # first slow attempts, and a worker that dies mid-attempt frees its deliveries when it ends.
    lease = timedelta(seconds=3 * timeout + 5)
    dispatch.drain_started(app, endpoint_id)
    started = time.monotonic()
    attempts = 0
    while time.monotonic() - started < DRAIN_BUDGET_SECONDS:
        claim = claim_due_deliveries(endpoint_id, limit=BATCH_SIZE, lease=lease, now=utcnow())
        if claim is None:
            return attempts
        with autocommit_connection() as autocommit:
            made, finished = _attempt_claim(claim, policy, url_policy, timeout, autocommit)
        attempts += made
        if not finished:
            break
    # Budget spent (or the lease ran short) with work perhaps left: queue a successor behind
    # the other endpoints' drains.
    dispatch.request_drains(app, [endpoint_id])
    return attempts


def _attempt_claim(
    claim: Claim, policy: RetryPolicy, url_policy: UrlPolicy, timeout: float, autocommit
) -> tuple[int, bool]:
    """Attempt the claimed deliveries in order; (attempts made, whether all were attempted)."""
    app = current_app._get_current_object()
    secret = _signing_secret(claim)
    attempts = 0
    for index, delivery in enumerate(claim.deliveries):
        # Never start an attempt the lease might not outlast: another worker could take the
        # delivery while it is in flight.
        if (claim.leased_until - utcnow()).total_seconds() < 2 * timeout + 2:
            release_deliveries(claim, [d.id for d in claim.deliveries[index:]])
            return attempts, False
        if secret is None:
            outcome = AttemptOutcome(
                requested_at=utcnow(),
                duration_ms=0,
                request_headers={},
                error="Not sent: the signing secret cannot be decrypted (ENCRYPTION_KEY "
                "changed?); rotate the endpoint's secret",
            )
        else:
            outcome = send_attempt(
                _http_session(),
                url=claim.url,
                policy=url_policy,
                secret=secret,
                body=delivery.body,
                event_name=delivery.event_name,
                delivery_id=delivery.id,
                timeout=timeout,
            )
        recorded = record_attempt(
            claim, delivery, outcome, policy=policy, now=utcnow(), autocommit=autocommit
        )
        # Successes are the bulk and live in the delivery log; failures are what operators
        # watch for.
        log.log(
            logging.DEBUG if outcome.succeeded and recorded.kept else logging.INFO,
            "webhook attempt delivery=%s endpoint=%s attempt=%d status=%s http=%s ms=%d%s",
            delivery.id,
            claim.endpoint_id,
            delivery.attempt_number,
            recorded.status,
            outcome.http_status,
            outcome.duration_ms,
            "" if recorded.kept else " (discarded: delivery no longer held)",
        )
        if recorded.retry_at is not None:
            dispatch.schedule_drain(app, claim.endpoint_id, recorded.retry_at)
        attempts += 1
        if recorded.endpoint_disabled:
            log.warning("webhook endpoint %s disabled after repeated failures", claim.endpoint_id)
        if not recorded.endpoint_open:
            # Deleted or disabled: its pending deliveries, the rest of this batch included,
            # were failed with it. Nothing more is sent.
            return attempts, True
    return attempts, True


def _signing_secret(claim: Claim) -> str | None:
    try:
        return secret_box().decrypt(claim.secret_ciphertext)
    except InvalidToken:
        log.error("signing secret of endpoint %s cannot be decrypted", claim.endpoint_id)
        return None


def _http_session():
    """One session per worker process, built on first use (SimpleWorker runs jobs in-process)."""
    global _session  # a per-process connection pool
    if _session is None:
        _session = new_session()
    return _session
