"""Where webhooks may be sent (CONTRACT 6.3).

A receiver URL must reach a public address: otherwise a brand could make our workers call into
our own network (cloud metadata at 169.254.169.254, databases on 10/8, admin ports on loopback).
The rule is checked when an endpoint is registered or updated, and again at every attempt, where
the attempt then connects to exactly the address that was checked: a name that resolved to a
public address for the check cannot resolve to 127.0.0.1 for the connection (DNS rebinding).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from models.webhook_endpoint import URL_MAX_LENGTH
from services.errors import ValidationFailed

# development and test only: a developer's own receiver (CONTRACT 6.3), the sole exception.
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1"})
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class UrlPolicy:
    https_only: bool
    allow_local: bool

    @classmethod
    def for_environment(cls, app_env: str) -> UrlPolicy:
        production = app_env == "production"
        return cls(https_only=production, allow_local=not production)


@dataclass(frozen=True)
class AttemptTarget:
    """Where one attempt connects: the checked address, and the name the receiver expects in
    `Host` and, for HTTPS, in SNI and its certificate."""

    url: str  # the URL with the host replaced by the checked address
    address: str
    hostname: str
    host_header: str
    scheme: str


class AddressRefused(Exception):
    """This attempt may not be made; the message is logged as the attempt's error."""


# What `str.strip()` takes off a URL before it is checked: every whitespace character.
_STRIPPED = r"\t\n\x0b\x0c\r\x1c-\x1f\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# A name whose last label starts with a letter is never an address literal, so the document
# promises no address the public-address rule would refuse.
_DNS_NAME = rf"(?:{_LABEL}\.){{1,4}}[A-Za-z](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?"
_LOCAL_NAME = r"(?:localhost|127\.0\.0\.1)"
# 1-65535 without leading zeros: port 0 (however spelled) is refused.
_PORT = (
    r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}"
    r"|[1-9][0-9]{0,3}))?"
)
# 8 ("https://") + 319 (host) + 6 (port) + 1715 = URL_MAX_LENGTH.
_PATH_AND_QUERY = rf"(?:[/?][^{_STRIPPED}\x00-\x1f#]{{0,{URL_MAX_LENGTH - 8 - 319 - 6 - 1}}})?"


def url_pattern(policy: UrlPolicy) -> str:
    """The `pattern` the document gives receiver URLs under `policy`: URLs of this shape pass
    `validate_endpoint_url` unless their name resolves to an address that is not public (which
    no pattern can know). Every URL it takes is within URL_MAX_LENGTH once trimmed."""
    hosts = f"(?:{_DNS_NAME}|{_LOCAL_NAME})" if policy.allow_local else _DNS_NAME
    secure = f"https://{hosts}{_PORT}{_PATH_AND_QUERY}"
    plain = f"|http://{_LOCAL_NAME}{_PORT}{_PATH_AND_QUERY}" if policy.allow_local else ""
    return f"^[{_STRIPPED}]*(?:{secure}{plain})[{_STRIPPED}]*$"


def validate_endpoint_url(url: str, policy: UrlPolicy) -> str:
    """The URL, trimmed, if an endpoint may be registered with it.

    :raise ValidationFailed: on the `url` field, saying which rule it breaks.
    """
    url = url.strip()
    try:
        parts, hostname = _parse(url, policy)
        addresses = _resolve(hostname, parts.port or _default_port(parts.scheme))
    except AddressRefused as refused:
        raise ValidationFailed("Invalid webhook URL", {"url": [str(refused)]}) from None
    except socket.gaierror:
        # CONTRACT 6.3: a name that does not resolve (yet) is accepted; its attempts fail and
        # are logged until it does.
        return url
    if not _is_local_exception(hostname, policy):
        _require_public(addresses, hostname, error=_validation_error)
    return url


