"""After a commit that published deliveries, the endpoints' drains are queued on Redis by the
process's drain requester thread (workers/dispatch.py), never by the request itself: a slow or
silent Redis does not hold up an answer, and what a process still holds at exit is sent."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from app import create_app
from tests.helpers import assert_success
from tests.server_process import ServerProcess
from tests.test_events_cli import flask_command, register
from tests.test_webhook_faults import queued_jobs_for
from workers.dispatch import DrainRequester, drain_requester

POSTBACK = {"eventType": "purchase", "valueMinor": 1250, "currency": "NGN"}


def post_conversion(client, brand: str, key: str, idempotency_key: str):
    return client.post(
        f"/api/v1/brand/{brand}/conversion/record-postback",
        headers={"X-Api-Key": key, "Idempotency-Key": idempotency_key},
        json=POSTBACK,
    )


def queued_drains(app, endpoint_id: str) -> int:
    return len(queued_jobs_for(app, endpoint_id))


def subscribed_endpoint(client, brand: str, key: str) -> str:
    return register(client, brand, key, ["conversion.recorded"])


def test_a_committed_postback_queues_its_endpoints_drain(app, client, brand, write_key):
    endpoint = subscribed_endpoint(client, brand, write_key)

    assert_success(post_conversion(client, brand, write_key, "order-1001-purchase"), 201)

    assert drain_requester().flush(timeout=10)
    assert queued_drains(app, endpoint) == 1


def test_commits_made_while_a_drain_is_queued_add_no_job(app, client, brand, write_key):
    endpoint = subscribed_endpoint(client, brand, write_key)

    for number in range(5):
        response = post_conversion(client, brand, write_key, f"order-{number:04}-flag-test")
        assert_success(response, 201)
        assert drain_requester().flush(timeout=10)

    assert queued_drains(app, endpoint) == 1


class SilentRedis:
    """A TCP server on 127.0.0.1 that reads what a Redis client sends and answers nothing
    until `release()`, which closes every connection."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connected = threading.Event()
        self._connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self._connections.append(connection)
            self.connected.set()
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        try:
            while connection.recv(4096):
                pass
        except OSError:
            pass

    def release(self) -> None:
        self._listener.close()
        for connection in self._connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)  # close() alone would not hang up
            connection.close()


@pytest.fixture
def silent_redis() -> Iterator[SilentRedis]:
    server = SilentRedis()
    try:
        yield server
    finally:
        server.release()


def test_an_answer_does_not_wait_for_redis(
    app_environ, brand, write_key, client, silent_redis, caplog
):
    subscribed_endpoint(client, brand, write_key)
    stalled = create_app({**app_environ, "REDIS_URL": f"redis://127.0.0.1:{silent_redis.port}/0"})

    response = post_conversion(stalled.test_client(), brand, write_key, "order-2002-purchase")

    assert_success(response, 201)
    # Redis was asked and has answered nothing, and its client has not given up on it yet: the
    # answer above came back without waiting for Redis (a request that waited would have
    # logged the failure after the client's 5-second timeout, before answering).
    assert silent_redis.connected.wait(10)
    assert "could not queue webhook drains" not in caplog.text
    silent_redis.release()
    assert drain_requester().flush(timeout=10)
    assert "could not queue webhook drains for 1 endpoint(s)" in caplog.text


def test_a_gunicorn_worker_queues_the_drain_of_its_commit(
    app, app_environ, client, brand, read_key, write_key
):
    # No RQ worker runs, so no sweeper: a queued drain can only come from the requester thread
    # of the gunicorn worker that answered.
    endpoint = subscribed_endpoint(client, brand, write_key)
    server = ServerProcess(app_environ, workers=2, threads=2)
    try:
        response = requests.post(
            f"{server.url}/api/v1/brand/{brand}/conversion/record-postback",
            headers={"X-Api-Key": read_key, "Idempotency-Key": "order-3003-purchase"},
            json=POSTBACK,
            timeout=10,
        )
        assert response.status_code == 201, response.text
        deadline = time.monotonic() + 10
        while queued_drains(app, endpoint) == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert queued_drains(app, endpoint) == 1, server.output()
    finally:
        server.stop()


def test_a_process_that_exits_right_after_its_commit_still_queues_the_drain(
    app, app_environ, client, brand, write_key
):
    endpoint = subscribed_endpoint(client, brand, write_key)

    result = flask_command(app_environ, "events", "emit", brand, "conversion.recorded")

    assert result.returncode == 0, result.stderr
    assert queued_drains(app, endpoint) == 1


def test_wakes_added_while_a_round_is_sent_go_out_together(app):
    first, second = "whe_first", "whe_second"
    rounds: list[set[str]] = []
    sending = threading.Event()
    may_finish = threading.Event()

    def send(app_, endpoint_ids):
        rounds.append(set(endpoint_ids))
        sending.set()
        may_finish.wait(10)

    requester = DrainRequester(send=send)
    requester.add(app, [first])
    assert sending.wait(10)
    requester.add(app, [second])
    requester.add(app, [first])
    may_finish.set()

    assert requester.flush(timeout=10)
    assert rounds == [{first}, {first, second}]


def test_flush_reports_a_round_that_does_not_finish(app):
    stuck = threading.Event()
    requester = DrainRequester(send=lambda app_, endpoint_ids: stuck.wait(10))

    requester.add(app, ["whe_stuck"])

    assert requester.flush(timeout=0.2) is False
    stuck.set()
    assert requester.flush(timeout=10) is True
