"""An API key: the credential a brand's backend sends on every request but create-key."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from extensions import Model
from models.columns import UTCDateTime, id_column_type, new_id, utcnow

KEY_NAME_MAX_LENGTH = 100
READ = "read"
WRITE = "write"
SCOPES = (READ, WRITE)
DEFAULT_SCOPES = (READ,)


class ApiKey(Model):
    __tablename__ = "api_keys"
    __table_args__ = (
        # fetch-keys lists a brand's active keys, newest first.
        Index("ix_api_keys_brand_id_revoked_at", "brand_id", "revoked_at"),
    )

    id: Mapped[str] = mapped_column(
        id_column_type(), primary_key=True, default=lambda: new_id("key")
    )
    brand_id: Mapped[str] = mapped_column(
        id_column_type(), ForeignKey("brands.id", ondelete="CASCADE")
    )
    name: Mapped[str] = mapped_column(String(KEY_NAME_MAX_LENGTH))
    key_prefix: Mapped[str] = mapped_column(String(12))
    # SHA-256 of the secret: the secret itself is shown once and never stored.
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSON)
    # What minted the key: "bootstrap_token:<id>", "api_key:<id>" or "cli"; for audits.
    created_by: Mapped[str] = mapped_column(String(60))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def __repr__(self) -> str:
        return f"<ApiKey {self.id} {self.key_prefix}…>"
