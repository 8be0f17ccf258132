"""scripts/listen.py, the relay a brand developer runs on a laptop, against a real gunicorn server
and a real receiver on 127.0.0.1: it forwards each event as a delivery would arrive (verified
with the receiver's own HMAC code, with the `standardwebhooks` package and by the bundled
scripts/webhook_receiver.py), sends an event again until the receiver takes it, survives the API
going away and something else answering in its place, and resumes after Ctrl-C without losing
or repeating an event."""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlalchemy import select
from standardwebhooks import Webhook

from extensions import db
from models import WebhookEvent
from services.events import publish_event
from tests.ports import free_port
from tests.receiver import Receiver, Reply
from tests.server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
LISTEN = ROOT / "scripts" / "listen.py"
# A secret given with --secret that is not base64 (as the relay made them, and as endpoints' were
# before CONTRACT 12.1): it signs as before, webhook-signature keyed with the whole string.
SECRET = "whsec_relayTestSecret0123456789abcdefXYZ"
# One of the current format, as register, rotate and the relay itself issue them.
BASE64_SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


class Relay:
    """`python3 scripts/listen.py …` as a developer runs it, its output collected line by line."""

    def __init__(
        self, api: str, brand: str, key: str, forward_to: str, state: Path, *extra, ready=True
    ):
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
        if ready:
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
    webhook = Webhook(SECRET.encode())  # not base64: the library takes it as bytes
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


def test_a_refused_event_is_sent_again_with_back_off_and_holds_the_next(
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
    redirect = Reply(status=302, headers={"Location": local_receiver.url})
    local_receiver.reply_with(Reply(status=400), Reply(status=500, body=b"boom"), redirect)
    publish(app, brand, "deal.completed")
    [first] = publish(app, brand, "escrow.released")
    publish(app, brand, "deal.completed")
    [second] = publish(app, brand, "escrow.released")
    local_receiver.wait_for(5, timeout=30)  # 1 + 2 + 4 s of back-off
    # Only what was asked for; the first until a 2xx took it, the second only after.
    assert forwarded_ids(local_receiver) == [first, first, first, first, second]
    lines = [line for line in relay.lines if first in line]
    expected = [
        r"-> 400 \(\d+ ms\); not delivered, trying again in 1 s \(a receiver checking signatures "
        r"needs the signing secret printed above\)$",
        r"-> 500 \(\d+ ms\); not delivered, trying again in 2 s$",
        r"-> 302 \(\d+ ms\); not delivered, trying again in 4 s$",  # no redirect is followed
        r"-> 200 \(\d+ ms\)$",
    ]
    assert len(lines) == len(expected), relay.output
    for line, pattern in zip(lines, expected, strict=True):
        assert re.search(rf"{first}  {pattern}", line), line
    relay.wait_for_line(second)
    # The secret it made up is shown and kept: `whsec_` + base64 of 32 bytes, so the library
    # verifies with it as printed, as it does a delivery of the service (CONTRACT 12.1).
    secret = re.search(r"Signing secret: (whsec_\S+) ", relay.output).group(1)
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]{43}=", secret), secret
    request = local_receiver.received[-1]
    assert {name.lower(): value for name, value in request.headers.items()}["webhook-id"] == second
    assert Webhook(secret).verify(request.body, request.headers)["id"] == second


