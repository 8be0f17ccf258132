"""A delivery of one event to one endpoint, and the attempts made to deliver it."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, Text, and_, exists, select, text
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import Mapped, column_property, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow
from models.delivery_queue import QueuedDelivery

PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"
DELIVERY_STATUSES = (PENDING, DELIVERED, FAILED)
ERROR_MAX_LENGTH = 500
RESPONSE_BODY_MAX_BYTES = 2048
# CONTRACT 13.4: what an alert about a failing endpoint carries of the failed answer's body.
LAST_ATTEMPT_BODY_CHARS = 1024
RESPONSE_HEADERS_MAX = 32
RESPONSE_HEADER_MAX_CHARS = 256

_FAILED_ONLY = text("failed_at IS NOT NULL")
# Room left in each page for the new version of its rows' one update (`delivered`).
FILLFACTOR = 85


class WebhookDelivery(Model):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        # Only columns that never change are indexed (and `failed_at`, set once in a rare
        # case), so that the one update most deliveries get, `delivered`, is a HOT update:
        # no index is written, and the page's free space (fillfactor) takes the new version.
        # What is pending lives in webhook_delivery_queue and webhook_delivery_leases.
        #
        # The delivery log (fetch-deliveries): a brand's rows newest (or oldest) first, alone or
        # filtered by event or endpoint (an endpoint's rows are all one brand's).
        Index("ix_webhook_deliveries_brand_created", "brand_id", "created_at", "id"),
        Index("ix_webhook_deliveries_brand_event", "brand_id", "event_name", "created_at", "id"),
        Index("ix_webhook_deliveries_endpoint_created", "endpoint_id", "created_at", "id"),
        # What failed, by brand and by endpoint (status=failed, recover, the dashboard's
        # failures): few rows, so small indexes.
        Index(
            "ix_webhook_deliveries_brand_failed",
            "brand_id",
            "created_at",
            "id",
            postgresql_where=_FAILED_ONLY,
        ),
        Index(
            "ix_webhook_deliveries_endpoint_failed",
            "endpoint_id",
            "created_at",
            "id",
            postgresql_where=_FAILED_ONLY,
        ),
        # An event's deliveries: retention deletes an event only once none refers to it, and
        # the foreign key's own check on that delete reads this index too.
        Index("ix_webhook_deliveries_event", "event_id"),
        {"postgresql_with": {"fillfactor": FILLFACTOR}},
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
    # When the next attempt is due, as the log shows it; null once the delivery is settled. The
    # delivery loop reads its own copy, in webhook_delivery_queue, written by the same
    # statements.
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # When it ended `failed` (null otherwise): the one indexed column that changes, and only for
    # the few deliveries that fail.
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # The newer delivery of the same event to the same endpoint (redeliver, recover): a failure
    # is recovered once.
    redelivered_as: Mapped[str | None] = mapped_column(id_column_type(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # CONTRACT 13.1: the pending delivery this one is held behind (ordering by subject), read
    # from its queue row as the delivery is loaded; null unless held.
    held_behind: Mapped[str | None] = column_property(
        select(QueuedDelivery.held_behind)
        .where(QueuedDelivery.delivery_id == id)
        .correlate_except(QueuedDelivery)
        .scalar_subquery()
    )

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

    @hybrid_property
    def is_held(self) -> bool:
        """Pending and not attempted while an earlier delivery of its subject to its endpoint
        is pending (CONTRACT 13.1: `heldBehind` names that one). Also usable in queries, where
        the queue is read only for pending rows."""
        return self.status == PENDING and self.held_behind is not None

    @is_held.inplace.expression
    @classmethod
    def _is_held_expression(cls):
        return and_(
            cls.status == PENDING,
            exists().where(
                QueuedDelivery.delivery_id == cls.id, QueuedDelivery.held_behind.is_not(None)
            ),
        )

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
    # The delivery's endpoint, kept on each attempt for the health figures' index. No foreign
    # key: its check would lock the endpoint's row (KEY SHARE) at every record, and a session
    # holding that row would hold every brand's records (issue 41). The delivery's key keeps it
    # right, and deleting a brand removes both.
    endpoint_id: Mapped[str] = mapped_column(id_column_type())
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime())
    duration_ms: Mapped[int] = mapped_column(Integer)
    http_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(String(ERROR_MAX_LENGTH), nullable=True)
    response_body: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Exactly the headers sent (the signature is an HMAC, not the secret).
    request_headers: Mapped[dict] = mapped_column(JSON)
    # What the receiver answered with, bounded and made safe to store (workers/answers.py):
    # at most RESPONSE_HEADERS_MAX headers, each value at most RESPONSE_HEADER_MAX_CHARS.
    response_headers: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    # The address connected to (CONTRACT 12.5), and where the attempt's time went: null where
    # the attempt did not get that far or the step did not happen (no TLS over http, no
    # lookup for an address in the URL, a kept-alive connection reused).
    remote_address: Mapped[str | None] = mapped_column(String(45), nullable=True)
    dns_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    connect_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tls_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    first_byte_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)

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
