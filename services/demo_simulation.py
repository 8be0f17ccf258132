"""`flask demo simulate`: the demo workspace moves one step forward, as the platform would move
it, through the same platform changes (`services.platform`), so that developers watch real
events arrive at their endpoints."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select

from extensions import db
from models import Brand, Campaign, Deal, Placement, TrackedLink, WebhookEvent
from models.campaign import ACTIVE
from models.columns import utcnow
from models.deal import ACCEPTED, DISPUTED, IN_PROGRESS, OFFERED
from services.demo import DEMO_BRAND_NAME, post_url, record_sales
from services.errors import NotFound
from services.platform.deals import accept_deal, complete_deal, offer_deal, resolve_dispute
from services.platform.placements import (
    submit_placement,
    update_placement_metrics,
    verify_placement,
)
from services.platform.tracked_links import record_link_clicks


@dataclass(frozen=True)
class SimulatedStep:
    brand_id: str
    description: str
    # (event id, event name) of every event the step published, in order.
    events: list[tuple[str, str]]


def simulate_step(*, brand_id: str | None = None, now: datetime | None = None) -> SimulatedStep:
    """Move the demo workspace one step forward, as the platform would, and report the events
    that published. The first step that applies wins, in this order: complete a deal whose
    placements are all verified, verify a submitted placement, accept an offer, resolve a
    dispute, submit a placement a deal still lacks, measure a placement's clicks, and at last
    offer a new creator a deal on an active campaign (accepted at once).

    :raise NotFound: no demo brand (or no brand with `brand_id`).
    """
    brand = _demo_brand(brand_id)
    now = now or utcnow()
    rng = random.Random()  # noqa: S311 - demo clicks, not a secret
    description = "Nothing left to move: every campaign has ended"
    for step in _STEPS:
        moved = step(brand.id, now, rng)
        if moved:
            description = moved
            break
    db.session.flush()
    events = db.session.execute(
        select(WebhookEvent.id, WebhookEvent.name)
        .where(WebhookEvent.brand_id == brand.id, WebhookEvent.created_at >= now)
        .order_by(WebhookEvent.id)
    ).all()
    return SimulatedStep(
        brand_id=brand.id, description=description, events=[(row.id, row.name) for row in events]
    )


def _demo_brand(brand_id: str | None) -> Brand:
    statement = select(Brand)
    if brand_id is not None:
        statement = statement.where(Brand.id == brand_id)
    else:
        statement = statement.where(Brand.name == DEMO_BRAND_NAME).order_by(
            Brand.created_at.desc(), Brand.id.desc()
        )
    brand = db.session.scalars(statement.limit(1)).first()
    if brand is None:
        raise NotFound(
            f"No brand with id {brand_id!r}"
            if brand_id
            else "No demo brand yet: run `flask --app app demo seed` first"
        )
    return brand


def _oldest_deal(brand_id: str, *conditions) -> Deal | None:
    return db.session.scalars(
        select(Deal)
        .join(Campaign, Campaign.id == Deal.campaign_id)
        .where(Deal.brand_id == brand_id, *conditions)
        .order_by(Deal.created_at, Deal.id)
        .limit(1)
    ).first()


def _first_placement(brand_id: str, *conditions, order_by) -> Placement | None:
    return db.session.scalars(
        select(Placement)
        .join(Deal, Deal.id == Placement.deal_id)
        .where(Deal.brand_id == brand_id, *conditions)
        .order_by(order_by, Placement.id)
        .limit(1)
    ).first()


def _complete_finished_deal(brand_id: str, now: datetime, rng) -> str | None:
    deal = _oldest_deal(
        brand_id,
        Deal.status == IN_PROGRESS,
        Deal.verified_placements >= Deal.placements_required,
    )
    if deal is None:
        return None
    complete_deal(deal.id, now=now)
    return f"{deal.creator_handle}'s deal {deal.id} completed; escrow released"


def _verify_placement(brand_id: str, now: datetime, rng) -> str | None:
    placement = _first_placement(
        brand_id,
        Deal.status == IN_PROGRESS,
        Placement.verified_at.is_(None),
        order_by=Placement.created_at,
    )
    if placement is None:
        return None
    verify_placement(placement.id, now=now)
    update_placement_metrics(placement.id, clicks=rng.randint(200, 2500), now=now)
    return f"Placement {placement.id} ({placement.post_url}) verified"


def _accept_offer(brand_id: str, now: datetime, rng) -> str | None:
    deal = _oldest_deal(brand_id, Deal.status == OFFERED, Campaign.status == ACTIVE)
    if deal is None:
        return None
    accept_deal(deal.id, now=now)
    return f"{deal.creator_handle} accepted deal {deal.id}; escrow held"


def _resolve_dispute(brand_id: str, now: datetime, rng) -> str | None:
    deal = _oldest_deal(brand_id, Deal.status == DISPUTED)
    if deal is None:
        return None
    resolve_dispute(deal.id, outcome="split", now=now)
    return f"The dispute on {deal.creator_handle}'s deal {deal.id} was settled half and half"


def _submit_missing_placement(brand_id: str, now: datetime, rng) -> str | None:
    submitted = (
        select(func.count()).where(Placement.deal_id == Deal.id).correlate(Deal).scalar_subquery()
    )
    deal = _oldest_deal(
        brand_id, Deal.status.in_((ACCEPTED, IN_PROGRESS)), submitted < Deal.placements_required
    )
    if deal is None:
        return None
    handle = deal.creator_handle.strip("@").split(".")[0]
    placement = submit_placement(
        deal_id=deal.id,
        platform="instagram",
        post_url=post_url("instagram", handle, 1, rng),
        now=now,
    )
    return f"{deal.creator_handle} posted {placement.post_url}; it awaits verification"


def _measure_clicks(brand_id: str, now: datetime, rng) -> str | None:
    placement = _first_placement(
        brand_id, Placement.verified_at.is_not(None), order_by=Placement.metrics_updated_at
    )
    if placement is None:
        return None
    added = rng.randint(20, 400)
    update_placement_metrics(placement.id, clicks=placement.clicks + added, now=now)
    link = db.session.execute(
        select(TrackedLink.id, TrackedLink.brand_id, TrackedLink.code, TrackedLink.currency)
        .where(TrackedLink.deal_id == placement.deal_id)
        .limit(1)
    ).first()
    if link is None:
        return f"Placement {placement.id} drew {added} more clicks"
    record_link_clicks(link.id, clicks=added, now=now)
    record_sales(
        brand_id=link.brand_id,
        link_code=link.code,
        currency=link.currency,
        sales=1,
        now=now,
        rng=rng,
    )
    return f"Placement {placement.id} drew {added} more clicks and a sale on {link.code}"


_NEW_CREATORS = ("@ife.skincare", "@jollof.and.joy", "@ada.in.abuja", "@emeka.grooms")


def _offer_new_deal(brand_id: str, now: datetime, rng) -> str | None:
    campaign = db.session.scalars(
        select(Campaign)
        .where(Campaign.brand_id == brand_id, Campaign.status == ACTIVE)
        .order_by(Campaign.created_at, Campaign.id)
        .limit(1)
    ).first()
    if campaign is None:
        return None
    amount = max(campaign.budget_minor // 10, 1)
    deal = offer_deal(
        campaign_id=campaign.id,
        creator_handle=rng.choice(_NEW_CREATORS),
        agreed_amount_minor=amount,
        now=now,
    )
    accept_deal(deal.id, now=now)
    return f"{deal.creator_handle} was offered and accepted a deal on {campaign.name}"


_STEPS = (
    _complete_finished_deal,
    _verify_placement,
    _accept_offer,
    _resolve_dispute,
    _submit_missing_placement,
    _measure_clicks,
    _offer_new_deal,
)
