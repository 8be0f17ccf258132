"""A deal: one creator's agreement on a campaign, with the escrow behind it and what it has
earned so far."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow
from models.money import currency_code, minor_units

OFFERED = "offered"
ACCEPTED = "accepted"
DECLINED = "declined"
EXPIRED = "expired"
IN_PROGRESS = "in_progress"
COMPLETED = "completed"
CANCELLED = "cancelled"
DISPUTED = "disputed"
DEAL_STATUSES = (OFFERED, ACCEPTED, DECLINED, EXPIRED, IN_PROGRESS, COMPLETED, CANCELLED, DISPUTED)
# No further change once a deal is in one of these.
FINAL_DEAL_STATUSES = (DECLINED, EXPIRED, COMPLETED, CANCELLED)

CREATOR_HANDLE_MAX_LENGTH = 100
# Who a resolved dispute went to (`dispute.resolved`): escrow released, refunded, or half each.
DISPUTE_OUTCOMES = ("creator", "brand", "split")


@dataclass(frozen=True)
class EscrowSnapshot:
    """What this deal's escrow holds amount to, by status."""

    held_minor: int
    released_minor: int
    refunded_minor: int
    currency: str


@dataclass(frozen=True)
class Settlement:
    """What the creator has earned (verified placements priced by the campaign's model) and
    what has been paid."""

    verified_placements: int
    placements_required: int
    amount_due_minor: int
    amount_settled_minor: int
    outstanding_minor: int
    currency: str


class Deal(Model):
    __tablename__ = "deals"
    __table_args__ = (
        # fetch-deals newest first: alone, by status, by campaign.
        Index("ix_deals_brand_created", "brand_id", "created_at", "id"),
        Index("ix_deals_brand_status", "brand_id", "status", "created_at", "id"),
        Index("ix_deals_campaign_created", "campaign_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(
        id_column_type(), primary_key=True, default=lambda: new_id("deal")
    )
    brand_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("brands.id", ondelete="CASCADE")
    )
    campaign_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("campaigns.id", ondelete="CASCADE")
    )
    creator_handle: Mapped[str] = mapped_column(String(CREATOR_HANDLE_MAX_LENGTH))
    status: Mapped[str] = mapped_column(String(20))
    agreed_amount_minor: Mapped[int] = mapped_column(minor_units())
    # Always the campaign's currency.
    currency: Mapped[str] = mapped_column(currency_code())
    placements_required: Mapped[int] = mapped_column(Integer, default=1)
    # The escrow snapshot: sums of this deal's holds by status, kept with every hold change.
    escrow_held_minor: Mapped[int] = mapped_column(minor_units(), default=0)
    escrow_released_minor: Mapped[int] = mapped_column(minor_units(), default=0)
    escrow_refunded_minor: Mapped[int] = mapped_column(minor_units(), default=0)
    # The settlement summary, kept with every placement verification and metrics update.
    verified_placements: Mapped[int] = mapped_column(Integer, default=0)
    amount_due_minor: Mapped[int] = mapped_column(minor_units(), default=0)
    accepted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    @property
    def escrow(self) -> EscrowSnapshot:
        return EscrowSnapshot(
            held_minor=self.escrow_held_minor,
            released_minor=self.escrow_released_minor,
            refunded_minor=self.escrow_refunded_minor,
            currency=self.currency,
        )

    @property
    def settlement(self) -> Settlement:
        # Settled means paid to the creator, which is exactly what escrow has released.
        settled = self.escrow_released_minor
        return Settlement(
            verified_placements=self.verified_placements,
            placements_required=self.placements_required,
            amount_due_minor=self.amount_due_minor,
            amount_settled_minor=settled,
            outstanding_minor=max(self.amount_due_minor - settled, 0),
            currency=self.currency,
        )

    def __repr__(self) -> str:
        return f"<Deal {self.id} {self.creator_handle!r} {self.status}>"
