"""Placement changes: a creator reports a live post, the platform verifies it, and its clicks
are measured. Verification and clicks move the deal's settlement (what the creator has
earned), which is kept here, in one place."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlsplit

from sqlalchemy import func, select

from extensions import db
from models import Campaign, Deal, Placement
from models.campaign import FIXED_FEE
from models.columns import new_id, utcnow
from models.deal import ACCEPTED, DISPUTED, IN_PROGRESS
from models.placement import PLATFORMS, POST_URL_MAX_LENGTH
from services.errors import Conflict, ValidationFailed
from services.platform_changes.changed_records import announce, lock_deal, locked, peek
from services.platform_changes.deals import start_deal

# A deal's settlement moves with its placements only while the work is open; once completed
# or cancelled it is what was paid, and later clicks are statistics.
SETTLING = (IN_PROGRESS, DISPUTED)


def submit_placement(
    *, deal_id: str, platform: str, post_url: str, now: datetime | None = None
) -> Placement:
    """A creator reports a live post for an accepted or running deal: `placement.submitted`
    (an accepted deal starts first: `deal.status_changed` to `in_progress`).

    :raise ValidationFailed: unknown platform, or a post URL that is not an http(s) URL.
    :raise Conflict: the deal is not accepted or in progress.
    """
    now = now or utcnow()
    errors: dict[str, list[str]] = {}
    if platform not in PLATFORMS:
        errors["platform"] = [f"Must be one of: {', '.join(PLATFORMS)}."]
    parts = urlsplit(post_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        errors["postUrl"] = ["Must be an http(s) URL."]
    elif len(post_url) > POST_URL_MAX_LENGTH:
        errors["postUrl"] = [f"At most {POST_URL_MAX_LENGTH} characters."]
    if errors:
        raise ValidationFailed("Invalid placement", errors)
    deal = peek(Deal, deal_id)
    if deal.status == ACCEPTED:
        start_deal(deal.id, now=now)
    _, deal = lock_deal(deal_id)
    if deal.status != IN_PROGRESS:
        raise Conflict(f"Deal {deal.id} is {deal.status}; it takes no placements")
    placement = Placement(
        id=new_id("plc", at=now),
        campaign_id=deal.campaign_id,
        deal_id=deal.id,
        platform=platform,
        post_url=post_url,
        clicks=0,
        created_at=now,
    )
    db.session.add(placement)
    db.session.flush()
    announce(brand_id=deal.brand_id, name="placement.submitted", record=placement, now=now)
    return placement


def verify_placement(placement_id: str, *, now: datetime | None = None) -> Placement:
    """The post is live and conforms: `placement.verified`; it now counts for settlement.

    :raise Conflict: already verified.
    """
    now = now or utcnow()
    campaign, deal, placement = _lock(placement_id)
    if placement.verified_at is not None:
        raise Conflict(f"Placement {placement.id} is already verified")
    if deal.status not in SETTLING:
        raise Conflict(f"Deal {deal.id} is {deal.status}; its placements no longer count")
    placement.verified_at = now
    _update_settlement(campaign, deal, now)
    announce(brand_id=campaign.brand_id, name="placement.verified", record=placement, now=now)
    return placement


def update_placement_metrics(
    placement_id: str, *, clicks: int, now: datetime | None = None
) -> Placement:
    """A new click count for a post: `placement.metrics_updated` with `previousClicks`; the
    deal's settlement follows while the deal is open.

    :raise ValidationFailed: a negative count.
    """
    if clicks < 0:
        raise ValidationFailed("Invalid metrics", {"clicks": ["Must not be negative."]})
    now = now or utcnow()
    campaign, deal, placement = _lock(placement_id)
    previous = placement.clicks
    placement.clicks = clicks
    placement.metrics_updated_at = now
    if placement.verified_at is not None and deal.status in SETTLING:
        _update_settlement(campaign, deal, now)
    announce(
        brand_id=campaign.brand_id,
        name="placement.metrics_updated",
        record=placement,
        now=now,
        previous_clicks=previous,
    )
    return placement


def _lock(placement_id: str) -> tuple[Campaign, Deal, Placement]:
    campaign, deal = lock_deal(peek(Placement, placement_id).deal_id)
    return campaign, deal, locked(Placement, placement_id)


def _update_settlement(campaign: Campaign, deal: Deal, now: datetime) -> None:
    """What the deal has earned: under `fixed_fee` the agreed amount in proportion to the
    required placements verified; under `per_click` the verified posts' clicks at the
    campaign's rate, capped at the agreed amount."""
    db.session.flush()
    verified, clicks = db.session.execute(
        select(func.count(), func.coalesce(func.sum(Placement.clicks), 0)).where(
            Placement.deal_id == deal.id, Placement.verified_at.is_not(None)
        )
    ).one()
    deal.verified_placements = verified
    if campaign.pricing_model == FIXED_FEE:
        counted = min(verified, deal.placements_required)
        due = deal.agreed_amount_minor * counted // deal.placements_required
    else:
        due = min(deal.agreed_amount_minor, clicks * (campaign.click_rate_minor or 0))
    deal.amount_due_minor = due
    deal.updated_at = now
