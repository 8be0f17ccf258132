"""The delivery loop: one per worker process, one loop that re-reads the truth.

    round: record what finished, extend the leases of what still runs, claim what is due
           now (up to the free slots), start those attempts
    wait:  until an attempt finishes, a wake-up arrives (PostgreSQL NOTIFY: events were
           published), a retry falls due, or the poll interval (at most 1 s) passes

Everything an attempt depends on is read from the database at its claim: which deliveries are
due, how many of an endpoint's attempts are in flight across all workers, its breaker, its URL
and secrets (services/delivery_attempts.py). The process keeps only what it is doing right
now: the attempts on the wire and the results not yet recorded, each under a lease it extends
every second. So nothing in memory can hold an endpoint back, a lost wake-up costs at most one
poll interval, and a worker killed at any moment leaves leases that lapse within seconds.

Attempts are tasks on an asyncio loop in a thread of its own, over one aiohttp session: a
receiver that takes 200 ms, or never answers, costs a socket and a timer, not a thread. The
database work of a round runs on one more thread with one connection.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from flask import Flask
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session

from extensions import db
from models.columns import utcnow
from observability.metrics import (
    ENDPOINTS_DISABLED_BY_SERVICE,
    count_attempt,
    count_backing_service_error,
)
from services.delivery_attempts import (
    LEASE,
    Attempt,
    AttemptOutcome,
    Recorded,
    RetryPolicy,
    extend_leases,
    run_round,
)
from services.endpoint_urls import UrlPolicy
from services.failpoints import failpoint
from services.secret_box import InvalidToken
from services.wakeups import listener_for
from workers.transport import Transport

log = logging.getLogger("brand_api.webhooks")

# Leases are extended this often (a lease lasts LEASE unless extended).
EXTEND_EVERY_SECONDS = 1.0
# After a round the database refused (an outage), the next waits this long.
DATABASE_RETRY_SECONDS = 1.0
# After an attempt ends, the next round waits up to this long for the others started with it.
GATHER_SECONDS = 0.002
# Results deferred because their endpoint's row was held (a change, another worker's claim) are
# tried again this soon: such locks last milliseconds.
DEFERRED_RETRY_SECONDS = 0.05


@dataclass
class Round:
    """What one round of database work came to."""

    recorded: list[tuple[Attempt, AttemptOutcome, Recorded]] = field(default_factory=list)
    deferred: list[tuple[Attempt, AttemptOutcome]] = field(default_factory=list)
    claimed: list[Attempt] = field(default_factory=list)
    next_due_at: datetime | None = None
    failed: bool = False


class DeliveryLoop:
    def __init__(self, app: Flask) -> None:
        settings = app.extensions["settings"]
        self.app = app
        self.concurrency = settings.webhook_concurrency
        self.endpoint_limit = settings.webhook_endpoint_concurrency
        self.timeout = settings.webhook_timeout
        self.poll_interval = settings.webhook_poll_interval
        self.policy = RetryPolicy.from_settings(settings)
        self.url_policy = UrlPolicy.for_environment(settings.app_env)
        # Begins every lease token this process takes.
        self.owner = secrets.token_hex(4)
        self._decrypt = functools.lru_cache(maxsize=4096)(app.extensions["secret_box"].decrypt)
        self._running: dict[str, Attempt] = {}  # on the wire, by delivery id
        self._finished: list[tuple[Attempt, AttemptOutcome]] = []  # not recorded yet
        self._cohort: set[str] = set()  # started by the last round, still running
        self._stopping = False
        self._idle = False
        self._failing = False  # the last round failed (logged once per outage)
        self._tasks: set[asyncio.Task] = set()
        self._db = ThreadPoolExecutor(1, "delivery-db", initializer=self._enter_app)
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delivery-loop", daemon=True)
        self._thread.start()
        self._unsubscribe = listener_for(app).subscribe(self._on_wakeup)

    # --- what other threads call ----------------------------------------------------------------

    def idle(self) -> bool:
        """Nothing in flight or waiting for its record, and nothing due within a poll interval
        at the last round (a burst worker's test for "done")."""
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
        self._db.shutdown(wait=False, cancel_futures=True)

    def _on_wakeup(self, brand_ids) -> None:
        self._loop.call_soon_threadsafe(self._wake.set)

    def _begin_stop(self) -> None:
        self._stopping = True
        self._wake.set()

    # --- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._done.set()

    def _enter_app(self) -> None:
        """The database thread keeps an app context and a session on a connection of its own
        for its life. A lost connection is replaced on the next use after the rollback."""
        self.app.app_context().push()
        # Flask-SQLAlchemy types its registry for its own Session, which chooses among binds;
        # this plain one is bound to its one connection.
        db.session.registry.set(Session(bind=db.engine.connect()))  # type: ignore[arg-type]

    async def _main(self) -> None:
        self._transport = Transport(policy=self.url_policy, timeout=self.timeout)
        extended_at = 0.0
        try:
            while not (self._stopping and not self._running and not self._finished):
                self._wake.clear()
                batch, self._finished = self._finished, []
                held = None
                if time.monotonic() - extended_at >= EXTEND_EVERY_SECONDS:
                    held = [(a.delivery_id, a.token) for a in self._running.values()]
                    held += [(a.delivery_id, a.token) for a, _ in batch]
                slots = 0 if self._stopping else self.concurrency - len(self._running)
                done = await self._loop.run_in_executor(
                    self._db, self._database_round, batch, held, slots, len(self._running)
                )
                if held is not None and not done.failed:
                    extended_at = time.monotonic()
                self._finished = done.deferred + self._finished
                for attempt, outcome, recorded in done.recorded:
                    _log_attempt(attempt, outcome, recorded)
                self._cohort = {attempt.delivery_id for attempt in done.claimed}
                for attempt in done.claimed:
                    self._start(attempt)
                self._idle = not (self._running or self._finished) and _not_due_soon(
                    done.next_due_at, self.poll_interval
                )
                await self._wait(done, extended_at)
        finally:
            await self._transport.close()

    async def _wait(self, done: Round, extended_at: float) -> None:
        """Until something to do: an attempt finished, a wake-up, a retry due, leases to
        extend, or the poll interval. After a failed round, a pause whatever happens: the
        results wait in memory, under leases it extends once the database answers."""
        if done.failed:
            await asyncio.sleep(DATABASE_RETRY_SECONDS)
            return
        timeout = DEFERRED_RETRY_SECONDS if done.deferred else self.poll_interval
        if done.next_due_at is not None:
            timeout = min(timeout, max(0.0, (done.next_due_at - utcnow()).total_seconds()))
        if self._running or self._finished:
            timeout = min(timeout, extended_at + EXTEND_EVERY_SECONDS - time.monotonic())
        if timeout > 0:
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass
        # Attempts started together mostly end together: a round for the first alone would
        # leave the rest to the next, and an endpoint's slots would refill one per round.
        gather_until = time.monotonic() + GATHER_SECONDS
        while self._finished and self._cohort and time.monotonic() < gather_until:
            self._wake.clear()
            try:
                async with asyncio.timeout(gather_until - time.monotonic()):
                    await self._wake.wait()
            except TimeoutError:
                break

    def _database_round(
        self, batch: list, held: list[tuple[str, str]] | None, slots: int, running: int
    ) -> Round:
        """One round's database work, on the database thread, in one transaction (a commit
        costs more than any of its statements): record the batch, extend the leases `held`
        (those of the attempts running and of the batch), claim up to `slots`. If it fails,
        nothing of it is written, and the batch is recorded next round."""
        done = Round()
        try:
            if batch:
                # Tests kill a worker here: the receiver has answered, nothing is recorded.
                failpoint("delivery.before_record")
            if held:
                extend_leases(held)
            results, claimed = run_round(
                batch,
                slots=slots,
                endpoint_limit=self.endpoint_limit,
                token=self.owner + secrets.token_hex(12),
                policy=self.policy,
                # Only an idle loop sleeps until the next retry; a busy one wakes as attempts end.
                next_due=running == 0,
            )
            db.session.commit()
            for (attempt, outcome), recorded in zip(batch, results, strict=True):
                if recorded is None:
                    done.deferred.append((attempt, outcome))
                else:
                    done.recorded.append((attempt, outcome, recorded))
            done.claimed, done.next_due_at = claimed.attempts, claimed.next_due_at
            if self._failing:
                log.info("webhook delivery rounds work again")
                self._failing = False
        except Exception as error:
            db.session.rollback()
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
            done.deferred = list(batch)  # not written: recorded next round
            done.failed = True
        return done

    # --- attempting -----------------------------------------------------------------------------

    def _start(self, attempt: Attempt) -> None:
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
                    "the signing secret cannot be decrypted (ENCRYPTION_KEY changed?); "
                    "rotate the endpoint's secret"
                )
            else:
                outcome = await self._transport.send_attempt(
                    url=attempt.url,
                    secret=current,
                    previous_secret=previous,
                    body=attempt.body,
                    event_name=attempt.event_name,
                    delivery_id=attempt.delivery_id,
                )
        except Exception as error:  # never lose track of a leased delivery
            log.exception("webhook attempt of %s failed unexpectedly", attempt.delivery_id)
            outcome = _not_sent(f"an error in the sender ({type(error).__name__})")
        finally:
            outcome = outcome or _not_sent("the worker stopped")
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


