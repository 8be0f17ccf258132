"""Requests waiting for a brand's next event (the events API's `wait`), woken by this process's
one wake-up listener (services/wakeups.py) instead of each reading the database on a timer.

A waiter is a flag (a `threading.Event`) registered under its brand. The listener's thread calls
`BrandWaiters.wake` with the brands a NOTIFY named, which sets their waiters' flags and returns
at once; with None ("the listener reconnected, anything may have happened") it sets every
flag, and each waiter reads once more. While the listener is not listening (starting, or
reconnecting), wake-ups can be lost, so a waiter then reads again every
`UNHEARD_POLL_SECONDS` instead of trusting its flag alone.

Caps
----
A waiting request holds its gunicorn thread (gthread runs a request in one thread until it
returns), so waits are capped per process: `EVENT_WAITS_PER_PROCESS` in all, never more than half
the worker's threads (`limit_waits_to_threads`, from gunicorn.conf.py), `EVENT_WAITS_PER_KEY` of
one API key, and one brand's fair share however many keys it mints (`brand_share`: half the cap
while it waits alone, less as other brands wait too). A request is counted only once it is about
to sleep (`Waiter.admit`): past a cap it is answered at once with 429 `RATE_LIMITED` and
`Retry-After`, and the threads it would have held stay free for every other call. Retry-After is
the wait it asked for plus up to as much again at random: at least the wait, so that a refused
client loops no faster than one that was held, and spread, so that clients refused together (a
burst of a thousand) do not all come back together, again and again. Counted in the process
rather than in Redis: the threads are the process's, a count dies with its process, and waiting
costs no round trip.
"""

from __future__ import annotations

import math
import os
import secrets
import threading
from collections.abc import Hashable, Iterator
from contextlib import contextmanager

from flask import current_app

from observability.metrics import EVENT_WAITS, RATE_LIMITED
from services.errors import RateLimited
from services.wakeups import WakeupListener, listener_for

# While wake-ups cannot be heard, how often a waiter reads anyway.
UNHEARD_POLL_SECONDS = 1.0


