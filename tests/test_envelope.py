"""SPEC section 1 and CONTRACT section 3: every response under /api/v1 is the envelope, whatever
went wrong, with its request id in the X-Request-Id header."""

from __future__ import annotations

import io
import logging

import pytest

from app import create_app
from models import credentials
from tests.helpers import assert_error, assert_success


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE"])
@pytest.mark.parametrize("path", ["/api/v1/nope", "/api/v1/", "/api/v1/brand/brd_x/unknown"])
def test_unknown_routes_are_not_found_envelopes(client, method, path):
    response = client.open(path, method=method)
    assert_error(response, 404, "NOT_FOUND")
    assert response.mimetype == "application/json"


def test_api_is_json_even_for_a_browser(client):
    response = client.get("/api/v1/nope", headers={"Accept": "text/html"})
    assert_error(response, 404, "NOT_FOUND")


def test_pages_outside_the_api_answer_a_browser_in_html(client):
    response = client.get("/no-such-page", headers={"Accept": "text/html"})
    assert response.status_code == 404
    assert response.mimetype == "text/html"
    assert response.headers["X-Request-Id"] in response.get_data(as_text=True)


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/api/v1/brand/brd_x/api-key/create-key", "POST"),
        ("PUT", "/api/v1/brand/brd_x/api-key/fetch-keys", "GET"),
        ("GET", "/api/v1/brand/brd_x/api-key/key_x/revoke-key", "DELETE"),
    ],
)
def test_wrong_method_is_method_not_allowed_with_allow_header(client, method, path, allowed):
    response = client.open(path, method=method)
    assert_error(response, 405, "METHOD_NOT_ALLOWED")
    assert allowed in response.headers["Allow"]


@pytest.mark.parametrize("route", ["rotate-key", "create-key"])
def test_body_over_the_limit_is_refused_before_authentication(app, client, brand, route):
    response = client.post(
        f"/api/v1/brand/{brand}/api-key/{route}",
        data=b"x" * (64 * 1024 + 1),
        headers={"Content-Type": "application/json", "X-Api-Key": "svc_live_x"},
    )
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")


