"""One delivery attempt over HTTP: resolve and check the receiver's address, connect to exactly
that address, post the signed body, and report what happened in words a brand can act on.

Attempts run on the delivery loop's asyncio loop (loop.py) over one aiohttp
session per worker process, which keeps connections to each receiver alive between attempts (a
TLS handshake per delivery would cost more than the delivery). `WEBHOOK_TIMEOUT` bounds the
whole attempt on the wall clock, name lookup, connect, sending, the answer's headers and its
body alike: a receiver that trickles a byte a second cannot hold an attempt past it. Names are
looked up on the loop too (c-ares), each under a deadline of its own, so a brand whose DNS is
slow holds only its own attempts.

Whatever the receiver answers is untrusted: answers.py reads it, bounded, and makes what
the log keeps of it safe to store. Each attempt also records where its time went (the lookup,
the TCP connect, the TLS handshake, the wait for the first byte) and the address it connected
to (CONTRACT 12.5): the connect and handshake are told apart by noting when this attempt's
socket is made and when its TLS object is, through a context variable the attempt sets.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import errno
import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

import aiohttp

from models.columns import utcnow
from services.delivery.answers import kept_headers, read_body_start, safe_error, safe_text
from services.delivery.outcomes import (
    OWN_FAULT,
    RETRY_AFTER_MAX_SECONDS,
    AttemptOutcome,
    AttemptTimings,
)
from services.endpoint_urls import AddressRefused, UrlPolicy, attempt_target, lookup_name
from services.signing import delivery_headers

# Receivers that may ask for a later retry (CONTRACT 8.6).
_RETRY_AFTER_STATUSES = (429, 503)
_GONE = 410
# A kept-alive connection idle this long is closed (receivers commonly close after 60 s); short
# enough that a worker talking to thousands of receivers does not hold a socket for each.
KEEPALIVE_SECONDS = 15.0
# A name lookup's own deadline, within the attempt's.
LOOKUP_TIMEOUT_SECONDS = 5.0
# An answer may carry this many headers, each line at most 8 KiB (aiohttp's limits); past that
# it is refused as not valid HTTP, a failure like any other, so that the breaker slows the
# receiver down: a 200 with a megabyte of headers would otherwise cost the worker that much
# parsing on every delivery, at its neighbours' expense.
MAX_RESPONSE_HEADERS = 128
NOT_HTTP = "The receiver's answer is not valid HTTP"


@dataclass
class _Progress:
    """One attempt as it goes: what it is doing (for a timeout's words), and when each step
    began, on time.perf_counter()."""

    phase: str = "connecting"
    status: int | None = None
    started: float = 0.0
    dns_ms: int | None = None
    connect_started: float | None = None
    tls_started: float | None = None
    connected: float | None = None
    reused: bool = False
    sent: float | None = None
    first_byte: float | None = None
    sent_headers: dict[str, str] | None = None

    def timings(self) -> AttemptTimings:
        connect_ms = tls_ms = None
        if self.connect_started is not None and not self.reused:
            connect_end = self.tls_started or self.connected
            if connect_end is not None:
                connect_ms = _ms(connect_end - self.connect_started)
            if self.tls_started is not None and self.connected is not None:
                tls_ms = _ms(self.connected - self.tls_started)
        first_byte_ms = None
        if self.sent is not None and self.first_byte is not None:
            first_byte_ms = _ms(self.first_byte - self.sent)
        return AttemptTimings(
            dns_ms=self.dns_ms, connect_ms=connect_ms, tls_ms=tls_ms, first_byte_ms=first_byte_ms
        )


# The attempt whose connection the current task is making (see the module's docstring).
_current: contextvars.ContextVar[_Progress | None] = contextvars.ContextVar(
    "webhook_attempt", default=None
)


def _note_socket(addr_info) -> socket.socket:
    """aiohttp's connector makes each connection's socket here, just before it connects."""
    progress = _current.get()
    if progress is not None and progress.connect_started is None:
        progress.connect_started = time.perf_counter()
    family, type_, proto, _, _ = addr_info
    return socket.socket(family=family, type=type_, proto=proto)


class _TimedSSLObject(ssl.SSLObject):
    """Made when a connection's TLS handshake begins: the TCP connect is over then."""

    @classmethod
    def _create(cls, *args, **kwargs):
        progress = _current.get()
        if progress is not None and progress.tls_started is None:
            progress.tls_started = time.perf_counter()
        return super()._create(*args, **kwargs)  # type: ignore[misc]


class Transport:
    """The HTTP side of a worker process's delivery loop: one aiohttp session on its loop.
    Create and use it on that loop."""

    def __init__(
        self,
        *,
        policy: UrlPolicy,
        timeout: float,
        connections: int = 256,
        ssl_context: ssl.SSLContext | None = None,
        nameservers: list[str] | None = None,
    ) -> None:
        self.policy = policy
        self.timeout = timeout
        self.lookup_timeout = min(timeout, LOOKUP_TIMEOUT_SECONDS)
        # Each attempt asks anew (no cache: CONTRACT 6.3 checks the address at every attempt).
        self._resolver = (
            aiohttp.AsyncResolver(nameservers=nameservers)
            if nameservers
            else aiohttp.AsyncResolver()
        )
        self._ssl = ssl_context or ssl.create_default_context()
        self._ssl.sslobject_class = _TimedSSLObject
        tracing = aiohttp.TraceConfig()
        tracing.on_connection_create_end.append(_connected)
        tracing.on_connection_reuseconn.append(_reused)
        tracing.on_request_headers_sent.append(_sent)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                # As many connections as attempts in flight, no more: a worker talking to
                # thousands of receivers stays within its open files.
                limit=connections,
                # Never cached: each attempt resolves and checks (CONTRACT 6.3), and connects
                # to the address in its URL, which is the checked one.
                use_dns_cache=False,
                keepalive_timeout=KEEPALIVE_SECONDS,
                ssl=self._ssl,
                socket_factory=_note_socket,
            ),
            # Proxies from the environment would connect somewhere other than the checked
            # address; cookies from one receiver are nobody's business at the next.
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None),
            trace_configs=[tracing],
            raise_for_status=False,
            # The body is inflated by answers.py, only as far as what is kept.
            auto_decompress=False,
            max_headers=MAX_RESPONSE_HEADERS,
        )

    async def close(self) -> None:
        await self._session.close()
        await self._resolver.close()

    async def send_attempt(
        self,
        *,
        url: str,
        secret: str,
        body: bytes,
        event_name: str,
        event_id: str,
        delivery_id: str,
        previous_secret: str | None = None,
        trace_headers: dict[str, str] | None = None,
    ) -> AttemptOutcome:
        """One attempt: `trace_headers` (a `traceparent`, CONTRACT 13.6) go with the signed
        ones, and into the attempt's record like them."""
        requested_at = utcnow()
        headers = delivery_headers(
            secret=secret,
            previous_secret=previous_secret,
            timestamp=int(time.time()),
            raw_body=body,
            event_name=event_name,
            event_id=event_id,
            delivery_id=delivery_id,
        )
        if trace_headers:
            headers |= trace_headers
        progress = _Progress(started=time.perf_counter())
        _current.set(progress)
        outcome = _Outcome(requested_at, progress, headers)
        try:
            async with asyncio.timeout(self.timeout):
                return await self._post(url, body, headers, outcome)
        except AddressRefused as refused:
            return outcome.make(error=f"Not sent: {refused}")
        except TimeoutError:
            return outcome.make(
                http_status=progress.status,
                error=f"Timed out after {self.timeout:g}s while {progress.phase}",
            )
        except (aiohttp.ClientError, OSError) as error:
            return outcome.make(http_status=progress.status, error=describe_failure(error))

    async def _post(self, url, body, headers, outcome: _Outcome) -> AttemptOutcome:
        progress = outcome.progress
        name = lookup_name(url, self.policy)
        if name is None:
            target = attempt_target(url, self.policy)
        else:
            progress.phase = "looking up the receiver's address"
            looked_up = time.perf_counter()
            addresses = await self._look_up(*name)
            progress.dns_ms = _ms(time.perf_counter() - looked_up)
            target = attempt_target(url, self.policy, addresses)
            progress.phase = "connecting"
        outcome.remote_address = target.address
        async with self._session.post(
            target.url,
            data=body,
            headers={**headers, "Host": target.host_header, "Accept-Encoding": "identity"},
            allow_redirects=False,
            server_hostname=target.hostname if target.scheme == "https" else None,
            trace_request_ctx=progress,
        ) as response:
            progress.first_byte = time.perf_counter()
            progress.status = response.status
            progress.phase = "reading the response"
            response_body, complete = await read_body_start(response)
            if not complete:
                # Unread bytes are left on the connection: it must not serve another attempt.
                response.close()
            return _judge(response, response_body, outcome)

    async def _look_up(
        self, host: str, port: int
    ) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        try:
            async with asyncio.timeout(self.lookup_timeout):
                found = await self._resolver.resolve(host, port, family=socket.AF_UNSPEC)
        except TimeoutError:
            raise AddressRefused(
                f"Timed out after {self.lookup_timeout:g}s looking up the receiver's address"
            ) from None
        except OSError as error:
            raise AddressRefused(
                f"Could not resolve {host}: {safe_error(str(error.strerror))}"
            ) from None
        # The zone of a scoped IPv6 address (fe80::1%eth0) is irrelevant to the check.
        return [ipaddress.ip_address(result["host"].split("%", 1)[0]) for result in found]


