"""Per-key rate limits (CONTRACT 9.1) on the real Redis: 429 with its headers once a key is over,
other keys untouched, postbacks on their own limit, one count shared by every gunicorn worker,
and requests allowed (counted, logged) when Redis cannot be asked."""

from __future__ import annotations

import logging
import secrets
import time

import pytest
import requests
from prometheus_client import REGISTRY

from app import create_app
from tests.helpers import assert_error, assert_success
from tests.server_process import ServerProcess
from tests.test_postbacks import counts, post


def fetch_keys(client, brand: str, key: str):
    return client.get(f"/api/v1/brand/{brand}/api-key/fetch-keys", headers={"X-Api-Key": key})


@pytest.fixture
def limited(app_environ):
    """The app with limits small enough to reach: 3 requests a minute, 5 postbacks."""
    app = create_app(
        {**app_environ, "RATE_LIMIT_PER_KEY": "3/minute", "POSTBACK_RATE_LIMIT_PER_KEY": "5/minute"}
    )
    return app.test_client()


def test_a_key_over_its_limit_gets_429_with_retry_after_and_the_headers(limited, brand, make_key):
    key = make_key(brand)
    for remaining in (2, 1, 0):
        response = fetch_keys(limited, brand, key)
        assert_success(response)
        assert response.headers["RateLimit-Limit"] == "3"
        assert response.headers["RateLimit-Remaining"] == str(remaining)
        assert 1 <= int(response.headers["RateLimit-Reset"]) <= 60

    refused = fetch_keys(limited, brand, key)
    assert_error(refused, 429, "RATE_LIMITED")
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.headers["RateLimit-Limit"] == "3"
    assert refused.headers["RateLimit-Remaining"] == "0"


def test_other_keys_of_the_brand_keep_their_own_count(limited, brand, make_key):
    busy, other = make_key(brand), make_key(brand)
    for _ in range(4):
        fetch_keys(limited, brand, busy)
    assert fetch_keys(limited, brand, busy).status_code == 429
    response = fetch_keys(limited, brand, other)
    assert_success(response)
    assert response.headers["RateLimit-Remaining"] == "2"


def test_every_answer_to_a_valid_key_carries_the_headers_and_no_other_does(
    limited, brand, make_brand, make_key
):
    key = make_key(brand)
    not_found = limited.get(
        f"/api/v1/brand/{brand}/webhook/deliveries/whd_missing", headers={"X-Api-Key": key}
    )
    assert_error(not_found, 404, "NOT_FOUND")
    assert not_found.headers["RateLimit-Remaining"] == "2"
    # Another brand's route: refused, and still counted against the key that asked.
    forbidden = fetch_keys(limited, make_brand("Other"), key)
    assert_error(forbidden, 403, "FORBIDDEN")
    assert forbidden.headers["RateLimit-Remaining"] == "1"

    unknown = fetch_keys(limited, brand, "svc_live_" + "x" * 40)
    assert_error(unknown, 401, "UNAUTHORIZED")
    assert "RateLimit-Limit" not in unknown.headers


def test_postbacks_have_their_own_higher_limit_and_a_refused_one_records_nothing(
    app, limited, brand, make_key
):
    key = make_key(brand)
    for _ in range(4):
        fetch_keys(limited, brand, key)
    assert fetch_keys(limited, brand, key).status_code == 429

    body = {"eventType": "purchase"}
    for number in range(5):
        response = post(limited, brand, key, body, idempotency_key=f"rate-limit-order-{number:06d}")
        assert response.status_code == 201, response.get_json()
        assert response.headers["RateLimit-Limit"] == "5"
    before = counts(app)
    refused = post(limited, brand, key, body, idempotency_key="rate-limit-order-000005")
    assert_error(refused, 429, "RATE_LIMITED")
    assert counts(app) == before


def test_the_limit_is_one_count_across_gunicorn_workers(app_environ, brand, make_key):
    """Two gunicorn servers of one worker each, so that which process answers is chosen here,
    not by the accept race: their counts are one."""
    key = make_key(brand)
    limit = {"RATE_LIMIT_PER_KEY": "20/minute"}
    first = ServerProcess(app_environ, workers=1, threads=4, **limit)
    second = ServerProcess(app_environ, workers=1, threads=4, **limit)
    try:

        def ask(server):
            return requests.get(
                f"{server.url}/api/v1/brand/{brand}/api-key/fetch-keys",
                headers={"X-Api-Key": key},
                timeout=10,
            )

        answers = [ask(first) for _ in range(10)] + [ask(second) for _ in range(10)]
        assert [answer.status_code for answer in answers] == [200] * 20
        assert [int(a.headers["RateLimit-Remaining"]) for a in answers] == list(range(19, -1, -1))
        for server in (first, second):
            refused = ask(server)
            assert refused.status_code == 429
            assert refused.json()["errorCode"] == "RATE_LIMITED"
    finally:
        first.stop()
        second.stop()


def test_requests_are_allowed_counted_and_logged_when_redis_is_down(
    app_environ, brand, make_key, caplog
):
    key = make_key(brand)
    # Nothing listens on port 1: every Redis command fails at once.
    unreachable = create_app({**app_environ, "REDIS_URL": "redis://127.0.0.1:1/0"})
    client = unreachable.test_client()
    before = REGISTRY.get_sample_value("brand_api_rate_limit_unchecked_requests_total") or 0
    with caplog.at_level(logging.WARNING, logger="brand_api.rate_limits"):
        responses = [fetch_keys(client, brand, key) for _ in range(5)]
    for response in responses:
        assert_success(response)
        assert "RateLimit-Limit" not in response.headers
    after = REGISTRY.get_sample_value("brand_api_rate_limit_unchecked_requests_total")
    assert after - before == 5
    # Said once, not once per request: the limiter waits before asking Redis again.
    warnings = [r for r in caplog.records if r.name == "brand_api.rate_limits"]
    assert len(warnings) == 1
    assert "Redis unreachable" in warnings[0].getMessage()


def test_a_refusal_stands_until_its_retry_after_without_asking_redis_again(app_environ):
    """A client past its limit is refused from the process's memory until the Retry-After it was
    given: a flood of forged keys then costs no Redis round trip per request. Redis's own count
    is emptied under it here, and the refusal still stands; after the Retry-After, Redis is
    asked again."""
    import redis

    from services.errors import RateLimited
    from services.rate_limits import AUTH_FAILURES, KEY_PREFIX, RateLimiter

    limiter = RateLimiter(app_environ["REDIS_URL"], {AUTH_FAILURES: "2/second"})
    client = f"198.51.100.{secrets.randbelow(250)}-{secrets.token_hex(4)}"
    limiter.count_request(AUTH_FAILURES, client)
    limiter.count_request(AUTH_FAILURES, client)
    with pytest.raises(RateLimited) as first:
        limiter.count_request(AUTH_FAILURES, client)
    wait = first.value.retry_after
    assert wait is not None and 1 <= wait <= 2

    store = redis.Redis.from_url(app_environ["REDIS_URL"])
    counters = [key for key in store.scan_iter(f"{KEY_PREFIX}*") if client.encode() in key]
    assert counters and store.delete(*counters) == len(counters)
    with pytest.raises(RateLimited) as again:
        limiter.count_request(AUTH_FAILURES, client)
    assert again.value.retry_after is not None and again.value.retry_after <= wait

    time.sleep(wait + 0.1)
    assert limiter.count_request(AUTH_FAILURES, client) is not None  # Redis's (empty) count
