"""Conversion postbacks and the stored conversions (SPEC section 4, CONTRACT section 5)."""

from __future__ import annotations

from flask import current_app

from blueprints.api import api
from blueprints.api.auth import authenticate
from blueprints.api.operations import operation
from models.api_key import READ
from schemas.conversions import (
    ConversionListSchema,
    ConversionQuerySchema,
    ConversionSchema,
    PostbackHeadersSchema,
    PostbackReplaySchema,
    PostbackResultSchema,
    PostbackSchema,
)
from services.conversions import get_conversion, list_conversions
from services.postbacks import Postback, PostbackOutcome, record_postback
from services.rate_limits import POSTBACK

REPLAY = (200, "Replay: this Idempotency-Key was recorded before")


@api.post("/brand/<brand_id>/conversion/record-postback")
# SPEC 5, rule 8: any valid key of the brand, read or write; its own, higher rate limit.
@authenticate(scope=None, rate_limit=POSTBACK)
@operation(
    operation_id="recordPostback",
    tag="Conversions",
    summary="Record a conversion postback, exactly once per Idempotency-Key",
    description="Stores the outcome and, when `linkCode` is one of your tracked links, counts "
    "it on that link (its `conversions` and `conversionValueMinor`) and takes the link's "
    "campaign and deal. A new conversion answers 201 and publishes `conversion.recorded`.\n\n"
    "Retry freely with the same `Idempotency-Key`: a key seen before answers 200 with "
    "`replay: true` and the FIRST conversion, whatever the new body, and counts and publishes "
    "nothing. While the first request with a key is still being recorded, the same key "
    "answers 409 `CONFLICT` with `Retry-After`; a request that died lets go of its key at "
    "once, and one that hangs does after at most 120 seconds. Not throttled per address.",
    headers=PostbackHeadersSchema,
    body=PostbackSchema,
    response=PostbackResultSchema,
    status=201,
    message="Conversion recorded",
    other_status=lambda outcome: REPLAY if outcome.replay else None,
    other_statuses=dict([REPLAY]),
    other_schemas={REPLAY[0]: PostbackReplaySchema},
    errors=(409,),
)
def record_postback_route(brand_id: str, headers: dict, body: dict) -> PostbackOutcome:
    return record_postback(
        brand_id=brand_id,
        idempotency_key=headers["idempotency_key"],
        postback=Postback(**body),
        in_flight_window=current_app.extensions["settings"].postback_in_flight_window,
    )


@api.get("/brand/<brand_id>/conversion/fetch-postbacks")
@authenticate(scope=READ)
@operation(
    operation_id="fetchPostbacks",
    tag="Conversions",
    summary="List the brand's stored conversions",
    description="Filter by `eventType`, `linkCode`, `campaignId`, `dealId` and `attributed`; "
    "newest first unless `sortOrder=asc`; paging in `meta`.",
    query=ConversionQuerySchema,
    response=ConversionListSchema,
    paged=True,
)
def fetch_postbacks(brand_id: str, query: dict):
    return list_conversions(brand_id=brand_id, **query)


@api.get("/brand/<brand_id>/conversion/<id(conv):conversion_id>")
@authenticate(scope=READ)
@operation(
    operation_id="fetchConversion",
    tag="Conversions",
    summary="One stored conversion",
    response=ConversionSchema,
)
def fetch_conversion(brand_id: str, conversion_id: str):
    return get_conversion(brand_id, conversion_id)
