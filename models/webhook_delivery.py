"""A delivery of one event to one endpoint, and the attempts made to deliver it."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, and_, text
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow

PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"
DELIVERY_STATUSES = (PENDING, DELIVERED, FAILED)
ERROR_MAX_LENGTH = 500
RESPONSE_BODY_MAX_BYTES = 2048

_PENDING_ONLY = text("status = 'pending'")


class WebhookDelivery(Model):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        # The delivery log (fetch-deliveries): a brand's rows newest (or oldest) first, alone or
        # filtered by status, event or endpoint; each filter has an index in the sort order.
        Index("ix_webhook_deliveries_brand_created", "brand_id", "created_at", "id"),
        Index("ix_webhook_deliveries_brand_status", "brand_id", "status", "created_at", "id"),
        Index("ix_webhook_deliveries_brand_event", "brand_id", "event_name", "created_at", "id"),
        Index(
            "ix_webhook_deliveries_brand_endpoint",
            "brand_id",
            "endpoint_id",
            "created_at",
            "id",
        ),
        # An event's deliveries: retention deletes an event only once none refers to it, and
        # the foreign key's own check on that delete reads this index too.
        Index("ix_webhook_deliveries_event", "event_id"),
        # Work to do: an endpoint's due deliveries (claims, disabling) and all due ones (sweeps).
        # Partial, so they stay small however many delivered rows the log keeps.
        Index(
            "ix_webhook_deliveries_endpoint_due_order",
            "endpoint_id",
            "next_attempt_at",
            "id",
            postgresql_where=_PENDING_ONLY,
        ),
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=_PENDING_ONLY,
        ),
        # Attempts in flight: an endpoint's leased deliveries, counted at every claim to hold
        # the per-endpoint limit across workers. Whatever their status: a delivery failed by a
        # disable while its attempt is on the wire still holds its slot until recorded.
        Index(
            "ix_webhook_deliveries_endpoint_leased",
            "endpoint_id",
            "leased_until",
            postgresql_where=text("lease_token IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(
        id_column_type(), primary_key=True, default=lambda: new_id("whd")
    )
    brand_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("brands.id", ondelete="CASCADE")
    )
    endpoint_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("webhook_endpoints.id", ondelete="CASCADE")
    )
    # No cascade: deleting an event a delivery still refers to fails rather than taking the
    # delivery with it (services/retention.py).
    event_id: Mapped[str] = mapped_column(id_column_type(), ForeignKey("webhook_events.id"))
    event_name: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(10), default=PENDING)
    http_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(String(ERROR_MAX_LENGTH), nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # When the next attempt is due; null once the delivery is settled.
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # A worker's claim, taken as its attempt starts and extended while it runs: no other worker
    # attempts the delivery until the lease lapses, which it does within seconds of that worker
    # dying. The result is written only under the token that took it.
    leased_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    lease_token: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # The newer delivery of the same event to the same endpoint (redeliver, recover): a failure
    # is recovered once.
    redelivered_as: Mapped[str | None] = mapped_column(id_column_type(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    @property
    def next_retry_at(self) -> datetime | None:
        """SPEC's `nextRetryAt`: when a retry after a failed attempt is due."""
        return self.next_attempt_at if self.is_retrying else None

    @hybrid_property
    def is_retrying(self) -> bool:
        """Still `pending` after a failed attempt: its endpoint is failing and it waits for a
        retry (for up to the whole retry schedule, about 27 hours by default) before it is
        `failed`. The API keeps SPEC's status; this says what the status hides. Also usable in
        queries."""
        return self.status == PENDING and self.attempt_count > 0

    @is_retrying.inplace.expression
    @classmethod
    def _is_retrying_expression(cls):
        return and_(cls.status == PENDING, cls.attempt_count > 0)

    def __repr__(self) -> str:
        return f"<WebhookDelivery {self.id} {self.event_name} {self.status}>"


class WebhookAttempt(Model):
    __tablename__ = "webhook_attempts"
    __table_args__ = (
        # An endpoint's attempts of the last 24 hours (its health, CONTRACT 8.4).
        Index("ix_webhook_attempts_endpoint_requested", "endpoint_id", "requested_at"),
    )

    delivery_id: Mapped[str] = mapped_column(
        id_column_type(),
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"),
        primary_key=True,
    )
    attempt_number: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    # The delivery's endpoint, kept on each attempt for the health figures' index.
    endpoint_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("webhook_endpoints.id", ondelete="CASCADE")
    )
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime())
    duration_ms: Mapped[int] = mapped_column(Integer)
    http_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(String(ERROR_MAX_LENGTH), nullable=True)
    response_body: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Exactly the headers sent (the signature is an HMAC, not the secret).
    request_headers: Mapped[dict] = mapped_column(JSON)

    @hybrid_property
    def failed(self) -> bool:
        """Every failed attempt records why (a 2xx within the timeout records no error)."""
        return self.error is not None

    @failed.inplace.expression
    @classmethod
    def _failed_expression(cls):
        return cls.error.is_not(None)

    def __repr__(self) -> str:
        return f"<WebhookAttempt {self.delivery_id}#{self.attempt_number}>"
