"""Dashboard sessions kept on the server (CONTRACT 7 and 11.3), tried as an attacker would: a
cookie copied before sign-out, revocation or expiry opens nothing afterwards; a secret shown once
is shown once, whatever cookie is replayed and however many replays race; failed sign-ins are
throttled per client address.

Black-box where it can be: a real gunicorn server in production mode, driven through the
dashboard's forms without JavaScript, with cookies copied by hand as a thief would."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import requests
from sqlalchemy import Interval, literal, update

from app import create_app
from extensions import db
from models import DashboardSession
from models.columns import utcnow
from tests.dashboard import SIGNING_SECRET
from tests.server_process import ServerProcess

_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
SECRET = re.compile(r"svc_live_[A-Za-z0-9]{30,}")
IDLE = 3600
LIFETIME = 43200


class Browser:
    """A browser without JavaScript whose cookie is a plain string, to copy and replay."""

    def __init__(self, base: str, cookie: str = "", *, replaying: bool = False) -> None:
        self.base = base
        self.cookie = cookie
        # A thief replays the cookie it copied, whatever the server answers.
        self.replaying = replaying

    def request(self, method: str, path: str, **options) -> requests.Response:
        headers = options.pop("headers", {})
        if self.cookie:
            headers["Cookie"] = f"session={self.cookie}"
        response = requests.request(
            method,
            f"{self.base}{path}",
            headers=headers,
            allow_redirects=False,
            timeout=20,
            **options,
        )
        # Secure cookies (production) are not sent back over http:// by requests itself.
        found = re.search(r"\bsession=([^;]*)", response.headers.get("Set-Cookie", ""))
        if found and not self.replaying:
            self.cookie = found[1]
        return response

    def get(self, path: str) -> requests.Response:
        return self.request("GET", path)

    def post_form(self, path: str, data: dict, *, csrf_from: str) -> requests.Response:
        token = _CSRF.search(self.get(csrf_from).text)
        assert token, f"no form with a CSRF token on {csrf_from}"
        return self.request("POST", path, data=data | {"csrf_token": token[1]})

    def sign_in(self, secret: str) -> None:
        response = self.post_form(
            "/dashboard/sign-in", {"apiKey": secret}, csrf_from="/dashboard/sign-in"
        )
        assert response.status_code == 303, response.text
        assert response.headers["Location"] == "/dashboard/"

    def copy(self) -> Browser:
        """The cookie as it is now, replayed as it is whatever the server answers."""
        return Browser(self.base, self.cookie, replaying=True)


@pytest.fixture(scope="module")
def production(app, app_environ) -> Iterator[ServerProcess]:
    process = ServerProcess(app_environ | {"APP_ENV": "production"}, workers=2, threads=4)
    yield process
    process.stop()


def signed_out(response: requests.Response) -> bool:
    return response.status_code == 303 and response.headers["Location"].startswith(
        "/dashboard/sign-in"
    )


def key_names(server: ServerProcess, brand: str, key: str) -> list[str]:
    answer = requests.get(
        f"{server.url}/api/v1/brand/{brand}/api-key/fetch-keys",
        headers={"X-Api-Key": key},
        timeout=10,
    )
    return sorted(k["name"] for k in answer.json()["data"])


def test_a_cookie_copied_before_sign_out_opens_nothing_after_it(production, brand, write_key):
    browser = Browser(production.url)
    browser.sign_in(write_key)
    thief = browser.copy()
    assert thief.get("/dashboard/keys").status_code == 200
    token = _CSRF.search(thief.get("/dashboard/keys").text)[1]

    signed_out_answer = browser.post_form("/dashboard/sign-out", {}, csrf_from="/dashboard/")
    assert signed_out(signed_out_answer)

    assert signed_out(thief.get("/dashboard/keys"))
    assert signed_out(thief.get("/dashboard/"))
    minted = thief.request(
        "POST",
        "/dashboard/keys",
        data={"name": "stolen", "scopes": ["read", "write"], "csrf_token": token},
    )
    assert signed_out(minted)
    assert key_names(production, brand, write_key) == ["test key"]


def test_revoking_the_key_ends_every_session_of_it_at_once(production, brand, write_key, make_key):
    first, second = Browser(production.url), Browser(production.url)
    first.sign_in(write_key)
    second.sign_in(write_key)
    copies = [first.copy(), second.copy()]
    admin_key = make_key(brand, name="admin")
    key_id = next(
        k["id"]
        for k in requests.get(
            f"{production.url}/api/v1/brand/{brand}/api-key/fetch-keys",
            headers={"X-Api-Key": admin_key},
            timeout=10,
        ).json()["data"]
        if k["name"] == "test key"
    )
    revoked = requests.delete(
        f"{production.url}/api/v1/brand/{brand}/api-key/{key_id}/revoke-key",
        headers={"X-Api-Key": admin_key},
        timeout=10,
    )
    assert revoked.status_code == 200
    for browser in [first, second, *copies]:
        assert signed_out(browser.get("/dashboard/keys"))


def test_a_new_keys_secret_is_shown_once_whatever_cookie_is_replayed(production, write_key):
    browser = Browser(production.url)
    browser.sign_in(write_key)
    before_the_post = browser.copy()
    created = browser.post_form(
        "/dashboard/keys", {"name": "ci", "scopes": ["read"]}, csrf_from="/dashboard/keys"
    )
    assert created.status_code == 303
    after_the_post = browser.copy()

    # Every copy of the redirect's cookie races for the page: one of them shows the secret.
    replays = [after_the_post.copy() for _ in range(6)] + [before_the_post.copy()]
    with ThreadPoolExecutor(max_workers=len(replays)) as pool:
        answers = list(pool.map(lambda b: b.get("/dashboard/keys"), replays))
    assert [a.status_code for a in answers] == [200] * len(replays)
    shown = [set(SECRET.findall(answer.text)) for answer in answers]
    assert sum(1 for secrets in shown if secrets) == 1, shown

    for replay in [after_the_post.copy(), before_the_post.copy(), browser]:
        assert not SECRET.search(replay.get("/dashboard/keys").text)


def test_a_new_signing_secret_is_shown_once_whatever_cookie_is_replayed(
    production, brand, write_key
):
    endpoint = requests.post(
        f"{production.url}/api/v1/brand/{brand}/webhook/register-endpoint",
        json={"url": "https://hooks.brand-example.invalid/x"},
        headers={"X-Api-Key": write_key},
        timeout=10,
    ).json()["data"]
    page = f"/dashboard/endpoints/{endpoint['id']}"
    browser = Browser(production.url)
    browser.sign_in(write_key)
    rotated = browser.post_form(f"{page}/rotate-secret", {"overlapSeconds": "0"}, csrf_from=page)
    assert rotated.status_code == 303
    replay = browser.copy()

    first = SIGNING_SECRET.findall(browser.get(page).text)
    assert first and first[0] != endpoint["signingSecret"]
    assert not SIGNING_SECRET.search(replay.get(page).text)
    assert not SIGNING_SECRET.search(browser.get(page).text)


def test_a_secret_not_taken_goes_with_its_session(production, write_key):
    browser = Browser(production.url)
    browser.sign_in(write_key)
    browser.post_form(
        "/dashboard/keys", {"name": "ci", "scopes": ["read"]}, csrf_from="/dashboard/keys"
    )
    copy = browser.copy()
    assert signed_out(browser.post_form("/dashboard/sign-out", {}, csrf_from="/dashboard/"))
    shown = copy.get("/dashboard/keys")
    assert signed_out(shown) and not SECRET.search(shown.text)


# --- lifetimes --------------------------------------------------------------------------------


def age_sessions(app, **ages: timedelta) -> None:
    """Move every session's clocks back, as if that much time had passed."""
    with app.app_context():
        now = utcnow()
        db.session.execute(
            update(DashboardSession).values(**{column: now - age for column, age in ages.items()})
        )
        db.session.commit()


