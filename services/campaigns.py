"""Reading the brand's campaigns (fetchCampaigns, fetchCampaign)."""

from __future__ import annotations

from sqlalchemy import select

from models import Campaign
from services.pagination import Page, paginate
from services.record_reads import get_owned, newest_first


def list_campaigns(*, brand_id: str, page: int, limit: int, status: str | None = None) -> Page:
    statement = select(Campaign).where(Campaign.brand_id == brand_id)
    if status is not None:
        statement = statement.where(Campaign.status == status)
    return paginate(newest_first(statement, Campaign), page=page, limit=limit)


def get_campaign(brand_id: str, campaign_id: str) -> Campaign:
    """:raise NotFound: missing, or another brand's."""
    return get_owned(Campaign, campaign_id, brand_id, "campaign")
