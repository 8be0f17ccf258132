"""An escrow hold: funds the platform holds for a deal until they are released to the creator
or refunded to the brand."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow
from models.money import currency_code, minor_units

HELD = "held"
RELEASED = "released"
REFUNDED = "refunded"
HOLD_STATUSES = (HELD, RELEASED, REFUNDED)


class EscrowHold(Model):
    __tablename__ = "escrow_holds"
    __table_args__ = (
        # fetch-holds newest first: alone, by status, by campaign, by deal.
        Index("ix_escrow_holds_brand_created", "brand_id", "created_at", "id"),
        Index("ix_escrow_holds_brand_status", "brand_id", "status", "created_at", "id"),
        Index("ix_escrow_holds_campaign_created", "campaign_id", "created_at", "id"),
        Index("ix_escrow_holds_deal_created", "deal_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(
        id_column_type(), primary_key=True, default=lambda: new_id("esc")
    )
    brand_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("brands.id", ondelete="CASCADE")
    )
    campaign_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("campaigns.id", ondelete="CASCADE")
    )
    deal_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("deals.id", ondelete="CASCADE")
    )
    amount_minor: Mapped[int] = mapped_column(minor_units())
    currency: Mapped[str] = mapped_column(currency_code())
    status: Mapped[str] = mapped_column(String(20))
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    refunded_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # When the funds were held.
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    def __repr__(self) -> str:
        return f"<EscrowHold {self.id} {self.amount_minor} {self.currency} {self.status}>"
