"""The delivery loop: one per worker process, one loop that re-reads the truth.

    round: record what finished (services/delivery_attempts.py `record_attempts`), then claim
           what is due now, up to the free slots (`claim_attempts`), and start those attempts
    wait:  until an attempt finishes, a wake-up arrives (PostgreSQL NOTIFY: events were
           published), an endpoint's turn comes, or the poll interval (at most 1 s) passes

Everything an attempt depends on is read from the database at its claim. The process keeps only
what it is doing right now: the attempts on the wire and the results not yet recorded, each
under a lease that outlives the attempt (its timeout plus a slack), so nothing needs extending
and a worker killed at any moment leaves leases that lapse by themselves. It never starts a
second attempt of a delivery it is still sending or recording.

Attempts are tasks on an asyncio loop in a thread of its own, over one aiohttp session: a
receiver that takes 200 ms, or never answers, costs a socket and a timer, not a thread. The
database work runs on one more thread with one connection of its own, which carries a statement
timeout, a lock timeout and TCP keepalives; a round that still takes longer than
`ROUND_DEADLINE_SECONDS` (a connection gone half-open: no timeout of the server's can fire)
has its socket shut, and the next round opens a new connection.

If the loop itself dies (a bug), the process exits non-zero saying why, so that its supervisor
starts it again: a worker that runs RQ and delivers nothing must not look alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from flask import Flask
from sqlalchemy import Connection, text
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from extensions import db
from models.columns import utcnow
from observability.metrics import (
    ENDPOINTS_DISABLED_BY_SERVICE,
    count_attempt,
    count_backing_service_error,
)
from services.connections import shut_socket
from services.delivery_attempts import (
    Attempt,
    AttemptOutcome,
    Recorded,
    RetryPolicy,
    claim_attempts,
    record_attempts,
)
from services.endpoint_urls import UrlPolicy
from services.failpoints import failpoint
from services.secret_box import InvalidToken
from services.wakeups import listener_for
from workers.transport import OWN_FAULT, Transport

log = logging.getLogger("brand_api.webhooks")

# After a round the database refused (an outage), the next waits this long.
DATABASE_RETRY_SECONDS = 1.0
# After an attempt ends, the next round waits up to this long for the others started with it
# (attempts started together mostly end together; a round for each would cost a commit each).
GATHER_SECONDS = 0.002
# A round that found endpoints ready but could start nothing (their publishers had not
# committed yet) waits at least this long before the next, so as not to spin.
MIN_IDLE_SECONDS = 0.05
# The loop's own connection: no statement of a round takes longer, nor waits longer for a lock.
STATEMENT_TIMEOUT_MS = 15_000
LOCK_TIMEOUT_MS = 5_000
# A round longer than this has its connection's socket shut (see the module's docstring).
ROUND_DEADLINE_SECONDS = 20.0
# How often the loop writes its heartbeat (webhook_delivery_loops).
HEARTBEAT_SECONDS = 1.0
# The exit status of a worker whose loop died.
EXIT_LOOP_DIED = 3


@dataclass
class Round:
    """What one round of database work came to."""

    recorded: list[tuple[Attempt, AttemptOutcome, Recorded]] = field(default_factory=list)
    claimed: list[Attempt] = field(default_factory=list)
    next_ready_at: datetime | None = None
    due_left: bool = False
    failed: bool = False
    # Results not written (the round failed before their commit): recorded next round.
    unrecorded: list[tuple[Attempt, AttemptOutcome]] = field(default_factory=list)


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
        self._finished: list[tuple[Attempt, AttemptOutcome]] = []  # not recorded yet
        self._cohort: set[str] = set()  # started by the last round, still running
        self._stopping = False
        self._idle = False
        self._failing = False  # the last round failed (logged once per outage)
        self._beat_at = 0.0
        self._tasks: set[asyncio.Task] = set()
        self._db = ThreadPoolExecutor(1, "delivery-db", initializer=self._enter_app)
        self._connection: Connection | None = None  # the database thread's, see _session
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delivery-loop", daemon=True)
        self._thread.start()
        self._unsubscribe = listener_for(app).subscribe(self._on_wakeup)

    # --- what other threads call ----------------------------------------------------------------

    def idle(self) -> bool:
        """Nothing in flight or waiting for its record, the last round worked, and nothing was
        left due at it, held back or not (a burst worker's test for "done")."""
        return self._idle

    def stop(self, grace: float) -> None:
        """Claim nothing more; wait up to `grace` for the attempts in flight (each over within
        the timeout) and their records. What is still running then keeps its lease, which
        lapses by itself."""
        self._unsubscribe()
        self._loop.call_soon_threadsafe(self._begin_stop)
        if not self._done.wait(grace):
            log.warning(
                "stopping with %d attempt(s) in flight or unrecorded; their leases lapse",
                len(self._running) + len(self._finished),
            )
        else:
            self._forget_heartbeat()
        self._db.shutdown(wait=False, cancel_futures=True)

    def _on_wakeup(self, brand_ids) -> None:
        self._loop.call_soon_threadsafe(self._wake.set)

    def _begin_stop(self) -> None:
        self._stopping = True
        self._wake.set()

    # --- the loop -------------------------------------------------------------------------------

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

    def _enter_app(self) -> None:
        """The database thread keeps an app context for its life."""
        self.app.app_context().push()

    async def _main(self) -> None:
        self._transport = Transport(
            policy=self.url_policy, timeout=self.timeout, connections=self.concurrency
        )
        try:
            while not (self._stopping and not self._running and not self._finished):
                self._wake.clear()
                failpoint("delivery.loop")  # tests make the loop itself fail here
                batch, self._finished = self._finished, []
                slots = 0 if self._stopping else self.concurrency - len(self._running)
                held = [*self._running, *(attempt.delivery_id for attempt, _ in batch)]
                done = await self._database_round(batch, slots, held)
                self._finished = done.unrecorded + self._finished
                for attempt, outcome, recorded in done.recorded:
                    _log_attempt(attempt, outcome, recorded)
                self._cohort = {attempt.delivery_id for attempt in done.claimed}
                for attempt in done.claimed:
                    self._start(attempt)
                self._idle = not (self._running or self._finished or done.failed or done.due_left)
                await self._wait(done, slots)
        finally:
            await self._transport.close()

    async def _database_round(self, batch: list, slots: int, held: list[str]) -> Round:
        """The round's database work on the database thread, under the round's deadline."""
        future = self._loop.run_in_executor(
            self._db, self._round_on_database_thread, batch, slots, held, len(self._running)
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

    def _round_on_database_thread(
        self, batch: list, slots: int, held: list[str], running: int
    ) -> Round:
        """Record the batch, then claim up to `slots` (never one of `held`: this worker's
        deliveries on the wire or waiting for their record), in one transaction: a commit costs
        more than either (record_attempts writes a batch it cannot store row by row, each in a
        transaction of its own, before the claim). A round the database refuses (an outage)
        writes nothing: the batch is recorded next round (what a fallback already wrote is then
        found recorded, and not written twice)."""
        done = Round()
        session = None
        try:
            session = self._session()
            recorded: list = []
            if batch:
                # Tests kill a worker here: the receiver has answered, nothing is recorded.
                failpoint("delivery.before_record")
                recorded = record_attempts(batch, policy=self.policy)
            failpoint("delivery.before_claim")  # tests slow a round down here
            claimed = None
            if slots > 0:
                claimed = claim_attempts(
                    slots=slots,
                    endpoint_limit=self.endpoint_limit,
                    token=self.owner + secrets.token_hex(12),
                    lease=self.policy.lease,
                    held=held,
                )
            session.commit()
            done.recorded = [
                (attempt, outcome, result)
                for (attempt, outcome), result in zip(batch, recorded, strict=True)
            ]
            batch = []
            if claimed is not None:
                # Tests kill a worker here: leases taken, no attempt started.
                failpoint("delivery.after_claim")
                done.claimed, done.next_ready_at = claimed.attempts, claimed.next_ready_at
            if self.burst and running == 0 and not done.claimed:
                done.due_left = bool(session.execute(_ANYTHING_DUE).scalar())
                session.commit()
            self._heartbeat(session)
            if self._failing:
                log.info("webhook delivery rounds work again")
                self._failing = False
        except Exception as error:
            self._drop_session(session)
            count_backing_service_error("database", "worker")
            outage = isinstance(error, OperationalError | InterfaceError)
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
            done.unrecorded = batch
        return done

    # --- the database thread's connection -------------------------------------------------------

    def _session(self) -> Session:
        """The database thread's session on its own connection, opened when there is none:
        Flask-SQLAlchemy's scoped session, bound to it."""
        if self._connection is None:
            connection = db.engine.connect()
            connection.exec_driver_sql(f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}")
            connection.exec_driver_sql(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
            # The claim and the record are a few statements run every round (psycopg prepares
            # them after five): planned once, not at every execution, where planning cost more
            # than running them (3 ms against 1 for the claim's).
            connection.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
            connection.commit()
            self._connection = connection
            # Flask-SQLAlchemy types its registry for its own Session, which chooses among
            # binds; this plain one is bound to its one connection.
            db.session.registry.set(Session(bind=connection))  # type: ignore[arg-type]
        return db.session()

    def _drop_session(self, session: Session | None) -> None:
        """After a failed round: roll back, and give up the connection (perhaps broken); the
        next round opens another."""
        connection, self._connection = self._connection, None
        # A broken connection may fail to roll back or close: it is being thrown away.
        with contextlib.suppress(Exception):
            if session is not None:
                session.rollback()
        db.session.registry.clear()
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.invalidate()
                connection.close()

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
            _HEARTBEAT, {"id": self.loop_id, "hostname": socket.gethostname(), "pid": os.getpid()}
        )
        session.commit()
        self._beat_at = now

    def _forget_heartbeat(self) -> None:
        try:
            with self.app.app_context(), db.engine.begin() as connection:
                connection.execute(_FORGET_HEARTBEAT, {"id": self.loop_id})
        except Exception:  # noqa: S110 - the row ages out by itself
            pass

    # --- waiting --------------------------------------------------------------------------------

    async def _wait(self, done: Round, slots: int) -> None:
        """Until something to do: an attempt finished, a wake-up, an endpoint's turn, or the
        poll interval. After a failed round, a pause whatever happens: the results wait in
        memory, under leases that outlast this pause."""
        if done.failed:
            await asyncio.sleep(DATABASE_RETRY_SECONDS)
            return
        timeout = self.poll_interval
        if done.next_ready_at is not None and len(self._running) < self.concurrency:
            until_ready = (done.next_ready_at - utcnow()).total_seconds()
            floor = 0.0 if done.claimed else MIN_IDLE_SECONDS
            timeout = min(timeout, max(floor, until_ready))
        if timeout > 0 and not self._finished:
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass
        gather_until = time.monotonic() + GATHER_SECONDS
        while self._finished and self._cohort and time.monotonic() < gather_until:
            self._wake.clear()
            try:
                async with asyncio.timeout(gather_until - time.monotonic()):
                    await self._wake.wait()
            except TimeoutError:
                break

    # --- attempting -----------------------------------------------------------------------------

    def _start(self, attempt: Attempt) -> None:
        if attempt.delivery_id in self._running:  # the claim excludes these; never twice
            log.error("delivery %s claimed while still on the wire", attempt.delivery_id)
            return
        self._running[attempt.delivery_id] = attempt
        task = self._loop.create_task(self._attempt(attempt))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _attempt(self, attempt: Attempt) -> None:
        outcome = None
        try:
            current, previous = self._secrets(attempt)
            if current is None:
                outcome = _not_sent(
                    f"{OWN_FAULT} cannot decrypt the signing secret (ENCRYPTION_KEY changed?); "
                    "rotate the endpoint's secret"
                )
            else:
                outcome = await self._transport.send_attempt(
                    url=attempt.url,
                    secret=current,
                    previous_secret=previous,
                    body=attempt.body,
                    event_name=attempt.event_name,
                    event_id=attempt.event_id,
                    delivery_id=attempt.delivery_id,
                )
        except Exception as error:  # never lose track of a leased delivery
            log.exception("webhook attempt of %s failed unexpectedly", attempt.delivery_id)
            outcome = _not_sent(f"{OWN_FAULT} failed ({type(error).__name__})")
        finally:
            outcome = outcome or _not_sent(f"{OWN_FAULT} stopped")
            count_attempt(outcome.kind, outcome.duration_ms / 1000)
            del self._running[attempt.delivery_id]
            self._cohort.discard(attempt.delivery_id)
            self._finished.append((attempt, outcome))
            self._wake.set()

    def _secrets(self, attempt: Attempt) -> tuple[str | None, str | None]:
        try:
            current = self._decrypt(attempt.secret_ciphertext)
        except InvalidToken:
            log.error("signing secret of endpoint %s cannot be decrypted", attempt.endpoint_id)
            return None, None
        previous = None
        if attempt.previous_secret_ciphertext is not None:
            try:
                previous = self._decrypt(attempt.previous_secret_ciphertext)
            except InvalidToken:  # the current one still signs
                log.error("previous secret of endpoint %s cannot be decrypted", attempt.endpoint_id)
        return current, previous


def _not_sent(why: str) -> AttemptOutcome:
    return AttemptOutcome(requested_at=utcnow(), duration_ms=0, request_headers={}, error=why)


def _log_attempt(attempt: Attempt, outcome: AttemptOutcome, recorded: Recorded) -> None:
    # Successes are the bulk and live in the delivery log; failures are what operators watch.
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
    if recorded.endpoint_disabled:
        ENDPOINTS_DISABLED_BY_SERVICE.inc()
        log.warning(
            "webhook endpoint %s disabled: %s",
            attempt.endpoint_id,
            outcome.error,
            extra={"endpoint_id": attempt.endpoint_id},
        )


# Is anything due now, held back by a breaker or not (a burst worker is not done while so)?
_ANYTHING_DUE = text(
    """
    SELECT EXISTS (SELECT 1 FROM webhook_delivery_queue
                   WHERE next_attempt_at <= statement_timestamp())
        OR EXISTS (SELECT 1 FROM webhook_delivery_leases AS lease
                   JOIN webhook_deliveries AS d ON d.id = lease.delivery_id
                   WHERE d.status = 'pending')
    """
)
_HEARTBEAT = text(
    """
    INSERT INTO webhook_delivery_loops (id, hostname, pid, started_at, last_round_at)
    VALUES (:id, :hostname, :pid, statement_timestamp(), statement_timestamp())
    ON CONFLICT (id) DO UPDATE SET last_round_at = excluded.last_round_at
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


__all__ = ["DeliveryLoop", "start_delivery_loop", "stop_delivery_loop"]
