"""A real HTTP receiver on 127.0.0.1 for webhook tests: a threaded server in the test process
that verifies every signature with its own HMAC code (not the service's) and answers as each
test scripts it."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import select
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"ok"
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    # Set by a test to hold the request open until it chooses (a worker killed mid-attempt).
    hold: threading.Event | None = None
    # Seconds between the bytes of the whole answer, status line included (a trickling
    # receiver: every read gets a byte in time, the answer never ends in time).
    trickle: float = 0.0


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    signature_valid: bool
    received_at: float  # time.monotonic()
    received_wall: float = 0.0  # time.time(), to compare with an HTTP date
    # When it left the wire (time.monotonic()): its answer was written, or the sender hung up
    # (a timeout); None while it is on the wire.
    ended_at: float | None = None

    @property
    def json(self) -> dict:
        return json.loads(self.body)

    @property
    def delivery_id(self) -> str:
        return self.headers["X-Service-Delivery"]


def expected_signature(secret: str, timestamp: str, body: bytes) -> str:
    """What a brand's receiver computes: HMAC-SHA256 of `{timestamp}.{rawBody}`."""
    message = timestamp.encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


class Receiver:
    def __init__(self, port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self.secrets: list[str] = []
        self.received: list[Received] = []
        # What every request gets once the script is used up.
        self.default = Reply()
        self.in_flight = 0
        self.max_in_flight = 0
        # Delivery ids whose answer was written in full, in order.
        self.answered: list[str] = []
        self.trickles_finished = 0
        self._script: deque[Reply] = deque()
        self._lock = threading.Condition()
        self.server = _Server(("127.0.0.1", port), _Handler)
        self.server.daemon_threads = True
        self.server.receiver = self
        if tls is not None:
            # HTTPS on 127.0.0.1, reached as https://localhost (its certificate's name).
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.scheme = "http" if tls is None else "https"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.scheme == "http" else "localhost"
        return f"{self.scheme}://{host}:{self.port}/hooks"

    def reply_with(self, *replies: Reply) -> None:
        """The next requests get these replies in order; after them, 200."""
        with self._lock:
            self._script.extend(replies)

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.received) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"receiver got {len(self.received)} request(s), expected {count}"
                    )
                self._lock.wait(remaining)
            return list(self.received)

    def wait_answered(self, count: int, timeout: float = 20.0) -> list[str]:
        """The delivery ids of the first `count` answers written in full: a sender may read an
        answer (and act on it, or die) before this receiver's thread has noted it."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.answered) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"receiver answered {self.answered}, expected {count}")
                self._lock.wait(remaining)
            return list(self.answered)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def overlaps(self) -> list[tuple[str, float, float]]:
        """Deliveries that were on the wire twice at once: (delivery id, when the second began,
        when the first ended). A retry after the sender gave up on the first is not one."""
        found = []
        by_delivery: dict[str, list[Received]] = {}
        with self._lock:
            for request in self.received:
                by_delivery.setdefault(request.delivery_id, []).append(request)
        for delivery_id, requests in by_delivery.items():
            requests.sort(key=lambda request: request.received_at)
            for first, second in itertools.pairwise(requests):
                ended = first.ended_at if first.ended_at is not None else float("inf")
                if second.received_at < ended:
                    found.append((delivery_id, second.received_at, ended))
        return found

    def _record(self, request: Received) -> Reply:
        with self._lock:
            self.received.append(request)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self._lock.notify_all()
            return self._script.popleft() if self._script else self.default

    def _answered(self, *, trickled: bool, delivery_id: str | None) -> None:
        with self._lock:
            self.in_flight -= 1
            self.trickles_finished += trickled
            if delivery_id is not None:
                self.answered.append(delivery_id)
            self._lock.notify_all()

    def _verify(self, headers: dict[str, str], body: bytes) -> bool:
        """Whether one of the presented signatures (several during a rotation's overlap) is
        one of this receiver's secrets'."""
        timestamp = headers.get("X-Service-Timestamp", "")
        presented = [value.strip() for value in headers.get("X-Service-Signature", "").split(",")]
        if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > 300:
            return False
        return any(
            hmac.compare_digest(given, expected_signature(secret, timestamp, body))
            for secret in self.secrets
            for given in presented
        )


class _Server(ThreadingHTTPServer):
    # A listen backlog like a real server's: with the default of 5, a hundred attempts that
    # connect at once wait out SYN retries and time out before they are accepted.
    request_queue_size = 256


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real receivers do
    # Without this, keep-alive responses stall ~40 ms on delayed ACKs (PERFORMANCE-NOTES).
    disable_nagle_algorithm = True

    def do_POST(self) -> None:
        receiver: Receiver = self.server.receiver
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        headers = dict(self.headers.items())
        request = Received(
            path=self.path,
            headers=headers,
            body=body,
            signature_valid=receiver._verify(headers, body),
            received_at=time.monotonic(),
            received_wall=time.time(),
        )
        reply = receiver._record(request)
        trickled = False
        answered = None
        try:
            if reply.hold is not None and not self._wait_unless_gone(reply.hold.wait, 30):
                return
            if reply.delay and not self._wait_unless_gone(
                threading.Event().wait, reply.delay, waited_out=True
            ):
                return
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(reply.body)))
            if reply.trickle:
                self._trickle(reply)
                trickled = True
            else:
                self.end_headers()
                self.wfile.write(reply.body)
            self.wfile.flush()
            answered = headers.get("X-Service-Delivery")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the worker gave up waiting (timeout tests)
        finally:
            request.ended_at = time.monotonic()
            receiver._answered(trickled=trickled, delivery_id=answered)

    def _wait_unless_gone(self, wait, seconds: float, *, waited_out: bool = False) -> bool:
        """Wait (`wait(timeout)` returns True when done) up to `seconds`, watching the
        connection: False as soon as the sender hangs up, else True."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return waited_out
            if wait(min(0.02, left)):
                return True
            if isinstance(self.connection, ssl.SSLSocket):
                continue  # TLS cannot be peeked at: waited out as it is
            readable, _, _ = select.select([self.connection], [], [], 0)
            if readable and not self.connection.recv(1, socket.MSG_PEEK):
                return False  # end of stream: the sender gave up

    def _trickle(self, reply: Reply) -> None:
        self._headers_buffer.append(b"\r\n")
        answer = b"".join(self._headers_buffer) + reply.body
        self._headers_buffer = []
        for index in range(len(answer)):
            self.wfile.write(answer[index : index + 1])
            self.wfile.flush()
            time.sleep(reply.trickle)

    def log_message(self, format, *args) -> None:
        pass
