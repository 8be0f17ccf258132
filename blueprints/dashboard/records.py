"""Conversions and tracked links: the brand's stored conversion postbacks with the API's filters
and one conversion's page, and its tracked links with their counters (SPEC sections 2 and 4,
CONTRACT 4 and 5).

Read-only: each list parses its query through the API's own query schema and calls the service
the JSON route calls (fetchPostbacks and fetchConversion in blueprints/api/conversions.py,
fetchLinks in blueprints/api/platform_data.py); rows are the API's response schemas' dumps.
"""

from __future__ import annotations

import json

from flask import url_for

from blueprints.dashboard import dashboard
from blueprints.dashboard.rendering import chosen_filters, render, render_list
from blueprints.dashboard.session import current_caller, signed_in
from schemas.campaigns import CampaignSchema
from schemas.conversions import IDEMPOTENCY_KEY_HEADER, ConversionQuerySchema, ConversionSchema
from schemas.deals import DealSchema
from schemas.envelope import PageMetaSchema
from schemas.tracked_links import TrackedLinkQuerySchema, TrackedLinkSchema
from services.campaigns import get_campaign
from services.conversions import get_conversion, list_conversions
from services.deals import get_deal
from services.tracked_links import list_links

CONVERSION_FILTERS = ("eventType", "linkCode", "campaignId", "dealId", "attributed", "sortOrder")
LINK_FILTERS = ("campaignId", "dealId", "code")

_conversion_query = ConversionQuerySchema()
_conversions = ConversionSchema(many=True)
_conversion = ConversionSchema()
_link_query = TrackedLinkQuerySchema()
_links = TrackedLinkSchema(many=True)
_campaign = CampaignSchema()
_deal = DealSchema()
_meta = PageMetaSchema()


# ---- conversions ----


def _postback_example(brand_id: str) -> dict:
    """What the empty state's curl fills in: the API's own route for this brand."""
    return {
        "url": url_for("api.record_postback_route", brand_id=brand_id, _external=True),
        "header": IDEMPOTENCY_KEY_HEADER,
    }


@dashboard.get("/conversions")
@signed_in()
def conversions():
    """fetchPostbacks: the same filters, order and paging as the API."""
    brand_id = current_caller().brand_id

    def fetch(query: dict) -> dict:
        page = list_conversions(brand_id=brand_id, **query)
        rows = _conversions.dump(page.items)
        return {"conversions": rows, "names": _names(brand_id, rows), "meta": _meta.dump(page)}

    return render_list(
        "dashboard/conversions.html",
        fragment="dashboard/_conversion_results.html",
        query_schema=_conversion_query,
        fetch=fetch,
        chosen=chosen_filters(CONVERSION_FILTERS),
        conversions=[],
        names={},
        meta=None,
        postback=_postback_example(brand_id),
    )


@dashboard.get("/conversions/<id(conv):conversion_id>")
@signed_in()
def conversion(conversion_id: str):
    """fetchConversion: another brand's id is NotFound, as in the API."""
    brand_id = current_caller().brand_id
    record = _conversion.dump(get_conversion(brand_id, conversion_id))
    return render(
        "dashboard/conversion.html",
        conversion=record,
        names=_names(brand_id, [record]),
        metadata=json.dumps(record["metadata"], indent=2, ensure_ascii=False),
    )


# ---- tracked links ----


def _names(brand_id: str, rows: list[dict]) -> dict[str, str]:
    """A label for each campaign (its name) and deal (its creator's handle) the rows name, as
    the API's fetchCampaign and fetchDeal show them; a page holds at most `limit` rows."""
    campaign_ids = {row["campaignId"] for row in rows if row["campaignId"]}
    deal_ids = {row["dealId"] for row in rows if row["dealId"]}
    names = {id: _campaign.dump(get_campaign(brand_id, id))["name"] for id in campaign_ids}
    names |= {id: _deal.dump(get_deal(brand_id, id))["creatorHandle"] for id in deal_ids}
    return names


@dashboard.get("/links")
@signed_in()
def links():
    """fetchLinks, each link with its clicks and attributed conversions."""
    brand_id = current_caller().brand_id

    def fetch(query: dict) -> dict:
        page = list_links(brand_id=brand_id, **query)
        rows = _links.dump(page.items)
        return {"links": rows, "names": _names(brand_id, rows), "meta": _meta.dump(page)}

    return render_list(
        "dashboard/links.html",
        fragment="dashboard/_link_results.html",
        query_schema=_link_query,
        fetch=fetch,
        chosen=chosen_filters(LINK_FILTERS),
        links=[],
        names={},
        meta=None,
    )