def test_chunked_body_over_the_limit_is_cut_off(client, brand, write_key):
    # No Content-Length: the server (gunicorn) marks the stream terminated, as here.
    response = client.post(
        f"/api/v1/brand/{brand}/api-key/rotate-key",
        input_stream=io.BytesIO(b'{"name": "' + b"x" * (80 * 1024) + b'"}'),
        headers={
            "Content-Type": "application/json",
            "Transfer-Encoding": "chunked",
            "X-Api-Key": write_key,
        },
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert_error(response, 413, "PAYLOAD_TOO_LARGE")


def test_oversized_body_with_valid_credentials_is_413(client, brand, write_key):
    response = client.post(
        f"/api/v1/brand/{brand}/api-key/rotate-key",
        data=b'{"name": "' + b"x" * (64 * 1024) + b'"}',
        headers={"Content-Type": "application/json", "X-Api-Key": write_key},
    )
    body = assert_error(response, 413, "PAYLOAD_TOO_LARGE")
    assert "64 KiB" in body["message"]


@pytest.fixture
def failing_app(app_environ):
    application = create_app(app_environ)

    @application.get("/api/v1/_test/explode")
    def explode():
        raise RuntimeError("database password is hunter2")  # must never reach the caller

    return application


def test_unexpected_errors_are_internal_error_without_a_trace(failing_app, caplog):
    caplog.set_level(logging.ERROR, logger="brand_api")
    response = failing_app.test_client().get("/api/v1/_test/explode")
    body = assert_error(response, 500, "INTERNAL_ERROR")
    text = response.get_data(as_text=True)
    assert "hunter2" not in text and "Traceback" not in text and "RuntimeError" not in text
    assert body["requestId"] in body["message"]
    logged = [r for r in caplog.records if body["requestId"] in r.getMessage()]
    assert logged and logged[0].exc_info is not None  # the trace is in the log, under that id


def test_unreachable_database_is_service_unavailable(app_environ, app):
    down = create_app({**app_environ, "DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:1/x"})
    key = credentials.generate_secret(credentials.API_KEY_PREFIX)
    response = down.test_client().get(
        "/api/v1/brand/brd_x/api-key/fetch-keys", headers={"X-Api-Key": key}
    )
    assert_error(response, 503, "SERVICE_UNAVAILABLE")
    assert response.headers["Retry-After"]


def test_every_response_carries_a_request_id(client, brand, read_key):
    responses = [
        client.get("/healthz"),
        client.get("/api/v1/nope"),
        client.get(f"/api/v1/brand/{brand}/api-key/fetch-keys", headers={"X-Api-Key": read_key}),
        client.get("/api/v1/openapi.json"),
    ]
    ids = [r.headers["X-Request-Id"] for r in responses]
    assert all(ids) and len(set(ids)) == len(ids)


def test_a_safe_caller_request_id_is_kept(client):
    response = client.get("/healthz", headers={"X-Request-Id": "partner-trace-0123456789"})
    assert response.headers["X-Request-Id"] == "partner-trace-0123456789"
    assert response.get_json()["requestId"] == "partner-trace-0123456789"


@pytest.mark.parametrize("unsafe", ["short", "has space in it", "x" * 129, "line\u2028break-here"])
def test_an_unsafe_caller_request_id_is_replaced(client, unsafe):
    response = client.get("/healthz", headers={"X-Request-Id": unsafe})
    assert response.headers["X-Request-Id"].startswith("req_")


def test_healthz_answers_without_dependencies(app_environ):
    down = create_app(
        {
            **app_environ,
            "DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:1/x",
            "REDIS_URL": "redis://127.0.0.1:1/0",
        }
    )
    assert assert_success(down.test_client().get("/healthz")) == {"status": "ok"}


def test_readyz_is_ready_when_database_and_redis_answer(client):
    assert assert_success(client.get("/readyz")) == {
        "status": "ready",
        "database": "ok",
        "redis": "ok",
    }


@pytest.mark.parametrize(
    ("override", "down"),
    [
        ({"REDIS_URL": "redis://127.0.0.1:1/0"}, "redis"),
        ({"DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:1/x"}, "database"),
    ],
)
def test_readyz_names_what_is_down(app_environ, app, override, down):
    application = create_app({**app_environ, **override})
    response = application.test_client().get("/readyz")
    body = assert_error(response, 503, "SERVICE_UNAVAILABLE")
    assert down in body["message"]


def test_envelope_keys_follow_the_spec(client):
    body = client.get("/healthz").get_json()
    assert list(body) == ["status", "statusCode", "message", "data", "requestId"]
    error = client.get("/api/v1/nope").get_json()
    assert list(error) == ["status", "statusCode", "message", "errorCode", "requestId"]


def test_pages_forbid_framing_sniffing_and_foreign_resources(client):
    page = client.get("/docs")
    assert page.status_code == 200
    policy = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "style-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    for response in (page, client.get("/healthz")):
        assert response.headers["X-Frame-Options"] == "DENY"
        assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_root_sends_people_to_the_api_reference(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response.headers["Location"].endswith("/docs")


def test_a_nul_character_in_a_body_is_a_validation_error_and_changes_nothing(
    client, brand, write_key
):
    """PostgreSQL refuses NUL in text; the request says which part is wrong instead of a 500."""
    response = client.post(
        f"/api/v1/brand/{brand}/webhook/register-endpoint",
        data='{"url": "https://hooks.example.invalid/x", "events": ["deal.\\u0000completed"]}',
        headers={"X-Api-Key": write_key, "Content-Type": "application/json"},
    )
    body = assert_error(response, 400, "VALIDATION_ERROR")
    assert body["errors"] == {"events.0": ["Must not contain NUL characters (\\u0000)."]}
    listed = client.get(
        f"/api/v1/brand/{brand}/webhook/fetch-endpoints", headers={"X-Api-Key": write_key}
    )
    assert assert_success(listed)["endpoints"] == []


@pytest.mark.parametrize(
    "path",
    ["webhook/deliveries/whd_%00x", "webhook/deliveries/whd_%00x/redeliver"],
)
def test_a_nul_character_in_a_path_id_is_not_found(client, brand, write_key, path):
    method = client.post if path.endswith("redeliver") else client.get
    response = method(f"/api/v1/brand/{brand}/{path}", headers={"X-Api-Key": write_key})
    assert_error(response, 404, "NOT_FOUND")


def test_a_nul_character_in_a_query_is_a_validation_error(client, brand, read_key):
    response = client.get(
        f"/api/v1/brand/{brand}/webhook/fetch-deliveries?endpointId=whe_%00",
        headers={"X-Api-Key": read_key},
    )
    body = assert_error(response, 400, "VALIDATION_ERROR")
    assert list(body["errors"]) == ["endpointId"]
