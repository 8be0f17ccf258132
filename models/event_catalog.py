"""The 22 event names of SPEC section 6 and the 2 operational ones of CONTRACT 8.5, what each
means, and a sample `data` for each.

`data` is the record the event is about, in the shape the read API returns it (camelCase, money in
minor units with `currency`, ISO 8601 UTC timestamps), plus, for events about a change, the fields
that say what changed (`previousStatus`, `thresholdPercent`, `previousClicks`). The catalogue is
published in the OpenAPI document and on the dashboard, and `flask events emit` sends a sample
when no `--data` is given, about records of its own each time (`fresh_sample_data`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from models.columns import new_id

# `apiVersion` of every event body: the shape of `data` (a new version would be a new shape).
API_VERSION = "1"


@dataclass(frozen=True)
class EventType:
    name: str
    description: str
    sample: MappingProxyType

    @property
    def resource(self) -> str:
        return self.name.split(".", 1)[0]


# What an operational event (CONTRACT 8.5) says of the endpoint it is about.
_ENDPOINT_HEALTH = {
    "endpointId": "whe_01jd3kr7s9t1v3w5x7y9z1a3b5",
    "url": "https://hooks.example.com/brand-api",
    "consecutiveFailures": 15,
    "lastError": "HTTP 503",
    "disabledAt": "2026-11-21T06:40:12.000Z",
    "lastAttempt": {
        "deliveryId": "whd_01jd3kt0v2w4x6y8z0a2b4c6d8",
        "eventId": "evt_01jd3kw3x5y7z9a1b3c5d7e9f1",
        "eventType": "conversion.recorded",
        "httpStatus": 503,
        "error": "HTTP 503",
        "responseBody": "upstream unavailable",
    },
}
_CAMPAIGN = {
    "id": "cmp_01jd3k9m2x4q8r7t6v5w4y3z2a",
    "name": "Harmattan Glow launch",
    "status": "active",
    "pricingModel": "fixed_fee",
    "clickRateMinor": None,
    "currency": "NGN",
    "budgetMinor": 250000000,
    "spentMinor": 112500000,
    "committedMinor": 45000000,
    "remainingMinor": 92500000,
    "startsAt": "2026-11-01T00:00:00.000Z",
    "endsAt": "2026-11-30T23:59:59.000Z",
    "publishedAt": "2026-11-01T00:00:00.000Z",
    "completedAt": None,
    "cancelledAt": None,
    "createdAt": "2026-10-28T10:12:44.000Z",
    "updatedAt": "2026-11-15T09:30:00.000Z",
}
_DEAL: dict[str, Any] = {
    "id": "deal_01jd3kb7c9x2m4n6p8q0r2s4t6",
    "campaignId": _CAMPAIGN["id"],
    "creatorHandle": "@adaeze.cooks",
    "status": "completed",
    "agreedAmountMinor": 45000000,
    "currency": "NGN",
    "escrow": {
        "heldMinor": 0,
        "releasedMinor": 45000000,
        "refundedMinor": 0,
        "currency": "NGN",
    },
    "settlement": {
        "verifiedPlacements": 2,
        "placementsRequired": 2,
        "amountDueMinor": 45000000,
        "amountSettledMinor": 45000000,
        "outstandingMinor": 0,
        "currency": "NGN",
    },
    "acceptedAt": "2026-11-05T10:00:00.000Z",
    "completedAt": "2026-11-20T08:15:00.000Z",
    "createdAt": "2026-11-04T16:20:00.000Z",
    "updatedAt": "2026-11-20T08:15:00.000Z",
}


def _deal_at(status: str, previous: str, *, held=0, refunded=0, verified=0, accepted=True) -> dict:
    """The sample deal at another point of its life: escrow and settlement to match."""
    due = _DEAL["agreedAmountMinor"] * verified // 2
    return {
        **_DEAL,
        "status": status,
        "escrow": {
            **_DEAL["escrow"],
            "heldMinor": held,
            "releasedMinor": 0,
            "refundedMinor": refunded,
        },
        "settlement": {
            **_DEAL["settlement"],
            "verifiedPlacements": verified,
            "amountDueMinor": due,
            "amountSettledMinor": 0,
            "outstandingMinor": due,
        },
        "acceptedAt": _DEAL["acceptedAt"] if accepted else None,
        "completedAt": None,
        "previousStatus": previous,
    }


_CONTENT = {
    "id": "cnt_01jd3kd2f4g6h8j0k2m4n6p8q0",
    "dealId": _DEAL["id"],
    "campaignId": _CAMPAIGN["id"],
    "kind": "video",
    "caption": "Morning routine with Harmattan Glow",
    "submittedAt": "2026-11-12T09:41:07.000Z",
}
_PLACEMENT = {
    "id": "plc_01jd3kf5h7j9k1m3n5p7q9r1s3",
    "campaignId": _CAMPAIGN["id"],
    "dealId": _DEAL["id"],
    "platform": "instagram",
    "postUrl": "https://www.instagram.com/p/C9xYz12AbCd/",
    "clicks": 1842,
    "submittedAt": "2026-11-13T18:22:10.000Z",
    "verifiedAt": "2026-11-14T16:03:55.000Z",
    "metricsUpdatedAt": "2026-11-16T06:00:00.000Z",
}
_HOLD = {
    "id": "esc_01jd3kh8k0m2n4p6q8r0s2t4v6",
    "dealId": _DEAL["id"],
    "campaignId": _CAMPAIGN["id"],
    "amountMinor": 45000000,
    "currency": "NGN",
    "status": "held",
    "heldAt": "2026-11-05T10:00:00.000Z",
    "releasedAt": None,
    "refundedAt": None,
}
_CONVERSION: dict[str, Any] = {
    "id": "conv_01jd3km1n3p5q7r9s1t3v5w7x9",
    "idempotencyKey": "order-20931-purchase",
    "eventType": "purchase",
    "clickId": "clk_8f2a61",
    "linkCode": "GLOW25",
    "linkId": "lnk_01jd3kc4d6f8g0h2j4k6m8n0p2",
    "campaignId": _CAMPAIGN["id"],
    "dealId": _DEAL["id"],
    "valueMinor": 1250000,
    "currency": "NGN",
    "metadata": {"orderId": "ORD-20931"},
    "attributed": True,
    "createdAt": "2026-11-15T12:30:00.000Z",
}


_LINK = {
    "id": _CONVERSION["linkId"],
    "campaignId": _CAMPAIGN["id"],
    "dealId": _DEAL["id"],
    "code": _CONVERSION["linkCode"],
    "shortUrl": "https://kola.link/" + _CONVERSION["linkCode"],
    "destinationUrl": "https://kolanaturals.example/harmattan-glow?utm_source=brandapi",
    "clicks": 4552,
    "conversions": 11,
    "conversionValueMinor": 18450000,
    "currency": "NGN",
    "lastClickedAt": "2026-11-19T21:04:33.000Z",
    "createdAt": "2026-11-05T10:00:00.000Z",
}

# Whole records, consistent with one another (one campaign, its deal, placement, hold, link and
# a conversion on it): the read API's examples in the OpenAPI document, as events use them.
SAMPLE_RECORDS = MappingProxyType(
    {
        "Campaign": MappingProxyType(_CAMPAIGN),
        "Deal": MappingProxyType(_DEAL),
        "Placement": MappingProxyType(_PLACEMENT),
        "EscrowHold": MappingProxyType(_HOLD),
        "TrackedLink": MappingProxyType(_LINK),
        "Conversion": MappingProxyType(_CONVERSION),
    }
)


def _event(name: str, description: str, sample: dict) -> EventType:
    return EventType(name=name, description=description, sample=MappingProxyType(sample))


_TYPES = (
    _event(
        "campaign.published",
        "A campaign went live and is open to creators.",
        {**_CAMPAIGN, "spentMinor": 0, "committedMinor": 0, "remainingMinor": 250000000},
    ),
    _event(
        "campaign.completed",
        "A campaign reached its end date or its last deal completed.",
        {
            **_CAMPAIGN,
            "status": "completed",
            "spentMinor": 243000000,
            "committedMinor": 0,
            "remainingMinor": 7000000,
            "completedAt": "2026-11-30T23:59:59.000Z",
        },
    ),
    _event(
        "campaign.cancelled",
        "A campaign was cancelled before completion; open deals are cancelled with it.",
        {
            **_CAMPAIGN,
            "status": "cancelled",
            "committedMinor": 0,
            "remainingMinor": 137500000,
            "cancelledAt": "2026-11-18T12:00:00.000Z",
            "previousStatus": "active",
        },
    ),
    _event(
        "campaign.budget_threshold",
        "A campaign's spend crossed a share of its budget (50, 80 and 100 percent).",
        {
            **_CAMPAIGN,
            "spentMinor": 200000000,
            "committedMinor": 0,
            "remainingMinor": 50000000,
            "thresholdPercent": 80,
        },
    ),
    _event(
        "deal.accepted",
        "A creator accepted the brand's offer; its escrow was held just before (escrow.held).",
        _deal_at("accepted", "offered", held=_DEAL["agreedAmountMinor"]),
    ),
    _event(
        "deal.declined",
        "A creator declined the offer.",
        _deal_at("declined", "offered", accepted=False),
    ),
    _event(
        "deal.expired",
        "An offer expired before the creator answered.",
        _deal_at("expired", "offered", accepted=False),
    ),
    _event(
        "deal.status_changed",
        "Any change of a deal's status, including those with their own event.",
        _deal_at("in_progress", "accepted", held=_DEAL["agreedAmountMinor"]),
    ),
    _event(
        "deal.completed",
        "A deal's placements were verified and it is settled.",
        {**_DEAL, "previousStatus": "in_progress"},
    ),
    _event(
        "deal.cancelled",
        "A deal was cancelled; its escrow is refunded.",
        _deal_at("cancelled", "accepted", refunded=_DEAL["agreedAmountMinor"]),
    ),
    _event(
        "deal.disputed",
        "The brand or the creator opened a dispute on a deal.",
        _deal_at("disputed", "in_progress", held=_DEAL["agreedAmountMinor"], verified=1),
    ),
    _event(
        "content.submitted",
        "A creator submitted content of a deal for the brand's approval.",
        _CONTENT,
    ),
    _event(
        "placement.submitted",
        "A creator reported a live post; it awaits verification.",
        {**_PLACEMENT, "clicks": 0, "verifiedAt": None, "metricsUpdatedAt": None},
    ),
    _event(
        "placement.verified",
        "A live post was verified; it now counts towards settlement.",
        _PLACEMENT,
    ),
    _event(
        "placement.metrics_updated",
        "A placement's click count changed.",
        {**_PLACEMENT, "clicks": 2210, "previousClicks": 1842},
    ),
    _event(
        "escrow.held",
        "Funds for a deal were placed in escrow.",
        _HOLD,
    ),
    _event(
        "escrow.released",
        "Escrowed funds were released to the creator.",
        {**_HOLD, "status": "released", "releasedAt": "2026-11-20T08:15:00.000Z"},
    ),
    _event(
        "escrow.refunded",
        "Escrowed funds were refunded to the brand.",
        {**_HOLD, "status": "refunded", "refundedAt": "2026-11-20T08:15:00.000Z"},
    ),
    _event(
        "verification.completed",
        "The workspace's KYB verification finished.",
        {
            "brandId": "brd_01jd3k7a9b1c3d5e7f9g1h3j5k",
            "kybStatus": "verified",
            "completedAt": "2026-11-02T14:20:00.000Z",
        },
    ),
    _event(
        "dispute.resolved",
        "A dispute on a deal was resolved; escrow moves accordingly.",
        {
            "dealId": _DEAL["id"],
            "campaignId": _CAMPAIGN["id"],
            "outcome": "split",
            "releasedMinor": 22500000,
            "refundedMinor": 22500000,
            "currency": "NGN",
            "resolvedAt": "2026-11-21T11:00:00.000Z",
        },
    ),
    _event(
        "conversion.recorded",
        "A new conversion postback was stored (never on a replay).",
        _CONVERSION,
    ),
    _event(
        "webhook.test",
        "A test ping from send-test; sent to that endpoint whatever its subscriptions.",
        {
            "endpointId": "whe_01jd3kr7s9t1v3w5x7y9z1a3b5",
            "message": "Test ping from the Brand API: your endpoint is reachable.",
        },
    ),
    _event(
        "webhook.endpoint_failing",
        "Another of the brand's endpoints has failed half the attempts in a row that disable "
        "an endpoint (once, until a success resets its count): look at it before it is "
        "disabled. Sent to the brand's other active endpoints subscribed to it.",
        {**_ENDPOINT_HEALTH, "consecutiveFailures": 8, "disabledAt": None},
    ),
    _event(
        "webhook.endpoint_disabled",
        "The service disabled another of the brand's endpoints (repeated failures, or its "
        "receiver answered 410 Gone): it receives nothing until re-enabled, and its pending "
        "deliveries failed. Sent to the brand's other active endpoints subscribed to it.",
        _ENDPOINT_HEALTH,
    ),
)

EVENT_TYPES: dict[str, EventType] = {event.name: event for event in _TYPES}
EVENT_NAMES: tuple[str, ...] = tuple(EVENT_TYPES)
TEST_EVENT = "webhook.test"
DEFAULT_SUBSCRIPTION: tuple[str, ...] = ("deal.completed", "conversion.recorded")


def is_event_name(name: str) -> bool:
    return name in EVENT_TYPES


def supported_events(names: list[str]) -> list[str]:
    """The supported names among `names`, deduplicated, in catalogue order; others dropped."""
    wanted = set(names)
    return [name for name in EVENT_NAMES if name in wanted]


def sample_data(name: str) -> dict:
    """A deep copy of the sample, safe to change."""
    return copy.deepcopy(dict(EVENT_TYPES[name].sample))


# An id of the samples above (`deal_01jd3kb7…`): a type prefix, then 26 characters.
_SAMPLE_ID = re.compile(r"^([a-z]+)_[0-9a-z]{26}$")


def fresh_sample_data(name: str) -> dict:
    """The sample with every record id in it replaced by a new id of the same type (the same
    new id wherever the sample repeats one): an event about records of its own, so its subject
    is a new one, whose `sequence` starts at 1, rather than the one sample deal every emit
    would otherwise move along."""
    replaced: dict[str, str] = {}

    def fresh(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: fresh(item) for key, item in value.items()}
        if isinstance(value, list):
            return [fresh(item) for item in value]
        if isinstance(value, str) and (found := _SAMPLE_ID.match(value)):
            return replaced.setdefault(value, new_id(found[1]))
        return value

    return fresh(sample_data(name))
