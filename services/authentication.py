"""Who is calling, and may they do this? SPEC section 5, for the JSON API and dashboard alike."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import NoReturn

from models import credentials
from models.api_key import READ, WRITE
from models.columns import utcnow
from services.api_keys import find_key_by_id, find_key_by_secret, record_key_use
from services.bootstrap_tokens import find_valid_bootstrap_token
from services.errors import Forbidden, RateLimited, Unauthorized
from services.rate_limits import AUTH_FAILURES, RateLimiter, client_of

# SPEC section 5 rule 2: anything that does not start with this is refused outright.
API_KEY_FAMILY_PREFIX = "svc_"


@dataclass(frozen=True)
class Caller:
    """An authenticated credential: an API key, or a bootstrap token (create-key only)."""

    brand_id: str
    scopes: frozenset[str]
    key_id: str | None = None
    bootstrap_token_id: str | None = None

    @property
    def actor(self) -> str:
        """How audit fields name this caller; never contains a secret."""
        if self.key_id:
            return f"api_key:{self.key_id}"
        return f"bootstrap_token:{self.bootstrap_token_id}"


def authenticate_api_key(secret: str | None, *, now: datetime | None = None) -> Caller:
    """:raise Unauthorized: missing, malformed, unknown or revoked key, or a bootstrap token."""
    if not secret:
        raise Unauthorized("API key required: send it in the X-Api-Key header")
    if secret.startswith(credentials.BOOTSTRAP_TOKEN_PREFIX):
        raise Unauthorized("A bootstrap token is accepted only by create-key; send an API key")
    if not secret.startswith(API_KEY_FAMILY_PREFIX) or not credentials.is_well_formed(
        secret, credentials.API_KEY_PREFIX
    ):
        raise Unauthorized("Invalid API key")
    key, revoked = find_key_by_secret(secret)
    if key is None:
        raise Unauthorized("Invalid API key")
    if revoked:
        raise Unauthorized("This API key has been revoked")
    record_key_use(key, now or utcnow())
    return Caller(brand_id=key.brand_id, scopes=key.scopes, key_id=key.id)


def authenticate_key_id(key_id: str | None, *, now: datetime | None = None) -> Caller:
    """A dashboard session keeps its key's id, never the secret; the key is checked again on
    every request, so revoking it signs its sessions out at once.

    :raise Unauthorized: no key id, or the key is unknown or revoked.
    """
    if not key_id:
        raise Unauthorized("Sign in with an API key")
    key, revoked = find_key_by_id(key_id)
    if key is None or revoked:
        raise Unauthorized("The API key of this session was revoked; sign in again")
    record_key_use(key, now or utcnow())
    return Caller(brand_id=key.brand_id, scopes=key.scopes, key_id=key.id)


def authenticate_bootstrap_token(token: str | None, *, now: datetime | None = None) -> Caller:
    """:raise Unauthorized: missing, unknown, expired or revoked token, or an API key."""
    if not token:
        raise Unauthorized(
            "Bootstrap token required: send it in the X-Service-Bootstrap-Token header"
        )
    if token.startswith(API_KEY_FAMILY_PREFIX):
        raise Unauthorized("create-key accepts only a bootstrap token, not an API key")
    now = now or utcnow()
    record = find_valid_bootstrap_token(token, now)
    if record is None:
        raise Unauthorized("Invalid, expired or revoked bootstrap token")
    record.last_used_at = now
    return Caller(brand_id=record.brand_id, scopes=frozenset(), bootstrap_token_id=record.id)


def refuse_failed_authentication(
    limiter: RateLimiter | None, address: str, failure: Unauthorized
) -> NoReturn:
    """A request from `address` failed authentication: it counts against the address's client
    (an IPv6 address's /64), and past AUTH_FAILURES_PER_MINUTE in a moving minute it is answered
    429 instead of 401 (CONTRACT 13.7). A valid key never comes here, so the same address's
    valid calls go on. Redis unreachable: nothing is counted, the 401 stands (as for the API's
    own limits, CONTRACT 9.1): a failure costs one indexed lookup and holds nothing shared.

    :raise RateLimited: past the limit.
    :raise Unauthorized: `failure`, otherwise.
    """
    if limiter is not None:
        try:
            limiter.count_request(AUTH_FAILURES, client_of(address))
        except RateLimited as refused:
            wait = refused.retry_after or 1
            raise RateLimited(
                retry_after=wait,
                message="Too many requests from this address failed authentication; "
                f"retry after {wait} seconds",
            ) from None
    raise failure


def authorize(caller: Caller, brand_id: str, scope: str | None) -> None:
    """The caller's brand must be the one addressed, and its key must carry the scope.

    `write` implies `read`: a key allowed to revoke keys may also list them.

    :raise Forbidden: with the SPEC messages.
    """
    if caller.brand_id != brand_id:
        kind = "API key" if caller.key_id else "Bootstrap token"
        raise Forbidden(f"{kind} does not belong to this brand")
    if scope == WRITE and WRITE not in caller.scopes:
        raise Forbidden("Write scope required")
    if scope == READ and not caller.scopes & {READ, WRITE}:
        raise Forbidden("Read scope required")
