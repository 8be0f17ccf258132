"""Read-only views of the brand's platform records and workspace (SPEC sections 1-2,
CONTRACT section 4). Nothing here writes: the platform's changes arrive through
`services.platform_changes`, and announce themselves as webhook events."""

from __future__ import annotations

from typing import cast

from blueprints.api import api
from blueprints.api.auth import authenticate, current_caller
from blueprints.api.operations import operation
from models.api_key import READ
from schemas.campaigns import CampaignListSchema, CampaignQuerySchema, CampaignSchema
from schemas.deals import DealListSchema, DealQuerySchema, DealSchema
from schemas.escrow_holds import EscrowHoldListSchema, EscrowHoldQuerySchema, EscrowHoldSchema
from schemas.placements import PlacementListSchema, PlacementQuerySchema, PlacementSchema
from schemas.tracked_links import TrackedLinkListSchema, TrackedLinkQuerySchema, TrackedLinkSchema
from schemas.workspace import WorkspaceSchema
from services.campaigns import get_campaign, list_campaigns
from services.deals import get_deal, list_deals
from services.escrow_holds import get_hold, list_holds
from services.placements import get_placement, list_placements
from services.tracked_links import get_link, list_links
from services.workspace import get_workspace

NEWEST_FIRST = " Newest first; paging in `meta`."


@api.get("/brand/<brand_id>/campaigns")
@authenticate(scope=READ)
@operation(
    operation_id="fetchCampaigns",
    tag="Campaigns",
    summary="List the brand's campaigns",
    description="Filter by `status`." + NEWEST_FIRST,
    query=CampaignQuerySchema,
    response=CampaignListSchema,
    paged=True,
)
def fetch_campaigns(brand_id: str, query: dict):
    return list_campaigns(brand_id=brand_id, **query)


@api.get("/brand/<brand_id>/campaigns/<id(cmp):campaign_id>")
@authenticate(scope=READ)
@operation(
    operation_id="fetchCampaign",
    tag="Campaigns",
    summary="One campaign",
    description="Budget, spend and committed escrow in minor units of its currency.",
    response=CampaignSchema,
)
def fetch_campaign(brand_id: str, campaign_id: str):
    return get_campaign(brand_id, campaign_id)


@api.get("/brand/<brand_id>/deals")
@authenticate(scope=READ)
@operation(
    operation_id="fetchDeals",
    tag="Deals",
    summary="List the brand's deals",
    description="Filter by `status` and `campaignId`; each deal carries its escrow snapshot "
    "and settlement summary." + NEWEST_FIRST,
    query=DealQuerySchema,
    response=DealListSchema,
    paged=True,
)
def fetch_deals(brand_id: str, query: dict):
    return list_deals(brand_id=brand_id, **query)


@api.get("/brand/<brand_id>/deals/<id(deal):deal_id>")
@authenticate(scope=READ)
@operation(
    operation_id="fetchDeal",
    tag="Deals",
    summary="One deal with its escrow snapshot and settlement totals",
    response=DealSchema,
)
def fetch_deal(brand_id: str, deal_id: str):
    return get_deal(brand_id, deal_id)


@api.get("/brand/<brand_id>/tracked-link/fetch-links")
@authenticate(scope=READ)
@operation(
    operation_id="fetchLinks",
    tag="Tracked links",
    summary="List the brand's tracked links",
    description="Filter by `campaignId`, `dealId` and exact `code`; each link carries its "
    "clicks and attributed conversions." + NEWEST_FIRST,
    query=TrackedLinkQuerySchema,
    response=TrackedLinkListSchema,
    paged=True,
)
def fetch_links(brand_id: str, query: dict):
    return list_links(brand_id=brand_id, **query)


@api.get("/brand/<brand_id>/tracked-link/<id(lnk):link_id>")
@authenticate(scope=READ)
@operation(
    operation_id="fetchLink",
    tag="Tracked links",
    summary="One tracked link",
    response=TrackedLinkSchema,
)
def fetch_link(brand_id: str, link_id: str):
    return get_link(brand_id, link_id)


@api.get("/brand/<brand_id>/placement/fetch-placements")
@authenticate(scope=READ)
@operation(
    operation_id="fetchPlacements",
    tag="Placements",
    summary="List the placements of the brand's campaigns",
    description="Live posts with their clicks and verification; filter by `campaignId` and "
    "`dealId`." + NEWEST_FIRST,
    query=PlacementQuerySchema,
    response=PlacementListSchema,
    paged=True,
)
def fetch_placements(brand_id: str, query: dict):
    return list_placements(brand_id=brand_id, **query)


@api.get("/brand/<brand_id>/placement/<id(plc):placement_id>")
@authenticate(scope=READ)
@operation(
    operation_id="fetchPlacement",
    tag="Placements",
    summary="One placement",
    description="A placement belongs to the brand through its campaign.",
    response=PlacementSchema,
)
def fetch_placement(brand_id: str, placement_id: str):
    return get_placement(brand_id, placement_id)


@api.get("/brand/<brand_id>/escrow/fetch-holds")
@authenticate(scope=READ)
@operation(
    operation_id="fetchEscrowHolds",
    tag="Escrow",
    summary="List the brand's escrow holds",
    description="Filter by `campaignId`, `dealId` and `status`." + NEWEST_FIRST,
    query=EscrowHoldQuerySchema,
    response=EscrowHoldListSchema,
    paged=True,
)
def fetch_escrow_holds(brand_id: str, query: dict):
    return list_holds(brand_id=brand_id, **query)


@api.get("/brand/<brand_id>/escrow/<id(esc):hold_id>")
@authenticate(scope=READ)
@operation(
    operation_id="fetchEscrowHold",
    tag="Escrow",
    summary="One escrow hold",
    response=EscrowHoldSchema,
)
def fetch_escrow_hold(brand_id: str, hold_id: str):
    return get_hold(brand_id, hold_id)


@api.get("/brand/<brand_id>/workspace")
@authenticate(scope=READ)
@operation(
    operation_id="fetchWorkspace",
    tag="Workspace",
    summary="The brand's workspace and the calling key",
    description="Plan, KYB status, the current subscription period, and the id and scopes "
    "of the key that made the request. Never a secret.",
    response=WorkspaceSchema,
)
def fetch_workspace(brand_id: str):
    caller = current_caller()
    # An API key's caller: only create-key takes a bootstrap token.
    return get_workspace(brand_id=brand_id, key_id=cast(str, caller.key_id), scopes=caller.scopes)
