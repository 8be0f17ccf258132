"""A secret never appears in a listing, a log line or an error: the whole key lifecycle, and a
webhook signing secret's, is driven with every logger recording (SQL statements included) and
everything said is searched."""

from __future__ import annotations

import base64
import logging

from tests.helpers import assert_success


def fragments(secret: str) -> list[str]:
    """The secret and its unlisted part (the first 12 characters are the public prefix)."""
    return [secret, secret[12:], secret[len("bst_") :]] if secret else []


def test_no_secret_in_listings_logs_or_errors(app, client, runner, make_brand, caplog):
    caplog.set_level(logging.DEBUG)
    logging.getLogger("sqlalchemy.engine").setLevel(logging.INFO)  # statements and parameters
    try:
        brand = runner.invoke(args=["brands", "create", "Leak Check"]).stdout.strip()
        other_brand = make_brand("Other")
        token = runner.invoke(args=["brands", "issue-bootstrap-token", brand]).stdout.strip()
        said: list[str] = []

        def call(method, path, **kwargs):
            response = client.open(f"/api/v1/brand/{brand}{path}", method=method, **kwargs)
            said.append(response.get_data(as_text=True))
            return response

        created = call(
            "POST",
            "/api-key/create-key",
            json={"name": "first", "scopes": ["read", "write"]},
            headers={"X-Service-Bootstrap-Token": token},
        )
        key = created.get_json()["data"]["secret"]
        said.pop()  # the one response meant to carry a secret
        rotated = call(
            "POST", "/api-key/rotate-key", json={"name": "second"}, headers={"X-Api-Key": key}
        )
        second = rotated.get_json()["data"]["secret"]
        said.pop()
        listed = assert_success(call("GET", "/api-key/fetch-keys", headers={"X-Api-Key": key}))
        second_id = next(item["id"] for item in listed if item["name"] == "second")
        call("DELETE", f"/api-key/{second_id}/revoke-key", headers={"X-Api-Key": key})

        # Every way of getting it wrong, each answered with an error that must not echo a secret.
        call("GET", "/api-key/fetch-keys", headers={"X-Api-Key": second})  # revoked
        call("GET", "/api-key/fetch-keys", headers={"X-Api-Key": token})  # bootstrap token
        call("GET", "/api-key/fetch-keys", headers={"Authorization": f"Bearer {key[:-1]}x"})
        call("POST", "/api-key/create-key", json={"name": "x"}, headers={"X-Api-Key": key})
        call(
            "POST",
            "/api-key/create-key",
            json={"name": 5},
            headers={"X-Service-Bootstrap-Token": token},
        )
        call("POST", "/api-key/rotate-key", data=b"{" + key.encode(), headers={"X-Api-Key": key})
        client.get(f"/api/v1/brand/{other_brand}/api-key/fetch-keys", headers={"X-Api-Key": key})
        said.append(runner.invoke(args=["brands", "list"]).output)
    finally:
        logging.getLogger("sqlalchemy.engine").setLevel(logging.WARNING)

    logged = [record.getMessage() for record in caplog.records]
    logged += [caplog.text]
    assert any("fetch-keys" in line for line in logged)  # the requests were really logged
    assert any("api_keys" in line for line in logged)  # and so were the SQL statements
    for secret in (key, second, token):
        for fragment in fragments(secret):
            for text in said + logged:
                assert fragment not in text


def signing_secret_fragments(secret: str) -> list[str]:
    """A signing secret (CONTRACT 12.1: `whsec_` + base64 of 32 bytes), what follows its prefix,
    and its key bytes as hex or url-safe base64, the ways a key could be written down."""
    key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    assert len(key) == 32, secret
    return [
        secret,
        secret.removeprefix("whsec_"),
        key.hex(),
        base64.urlsafe_b64encode(key).decode(),
    ]


def test_no_signing_secret_in_listings_logs_or_errors(app, client, brand, write_key, caplog):
    caplog.set_level(logging.DEBUG)
    logging.getLogger("sqlalchemy.engine").setLevel(logging.INFO)  # statements and parameters
    headers = {"X-Api-Key": write_key}
    base = f"/api/v1/brand/{brand}/webhook"
    said: list[str] = []
    try:

        def call(method, path, **kwargs):
            response = client.open(f"{base}{path}", method=method, headers=headers, **kwargs)
            said.append(response.get_data(as_text=True))
            return response

        registered = call("POST", "/register-endpoint", json={"url": "http://127.0.0.1:9/h"})
        said.pop()  # the one response meant to carry it
        endpoint = registered.get_json()["data"]
        path = f"/{endpoint['id']}"
        rotated = call("POST", f"{path}/rotate-secret", json={"overlapSeconds": 3600})
        said.pop()
        call("GET", "/fetch-endpoints")
        updated = call("PATCH", f"{path}/update-endpoint", json={"description": "rotated"})
        assert updated.status_code == 200
        assert call("PATCH", f"{path}/update-endpoint", json={"url": "ftp://x"}).status_code == 400
        call("POST", f"{path}/rotate-secret", json={"overlapSeconds": -1})
        call("POST", f"{path}/rotate-secret", data=b"{", content_type="application/json")
        call("POST", f"{path}/send-test")
        call("GET", "/fetch-deliveries")
        call("GET", f"{path}/stats")
    finally:
        logging.getLogger("sqlalchemy.engine").setLevel(logging.WARNING)

    logged = [record.getMessage() for record in caplog.records] + [caplog.text]
    assert any("webhook_endpoints" in line for line in logged)  # SQL statements were logged
    for secret in (endpoint["signingSecret"], rotated.get_json()["data"]["signingSecret"]):
        for fragment in signing_secret_fragments(secret):
            for text in said + logged:
                assert fragment not in text
