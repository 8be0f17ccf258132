"""Escrow changes: funds held for a deal, released to the creator or refunded to the brand.

Each change keeps the deal's escrow snapshot and the campaign's committed and spent amounts in
step with the holds, and announces `escrow.held`, `escrow.released` or `escrow.refunded`.
Releasing money is spending it: `campaign.budget_threshold` is announced as spend crosses 50,
80 and 100 percent of the budget.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from extensions import db
from models import Campaign, Deal, EscrowHold
from models.campaign import BUDGET_THRESHOLDS
from models.columns import new_id, utcnow
from models.deal import ACCEPTED, IN_PROGRESS
from models.escrow_hold import HELD, REFUNDED, RELEASED
from services.errors import Conflict, ValidationFailed
from services.platform_changes.changed_records import announce, lock_deal, locked, peek


def hold_escrow(
    deal_id: str, *, amount_minor: int | None = None, now: datetime | None = None
) -> EscrowHold:
    """Hold funds for an accepted or running deal (by default, what its agreed amount still
    lacks): `escrow.held`.

    :raise Conflict: the deal is not accepted or in progress, or is fully funded.
    :raise ValidationFailed: a non-positive amount.
    """
    now = now or utcnow()
    campaign, deal = lock_deal(deal_id)
    if deal.status not in (ACCEPTED, IN_PROGRESS):
        raise Conflict(f"Deal {deal.id} is {deal.status}; escrow is held for accepted deals")
    if amount_minor is None:
        amount_minor = (
            deal.agreed_amount_minor - deal.escrow_held_minor - deal.escrow_released_minor
        )
        if amount_minor <= 0:
            raise Conflict(f"Deal {deal.id} is fully funded")
    if amount_minor <= 0:
        raise ValidationFailed("Invalid hold", {"amountMinor": ["Must be positive."]})
    hold = EscrowHold(
        id=new_id("esc", at=now),
        brand_id=deal.brand_id,
        campaign_id=deal.campaign_id,
        deal_id=deal.id,
        amount_minor=amount_minor,
        currency=deal.currency,
        status=HELD,
        created_at=now,
    )
    db.session.add(hold)
    deal.escrow_held_minor += amount_minor
    deal.updated_at = now
    campaign.committed_minor += amount_minor
    campaign.updated_at = now
    db.session.flush()
    announce(brand_id=hold.brand_id, name="escrow.held", record=hold, now=now)
    return hold


def release_escrow(hold_id: str, *, now: datetime | None = None) -> EscrowHold:
    """Pay a held hold to the creator: `escrow.released`, and budget thresholds it crosses."""
    now = now or utcnow()
    campaign, deal, hold = _lock_hold(hold_id)
    _release(campaign, deal, hold, now)
    _record_spend(campaign, hold.amount_minor, now)
    return hold


def refund_escrow(hold_id: str, *, now: datetime | None = None) -> EscrowHold:
    """Return a held hold to the brand: `escrow.refunded`."""
    now = now or utcnow()
    campaign, deal, hold = _lock_hold(hold_id)
    _refund(campaign, deal, hold, now)
    return hold


def settle_deal_escrow(
    campaign: Campaign, deal: Deal, *, release_minor: int, now: datetime
) -> None:
    """Release `release_minor` of a deal's held escrow, oldest hold first, and refund the rest.
    The caller holds the campaign's and the deal's locks.

    A hold released only in part is split: the released part keeps its id and the rest becomes
    a new hold, with the same `heldAt`, that is refunded, so that every hold ends wholly
    released or wholly refunded.
    """
    to_release = max(release_minor, 0)
    released = 0
    for hold in _held_holds(deal.id):
        rest = _split(hold, keep_minor=to_release) if 0 < to_release < hold.amount_minor else None
        if to_release >= hold.amount_minor:
            to_release -= hold.amount_minor
            released += hold.amount_minor
            _release(campaign, deal, hold, now)
        else:
            _refund(campaign, deal, hold, now)
        if rest is not None:
            _refund(campaign, deal, rest, now)
    # Spend last, so that a threshold event shows the campaign as it is once settled.
    if released:
        _record_spend(campaign, released, now)


def _lock_hold(hold_id: str) -> tuple[Campaign, Deal, EscrowHold]:
    campaign, deal = lock_deal(peek(EscrowHold, hold_id).deal_id)
    hold = locked(EscrowHold, hold_id)
    if hold.status != HELD:
        raise Conflict(f"Escrow hold {hold.id} is already {hold.status}")
    return campaign, deal, hold


def _held_holds(deal_id: str) -> list[EscrowHold]:
    return list(
        db.session.scalars(
            select(EscrowHold)
            .where(EscrowHold.deal_id == deal_id, EscrowHold.status == HELD)
            .order_by(EscrowHold.created_at, EscrowHold.id)
            .with_for_update()
        )
    )


def _split(hold: EscrowHold, *, keep_minor: int) -> EscrowHold:
    rest = EscrowHold(
        id=new_id("esc", at=hold.created_at),
        brand_id=hold.brand_id,
        campaign_id=hold.campaign_id,
        deal_id=hold.deal_id,
        amount_minor=hold.amount_minor - keep_minor,
        currency=hold.currency,
        status=HELD,
        created_at=hold.created_at,
    )
    hold.amount_minor = keep_minor
    db.session.add(rest)
    db.session.flush()
    return rest


def _release(campaign: Campaign, deal: Deal, hold: EscrowHold, now: datetime) -> None:
    hold.status = RELEASED
    hold.released_at = now
    deal.escrow_held_minor -= hold.amount_minor
    deal.escrow_released_minor += hold.amount_minor
    deal.updated_at = now
    campaign.committed_minor -= hold.amount_minor
    announce(brand_id=hold.brand_id, name="escrow.released", record=hold, now=now)


def _refund(campaign: Campaign, deal: Deal, hold: EscrowHold, now: datetime) -> None:
    hold.status = REFUNDED
    hold.refunded_at = now
    deal.escrow_held_minor -= hold.amount_minor
    deal.escrow_refunded_minor += hold.amount_minor
    deal.updated_at = now
    campaign.committed_minor -= hold.amount_minor
    campaign.updated_at = now
    announce(brand_id=hold.brand_id, name="escrow.refunded", record=hold, now=now)


def _record_spend(campaign: Campaign, amount_minor: int, now: datetime) -> None:
    """Spent goes up; each budget threshold crossed is announced once, by the release that
    crosses it."""
    before = campaign.spent_minor
    campaign.spent_minor = before + amount_minor
    campaign.updated_at = now
    for percent in BUDGET_THRESHOLDS:
        line = campaign.budget_minor * percent
        if before * 100 < line <= campaign.spent_minor * 100:
            announce(
                brand_id=campaign.brand_id,
                name="campaign.budget_threshold",
                record=campaign,
                now=now,
                threshold_percent=percent,
            )
