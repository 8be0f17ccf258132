"""Requests waiting for a brand's next event (the events API's `wait`), woken by this process's
one wake-up listener (services/wakeups.py) instead of each reading the database on a timer.

A waiter is a flag (a `threading.Event`) registered under its brand. The listener's thread calls
`BrandWaiters.wake` with the brands a NOTIFY named, which sets their waiters' flags and returns
at once; with None ("the listener reconnected, anything may have happened") it sets every
flag, and each waiter reads once more. While the listener is not listening (starting, or
reconnecting), wake-ups can be lost, so a waiter then reads again every
`UNHEARD_POLL_SECONDS` instead of trusting its flag alone.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from services.wakeups import WakeupListener, listener_for

# While wake-ups cannot be heard, how often a waiter reads anyway.
UNHEARD_POLL_SECONDS = 1.0


class Waiter:
    """One waiting request's flag."""

    def __init__(self, listener: WakeupListener) -> None:
        self._flag = threading.Event()
        self._listener = listener
        self.stopping = False

    def set(self) -> None:
        self._flag.set()

    def clear(self) -> None:
        self._flag.clear()

    def wait(self, timeout: float) -> bool:
        """Until woken or `timeout` seconds; True when woken."""
        if not self._listener.wait_listening(0):
            timeout = min(timeout, UNHEARD_POLL_SECONDS)
        return self._flag.wait(max(timeout, 0))


class BrandWaiters:
    """This process's waiters by brand."""

    def __init__(self, listener: WakeupListener) -> None:
        self.listener = listener
        self._lock = threading.Lock()
        self._by_brand: dict[str, set[Waiter]] = {}
        self._stopping = _stopping
        listener.subscribe(self.wake)

    def wake(self, brand_ids: frozenset[str] | None) -> None:
        """The listener's callback: wake the brands' waiters (None: every waiter)."""
        with self._lock:
            if brand_ids is None:
                woken = [w for waiters in self._by_brand.values() for w in waiters]
            else:
                woken = [w for brand in brand_ids for w in self._by_brand.get(brand, ())]
        for waiter in woken:
            waiter.set()

    def stop_waiting(self) -> None:
        """The process is shutting down: every waiter, now and to come, answers at once with
        what it has rather than being cut off mid-wait."""
        with self._lock:
            self._stopping = True
            woken = [w for waiters in self._by_brand.values() for w in waiters]
        for waiter in woken:
            waiter.stopping = True
            waiter.set()

    def count(self) -> int:
        with self._lock:
            return sum(len(waiters) for waiters in self._by_brand.values())

    @contextmanager
    def waiting(self, brand_id: str) -> Iterator[Waiter]:
        waiter = Waiter(self.listener)
        with self._lock:
            waiter.stopping = self._stopping
            self._by_brand.setdefault(brand_id, set()).add(waiter)
        try:
            yield waiter
        finally:
            with self._lock:
                waiters = self._by_brand.get(brand_id)
                if waiters is not None:
                    waiters.discard(waiter)
                    if not waiters:
                        del self._by_brand[brand_id]


_registries: dict[int, BrandWaiters] = {}
_registries_lock = threading.Lock()
_stopping = False


def brand_waiters() -> BrandWaiters:
    """This process's registry for the current app's database, subscribed on first use."""
    listener = listener_for()
    with _registries_lock:
        registry = _registries.get(id(listener))
        if registry is None or registry.listener is not listener:
            registry = _registries[id(listener)] = BrandWaiters(listener)
        return registry


def wait_for_brand(brand_id: str):
    """A context in which a `Waiter` is woken when the brand publishes (see the module's doc)."""
    return brand_waiters().waiting(brand_id)


def stop_every_wait() -> None:
    """Answer every waiting request of this process now, and every later one without waiting
    (a gunicorn worker asked to stop: gunicorn.conf.py)."""
    global _stopping
    with _registries_lock:
        _stopping = True
        registries = list(_registries.values())
    for registry in registries:
        registry.stop_waiting()


def _fresh_after_fork() -> None:
    # A forked child has none of its parent's threads (the listener included): it starts empty.
    global _registries, _registries_lock, _stopping
    _registries = {}
    _registries_lock = threading.Lock()
    _stopping = False


os.register_at_fork(after_in_child=_fresh_after_fork)
