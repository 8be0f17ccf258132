"""An event: something that happened to a brand, stored with the exact body every delivery of it
sends (the outbox row of `services.events.publish_event`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow

# Filled by the database on every insert (a postback's single statement too), never by Python:
# the publishing transaction's id and the event's place among that transaction's events, the
# order the events API lists a brand's events in (services/event_feed.py).
PUBLISHING_TRANSACTION = "CAST(CAST(pg_current_xact_id() AS TEXT) AS BIGINT)"
POSITION_SEQUENCE = "webhook_events_position_seq"
SUBJECT_TYPE_MAX_LENGTH = 16
SUBJECT_ID_MAX_LENGTH = 64
# A W3C `traceparent` of version 00: `00-` + 32 hex + `-` + 16 hex + `-` + 2 hex.
TRACEPARENT_LENGTH = 55
# CONTRACT 13.2: where an event went: sent, or why not. The publisher stores the last two
# (`passed_over`); services/event_routing.py derives the others.
SENT = "sent"
NOT_SUBSCRIBED = "not_subscribed"
FILTERED = "filtered"
DISABLED = "disabled"
ROUTING_OUTCOMES = (SENT, NOT_SUBSCRIBED, FILTERED, DISABLED)


class WebhookEvent(Model):
    __tablename__ = "webhook_events"
    __table_args__ = (
        Index("ix_webhook_events_brand_id_created_at", "brand_id", "created_at"),
        # The events API: one event type of a brand in publish order (migration 0013).
        Index("ix_webhook_events_feed", "brand_id", "name", "xact_id", "position"),
        # A subject's events in order (fetch-events' `subject`, the dashboard's event page,
        # and the sequence a publisher gives an event of a subject with no counter yet).
        Index("ix_webhook_events_subject", "brand_id", "subject_type", "subject_id", "sequence"),
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
    # CONTRACT 12.2: the record whose life this event is a step of, and which step (1, 2, ...,
    # per brand and subject, without gaps, in publish order).
    subject_type: Mapped[str] = mapped_column(String(SUBJECT_TYPE_MAX_LENGTH))
    subject_id: Mapped[str] = mapped_column(String(SUBJECT_ID_MAX_LENGTH))
    sequence: Mapped[int] = mapped_column(Integer)
    # The campaign the subject belongs to, if any: endpoints' campaign filters (CONTRACT 12.3).
    campaign_id: Mapped[str | None] = mapped_column(id_column_type(), nullable=True)
    # CONTRACT 13.6: the trace context of the API request that published it, which each of its
    # delivery attempts joins (null: none, or published outside a request).
    traceparent: Mapped[str | None] = mapped_column(String(TRACEPARENT_LENGTH), nullable=True)
    # CONTRACT 13.2: the endpoints subscribed to the event that the publisher passed over, and
    # why (`{endpoint id: FILTERED | DISABLED}`); null when it passed over none. Only what
    # cannot be read back later: services/event_routing.py derives the rest.
    passed_over: Mapped[dict[str, str] | None] = mapped_column(JSONB, nullable=True)
    # CONTRACT 13.3: when its data was erased (the body keeps its envelope, `data` null).
    erased_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    @hybrid_property
    def is_erased(self) -> bool:
        """Its data was erased: it is never delivered again. Also usable in queries."""
        return self.erased_at is not None

    @is_erased.inplace.expression
    @classmethod
    def _is_erased_expression(cls):
        return cls.erased_at.is_not(None)

    @property
    def subject_key(self) -> str:
        """`type:id`, as fetch-events' `subject` takes it."""
        return f"{self.subject_type}:{self.subject_id}"

    def __repr__(self) -> str:
        return f"<WebhookEvent {self.id} {self.name}>"


class EventSubject(Model):
    """The last sequence number given to an event of a subject of a brand: publishers of the
    same subject take turns on this row (it is locked until the publishing transaction ends),
    so numbers are gapless and in commit order. Kept when the events age out."""

    __tablename__ = "webhook_event_subjects"

    brand_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("brands.id", ondelete="CASCADE"), primary_key=True
    )
    subject_type: Mapped[str] = mapped_column(String(SUBJECT_TYPE_MAX_LENGTH), primary_key=True)
    subject_id: Mapped[str] = mapped_column(String(SUBJECT_ID_MAX_LENGTH), primary_key=True)
    last_sequence: Mapped[int] = mapped_column(Integer)
