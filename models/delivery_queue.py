"""The work the delivery loop reads: each pending delivery is in exactly one of two small tables,
waiting for its next attempt (`webhook_delivery_queue`) or on the wire (`webhook_delivery_leases`).
The delivery itself (models/webhook_delivery.py) is the record a brand reads; these tables hold
only what the loop needs to choose and lease the next attempts, so that the claim reads rows
of pending work only, and the record's updates stay off every index.

A claim moves a row from the queue to the leases; the attempt's record deletes the lease and,
when the delivery waits for a retry, puts it back in the queue (services/delivery/queue.py).
Neither table has foreign keys: every write to them goes with a write to the delivery in the
same statement, and a key check per row would cost every postback.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Index, Integer, String, text
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type

SUBJECT_KEY_MAX_LENGTH = 80

_ORDERED = text("subject_key IS NOT NULL")


class QueuedDelivery(Model):
    """A pending delivery waiting for its next attempt."""

    __tablename__ = "webhook_delivery_queue"
    __table_args__ = (
        # A claim walks the endpoints with queued work and takes each one's oldest due rows;
        # the held ones (null) sort last.
        Index("ix_webhook_delivery_queue_endpoint_due", "endpoint_id", "next_attempt_at"),
        # What waits behind a delivery: released when it stops being pending (a trigger).
        Index(
            "ix_webhook_delivery_queue_held_behind",
            "held_behind",
            postgresql_where=text("held_behind IS NOT NULL"),
        ),
        # Ordering by subject (CONTRACT 12.2): is an earlier delivery of the subject pending?
        Index(
            "ix_webhook_delivery_queue_subject",
            "endpoint_id",
            "subject_key",
            "sequence",
            postgresql_where=_ORDERED,
        ),
    )

    delivery_id: Mapped[str] = mapped_column(id_column_type(), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(id_column_type())
    # When it may be attempted; null while it is held behind an earlier delivery of its subject
    # to an endpoint that orders them (released when that one ends).
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # CONTRACT 13.1: the pending delivery it is held behind (null unless held).
    held_behind: Mapped[str | None] = mapped_column(id_column_type(), nullable=True)
    # Attempts made so far (the next is this plus one).
    attempt_count: Mapped[int] = mapped_column(Integer)
    # A receiver's Retry-After: no attempt before this, even when the endpoint recovers.
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Set only for an endpoint with `ordering: "subject"`: "type:id" of the event's subject and
    # the event's place in that subject's life.
    subject_key: Mapped[str | None] = mapped_column(String(SUBJECT_KEY_MAX_LENGTH), nullable=True)
    sequence: Mapped[int | None] = mapped_column(Integer, nullable=True)

    def __repr__(self) -> str:
        return f"<QueuedDelivery {self.delivery_id} {self.next_attempt_at}>"


class DeliveryLease(Model):
    """An attempt on the wire: its worker's token, until when no other worker may take it, and
    what the queue row held (to put it back after a failure, or re-lease it after a lapse)."""

    __tablename__ = "webhook_delivery_leases"
    __table_args__ = (
        # An endpoint's attempts in flight, across all workers (its limit).
        Index("ix_webhook_delivery_leases_endpoint", "endpoint_id", "leased_until"),
        # Leases whose worker died or could not record in time, whoever they belong to.
        Index("ix_webhook_delivery_leases_leased_until", "leased_until"),
    )

    delivery_id: Mapped[str] = mapped_column(id_column_type(), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(id_column_type())
    token: Mapped[str] = mapped_column(String(32))
    leased_until: Mapped[datetime] = mapped_column(UTCDateTime())
    attempt_count: Mapped[int] = mapped_column(Integer)
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    subject_key: Mapped[str | None] = mapped_column(String(SUBJECT_KEY_MAX_LENGTH), nullable=True)
    sequence: Mapped[int | None] = mapped_column(Integer, nullable=True)

    def __repr__(self) -> str:
        return f"<DeliveryLease {self.delivery_id} until {self.leased_until}>"


class DeliveryLoopHeartbeat(Model):
    """Each running delivery loop and when its last round ended (written at most once a second):
    `GET /metrics` shows every loop's age, so a stalled worker, on any machine, is one alert. A
    loop that stops cleanly removes its row; one killed leaves it to age (and go after an hour)."""

    __tablename__ = "webhook_delivery_loops"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_round_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # The oldest due time the loop's last walk round the queue saw still waiting (null: none).
    oldest_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    def __repr__(self) -> str:
        return f"<DeliveryLoopHeartbeat {self.hostname}:{self.pid} {self.last_round_at}>"
