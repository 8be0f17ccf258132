"""Bootstrap tokens: support's way to let a brand mint its first key, or recover when every key
was revoked (SPEC section 4, rule 3). Valid until they expire or are revoked."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import CursorResult, select, update

from extensions import db
from models import BootstrapToken, credentials
from models.columns import utcnow
from services.brands import get_brand
from services.errors import ValidationFailed

DEFAULT_TTL_HOURS = 24
MAX_TTL_HOURS = 24 * 30


@dataclass(frozen=True)
class IssuedBootstrapToken:
    record: BootstrapToken
    token: str  # the only time the plaintext exists outside the caller's hands


def issue_bootstrap_token(
    *, brand_id: str, ttl_hours: int = DEFAULT_TTL_HOURS, now: datetime | None = None
) -> IssuedBootstrapToken:
    """:raise NotFound: unknown brand. :raise ValidationFailed: a TTL outside 1..720 hours."""
    get_brand(brand_id)
    if not 1 <= ttl_hours <= MAX_TTL_HOURS:
        raise ValidationFailed(
            "Invalid TTL", {"ttlHours": [f"Must be between 1 and {MAX_TTL_HOURS} hours."]}
        )
    now = now or utcnow()
    token = credentials.generate_secret(credentials.BOOTSTRAP_TOKEN_PREFIX)
    record = BootstrapToken(
        brand_id=brand_id,
        token_hash=credentials.hash_secret(token),
        created_at=now,
        expires_at=now + timedelta(hours=ttl_hours),
    )
    db.session.add(record)
    db.session.flush()
    return IssuedBootstrapToken(record=record, token=token)


def revoke_bootstrap_tokens(*, brand_id: str, now: datetime | None = None) -> int:
    """Revoke the brand's still-valid tokens; returns how many were revoked.

    :raise NotFound: unknown brand.
    """
    get_brand(brand_id)
    now = now or utcnow()
    result = db.session.execute(
        update(BootstrapToken)
        .where(
            BootstrapToken.brand_id == brand_id,
            BootstrapToken.revoked_at.is_(None),
            BootstrapToken.expires_at > now,
        )
        .values(revoked_at=now)
    )
    # Session.execute is typed for any statement; an UPDATE's result is a CursorResult.
    return cast(CursorResult, result).rowcount or 0


def find_valid_bootstrap_token(token: str, now: datetime) -> BootstrapToken | None:
    """The unexpired, unrevoked token record for this plaintext, or None."""
    if not credentials.is_well_formed(token, credentials.BOOTSTRAP_TOKEN_PREFIX):
        return None
    record = db.session.scalar(
        select(BootstrapToken).where(BootstrapToken.token_hash == credentials.hash_secret(token))
    )
    if record is None or not credentials.hash_matches(record.token_hash, token):
        return None
    return record if record.is_valid_at(now) else None
