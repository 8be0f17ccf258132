"""Erasure by subject (CONTRACT 13.3): a creator asks the brand to erase their data, and every
copy this service holds of it goes: the `data` of each event of the subject (a deal, a
campaign, a conversion...) and the receivers' answers to its deliveries. Ids, types, subjects,
sequences, times, statuses and headers stay, so the log still adds up (docs/webhooks.md).

The request counts the events and asks for an `erase_subject` job (services/delivery/bulk.py),
running its first batch itself: a subject's newest events, where its pending deliveries are, are
erased before the answer; the rest goes in bounded batches on the workers. An erased event is
never delivered again (services/events.py `deliver_again`)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from extensions import db
from models import WebhookEvent
from models.bulk_job import ERASE_SUBJECT
from models.event_subjects import subject_key
from services.delivery.bulk import request_job
from services.errors import NotFound


@dataclass(frozen=True)
class SubjectRef:
    type: str
    id: str


@dataclass(frozen=True)
class ErasureRequested:
    subject: SubjectRef
    # The brand's events of the subject (all of them are erased, the first batch already).
    events: int


def erase_subject(*, brand_id: str, subject: tuple[str, str]) -> ErasureRequested:
    """Erase the brand's events of `subject` (type, id) as they stand now; asking again erases
    again (what is erased already stays so, and events published since are erased too).

    :raise NotFound: the brand has no event of that subject."""
    subject_type, subject_id = subject
    # One range of ix_webhook_events_subject (brand, subject type, subject id, sequence).
    count, newest = db.session.execute(
        select(func.count(), func.max(WebhookEvent.sequence)).where(
            WebhookEvent.brand_id == brand_id,
            WebhookEvent.subject_type == subject_type,
            WebhookEvent.subject_id == subject_id,
        )
    ).one()
    if not count:
        raise NotFound(f"No event of {subject_key(subject_type, subject_id)} in this brand")
    request_job(
        kind=ERASE_SUBJECT,
        brand_id=brand_id,
        subject_key=subject_key(subject_type, subject_id),
        position=newest,
        first_batch=True,
    )
    return ErasureRequested(subject=SubjectRef(type=subject_type, id=subject_id), events=count)
