"""Waking the workers: after a transaction that added deliveries commits, one drain job per
endpoint is queued on RQ.

The database is the source of truth for what must be delivered; a job only says "this endpoint
has work". So a lost job loses nothing (the sweeper queues another), two jobs for one endpoint
are harmless (the second finds nothing to claim), and a request flag per endpoint keeps a burst
of events from queueing a job each.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

import redis
from flask import Flask, current_app
from rq import Queue
from sqlalchemy import event
from sqlalchemy.orm import Session

from services.events import WAKE_AFTER_COMMIT
from workers.connection import QUEUES, redis_connection

log = logging.getLogger("brand_api.webhooks")

WEBHOOK_QUEUE = QUEUES[0]
DRAIN_JOB = "workers.delivery_jobs.drain_endpoint"
# Set while a drain of the endpoint is queued and not yet started; expires so that a flag whose
# job vanished cannot block the endpoint for long.
_DRAIN_FLAG = "brand-api:drain-queued:{}"
DRAIN_FLAG_TTL_SECONDS = 300
# Generous: a drain stops taking new work after its budget, but one attempt may be slow.
DRAIN_JOB_TIMEOUT_SECONDS = 600


def install() -> None:
    """Enqueue after every commit that published deliveries (once per process: the listener is
    on SQLAlchemy's Session class, shared by every app in it)."""
    if not event.contains(Session, "after_commit", _wake_after_commit):
        event.listen(Session, "after_commit", _wake_after_commit)
        event.listen(Session, "after_soft_rollback", _forget_on_rollback)


def _wake_after_commit(session: Session) -> None:
    endpoint_ids = session.info.pop(WAKE_AFTER_COMMIT, None)
    if endpoint_ids:
        request_drains(current_app, endpoint_ids)


def _forget_on_rollback(session: Session, previous_transaction) -> None:
    session.info.pop(WAKE_AFTER_COMMIT, None)


def request_drains(app: Flask, endpoint_ids: Iterable[str]) -> int:
    """Queue a drain for each endpoint that has none queued; how many were queued.

    Never raises: the deliveries are committed, and if Redis cannot take the jobs now the
    sweeper will. The caller's request has succeeded either way.
    """
    endpoint_ids = sorted(set(endpoint_ids))
    connection = redis_connection(app)
    if connection is None or not endpoint_ids:
        return 0
    try:
        if len(endpoint_ids) == 1:
            # The usual case (a brand with one endpoint; every postback of theirs comes here):
            # one command costs a quarter less than a pipeline of one.
            flagged = [_flag(connection, endpoint_ids[0])]
        else:
            with connection.pipeline(transaction=False) as pipe:
                for endpoint_id in endpoint_ids:
                    _flag(pipe, endpoint_id)
                flagged = pipe.execute()
        wanted = [eid for eid, is_new in zip(endpoint_ids, flagged, strict=True) if is_new]
        if wanted:
            queue = Queue(WEBHOOK_QUEUE, connection=connection)
            queue.enqueue_many(
                [
                    Queue.prepare_data(
                        DRAIN_JOB,
                        args=(endpoint_id,),
                        timeout=DRAIN_JOB_TIMEOUT_SECONDS,
                        result_ttl=0,
                        failure_ttl=86400,
                        description=f"drain webhook endpoint {endpoint_id}",
                    )
                    for endpoint_id in wanted
                ]
            )
        return len(wanted)
    except redis.RedisError as error:
        log.warning(
            "could not queue webhook drains for %d endpoint(s); the sweeper will: %s",
            len(endpoint_ids),
            type(error).__name__,
        )
        return 0


def _flag(client, endpoint_id: str):
    """Set the endpoint's drain flag unless it is set: true when this call set it."""
    return client.set(_DRAIN_FLAG.format(endpoint_id), 1, nx=True, ex=DRAIN_FLAG_TTL_SECONDS)


def drain_started(app: Flask, endpoint_id: str) -> None:
    """Called first thing by a drain: a publish from now on queues a new one."""
    connection = redis_connection(app)
    if connection is not None:
        connection.delete(_DRAIN_FLAG.format(endpoint_id))


def schedule_drain(app: Flask, endpoint_id: str, at: datetime) -> None:
    """Wake the endpoint when a retry is due (RQ's scheduler moves the job to the queue)."""
    connection = redis_connection(app)
    if connection is None:
        return
    try:
        Queue(WEBHOOK_QUEUE, connection=connection).enqueue_at(
            at,
            DRAIN_JOB,
            endpoint_id,
            job_timeout=DRAIN_JOB_TIMEOUT_SECONDS,
            result_ttl=0,
            failure_ttl=86400,
            description=f"retry drain of webhook endpoint {endpoint_id}",
        )
    except redis.RedisError as error:
        log.warning("could not schedule a retry drain; the sweeper will: %s", error)
