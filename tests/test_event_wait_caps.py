"""Long-polls are capped (issue 36): a waiting `fetch-events?wait=N` holds a gunicorn thread, so
one API key, and all keys together, may hold only so many per server process, and a request
past a cap is answered at once with 429 `RATE_LIMITED` and `Retry-After` instead of queueing
in front of everyone else. Against a real gunicorn (one worker, gunicorn.conf.py's threads
unless a test says otherwise)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import requests

from config import DEFAULT_EVENT_WAITS_PER_KEY, DEFAULT_EVENT_WAITS_PER_PROCESS
from extensions import db
from services.events import publish_event
from tests.server_process import ServerProcess

WAIT = 30
# Well under WAIT: an answer within it was not held for the wait.
AT_ONCE = 15


@pytest.fixture(scope="module")
def capped(app, app_environ) -> Iterator[ServerProcess]:
    """Small caps, to reach them with a few requests."""
    process = ServerProcess(
        app_environ,
        workers=1,
        threads=None,
        worker_class=None,
        EVENT_WAITS_PER_KEY="2",
        EVENT_WAITS_PER_PROCESS="6",
    )
    yield process
    process.stop()


@dataclass
class Answer:
    status: int
    body: dict
    headers: requests.structures.CaseInsensitiveDict
    at: float


class Client:
    """One API key of a brand, calling the real server."""

    def __init__(self, server: ServerProcess, brand_id: str, key: str) -> None:
        self.base = f"{server.url}/api/v1/brand/{brand_id}"
        self.headers = {"X-Api-Key": key}

    def wait(self, after: str, timeout: float = WAIT + 15) -> Answer:
        response = requests.get(
            f"{self.base}/event/fetch-events",
            params={"after": after, "wait": WAIT},
            headers=self.headers,
            timeout=timeout,
        )
        return Answer(response.status_code, response.json(), response.headers, time.monotonic())

    def fetch_keys(self) -> Answer:
        response = requests.get(
            f"{self.base}/api-key/fetch-keys", headers=self.headers, timeout=AT_ONCE
        )
        return Answer(response.status_code, response.json(), response.headers, time.monotonic())


class Waits:
    """Long-polls sent at once from background threads, their answers as they come."""

    def __init__(self, calls: list[tuple[Client, str]]) -> None:
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=len(calls))
        self._futures = [self._pool.submit(self._wait, client, after) for client, after in calls]

    def _wait(self, client: Client, after: str) -> Answer:
        answer = client.wait(after)
        with self._lock:
            self.answers.append(answer)
        return answer

    def answered(self) -> list[Answer]:
        with self._lock:
            return list(self.answers)

    def until_answered(self, count: int, within: float = AT_ONCE) -> list[Answer]:
        """The first `count` answers, once they are in (fewer if `within` seconds pass)."""
        deadline = time.monotonic() + within
        while len(self.answered()) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # and no more come meanwhile
        return self.answered()

    def all(self) -> list[Answer]:
        answers = [future.result() for future in self._futures]
        self._pool.shutdown()
        return answers


def waiting_on(server: ServerProcess, count: int) -> None:
    """Once the (one-worker) server holds `count` waits, by its metrics: requests sent from
    threads reach it in their own time on a busy machine."""
    deadline = time.monotonic() + AT_ONCE
    while True:
        text = requests.get(f"{server.url}/metrics", timeout=10).text
        held = float(re.search(r"^brand_api_event_waits (\S+)$", text, re.MULTILINE)[1])
        if held == count or time.monotonic() > deadline:
            assert held == count
            return
        time.sleep(0.05)


def publish(app, brand_id: str) -> str:
    with app.app_context():
        published = publish_event(brand_id=brand_id, name="deal.completed", data={"n": 1})
        db.session.commit()
        return published.event.id


def assert_refused_at_once(answer: Answer, started: float, message: str) -> None:
    assert answer.status == 429, answer.body
    assert answer.body["status"] is False
    assert answer.body["statusCode"] == 429
    assert answer.body["errorCode"] == "RATE_LIMITED"
    assert message in answer.body["message"]
    assert answer.body["requestId"] == answer.headers["X-Request-Id"]
    # The caller comes back no sooner than its wait would have ended, and callers refused
    # together come back spread over as long again.
    assert WAIT <= int(answer.headers["Retry-After"]) <= 2 * WAIT
    assert "RateLimit-Remaining" in answer.headers
    assert answer.at - started < AT_ONCE


def test_a_key_past_its_wait_cap_is_refused_at_once_and_its_other_waits_are_woken(
    app, capped, brand, make_key
):
    key, other = Client(capped, brand, make_key(brand)), Client(capped, brand, make_key(brand))
    after = publish(app, brand)
    held = Waits([(key, after)] * 2 + [(other, after)])
    waiting_on(capped, 3)  # all three wait: under every cap (the brand's share is 3 of 6)

    started = time.monotonic()
    refused = key.wait(after)
    assert_refused_at_once(refused, started, "This API key already has 2 long-polls waiting")

    event_id = publish(app, brand)
    for answer in held.all():
        assert answer.status == 200, answer.body
        assert [event["id"] for event in answer.body["data"]["events"]] == [event_id]

    # Its waits answered, the key may wait again.
    again = Waits([(key, event_id)])
    waiting_on(capped, 1)
    publish(app, brand)
    assert again.all()[0].status == 200


def test_a_process_past_its_wait_cap_refuses_every_brand_at_once_and_wakes_its_waits(
    app, capped, make_brand, make_key
):
    brands = [make_brand(f"Brand {number}") for number in range(4)]
    afters = {brand: publish(app, brand) for brand in brands[:3]}
    # Brands arriving one after another take their shares: 6 // 2, 6 // 3 and 6 // 4 of the
    # process's 6 waits, which fills it.
    first, second = (Client(capped, brands[0], make_key(brands[0])) for _ in range(2))
    held = [Waits([(first, afters[brands[0]])] * 2 + [(second, afters[brands[0]])])]
    waiting_on(capped, 3)
    held.append(Waits([(Client(capped, brands[1], make_key(brands[1])), afters[brands[1]])] * 2))
    waiting_on(capped, 5)
    held.append(Waits([(Client(capped, brands[2], make_key(brands[2])), afters[brands[2]])]))
    waiting_on(capped, 6)  # the process's cap

    third = Client(capped, brands[3], make_key(brands[3]))
    older = publish(app, brands[3])
    after = publish(app, brands[3])
    started = time.monotonic()
    refused = third.wait(after)
    assert_refused_at_once(refused, started, "as many long-polls waiting as it may")
    # A wait with something to read is answered as ever: only waiting is refused.
    readable = third.wait(older)
    assert readable.status == 200
    assert [event["id"] for event in readable.body["data"]["events"]] == [after]

    for brand, waits in zip(brands, held, strict=False):
        event_id = publish(app, brand)
        for answer in waits.all():
            assert answer.status == 200, answer.body
            assert [event["id"] for event in answer.body["data"]["events"]] == [event_id]


def test_with_the_default_caps_waits_never_take_the_threads_normal_calls_need(
    app, app_environ, brand, make_key
):
    """More long-polls than the worker has threads (gunicorn.conf.py's 256), from keys each
    asking for one more than its cap: the brand waits on its share, half the process's waits,
    and the worker keeps threads for everyone else's calls."""
    keys_count = DEFAULT_EVENT_WAITS_PER_PROCESS // DEFAULT_EVENT_WAITS_PER_KEY + 15
    per_key = DEFAULT_EVENT_WAITS_PER_KEY + 1
    assert keys_count * per_key > 256
    share = DEFAULT_EVENT_WAITS_PER_PROCESS // 2
    server = ServerProcess(app_environ, workers=1, threads=None, worker_class=None)
    try:
        clients = [Client(server, brand, make_key(brand)) for _ in range(keys_count)]
        after = publish(app, brand)
        waits = Waits([(client, after) for client in clients for _ in range(per_key)])
        total = keys_count * per_key
        # Every answer before the publish is a refusal: an admitted wait ends only with it.
        refused = waits.until_answered(total - share, within=WAIT - 5)
        assert len(refused) == total - share
        waiting_on(server, share)
        assert {answer.status for answer in refused} == {429}

        # A key that was refused, and every other, still gets its normal calls answered while
        # the process holds the brand's waits.
        for client in (clients[0], clients[-1]):
            listed = client.fetch_keys()
            assert listed.status == 200, listed.body
        assert len(waits.answered()) == len(refused)  # the admitted ones still wait

        event_id = publish(app, brand)
        woken = [answer for answer in waits.all() if answer.status == 200]
        assert len(woken) == share
        assert {answer.body["data"]["events"][0]["id"] for answer in woken} == {event_id}
    finally:
        server.stop()


def test_a_worker_with_few_threads_lets_waits_take_at_most_half_of_them(
    app, app_environ, make_brand, make_key
):
    """Whatever EVENT_WAITS_PER_PROCESS says, a gthread worker started with fewer threads than
    gunicorn.conf.py's keeps half of them for normal calls."""
    server = ServerProcess(app_environ, workers=1, threads=8)
    try:
        brands = [make_brand(f"Brand {number}") for number in range(5)]
        clients = [Client(server, brand, make_key(brand)) for brand in brands]
        afters = [publish(app, brand) for brand in brands]
        waits = []
        for number in range(4):  # a brand each: every one within its share
            waits.append(Waits([(clients[number], afters[number])]))
            waiting_on(server, number + 1)
        refused = clients[4].wait(afters[4])
        assert refused.status == 429
        assert "as many long-polls waiting as it may (4)" in refused.body["message"]
        assert clients[4].fetch_keys().status == 200

        for brand, waiting in zip(brands, waits, strict=False):
            event_id = publish(app, brand)
            [answer] = waiting.all()
            assert answer.status == 200, answer.body
            assert answer.body["data"]["events"][0]["id"] == event_id
    finally:
        server.stop()


def test_past_a_cap_a_read_another_waiter_found_empty_is_refused_unread(
    app_environ, brand, make_key, monkeypatch
):
    """5,000 long-polls of one brand (issue 42) each read the feed before they were refused:
    now, while a waiter of the brand sleeps on the very same read, un-woken since it found it
    empty, a request past a cap is refused before reading. One with something to list still
    gets it, cap or not."""
    from app import create_app
    from services import event_feed, event_waits

    app = create_app({**app_environ, "EVENT_WAITS_PER_KEY": "1"})
    key = make_key(brand, scopes=("read",))
    earlier, after = publish(app, brand), publish(app, brand)
    url = f"/api/v1/brand/{brand}/event/fetch-events"
    headers = {"X-Api-Key": key}

    def long_poll(cursor: str):
        return app.test_client().get(
            url, query_string={"after": cursor, "wait": WAIT}, headers=headers
        )

    with ThreadPoolExecutor(max_workers=1) as pool:
        held = pool.submit(long_poll, after)
        deadline = time.monotonic() + AT_ONCE
        with app.app_context():
            while event_waits.brand_waiters().count() < 1 or not any(
                w.caught_up_on for w in event_waits.brand_waiters()._by_brand.get(brand, ())
            ):
                assert time.monotonic() < deadline, "the first long-poll never slept"
                time.sleep(0.05)

        def no_read(*args, **kwargs):
            raise AssertionError("the feed was read")

        with monkeypatch.context() as patched:
            patched.setattr(event_feed, "_cursor", no_read)
            refused = long_poll(after)
        assert refused.status_code == 429, refused.json
        assert "This API key already has 1 long-polls waiting" in refused.json["message"]
        assert WAIT <= int(refused.headers["Retry-After"]) <= 2 * WAIT

        # Something to list: listed, the cap notwithstanding.
        readable = long_poll(earlier)
        assert readable.status_code == 200
        assert [event["id"] for event in readable.json["data"]["events"]] == [after]

        event_id = publish(app, brand)
        answer = held.result(timeout=AT_ONCE)
        assert answer.status_code == 200
        assert [event["id"] for event in answer.json["data"]["events"]] == [event_id]
