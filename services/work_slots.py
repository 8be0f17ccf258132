"""Work slots: how many requests of one process do work at the same time, whatever the number
of requests it holds open.

A gunicorn worker holds many requests at once so that long-polls of the events API can wait
(services/event_feed.py) without keeping other requests out. Those waiting requests do nothing;
the ones doing work share the process's CPU and its database pool, one pooled connection each.
So every request takes a slot before it runs and gives it back at its end, and a long-poll gives
its slot back while it waits (`set_aside`).

A request takes its slot only once it has arrived whole and its caller is known
(blueprints/admission.py): a slow client holds a thread, never a slot. No wait is unbounded: a
request that waits `SLOT_WAIT_SECONDS` for its slot is answered 503 with `Retry-After`, and the
lane of requests that name no brand (the dashboard, the docs) holds at most
`SHARED_LANE_WAITING` waiting requests: one more is answered 429 at once.

`WORK_SLOTS_PER_PROCESS` (app.py) is what the worker's threads were before long-polls: the figure
the postback benchmark chose (docs/benchmarks.md), well under half the pool.

Requests waiting for a slot queue in lanes, one per authenticated brand, and a freed slot goes
to the next lane in turn (round robin), handed over directly so that no newcomer takes it first.
One brand's burst (a thousand long-polls refused and retried, a backfill of postbacks) then
lengthens only its own lane: another brand's call waits for one slot to come free, not for the
whole burst ahead of it (docs/benchmarks.md, "A lane per brand at the work slots"; why the
lanes stay: docs/decisions.md, "Admission").
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from services.errors import RateLimited, ServiceUnavailable

# Requests that name no brand (the dashboard's pages, the docs) share a lane.
SHARED_LANE = ""
# How long a request may wait for its slot before it is answered 503; a second is plenty to come
# back after, as a slot frees every few milliseconds when the process is healthy.
SLOT_WAIT_SECONDS = 10.0
SLOT_RETRY_AFTER_SECONDS = 1
# Requests waiting in the shared lane at once, per process: nothing authenticated them, so they
# may not pile up (a flood of sign-in forms).
SHARED_LANE_WAITING = 32


class WorkSlots:
    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._free = size
        # Each lane's waiting requests, oldest first; the dict's order is the turn order.
        self._lanes: dict[str, deque[threading.Event]] = {}
        # Per request (a thread under gthread, a greenlet under gevent: gevent patches this).
        self._held = threading.local()

    def take(
        self,
        lane: str = SHARED_LANE,
        *,
        timeout: float | None = None,
        lane_cap: int | None = None,
    ) -> None:
        """Wait for a free slot, in `lane`'s turn; the current request holds it until
        `give_back`.

        :raise RateLimited: `lane` already has `lane_cap` requests waiting.
        :raise ServiceUnavailable: no slot came within `timeout` seconds.
        """
        with self._lock:
            if self._free and not self._lanes:
                self._free -= 1
                turn = None
            else:
                waiting = self._lanes.get(lane)
                if lane_cap is not None and waiting is not None and len(waiting) >= lane_cap:
                    raise RateLimited(
                        retry_after=SLOT_RETRY_AFTER_SECONDS,
                        message="This server has as many unauthenticated requests waiting as it "
                        f"takes; retry after {SLOT_RETRY_AFTER_SECONDS} second",
                    )
                turn = threading.Event()
                self._lanes.setdefault(lane, deque()).append(turn)
        if turn is not None and not turn.wait(timeout):
            self._leave(lane, turn)
        self._held.slot = True
        self._held.lane = lane

    def _leave(self, lane: str, turn: threading.Event) -> None:
        """A wait timed out: out of its lane, unless give_back handed it the slot meanwhile.

        :raise ServiceUnavailable: it left without a slot.
        """
        with self._lock:
            waiting = self._lanes.get(lane)
            if waiting is not None and turn in waiting:
                waiting.remove(turn)
                if not waiting:
                    del self._lanes[lane]
                raise ServiceUnavailable(
                    f"This server is busy; retry after {SLOT_RETRY_AFTER_SECONDS} second",
                    retry_after=SLOT_RETRY_AFTER_SECONDS,
                )
        # Not in its lane any more: give_back handed it the slot just as it timed out.

    def give_back(self) -> None:
        """Free the current request's slot, if it holds one: to the next lane's oldest waiting
        request, or to the free ones."""
        if not getattr(self._held, "slot", False):
            return
        self._held.slot = False
        with self._lock:
            if not self._lanes:
                self._free += 1
                return
            lane = next(iter(self._lanes))
            waiting = self._lanes.pop(lane)
            turn = waiting.popleft()
            if waiting:
                self._lanes[lane] = waiting  # to the back of the turn order
        turn.set()

    def waiting(self) -> int:
        with self._lock:
            return sum(len(turns) for turns in self._lanes.values())

    @contextmanager
    def set_aside(self) -> Iterator[None]:
        """Hold no slot inside (a request about to wait), and one again after it, in its lane."""
        held = getattr(self._held, "slot", False)
        lane = getattr(self._held, "lane", SHARED_LANE)
        if held:
            self.give_back()
        try:
            yield
        finally:
            if held:
                self.take(lane, timeout=SLOT_WAIT_SECONDS)


_size: int | None = None
_slots: WorkSlots | None = None


def install(size: int) -> None:
    """Every request of this process takes one of `size` slots (app.py). One set per process,
    whatever apps it builds: they share its pool's limits."""
    global _size, _slots
    if _size != size:
        _size, _slots = size, None


def _current() -> WorkSlots | None:
    global _slots
    if _slots is None and _size is not None:
        _slots = WorkSlots(_size)
    return _slots


def take(lane: str = SHARED_LANE) -> None:
    """Before a request runs: wait for a free slot, in `lane`'s turn (the authenticated brand,
    blueprints/admission.py), at most `SLOT_WAIT_SECONDS`; the shared lane is capped.

    :raise RateLimited: the shared lane is full.
    :raise ServiceUnavailable: no slot within `SLOT_WAIT_SECONDS`.
    """
    slots = _current()
    if slots is not None:
        cap = SHARED_LANE_WAITING if lane == SHARED_LANE else None
        slots.take(lane, timeout=SLOT_WAIT_SECONDS, lane_cap=cap)


def give_back(_error: BaseException | None = None) -> None:
    """At a request's end, whatever happened."""
    slots = _current()
    if slots is not None:
        slots.give_back()


@contextmanager
def set_aside() -> Iterator[None]:
    """The current request waits: it holds no work slot meanwhile (no-op when none is held)."""
    slots = _current()
    if slots is None:
        yield
        return
    with slots.set_aside():
        yield


def _fresh_after_fork() -> None:
    # A forked worker starts with every slot free, whoever held them in its parent.
    global _slots
    _slots = None


os.register_at_fork(after_in_child=_fresh_after_fork)
