"""Locking the platform records a change is about, and announcing the change."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Protocol, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Mapped

from extensions import db
from models import Campaign, Deal
from schemas.events import event_data
from services.errors import NotFound
from services.events import PublishedEvent, publish_event


# What these functions need of a model class: its `id` column, as an SQL expression.
class _Record(Protocol):
    id: ClassVar[Mapped[str]]


Record = TypeVar("Record", bound=_Record)


def locked(model: type[Record], record_id: str) -> Record:
    """The record, locked for the rest of the transaction and freshly read.

    :raise NotFound: no such record.
    """
    record = db.session.scalar(
        select(model)
        .where(model.id == record_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )
    if record is None:
        raise NotFound(f"No {model.__name__} with id {record_id!r}")
    return record


def peek(model: type[Record], record_id: str) -> Record:
    """The record, unlocked: to learn which rows to lock, in the package's order.

    :raise NotFound: no such record.
    """
    record = db.session.get(model, record_id)
    if record is None:
        raise NotFound(f"No {model.__name__} with id {record_id!r}")
    return record


def lock_deal(deal_id: str) -> tuple[Campaign, Deal]:
    """The deal and its campaign, locked in the package's order (campaign first).

    :raise NotFound: no such deal.
    """
    campaign = locked(Campaign, peek(Deal, deal_id).campaign_id)
    return campaign, locked(Deal, deal_id)


def announce(
    *, brand_id: str, name: str, record: object, now: datetime, **changes: object
) -> PublishedEvent:
    """Publish `name` about `record` (its read-API shape), plus what changed
    (`previous_status=...`): the event's schema (`schemas.events`) writes its data."""
    data = event_data(name, record, **changes)
    return publish_event(brand_id=brand_id, name=name, data=data, now=now)
