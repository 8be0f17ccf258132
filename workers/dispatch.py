"""Waking the workers: after a transaction that added deliveries commits, a drain job naming
its endpoints is queued on RQ.

The database is the source of truth for what must be delivered; a job only says "these
endpoints have work". So a lost job loses nothing (the sweeper queues another), two jobs for
one endpoint are harmless (the second finds nothing to claim), and a request flag per endpoint
keeps a burst of events from queueing a job each.

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
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timedelta

import redis
from flask import Flask, current_app
from rq import Queue
from sqlalchemy import event
from sqlalchemy.orm import Session

from observability.metrics import count_backing_service_error
from services.events import WAKE_AFTER_COMMIT
from workers.connection import QUEUES, redis_connection

log = logging.getLogger("brand_api.webhooks")

WEBHOOK_QUEUE = QUEUES[0]
DRAIN_JOB = "workers.delivery_jobs.drain_endpoints"
# Endpoints one drain job carries at most.
DRAIN_JOB_ENDPOINTS = 100
# Set while a drain of the endpoint is queued and not yet started; expires so that a flag whose
# job vanished cannot block the endpoint for long.
_DRAIN_FLAG = "brand-api:drain-queued:{}"
DRAIN_FLAG_TTL_SECONDS = 300
# A drain only hands its endpoints to the worker's engine; this bounds a job stuck on Redis.
DRAIN_JOB_TIMEOUT_SECONDS = 60
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
    """Queue drains for the endpoints that have none queued; how many endpoints were queued.
    One job carries up to DRAIN_JOB_ENDPOINTS of them: an event that fans out to twenty
    endpoints costs one job, not twenty.

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
            Queue(WEBHOOK_QUEUE, connection=connection).enqueue_many(
                [
                    Queue.prepare_data(
                        DRAIN_JOB,
                        args=(chunk,),
                        timeout=DRAIN_JOB_TIMEOUT_SECONDS,
                        result_ttl=0,
                        failure_ttl=86400,
                        description=f"drain webhook endpoints {' '.join(chunk)}",
                    )
                    for chunk in _chunks(wanted, DRAIN_JOB_ENDPOINTS)
                ]
            )
        return len(wanted)
    except redis.RedisError as error:
        count_backing_service_error("redis", "dispatch")
        log.warning(
            "could not queue webhook drains for %d endpoint(s); the sweeper will: %s",
            len(endpoint_ids),
            type(error).__name__,
        )
        return 0


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _flag(client, endpoint_id: str):
    """Set the endpoint's drain flag unless it is set: true when this call set it."""
    return client.set(_DRAIN_FLAG.format(endpoint_id), 1, nx=True, ex=DRAIN_FLAG_TTL_SECONDS)


def drain_started(app: Flask, endpoint_ids: list[str]) -> None:
    """Called first thing by a drain: a publish from now on queues a new one."""
    connection = redis_connection(app)
    if connection is not None and endpoint_ids:
        connection.delete(*(_DRAIN_FLAG.format(endpoint_id) for endpoint_id in endpoint_ids))


def schedule_drains(app: Flask, due: Mapping[str, datetime]) -> None:
    """Wake each endpoint when its retry is due, from any worker (RQ's scheduler moves the job
    to the queue). The engine that recorded the retry wakes it on time itself; this is for when
    that process is gone. RQ keeps whole seconds, so a job is set for the second after, and one
    job id per endpoint and second keeps a thousand retries of one endpoint one job."""
    connection = redis_connection(app)
    if connection is None or not due:
        return
    queue = Queue(WEBHOOK_QUEUE, connection=connection)
    try:
        with connection.pipeline(transaction=False) as pipe:
            for endpoint_id, at in due.items():
                second = at.replace(microsecond=0) + timedelta(seconds=1)
                queue.enqueue_at(
                    second,
                    DRAIN_JOB,
                    [endpoint_id],
                    job_id=f"webhook-retry:{endpoint_id}:{int(second.timestamp())}",
                    job_timeout=DRAIN_JOB_TIMEOUT_SECONDS,
                    result_ttl=0,
                    failure_ttl=86400,
                    description=f"retry drain of webhook endpoint {endpoint_id}",
                    pipeline=pipe,
                )
            pipe.execute()
    except redis.RedisError as error:
        count_backing_service_error("redis", "dispatch")
        log.warning("could not schedule retry drains; the sweeper will: %s", type(error).__name__)


class DrainRequester:
    """One thread per process that queues the drains committed transactions asked for
    (`request_drains`), and the retry drains a worker schedules (`schedule_drains`), so that
    neither a request nor the delivery engine waits on Redis.

    Only committed work reaches it (the session's after-commit hook). A wake still held here
    when the process dies is not lost work: the deliveries are in the database, due, and the
    worker's sweeper queues their drain. At a normal exit what is held is sent first (atexit).
    """

    def __init__(self, send: Callable[[Flask, Iterable[str]], object] | None = None) -> None:
        # What a round calls per app: `request_drains` (a test may watch the rounds instead).
        self._send = send or request_drains
        self._changed = threading.Condition()
        self._pending: dict[Flask, set[str]] = {}
        self._later: dict[Flask, dict[str, datetime]] = {}
        self._busy = False
        self._idle = False
        self._thread: threading.Thread | None = None

    def add(self, app: Flask, endpoint_ids: Iterable[str]) -> None:
        with self._changed:
            self._pending.setdefault(app, set()).update(endpoint_ids)
            self._start_or_notify()

    def add_later(self, app: Flask, endpoint_id: str, at: datetime) -> None:
        """Schedule a drain of the endpoint at `at` (the earliest of those asked for wins)."""
        with self._changed:
            later = self._later.setdefault(app, {})
            if endpoint_id not in later or at < later[endpoint_id]:
                later[endpoint_id] = at
            self._start_or_notify()

    def _start_or_notify(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="drain-requester", daemon=True)
            self._thread.start()
        if self._idle:
            # Waking a thread costs a context switch; one resting between rounds takes this
            # with the rest when its pause ends.
            self._changed.notify_all()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every wake added so far has been sent to Redis; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._pending or self._later or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._changed.wait(remaining)
        return True

    def _run(self) -> None:
        while True:
            with self._changed:
                self._idle = True
                while not self._pending and not self._later:
                    self._changed.wait()
                self._idle = False
                batch, self._pending = self._pending, {}
                later, self._later = self._later, {}
                self._busy = True
            try:
                for app, endpoint_ids in batch.items():
                    self._send(app, endpoint_ids)
                for app, due in later.items():
                    schedule_drains(app, due)
            except Exception:  # neither raises; keep the thread alive regardless
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
