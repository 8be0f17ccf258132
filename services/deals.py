"""Reading the brand's deals (fetchDeals, fetchDeal) with their escrow and settlement."""

from __future__ import annotations

from sqlalchemy import select

from models import Deal
from services.pagination import Page, paginate
from services.record_reads import get_owned, newest_first


def list_deals(
    *,
    brand_id: str,
    page: int,
    limit: int,
    status: str | None = None,
    campaign_id: str | None = None,
) -> Page:
    statement = select(Deal).where(Deal.brand_id == brand_id)
    if status is not None:
        statement = statement.where(Deal.status == status)
    if campaign_id is not None:
        statement = statement.where(Deal.campaign_id == campaign_id)
    return paginate(newest_first(statement, Deal), page=page, limit=limit)


def get_deal(brand_id: str, deal_id: str) -> Deal:
    """:raise NotFound: missing, or another brand's."""
    return get_owned(Deal, deal_id, brand_id, "deal")
