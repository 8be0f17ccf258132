"""Work slots (services/work_slots.py): a gunicorn worker holds many requests open but runs only
a few doing work at once, so that a burst never takes the whole database pool and long-polls
waiting never keep other requests out."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from services.errors import RateLimited, ServiceUnavailable
from services.work_slots import WorkSlots
from tests.server_process import ServerProcess


def test_a_burst_of_first_requests_from_new_keys_is_answered_not_deadlocked(
    app_environ, brand, make_key
):
    """Each key's first request stamps its `lastUsedAt` on a second connection while its
    session holds the first: 60 at once on a pool of 20, unbounded, waited out the pool's 30 s
    timeout and failed."""
    keys = [make_key(brand, scopes=("read",), name=f"burst {n}") for n in range(60)]
    server = ServerProcess(app_environ, workers=1, threads=None, worker_class=None)
    try:
        url = f"{server.url}/api/v1/brand/{brand}/workspace"

        def call(key: str) -> int:
            return requests.get(url, headers={"X-Api-Key": key}, timeout=60).status_code

        started = time.monotonic()
        with ThreadPoolExecutor(60) as pool:
            statuses = list(pool.map(call, keys))
        assert statuses == [200] * 60
        assert time.monotonic() - started < 20
    finally:
        server.stop()


def test_a_request_setting_its_slot_aside_lets_another_take_it():
    slots = WorkSlots(1)
    slots.take()
    other_ran = threading.Event()

    def other() -> None:
        slots.take()
        other_ran.set()
        slots.give_back()

    thread = threading.Thread(target=other)
    thread.start()
    assert not other_ran.wait(0.2)  # the one slot is held
    with slots.set_aside():
        assert other_ran.wait(5)
    thread.join(5)
    slots.give_back()
    slots.give_back()  # giving back twice frees one slot once
    slots.take()
    assert not _taken_within(slots, 0.2)  # the one slot is held again


def _taken_within(slots: WorkSlots, seconds: float) -> bool:
    taken = threading.Event()

    def take() -> None:
        slots.take()
        taken.set()

    threading.Thread(target=take, daemon=True).start()
    return taken.wait(seconds)


def test_a_brands_burst_queues_in_its_own_lane_and_another_brand_goes_next():
    """One brand's 20 queued requests (a flood of refused long-polls) and then one call of
    another brand: the other brand's call runs as soon as a slot frees, not after the 20."""
    slots = WorkSlots(1)
    slots.take()
    order: list[str] = []
    lock = threading.Lock()

    def request(lane: str, name: str) -> None:
        slots.take(lane)
        with lock:
            order.append(name)
        slots.give_back()

    threads = []

    def queue(lane: str, name: str) -> None:
        threads.append(threading.Thread(target=request, args=(lane, name)))
        threads[-1].start()
        while slots.waiting() < len(threads):  # queued, in this order
            time.sleep(0.005)

    for number in range(20):
        queue("brd_flood", f"flood {number}")
    queue("brd_neighbour", "neighbour")
    slots.give_back()
    for thread in threads:
        thread.join(5)
    assert len(order) == 21
    assert order.index("neighbour") == 1  # after the flood's oldest, before its 19 others
    # Within a lane, first come first served.
    assert [name for name in order if name != "neighbour"] == [f"flood {n}" for n in range(20)]


def test_a_wait_for_a_slot_is_bounded_and_the_shared_lane_capped():
    """Past its timeout a waiting request leaves its lane with 503 (the slot it never got is not
    lost), and a full lane refuses one more at once with 429."""
    slots = WorkSlots(1)
    slots.take()
    with pytest.raises(ServiceUnavailable) as busy:
        slots.take("brd_waiting", timeout=0.1)
    assert busy.value.retry_after == 1
    assert slots.waiting() == 0

    first = threading.Thread(target=_take_and_give_back, args=(slots, "shared"), daemon=True)
    first.start()
    while slots.waiting() < 1:
        time.sleep(0.005)
    with pytest.raises(RateLimited):
        slots.take("shared", timeout=5, lane_cap=1)
    slots.give_back()
    first.join(5)
    slots.take(timeout=5)  # the one slot, free again
    slots.give_back()


def _take_and_give_back(slots: WorkSlots, lane: str) -> None:
    slots.take(lane)
    slots.give_back()
