"""Assertions on the SPEC envelope, shared by the API tests."""

from __future__ import annotations

# Every webhook event's body, as SPEC's envelope and CONTRACT 12 give it: these keys in this
# order, no others.
EVENT_ENVELOPE_KEYS = [
    "id",
    "type",
    "createdAt",
    "brandId",
    "apiVersion",
    "subject",
    "sequence",
    "data",
]


def assert_error(response, status: int, error_code: str, message: str | None = None) -> dict:
    """The SPEC error envelope, with the request id echoed in the header."""
    body = response.get_json()
    assert response.status_code == status, body
    assert body["status"] is False
    assert body["statusCode"] == status
    assert body["errorCode"] == error_code
    assert "data" not in body
    assert body["requestId"] == response.headers["X-Request-Id"]
    if message is not None:
        assert body["message"] == message
    return body


def assert_success(response, status: int = 200) -> dict:
    body = response.get_json()
    assert response.status_code == status, body
    assert body["status"] is True
    assert body["statusCode"] == status
    assert "errorCode" not in body
    assert body["requestId"] == response.headers["X-Request-Id"]
    return body["data"]
