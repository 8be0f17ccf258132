"""API keys: minted (create-key, rotate-key), listed and revoked per brand (SPEC section 4)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import Connection, bindparam, or_, select, update

from extensions import db
from models import ApiKey, credentials
from models.api_key import DEFAULT_SCOPES, SCOPES
from models.columns import utcnow
from services.brands import get_brand
from services.errors import NotFound
from services.psycopg_direct import fetch_first_on_psycopg, psycopg_sql

# lastUsedAt is kept to this resolution so that a busy key costs one UPDATE a minute, not one a
# request; listings show "used in the last minute" exactly as well.
LAST_USED_RESOLUTION = timedelta(seconds=60)


@dataclass(frozen=True)
class IssuedApiKey:
    record: ApiKey
    secret: str  # returned once, in the create-key or rotate-key response


@dataclass(frozen=True)
class ActiveKey:
    """What authentication needs of a key, read without loading an ORM object."""

    id: str
    brand_id: str
    scopes: frozenset[str]
    last_used_at: datetime | None


def normalize_scopes(scopes: Iterable[str]) -> list[str]:
    """Deduplicated, in canonical order (`read` before `write`)."""
    wanted = set(scopes)
    return [scope for scope in SCOPES if scope in wanted]


def create_api_key(
    *,
    brand_id: str,
    name: str,
    scopes: Iterable[str] = DEFAULT_SCOPES,
    created_by: str,
    now: datetime | None = None,
) -> IssuedApiKey:
    """Mint a key for the brand; the secret is in the result and nowhere else.

    :raise NotFound: unknown brand.
    """
    get_brand(brand_id)
    secret = credentials.generate_secret(credentials.API_KEY_PREFIX)
    record = ApiKey(
        brand_id=brand_id,
        name=name,
        key_prefix=credentials.key_prefix(secret),
        secret_hash=credentials.hash_secret(secret),
        scopes=normalize_scopes(scopes),
        created_by=created_by,
        created_at=now or utcnow(),
    )
    db.session.add(record)
    db.session.flush()
    return IssuedApiKey(record=record, secret=secret)


def list_active_keys(brand_id: str) -> list[ApiKey]:
    """The brand's unrevoked keys, newest first."""
    return list(
        db.session.scalars(
            select(ApiKey)
            .where(ApiKey.brand_id == brand_id, ApiKey.revoked_at.is_(None))
            .order_by(ApiKey.created_at.desc(), ApiKey.id.desc())
        )
    )


def revoke_api_key(*, brand_id: str, key_id: str, now: datetime | None = None) -> ApiKey:
    """Revoke at once; revoking a revoked key is a no-op that returns it (safe to retry).

    :raise NotFound: no key with that id belongs to the brand.
    """
    key = db.session.scalar(select(ApiKey).where(ApiKey.id == key_id, ApiKey.brand_id == brand_id))
    if key is None:
        raise NotFound(f"No API key with id {key_id!r} in this brand")
    if key.revoked_at is None:
        key.revoked_at = now or utcnow()
        db.session.flush()
    return key


# A psycopg row of the lookup, its fields named as the statement's columns (as a Core row's are):
# the statement selects exactly these.
class _KeyRow(NamedTuple):
    id: str
    brand_id: str
    scopes: list[str]
    secret_hash: str
    revoked_at: datetime | None
    last_used_at: datetime | None


# Every authenticated request runs this: built once, and run on the session's connection as Core
# (which skips the ORM's per-execution work), or on PostgreSQL through psycopg itself
# (services.psycopg_direct).
_KEY_BY_SECRET_HASH = select(*(ApiKey.__table__.c[name] for name in _KeyRow._fields)).where(
    ApiKey.__table__.c.secret_hash == bindparam("secret_hash")
)
_KEY_BY_SECRET_HASH_ON_PSYCOPG = psycopg_sql(_KEY_BY_SECRET_HASH)


def find_key_by_secret(secret: str) -> tuple[ActiveKey | None, bool]:
    """Look a presented secret up: `(key, revoked)`; `(None, False)` when it is unknown."""
    params = {"secret_hash": credentials.hash_secret(secret)}
    with _statement_of_its_own() as connection:
        found = fetch_first_on_psycopg(connection, _KEY_BY_SECRET_HASH_ON_PSYCOPG, params)
    row = _KeyRow(*found) if found is not None else None
    if row is None or not credentials.hash_matches(row.secret_hash, secret):
        return None, False
    return _active_key_and_revoked(row)


@contextmanager
def _statement_of_its_own() -> Iterator[Connection]:
    """A pooled connection in autocommit, given back at once: the lookup and the stamp are one
    statement each, so no BEGIN and ROLLBACK or COMMIT go around them. A refused key then costs
    two round trips (the pool's ping and the lookup) instead of four, and every request two fewer
    before it takes a work slot, holding no connection (blueprints/admission.py)."""
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        yield connection


def find_key_by_id(key_id: str) -> tuple[ActiveKey | None, bool]:
    """Look a key up by id (a dashboard session names its key so): `(key, revoked)`."""
    row = db.session.execute(
        select(
            ApiKey.id, ApiKey.brand_id, ApiKey.scopes, ApiKey.revoked_at, ApiKey.last_used_at
        ).where(ApiKey.id == key_id)
    ).first()
    if row is None:
        return None, False
    return _active_key_and_revoked(row)


def _active_key_and_revoked(row) -> tuple[ActiveKey, bool]:
    key = ActiveKey(
        id=row.id,
        brand_id=row.brand_id,
        scopes=frozenset(row.scopes),
        last_used_at=row.last_used_at,
    )
    return key, row.revoked_at is not None


def record_key_use(key: ActiveKey, now: datetime) -> None:
    """Move lastUsedAt forward when it is older than the resolution.

    A statement of its own, committed at once, so the stamp survives a request that later fails
    and holds no connection while the request waits for a work slot. The WHERE clause keeps
    concurrent requests of one key from all writing it.
    """
    if key.last_used_at is not None and now - key.last_used_at < LAST_USED_RESOLUTION:
        return
    with _statement_of_its_own() as connection:
        connection.execute(
            update(ApiKey)
            .where(
                ApiKey.id == key.id,
                or_(
                    ApiKey.last_used_at.is_(None),
                    ApiKey.last_used_at < now - LAST_USED_RESOLUTION,
                ),
            )
            .values(last_used_at=now)
        )
