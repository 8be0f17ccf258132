"""The delivery engine: one per worker process, many attempts in flight, and no endpoint waiting
on another's slow one (docs/webhooks.md, "The engine").

RQ says which endpoints have work (drain jobs, retry drains from its scheduler, the sweeper);
a job hands its endpoints to this process's engine and returns at once. The engine runs an
asyncio loop in a thread of its own, where every attempt in flight is a task on one aiohttp
session: a receiver that takes 200 ms, or never answers, costs a socket and a timer, not a
thread. The database work runs beside the loop on two threads with a connection each: one
claims, one records, each taking whatever has piled up since its last round in one go.

Fairness: endpoints that want a slot wait in one queue, in turn. Free slots go to the front of
the queue, and an endpoint comes back at its end each time an attempt of it ends, so a backlog
takes turns with a single event instead of going first. Isolation: an endpoint has at most its
slot limit in flight across all workers (`WEBHOOK_ENDPOINT_CONCURRENCY`, one while it keeps
failing), and after a failure in such a run it waits a cool-down before its next attempt: a
hanging receiver holds one slot of the process's `WEBHOOK_CONCURRENCY`. A healthy endpoint
with a backlog is claimed a few rounds ahead, so that its next attempts start as the last ones
end without a claim each.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from flask import Flask
from sqlalchemy.orm import Session

from extensions import db
from models.columns import utcnow
from models.webhook_delivery import DELIVERED
from observability.metrics import (
    ENDPOINTS_DISABLED_BY_SERVICE,
    count_attempt,
    count_backing_service_error,
)
from services.delivery_attempts import (
    AttemptOutcome,
    Claim,
    ClaimedDelivery,
    Recorded,
    RetryPolicy,
    claim_due_deliveries,
    record_attempt,
    release_deliveries,
    settle_delivered,
)
from services.endpoint_health import PROBING_AFTER_FAILURES, slot_limit
from services.endpoint_urls import UrlPolicy
from services.secret_box import InvalidToken, secret_box
from workers.dispatch import drain_requester
from workers.transport import Transport

log = logging.getLogger("brand_api.webhooks")

# Endpoints one claim statement serves at most.
CLAIM_ENDPOINTS_MAX = 200
# Rounds of an endpoint's attempts claimed ahead while it is healthy and has a backlog, as
# long as one claim statement leases about CLAIM_ROWS deliveries at most: a claim of many
# endpoints takes fewer of each, so that it stays short for the endpoints queued behind it.
ROUNDS_AHEAD = 8
CLAIM_ROWS = 256
# A claim or a record round that failed (the database unreachable) is tried again after this.
DATABASE_RETRY_SECONDS = 1.0
# An endpoint whose slots another worker holds, or is claiming, is looked at again after this.
HELD_ELSEWHERE_RECHECK_SECONDS = 0.5
# Threads for name lookups (getaddrinfo blocks); only attempts to a name use them.
LOOKUP_THREADS = 8
# A retry due further ahead than this is left to RQ's scheduler and the sweeper: the process
# may not live that long, and its timers would only pile up.
TIMER_HORIZON_SECONDS = 3600.0


@dataclass(frozen=True)
class SigningKeys:
    """An endpoint's signing secret and, during a rotation's overlap, the one before it."""

    current: str
    previous: str | None = None
    previous_until: datetime | None = None

    def previous_now(self) -> str | None:
        """The previous secret if its overlap has not ended (a delivery claimed ahead may be
        sent after the end)."""
        if self.previous is None or self.previous_until is None:
            return None
        return self.previous if self.previous_until > utcnow() else None


# A delivery claimed ahead, with the keys to sign it with.
Waiting = tuple[Claim, ClaimedDelivery, SigningKeys | None]


def attempt_time(timeout: float) -> timedelta:
    """The longest one attempt takes, with its record."""
    return timedelta(seconds=timeout + 2)


def attempt_lease(timeout: float) -> timedelta:
    """How long a delivery is held after its attempt may start: the attempt (at most the
    timeout) and its record, with room for a slow database. A worker killed mid-attempt frees
    its deliveries when this runs out."""
    return timedelta(seconds=2 * timeout + 5)


@dataclass
class _Endpoint:
    """What this process knows of one endpoint."""

    asking: int = 0  # slots a claim in progress may fill
    in_flight: int = 0  # attempts on the wire
    waiting: deque[Waiting] = field(default_factory=deque)  # claimed ahead, not started
    # Deliveries whose attempt is over and not recorded yet. Each still holds its slot: the
    # record may find the endpoint deleted or disabled, and the rest must then not be sent.
    finished: set[str] = field(default_factory=set)
    # Of those, the failed ones: until they are recorded (which may disable the endpoint or
    # open its breaker) nothing more of it starts.
    failures_unrecorded: int = 0
    wanting: bool = False  # may have due deliveries not claimed yet
    queued: bool = False  # in the queue for a slot
    failures: int = 0  # its run of failed attempts, as last seen
    not_before: float = 0.0  # loop time before which it gets no new attempt (a cool-down)
    timer: asyncio.TimerHandle | None = None
    timer_at: float = math.inf
    woken_by: str | None = None  # the RQ job that last asked for it, for the attempts' logs

    @property
    def held(self) -> bool:
        return bool(self.asking or self.in_flight or self.waiting or self.finished)


@dataclass
class _Lane:
    """Attempts waiting for one of the recording threads, recorded a batch at a time."""

    executor: ThreadPoolExecutor
    record: Callable[[list], list[Recorded | None]]
    waiting: list = field(default_factory=list)
    running: bool = False


class DeliveryEngine:
    def __init__(self, app: Flask) -> None:
        settings = app.extensions["settings"]
        self.app = app
        self.concurrency = settings.webhook_concurrency
        self.endpoint_limit = settings.webhook_endpoint_concurrency
        self.timeout = settings.webhook_timeout
        self.policy = RetryPolicy.from_settings(settings)
        # Begins every lease this process takes: a claim tells its own leases from others'.
        self.owner = secrets.token_hex(4)
        self._endpoints: dict[str, _Endpoint] = {}
        self._ready: deque[str] = deque()
        self._in_flight = 0  # attempts on the wire
        self._asked = 0  # slots the claims to be made and in progress may fill
        self._to_claim: dict[str, int] = {}
        self._claiming = False
        self._stopping = False
        self._tasks: set[asyncio.Task] = set()
        self._claims = ThreadPoolExecutor(1, "delivery-claims", initializer=self._enter_app)
        self._delivered = _Lane(
            # Its one statement is a transaction by itself: no BEGIN and COMMIT round trips.
            ThreadPoolExecutor(
                1, "delivery-successes", initializer=self._enter_app, initargs=(True,)
            ),
            self._record_delivered,
        )
        self._others = _Lane(
            ThreadPoolExecutor(1, "delivery-records", initializer=self._enter_app),
            self._record_others,
        )
        self._lookups = ThreadPoolExecutor(LOOKUP_THREADS, "delivery-lookups")
        self._loop = asyncio.new_event_loop()
        self._transport: Transport | None = None
        url_policy = UrlPolicy.for_environment(settings.app_env)
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(url_policy, started), name="delivery-engine", daemon=True
        )
        self._thread.start()
        started.wait()

    # --- what the worker's threads call ---------------------------------------------------------

    def wake(self, endpoint_ids: list[str], job_id: str | None = None) -> None:
        """These endpoints may have due deliveries (RQ job `job_id` says so)."""
        self._loop.call_soon_threadsafe(self._wake, list(endpoint_ids), job_id)

    def idle(self) -> bool:
        """Nothing in flight, claimed, waiting or being recorded, and no retry due within a
        second (a burst worker's test for "done")."""
        return asyncio.run_coroutine_threadsafe(self._is_idle(), self._loop).result(10)

    def stop(self, grace: float) -> None:
        """Start nothing more; wait up to `grace` for the attempts in flight (each over within
        the timeout) and their records, and give back what was claimed and not started."""
        future = asyncio.run_coroutine_threadsafe(self._stop(grace), self._loop)
        try:
            future.result(grace + 10)
        except TimeoutError:
            log.warning("the delivery engine did not stop in time; its leases lapse")
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        for executor in (
            self._claims,
            self._delivered.executor,
            self._others.executor,
            self._lookups,
        ):
            executor.shutdown(wait=False, cancel_futures=True)

    # --- the loop ---------------------------------------------------------------------------------

    def _run(self, url_policy: UrlPolicy, started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._transport = self._loop.run_until_complete(self._open_transport(url_policy))
        started.set()
        self._loop.run_forever()

    async def _open_transport(self, url_policy: UrlPolicy) -> Transport:
        return Transport(policy=url_policy, timeout=self.timeout, lookups=self._lookups)

    def _enter_app(self, autocommit: bool = False) -> None:
        """Each database thread keeps an app context and a session on a connection of its own
        for its life: no pool checkout, and so no pre-ping round trip, per transaction. A lost
        connection is replaced on the next use after the failed transaction's rollback."""
        self.app.app_context().push()
        connection = db.engine.connect()
        if autocommit:
            connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        db.session.registry.set(Session(bind=connection))

    def _spawn(self, coroutine) -> None:
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _state(self, endpoint_id: str) -> _Endpoint:
        state = self._endpoints.get(endpoint_id)
        if state is None:
            state = self._endpoints[endpoint_id] = _Endpoint()
        return state

    def _wake(self, endpoint_ids: list[str], job_id: str | None = None) -> None:
        for endpoint_id in endpoint_ids:
            state = self._state(endpoint_id)
            state.wanting = True
            state.woken_by = job_id or state.woken_by
            self._queue(endpoint_id, state)
        self._dispatch()

    def _free_slots(self) -> int:
        return self.concurrency - self._in_flight - self._asked

    def _endpoint_slots(self, state: _Endpoint) -> int:
        limit = slot_limit(state.failures, self.endpoint_limit)
        return limit - state.in_flight - state.asking - len(state.finished)

    def _queue(self, endpoint_id: str, state: _Endpoint) -> None:
        """To the back of the queue for a slot, if it has work and a slot of its own free; an
        endpoint in a cool-down is woken when it ends."""
        if state.queued or self._stopping or state.failures_unrecorded:
            return
        if not (state.waiting or state.wanting) or self._endpoint_slots(state) <= 0:
            return  # back when it is woken, or when an attempt of it ends
        if state.not_before > self._loop.time():
            self._wake_at(endpoint_id, state, state.not_before)
            return
        state.queued = True
        self._ready.append(endpoint_id)

    def _dispatch(self) -> None:
        """Free slots to the endpoints at the front of the queue: a delivery claimed ahead
        starts at once, the others are claimed (several endpoints in one statement)."""
        while self._ready and self._free_slots() > 0 and not self._stopping:
            endpoint_id = self._ready.popleft()
            state = self._endpoints[endpoint_id]
            state.queued = False
            slots = min(self._endpoint_slots(state), self._free_slots())
            if slots <= 0:
                continue
            if state.waiting:
                for _ in range(min(slots, len(state.waiting))):
                    self._start(state, *state.waiting.popleft())
                self._queue(endpoint_id, state)  # more waiting than slots: back in turn
            elif len(self._to_claim) < CLAIM_ENDPOINTS_MAX:
                self._to_claim[endpoint_id] = slots
                state.asking += slots
                self._asked += slots
            else:
                self._ready.appendleft(endpoint_id)
                state.queued = True
                break
        if self._to_claim and not self._claiming:
            self._claiming = True
            asked, self._to_claim = self._to_claim, {}
            self._spawn(self._claim(asked))

    # --- claiming -------------------------------------------------------------------------------

    async def _claim(self, asked: dict[str, int]) -> None:
        try:
            claimed = await self._loop.run_in_executor(self._claims, self._claim_in_db, asked)
        except Exception:
            count_backing_service_error("database", "worker")
            log.exception("claiming webhook deliveries failed; trying again shortly")
            claimed = None
        self._asked -= sum(asked.values())
        retry_at = self._loop.time() + DATABASE_RETRY_SECONDS
        for endpoint_id, slots in asked.items():
            state = self._endpoints[endpoint_id]
            state.asking -= slots
            if claimed is None:
                self._wake_at(endpoint_id, state, retry_at)
            else:
                self._take(state, *claimed[endpoint_id], slots)
        self._claiming = False
        self._dispatch()

    def _claim_in_db(self, asked: dict[str, int]) -> dict[str, tuple[Claim, SigningKeys | None]]:
        try:
            claims = claim_due_deliveries(
                asked,
                endpoint_limit=self.endpoint_limit,
                lease=attempt_lease(self.timeout),
                now=utcnow(),
                owner=self.owner,
                ahead=max(
                    0,
                    min(
                        self.endpoint_limit * ROUNDS_AHEAD,
                        CLAIM_ROWS // len(asked) - self.endpoint_limit,
                    ),
                ),
                attempt_time=attempt_time(self.timeout),
            )
        except Exception:
            db.session.rollback()
            raise
        return {
            endpoint_id: (claim, _signing_keys(claim) if claim.deliveries else None)
            for endpoint_id, claim in claims.items()
        }

    def _take(self, state: _Endpoint, claim: Claim, keys: SigningKeys | None, asked: int) -> None:
        endpoint_id = claim.endpoint_id
        if not claim.open:
            state.wanting = False
            self._forget_if_idle(endpoint_id, state)
            return
        now = self._loop.time()
        if claim.busy:
            self._wake_at(endpoint_id, state, now + HELD_ELSEWHERE_RECHECK_SECONDS)
            return
        state.failures = claim.consecutive_failures
        for index, delivery in enumerate(claim.deliveries):
            if self._stopping:
                self._give_back(state, claim, delivery)
            elif index < claim.room:
                self._start(state, claim, delivery, keys)
            else:
                state.waiting.append((claim, delivery, keys))
        if self._stopping:
            return
        state.wanting = claim.more_due
        if claim.more_due:
            if claim.room == asked or state.waiting:
                self._queue(endpoint_id, state)  # the process's slots were short: back in turn
            elif not (state.in_flight or state.finished):
                # Its slots are held by other workers: they go on with it, and if they stop
                # this process looks again.
                self._wake_at(endpoint_id, state, now + HELD_ELSEWHERE_RECHECK_SECONDS)
            # else: back in turn when an attempt of it here is recorded
        elif claim.next_due_at is not None:
            self._wake_at_time(endpoint_id, state, claim.next_due_at)
        self._forget_if_idle(endpoint_id, state)

    # --- attempting -----------------------------------------------------------------------------

    def _start(
        self, state: _Endpoint, claim: Claim, delivery: ClaimedDelivery, keys: SigningKeys | None
    ) -> None:
        state.in_flight += 1
        self._in_flight += 1
        self._spawn(self._attempt(state, claim, delivery, keys))

    async def _attempt(
        self, state: _Endpoint, claim: Claim, delivery: ClaimedDelivery, keys: SigningKeys | None
    ) -> None:
        outcome = None
        try:
            if (delivery.leased_until - utcnow()).total_seconds() < self.timeout + 1:
                pass  # the lease might not outlast it (a slow claim): given back unattempted
            elif keys is None:
                outcome = AttemptOutcome(
                    requested_at=utcnow(),
                    duration_ms=0,
                    request_headers={},
                    error="Not sent: the signing secret cannot be decrypted (ENCRYPTION_KEY "
                    "changed?); rotate the endpoint's secret",
                )
            else:
                outcome = await self._transport.send_attempt(
                    url=claim.url,
                    secret=keys.current,
                    previous_secret=keys.previous_now(),
                    body=delivery.body,
                    event_name=delivery.event_name,
                    delivery_id=delivery.id,
                )
        except Exception as error:  # never lose track of a claimed delivery
            log.exception("webhook attempt of delivery %s failed unexpectedly", delivery.id)
            outcome = AttemptOutcome(
                requested_at=utcnow(),
                duration_ms=0,
                request_headers={},
                error=f"Not sent: an error in the sender ({type(error).__name__})",
            )
        finally:
            self._in_flight -= 1
            state.in_flight -= 1
            if outcome is not None and not outcome.succeeded:
                state.failures_unrecorded += 1
            self._finish(state, claim, delivery, outcome)
            self._dispatch()  # a slot of the process is free

    def _give_back(self, state: _Endpoint, claim: Claim, delivery: ClaimedDelivery, *_) -> None:
        self._finish(state, claim, delivery, None)

    def _finish(self, state, claim, delivery, outcome: AttemptOutcome | None) -> None:
        """Attempted (or, without an outcome, given back unattempted): to be recorded. A plain
        success goes to the lane that settles them a batch per statement; anything else to the
        lane that records one per transaction, so that a burst of failures (each counted
        against its endpoint, perhaps disabling it) never holds up the healthy endpoints."""
        state.finished.add(delivery.id)
        if outcome is not None:
            count_attempt(outcome.kind, outcome.duration_ms / 1000)
        self._to_record(
            self._delivered if outcome and outcome.succeeded else self._others,
            claim,
            delivery,
            outcome,
        )

    def _to_record(self, lane: _Lane, claim, delivery, outcome) -> None:
        lane.waiting.append((claim, delivery, outcome))
        if not lane.running:
            lane.running = True
            self._spawn(self._record(lane))

    # --- recording ------------------------------------------------------------------------------

    async def _record(self, lane: _Lane) -> None:
        while lane.waiting:
            batch, lane.waiting = lane.waiting, []
            try:
                recorded = await self._loop.run_in_executor(lane.executor, lane.record, batch)
            except Exception:
                count_backing_service_error("database", "worker")
                log.exception("recording webhook attempts failed; trying again shortly")
                # Recorded later while their leases last; past that, whoever claims them next
                # attempts them again (at least once).
                now = utcnow()
                for claim, delivery, outcome in batch:
                    if delivery.leased_until <= now:
                        self._settle(claim, delivery, outcome, None)
                held = [item for item in batch if item[1].leased_until > now]
                lane.waiting = held + lane.waiting
                await asyncio.sleep(DATABASE_RETRY_SECONDS)
                continue
            for item, result in zip(batch, recorded, strict=True):
                if result is None and lane is self._delivered:
                    self._to_record(self._others, *item)  # not plain after all
                else:
                    self._settle(*item, result)
            self._dispatch()
        lane.running = False

    def _record_delivered(self, batch) -> list[Recorded | None]:
        """Settle plain successes in one statement; None for each that was not (to be
        recorded by the other lane: no longer held, its endpoint closed, or failures of it to
        reset)."""
        try:
            settled = settle_delivered(batch, now=utcnow())
        except Exception:
            db.session.rollback()
            raise
        return [Recorded(status=DELIVERED) if item[1].id in settled else None for item in batch]

    def _record_others(self, batch) -> list[Recorded | None]:
        """Record each attempt in a transaction of its own, and give back those not attempted
        (None for them)."""
        results: list[Recorded | None] = []
        unattempted: dict[int, tuple[Claim, list[str]]] = {}
        try:
            for claim, delivery, outcome in batch:
                if outcome is None:
                    unattempted.setdefault(id(claim), (claim, []))[1].append(delivery.id)
                    results.append(None)
                    continue
                result = record_attempt(claim, delivery, outcome, policy=self.policy, now=utcnow())
                results.append(result)
                # Read across threads: the state outlives this record (its slot is held).
                state = self._endpoints.get(claim.endpoint_id)
                _log_attempt(claim, delivery, outcome, result, state.woken_by if state else None)
                if result.retry_at is not None:
                    # If this process is gone by then, RQ's scheduler wakes another worker.
                    drain_requester().add_later(self.app, claim.endpoint_id, result.retry_at)
            for claim, delivery_ids in unattempted.values():
                release_deliveries(claim, delivery_ids)
        except Exception:
            db.session.rollback()
            raise
        return results

    def _settle(
        self,
        claim: Claim,
        delivery: ClaimedDelivery,
        outcome: AttemptOutcome | None,
        result: Recorded | None,
    ) -> None:
        endpoint_id = claim.endpoint_id
        state = self._state(endpoint_id)
        state.finished.discard(delivery.id)
        if outcome is not None and not outcome.succeeded:
            state.failures_unrecorded -= 1
        if result is not None:
            if result.kept:
                state.failures = result.consecutive_failures
                if not outcome.succeeded and state.failures >= PROBING_AFTER_FAILURES:
                    # A failing receiver is probed with growing pauses, at most the timeout.
                    pause = min(self.timeout, 2.0 ** (state.failures - PROBING_AFTER_FAILURES))
                    state.not_before = self._loop.time() + pause
            if not result.endpoint_open:
                # Its pending deliveries were failed with it, those waiting here included.
                state.wanting = False
                while state.waiting:
                    self._give_back(state, *state.waiting.popleft())
            elif result.retry_at is not None:
                self._wake_at_time(endpoint_id, state, result.retry_at)
        self._queue(endpoint_id, state)
        self._forget_if_idle(endpoint_id, state)

    # --- timers ---------------------------------------------------------------------------------

    def _wake_at_time(self, endpoint_id: str, state: _Endpoint, at: datetime) -> None:
        delay = (at - utcnow()).total_seconds()
        if delay <= TIMER_HORIZON_SECONDS:
            self._wake_at(endpoint_id, state, self._loop.time() + max(delay, 0.0))

    def _wake_at(self, endpoint_id: str, state: _Endpoint, when: float) -> None:
        """Wake the endpoint at loop time `when`, unless it is woken sooner already."""
        if state.timer is not None:
            if state.timer_at <= when:
                return
            state.timer.cancel()
        state.timer_at = when
        state.timer = self._loop.call_at(when, self._timer_fired, endpoint_id)

    def _timer_fired(self, endpoint_id: str) -> None:
        state = self._state(endpoint_id)
        state.timer, state.timer_at = None, math.inf
        self._wake([endpoint_id])

    def _forget_if_idle(self, endpoint_id: str, state: _Endpoint) -> None:
        # An endpoint in a cool-down is remembered until it ends; its failure count is read
        # again at its next claim.
        cooling = state.not_before > self._loop.time()
        busy = state.held or state.wanting or state.queued or state.timer or cooling
        if not busy or (self._stopping and not state.held):
            if state.timer is not None:
                state.timer.cancel()
            self._endpoints.pop(endpoint_id, None)

    # --- idle and stop --------------------------------------------------------------------------

    def _recording(self) -> bool:
        return any(lane.waiting or lane.running for lane in (self._delivered, self._others))

    async def _is_idle(self) -> bool:
        soon = self._loop.time() + 1
        return not (
            self._in_flight
            or self._asked
            or self._recording()
            or self._claiming
            or self._ready
            or any(state.held or state.timer_at < soon for state in self._endpoints.values())
        )

    async def _stop(self, grace: float) -> None:
        self._stopping = True
        self._ready.clear()
        for endpoint_id, slots in self._to_claim.items():
            self._endpoints[endpoint_id].asking -= slots
            self._asked -= slots
        self._to_claim = {}
        for state in self._endpoints.values():
            while state.waiting:
                self._give_back(state, *state.waiting.popleft())
        deadline = self._loop.time() + grace
        while self._in_flight or self._asked or self._recording():
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                break
            await asyncio.sleep(min(remaining, 0.05))
        if self._in_flight:
            log.warning(
                "stopping with %d attempt(s) still in flight; their leases lapse",
                self._in_flight,
            )
        for state in self._endpoints.values():
            if state.timer is not None:
                state.timer.cancel()
        await self._transport.close()


def _signing_keys(claim: Claim) -> SigningKeys | None:
    box = secret_box()
    try:
        current = box.decrypt(claim.secret_ciphertext)
    except InvalidToken:
        log.error("signing secret of endpoint %s cannot be decrypted", claim.endpoint_id)
        return None
    previous = None
    if claim.previous_secret_ciphertext is not None:
        try:
            previous = box.decrypt(claim.previous_secret_ciphertext)
        except InvalidToken:  # the current one still signs
            log.error("previous secret of endpoint %s cannot be decrypted", claim.endpoint_id)
    return SigningKeys(current, previous, claim.previous_secret_expires_at)


def _log_attempt(
    claim, delivery, outcome: AttemptOutcome, recorded: Recorded, job_id: str | None
) -> None:
    # Successes are the bulk and live in the delivery log; failures are what operators watch.
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
        extra={
            "job_id": job_id,
            "delivery_id": delivery.id,
            "endpoint_id": claim.endpoint_id,
            "event_name": delivery.event_name,
            "attempt": delivery.attempt_number,
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
            claim.endpoint_id,
            outcome.error,
            extra={"endpoint_id": claim.endpoint_id},
        )


_engine: DeliveryEngine | None = None
_engine_lock = threading.Lock()


def engine_for(app: Flask) -> DeliveryEngine:
    """This process's engine, started on first use."""
    global _engine  # one engine per worker process
    with _engine_lock:
        if _engine is None:
            _engine = DeliveryEngine(app)
        return _engine


def stop_engine(grace: float) -> None:
    global _engine
    with _engine_lock:
        engine, _engine = _engine, None
    if engine is not None:
        engine.stop(grace)
