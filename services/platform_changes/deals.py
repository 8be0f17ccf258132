"""Deal changes: an offer and its answer, the work, and how the deal ends.

Every status change announces `deal.status_changed`, after the event of its own when SPEC
section 6 has one (`deal.accepted`, `deal.completed`, ...); each event's data is the deal as
fetchDeal shows it, plus `previousStatus`.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from extensions import db
from models import Campaign, Deal
from models.campaign import ACTIVE, PAUSED
from models.columns import new_id, utcnow
from models.deal import (
    ACCEPTED,
    CANCELLED,
    COMPLETED,
    CREATOR_HANDLE_MAX_LENGTH,
    DECLINED,
    DISPUTE_OUTCOMES,
    DISPUTED,
    EXPIRED,
    IN_PROGRESS,
    OFFERED,
)
from schemas.events import event_data
from services.errors import Conflict, ValidationFailed
from services.events import publish_event
from services.platform_changes.changed_records import announce, lock_deal, locked
from services.platform_changes.escrow import hold_escrow, settle_deal_escrow

# The statuses a deal may move to, from which.
_ALLOWED_FROM = {
    ACCEPTED: (OFFERED,),
    DECLINED: (OFFERED,),
    EXPIRED: (OFFERED,),
    IN_PROGRESS: (ACCEPTED,),
    DISPUTED: (ACCEPTED, IN_PROGRESS),
    COMPLETED: (IN_PROGRESS, DISPUTED),
    CANCELLED: (OFFERED, ACCEPTED, IN_PROGRESS, DISPUTED),
}
_OWN_EVENT = {
    ACCEPTED: "deal.accepted",
    DECLINED: "deal.declined",
    EXPIRED: "deal.expired",
    COMPLETED: "deal.completed",
    CANCELLED: "deal.cancelled",
    DISPUTED: "deal.disputed",
}


def offer_deal(
    *,
    campaign_id: str,
    creator_handle: str,
    agreed_amount_minor: int,
    placements_required: int = 1,
    now: datetime | None = None,
) -> Deal:
    """The brand offers a creator a deal on an active or paused campaign (no event: SPEC
    section 6 announces the answer, not the offer).

    :raise ValidationFailed: a field out of range.
    :raise Conflict: the campaign is not open.
    """
    now = now or utcnow()
    campaign = locked(Campaign, campaign_id)
    if campaign.status not in (ACTIVE, PAUSED):
        raise Conflict(f"Campaign {campaign.id} is {campaign.status}; it takes no offers")
    errors: dict[str, list[str]] = {}
    creator_handle = creator_handle.strip()
    if not creator_handle or len(creator_handle) > CREATOR_HANDLE_MAX_LENGTH:
        errors["creatorHandle"] = [f"Must be 1-{CREATOR_HANDLE_MAX_LENGTH} characters."]
    if agreed_amount_minor <= 0:
        errors["agreedAmountMinor"] = ["Must be positive."]
    if placements_required < 1:
        errors["placementsRequired"] = ["Must be at least 1."]
    if errors:
        raise ValidationFailed("Invalid deal", errors)
    deal = Deal(
        id=new_id("deal", at=now),
        brand_id=campaign.brand_id,
        campaign_id=campaign.id,
        creator_handle=creator_handle,
        status=OFFERED,
        agreed_amount_minor=agreed_amount_minor,
        currency=campaign.currency,
        placements_required=placements_required,
        escrow_held_minor=0,
        escrow_released_minor=0,
        escrow_refunded_minor=0,
        verified_placements=0,
        amount_due_minor=0,
        created_at=now,
        updated_at=now,
    )
    db.session.add(deal)
    db.session.flush()
    return deal


def accept_deal(deal_id: str, *, now: datetime | None = None) -> Deal:
    """The creator accepts: escrow is held for the agreed amount (`escrow.held`), then
    `deal.accepted`, which shows the deal funded."""
    now = now or utcnow()
    _, deal = lock_deal(deal_id)
    previous = _set_status(deal, ACCEPTED, now)
    deal.accepted_at = now
    hold_escrow(deal.id, now=now)
    _announce_status(deal, previous, now)
    return deal


def decline_deal(deal_id: str, *, now: datetime | None = None) -> Deal:
    return _simple_move(deal_id, DECLINED, now or utcnow())


def expire_deal(deal_id: str, *, now: datetime | None = None) -> Deal:
    return _simple_move(deal_id, EXPIRED, now or utcnow())


def start_deal(deal_id: str, *, now: datetime | None = None) -> Deal:
    """Work begins (the first placement is submitted): only `deal.status_changed`."""
    return _simple_move(deal_id, IN_PROGRESS, now or utcnow())


def dispute_deal(deal_id: str, *, now: datetime | None = None) -> Deal:
    return _simple_move(deal_id, DISPUTED, now or utcnow())


def complete_deal(deal_id: str, *, now: datetime | None = None) -> Deal:
    """The work is done: escrow releases what the settlement says is due and refunds the rest,
    then `deal.completed`.

    :raise Conflict: not in progress, or no placement is verified yet.
    """
    now = now or utcnow()
    campaign, deal = lock_deal(deal_id)
    if deal.status == IN_PROGRESS and deal.verified_placements == 0:
        raise Conflict(f"Deal {deal.id} has no verified placement to settle")
    previous = _set_status(deal, COMPLETED, now)
    deal.completed_at = now
    settle_deal_escrow(campaign, deal, release_minor=deal.amount_due_minor, now=now)
    _announce_status(deal, previous, now)
    return deal


def cancel_deal(deal_id: str, *, now: datetime | None = None) -> Deal:
    """Called off: its held escrow is refunded, then `deal.cancelled`."""
    now = now or utcnow()
    campaign, deal = lock_deal(deal_id)
    _cancel(campaign, deal, now)
    return deal


def resolve_dispute(deal_id: str, *, outcome: str, now: datetime | None = None) -> Deal:
    """A disputed deal is decided: for the `creator` (escrow released, deal completed), the
    `brand` (refunded, cancelled) or `split` (half each, completed). `dispute.resolved`, then
    the escrow and deal events.

    :raise ValidationFailed: an unknown outcome.
    :raise Conflict: the deal is not disputed.
    """
    if outcome not in DISPUTE_OUTCOMES:
        raise ValidationFailed(
            "Invalid outcome", {"outcome": [f"Must be one of: {', '.join(DISPUTE_OUTCOMES)}."]}
        )
    now = now or utcnow()
    campaign, deal = lock_deal(deal_id)
    if deal.status != DISPUTED:
        raise Conflict(f"Deal {deal.id} is {deal.status}, not disputed")
    held = deal.escrow_held_minor
    release = {"creator": held, "brand": 0, "split": held // 2}[outcome]
    # A dispute is not a record of this service: its event is all it leaves.
    resolution = {
        "deal_id": deal.id,
        "campaign_id": deal.campaign_id,
        "outcome": outcome,
        "released_minor": release,
        "refunded_minor": held - release,
        "currency": deal.currency,
        "resolved_at": now,
    }
    publish_event(
        brand_id=deal.brand_id,
        name="dispute.resolved",
        data=event_data("dispute.resolved", resolution),
        now=now,
    )
    if outcome == "brand":
        _cancel(campaign, deal, now)
        return deal
    previous = _set_status(deal, COMPLETED, now)
    deal.completed_at = now
    settle_deal_escrow(campaign, deal, release_minor=release, now=now)
    _announce_status(deal, previous, now)
    return deal


def expire_open_offers(campaign: Campaign, *, now: datetime) -> None:
    """A campaign ends: its unanswered offers expire. The caller holds the campaign's lock."""
    for deal in _deals_of(campaign.id, (OFFERED,)):
        previous = _set_status(deal, EXPIRED, now)
        _announce_status(deal, previous, now)


