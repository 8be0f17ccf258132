"""Campaign changes: created, published, paused, resumed, completed, cancelled. (Spend, and
`campaign.budget_threshold`, move with escrow releases: services/platform_changes/escrow.py.)"""

from __future__ import annotations

from datetime import datetime

from extensions import db
from models import Campaign
from models.campaign import (
    ACTIVE,
    CANCELLED,
    COMPLETED,
    DRAFT,
    NAME_MAX_LENGTH,
    PAUSED,
    PER_CLICK,
    PRICING_MODELS,
)
from models.columns import new_id, utcnow
from models.money import CURRENCIES
from services.brands import get_brand
from services.errors import Conflict, ValidationFailed
from services.platform_changes.changed_records import announce, locked
from services.platform_changes.deals import cancel_open_deals, expire_open_offers


def create_campaign(
    *,
    brand_id: str,
    name: str,
    pricing_model: str,
    currency: str,
    budget_minor: int,
    starts_at: datetime,
    ends_at: datetime,
    click_rate_minor: int | None = None,
    now: datetime | None = None,
) -> Campaign:
    """A draft campaign (no event: nothing is public until it is published).

    :raise ValidationFailed: a field out of range.
    :raise NotFound: no such brand.
    """
    get_brand(brand_id)
    errors: dict[str, list[str]] = {}
    name = name.strip()
    if not name or len(name) > NAME_MAX_LENGTH:
        errors["name"] = [f"Must be between 1 and {NAME_MAX_LENGTH} characters."]
    if pricing_model not in PRICING_MODELS:
        errors["pricingModel"] = [f"Must be one of: {', '.join(PRICING_MODELS)}."]
    if currency not in CURRENCIES:
        errors["currency"] = [f"Must be one of: {', '.join(CURRENCIES)}."]
    if budget_minor <= 0:
        errors["budgetMinor"] = ["Must be positive."]
    if ends_at <= starts_at:
        errors["endsAt"] = ["Must be after startsAt."]
    if (pricing_model == PER_CLICK) != (click_rate_minor is not None):
        errors["clickRateMinor"] = ["Required for per_click campaigns, and only for them."]
    elif click_rate_minor is not None and click_rate_minor <= 0:
        errors["clickRateMinor"] = ["Must be positive."]
    if errors:
        raise ValidationFailed("Invalid campaign", errors)
    now = now or utcnow()
    campaign = Campaign(
        id=new_id("cmp", at=now),
        brand_id=brand_id,
        name=name,
        status=DRAFT,
        pricing_model=pricing_model,
        click_rate_minor=click_rate_minor,
        currency=currency,
        budget_minor=budget_minor,
        spent_minor=0,
        committed_minor=0,
        starts_at=starts_at,
        ends_at=ends_at,
        created_at=now,
        updated_at=now,
    )
    db.session.add(campaign)
    db.session.flush()
    return campaign


def publish_campaign(campaign_id: str, *, now: datetime | None = None) -> Campaign:
    """Draft to active: `campaign.published`."""
    now = now or utcnow()
    campaign, _ = _move(campaign_id, ACTIVE, allowed_from=(DRAFT,), now=now)
    campaign.published_at = now
    announce(brand_id=campaign.brand_id, name="campaign.published", record=campaign, now=now)
    return campaign


def pause_campaign(campaign_id: str, *, now: datetime | None = None) -> Campaign:
    """Active to paused; no event (SPEC section 6 names none)."""
    return _move(campaign_id, PAUSED, allowed_from=(ACTIVE,), now=now or utcnow())[0]


def resume_campaign(campaign_id: str, *, now: datetime | None = None) -> Campaign:
    """Paused to active; no event."""
    return _move(campaign_id, ACTIVE, allowed_from=(PAUSED,), now=now or utcnow())[0]


def complete_campaign(campaign_id: str, *, now: datetime | None = None) -> Campaign:
    """Active or paused to completed: `campaign.completed`. Offers still unanswered expire
    first (each announces `deal.expired`)."""
    now = now or utcnow()
    campaign, _ = _move(campaign_id, COMPLETED, allowed_from=(ACTIVE, PAUSED), now=now)
    campaign.completed_at = now
    expire_open_offers(campaign, now=now)
    announce(brand_id=campaign.brand_id, name="campaign.completed", record=campaign, now=now)
    return campaign


def cancel_campaign(campaign_id: str, *, now: datetime | None = None) -> Campaign:
    """Draft, active or paused to cancelled: its open deals are cancelled first (their escrow
    refunded), then `campaign.cancelled`."""
    now = now or utcnow()
    campaign, previous = _move(
        campaign_id, CANCELLED, allowed_from=(DRAFT, ACTIVE, PAUSED), now=now
    )
    campaign.cancelled_at = now
    cancel_open_deals(campaign, now=now)
    announce(
        brand_id=campaign.brand_id,
        name="campaign.cancelled",
        record=campaign,
        now=now,
        previous_status=previous,
    )
    return campaign


def _move(
    campaign_id: str, to: str, *, allowed_from: tuple[str, ...], now: datetime
) -> tuple[Campaign, str]:
    """Lock the campaign and change its status; it and the status it had.

    :raise Conflict: not in one of `allowed_from`.
    """
    campaign = locked(Campaign, campaign_id)
    previous = campaign.status
    if previous not in allowed_from:
        raise Conflict(f"Campaign {campaign.id} is {previous}; it cannot become {to}")
    campaign.status = to
    campaign.updated_at = now
    return campaign, previous
