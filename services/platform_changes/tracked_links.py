"""Tracked link changes: the platform creates a link for a campaign (or one deal of it) and
counts its clicks. Neither is announced (SPEC section 6 has no link events); conversions on a
link arrive as postbacks."""

from __future__ import annotations

import re
from datetime import datetime
from typing import cast

from sqlalchemy import CursorResult, select, update

from extensions import db
from models import Campaign, Deal, TrackedLink
from models.columns import new_id, utcnow
from models.tracked_link import CODE_MAX_LENGTH
from services.errors import Conflict, NotFound, ValidationFailed
from services.platform_changes.changed_records import peek

CODE_PATTERN = re.compile(rf"^[A-Za-z0-9_-]{{3,{CODE_MAX_LENGTH}}}$")


def create_tracked_link(
    *,
    campaign_id: str,
    code: str,
    short_url: str,
    destination_url: str,
    deal_id: str | None = None,
    now: datetime | None = None,
) -> TrackedLink:
    """:raise ValidationFailed: a malformed code, or a deal of another campaign.
    :raise Conflict: the code is taken (codes are global: they are short URL paths)."""
    if not CODE_PATTERN.match(code):
        raise ValidationFailed(
            "Invalid link code",
            {"code": [f"3-{CODE_MAX_LENGTH} letters, digits, dashes or underscores."]},
        )
    campaign = peek(Campaign, campaign_id)
    if deal_id is not None and peek(Deal, deal_id).campaign_id != campaign.id:
        raise ValidationFailed("Invalid link", {"dealId": ["Not a deal of this campaign."]})
    if db.session.scalar(select(TrackedLink.id).where(TrackedLink.code == code)):
        raise Conflict(f"Link code {code!r} is taken")
    now = now or utcnow()
    link = TrackedLink(
        id=new_id("lnk", at=now),
        brand_id=campaign.brand_id,
        campaign_id=campaign.id,
        deal_id=deal_id,
        code=code,
        short_url=short_url,
        destination_url=destination_url,
        clicks=0,
        currency=campaign.currency,
        created_at=now,
    )
    db.session.add(link)
    db.session.flush()
    return link


def record_link_clicks(link_id: str, *, clicks: int, now: datetime | None = None) -> None:
    """Add `clicks` to the link's count, atomically (clicks arrive from many places at once).

    :raise NotFound: no such link.
    """
    if clicks < 1:
        raise ValidationFailed("Invalid clicks", {"clicks": ["Must be at least 1."]})
    now = now or utcnow()
    counted = db.session.execute(
        update(TrackedLink)
        .where(TrackedLink.id == link_id)
        .values(clicks=TrackedLink.clicks + clicks, last_clicked_at=now)
    )
    # Session.execute is typed for any statement; an UPDATE's result is a CursorResult.
    if cast(CursorResult, counted).rowcount == 0:
        raise NotFound(f"No TrackedLink with id {link_id!r}")
