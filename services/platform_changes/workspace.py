"""Workspace changes the platform reports: KYB verification finishing."""

from __future__ import annotations

from datetime import datetime

from models import Brand
from models.columns import utcnow
from schemas.base import iso_timestamp
from services.errors import ValidationFailed
from services.events import publish_event
from services.platform_changes.changed_records import locked

KYB_OUTCOMES = ("verified", "rejected")


def complete_kyb_verification(
    brand_id: str, *, kyb_status: str, now: datetime | None = None
) -> Brand:
    """KYB verification finished: the brand's status and `verification.completed`."""
    if kyb_status not in KYB_OUTCOMES:
        raise ValidationFailed(
            "Invalid KYB outcome", {"kybStatus": [f"Must be one of: {', '.join(KYB_OUTCOMES)}."]}
        )
    now = now or utcnow()
    brand = locked(Brand, brand_id)
    brand.kyb_status = kyb_status
    publish_event(
        brand_id=brand.id,
        name="verification.completed",
        data={"brandId": brand.id, "kybStatus": kyb_status, "completedAt": iso_timestamp(now)},
        now=now,
    )
    return brand
