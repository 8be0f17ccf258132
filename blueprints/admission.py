"""The front door: what a request must be before it takes anything other requests need.

Every request of a process shares its few work slots (services/work_slots.py) and its database
pool. Before issue 42 a request took its slot first and read its body and its caller after, so
16 clients each sending a body a byte at a time held every slot of every process, and a forger
queued in the lane of whichever brand its URL named. Now, in this order (`admit`, the app's
before_request after the request id):

1. The body is read whole within `BODY_DEADLINE_SECONDS` (up to a quarter more, at random),
   holding nothing but the request's own thread; one that does not arrive in time is answered
   408 `REQUEST_TIMEOUT`.
2. An API route's credential is checked (one indexed lookup in autocommit, on a connection
   given back at once: blueprints/api/auth.py, services/api_keys.py), so the request holds no
   pooled connection while it waits. A failure is answered at once (401, or 429 past
   the address's failures: CONTRACT 13.7) and takes no slot at all.
3. The request takes a work slot in its authenticated brand's lane; requests that name no brand
   (the dashboard, the docs) share one capped lane. Every wait is bounded (503, or 429 when the
   shared lane is full).

`/healthz` takes no slot: it touches nothing shared, and a load balancer must hear it whatever
the other requests do.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time

from flask import current_app, request
from werkzeug.exceptions import RequestTimeout

from blueprints.api.auth import authenticate_request, requirement_of
from extensions import db
from services import work_slots

# Long enough for the largest body (64 KiB) over a slow mobile link, short enough that a client
# trickling bytes holds its thread for seconds, not for as long as it likes.
BODY_DEADLINE_SECONDS = 10.0
# Requests that take no work slot.
UNQUEUED_ENDPOINTS = frozenset({"system.healthz"})


def admit() -> None:
    """The app's before_request: the body, then the caller, then a work slot (module doc)."""
    if request.endpoint in UNQUEUED_ENDPOINTS:
        return
    read_body_within_deadline(BODY_DEADLINE_SECONDS)
    lane = work_slots.SHARED_LANE
    view = current_app.view_functions.get(request.endpoint) if request.endpoint else None
    requirement = requirement_of(view)
    if _answered_by_flask():  # an OPTIONS Flask answers itself: the view never runs
        requirement = None
    if requirement is not None:
        lane = authenticate_request(requirement, (request.view_args or {})["brand_id"]).brand_id
        db.session.commit()  # a bootstrap token's lookup: its connection back before any wait
    work_slots.take(lane)


def _answered_by_flask() -> bool:
    rule = request.url_rule
    return request.method == "OPTIONS" and bool(getattr(rule, "provide_automatic_options", False))


def read_body_within_deadline(seconds: float) -> None:
    """Read the request's body into the request (Flask's `get_data` cache, which `get_json` and
    the form parser read from) within `seconds`.

    gunicorn reads a body only as the app asks for it, a recv() at a time with no deadline of its
    own. A watchdog thread ends the socket's reading side when the deadline passes (the blocked
    recv() returns at once, as at end of file); the answer still goes out on the writing side.

    :raise RequestTimeout: the body did not arrive in time (408).
    """
    has_body = (
        request.content_length or "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    )
    sock = request.environ.get("gunicorn.socket")
    if not has_body:
        return
    if sock is None:  # not under gunicorn (the test client): nothing slow to guard against
        request.get_data(cache=True)
        return
    watch = _watchdog().watch(sock, seconds)
    try:
        request.get_data(cache=True)
    except Exception:
        if _watchdog().release(watch):
            raise _late_body(seconds) from None
        raise
    if _watchdog().release(watch):
        raise _late_body(seconds)


def _late_body(seconds: float) -> RequestTimeout:
    return RequestTimeout(f"The request's body did not arrive within {seconds:g} seconds")


class _Watch:
    __slots__ = ("cut", "due", "sock")

    def __init__(self, due: float, sock: socket.socket) -> None:
        self.due = due
        self.sock = sock
        self.cut = False


class _ReadWatchdog:
    """One thread per process that cuts the reading side of sockets past their deadline."""

    # How often it looks: a deadline is kept to within this.
    TICK_SECONDS = 0.25

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: set[_Watch] = set()
        threading.Thread(target=self._run, name="body-deadlines", daemon=True).start()

    def watch(self, sock: socket.socket, seconds: float) -> _Watch:
        # At least `seconds`, and up to a quarter more at random: clients that arrived together
        # (a flood of slow bodies) are cut apart, so their 408s and the reconnections that
        # follow do not land on the process all at once, every deadline, again and again.
        spread = secrets.randbelow(int(seconds * 250) + 1) / 1000
        watch = _Watch(time.monotonic() + seconds + spread, sock)
        with self._lock:
            self._watches.add(watch)
        return watch

    def release(self, watch: _Watch) -> bool:
        """Stop watching; True when the deadline had passed and the socket was cut."""
        with self._lock:
            self._watches.discard(watch)
            return watch.cut

    def _run(self) -> None:
        while True:
            time.sleep(self.TICK_SECONDS)
            now = time.monotonic()
            with self._lock:
                late = [watch for watch in self._watches if watch.due <= now]
                for watch in late:
                    self._watches.discard(watch)
                    watch.cut = True
            for watch in late:
                with contextlib.suppress(OSError):  # the client went away meanwhile
                    watch.sock.shutdown(socket.SHUT_RD)


_watchdog_of_process: _ReadWatchdog | None = None
_watchdog_lock = threading.Lock()


def _watchdog() -> _ReadWatchdog:
    global _watchdog_of_process
    with _watchdog_lock:
        if _watchdog_of_process is None:
            _watchdog_of_process = _ReadWatchdog()
        return _watchdog_of_process


def _fresh_after_fork() -> None:
    # A forked worker has none of its parent's threads: it starts its own watchdog when needed.
    global _watchdog_of_process, _watchdog_lock
    _watchdog_of_process = None
    _watchdog_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_after_fork)
