"""The dashboard's first-key sign-in and API keys page (SPEC section 4, CONTRACT section 7)."""

from __future__ import annotations

import json
import re

from sqlalchemy import func, select

from extensions import db
from models import ApiKey
from tests.dashboard import csrf_token, htmx, sign_in

SECRET = re.compile(r"svc_live_[0-9A-Za-z]{38}")


def _first_key(client, **fields):
    token = csrf_token(client, "/dashboard/first-key")
    return client.post("/dashboard/first-key", data={"csrf_token": token, **fields})


def _session_cookie(app, client) -> dict:
    """What the browser's session cookie holds, decoded as anyone holding it could."""
    cookie = client.get_cookie(app.config.get("SESSION_COOKIE_NAME", "session"))
    return app.session_interface.get_signing_serializer(app).loads(cookie.value)


def _active_keys(app, brand_id: str) -> int:
    with app.app_context():
        return db.session.scalar(
            select(func.count()).where(ApiKey.brand_id == brand_id, ApiKey.revoked_at.is_(None))
        )


def test_first_key_with_a_bootstrap_token_signs_in_and_shows_the_secret_once(
    app, client, brand, make_bootstrap_token
):
    bootstrap = make_bootstrap_token(brand)
    response = _first_key(
        client, brandId=brand, bootstrapToken=bootstrap, name="dashboard", scopes=["read", "write"]
    )
    # A redirect to the page that shows the secret: a reload of that page posts nothing.
    assert response.status_code == 303
    assert response.headers["Location"] == "/dashboard/first-key/created"
    assert SECRET.search(response.get_data(as_text=True)) is None
    # The secret crosses the redirect in the session cookie, sealed: not readable in it.
    assert not SECRET.search(json.dumps(_session_cookie(app, client)))
    response = client.get("/dashboard/first-key/created")
    assert response.status_code == 200
    page = response.get_data(as_text=True)
    secrets_shown = SECRET.findall(page)
    assert len(set(secrets_shown)) == 1
    secret = secrets_shown[0]
    assert "shown this once" in page
    assert bootstrap not in page
    # Reloading finds the secret gone, and goes on to the dashboard instead of "form expired".
    again = client.get("/dashboard/first-key/created")
    assert again.status_code == 303 and again.headers["Location"] == "/dashboard/"
    overview = client.get("/dashboard/").get_data(as_text=True)
    assert "its secret was shown once" in overview
    assert secret not in overview
    # signed in with the new key, which works against the API too
    keys_page = client.get("/dashboard/keys").get_data(as_text=True)
    assert "this session" in keys_page
    assert secret not in keys_page
    assert secret[:12] in keys_page
    api = client.get(
        f"/api/v1/brand/{brand}/api-key/fetch-keys", headers={"X-Api-Key": secret}
    ).get_json()
    assert [key["name"] for key in api["data"]] == ["dashboard"]
    assert api["data"][0]["scopes"] == ["read", "write"]


def test_first_key_refuses_a_bad_token_and_stores_nothing(
    app, client, brand, make_brand, make_bootstrap_token
):
    other = make_brand("Other Brand")
    other_token = make_bootstrap_token(other)
    for token, message in [
        ("bst_not-a-real-token", "Invalid, expired or revoked bootstrap token"),
        (other_token, "Bootstrap token does not belong to this brand"),
    ]:
        response = _first_key(client, brandId=brand, bootstrapToken=token, name="x", scopes="read")
        assert response.status_code == 401
        page = response.get_data(as_text=True)
        assert message in page
        assert token not in page
    assert _active_keys(app, brand) == 0
    assert _active_keys(app, other) == 0
    assert client.get("/dashboard/").status_code == 303


def test_first_key_form_errors_name_each_field(app, client, brand, make_bootstrap_token):
    bootstrap = make_bootstrap_token(brand)
    response = _first_key(client, brandId="cmp_123", bootstrapToken=bootstrap, name="")
    assert response.status_code == 400
    page = response.get_data(as_text=True)
    assert "Not a brand id" in page
    assert "Give at least one scope." in page
    assert "Length must be between 1 and 100." in page
    assert bootstrap not in page
    assert _active_keys(app, brand) == 0


