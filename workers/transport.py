"""One delivery attempt over HTTP: resolve and check the receiver's address, connect to exactly
that address, post the signed body, and report what happened in words a brand can act on.

One `requests.Session` per worker process keeps connections to each receiver alive between
attempts (a TLS handshake per delivery would cost more than the delivery).
"""

from __future__ import annotations

import time
from datetime import datetime

import requests
from requests.adapters import HTTPAdapter

from models.columns import utcnow
from models.webhook_delivery import RESPONSE_BODY_MAX_BYTES
from services.delivery_attempts import AttemptOutcome
from services.endpoint_urls import AddressRefused, UrlPolicy, attempt_target
from services.signing import delivery_headers

_READ_CHUNK = 1024


class PinnedAddressAdapter(HTTPAdapter):
    """Connects to the address in the request URL (the one that was checked) while TLS still
    sends and verifies the receiver's own name: SNI and the certificate check use
    `request.pinned_hostname`, and connections are pooled per (address, name)."""

    def build_connection_pool_key_attributes(self, request, verify, cert=None):
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(
            request, verify, cert
        )
        hostname = getattr(request, "pinned_hostname", None)
        if hostname and host_params.get("scheme") == "https":
            pool_kwargs["server_hostname"] = hostname
            pool_kwargs["assert_hostname"] = hostname
        return host_params, pool_kwargs


def new_session() -> requests.Session:
    session = requests.Session()
    # Proxies from the environment would connect somewhere other than the checked address.
    session.trust_env = False
    adapter = PinnedAddressAdapter(pool_connections=64, pool_maxsize=4, max_retries=0)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    return session


def send_attempt(
    session: requests.Session,
    *,
    url: str,
    policy: UrlPolicy,
    secret: str,
    body: bytes,
    event_name: str,
    delivery_id: str,
    timeout: float,
) -> AttemptOutcome:
    requested_at = utcnow()
    started = time.perf_counter()
    headers = delivery_headers(
        secret=secret,
        timestamp=int(time.time()),
        raw_body=body,
        event_name=event_name,
        delivery_id=delivery_id,
    )
    try:
        target = attempt_target(url, policy)
    except AddressRefused as refused:
        return _outcome(requested_at, started, headers, error=f"Not sent: {refused}")
    prepared = requests.Request("POST", target.url, data=body, headers=headers).prepare()
    prepared.headers["Host"] = target.host_header
    prepared.pinned_hostname = target.hostname
    try:
        response = session.send(
            prepared, timeout=(timeout, timeout), allow_redirects=False, stream=True
        )
    except requests.exceptions.RequestException as error:
        return _outcome(requested_at, started, headers, error=describe_failure(error, timeout))
    try:
        response_body, cut_short = _read_start(response, deadline=started + timeout)
    except requests.exceptions.RequestException as error:
        response.close()
        return _outcome(
            requested_at,
            started,
            headers,
            http_status=response.status_code,
            error=describe_failure(error, timeout),
        )
    response.close()
    error = None
    if cut_short == "timeout":
        error = f"Timed out after {timeout:g}s while reading the response"
    elif 300 <= response.status_code < 400:
        location = response.headers.get("Location", "")[:200]
        error = f"HTTP {response.status_code}: redirects are not followed" + (
            f" (Location: {location})" if location else ""
        )
    elif not 200 <= response.status_code < 300:
        error = f"HTTP {response.status_code}"
    return _outcome(
        requested_at,
        started,
        headers,
        http_status=response.status_code,
        error=error,
        response_body=response_body,
    )


def describe_failure(error: requests.exceptions.RequestException, timeout: float) -> str:
    """A short cause without the URL (it may carry the brand's own query tokens)."""
    if isinstance(error, requests.exceptions.ConnectTimeout):
        return f"Timed out after {timeout:g}s while connecting"
    if isinstance(error, requests.exceptions.Timeout):
        return f"Timed out after {timeout:g}s waiting for the response"
    if isinstance(error, requests.exceptions.SSLError):
        reason = str(error)
        if "doesn't match" in reason or "does not match" in reason:
            return "TLS error: the receiver's certificate is not for its host name"
        if "CERTIFICATE_VERIFY_FAILED" in reason:
            return "TLS error: the receiver's certificate could not be verified"
        return "TLS error: the handshake with the receiver failed"
    if isinstance(error, requests.exceptions.ConnectionError):
        reason = str(error)
        if "Connection refused" in reason:
            return "Connection refused"
        if "Connection reset" in reason:
            return "Connection reset by the receiver"
        if "RemoteDisconnected" in reason or "closed connection" in reason:
            return "The receiver closed the connection without answering"
        return "Connection failed"
    return f"Request failed ({type(error).__name__})"


def _read_start(response: requests.Response, *, deadline: float) -> tuple[str, str | None]:
    """The first 2 KiB of the body as text; reading stops there or at the deadline."""
    collected = b""
    cut_short = None
    for chunk in response.iter_content(_READ_CHUNK):
        collected += chunk
        if len(collected) > RESPONSE_BODY_MAX_BYTES:
            cut_short = "size"
            break
        if time.perf_counter() > deadline:
            cut_short = "timeout"
            break
    text = collected[:RESPONSE_BODY_MAX_BYTES].decode("utf-8", errors="replace")
    return text, cut_short


def _outcome(
    requested_at: datetime,
    started: float,
    headers: dict[str, str],
    *,
    http_status: int | None = None,
    error: str | None = None,
    response_body: str | None = None,
) -> AttemptOutcome:
    return AttemptOutcome(
        requested_at=requested_at,
        duration_ms=round((time.perf_counter() - started) * 1000),
        request_headers=headers,
        http_status=http_status,
        error=error,
        response_body=response_body,
    )
