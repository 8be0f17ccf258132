"""Reading the brand's placements (fetchPlacements, fetchPlacement).

Placements carry no brand id (SPEC section 2): every read joins the placement's campaign and
checks the campaign's brand, so a placement of another brand's campaign is simply not found.
"""

from __future__ import annotations

from sqlalchemy import select

from extensions import db
from models import Campaign, Placement
from services.errors import NotFound
from services.pagination import Page, paginate
from services.records import newest_first


def _brand_placements(brand_id: str):
    return (
        select(Placement)
        .join(Campaign, Campaign.id == Placement.campaign_id)
        .where(Campaign.brand_id == brand_id)
    )


def list_placements(
    *,
    brand_id: str,
    page: int,
    limit: int,
    campaign_id: str | None = None,
    deal_id: str | None = None,
) -> Page:
    statement = _brand_placements(brand_id)
    if campaign_id is not None:
        statement = statement.where(Placement.campaign_id == campaign_id)
    if deal_id is not None:
        statement = statement.where(Placement.deal_id == deal_id)
    return paginate(newest_first(statement, Placement), page=page, limit=limit)


def get_placement(brand_id: str, placement_id: str) -> Placement:
    """:raise NotFound: missing, or of another brand's campaign."""
    placement = db.session.scalar(_brand_placements(brand_id).where(Placement.id == placement_id))
    if placement is None:
        raise NotFound(f"No placement with id {placement_id!r} in this brand")
    return placement
