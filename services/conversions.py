"""Reading the brand's stored conversions (fetchPostbacks, fetchConversion)."""

from __future__ import annotations

from sqlalchemy import select

from models import Conversion
from models.paging import DESCENDING
from services.pagination import Page, paginate
from services.record_reads import get_owned, in_creation_order


def list_conversions(
    *,
    brand_id: str,
    page: int,
    limit: int,
    event_type: str | None = None,
    link_code: str | None = None,
    campaign_id: str | None = None,
    deal_id: str | None = None,
    attributed: bool | None = None,
    sort_order: str = DESCENDING,
) -> Page:
    statement = select(Conversion).where(Conversion.brand_id == brand_id)
    if event_type is not None:
        statement = statement.where(Conversion.event_type == event_type)
    if link_code is not None:
        statement = statement.where(Conversion.link_code == link_code)
    if campaign_id is not None:
        statement = statement.where(Conversion.campaign_id == campaign_id)
    if deal_id is not None:
        statement = statement.where(Conversion.deal_id == deal_id)
    if attributed is not None:
        statement = statement.where(Conversion.attributed == attributed)
    return paginate(in_creation_order(statement, Conversion, sort_order), page=page, limit=limit)


def get_conversion(brand_id: str, conversion_id: str) -> Conversion:
    """:raise NotFound: missing, or another brand's."""
    return get_owned(Conversion, conversion_id, brand_id, "conversion")
