"""The front door (issue 42; blueprints/admission.py), against a real gunicorn over raw sockets:
a request takes nothing another request needs until it has arrived whole and its caller is
known. Slow bodies hold no work slot, forged keys queue nowhere, failed authentications are
limited per address (CONTRACT 13.7), and one brand's many keys do not take every long-poll."""

from __future__ import annotations

import json
import secrets
import select
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
import requests
from sqlalchemy import text

from blueprints.admission import BODY_DEADLINE_SECONDS
from extensions import db
from models import credentials
from tests.platform_factory import PlatformFactory
from tests.server_process import ServerProcess
from tests.test_event_wait_caps import Client, Waits, publish, waiting_on

# A failing request here means the server did not answer: an unbounded wait, as before issue 42.
ANSWER_TIMEOUT = 8
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def send_slowly(port: int, path: str, headers: dict[str, str]) -> socket.socket:
    """A POST whose headers promise 1,000 bytes of body, of which 3 are sent."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(60)
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Length: 1000"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + b"abc")
    return sock


def when_readable(socks: list[socket.socket], within: float) -> list[float]:
    """The monotonic time at which each of `socks` first had something to read."""
    at: dict[socket.socket, float] = {}
    deadline = time.monotonic() + within
    while len(at) < len(socks) and time.monotonic() < deadline:
        waiting = [sock for sock in socks if sock not in at]
        readable, _, _ = select.select(waiting, [], [], 0.05)
        for sock in readable:
            at[sock] = time.monotonic()
    assert len(at) == len(socks), f"{len(socks) - len(at)} never answered"
    return [at[sock] for sock in socks]


def read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """The status and body of the one answer on `sock`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    sock.close()
    return int(lines[0].split()[1]), body


def forged_key() -> str:
    """Well formed, so it costs the lookup a real key does, and unknown."""
    return credentials.generate_secret(credentials.API_KEY_PREFIX)


def random_brand_id() -> str:
    return "brd_" + uuid.uuid4().hex[:26]


def test_slow_bodies_hold_nothing_and_are_answered_408(app, app_environ, make_brand, make_key):
    """Measured before: 4 such connections to one process and /healthz and every brand's calls
    timed out; an authenticated slow body did the same."""
    attacker, other = make_brand("Slow Co"), make_brand("Other Co")
    attacker_key, other_key = make_key(attacker), make_key(other, scopes=("read",))
    server = ServerProcess(app_environ, workers=1, threads=None, worker_class=None)
    try:
        sent_at = time.monotonic()
        slow = [
            send_slowly(
                server.port,
                "/dashboard/sign-in",
                {"Content-Type": "application/x-www-form-urlencoded"},
            )
            for _ in range(16)
        ]
        slow += [
            send_slowly(
                server.port,
                f"/api/v1/brand/{attacker}/conversion/record-postback",
                {"Content-Type": "application/json", "X-Api-Key": attacker_key},
            )
            for _ in range(8)
        ]
        time.sleep(1)  # let every slow request reach the app and stall there

        health = requests.get(f"{server.url}/healthz", timeout=ANSWER_TIMEOUT)
        assert health.status_code == 200
        listed = requests.get(
            f"{server.url}/api/v1/brand/{other}/api-key/fetch-keys",
            headers={"X-Api-Key": other_key},
            timeout=ANSWER_TIMEOUT,
        )
        assert listed.status_code == 200, listed.text

        # The slow ones are answered, and their connections closed, once their deadline passed,
        # each at 10 s and up to a quarter more: sent together, they are not all cut together.
        # (The dashboard's answer is its HTML error page, the API's the envelope.)
        answered_at = when_readable(slow, within=BODY_DEADLINE_SECONDS * 1.25 + 5)
        assert min(answered_at) >= sent_at + BODY_DEADLINE_SECONDS - 0.5
        assert max(answered_at) - min(answered_at) > 0.5
        for number, sock in enumerate(slow):
            status, body = read_answer(sock)
            assert status == 408
            if number >= 16:
                assert json.loads(body)["errorCode"] == "REQUEST_TIMEOUT"
    finally:
        server.stop()


