"""Reading the brand's escrow holds (fetchEscrowHolds, fetchEscrowHold)."""

from __future__ import annotations

from sqlalchemy import select

from models import EscrowHold
from services.pagination import Page, paginate
from services.record_reads import get_owned, newest_first


def list_holds(
    *,
    brand_id: str,
    page: int,
    limit: int,
    campaign_id: str | None = None,
    deal_id: str | None = None,
    status: str | None = None,
) -> Page:
    statement = select(EscrowHold).where(EscrowHold.brand_id == brand_id)
    if campaign_id is not None:
        statement = statement.where(EscrowHold.campaign_id == campaign_id)
    if deal_id is not None:
        statement = statement.where(EscrowHold.deal_id == deal_id)
    if status is not None:
        statement = statement.where(EscrowHold.status == status)
    return paginate(newest_first(statement, EscrowHold), page=page, limit=limit)


def get_hold(brand_id: str, hold_id: str) -> EscrowHold:
    """:raise NotFound: missing, or another brand's."""
    return get_owned(EscrowHold, hold_id, brand_id, "escrow hold")
