"""One access line per request, written by the app for the API and the dashboard alike: `make run`
asks gunicorn for none, so each request is logged once, with its request id and caller."""

from __future__ import annotations

import logging

import pytest

from tests.dashboard import sign_in


@pytest.fixture
def access_lines(caplog):
    caplog.set_level(logging.INFO, logger="brand_api.access")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "brand_api.access"]

    return lines


def test_an_api_request_is_logged_once_with_its_id_status_and_caller(
    client, brand, read_key, access_lines
):
    response = client.get(
        f"/api/v1/brand/{brand}/api-key/fetch-keys?limit=5&sortOrder=asc",
        headers={"X-Api-Key": read_key},
    )
    assert response.status_code == 200
    key_id = response.get_json()["data"][0]["id"]

    [line] = access_lines()
    assert f"request_id={response.headers['X-Request-Id']} " in line
    assert f"method=GET path=/api/v1/brand/{brand}/api-key/fetch-keys status=200 " in line
    assert line.endswith(f"caller=api_key:{key_id}")
    assert "limit" not in line  # the path only, never the query string
    assert read_key not in line


def test_a_refused_api_request_is_logged_without_a_caller(client, brand, access_lines):
    response = client.get(
        f"/api/v1/brand/{brand}/api-key/fetch-keys", headers={"X-Api-Key": "svc_live_nope"}
    )
    assert response.status_code == 401
    [line] = access_lines()
    assert "status=401 " in line and line.endswith("caller=-")
    assert "svc_live_nope" not in line


def test_dashboard_pages_are_logged_too(client, brand, write_key, access_lines):
    sign_in(client, write_key)
    before = len(access_lines())
    response = client.get("/dashboard/keys")
    assert response.status_code == 200

    lines = access_lines()[before:]
    assert len(lines) == 1
    assert f"request_id={response.headers['X-Request-Id']} " in lines[0]
    assert "method=GET path=/dashboard/keys status=200 " in lines[0]
    assert "caller=api_key:key_" in lines[0]
    assert write_key not in "\n".join(access_lines())  # not even the sign-in's POST


def test_a_path_cannot_forge_a_log_line(client, access_lines):
    response = client.get("/dashboard/x%0A2026-01-01 INFO brand_api.access status=200%09tab")
    assert response.status_code == 404
    [line] = access_lines()
    assert "\n" not in line and "\t" not in line
    assert "path=/dashboard/x\\n2026-01-01 INFO brand_api.access status=200\\ttab " in line