class _Outcome:
    """What an attempt records, whichever way it ends."""

    def __init__(self, requested_at: datetime, progress: _Progress, headers: dict) -> None:
        self.requested_at = requested_at
        self.progress = progress
        self.headers = headers
        self.remote_address: str | None = None

    def make(
        self,
        *,
        http_status: int | None = None,
        error: str | None = None,
        response_body: str | None = None,
        response_headers: dict[str, str] | None = None,
        retry_after_seconds: float | None = None,
        gone: bool = False,
    ) -> AttemptOutcome:
        progress = self.progress
        # Reached only once something was sent; a refusal before it connected none.
        address = self.remote_address if progress.connect_started or progress.reused else None
        return AttemptOutcome(
            requested_at=self.requested_at,
            duration_ms=_ms(time.perf_counter() - progress.started),
            request_headers=progress.sent_headers or self.headers,
            http_status=http_status,
            error=None if error is None else safe_error(error),
            response_body=response_body,
            response_headers=response_headers,
            remote_address=address,
            timings=progress.timings(),
            retry_after_seconds=retry_after_seconds,
            gone=gone,
        )


def _judge(
    response: aiohttp.ClientResponse, response_body: str, outcome: _Outcome
) -> AttemptOutcome:
    status = response.status
    error = None
    if 300 <= status < 400:
        location = response.headers.get("Location", "")[:200]
        error = f"HTTP {status}: redirects are not followed" + (
            f" (Location: {location})" if location else ""
        )
    elif status == _GONE:
        error = "HTTP 410 Gone: the receiver says this endpoint no longer exists"
    elif not 200 <= status < 300:
        error = f"HTTP {status}"
    retry_after = None
    if status in _RETRY_AFTER_STATUSES:
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        if retry_after is not None:
            # A 429 or 503 is not a 2xx: its error was set above.
            error = cast(str, error) + f" (Retry-After: {retry_after:g}s)"
    return outcome.make(
        http_status=status,
        error=error,
        response_body=response_body,
        response_headers=kept_headers(response.headers.items()),
        retry_after_seconds=retry_after,
        gone=status == _GONE,
    )


