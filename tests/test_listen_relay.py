"""scripts/listen.py, the relay a brand developer runs on a laptop, against a real gunicorn server
and a real receiver on 127.0.0.1: it forwards each event as a delivery would arrive (verified
with the receiver's own HMAC code and with the `standardwebhooks` package), survives the API
going away and coming back, and resumes after Ctrl-C without losing or repeating an event."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from standardwebhooks import Webhook

from extensions import db
from models import WebhookEvent
from services.events import publish_event
from tests.receiver import Receiver, Reply
from tests.server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
LISTEN = ROOT / "scripts" / "listen.py"
SECRET = "whsec_relayTestSecret0123456789abcdefXYZ"


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Relay:
    """`python3 scripts/listen.py …` as a developer runs it, its output collected line by line."""

    def __init__(self, api: str, brand: str, key: str, forward_to: str, state: Path, *extra):
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(LISTEN),
                "--api",
                api,
                "--brand",
                brand,
                "--forward-to",
                forward_to,
                "--state",
                str(state),
                *extra,
            ],
            env={"PATH": os.environ["PATH"], "BRAND_API_KEY": key, "HOME": str(state.parent)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for_line("listening on")

    def _read(self) -> None:
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for_line(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [line for line in self.lines if text in line]
                if found:
                    return found[-1]
                if self.process.poll() is not None and not self._more_to_read():
                    raise AssertionError(f"listen.py exited: {self.output}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no {text!r} from listen.py:\n{self.output}")
                self._changed.wait(min(remaining, 0.5))

    def _more_to_read(self) -> bool:
        return not self.process.stdout.closed

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def interrupt(self) -> int:
        """Ctrl-C."""
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(20)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def relays() -> Iterator[list[Relay]]:
    started: list[Relay] = []
    yield started
    for relay in started:
        relay.kill()


@pytest.fixture
def api_port() -> int:
    return free_port()


@pytest.fixture
def api(app_environ, api_port) -> Iterator[list[ServerProcess]]:
    """The API server; a test may stop it and start another on the same port."""
    servers = [ServerProcess(app_environ, threads=None, worker_class=None, port=api_port)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def local_receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    receiver.secrets = [SECRET]
    yield receiver
    receiver.close()


def publish(app, brand: str, name: str = "deal.completed", count: int = 1) -> list[str]:
    ids = []
    with app.app_context():
        for number in range(count):
            ids.append(
                publish_event(brand_id=brand, name=name, data={"n": number, "note": "Ọjà"}).event.id
            )
            db.session.commit()
    return ids


def forwarded_ids(receiver: Receiver) -> list[str]:
    return [request.json["id"] for request in receiver.received]


def test_the_relay_forwards_each_event_as_a_delivery_signed_with_its_secret(
    app, brand, read_key, api, api_port, local_receiver, relays, tmp_path
):
    [before] = publish(app, brand)  # published before the relay's first run: not forwarded
    relay = Relay(
        f"http://127.0.0.1:{api_port}",
        brand,
        read_key,
        local_receiver.url,
        tmp_path / "state.json",
        "--secret",
        SECRET,
    )
    relays.append(relay)
    assert "1 earlier ones skipped" in relay.output
    assert f"Signing secret: {SECRET}" in relay.output

    published = publish(app, brand, count=2) + publish(app, brand, "escrow.released")
    received = local_receiver.wait_for(3)
    assert forwarded_ids(local_receiver) == published
    assert before not in forwarded_ids(local_receiver)

    with app.app_context():
        bodies = dict(
            db.session.execute(
                select(WebhookEvent.id, WebhookEvent.body).where(WebhookEvent.id.in_(published))
            ).all()
        )
    webhook = Webhook(SECRET.encode())
    for request in received:
        event_id = request.json["id"]
        # The very bytes a delivery of the event sends.
        assert request.body == bodies[event_id].encode()
        assert request.signature_valid  # tests/receiver.py's own HMAC check
        assert webhook.verify(request.body, request.headers) == request.json
        headers = {name.lower(): value for name, value in request.headers.items()}
        assert headers["x-service-event"] == request.json["type"]
        assert headers["x-service-delivery"] == headers["webhook-id"] == event_id
        assert headers["webhook-timestamp"] == headers["x-service-timestamp"]
        assert headers["content-type"] == "application/json"
        line = relay.wait_for_line(event_id)
        assert re.search(
            rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d  {re.escape(request.json['type'])} +"
            rf"{event_id}  -> 200 \(\d+ ms\)$",
            line,
        ), line


def test_only_the_events_asked_for_and_the_receivers_answer_on_each_line(
    app, brand, read_key, api, api_port, local_receiver, relays, tmp_path
):
    relay = Relay(
        f"http://127.0.0.1:{api_port}",
        brand,
        read_key,
        local_receiver.url,
        tmp_path / "state.json",
        "--events",
        "escrow.released",
    )
    relays.append(relay)
    local_receiver.reply_with(Reply(status=500, body=b"boom"))
    publish(app, brand, "deal.completed")
    [first] = publish(app, brand, "escrow.released")
    publish(app, brand, "deal.completed")
    [second] = publish(app, brand, "escrow.released")
    local_receiver.wait_for(2)
    assert forwarded_ids(local_receiver) == [first, second]
    assert "-> 500 (" in relay.wait_for_line(first)  # shown, and the relay goes on
    # The secret it made up is shown and kept: a receiver configured with it verifies.
    secret = re.search(r"Signing secret: (whsec_\w+)", relay.output).group(1)
    request = local_receiver.received[1]
    assert Webhook(secret.encode()).verify(request.body, request.headers)["id"] == second


def test_the_relay_survives_the_api_restarting_and_loses_nothing(
    app, app_environ, brand, read_key, api, api_port, local_receiver, relays, tmp_path
):
    relay = Relay(
        f"http://127.0.0.1:{api_port}",
        brand,
        read_key,
        local_receiver.url,
        tmp_path / "state.json",
        "--secret",
        SECRET,
    )
    relays.append(relay)
    first = publish(app, brand, count=2)
    local_receiver.wait_for(2)

    api[0].stop()  # its long-poll is cut, and the next ones find nothing listening
    relay.wait_for_line("the API is unreachable", timeout=40)
    while_down = publish(app, brand, count=3)
    api.append(ServerProcess(app_environ, threads=None, worker_class=None, port=api_port))
    relay.wait_for_line("the API answers again", timeout=60)
    later = publish(app, brand)
    local_receiver.wait_for(6, timeout=60)
    time.sleep(1.0)
    assert forwarded_ids(local_receiver) == first + while_down + later
    assert all(request.signature_valid for request in local_receiver.received)


def test_ctrl_c_stops_cleanly_and_the_next_run_resumes_without_loss_or_repeat(
    app, brand, read_key, api, api_port, local_receiver, relays, tmp_path
):
    state = tmp_path / "state.json"
    arguments = (f"http://127.0.0.1:{api_port}", brand, read_key, local_receiver.url, state)
    relay = Relay(*arguments, "--secret", SECRET)
    relays.append(relay)
    first = publish(app, brand, count=2)
    local_receiver.wait_for(2)
    assert relay.interrupt() == 0  # while it long-polls
    assert "Stopped. The next run resumes after " + first[-1] in relay.output

    while_stopped = publish(app, brand, count=3)
    time.sleep(0.5)
    assert len(local_receiver.received) == 2

    # Ctrl-C while an event is being forwarded: that one is finished and recorded first.
    local_receiver.reply_with(Reply(delay=1.5))
    again = Relay(*arguments, "--secret", SECRET)
    relays.append(again)
    assert f"after {first[-1]}" in again.output
    local_receiver.wait_for(3)  # the first of the three reached the receiver, which is slow
    assert again.interrupt() == 0
    assert f"resumes after {while_stopped[0]}" in again.output
    assert forwarded_ids(local_receiver) == first + while_stopped[:1]

    last = publish(app, brand)
    third = Relay(*arguments, "--secret", SECRET)
    relays.append(third)
    local_receiver.wait_for(6)
    time.sleep(1.0)
    assert forwarded_ids(local_receiver) == first + while_stopped + last
    assert third.interrupt() == 0


def test_a_receiver_not_listening_yet_gets_the_event_once_it_is(
    app, brand, read_key, api, api_port, relays, tmp_path
):
    port = free_port()
    relay = Relay(
        f"http://127.0.0.1:{api_port}",
        brand,
        read_key,
        f"http://127.0.0.1:{port}/hooks",
        tmp_path / "state.json",
    )
    relays.append(relay)
    [event_id] = publish(app, brand)
    relay.wait_for_line("nothing listens at")
    receiver = Receiver(port)  # now something listens where the relay was told
    try:
        receiver.wait_for(1)
        assert forwarded_ids(receiver) == [event_id]
    finally:
        receiver.close()


def test_a_wrong_key_or_an_unknown_event_name_stops_it_with_a_reason(
    brand, read_key, api, api_port, tmp_path
):
    base = [sys.executable, str(LISTEN), "--api", f"http://127.0.0.1:{api_port}"]
    common = ["--brand", brand, "--forward-to", "http://127.0.0.1:9/hooks"]
    state = ["--state", str(tmp_path / "state.json")]
    wrong_key = subprocess.run(
        [*base, *common, *state, "--key", "svc_live_" + "x" * 38],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert wrong_key.returncode == 2
    assert "HTTP 401" in wrong_key.stdout
    unknown = subprocess.run(
        [*base, *common, *state, "--key", read_key, "--events", "deal.complete"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert unknown.returncode == 2
    assert "deal.complete" in unknown.stdout and "HTTP 400" in unknown.stdout
