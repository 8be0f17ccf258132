"""Workspace changes the platform reports: KYB verification finishing."""

from __future__ import annotations

from datetime import datetime

from models import Brand
from models.brand import KYB_OUTCOMES
from models.columns import utcnow
from schemas.events import event_data
from services.errors import ValidationFailed
from services.events import publish_event
from services.platform_changes.changed_records import locked


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
        data=event_data(
            "verification.completed",
            {"brand_id": brand.id, "kyb_status": kyb_status, "completed_at": now},
        ),
        now=now,
    )
    return brand
