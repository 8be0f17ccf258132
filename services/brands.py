"""Brand workspaces: created by support, read by everything else."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select

from extensions import db
from models import ApiKey, Brand
from models.brand import BRAND_NAME_MAX_LENGTH, PLANS
from models.columns import utcnow
from services.errors import NotFound, ValidationFailed

SUBSCRIPTION_PERIOD = timedelta(days=30)


def create_brand(*, name: str, plan: str = "starter", now: datetime | None = None) -> Brand:
    """Create a workspace whose KYB is pending and whose first period starts now.

    :raise ValidationFailed: an empty or over-long name, or an unknown plan.
    """
    name = name.strip()
    errors = {}
    if not name or len(name) > BRAND_NAME_MAX_LENGTH:
        errors["name"] = [f"Must be between 1 and {BRAND_NAME_MAX_LENGTH} characters."]
    if plan not in PLANS:
        errors["plan"] = [f"Must be one of: {', '.join(PLANS)}."]
    if errors:
        raise ValidationFailed("Invalid brand", errors)
    start = now or utcnow()
    brand = Brand(
        name=name,
        plan=plan,
        kyb_status="pending",
        subscription_period_start=start,
        subscription_period_end=start + SUBSCRIPTION_PERIOD,
        created_at=start,
    )
    db.session.add(brand)
    db.session.flush()
    return brand


def get_brand(brand_id: str) -> Brand:
    """:raise NotFound: no brand has that id."""
    brand = db.session.get(Brand, brand_id)
    if brand is None:
        raise NotFound(f"No brand with id {brand_id!r}")
    return brand


def list_brands_with_key_counts() -> list[tuple[Brand, int]]:
    """Every brand, oldest first, with how many active API keys it has."""
    active_keys = (
        select(ApiKey.brand_id, func.count().label("active_keys"))
        .where(ApiKey.revoked_at.is_(None))
        .group_by(ApiKey.brand_id)
        .subquery()
    )
    rows = db.session.execute(
        select(Brand, func.coalesce(active_keys.c.active_keys, 0))
        .outerjoin(active_keys, active_keys.c.brand_id == Brand.id)
        .order_by(Brand.created_at, Brand.id)
    )
    return [(brand, count) for brand, count in rows]


def brand_count() -> int:
    return db.session.scalar(select(func.count()).select_from(Brand)) or 0
