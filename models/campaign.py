"""A campaign: the brand's budget and terms for work with creators, and how much of it is spent."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow
from models.money import currency_code, minor_units

DRAFT = "draft"
ACTIVE = "active"
PAUSED = "paused"
COMPLETED = "completed"
CANCELLED = "cancelled"
CAMPAIGN_STATUSES = (DRAFT, ACTIVE, PAUSED, COMPLETED, CANCELLED)

# How creators are paid (settlement uses verified placements and this model, SPEC section 1):
# a fixed fee per deal, earned as its placements are verified, or a rate per click on verified
# placements, capped at the deal's agreed amount.
FIXED_FEE = "fixed_fee"
PER_CLICK = "per_click"
PRICING_MODELS = (FIXED_FEE, PER_CLICK)

NAME_MAX_LENGTH = 200
# The shares of its budget whose crossing by spend announces `campaign.budget_threshold`.
BUDGET_THRESHOLDS = (50, 80, 100)


class Campaign(Model):
    __tablename__ = "campaigns"
    __table_args__ = (
        # fetch-campaigns, newest first, alone or by status.
        Index("ix_campaigns_brand_created", "brand_id", "created_at", "id"),
        Index("ix_campaigns_brand_status", "brand_id", "status", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(
        id_column_type(), primary_key=True, default=lambda: new_id("cmp")
    )
    brand_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("brands.id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(NAME_MAX_LENGTH))
    status: Mapped[str] = mapped_column(String(20))
    pricing_model: Mapped[str] = mapped_column(String(20))
    # PER_CLICK only: what one click on a verified placement earns the creator.
    click_rate_minor: Mapped[int | None] = mapped_column(minor_units(), nullable=True)
    currency: Mapped[str] = mapped_column(currency_code())
    budget_minor: Mapped[int] = mapped_column(minor_units())
    # Released from escrow to creators: money that has left the brand.
    spent_minor: Mapped[int] = mapped_column(minor_units(), default=0)
    # Held in escrow for accepted deals, not yet released or refunded.
    committed_minor: Mapped[int] = mapped_column(minor_units(), default=0)
    starts_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ends_at: Mapped[datetime] = mapped_column(UTCDateTime())
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    @property
    def remaining_minor(self) -> int:
        return self.budget_minor - self.spent_minor - self.committed_minor

    def __repr__(self) -> str:
        return f"<Campaign {self.id} {self.name!r} {self.status}>"