def test_keys_page_lists_active_keys_without_secrets(client, brand, write_key, make_key):
    read_only = make_key(brand, scopes=("read",), name="reporting")
    sign_in(client, write_key)
    page = client.get("/dashboard/keys").get_data(as_text=True)
    assert "reporting" in page
    assert read_only[:12] in page
    assert read_only not in page
    assert write_key not in page
    assert page.count('<tr id="key-') == 2


def test_create_key_shows_its_secret_once_and_updates_the_list(app, client, brand, write_key):
    token = sign_in(client, write_key)
    response = client.post(
        "/dashboard/keys",
        data={"name": "orders-service", "scopes": ["read", "write"]},
        headers=htmx(token),
    )
    assert response.status_code == 201
    fragment = response.get_data(as_text=True)
    assert "<html" not in fragment
    secret = SECRET.search(fragment).group(0)
    assert f'data-copy="{secret}"' in fragment
    assert 'id="key-rows" hx-swap-oob="true"' in fragment
    assert "orders-service" in fragment.split('id="key-rows"')[1]
    assert _active_keys(app, brand) == 2
    later = client.get("/dashboard/keys").get_data(as_text=True)
    assert secret not in later
    assert "orders-service" in later
    # the session's key stays valid (rotate-key semantics)
    assert client.get("/dashboard/keys").status_code == 200


def test_create_key_validation_errors_are_swapped_in_and_store_nothing(
    app, client, brand, write_key
):
    token = sign_in(client, write_key)
    response = client.post("/dashboard/keys", data={"name": "  "}, headers=htmx(token))
    assert response.status_code == 422
    fragment = response.get_data(as_text=True)
    assert "Give at least one scope." in fragment
    assert "Length must be between 1 and 100." in fragment
    assert 'id="key-form-panel"' in fragment
    response = client.post(
        "/dashboard/keys", data={"name": "x" * 101, "scopes": ["admin"]}, headers=htmx(token)
    )
    assert response.status_code == 422
    assert "Must be one of: read, write." in response.get_data(as_text=True)
    assert _active_keys(app, brand) == 1


def test_revoke_another_key_keeps_the_session(app, client, brand, write_key, make_key):
    make_key(brand, name="old-service")
    token = sign_in(client, write_key)
    page = client.get("/dashboard/keys").get_data(as_text=True)
    old_id = re.search(
        r'<tr id="key-(key_[^"]+)">\s*<td data-label="Name">old-service', page
    ).group(1)
    response = client.post(f"/dashboard/keys/{old_id}/revoke", headers=htmx(token))
    assert response.status_code == 200
    fragment = response.get_data(as_text=True)
    assert "old-service" not in fragment
    assert "revoked" in fragment  # the flash, swapped out of band
    assert _active_keys(app, brand) == 1
    assert client.get("/dashboard/keys").status_code == 200


def test_revoke_a_key_of_another_brand_is_not_found(app, client, brand, write_key, make_brand):
    other = make_brand("Other Brand")
    with app.app_context():
        from services.api_keys import create_api_key

        other_key = create_api_key(brand_id=other, name="theirs", created_by="tests").record.id
        db.session.commit()
    token = sign_in(client, write_key)
    response = client.post(f"/dashboard/keys/{other_key}/revoke", headers=htmx(token))
    assert response.status_code == 404
    assert _active_keys(app, other) == 1


def test_create_key_without_javascript_redirects_and_shows_the_secret_once(
    app, client, brand, write_key
):
    token = sign_in(client, write_key)
    response = client.post(
        "/dashboard/keys", data={"name": "no-js", "scopes": ["read"], "csrf_token": token}
    )
    assert response.status_code == 303
    assert response.headers["Location"] == "/dashboard/keys#key-create"
    page = client.get("/dashboard/keys").get_data(as_text=True)
    assert "<html" in page
    [secret] = set(SECRET.findall(page))
    assert page.count('id="key-rows"') == 1
    assert "no-js" in page.split('id="key-rows"')[1]
    # A reload reads the page again: no second key, and the secret is not shown again.
    reloaded = client.get("/dashboard/keys").get_data(as_text=True)
    assert secret not in reloaded and "no-js" in reloaded
    assert _active_keys(app, brand) == 2


