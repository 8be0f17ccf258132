"""Where webhooks may be sent (CONTRACT 6.3).

A receiver URL must reach a public address: otherwise a brand could make our workers call into
our own network (cloud metadata at 169.254.169.254, databases on 10/8, admin ports on loopback).
The rule is checked when an endpoint is registered or updated, and again at every attempt, where
the attempt then connects to exactly the address that was checked: a name that resolved to a
public address for the check cannot resolve to 127.0.0.1 for the connection (DNS rebinding).
"Public" is IANA's word for it: every block of the two special-purpose address registries whose
"Globally Reachable" is not True is refused (SPECIAL_PURPOSE_BLOCKS), and multicast.
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

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class SpecialPurposeBlock:
    """An entry of IANA's IPv4 or IPv6 Special-Purpose Address Registry (RFC 6890)."""

    network: IpNetwork
    name: str
    # The registry's "Globally Reachable": True, False, or None where it says N/A or nothing
    # (Teredo, 6to4, the deprecated 6to4 relay and ORCHID blocks). Only True may be a receiver.
    globally_reachable: bool | None


# Both registries whole, with their names, as IANA published them in 2025 (IPv4 26 entries,
# IPv6 25; https://www.iana.org/assignments/iana-ipv4-special-registry and
# iana-ipv6-special-registry). An address takes the most specific entry holding it, so the
# globally reachable services inside a refused block (192.0.0.9 in 192.0.0.0/24, AMT's
# 2001:3::/32 in 2001::/23) stay reachable, as the registry says they are. Python's
# `ipaddress.is_global` is not this list: 3.11 calls 192.0.0.0/24 and 3fff::/20 global.
SPECIAL_PURPOSE_BLOCKS = tuple(
    SpecialPurposeBlock(ipaddress.ip_network(network), name, reachable)
    for network, name, reachable in (
        ("0.0.0.0/8", '"This network"', False),
        ("0.0.0.0/32", '"This host on this network"', False),
        ("10.0.0.0/8", "Private-Use", False),
        ("100.64.0.0/10", "Shared Address Space", False),
        ("127.0.0.0/8", "Loopback", False),
        ("169.254.0.0/16", "Link Local", False),
        ("172.16.0.0/12", "Private-Use", False),
        ("192.0.0.0/24", "IETF Protocol Assignments", False),
        ("192.0.0.0/29", "IPv4 Service Continuity Prefix", False),
        ("192.0.0.8/32", "IPv4 dummy address", False),
        ("192.0.0.9/32", "Port Control Protocol Anycast", True),
        ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", True),
        ("192.0.0.170/32", "NAT64/DNS64 Discovery", False),
        ("192.0.0.171/32", "NAT64/DNS64 Discovery", False),
        ("192.0.2.0/24", "Documentation (TEST-NET-1)", False),
        ("192.31.196.0/24", "AS112-v4", True),
        ("192.52.193.0/24", "AMT", True),
        ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", None),
        ("192.88.99.2/32", "6a44-relay anycast address", False),
        ("192.168.0.0/16", "Private-Use", False),
        ("192.175.48.0/24", "Direct Delegation AS112 Service", True),
        ("198.18.0.0/15", "Benchmarking", False),
        ("198.51.100.0/24", "Documentation (TEST-NET-2)", False),
        ("203.0.113.0/24", "Documentation (TEST-NET-3)", False),
        ("240.0.0.0/4", "Reserved", False),
        ("255.255.255.255/32", "Limited Broadcast", False),
        ("::1/128", "Loopback Address", False),
        ("::/128", "Unspecified Address", False),
        ("::ffff:0:0/96", "IPv4-mapped Address", False),
        ("64:ff9b::/96", "IPv4-IPv6 Translat.", True),
        ("64:ff9b:1::/48", "IPv4-IPv6 Translat.", False),
        ("100::/64", "Discard-Only Address Block", False),
        ("100:0:0:1::/64", "Dummy IPv6 Prefix", False),
        ("2001::/23", "IETF Protocol Assignments", False),
        ("2001::/32", "TEREDO", None),
        ("2001:1::1/128", "Port Control Protocol Anycast", True),
        ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", True),
        ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", True),
        ("2001:2::/48", "Benchmarking", False),
        ("2001:3::/32", "AMT", True),
        ("2001:4:112::/48", "AS112-v6", True),
        ("2001:10::/28", "Deprecated (previously ORCHID)", None),
        ("2001:20::/28", "ORCHIDv2", True),
        ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", True),
        ("2001:db8::/32", "Documentation", False),
        ("2002::/16", "6to4", None),
        ("2620:4f:8000::/48", "Direct Delegation AS112 Service", True),
        ("3fff::/20", "Documentation", False),
        ("5f00::/16", "Segment Routing (SRv6) SIDs", False),
        ("fc00::/7", "Unique-Local", False),
        ("fe80::/10", "Link-Local Unicast", False),
    )
)
# Most specific first: the first block holding an address is the one that decides.
_BY_SPECIFICITY = sorted(SPECIAL_PURPOSE_BLOCKS, key=lambda block: -block.network.prefixlen)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


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
        addresses = _resolve(hostname, parts.port or default_port(parts.scheme))
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
    port = parts.port or default_port(parts.scheme)
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
        return hostname, parts.port or default_port(parts.scheme)
    return None


def special_purpose_block(address: IpAddress) -> SpecialPurposeBlock | None:
    """The most specific registry entry holding `address`, or None when none does."""
    return next(
        (
            block
            for block in _BY_SPECIFICITY
            if block.network.version == address.version and address in block.network
        ),
        None,
    )


def is_public_address(address: IpAddress) -> bool:
    """Whether a receiver may be at `address`: inside a special-purpose block, only when that
    block is globally reachable (and a NAT64 address only when the IPv4 address it carries is
    public); outside every block, anything but multicast, IPv6 space IANA has not allocated
    (`is_reserved`) and IPv6's deprecated site-local fec0::/10, which predates the registry
    and which networks still route privately."""
    block = special_purpose_block(address)
    if block is not None:
        if address in _NAT64:
            return is_public_address(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        return block.globally_reachable is True
    return not (
        address.is_multicast or address.is_reserved or getattr(address, "is_site_local", False)
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


def default_port(scheme: str) -> int:
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
            block = special_purpose_block(address)
            named = f" ({block.network}, {block.name})" if block is not None else ""
            raise error(
                f"{hostname}{shown} is a loopback, private, link-local, multicast or reserved "
                f"address{named}; webhooks are delivered only to public addresses."
            )


def _validation_error(message: str) -> ValidationFailed:
    return ValidationFailed("Invalid webhook URL", {"url": [message]})
