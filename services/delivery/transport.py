"""One delivery attempt over HTTP (mechanism 13 of docs/delivery.md): resolve and check the
receiver's address, connect to exactly it, post the signed body, and say what happened in words
a brand can act on. `WEBHOOK_TIMEOUT` bounds the whole attempt on the wall clock, lookup, connect
and answer alike; the answer is read by answers.py. The connect and the TLS handshake are timed
apart (CONTRACT 12.5) through a context variable the attempt sets.
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
from typing import Any, cast

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
# An idle kept-alive connection's life: a worker talking to thousands of receivers holds few.
KEEPALIVE_SECONDS = 15.0
# A name lookup's own deadline, within the attempt's.
LOOKUP_TIMEOUT_SECONDS = 5.0
# More headers (or a line over 8 KiB) is not valid HTTP, a failure the breaker slows down: a 200
# with a megabyte of headers would cost that much parsing on every delivery.
MAX_RESPONSE_HEADERS = 128
NOT_HTTP = "The receiver's answer is not valid HTTP"


@dataclass
class _Progress:
    """One attempt as it goes: what it is doing (for a timeout's words), when each step began
    (time.perf_counter()), and what it will record whichever way it ends."""

    requested_at: datetime
    headers: dict[str, str]
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
    remote_address: str | None = None

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

    def outcome(self, *, error: str | None = None, **answer: Any) -> AttemptOutcome:
        """The attempt's outcome, with what it got of an answer (AttemptOutcome's fields)."""
        # An address is reached only once something was sent; a refusal before it connected none.
        reached = self.connect_started or self.reused
        return AttemptOutcome(
            requested_at=self.requested_at,
            duration_ms=_ms(time.perf_counter() - self.started),
            request_headers=self.sent_headers or self.headers,
            error=None if error is None else safe_error(error),
            remote_address=self.remote_address if reached else None,
            timings=self.timings(),
            **answer,
        )


# The attempt whose connection the current task is making.
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
    """One aiohttp session per worker, kept-alive connections shared by its attempts; create
    and use it on the delivery loop's asyncio loop."""

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
                # As many connections as attempts in flight: within the worker's open files.
                limit=connections,
                # Each attempt resolves and checks anew (CONTRACT 6.3), and connects to the
                # checked address, which is in its URL.
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
            # answers.py inflates the body only as far as what is kept.
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
        """One attempt; `trace_headers` (CONTRACT 13.6) go with the signed ones."""
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
        progress = _Progress(requested_at, headers, started=time.perf_counter())
        _current.set(progress)
        try:
            async with asyncio.timeout(self.timeout):
                return await self._post(url, body, progress)
        except AddressRefused as refused:
            return progress.outcome(error=f"Not sent: {refused}")
        except TimeoutError:
            return progress.outcome(
                http_status=progress.status,
                error=f"Timed out after {self.timeout:g}s while {progress.phase}",
            )
        except (aiohttp.ClientError, OSError) as error:
            return progress.outcome(http_status=progress.status, error=describe_failure(error))

    async def _post(self, url: str, body: bytes, progress: _Progress) -> AttemptOutcome:
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
        progress.remote_address = target.address
        async with self._session.post(
            target.url,
            data=body,
            headers={**progress.headers, "Host": target.host_header, "Accept-Encoding": "identity"},
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
            return _judge(response, response_body, progress)

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


def _judge(
    response: aiohttp.ClientResponse, response_body: str, progress: _Progress
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
        if retry_after is not None:  # a 429 or 503: its error was set above
            error = cast(str, error) + f" (Retry-After: {retry_after:g}s)"
    return progress.outcome(
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
    """A short cause without the URL (it may carry the brand's query tokens) or the receiver's
    bytes beyond what says what was wrong."""
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
