"""Per-credential rate limits (CONTRACT 9.1), shared by every process through Redis.

Two limits: record-postback's (partners retry in bursts, so it is higher) and everyone else's,
each counted per API key (per bootstrap token for create-key) over a sliding window: the `limits`
package's sliding-window counter, two Redis counters per key and window, updated atomically by
its Lua scripts. Redis unreachable: the request is allowed, counted and logged, never refused.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import cast

import limits
import redis
from limits.storage import RedisStorage
from limits.strategies import SlidingWindowCounterRateLimiter

from observability.metrics import RATE_LIMITED, RATE_LIMITS_UNCHECKED, count_backing_service_error
from services.errors import RateLimited

log = logging.getLogger("brand_api.rate_limits")

API = "api"
POSTBACK = "postback"
# Failed dashboard sign-ins (only failures are counted), per client and across every client
# (services/sign_in_throttle.py).
SIGN_IN_FAILURES = "sign_in_failures"
SIGN_IN_FAILURES_GLOBAL = "sign_in_failures_global"
# API requests that failed authentication, per client (services.authentication; CONTRACT 13.7).
AUTH_FAILURES = "auth_failures"
IPV6_CLIENT_PREFIX = 64
KEY_PREFIX = "brand-api:rate"
# After Redis fails, requests go unchecked this long before it is asked again, so that a hung
# Redis costs one short timeout per process and interval, not one per request.
UNAVAILABLE_BACKOFF_SECONDS = 5.0
# Refusals remembered per process (below); past this many, the expired ones are dropped, and all
# of them if none had expired: a forgotten refusal costs one more round trip to Redis, no more.
REMEMBERED_REFUSALS = 10_000
REDIS_TIMEOUT_SECONDS = 0.25


def client_of(address: str) -> str:
    """What a failure from `address` counts against: an IPv4 address itself (an IPv4-mapped
    IPv6 address as that IPv4 address), an IPv6 address its /64, anything else as it is. One
    home or server is handed a whole /64 and can send from any of its 2^64 addresses, so
    counting each would count nothing."""
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, IPV6_CLIENT_PREFIX), strict=False))
    return str(parsed)


class _OneTripRedisStorage(RedisStorage):
    """limits' Redis storage, with a hit and the read of its window sent in one pipeline: the
    strategy's `hit` then `get_window_stats` would cost two round trips per request, which
    bench/rate_limiter.py measured at a fifth of a postback. Same scripts, keys and arithmetic
    as the library's; the window read with the hit is handed to the read that follows it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._read_with_hit = threading.local()

    def _client(self) -> redis.Redis:
        # limits types its client by a protocol of the few calls it makes itself; a redis://
        # storage's client is a redis.Redis, whose pipelines and SCRIPT LOAD this class uses.
        return cast(redis.Redis, self.get_connection())

    def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        keys = [
            self.prefixed_key(self._previous_window_key(key)),
            self.prefixed_key(self._current_window_key(key)),
        ]
        acquire, read = self.lua_acquire_sliding_window, self.lua_sliding_window
        try:
            acquired, window = self._both(acquire.sha, read.sha, keys, limit, expiry, amount)
        except redis.exceptions.NoScriptError:  # a Redis that restarted or was flushed
            connection = self._client()
            connection.script_load(acquire.script)
            connection.script_load(read.script)
            acquired, window = self._both(acquire.sha, read.sha, keys, limit, expiry, amount)
        self._read_with_hit.window = (key, expiry, window)
        return bool(acquired)

    def _both(self, acquire_sha, read_sha, keys, limit, expiry, amount):
        # EVALSHA straight into the pipeline: a pipeline of Script objects would first send
        # SCRIPT EXISTS, a round trip of its own.
        pipe = self._client().pipeline(transaction=False)
        pipe.evalsha(acquire_sha, 2, *keys, limit, expiry, amount)
        pipe.evalsha(read_sha, 2, *keys, expiry)
        return pipe.execute()

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        read = getattr(self._read_with_hit, "window", None)
        self._read_with_hit.window = None
        if read is None or read[:2] != (key, expiry):
            return super().get_sliding_window(key, expiry)
        window = read[2]
        if not window:
            return 0, 0.0, 0, 0.0
        return (
            int(window[0] or 0),
            max(0, float(window[1] or 0)) / 1000,
            int(window[2] or 0),
            max(0, float(window[3] or 0)) / 1000,
        )


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
        storage = _OneTripRedisStorage(
            "redis://", connection_pool=client.connection_pool, key_prefix=KEY_PREFIX
        )
        self._strategy = SlidingWindowCounterRateLimiter(storage)
        self._unavailable_until = 0.0
        # A refusal stands in this process until its Retry-After without asking Redis again:
        # a client that keeps knocking past its limit (a flood of forged keys from one address)
        # costs no round trip per request. Redis counts nothing past a limit, so the counts
        # are the same; (limit name, identifier) -> (monotonic end, the limit's amount).
        self._refused: dict[tuple[str, str], tuple[float, int]] = {}

    def limit_of(self, name: str) -> int:
        return self._items[name].amount

    def count_request(self, name: str, credential_id: str) -> RateLimitState | None:
        """Count one request of `credential_id` against limit `name`.

        :return: the state for the headers, or None when Redis could not be asked (allowed).
        :raise RateLimited: over the limit; nothing else of the request may run.
        """
        now = time.monotonic()
        refused = self._refused.get((name, credential_id))
        if refused is not None and refused[0] > now:
            wait = max(1, math.ceil(refused[0] - now))
            RATE_LIMITED.labels(limit=name).inc()
            raise RateLimited(retry_after=wait, state=RateLimitState(refused[1], 0, wait))
        if now < self._unavailable_until:
            RATE_LIMITS_UNCHECKED.inc()
            return None
        item = self._items[name]
        try:
            allowed = self._strategy.hit(item, name, credential_id)
            reset_at, remaining = self._strategy.get_window_stats(item, name, credential_id)
        except redis.RedisError as error:
            self._unavailable(error)
            return None
        reset_after = max(1, math.ceil(reset_at - time.time()))
        state = RateLimitState(limit=item.amount, remaining=remaining, reset_after=reset_after)
        if not allowed:
            RATE_LIMITED.labels(limit=name).inc()
            self._remember_refusal((name, credential_id), now + reset_after, item.amount)
            raise RateLimited(retry_after=reset_after, state=state)
        return state

    def _remember_refusal(self, key: tuple[str, str], until: float, amount: int) -> None:
        if len(self._refused) >= REMEMBERED_REFUSALS:
            now = time.monotonic()
            expired = [k for k, (end, _) in list(self._refused.items()) if end <= now]
            for k in expired:
                self._refused.pop(k, None)
            if len(self._refused) >= REMEMBERED_REFUSALS:
                self._refused.clear()
        self._refused[key] = (until, amount)

    def seconds_until_allowed(self, name: str, identifier: str) -> int | None:
        """Without counting anything: how long until `identifier` may go on, when limit `name`
        is used up; None when it may go on now (or Redis could not be asked: allowed)."""
        if time.monotonic() < self._unavailable_until:
            RATE_LIMITS_UNCHECKED.inc()
            return None
        item = self._items[name]
        try:
            if self._strategy.test(item, name, identifier):
                return None
            reset_at, _ = self._strategy.get_window_stats(item, name, identifier)
        except redis.RedisError as error:
            self._unavailable(error)
            return None
        RATE_LIMITED.labels(limit=name).inc()
        return max(1, math.ceil(reset_at - time.time()))

    def _unavailable(self, error: redis.RedisError) -> None:
        self._unavailable_until = time.monotonic() + UNAVAILABLE_BACKOFF_SECONDS
        RATE_LIMITS_UNCHECKED.inc()
        count_backing_service_error("redis", "rate_limiter")
        log.warning(
            "rate limits unchecked for %.0f s: Redis unreachable (%s)",
            UNAVAILABLE_BACKOFF_SECONDS,
            type(error).__name__,
        )
