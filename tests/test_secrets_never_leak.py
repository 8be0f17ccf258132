"""A secret never appears in a listing, a log line or an error: the whole key lifecycle is
driven with every logger recording (SQL statements included) and everything said is searched."""

from __future__ import annotations

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