def _not_due_soon(next_due_at: datetime | None, within: float) -> bool:
    return next_due_at is None or (next_due_at - utcnow()).total_seconds() > within


def _not_sent(why: str) -> AttemptOutcome:
    return AttemptOutcome(
        requested_at=utcnow(), duration_ms=0, request_headers={}, error=f"Not sent: {why}"
    )


def _log_attempt(attempt: Attempt, outcome: AttemptOutcome, recorded: Recorded) -> None:
    # Successes are the bulk and live in the delivery log; failures are what operators watch.
    log.log(
        logging.DEBUG if outcome.succeeded and recorded.kept else logging.INFO,
        "webhook attempt delivery=%s endpoint=%s attempt=%d status=%s http=%s ms=%d%s",
        attempt.delivery_id,
        attempt.endpoint_id,
        attempt.attempt_number,
        recorded.status,
        outcome.http_status,
        outcome.duration_ms,
        "" if recorded.kept else " (discarded: another worker took the delivery)",
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


_delivery_loop: DeliveryLoop | None = None
_delivery_loop_lock = threading.Lock()


def start_delivery_loop(app: Flask) -> DeliveryLoop:
    """This process's delivery loop, started on first use."""
    global _delivery_loop  # one loop per worker process
    with _delivery_loop_lock:
        if _delivery_loop is None:
            _delivery_loop = DeliveryLoop(app)
        return _delivery_loop


def stop_delivery_loop(grace: float) -> None:
    global _delivery_loop
    with _delivery_loop_lock:
        loop, _delivery_loop = _delivery_loop, None
    if loop is not None:
        loop.stop(grace)


__all__ = ["LEASE", "DeliveryLoop", "start_delivery_loop", "stop_delivery_loop"]
