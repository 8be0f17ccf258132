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
from sqlalchemy import update

from app import create_app
from extensions import db
from models import DashboardSession
from models.columns import utcnow
from tests.server_process import ServerProcess

_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')
SECRET = re.compile(r"svc_live_[A-Za-z0-9]{30,}")
SIGNING_SECRET = re.compile(r"whsec_[A-Za-z0-9+/=_-]{20,}")
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


def throttled_client(app_environ):
    """An app with the default limit, and a client from an address of its own."""
    limited = create_app(
        {k: v for k, v in app_environ.items() if k != "SIGN_IN_FAILURES_PER_ADDRESS"}
    )
    client = limited.test_client()
    client.environ_base["REMOTE_ADDR"] = f"2001:db8::{uuid.uuid4().hex[:4]}"
    return client


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