def brand_share(per_process: int, other_brands: int) -> int:
    """How many of a process's `per_process` waits one brand may hold while `other_brands`
    brands hold some too: never all of them, so that a brand that holds none always finds room
    (keys are free to mint, so a per-key cap alone bounds nothing)."""
    return max(1, per_process // (other_brands + 2))


class WaitCounts:
    """This process's waiting requests, in all, per brand and per API key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0
        self._by_key: dict[str, int] = {}
        self._by_brand: dict[str, int] = {}

    def admit(
        self,
        brand_id: str,
        key_id: str,
        *,
        per_key: int,
        per_process: int,
        retry_after: int,
        count: bool = True,
    ) -> None:
        """Count one more waiting request of `key_id`, a key of `brand_id` (with `count` False,
        only say whether it would be refused).

        :raise RateLimited: the key, the brand or the process already has as many as its cap.
        """
        with self._lock:
            held = self._by_key.get(key_id, 0)
            brand_held = self._by_brand.get(brand_id, 0)
            others = len(self._by_brand) - (1 if brand_held else 0)
            share = brand_share(per_process, others)
            if held < per_key and brand_held < share and self._total < per_process:
                if not count:
                    return
                self._by_key[key_id] = held + 1
                self._by_brand[brand_id] = brand_held + 1
                self._total += 1
                EVENT_WAITS.inc()
                return
        if held >= per_key:
            limit = "event_waits_per_key"
            refused = (
                f"This API key already has {held} long-polls waiting on the server that took "
                "this request"
            )
        elif brand_held >= share:
            limit = "event_waits_per_brand"
            refused = (
                f"This brand already has {brand_held} long-polls waiting on the server that "
                "took this request, its share while other brands wait there too"
            )
        else:
            limit = "event_waits_per_process"
            refused = (
                "The server that took this request has as many long-polls waiting as it may "
                f"({per_process})"
            )
        RATE_LIMITED.labels(limit=limit).inc()
        raise RateLimited(
            retry_after=retry_after,
            message=f"{refused}; retry after {retry_after} seconds",
        )

    def release(self, brand_id: str, key_id: str) -> None:
        with self._lock:
            self._total -= 1
            EVENT_WAITS.dec()
            for counts, name in ((self._by_key, key_id), (self._by_brand, brand_id)):
                held = counts.pop(name) - 1
                if held:
                    counts[name] = held


class Waiter:
    """One waiting request's flag, and its place among the process's waits once admitted."""

    def __init__(
        self, listener: WakeupListener, brand_id: str, key_id: str, seconds: float
    ) -> None:
        self._flag = threading.Event()
        self._listener = listener
        self.stopping = False
        self.brand_id = brand_id
        self.key_id = key_id
        self.seconds = seconds
        self.admitted = False
        # While asleep: the read it found empty, with nothing held back (`refuse_if_caught_up`).
        self.caught_up_on: Hashable | None = None

    def admit(self) -> None:
        """The request is about to sleep: count it against the caps, once (the registry lets
        go of it when the wait ends).

        :raise RateLimited: past a cap; Retry-After is between the wait it asked for and twice
            that (see the module's doc).
        """
        if self.admitted:
            return
        _admit(self.brand_id, self.key_id, self.seconds, count=True)
        self.admitted = True

    def set(self) -> None:
        self._flag.set()

    def clear(self) -> None:
        self._flag.clear()

    def wait(self, timeout: float, caught_up_on: Hashable | None = None) -> bool:
        """Until woken or `timeout` seconds; True when woken. `caught_up_on`: the read it found
        empty, with nothing held back, for other requests to take as read meanwhile."""
        if not self._listener.wait_listening(0):
            timeout = min(timeout, UNHEARD_POLL_SECONDS)
        self.caught_up_on = caught_up_on
        try:
            return self._flag.wait(max(timeout, 0))
        finally:
            self.caught_up_on = None

    def heard_nothing(self) -> bool:
        return not self._flag.is_set()


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

    def caught_up(self, brand_id: str, reading: Hashable) -> bool:
        """Whether a waiter of the brand sleeps on `reading`, found empty, un-woken since."""
        if not self.listener.wait_listening(0):  # wake-ups may be lost: nothing is known
            return False
        with self._lock:
            return any(
                waiter.caught_up_on == reading and waiter.heard_nothing()
                for waiter in self._by_brand.get(brand_id, ())
            )

    def count(self) -> int:
        with self._lock:
            return sum(len(waiters) for waiters in self._by_brand.values())

    @contextmanager
    def waiting(self, brand_id: str, key_id: str, seconds: float) -> Iterator[Waiter]:
        waiter = Waiter(self.listener, brand_id, key_id, seconds)
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
            if waiter.admitted:
                _counts.release(brand_id, key_id)


_registries: dict[int, BrandWaiters] = {}
_registries_lock = threading.Lock()
_stopping = False
_counts = WaitCounts()
# Half the gunicorn worker's threads, when it runs requests in threads (gunicorn.conf.py).
_thread_cap: int | None = None


def limit_waits_to_threads(threads: int) -> None:
    """This process runs each request in one of `threads` threads: waits may hold at most half
    of them, whatever EVENT_WAITS_PER_PROCESS says, so that other calls always find one."""
    global _thread_cap
    _thread_cap = threads // 2


def wait_caps() -> tuple[int, int]:
    """(per API key, per process) for the current app, as this process runs it."""
    settings = current_app.extensions["settings"]
    per_process = settings.event_waits_per_process
    if _thread_cap is not None:
        per_process = min(per_process, _thread_cap)
    return settings.event_waits_per_key, per_process


def brand_waiters() -> BrandWaiters:
    """This process's registry for the current app's database, subscribed on first use."""
    listener = listener_for()
    with _registries_lock:
        registry = _registries.get(id(listener))
        if registry is None or registry.listener is not listener:
            registry = _registries[id(listener)] = BrandWaiters(listener)
        return registry


def wait_for_brand(brand_id: str, key_id: str, seconds: float):
    """A context in which a `Waiter` of `key_id` is woken when the brand publishes; it waits
    at most `seconds` in all, once `admit()` let it (see the module's doc)."""
    return brand_waiters().waiting(brand_id, key_id, seconds)


def refuse_if_caught_up(brand_id: str, key_id: str, seconds: float, reading: Hashable) -> None:
    """Before a long-poll's first read: when a waiter of the brand sleeps on the same `reading`
    and has heard of no event since it found it empty, this read would find nothing either (as
    far as the wake-ups tell, which every waiter trusts), so a request past a cap is refused now,
    unread. A flood of one brand's long-polls then costs its authentication and little more: no
    feed statement, no pooled connection.

    :raise RateLimited: as `Waiter.admit`.
    """
    if brand_waiters().caught_up(brand_id, reading):
        _admit(brand_id, key_id, seconds, count=False)


def _admit(brand_id: str, key_id: str, seconds: float, *, count: bool) -> None:
    per_key, per_process = wait_caps()
    wait = max(1, math.ceil(seconds))
    _counts.admit(
        brand_id,
        key_id,
        per_key=per_key,
        per_process=per_process,
        retry_after=wait + secrets.randbelow(wait + 1),
        count=count,
    )


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
    global _registries, _registries_lock, _stopping, _counts
    _registries = {}
    _registries_lock = threading.Lock()
    _stopping = False
    _counts = WaitCounts()


os.register_at_fork(after_in_child=_fresh_after_fork)
