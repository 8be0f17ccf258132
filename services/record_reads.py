"""What every read of the brand's platform records shares: ownership and order."""

from __future__ import annotations

from typing import ClassVar, Protocol, TypeVar

from sqlalchemy import Select, select
from sqlalchemy.orm import Mapped

from extensions import db
from models.paging import ASCENDING
from services.errors import NotFound


# What these functions need of a model class: its columns, as SQL expressions.
class _BrandRecord(Protocol):
    id: ClassVar[Mapped[str]]
    brand_id: ClassVar[Mapped[str]]


Record = TypeVar("Record", bound=_BrandRecord)


def newest_first(statement: Select, model) -> Select:
    # `id` breaks ties between rows created in the same millisecond, so pages never overlap.
    return statement.order_by(model.created_at.desc(), model.id.desc())


def in_creation_order(statement: Select, model, sort_order: str) -> Select:
    """Oldest first for `asc`, else newest first (the lists that take `sortOrder`)."""
    if sort_order == ASCENDING:
        return statement.order_by(model.created_at, model.id)
    return newest_first(statement, model)


def get_owned(model: type[Record], record_id: str, brand_id: str, kind: str) -> Record:
    """The brand's record with that id.

    :raise NotFound: no such record, or another brand's (the same answer, so ids of other
        brands' records cannot be probed).
    """
    record = db.session.scalar(
        select(model).where(model.id == record_id, model.brand_id == brand_id)
    )
    if record is None:
        raise NotFound(f"No {kind} with id {record_id!r} in this brand")
    return record
