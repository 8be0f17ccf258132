"""A tracked link: the short URL a creator shares, and the clicks and conversions it brought."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from extensions import db
from models.columns import UTCDateTime, id_column_type, new_id, utcnow
from models.money import currency_code, minor_units

CODE_MAX_LENGTH = 32
URL_MAX_LENGTH = 2048


class TrackedLink(db.Model):
    __tablename__ = "tracked_links"
    __table_args__ = (
        # Codes are global (they are the path of a short URL on one domain); a postback's
        # lookup by (brand, code) and the `code` filter use this index.
        Index("ux_tracked_links_code", "code", unique=True),
        # fetch-links newest first: alone, by campaign, by deal.
        Index("ix_tracked_links_brand_created", "brand_id", "created_at", "id"),
        Index("ix_tracked_links_campaign_created", "campaign_id", "created_at", "id"),
        Index("ix_tracked_links_deal_created", "deal_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(
        id_column_type(), primary_key=True, default=lambda: new_id("lnk")
    )
    brand_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("brands.id", ondelete="CASCADE")
    )
    campaign_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("campaigns.id", ondelete="CASCADE")
    )
    # A campaign-wide link has no deal.
    deal_id: Mapped[str | None] = mapped_column(
        id_column_type(), ForeignKey("deals.id", ondelete="CASCADE"), nullable=True
    )
    code: Mapped[str] = mapped_column(String(CODE_MAX_LENGTH))
    short_url: Mapped[str] = mapped_column(String(200))
    destination_url: Mapped[str] = mapped_column(String(URL_MAX_LENGTH))
    clicks: Mapped[int] = mapped_column(BigInteger, default=0)
    conversions: Mapped[int] = mapped_column(BigInteger, default=0)
    # The sum of attributed conversions' values in the link's currency (its campaign's).
    conversion_value_minor: Mapped[int] = mapped_column(minor_units(), default=0)
    currency: Mapped[str] = mapped_column(currency_code())
    last_clicked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    def __repr__(self) -> str:
        return f"<TrackedLink {self.id} {self.code}>"