def pass_time(app, elapsed: timedelta) -> None:
    """Move every session's clocks back by `elapsed`, as if that much time had passed since
    each was written."""
    interval = literal(elapsed, Interval())
    with app.app_context():
        db.session.execute(
            update(DashboardSession).values(
                created_at=DashboardSession.created_at - interval,
                last_seen_at=DashboardSession.last_seen_at - interval,
            )
        )
        db.session.commit()


def sign_in(client, secret: str) -> None:
    token = _CSRF.search(client.get("/dashboard/sign-in").get_data(as_text=True))[1]
    response = client.post("/dashboard/sign-in", data={"apiKey": secret, "csrf_token": token})
    assert response.status_code == 303


def test_a_session_ends_after_an_hour_without_a_request(app, client, write_key):
    sign_in(client, write_key)
    age_sessions(app, last_seen_at=timedelta(seconds=IDLE - 120))
    assert client.get("/dashboard/").status_code == 200  # used in time: it goes on
    age_sessions(app, last_seen_at=timedelta(seconds=IDLE + 1))
    response = client.get("/dashboard/keys")
    assert response.status_code == 303
    page = client.get(response.headers["Location"]).get_data(as_text=True)
    assert "Your session has ended" in page
    assert client.get("/dashboard/").status_code == 303


