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
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class WorkSlots:
    def __init__(self, size: int) -> None:
        self.size = size
        self._free = threading.BoundedSemaphore(size)
        # Per request (a thread under gthread, a greenlet under gevent: gevent patches this).
        self._held = threading.local()

    def take(self) -> None:
        """Wait for a free slot; the current request holds it until `give_back`."""
        self._free.acquire()
        self._held.slot = True

    def give_back(self) -> None:
        """Free the current request's slot, if it holds one."""
        if getattr(self._held, "slot", False):
            self._held.slot = False
            self._free.release()

    @contextmanager
    def set_aside(self) -> Iterator[None]:
        """Hold no slot inside (a request about to wait), and one again after it."""
        held = getattr(self._held, "slot", False)
        if held:
            self.give_back()
        try:
            yield
        finally:
            if held:
                self.take()


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


def take() -> None:
    """Before a request runs: wait for a free slot."""
    slots = _current()
    if slots is not None:
        slots.take()


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
