"""The delivery loop, one per worker process: rounds of record, health and claim on a database
thread (queue.py `record_and_claim`), attempts as tasks on an asyncio loop in a thread of its
own, bulk jobs beside them (bulk.py). The process keeps only what it is doing now, each under a
lease that outlives it. docs/delivery.md lists the mechanisms and why each exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import queue as thread_queue
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from datetime import datetime

from flask import Flask
from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from extensions import db
from models.columns import utcnow
from observability.metrics import (
    ENDPOINTS_DISABLED_BY_SERVICE,
    count_attempt,
    count_backing_service_error,
)
from observability.tracing import TRACEPARENT, AttemptTrace
from services.connections import shut_socket
from services.delivery.bulk import BulkRunner
from services.delivery.health import EndpointNews, apply_news, news_of
from services.delivery.outcomes import (
    DATABASE_RETRY_SECONDS,
    OWN_FAULT,
    ROUND_DEADLINE_SECONDS,
    START_WINDOW_SECONDS,
    Attempt,
    AttemptOutcome,
    Recorded,
    RetryPolicy,
    not_sent,
)
from services.delivery.queue import OUTAGE, Claimed, record_and_claim, record_attempts
from services.delivery.transport import Transport
from services.endpoint_urls import UrlPolicy
from services.failpoints import failpoint
from services.secret_box import InvalidToken
from services.wakeups import listener_for

log = logging.getLogger("brand_api.webhooks")

# A claim walks at most this many endpoints per slot it could fill (and at least 64).
WALK_PER_SLOT = 2
# After an attempt ends, the next round waits this long for the rest of its claim's cohort:
# attempts started together mostly end together, and one round records them all.
GATHER_SECONDS = 0.002
# How often the loop writes its heartbeat (webhook_delivery_loops).
HEARTBEAT_SECONDS = 1.0
# The exit status of a worker whose loop died.
EXIT_LOOP_DIED = 3
# After its grace, a stopping loop waits this long for the attempts it abandoned to be noted.
ABANDON_SECONDS = 5.0


@dataclass
class Round:
    """What one round of database work came to."""

    recorded: list[tuple[Attempt, AttemptOutcome, Recorded]] = field(default_factory=list)
    claimed: Claimed = field(default_factory=Claimed)
    disabled: list[tuple[str, str]] = field(default_factory=list)
    due_left: bool = False
    failed: bool = False
    # Results not written (the round failed first, or their rows were locked): next round.
    unrecorded: list[tuple[Attempt, AttemptOutcome]] = field(default_factory=list)


class DatabaseThread(Executor):
    """One daemon thread that runs the loop's database work in order. Not a ThreadPoolExecutor:
    the interpreter joins those at exit, so a statement the loop abandoned at a stop would hold
    the process past its grace."""

    def __init__(self, initializer: Callable[[], None]) -> None:
        self._work: thread_queue.SimpleQueue = thread_queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._serve, args=(initializer,), name="delivery-db", daemon=True
        )
        self._thread.start()

    def submit(self, fn, /, *args, **kwargs) -> Future:
        future: Future = Future()
        self._work.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._work.put(None)
        if wait:
            self._thread.join()

    def _serve(self, initializer: Callable[[], None]) -> None:
        initializer()
        while (item := self._work.get()) is not None:
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as error:  # handed to whoever waits on the future
                future.set_exception(error)


class DeliveryLoop:
    def __init__(self, app: Flask, *, burst: bool = False) -> None:
        settings = app.extensions["settings"]
        self.app = app
        self.burst = burst
        self.concurrency = settings.webhook_concurrency
        self.endpoint_limit = settings.webhook_endpoint_concurrency
        self.timeout = settings.webhook_timeout
        self.poll_interval = settings.webhook_poll_interval
        self.policy = RetryPolicy.from_settings(settings)
        self.url_policy = UrlPolicy.for_environment(settings.app_env)
        # Begins every lease token this process takes, and names its heartbeat.
        self.owner = secrets.token_hex(4)
        self.loop_id = f"{self.owner}-{os.getpid()}"
        self._decrypt = functools.lru_cache(maxsize=4096)(app.extensions["secret_box"].decrypt)
        self._running: dict[str, Attempt] = {}  # on the wire, by delivery id
        self._cohort: set[str] = set()  # started by the last claim, still on the wire
        self._finished: list[tuple[Attempt, AttemptOutcome]] = []  # not recorded yet
        self._news: dict[str, EndpointNews] = {}  # health not written yet (rows were locked)
        self._cursor = ""  # where the next claim's walk begins
        self._cycle_start: str | None = None  # where the walks since the last wait began
        self._oldest_due_at: datetime | None = None
        self._stopping = False
        self._abandoned = False
        self._idle = False
        self._failing = False  # the last round failed (logged once per outage)
        self._beat_at = 0.0
        self._tasks: set[asyncio.Task] = set()
        self._db = DatabaseThread(initializer=lambda: app.app_context().push())
        self._connection: Connection | None = None  # the database thread's, see _session
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self._done = threading.Event()
        self._bulk = BulkRunner(app)
        self._thread = threading.Thread(target=self._run, name="delivery-loop", daemon=True)
        self._thread.start()
        self._unsubscribe = listener_for(app).subscribe(self._on_wakeup)

    def idle(self) -> bool:
        """Nothing in flight, unrecorded or due, and the last round worked (a burst's "done")."""
        return self._idle

    def stop(self, grace: float) -> None:
        """Claim nothing more; wait up to `grace` for the attempts in flight and their records,
        then abandon the rest (their leases lapse) and close the connection."""
        self._unsubscribe()
        self._loop.call_soon_threadsafe(self._begin_stop)
        clean = self._done.wait(grace)
        if not clean:
            log.warning(
                "stopping with %d attempt(s) in flight or unrecorded; their leases lapse",
                len(self._running) + len(self._finished),
            )
            self._loop.call_soon_threadsafe(self._abandon)
            self._done.wait(ABANDON_SECONDS)
        self._bulk.stop(timeout=ABANDON_SECONDS)
        with contextlib.suppress(Exception):
            self._db.submit(self._close_connection, forget=clean).result(ABANDON_SECONDS)
        self._db.shutdown(wait=False)

    def _on_wakeup(self, brand_ids) -> None:
        self._loop.call_soon_threadsafe(self._wake.set)

    def _begin_stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def _abandon(self) -> None:
        self._abandoned = True
        for task in list(self._tasks):
            task.cancel()
        self._wake.set()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self.app.app_context().push()  # failpoints and settings read the app
        try:
            self._loop.run_until_complete(self._main())
        except BaseException:
            # A bug: the process must not go on looking alive with no loop (its RQ half would).
            log.critical(
                "the webhook delivery loop died; exiting (status %d) so that the worker is "
                "started again",
                EXIT_LOOP_DIED,
                exc_info=True,
            )
            logging.shutdown()
            sys.stderr.flush()
            os._exit(EXIT_LOOP_DIED)
        finally:
            self._done.set()

    async def _main(self) -> None:
        self._transport = Transport(
            policy=self.url_policy, timeout=self.timeout, connections=self.concurrency
        )
        try:
            while not self._stopping or self._running or (self._finished and not self._abandoned):
                self._wake.clear()
                failpoint("delivery.loop")  # tests make the loop itself fail here
                batch, self._finished = self._finished, []
                if self._abandoned:
                    batch = []
                # The batch's leases are released by the record, before the claim in the same
                # transaction: only what is on the wire takes a slot. Counting the batch too, a
                # round that recorded a whole cohort claimed nothing, then slept its poll interval.
                slots = 0 if self._stopping else self.concurrency - len(self._running)
                held = [*self._running, *(attempt.delivery_id for attempt, _ in batch)]
                done = await self._database_round(batch, slots, held)
                self._finished = done.unrecorded + self._finished
                for attempt, outcome, recorded in done.recorded:
                    _log_attempt(attempt, outcome, recorded)
                for endpoint_id, why in done.disabled:
                    ENDPOINTS_DISABLED_BY_SERVICE.inc()
                    log.warning(
                        "webhook endpoint %s disabled: %s",
                        endpoint_id,
                        why,
                        extra={"endpoint_id": endpoint_id},
                    )
                self._cohort = {attempt.delivery_id for attempt in done.claimed.attempts}
                for attempt in done.claimed.attempts:
                    self._start(attempt)
                self._idle = not (self._running or self._finished or done.failed or done.due_left)
                await self._wait(done, slots)
        finally:
            await self._transport.close()

    async def _database_round(self, batch: list, slots: int, held: list[str]) -> Round:
        future = self._loop.run_in_executor(
            self._db, self._round_on_database_thread, batch, slots, held
        )
        try:
            return await asyncio.wait_for(asyncio.shield(future), ROUND_DEADLINE_SECONDS)
        except TimeoutError:
            log.error(
                "a webhook delivery round took over %gs: its database connection is shut and "
                "replaced",
                ROUND_DEADLINE_SECONDS,
            )
            self._shut_connection()
            return await future

    def _round_on_database_thread(self, batch: list, slots: int, held: list[str]) -> Round:
        """Record the batch, write its health news and claim up to `slots` (never one of
        `held`); a batch refused together is written apart after the claim, and a round the
        database refuses writes nothing (the batch waits for the next)."""
        done = Round()
        session = None
        try:
            session = self._session()
            if batch:
                # Tests kill or stall a worker here: answered, not recorded.
                failpoint("delivery.before_record")
            failpoint("delivery.before_claim")  # tests slow a round down here
            claim = None
            cycle_start = self._cursor if self._cycle_start is None else self._cycle_start
            if slots > 0:
                claim = {
                    "cursor": self._cursor,
                    "cycle_start": cycle_start,
                    "slots": slots,
                    "walk_max": max(64, WALK_PER_SLOT * slots),
                    "endpoint_limit": self.endpoint_limit,
                    "token": self.owner + secrets.token_hex(12),
                    "lease": self.policy.lease,
                    "held": held,
                    "start_by": time.monotonic() + START_WINDOW_SECONDS,
                }
            if not batch and self._news:
                self._write_health([], [], done)
                session.commit()
            recorded, claimed = record_and_claim(
                batch,
                policy=self.policy,
                claim=claim,
                between=lambda recorded: self._write_health(batch, recorded, done),
            )
            if recorded is None:
                recorded = record_attempts(batch, policy=self.policy)
                self._write_health(batch, recorded, done)
                session.commit()
            done.recorded = [
                (attempt, outcome, result)
                for (attempt, outcome), result in zip(batch, recorded, strict=True)
            ]
            done.unrecorded = [
                pair for pair, result in zip(batch, recorded, strict=True) if result.carried
            ]
            if claimed is not None:
                self._cursor = claimed.cursor
                self._cycle_start = None if claimed.round_done else cycle_start
                # The oldest due time seen over the last walk round (GET /metrics' lag).
                seen, oldest = claimed.oldest_due_at, self._oldest_due_at
                if claimed.round_done or oldest is None or (seen is not None and seen < oldest):
                    self._oldest_due_at = seen
                # Tests stall a worker here: leases taken, no attempt started.
                failpoint("delivery.after_claim")
                done.claimed = claimed
            self._heartbeat(session)
            if self.burst and not self._running and not done.claimed.attempts:
                done.due_left = bool(session.execute(_ANYTHING_DUE).scalar())
            session.commit()
            if self._failing:
                log.info("webhook delivery rounds work again")
                self._failing = False
        except Exception as error:
            self._drop_session(session)
            count_backing_service_error("database", "worker")
            outage = isinstance(error, OUTAGE)
            # An outage is one line, not one a second; anything else is a bug: its traceback.
            if not (outage and self._failing):
                log.warning(
                    "webhook delivery round failed (%s); trying again every %gs",
                    type(error).__name__,
                    DATABASE_RETRY_SECONDS,
                    exc_info=not outage,
                )
            self._failing = True
            done.failed = True
            if not done.recorded:
                done.unrecorded = batch
        return done

    def _write_health(self, batch: list, recorded: list[Recorded], done: Round) -> None:
        """The results' health news and what earlier rounds could not write, under a
        savepoint: what it cannot write now waits for the next round."""
        for endpoint_id, item in news_of(batch, recorded).items():
            known = self._news.get(endpoint_id)
            self._news[endpoint_id] = known.merge(item) if known else item
        if not self._news:
            return
        try:
            with db.session.begin_nested():
                applied = apply_news(self._news, policy=self.policy)
        except OUTAGE:
            raise
        except SQLAlchemyError:
            log.warning("endpoint health not written this round; next round", exc_info=True)
            return
        self._news = applied.carried
        done.disabled += applied.disabled

    def _session(self) -> Session:
        """Flask-SQLAlchemy's scoped session, bound to the database thread's own connection."""
        if self._connection is None:
            self._connection = db.engine.connect()
            # Flask-SQLAlchemy types its registry for its own Session, which chooses among
            # binds; this plain one is bound to its one connection.
            db.session.registry.set(Session(bind=self._connection))  # type: ignore[arg-type]
        return db.session()

    def _drop_session(self, session: Session | None, *, broken: bool = True) -> None:
        """Give up the session and its connection (after a failed round perhaps broken: not
        reused); the next round opens another."""
        connection, self._connection = self._connection, None
        # A broken connection may fail to roll back or close: it is being thrown away.
        with contextlib.suppress(Exception):
            if session is not None:
                session.close()
        db.session.registry.clear()
        if connection is not None:
            with contextlib.suppress(Exception):
                if broken:
                    connection.invalidate()
                connection.close()

    def _close_connection(self, forget: bool) -> None:
        """At the end: the heartbeat's row goes (a clean stop), and the connection is closed."""
        if self._connection is None:
            return
        session = self._session()
        if forget:
            with contextlib.suppress(Exception):
                session.execute(_FORGET_HEARTBEAT, {"id": self.loop_id})
                session.commit()
        self._drop_session(session, broken=False)

    def _shut_connection(self) -> None:
        """From the loop's thread: shut the database thread's socket, so that its blocked call
        fails at once instead of waiting on a peer that will never answer."""
        connection = self._connection
        if connection is not None:
            shut_socket(connection.connection.dbapi_connection)  # type: ignore[arg-type]

    def _heartbeat(self, session: Session) -> None:
        now = time.monotonic()
        if now - self._beat_at < HEARTBEAT_SECONDS:
            return
        session.execute(
            _HEARTBEAT,
            {
                "id": self.loop_id,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "oldest_due_at": self._oldest_due_at,
            },
        )
        self._beat_at = now

    async def _wait(self, done: Round, slots: int) -> None:
        """Until an attempt finishes, a wake-up, a retry falls due or the poll interval; not at
        all while fresh results wait or the walks have not gone round with slots free. After a
        failed round, a pause: its results wait under leases that outlast it."""
        if done.failed:
            await asyncio.sleep(DATABASE_RETRY_SECONDS)
            return
        fresh = len(self._finished) > len(done.unrecorded)  # results beyond the carried ones
        if fresh or (not done.claimed.round_done and len(done.claimed.attempts) < slots):
            await asyncio.sleep(0)  # the attempts' callbacks run, then the next round
        else:
            timeout = self.poll_interval
            if done.claimed.next_due_at is not None:
                until_due = (done.claimed.next_due_at - utcnow()).total_seconds()
                timeout = min(timeout, max(0.0, until_due))
            if timeout > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
        gather_until = time.monotonic() + GATHER_SECONDS
        while self._cohort and time.monotonic() < gather_until:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(gather_until - time.monotonic()):
                    await self._wake.wait()

    def _start(self, attempt: Attempt) -> None:
        if attempt.delivery_id in self._running:  # the claim excludes these; never twice
            log.error("delivery %s claimed while still on the wire", attempt.delivery_id)
            return
        if time.monotonic() > attempt.start_by:
            # The claim came back too late (a stalled process): sending now could outlast the
            # lease. Nothing is sent; the lease lapses and the next claim takes the delivery.
            log.warning(
                "delivery %s not started: its claim is over %gs old; its lease lapses",
                attempt.delivery_id,
                START_WINDOW_SECONDS,
            )
            return
        self._running[attempt.delivery_id] = attempt
        task = self._loop.create_task(self._attempt(attempt))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _attempt(self, attempt: Attempt) -> None:
        outcome = None
        # The `webhook.attempt` span (when exporting traces), in its event's trace.
        trace = AttemptTrace(
            attempt.traceparent,
            {
                "brand.id": attempt.brand_id,
                "event.id": attempt.event_id,
                "event.type": attempt.event_name,
                "webhook.endpoint.id": attempt.endpoint_id,
                "webhook.delivery.id": attempt.delivery_id,
                "webhook.attempt.number": attempt.attempt_number,
            },
        )
        try:
            current = self._secret(attempt, "signing", attempt.secret_ciphertext)
            if current is None:
                outcome = not_sent(
                    f"{OWN_FAULT} cannot decrypt the signing secret (ENCRYPTION_KEY changed?); "
                    "rotate the endpoint's secret",
                    utcnow(),
                )
            else:
                outcome = await self._transport.send_attempt(
                    url=attempt.url,
                    secret=current,
                    # While a rotation's overlap lasts; the current one signs if it cannot.
                    previous_secret=self._secret(
                        attempt, "previous", attempt.previous_secret_ciphertext
                    ),
                    body=attempt.body,
                    event_name=attempt.event_name,
                    event_id=attempt.event_id,
                    delivery_id=attempt.delivery_id,
                    # Only to an endpoint that asked for it (CONTRACT 13.6).
                    trace_headers=(
                        {TRACEPARENT: trace.traceparent()} if attempt.trace_context else None
                    ),
                )
        except Exception as error:  # never lose track of a leased delivery
            log.exception("webhook attempt of %s failed unexpectedly", attempt.delivery_id)
            outcome = not_sent(f"{OWN_FAULT} failed ({type(error).__name__})", utcnow())
        finally:
            outcome = outcome or not_sent(f"{OWN_FAULT} stopped", utcnow())
            trace.end(outcome.http_status, outcome.error_text)
            count_attempt(outcome.kind, outcome.duration_ms / 1000)
            del self._running[attempt.delivery_id]
            self._cohort.discard(attempt.delivery_id)
            self._finished.append((attempt, outcome))
            self._wake.set()

    def _secret(self, attempt: Attempt, which: str, ciphertext: str | None) -> str | None:
        try:
            return None if ciphertext is None else self._decrypt(ciphertext)
        except InvalidToken:
            log.error("%s secret of endpoint %s cannot be decrypted", which, attempt.endpoint_id)
            return None


def _log_attempt(attempt: Attempt, outcome: AttemptOutcome, recorded: Recorded) -> None:
    # Successes are the bulk and live in the delivery log; failures are what operators watch.
    if recorded.carried:
        return  # logged when it is written
    log.log(
        logging.DEBUG if outcome.succeeded and recorded.kept else logging.INFO,
        "webhook attempt delivery=%s endpoint=%s attempt=%d status=%s http=%s ms=%d%s%s",
        attempt.delivery_id,
        attempt.endpoint_id,
        attempt.attempt_number,
        recorded.status,
        outcome.http_status,
        outcome.duration_ms,
        "" if outcome.succeeded else f" error={outcome.error_text!r}",
        "" if recorded.kept else " (discarded: its lease lapsed and another worker took it)",
        extra={
            "delivery_id": attempt.delivery_id,
            "endpoint_id": attempt.endpoint_id,
            "event_name": attempt.event_name,
            "attempt": attempt.attempt_number,
            "outcome": outcome.kind,
            "delivery_status": recorded.status,
            "http_status": outcome.http_status,
            "duration_ms": outcome.duration_ms,
        },
    )


# Is anything due now, held back by a breaker or not (a burst worker is not done while so)?
_ANYTHING_DUE = text(
    """
    SELECT EXISTS (SELECT 1 FROM webhook_delivery_queue
                   WHERE next_attempt_at <= statement_timestamp())
        OR EXISTS (SELECT 1 FROM webhook_delivery_leases)
    """
)
_HEARTBEAT = text(
    """
    INSERT INTO webhook_delivery_loops (id, hostname, pid, started_at, last_round_at,
                                        oldest_due_at)
    VALUES (:id, :hostname, :pid, statement_timestamp(), statement_timestamp(), :oldest_due_at)
    ON CONFLICT (id) DO UPDATE
    SET last_round_at = excluded.last_round_at, oldest_due_at = excluded.oldest_due_at
    """
)
_FORGET_HEARTBEAT = text("DELETE FROM webhook_delivery_loops WHERE id = :id")


_delivery_loop: DeliveryLoop | None = None
_delivery_loop_lock = threading.Lock()


def start_delivery_loop(app: Flask, *, burst: bool = False) -> DeliveryLoop:
    """This process's delivery loop, started on first use."""
    global _delivery_loop  # one loop per worker process
    with _delivery_loop_lock:
        if _delivery_loop is None:
            _delivery_loop = DeliveryLoop(app, burst=burst)
        return _delivery_loop


def stop_delivery_loop(grace: float) -> None:
    global _delivery_loop
    with _delivery_loop_lock:
        loop, _delivery_loop = _delivery_loop, None
    if loop is not None:
        loop.stop(grace)