def test_the_bundled_receiver_verifies_the_relay_given_its_secret(
    app, brand, read_key, api, api_port, relays, tmp_path
):
    """The README's pair: scripts/webhook_receiver.py with WEBHOOK_SECRET, the relay with the same
    secret in --secret (an endpoint's, base64: the receiver checks both signature headers). With
    another secret the receiver refuses each event, the relay says so and keeps it; run again
    with the right one, it delivers that event."""
    receiver = BundledReceiver(tmp_path / "receiver.log", BASE64_SECRET)
    try:
        state = tmp_path / "state.json"
        arguments = (f"http://127.0.0.1:{api_port}", brand, read_key, receiver.url, state)
        wrong = Relay(*arguments, "--secret", "whsec_notTheReceiversSecret0123456789ab")
        relays.append(wrong)
        [event] = publish(app, brand)
        line = wrong.wait_for_line("not delivered")
        assert re.search(rf"{event}  -> 400 \(\d+ ms\); not delivered, trying again in 1 s", line)
        wrong.wait_for_line("trying again in 2 s")
        assert wrong.interrupt() == 0
        assert f"resumes after {event}" not in wrong.output  # it was not delivered

        right = Relay(*arguments, "--secret", BASE64_SECRET)
        relays.append(right)
        assert re.search(rf"{event}  -> 200 \(\d+ ms\)$", right.wait_for_line(event))
        [later] = publish(app, brand)
        assert re.search(rf"{later}  -> 200 \(\d+ ms\)$", right.wait_for_line(later))
        event_lines = receiver.lines_of(event)
        assert len(event_lines) >= 3, receiver.output  # refused twice at least, then taken
        assert all("(SIGNATURE INVALID)" in line for line in event_lines[:-1]), receiver.output
        assert "(signature OK)" in event_lines[-1], receiver.output
        assert ["(signature OK)" in line for line in receiver.lines_of(later)] == [True]
    finally:
        receiver.stop()


class BundledReceiver:
    """scripts/webhook_receiver.py as the README runs it, its output in a file."""

    def __init__(self, log: Path, secret: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(ROOT / "scripts" / "webhook_receiver.py"), str(self.port)],
                env={"PATH": os.environ["PATH"], "WEBHOOK_SECRET": secret, "PYTHONUNBUFFERED": "1"},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while "listening on" not in self.output:
            assert self.process.poll() is None and time.monotonic() < deadline, self.output
            time.sleep(0.05)

    @property
    def output(self) -> str:
        return self.log.read_text()

    def lines_of(self, delivery_id: str) -> list[str]:
        """The receiver's line for each request that carried this delivery id."""
        return [line for line in self.output.splitlines() if f" {delivery_id} (" in line]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class ForeignServer:
    """Something that is not the API on the port the relay was given: answers from a script."""

    def __init__(self, answers: list[tuple[int, bytes]]) -> None:
        self.answers = list(answers)
        self.requests = 0
        foreign = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = foreign.answers[min(foreign.requests, len(foreign.answers) - 1)]
                foreign.requests += 1
                self.send_response(status)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_something_else_answering_for_the_api_is_waited_out_and_said(
    app, app_environ, brand, read_key, local_receiver, relays, tmp_path
):
    """A 404 page of another server (then a 200 page) where the API should be: the relay says
    what came back, cleaned of markup and terminal escapes, and tries again with back-off;
    once the API answers there, it starts and forwards."""
    page = b"<html><h1>Not Found</h1>\x1b[2J<p>The requested URL\nwas not found here.</p></html>"
    foreign = ForeignServer([(404, page), (404, page), (200, b"<html>It works!</html>")])
    port = foreign.port
    relay = Relay(
        f"http://127.0.0.1:{port}",
        brand,
        read_key,
        local_receiver.url,
        tmp_path / "state.json",
        ready=False,
    )
    relays.append(relay)
    said = (
        f"http://127.0.0.1:{port} answered HTTP 404, not as the Brand API does: "
        "'Not Found The requested URL was not found here.'; is --api right?; trying again in"
    )
    relay.wait_for_line(f"{said} 2 s")
    said_lines = [line for line in relay.lines if said in line]
    assert [line.removeprefix(line[: line.index(said)]) for line in said_lines] == [
        f"{said} 1 s",
        f"{said} 2 s",
    ]
    relay.wait_for_line("answered HTTP 200, not as the Brand API does: 'It works!'")
    assert relay.process.poll() is None, relay.output
    assert "\x1b" not in relay.output and "<h1>" not in relay.output

    foreign.close()
    server = ServerProcess(app_environ, threads=None, worker_class=None, port=port)
    try:
        relay.wait_for_line("Ready: listening on", timeout=60)
        [event] = publish(app, brand)
        local_receiver.wait_for(1)
        assert forwarded_ids(local_receiver) == [event]
    finally:
        server.stop()


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