async def _connected(session, context, params) -> None:
    progress: _Progress = context.trace_request_ctx
    progress.connected = time.perf_counter()
    progress.phase = "sending the request"


async def _reused(session, context, params) -> None:
    progress: _Progress = context.trace_request_ctx
    progress.reused = True
    progress.phase = "sending the request"


async def _sent(session, context, params) -> None:
    progress: _Progress = context.trace_request_ctx
    progress.sent = time.perf_counter()
    progress.sent_headers = {name: value for name, value in params.headers.items()}
    progress.phase = "waiting for the response"


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """`Retry-After` in seconds from now: a number of seconds or an HTTP date, at most an hour
    (CONTRACT 8.6); None when absent or unreadable."""
    if not value or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(int(value))
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # an HTTP date is always GMT
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), float(RETRY_AFTER_MAX_SECONDS))


def describe_failure(error: Exception) -> str:
    """A short cause without the URL (it may carry the brand's own query tokens), and without
    the receiver's own bytes beyond what says what was wrong."""
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        # OpenSSL's words: "Hostname mismatch, ..." or "IP address mismatch, ...".
        if "mismatch" in getattr(error.certificate_error, "verify_message", ""):
            return "TLS error: the receiver's certificate is not for its host name"
        return "TLS error: the receiver's certificate could not be verified"
    if isinstance(error, aiohttp.ClientSSLError | ssl.SSLError):
        return "TLS error: the handshake with the receiver failed"
    if isinstance(error, aiohttp.ServerDisconnectedError):
        return "The receiver closed the connection without answering"
    if isinstance(error, aiohttp.ClientPayloadError):
        return "The receiver's answer was cut short"
    if isinstance(error, aiohttp.ClientResponseError):
        # aiohttp says what was wrong; the receiver's own bytes it may quote are made safe.
        why = safe_text(str(error.message or ""), limit=120).strip()
        return f"{NOT_HTTP} ({why})" if why else NOT_HTTP
    code = getattr(error, "errno", None)
    if isinstance(error, aiohttp.ClientConnectorError):
        code = error.os_error.errno
    if code in (errno.EMFILE, errno.ENFILE):
        return f"{OWN_FAULT} is out of open files; it is retried"
    if code == errno.ECONNREFUSED:
        return "Connection refused"
    if code in (errno.ECONNRESET, errno.EPIPE):
        return "Connection reset by the receiver"
    if isinstance(error, aiohttp.ClientConnectorError | OSError):
        return "Connection failed"
    return f"Request failed ({type(error).__name__})"
