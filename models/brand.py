"""A brand workspace: the tenant every other record belongs to."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow

PLANS = ("starter", "growth", "enterprise")
KYB_STATUSES = ("not_started", "pending", "verified", "rejected")
# How a KYB verification can finish (`verification.completed`).
KYB_OUTCOMES = ("verified", "rejected")
BRAND_NAME_MAX_LENGTH = 100


class Brand(Model):
    __tablename__ = "brands"

    id: Mapped[str] = mapped_column(
        id_column_type(), primary_key=True, default=lambda: new_id("brd")
    )
    name: Mapped[str] = mapped_column(String(BRAND_NAME_MAX_LENGTH))
    plan: Mapped[str] = mapped_column(String(20))
    kyb_status: Mapped[str] = mapped_column(String(20))
    subscription_period_start: Mapped[datetime] = mapped_column(UTCDateTime())
    subscription_period_end: Mapped[datetime] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    def __repr__(self) -> str:
        return f"<Brand {self.id} {self.name!r}>"