@pytest.fixture
def hung_postbacks(app, app_environ, make_brand, make_key):
    """A server whose one worker has every work slot held by a third brand's postbacks, hung
    just before they commit (a failpoint) for as long as the test needs."""
    busy = make_brand("Busy Co")
    busy_key = make_key(busy, scopes=("read",))
    factory = PlatformFactory(app)
    campaign = factory.campaign(busy, at=T0, published_at=T0 + timedelta(hours=1))
    deal = factory.deal(campaign, at=T0 + timedelta(hours=2), accepted_at=T0 + timedelta(hours=3))
    factory.link(campaign, "HOLD42", at=T0 + timedelta(hours=4), deal_id=deal)
    server = ServerProcess(
        app_environ,
        workers=1,
        threads=None,
        worker_class=None,
        FAILPOINTS="postback.before_commit=sleep:25",
    )
    pool = ThreadPoolExecutor(64)

    def postback():
        return requests.post(
            f"{server.url}/api/v1/brand/{busy}/conversion/record-postback",
            headers={"X-Api-Key": busy_key, "Idempotency-Key": secrets.token_hex(8)},
            json={"eventType": "purchase", "linkCode": "HOLD42", "valueMinor": 500},
            timeout=90,
        )

    from app import WORK_SLOTS_PER_PROCESS

    holding = [pool.submit(postback) for _ in range(WORK_SLOTS_PER_PROCESS)]
    deadline = time.monotonic() + 30
    while _postbacks_in_flight(app) < WORK_SLOTS_PER_PROCESS:
        assert time.monotonic() < deadline, server.output()
        time.sleep(0.1)
    try:
        yield server, holding, pool
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        server.stop()


def _postbacks_in_flight(app) -> int:
    """Postback transactions that took their idempotency key (an advisory lock) and hang."""
    with app.app_context():
        count = db.session.scalar(
            text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")
        )
        db.session.rollback()
        return int(count or 0)


def test_forged_keys_queue_nowhere_while_every_slot_is_busy(hung_postbacks, make_brand, make_key):
    """Measured before: requests were queued in the lane of the brand their URL named, before
    authentication, so forgers naming brand B queued ahead of B's calls, and forgers naming
    random ids got a lane each. Now a forged key is refused before any queue: its 401 comes
    while every work slot is still held."""
    server, holding, pool = hung_postbacks
    victim = make_brand("Victim Co")
    victim_key = make_key(victim, scopes=("read",))

    def forged(brand_id: str) -> int:
        return requests.get(
            f"{server.url}/api/v1/brand/{brand_id}/api-key/fetch-keys",
            headers={"X-Api-Key": forged_key()},
            timeout=ANSWER_TIMEOUT,
        ).status_code

    brands = [victim] * 20 + [random_brand_id() for _ in range(20)]
    assert list(pool.map(forged, brands)) == [401] * 40
    assert not any(future.done() for future in holding)  # the slots were held all along

    # The victim's own call waits for a slot in its own lane, for a bounded time: 503 with
    # Retry-After while the slots are held, and served once they free.
    url = f"{server.url}/api/v1/brand/{victim}/api-key/fetch-keys"
    busy = requests.get(url, headers={"X-Api-Key": victim_key}, timeout=60)
    assert busy.status_code == 503, busy.text
    assert busy.json()["errorCode"] == "SERVICE_UNAVAILABLE"
    assert busy.headers["Retry-After"] == "1"
    assert not any(future.done() for future in holding)
    assert [future.result().status_code for future in holding] == [201] * len(holding)
    answer = requests.get(url, headers={"X-Api-Key": victim_key}, timeout=60)
    assert answer.status_code == 200, answer.text


def test_requests_naming_no_brand_wait_in_one_capped_lane(hung_postbacks):
    """Requests no credential vouches for (the dashboard's pages) may not pile up behind busy
    slots: past the shared lane's cap they are answered 429 at once."""
    from services.work_slots import SHARED_LANE_WAITING

    server, holding, pool = hung_postbacks
    extra = 8

    def page() -> int:
        return requests.get(f"{server.url}/dashboard/sign-in", timeout=90).status_code

    pages = [pool.submit(page) for _ in range(SHARED_LANE_WAITING + extra)]
    deadline = time.monotonic() + 20
    while sum(future.done() for future in pages) < extra:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    refused = [future.result() for future in pages if future.done()]
    assert refused == [429] * extra
    # The others waited their bounded time in the lane: 503, the slots still held.
    assert (
        sorted(future.result() for future in pages) == [429] * extra + [503] * SHARED_LANE_WAITING
    )
    assert not any(future.done() for future in holding)


