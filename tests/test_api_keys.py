"""The key operations of SPEC section 4: createKey, rotateKey, fetchKeys, revokeKey."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from extensions import db
from models import ApiKey, BootstrapToken
from models.columns import utcnow
from tests.helpers import assert_error, assert_success


def create_url(brand_id: str) -> str:
    return f"/api/v1/brand/{brand_id}/api-key/create-key"


def rotate_url(brand_id: str) -> str:
    return f"/api/v1/brand/{brand_id}/api-key/rotate-key"


def fetch_url(brand_id: str) -> str:
    return f"/api/v1/brand/{brand_id}/api-key/fetch-keys"


def revoke_url(brand_id: str, key_id: str) -> str:
    return f"/api/v1/brand/{brand_id}/api-key/{key_id}/revoke-key"


def bootstrap(token: str) -> dict:
    return {"X-Service-Bootstrap-Token": token}


def key_header(secret: str) -> dict:
    return {"X-Api-Key": secret}


def key_count(app) -> int:
    with app.app_context():
        return db.session.scalar(select(func.count()).select_from(ApiKey))


# --- createKey ---------------------------------------------------------------------------------


def test_create_key_with_bootstrap_token_returns_the_secret_once(
    client, brand, make_bootstrap_token
):
    token = make_bootstrap_token(brand)
    response = client.post(
        create_url(brand),
        json={"name": "orders-service", "scopes": ["read", "write"]},
        headers=bootstrap(token),
    )
    data = assert_success(response, 201)
    assert set(data) == {"id", "name", "keyPrefix", "scopes", "secret", "createdAt"}
    assert data["id"].startswith("key_")
    assert data["name"] == "orders-service"
    assert data["scopes"] == ["read", "write"]
    assert data["secret"].startswith("svc_live_")
    assert len(data["secret"]) >= len("svc_live_") + 32
    assert data["keyPrefix"] == data["secret"][:12]
    assert data["createdAt"].endswith("Z")
    assert response.headers["Cache-Control"] == "no-store"

    listed = assert_success(client.get(fetch_url(brand), headers=key_header(data["secret"])))
    assert [key["id"] for key in listed] == [data["id"]]
    assert "secret" not in listed[0]


def test_create_key_defaults_to_read_scope(client, brand, make_bootstrap_token):
    response = client.post(
        create_url(brand),
        json={"name": "reporting"},
        headers=bootstrap(make_bootstrap_token(brand)),
    )
    assert assert_success(response, 201)["scopes"] == ["read"]


def test_create_key_accepts_the_token_as_bearer(client, brand, make_bootstrap_token):
    token = make_bootstrap_token(brand)
    response = client.post(
        create_url(brand), json={"name": "bearer"}, headers={"Authorization": f"Bearer {token}"}
    )
    assert_success(response, 201)


def test_create_key_deduplicates_scopes_in_canonical_order(client, brand, make_bootstrap_token):
    response = client.post(
        create_url(brand),
        json={"name": "dupes", "scopes": ["write", "read", "write"]},
        headers=bootstrap(make_bootstrap_token(brand)),
    )
    assert assert_success(response, 201)["scopes"] == ["read", "write"]


def test_create_key_records_which_bootstrap_token_minted_it(
    app, client, brand, make_bootstrap_token
):
    client.post(
        create_url(brand), json={"name": "audited"}, headers=bootstrap(make_bootstrap_token(brand))
    )
    with app.app_context():
        key = db.session.scalar(select(ApiKey))
        token = db.session.scalar(select(BootstrapToken))
        assert key.created_by == f"bootstrap_token:{token.id}"
        assert token.last_used_at is not None


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({}, "name", "Missing data"),
        ({"scopes": ["read"]}, "name", "Missing data"),
        ({"name": ""}, "name", "between 1 and 100"),
        ({"name": "   "}, "name", "between 1 and 100"),
        ({"name": "x" * 101}, "name", "between 1 and 100"),
        ({"name": "tab\there"}, "name", "control characters"),
        ({"name": 42}, "name", "Not a valid string"),
        ({"name": None}, "name", "may not be null"),
        ({"name": "k", "scopes": "read"}, "scopes", "Not a valid list"),
        ({"name": "k", "scopes": []}, "scopes", "at least one scope"),
        ({"name": "k", "scopes": ["admin"]}, "scopes.0", "Must be one of"),
        ({"name": "k", "scopes": ["read", 7]}, "scopes.1", "Not a valid string"),
        ({"name": "k", "scopes": None}, "scopes", "may not be null"),
        ({"name": "k", "owner": "me"}, "owner", "Unknown field"),
    ],
)
def test_create_key_rejects_invalid_bodies_and_stores_nothing(
    app, client, brand, make_bootstrap_token, body, field, fragment
):
    response = client.post(
        create_url(brand), json=body, headers=bootstrap(make_bootstrap_token(brand))
    )
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert fragment in " ".join(error["errors"][field])
    assert key_count(app) == 0


@pytest.mark.parametrize(
    ("raw", "content_type", "message"),
    [
        (b"", "application/json", None),
        (b"{not json", "application/json", "Request body must be valid JSON"),
        (b'["name"]', "application/json", "Request body must be a JSON object"),
        (b'"name"', "application/json", "Request body must be a JSON object"),
        (b"\xff\xfe\x00", "application/json", "Request body must be valid JSON"),
    ],
)
def test_create_key_rejects_bodies_that_are_not_a_json_object(
    app, client, brand, make_bootstrap_token, raw, content_type, message
):
    response = client.post(
        create_url(brand),
        data=raw,
        headers={**bootstrap(make_bootstrap_token(brand)), "Content-Type": content_type},
    )
    error = assert_error(response, 400, "VALIDATION_ERROR", message)
    assert error["errors"]  # an empty body is reported as the missing name
    assert key_count(app) == 0


def test_create_key_refuses_a_body_over_64_kib(app, client, brand, make_bootstrap_token):
    body = b'{"name": "big", "pad": "' + b"x" * (64 * 1024) + b'"}'
    response = client.post(
        create_url(brand),
        data=body,
        headers={**bootstrap(make_bootstrap_token(brand)), "Content-Type": "application/json"},
    )
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")
    assert key_count(app) == 0


def test_a_body_just_under_the_limit_is_read(client, brand, make_bootstrap_token):
    # Proves the limit is 64 KiB and not lower: a large body reaches validation.
    body = b'{"name": "big", "pad": "' + b"x" * (60 * 1024) + b'"}'
    response = client.post(
        create_url(brand),
        data=body,
        headers={**bootstrap(make_bootstrap_token(brand)), "Content-Type": "application/json"},
    )
    assert "pad" in assert_error(response, 400, "VALIDATION_ERROR")["errors"]


def test_bootstrap_token_stays_valid_until_it_expires(client, brand, make_bootstrap_token):
    token = make_bootstrap_token(brand)
    for name in ("first", "second"):
        assert_success(
            client.post(create_url(brand), json={"name": name}, headers=bootstrap(token)), 201
        )


def test_expired_bootstrap_token_is_refused(app, client, brand, make_bootstrap_token):
    token = make_bootstrap_token(brand)
    with app.app_context():
        record = db.session.scalar(select(BootstrapToken))
        record.expires_at = utcnow() - timedelta(seconds=1)
        db.session.commit()
    response = client.post(create_url(brand), json={"name": "late"}, headers=bootstrap(token))
    assert_error(response, 401, "UNAUTHORIZED", "Invalid, expired or revoked bootstrap token")
    assert key_count(app) == 0


def test_bootstrap_token_of_another_brand_is_forbidden(
    app, client, make_brand, make_bootstrap_token
):
    brand_a, brand_b = make_brand("A"), make_brand("B")
    response = client.post(
        create_url(brand_a), json={"name": "x"}, headers=bootstrap(make_bootstrap_token(brand_b))
    )
    assert_error(response, 403, "FORBIDDEN", "Bootstrap token does not belong to this brand")
    assert key_count(app) == 0


@pytest.mark.parametrize("where", ["X-Api-Key", "Bearer", "X-Service-Bootstrap-Token"])
def test_create_key_never_accepts_an_api_key(app, client, brand, write_key, where):
    headers = {
        "X-Api-Key": {"X-Api-Key": write_key},
        "Bearer": {"Authorization": f"Bearer {write_key}"},
        "X-Service-Bootstrap-Token": {"X-Service-Bootstrap-Token": write_key},
    }[where]
    response = client.post(create_url(brand), json={"name": "sneaky"}, headers=headers)
    assert_error(
        response, 401, "UNAUTHORIZED", "create-key accepts only a bootstrap token, not an API key"
    )
    assert key_count(app) == 1  # only the fixture's key


def test_create_key_refuses_an_api_key_even_beside_a_valid_token(
    app, client, brand, write_key, make_bootstrap_token
):
    headers = {**bootstrap(make_bootstrap_token(brand)), "X-Api-Key": write_key}
    response = client.post(create_url(brand), json={"name": "both"}, headers=headers)
    assert_error(response, 401, "UNAUTHORIZED")
    assert key_count(app) == 1


@pytest.mark.parametrize(
    "token", ["", "bst_", "bst_" + "a" * 38, "not-a-token", "Bearer", "eyJhbGciOiJIUzI1NiJ9.e30.x"]
)
def test_create_key_refuses_missing_or_invalid_tokens(app, client, brand, token):
    response = client.post(create_url(brand), json={"name": "x"}, headers=bootstrap(token))
    assert_error(response, 401, "UNAUTHORIZED")
    assert key_count(app) == 0


def test_authentication_is_checked_before_the_body(client, brand):
    response = client.post(create_url(brand), data=b"{broken", headers=bootstrap("bst_nope"))
    assert_error(response, 401, "UNAUTHORIZED")


# --- rotateKey ---------------------------------------------------------------------------------


def test_rotate_key_adds_a_key_and_keeps_the_caller_valid(client, brand, write_key):
    response = client.post(
        rotate_url(brand), json={"name": "next", "scopes": ["read"]}, headers=key_header(write_key)
    )
    new = assert_success(response, 201)
    assert set(new) == {"id", "name", "keyPrefix", "scopes", "secret", "createdAt"}
    assert new["secret"] != write_key and new["secret"].startswith("svc_live_")

    for secret in (write_key, new["secret"]):
        listed = assert_success(client.get(fetch_url(brand), headers=key_header(secret)))
        assert len(listed) == 2
    assert listed[0]["id"] == new["id"]  # newest first


def test_rotate_key_validates_like_create_key(app, client, brand, write_key):
    response = client.post(
        rotate_url(brand), json={"scopes": ["owner"]}, headers=key_header(write_key)
    )
    error = assert_error(response, 400, "VALIDATION_ERROR")
    assert set(error["errors"]) == {"name", "scopes.0"}
    assert key_count(app) == 1


def test_rotate_key_needs_write_scope(app, client, brand, read_key):
    response = client.post(rotate_url(brand), json={"name": "x"}, headers=key_header(read_key))
    assert_error(response, 403, "FORBIDDEN", "Write scope required")
    assert key_count(app) == 1


def test_rotate_key_records_the_calling_key(app, client, brand, write_key):
    new = assert_success(
        client.post(rotate_url(brand), json={"name": "child"}, headers=key_header(write_key)), 201
    )
    with app.app_context():
        parent = db.session.scalar(select(ApiKey).where(ApiKey.id != new["id"]))
        child = db.session.get(ApiKey, new["id"])
        assert child.created_by == f"api_key:{parent.id}"


# --- fetchKeys ---------------------------------------------------------------------------------


def test_fetch_keys_lists_active_keys_newest_first_without_secrets(
    client, brand, make_key, read_key
):
    other = make_key(brand, scopes=("read", "write"), name="second")
    listed = assert_success(client.get(fetch_url(brand), headers=key_header(read_key)))
    assert [key["name"] for key in listed] == ["second", "test key"]
    for key in listed:
        assert set(key) == {"id", "name", "keyPrefix", "scopes", "lastUsedAt", "createdAt"}
    raw = client.get(fetch_url(brand), headers=key_header(read_key)).get_data(as_text=True)
    assert read_key not in raw and other not in raw
    assert read_key[12:] not in raw  # not even the part after the prefix


def test_fetch_keys_shows_last_used_for_the_keys_that_were_used(client, brand, make_key, read_key):
    unused = make_key(brand, name="unused")
    listed = assert_success(client.get(fetch_url(brand), headers=key_header(read_key)))
    by_name = {key["name"]: key for key in listed}
    assert by_name["test key"]["lastUsedAt"] is not None
    assert by_name["unused"]["lastUsedAt"] is None
    assert unused


def test_write_scope_implies_read(client, brand, make_key):
    write_only = make_key(brand, scopes=("write",))
    assert len(assert_success(client.get(fetch_url(brand), headers=key_header(write_only)))) == 1


def test_other_brands_keys_are_never_listed(client, make_brand, make_key):
    brand_a, brand_b = make_brand("A"), make_brand("B")
    key_a = make_key(brand_a, name="a")
    make_key(brand_b, name="b")
    listed = assert_success(client.get(fetch_url(brand_a), headers=key_header(key_a)))
    assert [key["name"] for key in listed] == ["a"]


# --- revokeKey ---------------------------------------------------------------------------------


def test_revoke_key_is_immediate(client, brand, write_key, make_key):
    victim = make_key(brand, scopes=("read",), name="victim")
    listed = assert_success(client.get(fetch_url(brand), headers=key_header(victim)))
    victim_id = next(key["id"] for key in listed if key["name"] == "victim")

    response = client.delete(revoke_url(brand, victim_id), headers=key_header(write_key))
    data = assert_success(response)
    assert data["id"] == victim_id and data["revokedAt"].endswith("Z")

    # The very next request with that secret fails.
    response = client.get(fetch_url(brand), headers=key_header(victim))
    assert_error(response, 401, "UNAUTHORIZED", "This API key has been revoked")
    listed = assert_success(client.get(fetch_url(brand), headers=key_header(write_key)))
    assert victim_id not in [key["id"] for key in listed]


def test_a_key_can_revoke_itself(client, brand, write_key):
    own_id = assert_success(client.get(fetch_url(brand), headers=key_header(write_key)))[0]["id"]
    assert_success(client.delete(revoke_url(brand, own_id), headers=key_header(write_key)))
    assert_error(client.get(fetch_url(brand), headers=key_header(write_key)), 401, "UNAUTHORIZED")


def test_revoking_twice_is_a_safe_retry(client, brand, write_key, make_key):
    make_key(brand, name="victim")
    listed = assert_success(client.get(fetch_url(brand), headers=key_header(write_key)))
    victim_id = next(key["id"] for key in listed if key["name"] == "victim")
    first = assert_success(
        client.delete(revoke_url(brand, victim_id), headers=key_header(write_key))
    )
    second = assert_success(
        client.delete(revoke_url(brand, victim_id), headers=key_header(write_key))
    )
    assert first == second


def test_revoke_unknown_key_is_not_found(client, brand, write_key):
    response = client.delete(revoke_url(brand, "key_doesnotexist"), headers=key_header(write_key))
    assert_error(response, 404, "NOT_FOUND")


def test_revoke_another_brands_key_is_not_found_and_changes_nothing(client, make_brand, make_key):
    brand_a, brand_b = make_brand("A"), make_brand("B")
    key_a = make_key(brand_a)
    key_b = make_key(brand_b)
    id_b = assert_success(client.get(fetch_url(brand_b), headers=key_header(key_b)))[0]["id"]
    response = client.delete(revoke_url(brand_a, id_b), headers=key_header(key_a))
    assert_error(response, 404, "NOT_FOUND")
    assert_success(client.get(fetch_url(brand_b), headers=key_header(key_b)))


def test_revoke_needs_write_scope(client, brand, read_key, write_key):
    target = assert_success(client.get(fetch_url(brand), headers=key_header(write_key)))[0]["id"]
    response = client.delete(revoke_url(brand, target), headers=key_header(read_key))
    assert_error(response, 403, "FORBIDDEN", "Write scope required")
    assert_success(client.get(fetch_url(brand), headers=key_header(write_key)))


def test_bootstrap_token_recovers_a_brand_whose_keys_were_all_revoked(
    client, brand, write_key, make_bootstrap_token
):
    own_id = assert_success(client.get(fetch_url(brand), headers=key_header(write_key)))[0]["id"]
    assert_success(client.delete(revoke_url(brand, own_id), headers=key_header(write_key)))
    response = client.post(
        create_url(brand),
        json={"name": "recovered", "scopes": ["read", "write"]},
        headers=bootstrap(make_bootstrap_token(brand)),
    )
    recovered = assert_success(response, 201)["secret"]
    listed = assert_success(client.get(fetch_url(brand), headers=key_header(recovered)))
    assert [key["name"] for key in listed] == ["recovered"]
