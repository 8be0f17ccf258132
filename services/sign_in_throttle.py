"""Failed dashboard sign-ins (a wrong API key, or a wrong bootstrap token for the first key),
refused before any key or token is checked once too many failed (CONTRACT 7; docs/operations.md).

Counted twice in Redis, with the API's rate limiter, and only failures: per client, and across
every client against a ceiling of its own, so that many addresses cannot add up to an open door.
A client is an IPv4 address, or an IPv6 address's /64 (`services.rate_limits.client_of`). Redis
unreachable: nothing is counted or refused, as for the API.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass

from services.errors import RateLimited
from services.rate_limits import (
    SIGN_IN_FAILURES,
    SIGN_IN_FAILURES_GLOBAL,
    RateLimiter,
    client_of,
)

# The one identifier the global ceiling counts under.
EVERY_CLIENT = "*"


@dataclass(frozen=True)
class Refusal:
    retry_after: int  # seconds until a sign-in may be tried again
    everyone: bool  # the global ceiling is reached, not this client's own count


def sign_in_refusal(limiter: RateLimiter, address: str) -> Refusal | None:
    """Without counting anything: whether a sign-in from `address` is refused now, and for how
    long (the longer wait when both counts are used up)."""
    own = limiter.seconds_until_allowed(SIGN_IN_FAILURES, client_of(address))
    everyone = limiter.seconds_until_allowed(SIGN_IN_FAILURES_GLOBAL, EVERY_CLIENT)
    if everyone is not None and (own is None or everyone >= own):
        return Refusal(retry_after=everyone, everyone=True)
    if own is not None:
        return Refusal(retry_after=own, everyone=False)
    return None


def count_failed_sign_in(limiter: RateLimiter, address: str) -> None:
    """One more failure from `address`, in its client's count and in everyone's."""
    for name, identifier in (
        (SIGN_IN_FAILURES, client_of(address)),
        (SIGN_IN_FAILURES_GLOBAL, EVERY_CLIENT),
    ):
        with suppress(RateLimited):  # this failure used up the limit: the next try is refused
            limiter.count_request(name, identifier)