def test_a_request_keeps_the_session_alive(app, client, write_key):
    sign_in(client, write_key)
    age_sessions(app, last_seen_at=timedelta(seconds=IDLE - 30))
    assert client.get("/dashboard/").status_code == 200
    age_sessions(app, created_at=timedelta(minutes=5))  # last use: the request just made
    assert client.get("/dashboard/").status_code == 200


def test_a_session_ends_twelve_hours_after_sign_in_however_busy(app, client, write_key):
    sign_in(client, write_key)
    age_sessions(app, created_at=timedelta(seconds=LIFETIME + 1))
    assert client.get("/dashboard/").status_code == 303


def test_the_lifetimes_are_settings(app_environ, write_key):
    short = create_app(
        app_environ | {"DASHBOARD_SESSION_IDLE_TIMEOUT": "60", "DASHBOARD_SESSION_LIFETIME": "120"}
    )
    client = short.test_client()
    sign_in(client, write_key)
    age_sessions(short, last_seen_at=timedelta(seconds=61))
    assert client.get("/dashboard/").status_code == 303


def test_a_60_second_idle_timeout_keeps_a_session_used_every_20_seconds(app_environ, write_key):
    """The last use is written often enough for the shortest idle timeout (it was written once
    a minute, so a 60 s timeout ended every session a minute after sign-in, however busy)."""
    short = create_app(app_environ | {"DASHBOARD_SESSION_IDLE_TIMEOUT": "60"})
    client = short.test_client()
    sign_in(client, write_key)
    for _ in range(9):  # three minutes of use every 20 s
        pass_time(short, timedelta(seconds=20))
        assert client.get("/dashboard/").status_code == 200
    pass_time(short, timedelta(seconds=61))  # then a minute without a request: it ends
    assert client.get("/dashboard/").status_code == 303


def test_while_the_database_is_down_the_dashboard_says_so_and_signs_no_one_out(
    app_environ, client, write_key
):
    sign_in(client, write_key)
    cookie = client.get_cookie("session").value
    down = create_app(
        app_environ | {"DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none?connect_timeout=2"}
    )
    browser = down.test_client()
    browser.set_cookie("session", cookie)
    answer = browser.get("/dashboard/keys")
    assert answer.status_code == 503
    assert "unavailable" in answer.get_data(as_text=True)
    assert client.get("/dashboard/keys").status_code == 200  # back up: still signed in


# --- failed sign-ins --------------------------------------------------------------------------


def throttled_client(app_environ, address: str | None = None):
    """An app with the default limit per client, and a client from `address`, by default one
    in a /64 of its own (IPv6 clients are counted by /64)."""
    limited = create_app(
        {k: v for k, v in app_environ.items() if k != "SIGN_IN_FAILURES_PER_ADDRESS"}
    )
    client = limited.test_client()
    client.environ_base["REMOTE_ADDR"] = address or f"{own_network()}::1"
    return client


def own_network() -> str:
    """The first four groups of an IPv6 /64 no other client of the run uses."""
    return f"2001:db8:{uuid.uuid4().hex[:4]}:{uuid.uuid4().hex[:4]}"


def post_sign_in(client, secret: str):
    token = _CSRF.search(client.get("/dashboard/sign-in").get_data(as_text=True))[1]
    return client.post("/dashboard/sign-in", data={"apiKey": secret, "csrf_token": token})


def test_ten_failed_sign_ins_a_minute_then_a_page_that_says_when_to_try_again(
    app_environ, write_key
):
    client = throttled_client(app_environ)
    for attempt in range(10):
        response = post_sign_in(client, f"svc_live_{uuid.uuid4().hex}{attempt}")
        assert response.status_code == 303  # back to the form, saying why
    refused = post_sign_in(client, write_key)  # even the right key: nothing is checked now
    assert refused.status_code == 429
    wait = int(refused.headers["Retry-After"])
    assert 1 <= wait <= 60
    page = refused.get_data(as_text=True)
    assert "Too many failed sign-ins from your address" in page
    assert re.search(rf"Try again in {wait} seconds", page)
    assert '<form method="post"' in page  # the form is there for later
    assert client.get("/dashboard/").status_code == 303


