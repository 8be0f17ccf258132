"""Dashboard sign-in, sign-out, CSRF, scopes and revocation (CONTRACT section 7)."""

from __future__ import annotations

import re

from tests.dashboard import csrf_token, htmx, sign_in


def test_pages_need_a_session(client):
    for path in ["/dashboard/", "/dashboard/keys", "/dashboard/endpoints", "/dashboard/deliveries"]:
        response = client.get(path)
        assert response.status_code == 303
        assert response.headers["Location"].startswith("/dashboard/sign-in?next=")


def test_htmx_request_without_a_session_is_told_to_navigate(client):
    response = client.get("/dashboard/keys", headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert response.headers["HX-Redirect"] == "/dashboard/sign-in"
    assert response.get_data() == b""


def test_sign_in_keeps_a_session_token_in_the_cookie_and_nothing_of_the_key(
    app, client, brand, write_key
):
    token = sign_in(client, write_key)
    assert token
    with client.session_transaction() as session:
        assert set(session.keys()) <= {"sid", "csrf_token", "_flashes"}
        assert len(session["sid"]) >= 40
        assert write_key not in str(dict(session))
        assert "key_" not in str(dict(session))
    page = client.get("/dashboard/").get_data(as_text=True)
    assert "Acme Foods" in page
    # The top bar names the key as the key list does: by its prefix.
    assert f"<code>{write_key[:12]}…</code>" in page
    assert write_key not in page
    cookie = client.get_cookie("session")
    assert write_key not in cookie.value


def test_sign_in_returns_to_the_page_asked_for_and_only_within_the_dashboard(client, write_key):
    token = csrf_token(client)
    response = client.post(
        "/dashboard/sign-in",
        data={"apiKey": write_key, "csrf_token": token, "next": "/dashboard/keys?x=1"},
    )
    assert response.headers["Location"] == "/dashboard/keys?x=1"
    for hostile in ["https://evil.example/", "//evil.example/dashboard", "/api/v1/x"]:
        token = csrf_token(client)
        response = client.post(
            "/dashboard/sign-in", data={"apiKey": write_key, "csrf_token": token, "next": hostile}
        )
        assert response.headers["Location"] == "/dashboard/"


def test_a_bad_key_is_refused_without_echo(client, write_key):
    token = csrf_token(client)
    wrong = write_key[:-3] + "zzz"
    response = client.post("/dashboard/sign-in", data={"apiKey": wrong, "csrf_token": token})
    # Back to the form, saying why: a reload does not post the key again.
    assert response.status_code == 303
    assert response.headers["Location"] == "/dashboard/sign-in"
    assert wrong not in response.headers.get("Set-Cookie", "")
    body = client.get(response.headers["Location"]).get_data(as_text=True)
    assert "Invalid API key" in body and 'aria-invalid="true"' in body
    assert wrong not in body
    assert "Invalid API key" not in client.get("/dashboard/sign-in").get_data(as_text=True)
    assert client.get("/dashboard/").status_code == 303


def test_a_bootstrap_token_is_not_a_sign_in_credential(client, brand, make_bootstrap_token):
    bootstrap = make_bootstrap_token(brand)
    token = csrf_token(client)
    response = client.post("/dashboard/sign-in", data={"apiKey": bootstrap, "csrf_token": token})
    assert response.status_code == 303
    assert bootstrap not in client.get("/dashboard/sign-in").get_data(as_text=True)
    assert client.get("/dashboard/").status_code == 303


def test_state_changes_need_the_csrf_token(client, write_key):
    token = sign_in(client, write_key)
    for headers in [{"HX-Request": "true"}, htmx("wrong-token")]:
        response = client.post("/dashboard/keys", data={"name": "x"}, headers=headers)
        assert response.status_code == 403
        assert "did not come from this site" in response.get_data(as_text=True)
    response = client.post("/dashboard/sign-out")
    assert response.status_code == 403
    # the form field works as well as the header
    response = client.post(
        "/dashboard/keys", data={"name": "ci", "scopes": ["read"], "csrf_token": token}
    )
    assert response.status_code == 303


def test_sign_in_itself_needs_the_csrf_token(client, write_key):
    response = client.post("/dashboard/sign-in", data={"apiKey": write_key})
    assert response.status_code == 403
    assert client.get("/dashboard/").status_code == 303


def test_sign_out_ends_the_session(client, write_key):
    token = sign_in(client, write_key)
    response = client.post("/dashboard/sign-out", data={"csrf_token": token})
    assert response.status_code == 303
    assert client.get("/dashboard/").status_code == 303


def test_revoking_a_key_signs_its_sessions_out_at_once(app, brand, write_key, make_key):
    browser = app.test_client()
    other_browser = app.test_client()
    sign_in(browser, write_key)
    admin_key = make_key(brand, name="admin")
    admin_token = sign_in(other_browser, admin_key)
    keys_page = other_browser.get("/dashboard/keys").get_data(as_text=True)
    session_key_id = _key_id_of(keys_page, "test key")
    response = other_browser.post(
        f"/dashboard/keys/{session_key_id}/revoke", headers=htmx(admin_token)
    )
    assert response.status_code == 200
    assert session_key_id not in response.get_data(as_text=True)
    # The other session's very next request is signed out, and told why.
    response = browser.get("/dashboard/keys")
    assert response.status_code == 303
    page = browser.get(response.headers["Location"]).get_data(as_text=True)
    assert "The API key of this session was revoked; sign in again" in page
    with browser.session_transaction() as session:
        assert "sid" not in session
    assert browser.get("/dashboard/keys").status_code == 303


def test_revoking_the_sessions_own_key_ends_the_session(client, write_key):
    token = sign_in(client, write_key)
    key_id = _key_id_of(client.get("/dashboard/keys").get_data(as_text=True), "test key")
    response = client.post(f"/dashboard/keys/{key_id}/revoke", headers=htmx(token))
    assert response.headers["HX-Redirect"] == "/dashboard/sign-in"
    assert client.get("/dashboard/").status_code == 303
    # and the API refuses the secret too
    api = client.get("/api/v1/brand/x/api-key/fetch-keys", headers={"X-Api-Key": write_key})
    assert api.status_code == 401


def test_read_scope_sees_everything_and_is_offered_no_change(client, brand, read_key):
    token = sign_in(client, read_key)
    page = client.get("/dashboard/keys").get_data(as_text=True)
    assert "read only" in page
    assert "Create a key" not in page
    assert "Revoke" not in page
    response = client.post(
        "/dashboard/keys", data={"name": "x", "scopes": ["read"]}, headers=htmx(token)
    )
    assert response.status_code == 403
    assert "Write scope required" in response.get_data(as_text=True)


def test_security_headers_on_dashboard_pages(app, client, write_key):
    sign_in(client, write_key)
    response = client.get("/dashboard/")
    csp = response.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp
    assert "unsafe-inline" not in csp
    assert "default-src 'none'" in csp
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Cache-Control"] == "no-store"
    assert "HX-Request" in response.headers["Vary"]
    cookie = response.headers.get("Set-Cookie") or client.get("/dashboard/sign-in").headers.get(
        "Set-Cookie", ""
    )
    assert app.config["SESSION_COOKIE_HTTPONLY"] is True
    assert app.config["SESSION_COOKIE_SAMESITE"] == "Lax"
    if cookie:
        assert "HttpOnly" in cookie
        assert "SameSite=Lax" in cookie


def test_production_cookies_are_secure(app_environ):
    from app import create_app

    production = create_app(
        {**app_environ, "APP_ENV": "production", "DATABASE_URL": app_environ["DATABASE_URL"]}
    )
    assert production.config["SESSION_COOKIE_SECURE"] is True


def _key_id_of(page: str, name: str) -> str:
    row = re.search(r'<tr id="key-(key_[^"]+)">\s*<td data-label="Name">' + re.escape(name), page)
    assert row, page
    return row.group(1)