def cancel_open_deals(campaign: Campaign, *, now: datetime) -> None:
    """A campaign is cancelled: so is every deal not yet ended. The caller holds its lock."""
    for deal in _deals_of(campaign.id, (OFFERED, ACCEPTED, IN_PROGRESS, DISPUTED)):
        _cancel(campaign, deal, now)


def _cancel(campaign: Campaign, deal: Deal, now: datetime) -> None:
    previous = _set_status(deal, CANCELLED, now)
    settle_deal_escrow(campaign, deal, release_minor=0, now=now)
    _announce_status(deal, previous, now)


def _simple_move(deal_id: str, to: str, now: datetime) -> Deal:
    _, deal = lock_deal(deal_id)
    previous = _set_status(deal, to, now)
    _announce_status(deal, previous, now)
    return deal


def _set_status(deal: Deal, to: str, now: datetime) -> str:
    """Change the status if the move is allowed; the status it had.

    :raise Conflict: a move the deal's lifecycle does not have.
    """
    previous = deal.status
    if previous not in _ALLOWED_FROM[to]:
        raise Conflict(f"Deal {deal.id} is {previous}; it cannot become {to}")
    deal.status = to
    deal.updated_at = now
    return previous


def _announce_status(deal: Deal, previous: str, now: datetime) -> None:
    own = _OWN_EVENT.get(deal.status)
    for name in (own, "deal.status_changed") if own else ("deal.status_changed",):
        announce(brand_id=deal.brand_id, name=name, record=deal, now=now, previous_status=previous)


def _deals_of(campaign_id: str, statuses: tuple[str, ...]) -> list[Deal]:
    return list(
        db.session.scalars(
            select(Deal)
            .where(Deal.campaign_id == campaign_id, Deal.status.in_(statuses))
            .order_by(Deal.created_at, Deal.id)
            .with_for_update()
        )
    )