def test_a_bootstrap_token_pasted_as_an_api_key_points_to_the_first_key_page(
    client, brand, make_bootstrap_token
):
    bootstrap = make_bootstrap_token(brand)
    response = client.post(
        "/dashboard/sign-in", data={"apiKey": bootstrap, "csrf_token": csrf_token(client)}
    )
    assert response.status_code == 303
    page = client.get(response.headers["Location"]).get_data(as_text=True)
    assert "That is a bootstrap token, not an API key" in page
    error = page.split('id="apiKey-error">')[1].split("</p>")[0]
    assert '<a href="/dashboard/first-key">Create your brand' in error
    assert bootstrap not in page
    assert client.get("/dashboard/").status_code == 303  # not signed in


def test_revoking_the_key_whose_secret_is_shown_takes_its_secret_box_away(
    app, client, brand, write_key
):
    token = sign_in(client, write_key)
    created = client.post(
        "/dashboard/keys", data={"name": "mistake", "scopes": ["read"]}, headers=htmx(token)
    ).get_data(as_text=True)
    [key_id] = re.findall(r'id="shown-key-id" name="shownKeyId" value="(key_\w+)"', created)
    # The revoke button sends which key's secret the page shows (hx-include).
    page = client.get("/dashboard/keys").get_data(as_text=True)
    assert 'hx-include="#shown-key-id"' in page
    response = client.post(
        f"/dashboard/keys/{key_id}/revoke", data={"shownKeyId": key_id}, headers=htmx(token)
    )
    fragment = response.get_data(as_text=True)
    assert '<div id="key-form-panel" hx-swap-oob="true">' in fragment
    assert "Create a key" in fragment.split('id="key-form-panel"')[1]
    # Revoking another key leaves the box of the key just made alone.
    kept = client.post(
        "/dashboard/keys", data={"name": "new-one", "scopes": ["read"]}, headers=htmx(token)
    ).get_data(as_text=True)
    [new_id] = re.findall(r'name="shownKeyId" value="(key_\w+)"', kept)
    old = _other_key_id(app, brand)
    response = client.post(
        f"/dashboard/keys/{old}/revoke", data={"shownKeyId": new_id}, headers=htmx(token)
    )
    assert response.status_code == 200
    assert 'id="key-form-panel"' not in response.get_data(as_text=True)


def _other_key_id(app, brand_id: str) -> str:
    """A spare key of the brand, made now."""
    with app.app_context():
        from services.api_keys import create_api_key

        key_id = create_api_key(brand_id=brand_id, name="spare", created_by="tests").record.id
        db.session.commit()
        return key_id


def test_revoking_without_javascript_asks_on_a_page_first(app, client, brand, write_key, make_key):
    make_key(brand, name="old-service")
    token = sign_in(client, write_key)
    page = client.get("/dashboard/keys").get_data(as_text=True)
    old_id = re.search(
        r'<tr id="key-(key_[^"]+)">\s*<td data-label="Name">old-service', page
    ).group(1)
    # The button is a GET form: without JavaScript it opens the question, changing nothing.
    assert f'<form method="get" action="/dashboard/keys/{old_id}/revoke"' in page
    question = client.get(f"/dashboard/keys/{old_id}/revoke")
    assert question.status_code == 200
    text = question.get_data(as_text=True)
    assert "Revoke the key “old-service”?" in text
    assert "Every request with it fails at once. This cannot be undone." in text
    assert f'<form method="post" action="/dashboard/keys/{old_id}/revoke"' in text
    assert 'href="/dashboard/keys">Cancel</a>' in text
    assert _active_keys(app, brand) == 2
    answer = client.post(f"/dashboard/keys/{old_id}/revoke", data={"csrf_token": token})
    assert answer.status_code == 303 and answer.headers["Location"] == "/dashboard/keys"
    assert "Key svc_live_" in client.get("/dashboard/keys").get_data(as_text=True)
    assert _active_keys(app, brand) == 1
    assert client.get(f"/dashboard/keys/{old_id}/revoke").status_code == 404
