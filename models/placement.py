"""A placement: a creator's live post for a deal, and the clicks it drew.

It has no brand id (SPEC section 2): it belongs to a brand through its campaign, and every read
joins the campaign to check that.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow

PLATFORMS = ("instagram", "tiktok", "youtube", "x")
POST_URL_MAX_LENGTH = 2048


class Placement(Model):
    __tablename__ = "placements"
    __table_args__ = (
        # fetch-placements newest first: by campaign, by deal, and all of a brand's (the
        # brand's campaigns joined to this index, newest first across them).
        Index("ix_placements_campaign_created", "campaign_id", "created_at", "id"),
        Index("ix_placements_deal_created", "deal_id", "created_at", "id"),
        Index("ix_placements_created", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(
        id_column_type(), primary_key=True, default=lambda: new_id("plc")
    )
    campaign_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("campaigns.id", ondelete="CASCADE")
    )
    deal_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("deals.id", ondelete="CASCADE")
    )
    platform: Mapped[str] = mapped_column(String(20))
    post_url: Mapped[str] = mapped_column(String(POST_URL_MAX_LENGTH))
    clicks: Mapped[int] = mapped_column(BigInteger, default=0)
    verified_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    metrics_updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # When the creator reported the post live (placement.submitted).
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    def __repr__(self) -> str:
        return f"<Placement {self.id} {self.post_url}>"
