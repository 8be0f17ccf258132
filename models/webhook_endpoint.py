"""A webhook endpoint: a receiver URL of the brand's, the events it subscribes to, and the
encrypted secret its deliveries are signed with."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    Boolean,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    and_,
    false,
    text,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import ID_LENGTH, UTCDateTime, id_column_type, new_id, utcnow

URL_MAX_LENGTH = 2048
DESCRIPTION_MAX_LENGTH = 200
DISABLED_REASON_MAX_LENGTH = 200
# A rotation's overlap: the previous secret signs beside the new one for at most a week.
MAX_OVERLAP_SECONDS = 604800
# CONTRACT 12.2: how an endpoint's deliveries are ordered.
NO_ORDERING = "none"
SUBJECT_ORDERING = "subject"
ORDERINGS = (NO_ORDERING, SUBJECT_ORDERING)
# CONTRACT 12.3: at most this many campaigns in an endpoint's filter.
MAX_CAMPAIGN_FILTER = 100
# CONTRACT 13.5: an endpoint's own limit of attempts in flight.
MAX_IN_FLIGHT_RANGE = (1, 50)


class WebhookEndpoint(Model):
    __tablename__ = "webhook_endpoints"
    __table_args__ = (
        # fetch-endpoints and fan-out read a brand's endpoints that were not deleted.
        Index("ix_webhook_endpoints_brand_id_deleted_at", "brand_id", "deleted_at"),
        # The sweep that forgets previous secrets reads only the endpoints that have one.
        Index(
            "ix_webhook_endpoints_previous_secret",
            "previous_secret_expires_at",
            postgresql_where=text("previous_secret_expires_at IS NOT NULL"),
        ),
        # Room in each page for the new version of a row's health update (a HOT update: no
        # index changes), which a failing endpoint gets at every attempt.
        {"postgresql_with": {"fillfactor": 50}},
    )

    id: Mapped[str] = mapped_column(
        id_column_type(), primary_key=True, default=lambda: new_id("whe")
    )
    brand_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("brands.id", ondelete="CASCADE")
    )
    url: Mapped[str] = mapped_column(String(URL_MAX_LENGTH))
    # The brand's own words for it, so that two endpoints with one URL can be told apart.
    description: Mapped[str | None] = mapped_column(String(DESCRIPTION_MAX_LENGTH), nullable=True)
    # JSONB: publishing asks `events ? name` of every endpoint of the brand.
    events: Mapped[list[str]] = mapped_column(JSONB)
    # Fernet ciphertext (services/secret_box.py); the plain secret is shown once and never stored.
    secret_ciphertext: Mapped[str] = mapped_column(Text)
    # During a rotation's overlap (CONTRACT 8.2) the secret before it signs too, until then;
    # the worker's sweep destroys the ciphertext once that time has passed.
    previous_secret_ciphertext: Mapped[str | None] = mapped_column(Text, nullable=True)
    previous_secret_expires_at: Mapped[datetime | None] = mapped_column(
        UTCDateTime(), nullable=True
    )
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    # When the oldest failed attempt of the current run of consecutive failures was made: the
    # disable rule (CONTRACT 6.2) needs the run to be both long and old.
    failing_since: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # While the run of failures lasts, no attempt of it starts before this (the breaker's pause
    # between probes, the same for every worker: services/delivery/health.py).
    next_probe_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # CONTRACT 13.5: attempts in flight at once, across all workers (null: the setting
    # WEBHOOK_ENDPOINT_CONCURRENCY).
    max_in_flight: Mapped[int | None] = mapped_column(SmallInteger, nullable=True)
    # CONTRACT 13.6: every attempt carries a W3C `traceparent` (services/delivery/loop.py).
    trace_context: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # CONTRACT 12.2: "none", or "subject" (a subject's events one after another).
    ordering: Mapped[str] = mapped_column(String(10), default=NO_ORDERING, server_default="none")
    # CONTRACT 12.3: only events of these campaigns (null: every campaign's).
    campaign_ids: Mapped[list[str] | None] = mapped_column(
        postgresql.ARRAY(String(ID_LENGTH)), nullable=True
    )
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    disabled_reason: Mapped[str | None] = mapped_column(
        String(DISABLED_REASON_MAX_LENGTH), nullable=True
    )
    # Deleted endpoints stay as rows so that their deliveries remain in the log.
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    @hybrid_property
    def is_active(self) -> bool:
        """Receives deliveries: neither disabled nor deleted. Also usable in queries."""
        return self.disabled_at is None and self.deleted_at is None

    @is_active.inplace.expression
    @classmethod
    def _is_active_expression(cls):
        return endpoint_is_open(cls)

    @property
    def previous_secret_until(self) -> datetime | None:
        """Until when the secret before the current one still signs; None when it does not."""
        until = self.previous_secret_expires_at
        return until if until is not None and until > utcnow() else None

    def __repr__(self) -> str:
        return f"<WebhookEndpoint {self.id} {self.url}>"


def endpoint_is_open(columns):
    """The one rule for "this endpoint receives deliveries" (neither disabled nor deleted), on
    the model's or any alias's columns: `WebhookEndpoint.is_active` and every statement use it."""
    return and_(columns.disabled_at.is_(None), columns.deleted_at.is_(None))


def endpoint_is_open_sql(alias: str) -> str:
    """`endpoint_is_open` as SQL text, for statements written in SQL, on the table named
    `alias` in them."""
    columns = WebhookEndpoint.__table__.alias(alias).c
    return str(endpoint_is_open(columns).compile(dialect=postgresql.dialect()))