def test_failed_authentications_are_limited_per_address_and_valid_keys_go_on(
    app, app_environ, brand, make_key
):
    """CONTRACT 13.7, over real connections from 127.0.0.1: measured before, 12,000 401s in
    20 s and not one 429."""
    key = make_key(brand, scopes=("read",))
    server = ServerProcess(app_environ, workers=2, AUTH_FAILURES_PER_MINUTE="5")
    try:
        url = f"{server.url}/api/v1/brand/{brand}/api-key/fetch-keys"
        statuses = [
            requests.get(url, headers={"X-Api-Key": forged_key()}, timeout=10).status_code
            for _ in range(5)
        ]
        assert statuses == [401] * 5
        for headers in ({"X-Api-Key": forged_key()}, {}, {"X-Api-Key": "not-a-key"}):
            refused = requests.get(url, headers=headers, timeout=10)
            assert refused.status_code == 429
            assert refused.json()["errorCode"] == "RATE_LIMITED"
            assert 1 <= int(refused.headers["Retry-After"]) <= 60
        # Another brand's URL, a random one: the address is the same.
        elsewhere = requests.get(
            f"{server.url}/api/v1/brand/{random_brand_id()}/api-key/fetch-keys",
            headers={"X-Api-Key": forged_key()},
            timeout=10,
        )
        assert elsewhere.status_code == 429
        valid = requests.get(url, headers={"X-Api-Key": key}, timeout=10)
        assert valid.status_code == 200, valid.text
    finally:
        server.stop()


def test_an_ipv6_client_is_counted_by_its_64(app_environ, brand, make_key):
    from app import create_app

    app = create_app({**app_environ, "AUTH_FAILURES_PER_MINUTE": "3"})
    key = make_key(brand, scopes=("read",))
    prefix = f"2001:db8:{secrets.randbelow(65536):x}:{secrets.randbelow(65536):x}"
    path = f"/api/v1/brand/{brand}/api-key/fetch-keys"

    def call(address: str, secret: str) -> int:
        client = app.test_client()
        return client.get(
            path, headers={"X-Api-Key": secret}, environ_base={"REMOTE_ADDR": address}
        ).status_code

    # Three failures from three addresses of one /64 use up its count.
    assert [call(f"{prefix}::{n}", forged_key()) for n in (1, 2, 3)] == [401] * 3
    assert call(f"{prefix}::ffff", forged_key()) == 429
    assert call(f"{prefix}::ffff", key) == 200
    # Another /64 of the same /48 has a count of its own.
    neighbour = prefix.rsplit(":", 1)[0] + f":{(int(prefix.rsplit(':', 1)[1], 16) + 1) % 65536:x}"
    assert call(f"{neighbour}::1", forged_key()) == 401
    with app.app_context():
        db.engine.dispose()


def test_one_brand_with_many_keys_cannot_take_every_long_poll(
    app, app_environ, make_brand, make_key
):
    """Measured before: a brand minted 30 keys, held 10 waits on each, the whole per-process
    cap; another brand's long-poll then got 429 ten times out of ten. Now a brand holds at most
    its share, and the other brand's long-poll waits and is woken."""
    greedy, other = make_brand("Greedy Co"), make_brand("Patient Co")
    per_key, per_process = 2, 12
    server = ServerProcess(
        app_environ,
        workers=1,
        threads=None,
        worker_class=None,
        EVENT_WAITS_PER_KEY=str(per_key),
        EVENT_WAITS_PER_PROCESS=str(per_process),
    )
    try:
        greedy_clients = [Client(server, greedy, make_key(greedy)) for _ in range(10)]
        after = publish(app, greedy)
        greedy_waits = Waits([(client, after) for client in greedy_clients for _ in range(per_key)])
        refused = greedy_waits.until_answered(20 - per_process // 2, within=20)
        assert {answer.status for answer in refused} == {429}
        assert "its share" in refused[0].body["message"]
        waiting_on(server, per_process // 2)

        patient = Client(server, other, make_key(other))
        before = publish(app, other)
        patient_wait = Waits([(patient, before)])
        waiting_on(server, per_process // 2 + 1)
        event_id = publish(app, other)
        [answer] = patient_wait.all()
        assert answer.status == 200, answer.body
        assert [event["id"] for event in answer.body["data"]["events"]] == [event_id]

        publish(app, greedy)
        assert {answer.status for answer in greedy_waits.all()} == {200, 429}
    finally:
        server.stop()
