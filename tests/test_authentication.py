"""SPEC section 5 across every API-key route: credentials, brand match, scopes, revocation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from extensions import db
from models import ApiKey, credentials
from models.columns import utcnow
from services.api_keys import LAST_USED_RESOLUTION, find_key_by_secret, record_key_use
from tests.helpers import assert_error, assert_success

# Every route that takes an API key: (method, path template, needs write, JSON body).
API_KEY_ROUTES = [
    ("GET", "/api/v1/brand/{brand}/api-key/fetch-keys", False, None),
    ("POST", "/api/v1/brand/{brand}/api-key/rotate-key", True, {"name": "rotated"}),
    ("DELETE", "/api/v1/brand/{brand}/api-key/key_nonexistent/revoke-key", True, None),
]
ROUTE_IDS = [f"{method} {path.split('/')[-1]}" for method, path, _, _ in API_KEY_ROUTES]


def call(client, method, path, brand, headers, body=None):
    return client.open(path.format(brand=brand), method=method, headers=headers, json=body)


@pytest.mark.parametrize(("method", "path", "_write", "body"), API_KEY_ROUTES, ids=ROUTE_IDS)
def test_missing_credential_is_unauthorized(client, brand, method, path, _write, body):
    response = call(client, method, path, brand, {}, body)
    assert_error(response, 401, "UNAUTHORIZED", "API key required: send it in the X-Api-Key header")


@pytest.mark.parametrize(
    "presented",
    [
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc",  # another vendor's key
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",  # a website access token
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # a webhook signing secret
        "svc_",
        "svc_live_",
        "svc_test_" + "a" * 38,
        "live_" + "a" * 38,
        "SVC_LIVE_" + "a" * 38,
    ],
)
def test_anything_but_a_service_key_is_unauthorized(client, brand, presented):
    response = call(client, *API_KEY_ROUTES[0][:2], brand, {"X-Api-Key": presented})
    assert_error(response, 401, "UNAUTHORIZED", "Invalid API key")


def test_a_mistyped_key_fails_its_checksum(client, brand, read_key):
    last = read_key[-1]
    mistyped = read_key[:-1] + ("a" if last != "a" else "b")
    assert not credentials.is_well_formed(mistyped, credentials.API_KEY_PREFIX)
    response = call(client, *API_KEY_ROUTES[0][:2], brand, {"X-Api-Key": mistyped})
    assert_error(response, 401, "UNAUTHORIZED", "Invalid API key")


def test_a_well_formed_unknown_key_is_unauthorized(client, brand):
    stranger = credentials.generate_secret(credentials.API_KEY_PREFIX)
    response = call(client, *API_KEY_ROUTES[0][:2], brand, {"X-Api-Key": stranger})
    assert_error(response, 401, "UNAUTHORIZED", "Invalid API key")


def test_bearer_header_is_accepted(client, brand, read_key):
    response = call(client, *API_KEY_ROUTES[0][:2], brand, {"Authorization": f"Bearer {read_key}"})
    assert_success(response)


@pytest.mark.parametrize("scheme", ["bearer", "BEARER"])
def test_bearer_scheme_is_case_insensitive(client, brand, read_key, scheme):
    response = call(
        client, *API_KEY_ROUTES[0][:2], brand, {"Authorization": f"{scheme} {read_key}"}
    )
    assert_success(response)


@pytest.mark.parametrize("authorization", ["Basic dXNlcjpwYXNz", "Token abc", "Bearer"])
def test_other_authorization_schemes_are_not_credentials(client, brand, authorization):
    response = call(client, *API_KEY_ROUTES[0][:2], brand, {"Authorization": authorization})
    assert_error(response, 401, "UNAUTHORIZED")


def test_x_api_key_is_preferred_over_bearer(client, brand, read_key):
    good_header = {"X-Api-Key": read_key, "Authorization": "Bearer svc_live_garbage"}
    assert_success(call(client, *API_KEY_ROUTES[0][:2], brand, good_header))
    bad_header = {"X-Api-Key": "svc_live_garbage", "Authorization": f"Bearer {read_key}"}
    assert_error(call(client, *API_KEY_ROUTES[0][:2], brand, bad_header), 401, "UNAUTHORIZED")


@pytest.mark.parametrize(("method", "path", "_write", "body"), API_KEY_ROUTES, ids=ROUTE_IDS)
def test_key_of_another_brand_is_forbidden(
    client, make_brand, make_key, method, path, _write, body
):
    brand_a, brand_b = make_brand("A"), make_brand("B")
    key_b = make_key(brand_b, scopes=("read", "write"))
    response = call(client, method, path, brand_a, {"X-Api-Key": key_b}, body)
    assert_error(response, 403, "FORBIDDEN", "API key does not belong to this brand")


def test_unknown_brand_in_the_path_is_forbidden_not_revealed(client, write_key):
    response = call(client, *API_KEY_ROUTES[0][:2], "brd_doesnotexist", {"X-Api-Key": write_key})
    assert_error(response, 403, "FORBIDDEN", "API key does not belong to this brand")


@pytest.mark.parametrize(
    ("method", "path", "_write", "body"),
    [route for route in API_KEY_ROUTES if route[2]],
    ids=[i for i, route in zip(ROUTE_IDS, API_KEY_ROUTES, strict=True) if route[2]],
)
def test_read_key_on_a_write_route_is_forbidden(
    client, brand, read_key, method, path, _write, body
):
    response = call(client, method, path, brand, {"X-Api-Key": read_key}, body)
    assert_error(response, 403, "FORBIDDEN", "Write scope required")


@pytest.mark.parametrize(
    "headers",
    [
        lambda token: {"X-Api-Key": token},
        lambda token: {"Authorization": f"Bearer {token}"},
        lambda token: {"X-Service-Bootstrap-Token": token},
    ],
    ids=["X-Api-Key", "Bearer", "X-Service-Bootstrap-Token"],
)
@pytest.mark.parametrize(("method", "path", "_write", "body"), API_KEY_ROUTES, ids=ROUTE_IDS)
def test_bootstrap_token_is_refused_everywhere_but_create_key(
    client, brand, make_bootstrap_token, headers, method, path, _write, body
):
    response = call(client, method, path, brand, headers(make_bootstrap_token(brand)), body)
    assert_error(
        response,
        401,
        "UNAUTHORIZED",
        "A bootstrap token is accepted only by create-key; send an API key",
    )


@pytest.mark.parametrize(("method", "path", "_write", "body"), API_KEY_ROUTES, ids=ROUTE_IDS)
def test_revoked_key_fails_at_once_on_every_route(
    app, client, brand, make_key, method, path, _write, body
):
    secret = make_key(brand, scopes=("read", "write"))
    assert_success(call(client, *API_KEY_ROUTES[0][:2], brand, {"X-Api-Key": secret}))
    with app.app_context():
        db.session.scalar(select(ApiKey)).revoked_at = utcnow()
        db.session.commit()
    response = call(client, method, path, brand, {"X-Api-Key": secret}, body)
    assert_error(response, 401, "UNAUTHORIZED", "This API key has been revoked")


def test_last_used_is_not_written_on_every_request(app, client, brand, read_key):
    path = API_KEY_ROUTES[0][1]
    first = assert_success(call(client, "GET", path, brand, {"X-Api-Key": read_key}))
    second = assert_success(call(client, "GET", path, brand, {"X-Api-Key": read_key}))
    assert first[0]["lastUsedAt"] is not None
    assert second[0]["lastUsedAt"] == first[0]["lastUsedAt"]


def test_last_used_moves_once_the_resolution_has_passed(app, brand, read_key):
    with app.app_context():
        key, _ = find_key_by_secret(read_key)
        first_use = utcnow()
        record_key_use(key, first_use)
        key, _ = find_key_by_secret(read_key)
        assert key.last_used_at == first_use.replace(microsecond=key.last_used_at.microsecond)

        record_key_use(key, first_use + LAST_USED_RESOLUTION / 2)
        assert find_key_by_secret(read_key)[0].last_used_at == key.last_used_at

        later = first_use + LAST_USED_RESOLUTION + timedelta(seconds=1)
        record_key_use(key, later)
        assert find_key_by_secret(read_key)[0].last_used_at > key.last_used_at


def test_secrets_are_stored_only_as_hashes(app, brand, read_key, make_bootstrap_token):
    token = make_bootstrap_token(brand)
    with app.app_context():
        for table in db.metadata.sorted_tables:
            for row in db.session.execute(select(table)):
                text = " ".join(str(value) for value in row)
                assert read_key not in text and read_key[12:] not in text
                assert token not in text and token[4:] not in text
