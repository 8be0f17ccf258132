"""A dashboard session (CONTRACT 11.3): kept on the server, so that signing out, revoking its key
or its expiry ends it for every copy of its cookie, and the secrets it is to show once."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import ForeignKey, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, utcnow


class DashboardSession(Model):
    __tablename__ = "dashboard_sessions"

    # SHA-256 of the token the cookie carries: a copy of the table opens no session.
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    brand_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("brands.id", ondelete="CASCADE")
    )
    key_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("api_keys.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)


class OneTimeSecret(Model):
    """A key or signing secret a POST made, for the page after its redirect, taken once."""

    __tablename__ = "dashboard_one_time_secrets"

    session_hash: Mapped[str] = mapped_column(
        String(64),
        ForeignKey("dashboard_sessions.token_hash", ondelete="CASCADE"),
        primary_key=True,
    )
    kind: Mapped[str] = mapped_column(String(100), primary_key=True)
    # The answer holding the secret, encrypted with ENCRYPTION_KEY as signing secrets are.
    sealed: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
