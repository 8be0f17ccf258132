"""Waking the workers: after a transaction that added deliveries commits, one drain job per
endpoint is queued on RQ.

The database is the source of truth for what must be delivered; a job only says "this endpoint
has work". So a lost job loses nothing (the sweeper queues another), two jobs for one endpoint
are harmless (the second finds nothing to claim), and a request flag per endpoint keeps a burst
of events from queueing a job each.

A committing request does not talk to Redis itself: it hands the endpoints to this process's
`DrainRequester` thread and returns. A request's answer then never waits on Redis (nor on its
2-second connect timeout while it is down), and the endpoints of requests that commit while the
thread is busy are flagged together, one SET per endpoint for the lot.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
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
# The drain requester's rest between two rounds (see DrainRequester).
REQUEST_ROUND_PAUSE_SECONDS = 0.01


def install() -> None:
    """Enqueue after every commit that published deliveries (once per process: the listener is
    on SQLAlchemy's Session class, shared by every app in it)."""
    if not event.contains(Session, "after_commit", _wake_after_commit):
        event.listen(Session, "after_commit", _wake_after_commit)
        event.listen(Session, "after_soft_rollback", _forget_on_rollback)


def _wake_after_commit(session: Session) -> None:
    endpoint_ids = session.info.pop(WAKE_AFTER_COMMIT, None)
    if endpoint_ids:
        drain_requester().add(current_app._get_current_object(), endpoint_ids)


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


class DrainRequester:
    """One thread per process that queues the drains committed transactions asked for
    (`request_drains`), so that no request waits on Redis.

    Only committed work reaches it (the session's after-commit hook). A wake still held here
    when the process dies is not lost work: the deliveries are in the database, due, and the
    worker's sweeper queues their drain. At a normal exit what is held is sent first (atexit).
    """

    def __init__(self, send: Callable[[Flask, Iterable[str]], object] | None = None) -> None:
        # What a round calls per app: `request_drains` (a test may watch the rounds instead).
        self._send = send or request_drains
        self._changed = threading.Condition()
        self._pending: dict[Flask, set[str]] = {}
        self._busy = False
        self._idle = False
        self._thread: threading.Thread | None = None

    def add(self, app: Flask, endpoint_ids: Iterable[str]) -> None:
        with self._changed:
            self._pending.setdefault(app, set()).update(endpoint_ids)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="drain-requester", daemon=True
                )
                self._thread.start()
            if self._idle:
                # Waking a thread costs a context switch; one resting between rounds takes
                # this with the rest when its pause ends.
                self._changed.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every wake added so far has been sent to Redis; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._pending or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._changed.wait(remaining)
        return True

    def _run(self) -> None:
        while True:
            with self._changed:
                self._idle = True
                while not self._pending:
                    self._changed.wait()
                self._idle = False
                batch, self._pending = self._pending, {}
                self._busy = True
            try:
                for app, endpoint_ids in batch.items():
                    self._send(app, endpoint_ids)
            except Exception:  # request_drains never raises; keep the thread alive regardless
                log.exception("queueing webhook drains failed; the sweeper will")
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()
            # A pause between rounds: the endpoints of every commit made meanwhile go out
            # together. A wake after a quiet spell is sent at once.
            time.sleep(REQUEST_ROUND_PAUSE_SECONDS)


_requester = DrainRequester()


def drain_requester() -> DrainRequester:
    return _requester


def _new_requester_in_child() -> None:
    # A forked child (a gunicorn worker) has none of its parent's threads, and a lock taken in
    # the parent at the fork would stay taken: it starts with a requester of its own.
    global _requester
    _requester = DrainRequester()


os.register_at_fork(after_in_child=_new_requester_in_child)
atexit.register(lambda: _requester.flush(timeout=3.0))
