"""A tracked link: the short URL a creator shares, and the clicks and conversions it brought."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, SmallInteger, String, func, select
from sqlalchemy.orm import Mapped, column_property, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow
from models.money import currency_code, minor_units

CODE_MAX_LENGTH = 32
# How many slots a link's conversion counters may spread over: more than the connections that
# write at once in any one deployment (two gunicorn workers pool up to 20 each).
CONVERSION_COUNT_SLOTS = 64
URL_MAX_LENGTH = 2048


class TrackedLink(Model):
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
    # `conversions` and `conversion_value_minor` are read from the link's
    # TrackedLinkConversionCount rows (below).
    currency: Mapped[str] = mapped_column(currency_code())
    last_clicked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    def __repr__(self) -> str:
        return f"<TrackedLink {self.id} {self.code}>"


class TrackedLinkConversionCount(Model):
    """One slot of a link's conversion counters; the link's counters are the sum of its slots.

    Every postback on a link raises its counters in the postback's own transaction. On one row,
    concurrent postbacks of a popular link would queue on its lock until each commits; spread
    over slots (a database connection keeps to one, services/postbacks.py), they do not. A slot
    row exists once a postback has counted in it.
    """

    __tablename__ = "tracked_link_conversion_counts"

    link_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("tracked_links.id", ondelete="CASCADE"), primary_key=True
    )
    slot: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    conversions: Mapped[int] = mapped_column(BigInteger)
    # The sum of the counted conversions' values in the link's currency (its campaign's).
    conversion_value_minor: Mapped[int] = mapped_column(minor_units())


def _sum_of_slots(column):
    return (
        select(func.coalesce(func.sum(column), 0))
        .where(TrackedLinkConversionCount.link_id == TrackedLink.id)
        .correlate_except(TrackedLinkConversionCount)
        .scalar_subquery()
    )


# Loaded with every link: a page of links reads each link's few slot rows by primary key.
TrackedLink.conversions = column_property(_sum_of_slots(TrackedLinkConversionCount.conversions))
TrackedLink.conversion_value_minor = column_property(
    _sum_of_slots(TrackedLinkConversionCount.conversion_value_minor)
)
