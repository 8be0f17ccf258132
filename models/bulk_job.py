"""A change to a brand's deliveries that grows with its data (ending a closed endpoint's pending
deliveries, retry-now, catching up after an outage, releasing holds, erasing a subject),
recorded by the request or the round that decided it and carried out by the workers in bounded
batches (services/delivery/bulk.py)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Identity, Index, Integer, String, text
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type

# What a job does (services/delivery/bulk.py has one batch function for each).
END_PENDING = "end_pending"
RETRY_NOW = "retry_now"
CATCH_UP = "catch_up"
RELEASE_HELD = "release_held"
# CONTRACT 13.3: a brand's subject (`subject_key`) erased, newest event first.
ERASE_SUBJECT = "erase_subject"
BULK_JOB_KINDS = (END_PENDING, RETRY_NOW, CATCH_UP, RELEASE_HELD, ERASE_SUBJECT)


class BulkJob(Model):
    __tablename__ = "webhook_bulk_jobs"
    __table_args__ = (
        # One open job of a kind per endpoint: asking again joins the one under way.
        Index(
            "ix_webhook_bulk_jobs_open",
            "kind",
            "endpoint_id",
            unique=True,
            postgresql_where=text("finished_at IS NULL AND endpoint_id IS NOT NULL"),
        ),
        # The runners' turns: the open job whose last batch is oldest goes next.
        Index(
            "ix_webhook_bulk_jobs_turn",
            "last_run_at",
            "id",
            postgresql_where=text("finished_at IS NULL"),
        ),
        Index(
            "ix_webhook_bulk_jobs_finished",
            "finished_at",
            postgresql_where=text("finished_at IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    kind: Mapped[str] = mapped_column(String(20))
    # No foreign key: a claim asks for jobs, and must not wait for a brand's row. A job of a
    # deleted brand finds nothing to do and ends.
    brand_id: Mapped[str] = mapped_column(id_column_type())
    endpoint_id: Mapped[str | None] = mapped_column(id_column_type(), nullable=True)
    subject_key: Mapped[str | None] = mapped_column(String(80), nullable=True)
    # What the job writes where it needs words (the last error of the deliveries it ends).
    note: Mapped[str | None] = mapped_column(String(500), nullable=True)
    # Where a job that walks rows in order got to (erase_subject: the sequence of the next
    # event to erase, walking down).
    position: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The job concerns what was there at this time (deliveries created, or waiting, before it).
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Rows changed so far: the job's progress, shown while it runs.
    done: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    def __repr__(self) -> str:
        return f"<BulkJob {self.id} {self.kind} {self.endpoint_id} done={self.done}>"
