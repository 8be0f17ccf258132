"""One delivery attempt over HTTP: resolve and check the receiver's address, connect to exactly
that address, post the signed body, and report what happened in words a brand can act on.

Attempts run on the delivery loop's asyncio loop (workers/delivery_loop.py) over one aiohttp
session per worker process, which keeps connections to each receiver alive between attempts (a
TLS handshake per delivery would cost more than the delivery). `WEBHOOK_TIMEOUT` bounds the
whole attempt on the wall clock, name lookup, connect, sending, the answer's headers and its
body alike: a receiver that trickles a byte a second cannot hold an attempt past it. Names are
looked up on the loop too (c-ares), each under a deadline of its own, so a brand whose DNS is
slow holds only its own attempts.
"""

from __future__ import annotations

import asyncio
import email.utils
import errno
import ipaddress
import socket
import ssl
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import cast

import aiohttp

from models.columns import utcnow
from models.webhook_delivery import RESPONSE_BODY_MAX_BYTES
from services.delivery_attempts import RETRY_AFTER_MAX_SECONDS, AttemptOutcome
from services.endpoint_urls import AddressRefused, UrlPolicy, attempt_target, lookup_name
from services.signing import delivery_headers

# Receivers that may ask for a later retry (CONTRACT 8.6).
_RETRY_AFTER_STATUSES = (429, 503)
_GONE = 410
# A kept-alive connection idle this long is closed (receivers commonly close after 60 s).
KEEPALIVE_SECONDS = 30.0
# A name lookup's own deadline, within the attempt's.
LOOKUP_TIMEOUT_SECONDS = 5.0


class Transport:
    """The HTTP side of a worker process's engine: one aiohttp session on the engine's loop.
    Create and use it on that loop."""

    def __init__(
        self,
        *,
        policy: UrlPolicy,
        timeout: float,
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
        tracing = aiohttp.TraceConfig()
        tracing.on_connection_create_end.append(_connected)
        tracing.on_connection_reuseconn.append(_connected)
        tracing.on_request_headers_sent.append(_sent)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=0,  # the engine bounds attempts in flight
                # Never cached: each attempt resolves and checks (CONTRACT 6.3), and connects
                # to the address in its URL, which is the checked one.
                use_dns_cache=False,
                keepalive_timeout=KEEPALIVE_SECONDS,
                ssl=self._ssl,
            ),
            # Proxies from the environment would connect somewhere other than the checked
            # address; cookies from one receiver are nobody's business at the next.
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None),
            trace_configs=[tracing],
            raise_for_status=False,
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
        delivery_id: str,
        previous_secret: str | None = None,
    ) -> AttemptOutcome:
        requested_at = utcnow()
        started = time.perf_counter()
        headers = delivery_headers(
            secret=secret,
            previous_secret=previous_secret,
            timestamp=int(time.time()),
            raw_body=body,
            event_name=event_name,
            delivery_id=delivery_id,
        )
        progress = SimpleNamespace(phase="connecting", status=None)
        try:
            async with asyncio.timeout(self.timeout):
                return await self._post(url, body, headers, requested_at, started, progress)
        except AddressRefused as refused:
            return _outcome(requested_at, started, headers, error=f"Not sent: {refused}")
        except TimeoutError:
            return _outcome(
                requested_at,
                started,
                headers,
                http_status=progress.status,
                error=f"Timed out after {self.timeout:g}s while {progress.phase}",
            )
        except (aiohttp.ClientError, OSError) as error:
            return _outcome(
                requested_at,
                started,
                headers,
                http_status=progress.status,
                error=describe_failure(error),
            )

    async def _post(self, url, body, headers, requested_at, started, progress) -> AttemptOutcome:
        name = lookup_name(url, self.policy)
        if name is None:
            target = attempt_target(url, self.policy)
        else:
            progress.phase = "looking up the receiver's address"
            addresses = await self._look_up(*name)
            target = attempt_target(url, self.policy, addresses)
            progress.phase = "connecting"
        async with self._session.post(
            target.url,
            data=body,
            headers={**headers, "Host": target.host_header},
            allow_redirects=False,
            server_hostname=target.hostname if target.scheme == "https" else None,
            trace_request_ctx=progress,
        ) as response:
            progress.status = response.status
            progress.phase = "reading the response"
            response_body, complete = await _read_start(response)
            if not complete:
                # Unread bytes are left on the connection: it must not serve another attempt.
                response.close()
        return _judge(response, response_body, requested_at, started, headers)

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
            raise AddressRefused(f"Could not resolve {host}: {error.strerror}") from None
        # The zone of a scoped IPv6 address (fe80::1%eth0) is irrelevant to the check.
        return [ipaddress.ip_address(result["host"].split("%", 1)[0]) for result in found]


def _judge(response, response_body, requested_at, started, headers) -> AttemptOutcome:
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
    return _outcome(
        requested_at,
        started,
        headers,
        http_status=status,
        error=error,
        response_body=response_body,
        retry_after_seconds=retry_after,
        gone=status == _GONE,
    )


async def _connected(session, context, params) -> None:
    context.trace_request_ctx.phase = "sending the request"


async def _sent(session, context, params) -> None:
    context.trace_request_ctx.phase = "waiting for the response"


async def _read_start(response: aiohttp.ClientResponse) -> tuple[str, bool]:
    """The first 2 KiB of the body as text, and whether that was all of it."""
    collected = b""
    while len(collected) <= RESPONSE_BODY_MAX_BYTES:
        chunk = await response.content.read(RESPONSE_BODY_MAX_BYTES + 1 - len(collected))
        if not chunk:
            return collected.decode("utf-8", errors="replace"), True
        collected += chunk
    return collected[:RESPONSE_BODY_MAX_BYTES].decode("utf-8", errors="replace"), False


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
    """A short cause without the URL (it may carry the brand's own query tokens)."""
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
        return "The receiver's answer is not valid HTTP"
    code = getattr(error, "errno", None)
    if isinstance(error, aiohttp.ClientConnectorError):
        code = error.os_error.errno
    if code == errno.ECONNREFUSED:
        return "Connection refused"
    if code in (errno.ECONNRESET, errno.EPIPE):
        return "Connection reset by the receiver"
    if isinstance(error, aiohttp.ClientConnectorError | OSError):
        return "Connection failed"
    return f"Request failed ({type(error).__name__})"


def _outcome(
    requested_at: datetime,
    started: float,
    headers: dict[str, str],
    *,
    http_status: int | None = None,
    error: str | None = None,
    response_body: str | None = None,
    retry_after_seconds: float | None = None,
    gone: bool = False,
) -> AttemptOutcome:
    return AttemptOutcome(
        requested_at=requested_at,
        duration_ms=round((time.perf_counter() - started) * 1000),
        request_headers=headers,
        http_status=http_status,
        error=error,
        response_body=response_body,
        retry_after_seconds=retry_after_seconds,
        gone=gone,
    )
