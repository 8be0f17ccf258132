"""An event: something that happened to a brand, stored with the exact body every delivery of it
sends (the outbox row of `services.events.publish_event`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow


class WebhookEvent(Model):
    __tablename__ = "webhook_events"
    __table_args__ = (Index("ix_webhook_events_brand_id_created_at", "brand_id", "created_at"),)

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

    def __repr__(self) -> str:
        return f"<WebhookEvent {self.id} {self.name}>"