def attempt_target(
    url: str, policy: UrlPolicy, addresses: list[IpAddress] | None = None
) -> AttemptTarget:
    """Check every address the endpoint's host resolves to now, and pick one: `addresses`, as
    the caller looked them up for `lookup_name(url, policy)`, or resolved here (blocking).

    :raise AddressRefused: the URL breaks a rule today, or the name does not resolve.
    """
    parts, hostname = _parse(url, policy)
    port = parts.port or _default_port(parts.scheme)
    if _is_local_exception(hostname, policy):
        # The exception is for the names themselves; resolving localhost could also give ::1,
        # where a receiver bound to 127.0.0.1 is not listening.
        address: IpAddress = ipaddress.ip_address("127.0.0.1")
    else:
        if addresses is None:
            try:
                addresses = _resolve(hostname, port)
            except socket.gaierror as error:
                raise AddressRefused(f"Could not resolve {hostname}: {error.strerror}") from None
        if not addresses:
            raise AddressRefused(f"Could not resolve {hostname}")
        _require_public(addresses, hostname, error=AddressRefused)
        address = addresses[0]
    literal = f"[{address}]" if address.version == 6 else str(address)
    netloc = f"{literal}:{parts.port}" if parts.port else literal
    host_header = parts.netloc.rsplit("@", 1)[-1]
    return AttemptTarget(
        url=parts._replace(netloc=netloc, fragment="").geturl(),
        address=str(address),
        hostname=hostname,
        host_header=host_header,
        scheme=parts.scheme,
    )


def lookup_name(url: str, policy: UrlPolicy) -> tuple[str, int] | None:
    """The (name, port) `attempt_target` needs looked up for this URL; None when it needs no
    lookup (an address literal, the local exception, or a URL it refuses outright)."""
    try:
        parts, hostname = _parse(url, policy)
    except AddressRefused:
        return None
    if _is_local_exception(hostname, policy):
        return None
    try:
        ipaddress.ip_address(hostname)
    except ValueError:
        return hostname, parts.port or _default_port(parts.scheme)
    return None


def is_public_address(address: IpAddress) -> bool:
    """What Python's `ipaddress` calls global, less what it calls global yet no receiver can
    be (multicast, reserved, and IPv6's deprecated site-local fec0::/10, which networks still
    route privately); and what an IPv6 address embeds (mapped, 6to4, Teredo, NAT64) must be
    public too, so that no IPv6 spelling reaches a private IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = [address.ipv4_mapped, address.sixtofour]
        if address.teredo:
            embedded.append(address.teredo[1])
        if address in _NAT64:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        if any(inner is not None and not is_public_address(inner) for inner in embedded):
            return False
    return (
        address.is_global
        and not address.is_multicast
        and not address.is_reserved
        and not getattr(address, "is_site_local", False)
    )


def _parse(url: str, policy: UrlPolicy):
    if len(url) > URL_MAX_LENGTH:
        raise AddressRefused(f"Must be at most {URL_MAX_LENGTH} characters.")
    if any(ch.isspace() or ord(ch) < 0x20 for ch in url):
        raise AddressRefused("Must not contain spaces or control characters.")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError on a malformed port
    except ValueError:
        raise AddressRefused("Must be an absolute URL with a valid host and port.") from None
    if port == 0:  # no receiver listens there; a connection would go to the default port
        raise AddressRefused("Must not use port 0: give a port from 1 to 65535, or none.")
    hostname = (parts.hostname or "").rstrip(".").lower()
    if parts.scheme not in ("http", "https") or not hostname:
        raise AddressRefused("Must be an absolute https:// URL.")
    if parts.username is not None or parts.password is not None:
        raise AddressRefused(
            "Must not contain credentials (user:password@); they would be shown in listings "
            "and logs. Verify our signature instead."
        )
    if parts.fragment:
        raise AddressRefused("Must not contain a #fragment.")
    local = _is_local_exception(hostname, policy)
    if parts.scheme != "https" and not local:
        if policy.allow_local:
            raise AddressRefused(
                "Must use https://; http:// is accepted only for localhost and 127.0.0.1 "
                "outside production."
            )
        raise AddressRefused("Must use https:// in production.")
    return parts, hostname


def _is_local_exception(hostname: str, policy: UrlPolicy) -> bool:
    return policy.allow_local and hostname in LOCAL_HOSTS


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def _resolve(hostname: str, port: int) -> list[IpAddress]:
    try:
        return [ipaddress.ip_address(hostname)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
    except UnicodeError:  # a label over 63 characters, or empty: no name at all
        raise AddressRefused("Must be an absolute URL with a valid host name.") from None
    # The zone of a scoped IPv6 address (fe80::1%eth0) is irrelevant to the check.
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def _require_public(addresses: list[IpAddress], hostname: str, *, error) -> None:
    for address in addresses:
        if not is_public_address(address):
            shown = "" if str(address) == hostname else f" ({address})"
            raise error(
                f"{hostname}{shown} is a loopback, private, link-local, multicast or reserved "
                "address; webhooks are delivered only to public addresses."
            )


def _validation_error(message: str) -> ValidationFailed:
    return ValidationFailed("Invalid webhook URL", {"url": [message]})