def test_throttling_counts_failures_only_and_per_address(app_environ, write_key):
    client = throttled_client(app_environ)
    for _ in range(12):  # successful sign-ins are not counted
        assert post_sign_in(client, write_key).status_code == 303
    for _ in range(10):
        post_sign_in(client, "svc_live_" + "x" * 40)
    assert post_sign_in(client, write_key).status_code == 429
    elsewhere = throttled_client(app_environ)
    assert post_sign_in(elsewhere, write_key).status_code == 303


def test_an_ipv6_client_is_counted_by_its_64_and_an_ipv4_client_by_its_address(
    app_environ, write_key
):
    """Ten failures from ten addresses of one /64 use up its limit for every address in it;
    the /64 next door, and IPv4 addresses (an IPv4-mapped one included), keep their own."""
    network = own_network()
    for host in range(1, 11):
        client = throttled_client(app_environ, f"{network}:{host:x}:{host:x}:{host:x}:{host:x}")
        assert post_sign_in(client, "svc_live_" + "x" * 40).status_code == 303
    same_64 = throttled_client(app_environ, f"{network}:ffff:1:2:3")
    refused = post_sign_in(same_64, write_key)
    assert refused.status_code == 429
    assert "Too many failed sign-ins from your address" in refused.get_data(as_text=True)
    assert post_sign_in(throttled_client(app_environ), write_key).status_code == 303

    ipv4 = f"198.51.100.{uuid.uuid4().int % 250 + 1}"
    for _ in range(10):
        post_sign_in(throttled_client(app_environ, ipv4), "svc_live_" + "x" * 40)
    assert post_sign_in(throttled_client(app_environ, ipv4), write_key).status_code == 429
    mapped = throttled_client(app_environ, f"::ffff:{ipv4}")
    assert post_sign_in(mapped, write_key).status_code == 429  # the same client, spelled in IPv6
    next_door = ".".join([*ipv4.split(".")[:3], str(int(ipv4.rsplit(".", 1)[1]) + 1)])
    assert post_sign_in(throttled_client(app_environ, next_door), write_key).status_code == 303


def test_failed_sign_ins_from_everywhere_meet_a_global_ceiling(app_environ, brand, write_key):
    """Each address stays far under its own limit, yet past SIGN_IN_FAILURES_GLOBAL failures
    in all, every sign-in and first-key attempt gets the 429 page until the window has room."""
    limited = create_app(app_environ | {"SIGN_IN_FAILURES_GLOBAL": "12/minute"})

    def client_from(address: str):
        client = limited.test_client()
        client.environ_base["REMOTE_ADDR"] = address
        return client

    for host in range(1, 7):  # six IPv4 addresses and six IPv6 /64s, one failure each
        assert post_sign_in(client_from(f"203.0.113.{host}"), "svc_live_x").status_code == 303
        assert post_sign_in(client_from(f"{own_network()}::1"), "svc_live_x").status_code == 303
    newcomer = client_from("192.0.2.77")
    refused = post_sign_in(newcomer, write_key)  # the right key, from an address never seen
    assert refused.status_code == 429
    wait = int(refused.headers["Retry-After"])
    assert 1 <= wait <= 60
    page = refused.get_data(as_text=True)
    assert "Too many failed sign-ins to this service from everywhere" in page
    assert f"Try again in {wait} seconds" in page
    assert newcomer.get("/dashboard/").status_code == 303  # not signed in
    token = _CSRF.search(newcomer.get("/dashboard/first-key").get_data(as_text=True))[1]
    first_key = newcomer.post(
        "/dashboard/first-key",
        data={"brandId": brand, "bootstrapToken": "bst_x", "name": "a", "csrf_token": token},
    )
    assert first_key.status_code == 429


def test_guessing_bootstrap_tokens_is_throttled_too(app_environ, brand):
    client = throttled_client(app_environ)
    for _ in range(10):
        token = _CSRF.search(client.get("/dashboard/first-key").get_data(as_text=True))[1]
        response = client.post(
            "/dashboard/first-key",
            data={
                "brandId": brand,
                "bootstrapToken": f"bst_{uuid.uuid4().hex}",
                "name": "first",
                "scopes": ["read"],
                "csrf_token": token,
            },
        )
        assert response.status_code == 401
    token = _CSRF.search(client.get("/dashboard/first-key").get_data(as_text=True))[1]
    refused = client.post(
        "/dashboard/first-key",
        data={"brandId": brand, "bootstrapToken": "bst_x", "name": "a", "csrf_token": token},
    )
    assert refused.status_code == 429
    assert "Too many failed sign-ins" in refused.get_data(as_text=True)
    assert refused.headers["Retry-After"]
