"""Per-credential rate limits (CONTRACT 9.1), shared by every process through Redis.

Two limits: record-postback's (partners retry in bursts, so it is higher) and everyone else's,
each counted per API key (per bootstrap token for create-key) over a sliding window: the `limits`
package's sliding-window counter, two Redis counters per key and window, updated atomically by
its Lua scripts. Redis unreachable: the request is allowed, counted and logged, never refused.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import limits
import redis
from limits.storage import RedisStorage
from limits.strategies import SlidingWindowCounterRateLimiter

from observability.metrics import RATE_LIMITED, RATE_LIMITS_UNCHECKED, count_backing_service_error
from services.errors import RateLimited

log = logging.getLogger("brand_api.rate_limits")

API = "api"
POSTBACK = "postback"
KEY_PREFIX = "brand-api:rate"
# After Redis fails, requests go unchecked this long before it is asked again, so that a hung
# Redis costs one short timeout per process and interval, not one per request.
UNAVAILABLE_BACKOFF_SECONDS = 5.0
REDIS_TIMEOUT_SECONDS = 0.25


@dataclass(frozen=True)
class RateLimitState:
    """What the RateLimit-* headers say after a request was counted."""

    limit: int
    remaining: int
    reset_after: int  # seconds until the count has room again


class RateLimiter:
    def __init__(self, redis_url: str, limits_by_name: dict[str, str]) -> None:
        self._items = {name: limits.parse(text) for name, text in limits_by_name.items()}
        client = redis.Redis.from_url(
            redis_url,
            socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
            socket_timeout=REDIS_TIMEOUT_SECONDS,
        )
        storage = RedisStorage(
            "redis://", connection_pool=client.connection_pool, key_prefix=KEY_PREFIX
        )
        self._strategy = SlidingWindowCounterRateLimiter(storage)
        self._unavailable_until = 0.0

    def limit_of(self, name: str) -> int:
        return self._items[name].amount

    def count_request(self, name: str, credential_id: str) -> RateLimitState | None:
        """Count one request of `credential_id` against limit `name`.

        :return: the state for the headers, or None when Redis could not be asked (allowed).
        :raise RateLimited: over the limit; nothing else of the request may run.
        """
        if time.monotonic() < self._unavailable_until:
            RATE_LIMITS_UNCHECKED.inc()
            return None
        item = self._items[name]
        try:
            allowed = self._strategy.hit(item, name, credential_id)
            reset_at, remaining = self._strategy.get_window_stats(item, name, credential_id)
        except redis.RedisError as error:
            self._unavailable_until = time.monotonic() + UNAVAILABLE_BACKOFF_SECONDS
            RATE_LIMITS_UNCHECKED.inc()
            count_backing_service_error("redis", "rate_limiter")
            log.warning(
                "rate limits unchecked for %.0f s: Redis unreachable (%s)",
                UNAVAILABLE_BACKOFF_SECONDS,
                type(error).__name__,
            )
            return None
        reset_after = max(1, math.ceil(reset_at - time.time()))
        state = RateLimitState(limit=item.amount, remaining=remaining, reset_after=reset_after)
        if not allowed:
            RATE_LIMITED.labels(limit=name).inc()
            raise RateLimited(retry_after=reset_after, state=state)
        return state
