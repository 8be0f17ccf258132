"""A conversion: an outcome (a purchase, a lead, a signup) a brand's partner reported through a
postback, attributed to one of the brand's tracked links when its code matched."""

from __future__ import annotations

import re
from datetime import datetime

from sqlalchemy import JSON, Boolean, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow
from models.money import currency_code, minor_units

IDEMPOTENCY_KEY_MIN_LENGTH = 16
IDEMPOTENCY_KEY_MAX_LENGTH = 128
# SPEC 4, recordPostback rule 1.
IDEMPOTENCY_KEY_PATTERN = re.compile(
    rf"^[A-Za-z0-9_:-]{{{IDEMPOTENCY_KEY_MIN_LENGTH},{IDEMPOTENCY_KEY_MAX_LENGTH}}}$"
)
EVENT_TYPE_MAX_LENGTH = 100
CLICK_ID_MAX_LENGTH = 255
# Longer than any tracked link's code: an unknown code is stored as sent (SPEC 2, rule 3).
LINK_CODE_MAX_LENGTH = 100


class Conversion(Model):
    __tablename__ = "conversions"
    __table_args__ = (
        # The idempotency rule itself: one conversion per key per brand, for as long as the
        # conversion exists (CONTRACT 5: a replay never expires).
        Index("ux_conversions_brand_idempotency_key", "brand_id", "idempotency_key", unique=True),
        # fetch-postbacks in creation order (either direction): alone and by each filter.
        Index("ix_conversions_brand_created", "brand_id", "created_at", "id"),
        Index("ix_conversions_brand_event_type", "brand_id", "event_type", "created_at", "id"),
        Index("ix_conversions_brand_link_code", "brand_id", "link_code", "created_at", "id"),
        Index("ix_conversions_brand_attributed", "brand_id", "attributed", "created_at", "id"),
        Index("ix_conversions_campaign_created", "campaign_id", "created_at", "id"),
        Index("ix_conversions_deal_created", "deal_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(
        id_column_type(), primary_key=True, default=lambda: new_id("conv")
    )
    brand_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("brands.id", ondelete="CASCADE")
    )
    idempotency_key: Mapped[str] = mapped_column(String(IDEMPOTENCY_KEY_MAX_LENGTH))
    event_type: Mapped[str] = mapped_column(String(EVENT_TYPE_MAX_LENGTH))
    click_id: Mapped[str | None] = mapped_column(String(CLICK_ID_MAX_LENGTH), nullable=True)
    link_code: Mapped[str | None] = mapped_column(String(LINK_CODE_MAX_LENGTH), nullable=True)
    # Set only when `link_code` is one of the brand's links (SPEC 2, rule 1). The campaign and
    # deal are the link's, copied so that filters need no join; they carry no foreign keys of
    # their own because the link's already ties them, and a key-share lock on campaign and deal
    # rows would make every postback wait behind platform changes that lock those rows.
    link_id: Mapped[str | None] = mapped_column(
        id_column_type(), ForeignKey("tracked_links.id", ondelete="SET NULL"), nullable=True
    )
    campaign_id: Mapped[str | None] = mapped_column(id_column_type(), nullable=True)
    deal_id: Mapped[str | None] = mapped_column(id_column_type(), nullable=True)
    value_minor: Mapped[int] = mapped_column(minor_units(), default=0)
    currency: Mapped[str] = mapped_column(currency_code())
    # `metadata` is taken by SQLAlchemy's declarative base; the column keeps the API's name.
    details: Mapped[dict] = mapped_column("metadata", JSON, default=dict)
    # SPEC 2, rule 2: a link code or a click id was present (known or not).
    attributed: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    def __repr__(self) -> str:
        return f"<Conversion {self.id} {self.event_type} {self.value_minor} {self.currency}>"
