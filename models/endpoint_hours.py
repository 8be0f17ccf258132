"""An endpoint's attempts counted by the hour, kept by the database as attempts are written.

The 24-hour health that fetch-endpoints shows for every endpoint (`successRate24h`,
`lastSuccessAt`: CONTRACT 8.4) counted the window's attempts on each call: a read that grows
with the brand's traffic (86,000 attempts a day took 25 ms of counting, whether from the table
or from an index alone: bench/delivery_log.py). These rows hold the same counts per endpoint
and hour, so the window is 23 rows per endpoint plus the attempts of its two partial hours
(services/endpoint_stats.py).

A statement trigger on `webhook_attempts` keeps them (migrations/versions/0015): every insert,
whoever makes it, adds its attempts to their hours in the same transaction, so the counts
cannot drift from the attempts. Each session counts into rows of its own (`writer`), so two
workers recording one endpoint's attempts in the same hour never wait for each other's commit;
a reader sums an endpoint's rows. Retention deletes hours older than two days.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Index, Integer
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type

# Longer than any window read from them (24 hours), and its partial hours.
HOURS_KEPT = timedelta(days=2)


class EndpointHour(Model):
    __tablename__ = "webhook_endpoint_hours"
    __table_args__ = (
        # Retention: the hours that are too old to be in any window.
        Index("ix_webhook_endpoint_hours_hour", "hour"),
    )

    # No foreign key, as for webhook_attempts.endpoint_id: a record never waits for an
    # endpoint's row. Retention deletes the hours of an endpoint deleted with its brand.
    endpoint_id: Mapped[str] = mapped_column(id_column_type(), primary_key=True)
    # The hour's start, on UTC's hours.
    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    # The writing session's backend pid (migrations/versions/0020): one row per session and hour.
    writer: Mapped[int] = mapped_column(Integer, primary_key=True, default=0)
    attempts: Mapped[int] = mapped_column(Integer)
    succeeded: Mapped[int] = mapped_column(Integer)
    last_success_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_failure_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    def __repr__(self) -> str:
        return f"<EndpointHour {self.endpoint_id} {self.hour} {self.succeeded}/{self.attempts}>"
