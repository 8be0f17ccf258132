"""An event: something that happened to a brand, stored with the exact body every delivery of it
sends (the outbox row of `services.events.publish_event`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow

# Filled by the database on every insert (a postback's single statement too), never by Python:
# the publishing transaction's id and the event's place among that transaction's events, the
# order the events API lists a brand's events in (services/event_feed.py).
PUBLISHING_TRANSACTION = "CAST(CAST(pg_current_xact_id() AS TEXT) AS BIGINT)"
POSITION_SEQUENCE = "webhook_events_position_seq"


class WebhookEvent(Model):
    __tablename__ = "webhook_events"
    __table_args__ = (
        Index("ix_webhook_events_brand_id_created_at", "brand_id", "created_at"),
        # The events API: one event type of a brand in publish order (migration 0013).
        Index("ix_webhook_events_feed", "brand_id", "name", "xact_id", "position"),
    )

    id: Mapped[str] = mapped_column(
        id_column_type(), primary_key=True, default=lambda: new_id("evt")
    )
    brand_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("brands.id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(64))
    # Serialized once: every attempt and every redelivery signs and sends these same bytes.
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    xact_id: Mapped[int] = mapped_column(BigInteger, server_default=text(PUBLISHING_TRANSACTION))
    position: Mapped[int] = mapped_column(
        BigInteger, server_default=text(f"nextval('{POSITION_SEQUENCE}')")
    )

    def __repr__(self) -> str:
        return f"<WebhookEvent {self.id} {self.name}>"
