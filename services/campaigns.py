"""Reading the brand's campaigns (fetchCampaigns, fetchCampaign, and the choices of an
endpoint's campaign filter)."""

from __future__ import annotations

import re
from collections.abc import Collection

from sqlalchemy import or_, select

from extensions import db
from models import Campaign
from models.columns import id_pattern
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


# The campaigns an endpoint form offers: a brand's newest this many, and the ones it filters.
CAMPAIGN_CHOICES = 200


_CAMPAIGN_ID = re.compile(id_pattern("cmp"))


def campaign_choices(
    brand_id: str, *, including: Collection[str] = (), limit: int = CAMPAIGN_CHOICES
) -> list[Campaign]:
    """The brand's newest `limit` campaigns, and those of `including` among its others (an
    endpoint's filter, so that saving its form never drops one), newest first. `including` may
    come from a form as typed: what is not a campaign id is no campaign, and is not looked up."""
    including = [value for value in including if _CAMPAIGN_ID.fullmatch(value)]
    newest = (
        select(Campaign.id)
        .where(Campaign.brand_id == brand_id)
        .order_by(Campaign.created_at.desc(), Campaign.id.desc())
        .limit(limit)
    )
    statement = select(Campaign).where(
        Campaign.brand_id == brand_id,
        or_(Campaign.id.in_(newest.scalar_subquery()), Campaign.id.in_(list(including))),
    )
    return list(db.session.scalars(newest_first(statement, Campaign)))
