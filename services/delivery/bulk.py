"""Bulk jobs: the changes to deliveries that grow with a brand's data (ending a closed endpoint's
queue, retry-now, catch-up, releasing holds, erasing a subject). Each is a row of
`webhook_bulk_jobs` (models/bulk_job.py), run in batches of at most `BATCH_ROWS` rows by every
worker's `BulkRunner`, taking turns and resting as long as each batch took: mechanism 11 of
docs/delivery.md. Every batch re-reads what is left, so a job whose runner died mid-batch is
taken up by the next, with nothing done twice and nothing stranded.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from flask import Flask
from psycopg.errors import QueryCanceled
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from extensions import db
from models.bulk_job import CATCH_UP, END_PENDING, ERASE_SUBJECT, RELEASE_HELD, RETRY_NOW
from models.event_subjects import parse_subject_key
from models.webhook_endpoint import NO_ORDERING, endpoint_is_open_sql
from services.wakeups import listener_for, notify_brand

log = logging.getLogger("brand_api.webhooks")

BATCH_ROWS = 1000
# Events erased in one batch (each with its deliveries and their attempts: several rows each).
ERASE_BATCH_EVENTS = 500
# The last error of a delivery that erasure ended (CONTRACT 13.3).
ERASED = "erased"
# Each batch is one transaction under these.
STATEMENT_TIMEOUT = "5s"
LOCK_TIMEOUT = "1s"
# A person's request runs its first batch under this; a batch that takes longer is the
# workers' (a loaded database must not turn the request into a 503, nor hold it 5 s).
FIRST_BATCH_TIMEOUT = "2s"
# With nothing to do, a runner looks again after this long, or at a wake-up after the debounce.
IDLE_SECONDS = 1.0
WAKE_DEBOUNCE_SECONDS = 0.1
# Finished jobs are kept this long (their progress stays readable), then deleted.
KEEP_FINISHED = "1 day"


def request_job(
    *,
    kind: str,
    brand_id: str,
    endpoint_id: str | None = None,
    subject_key: str | None = None,
    position: int | None = None,
    note: str | None = None,
    now: datetime | None = None,
    first_batch: bool = False,
) -> None:
    """Ask for a job in the caller's transaction, or join the open one of its kind for the
    endpoint; with `first_batch`, run one batch of it now unless a runner holds it (what a
    person does takes effect at once for all but the largest queues). A first batch that
    cannot finish within FIRST_BATCH_TIMEOUT is undone and left to the workers: the job
    stands either way."""
    job_id = db.session.execute(
        _REQUEST,
        {
            "kind": kind,
            "brand_id": brand_id,
            "endpoint_id": endpoint_id,
            "subject_key": subject_key,
            "position": position,
            "note": note,
            "now": now,
        },
    ).scalar()
    if first_batch:
        job = db.session.execute(
            _OPEN_JOB, {"id": job_id, "kind": kind, "endpoint_id": endpoint_id}
        ).first()
        if job is not None:
            try:
                with db.session.begin_nested():
                    db.session.execute(
                        text(f"SET LOCAL statement_timeout = '{FIRST_BATCH_TIMEOUT}'")
                    )
                    _run_batch(job)
            except OperationalError as error:
                if not isinstance(error.orig, QueryCanceled):
                    raise  # the database is out of reach: the request fails, whole
                # The savepoint took the batch's writes back; the job stands.
                log.info(
                    "bulk job %s (%s of endpoint %s): first batch left to the workers (%s)",
                    job.id,
                    kind,
                    endpoint_id,
                    type(error.orig).__name__,
                )
    notify_brand(brand_id)


_REQUEST = text(
    """
    INSERT INTO webhook_bulk_jobs (
        kind, brand_id, endpoint_id, subject_key, position, note, requested_at, last_run_at
    )
    VALUES (:kind, :brand_id, :endpoint_id, :subject_key, :position, :note,
            COALESCE(CAST(:now AS timestamptz), statement_timestamp()), '-infinity')
    ON CONFLICT (kind, endpoint_id) WHERE finished_at IS NULL AND endpoint_id IS NOT NULL
    DO NOTHING
    RETURNING id
    """
)


@dataclass(frozen=True)
class BatchRun:
    job_id: int
    changed: int
    finished: bool


def run_one_batch() -> BatchRun | None:
    """One batch of the open job whose turn it is, committed; None when there was none. A
    failing job goes to the back of the line first, so that it never holds up the others."""
    session = db.session
    session.execute(text(f"SET LOCAL statement_timeout = '{STATEMENT_TIMEOUT}'"))
    session.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
    job = session.execute(_NEXT_JOB).first()
    if job is None:
        session.commit()
        return None
    try:
        changed, finished = _run_batch(job)
        session.commit()
    except Exception:
        session.rollback()
        with contextlib.suppress(Exception):
            session.execute(_PROGRESS, {"id": job.id, "changed": 0, "finished": False})
            session.commit()
        raise
    if finished:
        log.info("bulk job %s (%s of endpoint %s) finished", job.id, job.kind, job.endpoint_id)
    return BatchRun(job_id=job.id, changed=changed, finished=finished)


def _run_batch(job) -> tuple[int, bool]:
    """One batch of the job (locked by the caller), its progress noted: rows changed, done."""
    changed, finished = _BATCHES[job.kind](db.session, job)
    db.session.execute(_PROGRESS, {"id": job.id, "changed": changed, "finished": finished})
    if changed and job.kind not in (END_PENDING, ERASE_SUBJECT):
        notify_brand(job.brand_id)  # due work: the loops claim it now
    return changed, finished


_JOB_COLUMNS = "id, kind, brand_id, endpoint_id, subject_key, position, note, requested_at"
# The job just asked for, or the open one of its kind for its endpoint that it joined.
_OPEN_JOB = text(
    f"""
    SELECT {_JOB_COLUMNS} FROM webhook_bulk_jobs
    WHERE (id = :id OR (CAST(:id AS bigint) IS NULL AND kind = :kind
                        AND endpoint_id = :endpoint_id))
      AND finished_at IS NULL
    FOR UPDATE SKIP LOCKED
    """  # noqa: S608 - constant SQL, put together at import
)
_NEXT_JOB = text(
    f"""
    SELECT {_JOB_COLUMNS} FROM webhook_bulk_jobs
    WHERE finished_at IS NULL ORDER BY last_run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED
    """  # noqa: S608 - constant SQL, put together at import
)
_PROGRESS = text(
    """
    UPDATE webhook_bulk_jobs
    SET done = done + :changed, last_run_at = statement_timestamp(),
        finished_at = CASE WHEN :finished THEN statement_timestamp() END
    WHERE id = :id
    """
)


def _end_pending(session: Session, job) -> tuple[int, bool]:
    row = session.execute(
        _END_PENDING,
        {
            "endpoint_id": job.endpoint_id,
            "requested_at": job.requested_at,
            "note": job.note or "Endpoint disabled or deleted",
            "batch": BATCH_ROWS,
        },
    ).one()
    return row.failed, row.picked == 0 and not row.in_flight


# The endpoint's queued deliveries made before the request (all of them while it stays
# closed: a publish that raced its closing included) and its lapsed leases, a batch of them,
# ended `failed`; whether any lease is still out (its record settles it; the job waits).
_END_PENDING = text(
    f"""
    WITH endpoint AS (
        SELECT {endpoint_is_open_sql("e")} AS open FROM webhook_endpoints AS e
        WHERE e.id = :endpoint_id
    ),
    doomed AS MATERIALIZED (
        SELECT q.delivery_id FROM webhook_delivery_queue AS q
        JOIN webhook_deliveries AS d ON d.id = q.delivery_id
        WHERE q.endpoint_id = :endpoint_id
          AND (NOT COALESCE((SELECT open FROM endpoint), false)
               OR d.created_at <= :requested_at)
        LIMIT :batch
        FOR UPDATE OF q SKIP LOCKED
    ),
    lapsed AS MATERIALIZED (
        SELECT l.delivery_id FROM webhook_delivery_leases AS l
        WHERE l.endpoint_id = :endpoint_id AND l.leased_until < statement_timestamp()
        LIMIT :batch
        FOR UPDATE OF l SKIP LOCKED
    ),
    unqueued AS (
        DELETE FROM webhook_delivery_queue
        WHERE delivery_id IN (SELECT delivery_id FROM doomed) RETURNING delivery_id
    ),
    unleased AS (
        DELETE FROM webhook_delivery_leases
        WHERE delivery_id IN (SELECT delivery_id FROM lapsed) RETURNING delivery_id
    ),
    failed AS (
        UPDATE webhook_deliveries
        SET status = 'failed', failed_at = statement_timestamp(), last_error = :note,
            next_attempt_at = NULL
        WHERE id IN (SELECT delivery_id FROM unqueued UNION ALL SELECT delivery_id FROM unleased)
          AND status = 'pending'
        RETURNING id
    )
    SELECT (SELECT count(*) FROM failed) AS failed,
           (SELECT count(*) FROM doomed) + (SELECT count(*) FROM lapsed) AS picked,
           EXISTS (SELECT 1 FROM webhook_delivery_leases AS l
                   WHERE l.endpoint_id = :endpoint_id
                     AND l.delivery_id NOT IN (SELECT delivery_id FROM lapsed)) AS in_flight
    """  # noqa: S608 - constant SQL, put together at import
)


def _batch_of(statement, **params):
    """A batch function whose statement returns how many of at most BATCH_ROWS rows it changed."""

    def batch(session: Session, job) -> tuple[int, bool]:
        changed = session.execute(
            statement, {"endpoint_id": job.endpoint_id, "batch": BATCH_ROWS, **params}
        ).scalar_one()
        return changed, changed < BATCH_ROWS

    return batch


# A batch of the endpoint's deliveries waiting for a retry (queued after a failed attempt, due
# later), due now: the ones a receiver's Retry-After still holds are kept unless `override`.
# A held one (null) waits for an earlier one of its subject, not for a time: it stays held.
_BRING_FORWARD = text(
    """
    WITH picked AS MATERIALIZED (
        SELECT q.delivery_id FROM webhook_delivery_queue AS q
        WHERE q.endpoint_id = :endpoint_id AND q.attempt_count > 0
          AND q.next_attempt_at > statement_timestamp()
          AND (CAST(:override AS boolean) OR q.not_before IS NULL
               OR q.not_before <= statement_timestamp())
        ORDER BY q.next_attempt_at
        LIMIT :batch
        FOR UPDATE OF q SKIP LOCKED
    ),
    brought AS (
        UPDATE webhook_delivery_queue AS q
        SET next_attempt_at = statement_timestamp(), not_before = NULL
        FROM picked WHERE q.delivery_id = picked.delivery_id
        RETURNING q.delivery_id, q.next_attempt_at
    ),
    shown AS (
        UPDATE webhook_deliveries AS d SET next_attempt_at = brought.next_attempt_at
        FROM brought WHERE d.id = brought.delivery_id
    )
    SELECT count(*) FROM brought
    """
)


# A batch of the endpoint's held deliveries, due again in their place from before they were
# held, while its ordering stays off (turned on again, the claim holds what it must).
_RELEASE_HELD = text(
    """
    WITH picked AS MATERIALIZED (
        SELECT q.delivery_id FROM webhook_delivery_queue AS q
        WHERE q.endpoint_id = :endpoint_id AND q.next_attempt_at IS NULL
          AND EXISTS (SELECT 1 FROM webhook_endpoints AS e
                      WHERE e.id = :endpoint_id AND e.ordering = :none)
        LIMIT :batch
        FOR UPDATE OF q SKIP LOCKED
    ),
    released AS (
        UPDATE webhook_delivery_queue AS q
        SET next_attempt_at = LEAST(d.next_attempt_at, statement_timestamp()),
            held_behind = NULL
        FROM picked JOIN webhook_deliveries AS d ON d.id = picked.delivery_id
        WHERE q.delivery_id = picked.delivery_id
        RETURNING 1
    )
    SELECT count(*) FROM released
    """
)


def _erase_subject(session: Session, job) -> tuple[int, bool]:
    """A batch of the subject's events, newest first from the job's position (the pending
    work is the newest): their pending deliveries ended, their data and answers erased."""
    subject_type, subject_id = parse_subject_key(job.subject_key)
    events = session.execute(
        _ERASABLE_EVENTS,
        {
            "brand_id": job.brand_id,
            "subject_type": subject_type,
            "subject_id": subject_id,
            "position": job.position,
            "batch": ERASE_BATCH_EVENTS,
        },
    ).all()
    if not events:
        return 0, True
    ids = {"event_ids": [row.id for row in events]}
    session.execute(_END_ERASED_DELIVERIES, ids | {"note": ERASED})
    session.execute(_UNQUEUE_ERASED_DELIVERIES, ids)
    session.execute(_ERASE_EVENTS, ids)
    session.execute(_STRIP_ANSWERS, ids)
    session.execute(_STRIP_ALERTS, ids | {"brand_id": job.brand_id})
    session.execute(
        _MOVE_POSITION, {"id": job.id, "position": min(row.sequence for row in events) - 1}
    )
    return len(events), len(events) < ERASE_BATCH_EVENTS


# The subject's next events (newest first from the position), locked against a redelivery
# (services/events.py reads them FOR SHARE) until the batch commits. NO KEY: a delivery's
# foreign key check (KEY SHARE) still passes.
_ERASABLE_EVENTS = text(
    """
    SELECT id, sequence FROM webhook_events
    WHERE brand_id = :brand_id AND subject_type = :subject_type AND subject_id = :subject_id
      AND sequence <= :position
    ORDER BY sequence DESC LIMIT :batch
    FOR NO KEY UPDATE
    """
)
# Their pending deliveries, locked (a record writing one is waited for; one that comes after
# skips it and is carried, then finds its lease gone), ended `failed`, out of the queue and
# the leases. A claim that took one before this statement is caught by the next.
_END_ERASED_DELIVERIES = text(
    """
    WITH doomed AS MATERIALIZED (
        SELECT id FROM webhook_deliveries
        WHERE event_id = ANY(CAST(:event_ids AS varchar[])) AND status = 'pending'
        ORDER BY id FOR NO KEY UPDATE
    ),
    unqueued AS (
        DELETE FROM webhook_delivery_queue WHERE delivery_id IN (SELECT id FROM doomed)
    ),
    unleased AS (
        DELETE FROM webhook_delivery_leases WHERE delivery_id IN (SELECT id FROM doomed)
    )
    UPDATE webhook_deliveries
    SET status = 'failed', failed_at = statement_timestamp(), last_error = :note,
        next_attempt_at = NULL
    WHERE id IN (SELECT id FROM doomed)
    """
)
# What the statement above could not see (its snapshot came before its waits): a row a record
# put back in the queue, a lease a claim took meanwhile. None of their deliveries is pending.
_UNQUEUE_ERASED_DELIVERIES = text(
    """
    WITH theirs AS MATERIALIZED (
        SELECT id FROM webhook_deliveries WHERE event_id = ANY(CAST(:event_ids AS varchar[]))
    ),
    unqueued AS (
        DELETE FROM webhook_delivery_queue WHERE delivery_id IN (SELECT id FROM theirs)
    )
    DELETE FROM webhook_delivery_leases WHERE delivery_id IN (SELECT id FROM theirs)
    """
)
# The body keeps its envelope (id, type, times, subject, sequence) with `data` null: `data` is
# its last member (services/events.py writes it so), else the JSON is rewritten.
_ERASE_EVENTS = text(
    """
    UPDATE webhook_events
    SET erased_at = statement_timestamp(),
        body = CASE WHEN strpos(body, ',"data":') > 0
                    THEN left(body, strpos(body, ',"data":') - 1) || ',"data"\\:null}'
                    ELSE CAST(jsonb_set(CAST(body AS jsonb), ARRAY['data'], 'null') AS text)
               END
    WHERE id = ANY(CAST(:event_ids AS varchar[])) AND erased_at IS NULL
    """
)
# Attempts keep their status, times and headers; the receiver's answer goes (the request's
# body is the event's, erased above).
_STRIP_ANSWERS = text(
    """
    UPDATE webhook_attempts SET response_body = NULL
    WHERE delivery_id IN (SELECT id FROM webhook_deliveries
                          WHERE event_id = ANY(CAST(:event_ids AS varchar[])))
      AND response_body IS NOT NULL
    """
)
# An alert (CONTRACT 13.4) copies the answer to one of these events' deliveries into its own
# data: that copy goes too. A brand's alerts are few (one per failing or disabled spell), and
# the feed index finds them by brand and name.
_STRIP_ALERTS = text(
    """
    UPDATE webhook_events
    SET body = CAST(jsonb_set(CAST(body AS jsonb), '{data,lastAttempt,responseBody}', 'null')
                    AS text)
    WHERE brand_id = :brand_id
      AND name IN ('webhook.endpoint_failing', 'webhook.endpoint_disabled')
      AND CAST(body AS jsonb) #>> '{data,lastAttempt,eventId}'
          = ANY(CAST(:event_ids AS varchar[]))
      AND CAST(body AS jsonb) #>> '{data,lastAttempt,responseBody}' IS NOT NULL
    """
)
_MOVE_POSITION = text("UPDATE webhook_bulk_jobs SET position = :position WHERE id = :id")

_BATCHES = {
    END_PENDING: _end_pending,
    RETRY_NOW: _batch_of(_BRING_FORWARD, override=True),
    CATCH_UP: _batch_of(_BRING_FORWARD, override=False),
    RELEASE_HELD: _batch_of(_RELEASE_HELD, none=NO_ORDERING),
    ERASE_SUBJECT: _erase_subject,
}

_FORGET_FINISHED = text(
    f"""
    DELETE FROM webhook_bulk_jobs WHERE id IN (
        SELECT id FROM webhook_bulk_jobs
        WHERE finished_at < statement_timestamp() - interval '{KEEP_FINISHED}'
        LIMIT {BATCH_ROWS})
    """  # noqa: S608 - constant SQL, put together at import
)


class BulkRunner:
    """A thread of a worker process that runs bulk jobs, batch after batch, until stopped."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bulk-runner", daemon=True)
        self._unsubscribe = listener_for(app).subscribe(lambda brands: self._wake.set())
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop after the batch under way (each is a few seconds at most)."""
        self._unsubscribe()
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        with self.app.app_context():
            failing = False
            while not self._stopping.is_set():
                started = time.monotonic()
                try:
                    batch = run_one_batch()
                    if batch is None:
                        db.session.execute(_FORGET_FINISHED)
                        db.session.commit()
                    # A job with nothing to do yet (it waits for attempts in flight) is looked
                    # at again after a pause, not at once.
                    worked = batch is not None and (batch.changed > 0 or batch.finished)
                    failing = False
                except Exception as error:
                    db.session.rollback()
                    worked = False
                    if not failing:  # an outage is one line, not one a second
                        log.warning(
                            "bulk job batch failed (%s); trying again",
                            type(error).__name__,
                            exc_info=not isinstance(error, OperationalError),
                        )
                    failing = True
                finally:
                    db.session.remove()
                if worked:
                    # Rest as long as the batch took: half a connection, never all of it.
                    self._stopping.wait(time.monotonic() - started)
                else:
                    # Publishes wake it too, many a second: it looks at most ten times a second.
                    self._stopping.wait(WAKE_DEBOUNCE_SECONDS)
                    self._wake.wait(IDLE_SECONDS)
                    self._wake.clear()
