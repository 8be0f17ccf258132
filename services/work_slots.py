"""Work slots: how many requests of one process do work at the same time, whatever the number
of requests it holds open.

A gunicorn worker holds many requests at once so that long-polls of the events API can wait
(services/event_feed.py) without keeping other requests out. Those waiting requests do nothing;
the ones doing work share the process's CPU and its database pool, and each may need two of
the pool's connections at once (its session's, and the short one that stamps its API key's
`lastUsedAt`). Unbounded, a burst of requests takes every pooled connection for its sessions and
then waits forever for the second one. So every request takes a slot before it runs and gives it
back at its end, and a long-poll gives its slot back while it waits (`set_aside`).

`WORK_SLOTS_PER_PROCESS` (app.py) is what the worker's threads were before long-polls: the figure
the postback benchmark chose (docs/benchmarks.md), well under half the pool.

Requests waiting for a slot queue in lanes, one per brand the route names, and a freed slot goes
to the next lane in turn (round robin), handed over directly so that no newcomer takes it first.
One brand's burst (a thousand long-polls refused and retried, a backfill of postbacks) then
lengthens only its own lane: another brand's call waits for one slot to come free, not for the
whole burst ahead of it (docs/benchmarks.md, "A lane per brand at the work slots").
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

# Requests that name no brand (the dashboard's pages, the docs, health checks) share a lane.
SHARED_LANE = ""


class WorkSlots:
    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._free = size
        # Each lane's waiting requests, oldest first; the dict's order is the turn order.
        self._lanes: dict[str, deque[threading.Event]] = {}
        # Per request (a thread under gthread, a greenlet under gevent: gevent patches this).
        self._held = threading.local()

    def take(self, lane: str = SHARED_LANE) -> None:
        """Wait for a free slot, in `lane`'s turn; the current request holds it until
        `give_back`."""
        with self._lock:
            if self._free and not self._lanes:
                self._free -= 1
                turn = None
            else:
                turn = threading.Event()
                self._lanes.setdefault(lane, deque()).append(turn)
        if turn is not None:
            turn.wait()  # give_back handed this request its slot
        self._held.slot = True
        self._held.lane = lane

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
                self.take(lane)


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
    """Before a request runs: wait for a free slot, in `lane`'s turn (app.py: the brand its
    route names)."""
    slots = _current()
    if slots is not None:
        slots.take(lane)


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
