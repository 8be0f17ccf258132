"""Where webhooks may be sent (CONTRACT 6.3): the URL rules on register-endpoint and
update-endpoint in test and production apps, and services.endpoint_urls itself."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterator

import pytest
from flask import Flask

from app import create_app
from extensions import db
from services import endpoint_urls
from services.endpoint_urls import (
    AddressRefused,
    UrlPolicy,
    attempt_target,
    is_public_address,
    validate_endpoint_url,
)
from services.errors import ValidationFailed
from tests.helpers import assert_error, assert_success

UNRESOLVABLE = "https://hooks.brand-example.invalid/x"
LONG_PATH_PREFIX = "https://hooks.brand-example.invalid/"
TEST_POLICY = UrlPolicy.for_environment("test")
DEV_POLICY = UrlPolicy.for_environment("development")
PRODUCTION_POLICY = UrlPolicy.for_environment("production")

# Literal addresses that are not public, refused in every environment (over https, so that the
# address is the only rule broken).
NON_PUBLIC_HOSTS = [
    "10.0.0.1",
    "172.16.0.1",
    "192.168.1.1",
    "127.0.0.2",
    "169.254.169.254",
    "0.0.0.0",  # noqa: S104 - a refused address, not a bind
    "224.0.0.1",
    "240.0.0.1",
    "100.64.0.1",
    "[::1]",
    "[fe80::1]",
    "[fc00::1]",
    "[fec0::1]",
    "[::ffff:10.0.0.1]",
    "[::ffff:127.0.0.1]",
    "[2002:7f00:1::1]",
    "[64:ff9b::a00:1]",
    "2130706433",
]
NON_PUBLIC_URLS = [f"https://{host}/hooks" for host in NON_PUBLIC_HOSTS]

# Broken whatever the environment.
MALFORMED_URLS = [
    LONG_PATH_PREFIX + "a" * (2049 - len(LONG_PATH_PREFIX)),
    "https://user:pass@hooks.brand-example.invalid/x",
    "https://token@hooks.brand-example.invalid/x",
    "https://hooks.brand-example.invalid/x#frag",
    "ftp://hooks.brand-example.invalid/x",
    "not a url",
    "hooks.brand-example.invalid/x",
    "https://",
    "https://hooks.brand-example.invalid:99999/x",
    "https://hooks.brand-example.invalid:0/x",
    "https://hooks.brand-example.invalid:00/x",
    "https://93.184.216.34:0/x",
    "javascript:alert(1)",
]

LOCAL_URLS = [
    "http://localhost:8080/hooks",
    "http://127.0.0.1:9000/hooks",
    "http://localhost/hooks",
    "https://localhost:8443/hooks",
    "https://127.0.0.1/hooks",
]


def register_response(client, brand_id: str, key: str, url):
    return client.post(
        f"/api/v1/brand/{brand_id}/webhook/register-endpoint",
        json={"url": url},
        headers={"X-Api-Key": key},
    )


def listed_urls(client, brand_id: str, key: str) -> list[str]:
    response = client.get(
        f"/api/v1/brand/{brand_id}/webhook/fetch-endpoints", headers={"X-Api-Key": key}
    )
    return [item["url"] for item in assert_success(response)["endpoints"]]


def assert_url_refused(response) -> None:
    body = assert_error(response, 400, "VALIDATION_ERROR")
    assert body["errors"]["url"], body


@pytest.fixture(scope="module")
def production_app(app, app_environ) -> Iterator[Flask]:
    """A production-mode app on the same database as `app` (already migrated)."""
    application = create_app({**app_environ, "APP_ENV": "production"})
    yield application
    with application.app_context():
        db.engine.dispose()


@pytest.fixture
def production_client(production_app):
    return production_app.test_client()


@pytest.fixture
def endpoint_id(client, brand, write_key) -> str:
    return assert_success(register_response(client, brand, write_key, UNRESOLVABLE), 201)["id"]


def update_response(client, brand_id: str, key: str, endpoint: str, url):
    return client.patch(
        f"/api/v1/brand/{brand_id}/webhook/{endpoint}/update-endpoint",
        json={"url": url},
        headers={"X-Api-Key": key},
    )


# --- register-endpoint in the test environment -------------------------------------------------


@pytest.mark.parametrize("url", LOCAL_URLS)
def test_local_receivers_are_accepted_outside_production(client, brand, write_key, url):
    data = assert_success(register_response(client, brand, write_key, url), 201)
    assert data["url"] == url


@pytest.mark.parametrize(
    "url",
    [
        UNRESOLVABLE,
        "https://93.184.216.34/hooks",
        "https://[2606:4700:4700::1111]:8443/hooks",
        "https://hooks.brand-example.invalid:8443/x?source=brand",
    ],
)
def test_public_or_unresolvable_https_urls_are_accepted(client, brand, write_key, url):
    data = assert_success(register_response(client, brand, write_key, url), 201)
    assert data["url"] == url
    assert listed_urls(client, brand, write_key) == [url]


def test_a_url_of_exactly_2048_characters_is_accepted(client, brand, write_key):
    url = LONG_PATH_PREFIX + "a" * (2048 - len(LONG_PATH_PREFIX))
    assert len(url) == 2048
    assert_success(register_response(client, brand, write_key, url), 201)


@pytest.mark.parametrize(
    "url",
    [
        "http://hooks.brand-example.invalid/x",
        "http://93.184.216.34/hooks",
        "http://localhost.brand-example.invalid/x",
    ],
)
def test_plain_http_is_refused_except_for_localhost(client, brand, write_key, url):
    assert_url_refused(register_response(client, brand, write_key, url))


@pytest.mark.parametrize("url", NON_PUBLIC_URLS)
def test_non_public_addresses_are_refused(client, brand, write_key, url):
    assert_url_refused(register_response(client, brand, write_key, url))
    assert listed_urls(client, brand, write_key) == []


@pytest.mark.parametrize("url", MALFORMED_URLS)
def test_malformed_urls_are_refused(client, brand, write_key, url):
    assert_url_refused(register_response(client, brand, write_key, url))
    assert listed_urls(client, brand, write_key) == []


@pytest.mark.parametrize(
    "url", ["http://localhost:0/hooks", "http://127.0.0.1:0/hooks", "https://localhost:000/x"]
)
def test_port_0_is_refused_even_for_a_local_receiver(client, brand, write_key, url):
    body = assert_error(register_response(client, brand, write_key, url), 400, "VALIDATION_ERROR")
    assert body["errors"] == {"url": ["Must not use port 0: give a port from 1 to 65535, or none."]}
    assert listed_urls(client, brand, write_key) == []


def test_an_attempt_to_port_0_is_refused_not_sent_to_the_default_port():
    """An endpoint stored before the rule: its attempts fail instead of reaching port 80."""
    for url in ["http://localhost:0/hooks", "https://93.184.216.34:0/x"]:
        with pytest.raises(AddressRefused, match="port 0"):
            attempt_target(url, TEST_POLICY)


# --- register-endpoint in production -----------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        *LOCAL_URLS,
        "http://hooks.brand-example.invalid/x",
        "https://LOCALHOST/hooks",
        "https://localhost./hooks",
    ],
)
def test_production_refuses_http_and_loopback(production_client, brand, write_key, url):
    assert_url_refused(register_response(production_client, brand, write_key, url))


@pytest.mark.parametrize("url", NON_PUBLIC_URLS)
def test_production_refuses_non_public_addresses(production_client, brand, write_key, url):
    assert_url_refused(register_response(production_client, brand, write_key, url))


def test_production_accepts_public_and_unresolvable_https(production_client, brand, write_key):
    for url in (UNRESOLVABLE, "https://93.184.216.34/hooks"):
        assert_success(register_response(production_client, brand, write_key, url), 201)


# --- update-endpoint applies the same rules ----------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://10.0.0.1/hooks",
        "https://169.254.169.254/latest/meta-data",
        "https://[::ffff:10.0.0.1]/hooks",
        "https://[64:ff9b::a00:1]/hooks",
        "https://2130706433/hooks",
        "http://hooks.brand-example.invalid/x",
        "https://user:pass@hooks.brand-example.invalid/x",
        "https://hooks.brand-example.invalid/x#frag",
        "ftp://hooks.brand-example.invalid/x",
        LONG_PATH_PREFIX + "a" * 2049,
        "",
    ],
)
def test_update_refuses_a_bad_url_and_keeps_the_old_one(client, brand, write_key, endpoint_id, url):
    assert_url_refused(update_response(client, brand, write_key, endpoint_id, url))
    assert listed_urls(client, brand, write_key) == [UNRESOLVABLE]


def test_update_accepts_a_local_receiver_outside_production(client, brand, write_key, endpoint_id):
    response = update_response(client, brand, write_key, endpoint_id, "http://localhost:7000/h")
    assert assert_success(response)["url"] == "http://localhost:7000/h"


def test_update_in_production_refuses_localhost(
    production_client, client, brand, write_key, endpoint_id
):
    response = update_response(
        production_client, brand, write_key, endpoint_id, "http://localhost:1/"
    )
    assert_url_refused(response)
    assert listed_urls(client, brand, write_key) == [UNRESOLVABLE]


# --- services.endpoint_urls --------------------------------------------------------------------


def fake_resolver(table: dict[str, list[str]]):
    """A getaddrinfo that answers from `table` and fails for any other name."""

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (
                socket.AF_INET6 if ":" in address else socket.AF_INET,
                socket.SOCK_STREAM,
                6,
                "",
                (address, port),
            )
            for address in table[host]
        ]

    return getaddrinfo


@pytest.fixture
def dns(monkeypatch):
    table: dict[str, list[str]] = {}
    monkeypatch.setattr(endpoint_urls.socket, "getaddrinfo", fake_resolver(table))
    return table


def test_policies_per_environment():
    assert PRODUCTION_POLICY.https_only and not PRODUCTION_POLICY.allow_local
    for policy in (TEST_POLICY, DEV_POLICY):
        assert policy.allow_local and not policy.https_only


def test_validate_returns_the_trimmed_url():
    assert validate_endpoint_url(f"  {UNRESOLVABLE}\n", PRODUCTION_POLICY) == UNRESOLVABLE


def test_validate_refuses_a_name_that_resolves_to_a_private_address(dns):
    dns["internal.brand-example.com"] = ["10.1.2.3"]
    with pytest.raises(ValidationFailed) as raised:
        validate_endpoint_url("https://internal.brand-example.com/h", PRODUCTION_POLICY)
    assert "10.1.2.3" in raised.value.errors["url"][0]


def test_validate_refuses_a_name_with_any_private_address_among_public_ones(dns):
    dns["mixed.brand-example.com"] = ["93.184.216.34", "fd00::5"]
    with pytest.raises(ValidationFailed):
        validate_endpoint_url("https://mixed.brand-example.com/h", PRODUCTION_POLICY)


def test_validate_accepts_a_name_that_resolves_to_public_addresses(dns):
    dns["hooks.brand-example.com"] = ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]
    url = "https://hooks.brand-example.com/h"
    assert validate_endpoint_url(url, PRODUCTION_POLICY) == url


def test_attempt_target_connects_to_the_checked_address(dns):
    dns["hooks.brand-example.com"] = ["93.184.216.34"]
    target = attempt_target("https://hooks.brand-example.com:8443/in?a=1", PRODUCTION_POLICY)
    assert target.url == "https://93.184.216.34:8443/in?a=1"
    assert target.address == "93.184.216.34"
    assert target.hostname == "hooks.brand-example.com"
    assert target.host_header == "hooks.brand-example.com:8443"
    assert target.scheme == "https"


def test_attempt_target_brackets_an_ipv6_address(dns):
    dns["v6.brand-example.com"] = ["2606:4700:4700::1111"]
    target = attempt_target("https://v6.brand-example.com/in", PRODUCTION_POLICY)
    assert target.url == "https://[2606:4700:4700::1111]/in"
    assert target.host_header == "v6.brand-example.com"


def test_attempt_target_refuses_a_name_rebound_to_a_private_address(dns):
    dns["hooks.brand-example.com"] = ["93.184.216.34"]
    url = "https://hooks.brand-example.com/in"
    assert validate_endpoint_url(url, PRODUCTION_POLICY) == url
    dns["hooks.brand-example.com"] = ["169.254.169.254"]
    with pytest.raises(AddressRefused):
        attempt_target(url, PRODUCTION_POLICY)


def test_attempt_target_refuses_an_unresolvable_name(dns):
    with pytest.raises(AddressRefused):
        attempt_target(UNRESOLVABLE, PRODUCTION_POLICY)


@pytest.mark.parametrize("url", NON_PUBLIC_URLS)
def test_attempt_target_refuses_non_public_literals(url):
    with pytest.raises(AddressRefused):
        attempt_target(url, TEST_POLICY)


def test_attempt_target_for_localhost_uses_127_0_0_1_outside_production():
    target = attempt_target("http://localhost:8123/hooks", TEST_POLICY)
    assert target.url == "http://127.0.0.1:8123/hooks"
    assert target.host_header == "localhost:8123"
    assert target.hostname == "localhost"
    with pytest.raises(AddressRefused):
        attempt_target("https://localhost:8123/hooks", PRODUCTION_POLICY)


def test_attempt_target_drops_the_fragment_and_refuses_http_in_production():
    with pytest.raises(AddressRefused):
        attempt_target("http://93.184.216.34/hooks", PRODUCTION_POLICY)
    target = attempt_target("https://93.184.216.34/hooks", PRODUCTION_POLICY)
    assert target.url == "https://93.184.216.34/hooks"
    assert target.host_header == "93.184.216.34"


@pytest.mark.parametrize(
    "address",
    ["93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2001:4860:4860::8888"],
)
def test_public_addresses(address):
    assert is_public_address(ipaddress.ip_address(address)) is True


@pytest.mark.parametrize(
    "address",
    [
        "10.0.0.1",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "127.0.0.1",
        "127.0.0.2",
        "169.254.169.254",
        "0.0.0.0",  # noqa: S104 - a refused address, not a bind
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "100.64.0.1",
        "192.0.2.1",
        "198.18.0.1",
        "::",
        "::1",
        "fe80::1",
        "fc00::1",
        "fd12:3456::1",
        "fec0::1",  # site-local (deprecated, still routed privately); ipaddress calls it global
        "feff:ffff::1",
        "ff02::1",
        "ff0e::1",  # global-scope multicast: global to ipaddress, never a receiver
        "::ffff:10.0.0.1",
        "::ffff:127.0.0.1",
        "2002:7f00:1::1",
        "2002:a00:1::1",
        "64:ff9b::a00:1",
        "64:ff9b::7f00:1",
        "2001:db8::1",
    ],
)
def test_non_public_addresses(address):
    assert is_public_address(ipaddress.ip_address(address)) is False


# --- IANA's special-purpose address registries, entry by entry -----------------------------------

# Both registries as IANA publishes them (iana-ipv4-special-registry, iana-ipv6-special-registry),
# transcribed here apart from the code: (block, name, "Globally Reachable" with N/A or blank as
# None, an address inside the block and inside no more specific entry).
IANA_SPECIAL_PURPOSE = [
    ("0.0.0.0/8", '"This network"', False, "0.1.2.3"),
    ("0.0.0.0/32", '"This host on this network"', False, "0.0.0.0"),  # noqa: S104
    ("10.0.0.0/8", "Private-Use", False, "10.20.30.40"),
    ("100.64.0.0/10", "Shared Address Space", False, "100.127.255.254"),
    ("127.0.0.0/8", "Loopback", False, "127.1.2.3"),
    ("169.254.0.0/16", "Link Local", False, "169.254.169.254"),
    ("172.16.0.0/12", "Private-Use", False, "172.31.0.1"),
    ("192.0.0.0/24", "IETF Protocol Assignments", False, "192.0.0.192"),
    ("192.0.0.0/29", "IPv4 Service Continuity Prefix", False, "192.0.0.1"),
    ("192.0.0.8/32", "IPv4 dummy address", False, "192.0.0.8"),
    ("192.0.0.9/32", "Port Control Protocol Anycast", True, "192.0.0.9"),
    ("192.0.0.10/32", "Traversal Using Relays around NAT Anycast", True, "192.0.0.10"),
    ("192.0.0.170/32", "NAT64/DNS64 Discovery", False, "192.0.0.170"),
    ("192.0.0.171/32", "NAT64/DNS64 Discovery", False, "192.0.0.171"),
    ("192.0.2.0/24", "Documentation (TEST-NET-1)", False, "192.0.2.1"),
    ("192.31.196.0/24", "AS112-v4", True, "192.31.196.1"),
    ("192.52.193.0/24", "AMT", True, "192.52.193.1"),
    ("192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", None, "192.88.99.1"),
    ("192.88.99.2/32", "6a44-relay anycast address", False, "192.88.99.2"),
    ("192.168.0.0/16", "Private-Use", False, "192.168.1.1"),
    ("192.175.48.0/24", "Direct Delegation AS112 Service", True, "192.175.48.1"),
    ("198.18.0.0/15", "Benchmarking", False, "198.19.255.1"),
    ("198.51.100.0/24", "Documentation (TEST-NET-2)", False, "198.51.100.7"),
    ("203.0.113.0/24", "Documentation (TEST-NET-3)", False, "203.0.113.7"),
    ("240.0.0.0/4", "Reserved", False, "250.1.2.3"),
    ("255.255.255.255/32", "Limited Broadcast", False, "255.255.255.255"),
    ("::1/128", "Loopback Address", False, "::1"),
    ("::/128", "Unspecified Address", False, "::"),
    ("::ffff:0:0/96", "IPv4-mapped Address", False, "::ffff:8.8.8.8"),
    ("64:ff9b::/96", "IPv4-IPv6 Translat.", True, "64:ff9b::808:808"),
    ("64:ff9b:1::/48", "IPv4-IPv6 Translat.", False, "64:ff9b:1::808:808"),
    ("100::/64", "Discard-Only Address Block", False, "100::1"),
    ("100:0:0:1::/64", "Dummy IPv6 Prefix", False, "100:0:0:1::1"),
    ("2001::/23", "IETF Protocol Assignments", False, "2001:1ff::1"),
    ("2001::/32", "TEREDO", None, "2001:0:808:808::1"),
    ("2001:1::1/128", "Port Control Protocol Anycast", True, "2001:1::1"),
    ("2001:1::2/128", "Traversal Using Relays around NAT Anycast", True, "2001:1::2"),
    ("2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", True, "2001:1::3"),
    ("2001:2::/48", "Benchmarking", False, "2001:2::1"),
    ("2001:3::/32", "AMT", True, "2001:3::1"),
    ("2001:4:112::/48", "AS112-v6", True, "2001:4:112::1"),
    ("2001:10::/28", "Deprecated (previously ORCHID)", None, "2001:10::1"),
    ("2001:20::/28", "ORCHIDv2", True, "2001:20::1"),
    ("2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", True, "2001:30::1"),
    ("2001:db8::/32", "Documentation", False, "2001:db8::1"),
    ("2002::/16", "6to4", None, "2002:808:808::1"),
    ("2620:4f:8000::/48", "Direct Delegation AS112 Service", True, "2620:4f:8000::1"),
    ("3fff::/20", "Documentation", False, "3fff::1"),
    ("5f00::/16", "Segment Routing (SRv6) SIDs", False, "5f00::1"),
    ("fc00::/7", "Unique-Local", False, "fd12:3456::1"),
    ("fe80::/10", "Link-Local Unicast", False, "fe80::1"),
]


@pytest.fixture(scope="module")
def development_app(app, app_environ) -> Iterator[Flask]:
    application = create_app({**app_environ, "APP_ENV": "development"})
    yield application
    with application.app_context():
        db.engine.dispose()


def test_the_code_holds_both_registries_whole():
    held = {
        (str(block.network), block.name, block.globally_reachable)
        for block in endpoint_urls.SPECIAL_PURPOSE_BLOCKS
    }
    assert held == {(block, name, reachable) for block, name, reachable, _ in IANA_SPECIAL_PURPOSE}
    assert len(endpoint_urls.SPECIAL_PURPOSE_BLOCKS) == 26 + 25


def test_each_sample_address_is_in_its_entry_and_in_no_more_specific_one():
    networks = [ipaddress.ip_network(block) for block, *_ in IANA_SPECIAL_PURPOSE]
    for network, (_block, _name, _reachable, sample) in zip(
        networks, IANA_SPECIAL_PURPOSE, strict=True
    ):
        address = ipaddress.ip_address(sample)
        assert address in network
        narrower = [
            other
            for other in networks
            if other.version == network.version
            and other.prefixlen > network.prefixlen
            and address in other
        ]
        assert narrower == [], (sample, narrower)


def url_of(address: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"https://{host}/hooks"


@pytest.mark.parametrize(
    ("block", "name", "reachable", "address"),
    IANA_SPECIAL_PURPOSE,
    ids=[f"{block} {name}" for block, name, *_ in IANA_SPECIAL_PURPOSE],
)
def test_every_registry_entry_not_globally_reachable_is_refused_everywhere(
    development_app, production_app, brand, write_key, block, name, reachable, address
):
    """At registration, at update and at every attempt, in development and in production:
    refused unless the registry calls the block globally reachable (the anycast services,
    AS112, AMT and NAT64, which answer on the Internet), and then accepted."""
    url = url_of(address)
    for application in (development_app, production_app):
        client = application.test_client()
        env = application.extensions["settings"].app_env
        registered = register_response(client, brand, write_key, url)
        existing = assert_success(register_response(client, brand, write_key, UNRESOLVABLE), 201)
        updated = update_response(client, brand, write_key, existing["id"], url)
        policy = UrlPolicy.for_environment(env)
        if reachable is True:
            assert assert_success(registered, 201)["url"] == url, env
            assert assert_success(updated)["url"] == url, env
            assert attempt_target(url, policy).address == str(ipaddress.ip_address(address))
        else:
            message = assert_error(registered, 400, "VALIDATION_ERROR")["errors"]["url"][0]
            assert f"({block}, {name})" in message, (env, message)
            assert_url_refused(updated)
            with pytest.raises(AddressRefused, match=re.escape(f"({block}, {name})")):
                attempt_target(url, policy)
        listed = listed_urls(client, brand, write_key)
        assert (url in listed) is (reachable is True), (env, listed)


def test_the_local_exception_outlives_the_registry_outside_production(
    development_app, production_app, brand, write_key
):
    """CONTRACT 6.3: http://localhost and http://127.0.0.1 (127.0.0.0/8, Loopback) in
    development, and nowhere in production; any other loopback address in neither."""
    for url in ("http://localhost:8080/hooks", "http://127.0.0.1:9000/hooks"):
        development = development_app.test_client()
        assert_success(register_response(development, brand, write_key, url), 201)
        assert attempt_target(url, DEV_POLICY).address == "127.0.0.1"
        production = production_app.test_client()
        assert_url_refused(register_response(production, brand, write_key, url))
    development = development_app.test_client()
    assert_url_refused(register_response(development, brand, write_key, "http://127.0.0.2/h"))
