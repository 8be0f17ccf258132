"""The platform's changes (`services.platform_changes`), as a brand observes them: the records
the read API shows, and the SPEC section 6 events published with them (CONTRACT 6.1-6.2).

Every change runs in its own transaction, committed the way a platform sync would, and is then
checked from outside: the `WebhookEvent` rows of the brand (the bodies every delivery sends), the
read routes with a read key, and, end to end, a real worker delivering to a real receiver.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy import func, select, text

from extensions import db
from models import Brand, Campaign, Deal, EscrowHold, Placement, WebhookEvent
from models.columns import utcnow
from models.event_catalog import EVENT_NAMES, sample_data
from schemas.campaigns import CampaignSchema
from schemas.deals import DealSchema
from schemas.escrow_holds import EscrowHoldSchema
from schemas.placements import PlacementSchema
from services.errors import Conflict, NotFound, ValidationFailed
from services.platform_changes.campaigns import (
    cancel_campaign,
    complete_campaign,
    create_campaign,
    pause_campaign,
    publish_campaign,
    resume_campaign,
)
from services.platform_changes.deals import (
    accept_deal,
    cancel_deal,
    complete_deal,
    decline_deal,
    dispute_deal,
    expire_deal,
    offer_deal,
    resolve_dispute,
)
from services.platform_changes.escrow import hold_escrow, refund_escrow, release_escrow
from services.platform_changes.placements import (
    submit_placement,
    update_placement_metrics,
    verify_placement,
)
from services.platform_changes.workspace import complete_kyb_verification
from tests.event_schemas import contract_of
from tests.helpers import assert_success
from tests.receiver import Receiver

# The fields an event adds to its record to say what changed.
CHANGE_FIELDS = ("previousStatus", "thresholdPercent", "previousClicks")
# Events with no platform change behind them (a postback, a test ping, content approval).
# Published elsewhere: postbacks, send-test, and the worker's operational events (their samples
# are checked against real ones in tests/test_operational_events.py).
NOT_PLATFORM_EVENTS = {
    "conversion.recorded",
    "webhook.test",
    "content.submitted",
    "webhook.endpoint_failing",
    "webhook.endpoint_disabled",
}
POST_URL = "https://www.instagram.com/p/C9xYz12AbCd/"


# ---------------------------------------------------------------------------------------------
# Driving the platform layer, one committed transaction per change


@dataclass
class Change:
    """What one committed change returned (its record's id) and the events it published."""

    id: str | None
    events: list[dict]

    @property
    def names(self) -> list[str]:
        return [event["type"] for event in self.events]

    def data(self, name: str) -> dict:
        [found] = [event["data"] for event in self.events if event["type"] == name]
        return found

    def all_data(self, name: str) -> list[dict]:
        return [event["data"] for event in self.events if event["type"] == name]


class Platform:
    """The platform of one brand: makes records through `services.platform_changes` and commits."""

    def __init__(self, app, brand_id: str) -> None:
        self.app = app
        self.brand = brand_id

    def events(self) -> list[dict]:
        """Every event of the brand, oldest first, as delivered (the stored body)."""
        with self.app.app_context():
            bodies = db.session.scalars(
                select(WebhookEvent.body)
                .where(WebhookEvent.brand_id == self.brand)
                .order_by(WebhookEvent.id)
            ).all()
        return [json.loads(body) for body in bodies]

    def do(self, change: Callable, *args, **kwargs) -> Change:
        before = len(self.events())
        with self.app.app_context():
            result = change(*args, **kwargs)
            result_id = getattr(result, "id", None)
            db.session.commit()
        return Change(result_id, self.events()[before:])

    def campaign(
        self,
        *,
        pricing_model: str = "fixed_fee",
        budget_minor: int = 1_000_000,
        click_rate_minor: int | None = None,
        currency: str = "NGN",
        publish: bool = True,
    ) -> str:
        start = utcnow()
        campaign_id = self.do(
            create_campaign,
            brand_id=self.brand,
            name="Harmattan Glow launch",
            pricing_model=pricing_model,
            currency=currency,
            budget_minor=budget_minor,
            starts_at=start,
            ends_at=start + timedelta(days=30),
            click_rate_minor=click_rate_minor,
        ).id
        if publish:
            self.do(publish_campaign, campaign_id)
        return campaign_id

    def offer(self, campaign_id: str, amount_minor: int = 90_000, required: int = 1) -> str:
        return self.do(
            offer_deal,
            campaign_id=campaign_id,
            creator_handle="@adaeze.cooks",
            agreed_amount_minor=amount_minor,
            placements_required=required,
        ).id

    def accepted(self, campaign_id: str, amount_minor: int = 90_000, required: int = 1) -> str:
        deal_id = self.offer(campaign_id, amount_minor, required)
        self.do(accept_deal, deal_id)
        return deal_id

    def submit(self, deal_id: str, platform: str = "instagram") -> str:
        return self.do(submit_placement, deal_id=deal_id, platform=platform, post_url=POST_URL).id

    def verified(self, deal_id: str, clicks: int | None = None) -> str:
        placement_id = self.submit(deal_id)
        self.do(verify_placement, placement_id)
        if clicks is not None:
            self.do(update_placement_metrics, placement_id, clicks=clicks)
        return placement_id

    def hold_ids(self, deal_id: str) -> list[str]:
        with self.app.app_context():
            return list(
                db.session.scalars(
                    select(EscrowHold.id)
                    .where(EscrowHold.deal_id == deal_id)
                    .order_by(EscrowHold.created_at, EscrowHold.id)
                )
            )

    def world(self) -> dict:
        """Everything of the brand a reader could see: records in read shape, and events."""
        with self.app.app_context():
            campaigns = db.session.scalars(
                select(Campaign).where(Campaign.brand_id == self.brand).order_by(Campaign.id)
            ).all()
            campaign_ids = [campaign.id for campaign in campaigns]
            return {
                "kyb": db.session.get(Brand, self.brand).kyb_status,
                "campaigns": CampaignSchema(many=True).dump(campaigns),
                "deals": DealSchema(many=True).dump(
                    db.session.scalars(
                        select(Deal).where(Deal.brand_id == self.brand).order_by(Deal.id)
                    ).all()
                ),
                "holds": EscrowHoldSchema(many=True).dump(
                    db.session.scalars(
                        select(EscrowHold)
                        .where(EscrowHold.brand_id == self.brand)
                        .order_by(EscrowHold.id)
                    ).all()
                ),
                "placements": PlacementSchema(many=True).dump(
                    db.session.scalars(
                        select(Placement)
                        .where(Placement.campaign_id.in_(campaign_ids))
                        .order_by(Placement.id)
                    ).all()
                ),
                "events": [event["id"] for event in self.events()],
            }


@pytest.fixture
def platform(app, brand) -> Platform:
    return Platform(app, brand)


class Reader:
    """The read API, as the brand calls it with a read key."""

    def __init__(self, client, brand_id: str, key: str) -> None:
        self.client = client
        self.brand = brand_id
        self.key = key

    def get(self, path: str, **query) -> dict:
        response = self.client.get(
            f"/api/v1/brand/{self.brand}/{path}",
            query_string=query,
            headers={"X-Api-Key": self.key},
        )
        return assert_success(response)

    def campaign(self, campaign_id: str) -> dict:
        return self.get(f"campaigns/{campaign_id}")

    def deal(self, deal_id: str) -> dict:
        return self.get(f"deals/{deal_id}")

    def hold(self, hold_id: str) -> dict:
        return self.get(f"escrow/{hold_id}")

    def placement(self, placement_id: str) -> dict:
        return self.get(f"placement/{placement_id}")

    def holds_of(self, deal_id: str) -> list[dict]:
        return self.get("escrow/fetch-holds", dealId=deal_id)["holds"]

    def record_of(self, event: dict) -> dict | None:
        """What the read API shows now of the record an event is about (None: no record)."""
        resource = event["type"].split(".", 1)[0]
        route = {
            "campaign": self.campaign,
            "deal": self.deal,
            "escrow": self.hold,
            "placement": self.placement,
        }.get(resource)
        return None if route is None else route(event["data"]["id"])


@pytest.fixture
def reader(client, brand, read_key) -> Reader:
    return Reader(client, brand, read_key)


def record_part(data: dict) -> dict:
    """An event's data without the fields that say what changed: the record itself."""
    return {key: value for key, value in data.items() if key not in CHANGE_FIELDS}


def assert_events_show_what_the_api_shows(reader: Reader, change: Change) -> None:
    """Each event's record equals what the read API shows for it right after the change."""
    for event in change.events:
        now = reader.record_of(event)
        if now is not None:
            assert record_part(event["data"]) == now, event["type"]


# ---------------------------------------------------------------------------------------------
# Campaigns


def test_publish_campaign_announces_the_live_campaign(platform, reader):
    campaign_id = platform.campaign(publish=False)
    assert platform.events() == []  # a draft is not announced

    change = platform.do(publish_campaign, campaign_id)

    assert change.names == ["campaign.published"]
    [event] = change.events
    assert event["id"].startswith("evt_")
    assert event["brandId"] == platform.brand
    assert event["apiVersion"] == "1"
    data = event["data"]
    assert data["id"] == campaign_id
    assert data["status"] == "active"
    assert data["publishedAt"] is not None
    assert (data["budgetMinor"], data["spentMinor"], data["committedMinor"]) == (1_000_000, 0, 0)
    assert data["remainingMinor"] == 1_000_000
    assert data == reader.campaign(campaign_id)


def test_pausing_and_resuming_a_campaign_is_not_announced(platform, reader):
    campaign_id = platform.campaign()
    assert platform.do(pause_campaign, campaign_id).events == []
    assert reader.campaign(campaign_id)["status"] == "paused"
    assert platform.do(resume_campaign, campaign_id).events == []
    assert reader.campaign(campaign_id)["status"] == "active"


def test_cancel_campaign_cancels_its_open_deals_then_announces_itself(platform, reader):
    campaign_id = platform.campaign()
    offered = platform.offer(campaign_id, 10_000)
    accepted = platform.accepted(campaign_id, 20_000)
    running = platform.accepted(campaign_id, 30_000)
    placement_id = platform.verified(running)
    done = platform.accepted(campaign_id, 40_000)
    platform.verified(done)
    platform.do(complete_deal, done)
    declined = platform.offer(campaign_id, 50_000)
    platform.do(decline_deal, declined)

    change = platform.do(cancel_campaign, campaign_id)

    assert change.names == [
        "deal.cancelled",  # the offer: nothing held, nothing refunded
        "deal.status_changed",
        "escrow.refunded",
        "deal.cancelled",
        "deal.status_changed",
        "escrow.refunded",
        "deal.cancelled",
        "deal.status_changed",
        "campaign.cancelled",
    ]
    cancelled = change.all_data("deal.cancelled")
    assert [d["id"] for d in cancelled] == [offered, accepted, running]
    assert [d["previousStatus"] for d in cancelled] == ["offered", "accepted", "in_progress"]
    assert [d["escrow"]["refundedMinor"] for d in cancelled] == [0, 20_000, 30_000]
    assert all(d["escrow"]["heldMinor"] == 0 for d in cancelled)
    assert [d["amountMinor"] for d in change.all_data("escrow.refunded")] == [20_000, 30_000]
    campaign = change.data("campaign.cancelled")
    assert campaign["status"] == "cancelled"
    assert campaign["previousStatus"] == "active"
    assert campaign["cancelledAt"] is not None
    assert (campaign["committedMinor"], campaign["spentMinor"]) == (0, 40_000)
    assert campaign["remainingMinor"] == 1_000_000 - 40_000
    # Ended deals are left as they were.
    assert reader.deal(done)["status"] == "completed"
    assert reader.deal(declined)["status"] == "declined"
    assert reader.placement(placement_id)["verifiedAt"] is not None
    assert_events_show_what_the_api_shows(reader, change)
    # A cancelled campaign takes no more offers.
    with pytest.raises(Conflict), platform.app.app_context():
        offer_deal(campaign_id=campaign_id, creator_handle="@late", agreed_amount_minor=1)


def test_complete_campaign_expires_unanswered_offers(platform, reader):
    campaign_id = platform.campaign()
    first = platform.offer(campaign_id, 10_000)
    accepted = platform.accepted(campaign_id, 20_000)
    second = platform.offer(campaign_id, 30_000)

    change = platform.do(complete_campaign, campaign_id)

    assert change.names == [
        "deal.expired",
        "deal.status_changed",
        "deal.expired",
        "deal.status_changed",
        "campaign.completed",
    ]
    expired = change.all_data("deal.expired")
    assert [d["id"] for d in expired] == [first, second]
    assert {d["status"] for d in expired} == {"expired"}
    assert {d["previousStatus"] for d in expired} == {"offered"}
    campaign = change.data("campaign.completed")
    assert campaign["status"] == "completed"
    assert campaign["completedAt"] is not None
    assert campaign["committedMinor"] == 20_000  # the accepted deal still runs, funded
    assert reader.deal(accepted)["status"] == "accepted"
    assert_events_show_what_the_api_shows(reader, change)


# ---------------------------------------------------------------------------------------------
# Deals


def test_accept_deal_holds_escrow_then_announces_the_funded_deal(platform, reader):
    campaign_id = platform.campaign()
    deal_id = platform.offer(campaign_id, 90_000)
    assert [e["type"] for e in platform.events()] == ["campaign.published"]  # an offer is silent

    change = platform.do(accept_deal, deal_id)

    assert change.names == ["escrow.held", "deal.accepted", "deal.status_changed"]
    accepted = change.data("deal.accepted")
    assert accepted == change.data("deal.status_changed")
    assert accepted["id"] == deal_id
    assert (accepted["status"], accepted["previousStatus"]) == ("accepted", "offered")
    assert accepted["acceptedAt"] is not None
    hold = change.data("escrow.held")
    assert hold["dealId"] == deal_id and hold["campaignId"] == campaign_id
    assert (hold["amountMinor"], hold["currency"], hold["status"]) == (90_000, "NGN", "held")
    assert hold == reader.hold(hold["id"])

    deal = reader.deal(deal_id)
    assert deal["escrow"] == {
        "heldMinor": 90_000,
        "releasedMinor": 0,
        "refundedMinor": 0,
        "currency": "NGN",
    }
    # Escrow is held before the deal is announced, so the deal event shows it funded: exactly
    # what the API shows.
    assert record_part(accepted) == deal
    assert_events_show_what_the_api_shows(reader, change)
    campaign = reader.campaign(campaign_id)
    assert (campaign["committedMinor"], campaign["remainingMinor"]) == (90_000, 910_000)


@pytest.mark.parametrize(
    ("move", "status", "own_event"),
    [
        (decline_deal, "declined", "deal.declined"),
        (expire_deal, "expired", "deal.expired"),
    ],
)
def test_an_unanswered_offer_ends(platform, reader, move, status, own_event):
    deal_id = platform.offer(platform.campaign())

    change = platform.do(move, deal_id)

    assert change.names == [own_event, "deal.status_changed"]
    data = change.data(own_event)
    assert (data["status"], data["previousStatus"]) == (status, "offered")
    assert data["acceptedAt"] is None
    assert data == change.data("deal.status_changed")
    assert_events_show_what_the_api_shows(reader, change)
    assert reader.holds_of(deal_id) == []


def test_dispute_deal_announces_the_dispute(platform, reader):
    deal_id = platform.accepted(platform.campaign())
    platform.submit(deal_id)

    change = platform.do(dispute_deal, deal_id)

    assert change.names == ["deal.disputed", "deal.status_changed"]
    data = change.data("deal.disputed")
    assert (data["status"], data["previousStatus"]) == ("disputed", "in_progress")
    assert data["escrow"]["heldMinor"] == 90_000  # a dispute moves no money
    assert_events_show_what_the_api_shows(reader, change)


def test_first_placement_starts_the_deal_then_is_announced(platform, reader):
    deal_id = platform.accepted(platform.campaign())

    first = platform.do(submit_placement, deal_id=deal_id, platform="tiktok", post_url=POST_URL)

    assert first.names == ["deal.status_changed", "placement.submitted"]
    started = first.data("deal.status_changed")
    assert (started["status"], started["previousStatus"]) == ("in_progress", "accepted")
    placement = first.data("placement.submitted")
    assert placement["id"] == first.id
    assert placement["dealId"] == deal_id
    assert (placement["platform"], placement["postUrl"]) == ("tiktok", POST_URL)
    assert (placement["clicks"], placement["verifiedAt"]) == (0, None)
    assert_events_show_what_the_api_shows(reader, first)

    second = platform.do(submit_placement, deal_id=deal_id, platform="x", post_url=POST_URL)
    assert second.names == ["placement.submitted"]  # already in progress


def test_fixed_fee_settlement_follows_verified_placements(platform, reader):
    deal_id = platform.accepted(platform.campaign(), 90_000, required=2)
    first, second, third = (platform.submit(deal_id) for _ in range(3))
    assert reader.deal(deal_id)["settlement"]["amountDueMinor"] == 0  # submitted is not earned

    change = platform.do(verify_placement, first)

    assert change.names == ["placement.verified"]
    verified = change.data("placement.verified")
    assert verified["id"] == first and verified["verifiedAt"] is not None
    assert_events_show_what_the_api_shows(reader, change)
    assert reader.deal(deal_id)["settlement"] == {
        "verifiedPlacements": 1,
        "placementsRequired": 2,
        "amountDueMinor": 45_000,
        "amountSettledMinor": 0,
        "outstandingMinor": 45_000,
        "currency": "NGN",
    }
    platform.do(verify_placement, second)
    assert reader.deal(deal_id)["settlement"]["amountDueMinor"] == 90_000
    platform.do(verify_placement, third)  # more posts than asked for earn nothing more
    settlement = reader.deal(deal_id)["settlement"]
    assert (settlement["verifiedPlacements"], settlement["amountDueMinor"]) == (3, 90_000)


def test_fixed_fee_settlement_rounds_down_to_the_minor_unit(platform, reader):
    deal_id = platform.accepted(platform.campaign(), 100_000, required=3)
    platform.verified(deal_id)
    assert reader.deal(deal_id)["settlement"]["amountDueMinor"] == 33_333


def test_per_click_settlement_is_verified_clicks_at_the_rate_capped(platform, reader):
    campaign_id = platform.campaign(pricing_model="per_click", click_rate_minor=25)
    deal_id = platform.accepted(campaign_id, 10_000)
    unverified = platform.submit(deal_id)
    platform.do(update_placement_metrics, unverified, clicks=999)
    assert reader.deal(deal_id)["settlement"]["amountDueMinor"] == 0  # unverified: not paid

    placement_id = platform.verified(deal_id)
    assert reader.deal(deal_id)["settlement"]["amountDueMinor"] == 0  # no clicks yet

    change = platform.do(update_placement_metrics, placement_id, clicks=200)

    assert change.names == ["placement.metrics_updated"]
    data = change.data("placement.metrics_updated")
    assert (data["clicks"], data["previousClicks"]) == (200, 0)
    assert data["metricsUpdatedAt"] is not None
    assert_events_show_what_the_api_shows(reader, change)
    settlement = reader.deal(deal_id)["settlement"]
    assert (settlement["amountDueMinor"], settlement["outstandingMinor"]) == (5_000, 5_000)

    change = platform.do(update_placement_metrics, placement_id, clicks=1_000)
    assert change.data("placement.metrics_updated")["previousClicks"] == 200
    assert reader.deal(deal_id)["settlement"]["amountDueMinor"] == 10_000  # 25_000 capped


def test_complete_deal_releases_escrow_then_announces_the_deal(platform, reader):
    campaign_id = platform.campaign()
    deal_id = platform.accepted(campaign_id, 90_000)
    platform.verified(deal_id)
    [hold_id] = platform.hold_ids(deal_id)

    change = platform.do(complete_deal, deal_id)

    assert change.names == ["escrow.released", "deal.completed", "deal.status_changed"]
    released = change.data("escrow.released")
    assert (released["id"], released["status"], released["amountMinor"]) == (
        hold_id,
        "released",
        90_000,
    )
    assert released["releasedAt"] is not None and released["refundedAt"] is None
    deal = change.data("deal.completed")
    assert (deal["status"], deal["previousStatus"]) == ("completed", "in_progress")
    assert deal["completedAt"] is not None
    assert deal["escrow"] == {
        "heldMinor": 0,
        "releasedMinor": 90_000,
        "refundedMinor": 0,
        "currency": "NGN",
    }
    assert deal["settlement"]["amountSettledMinor"] == 90_000
    assert deal["settlement"]["outstandingMinor"] == 0
    assert_events_show_what_the_api_shows(reader, change)
    campaign = reader.campaign(campaign_id)
    assert (campaign["spentMinor"], campaign["committedMinor"]) == (90_000, 0)


def test_complete_per_click_deal_earning_less_splits_the_hold(platform, reader):
    campaign_id = platform.campaign(
        pricing_model="per_click", click_rate_minor=25, budget_minor=1_000_000
    )
    deal_id = platform.accepted(campaign_id, 10_000)
    platform.verified(deal_id, clicks=200)  # earns 5_000 of 10_000
    [hold_id] = platform.hold_ids(deal_id)
    held_at = reader.hold(hold_id)["heldAt"]

    change = platform.do(complete_deal, deal_id)

    assert change.names == [
        "escrow.released",
        "escrow.refunded",
        "deal.completed",
        "deal.status_changed",
    ]
    released, refunded = change.data("escrow.released"), change.data("escrow.refunded")
    # The released part keeps the hold's id; the rest is a new hold, held when it was.
    assert (released["id"], released["amountMinor"], released["status"]) == (
        hold_id,
        5_000,
        "released",
    )
    assert refunded["id"] != hold_id and refunded["id"].startswith("esc_")
    assert (refunded["amountMinor"], refunded["status"]) == (5_000, "refunded")
    assert refunded["heldAt"] == released["heldAt"] == held_at
    assert refunded["dealId"] == deal_id and refunded["campaignId"] == campaign_id
    assert {h["id"]: h["status"] for h in reader.holds_of(deal_id)} == {
        hold_id: "released",
        refunded["id"]: "refunded",
    }
    deal = change.data("deal.completed")
    assert deal["escrow"] == {
        "heldMinor": 0,
        "releasedMinor": 5_000,
        "refundedMinor": 5_000,
        "currency": "NGN",
    }
    assert (deal["settlement"]["amountSettledMinor"], deal["settlement"]["outstandingMinor"]) == (
        5_000,
        0,
    )
    assert_events_show_what_the_api_shows(reader, change)
    campaign = reader.campaign(campaign_id)
    assert (campaign["spentMinor"], campaign["committedMinor"]) == (5_000, 0)
    assert campaign["remainingMinor"] == 995_000


def test_cancel_deal_refunds_its_escrow(platform, reader):
    campaign_id = platform.campaign()
    deal_id = platform.accepted(campaign_id, 90_000)
    [hold_id] = platform.hold_ids(deal_id)

    change = platform.do(cancel_deal, deal_id)

    assert change.names == ["escrow.refunded", "deal.cancelled", "deal.status_changed"]
    refunded = change.data("escrow.refunded")
    assert (refunded["id"], refunded["status"], refunded["amountMinor"]) == (
        hold_id,
        "refunded",
        90_000,
    )
    assert refunded["refundedAt"] is not None and refunded["releasedAt"] is None
    deal = change.data("deal.cancelled")
    assert (deal["status"], deal["previousStatus"]) == ("cancelled", "accepted")
    assert deal["escrow"]["refundedMinor"] == 90_000 and deal["escrow"]["heldMinor"] == 0
    assert_events_show_what_the_api_shows(reader, change)
    campaign = reader.campaign(campaign_id)
    assert (campaign["spentMinor"], campaign["committedMinor"]) == (0, 0)


def test_cancel_an_offer_has_no_escrow_to_refund(platform, reader):
    deal_id = platform.offer(platform.campaign())
    change = platform.do(cancel_deal, deal_id)
    assert change.names == ["deal.cancelled", "deal.status_changed"]
    assert change.data("deal.cancelled")["previousStatus"] == "offered"


@pytest.mark.parametrize(
    ("outcome", "released", "refunded", "ends", "escrow_events"),
    [
        ("creator", 10_001, 0, "completed", ["escrow.released"]),
        ("brand", 0, 10_001, "cancelled", ["escrow.refunded"]),
        ("split", 5_000, 5_001, "completed", ["escrow.released", "escrow.refunded"]),
    ],
)
def test_resolve_dispute(platform, reader, outcome, released, refunded, ends, escrow_events):
    campaign_id = platform.campaign()
    deal_id = platform.accepted(campaign_id, 10_001)
    platform.submit(deal_id)
    platform.do(dispute_deal, deal_id)
    [hold_id] = platform.hold_ids(deal_id)

    change = platform.do(resolve_dispute, deal_id, outcome=outcome)

    own = {"completed": "deal.completed", "cancelled": "deal.cancelled"}[ends]
    assert change.names == ["dispute.resolved", *escrow_events, own, "deal.status_changed"]
    resolved = change.data("dispute.resolved")
    assert resolved == {
        "dealId": deal_id,
        "campaignId": campaign_id,
        "outcome": outcome,
        "releasedMinor": released,
        "refundedMinor": refunded,
        "currency": "NGN",
        "resolvedAt": resolved["resolvedAt"],
    }
    assert resolved["resolvedAt"].endswith("Z")
    deal = change.data(own)
    assert (deal["status"], deal["previousStatus"]) == (ends, "disputed")
    assert deal["escrow"] == {
        "heldMinor": 0,
        "releasedMinor": released,
        "refundedMinor": refunded,
        "currency": "NGN",
    }
    holds = {h["status"]: h for h in reader.holds_of(deal_id)}
    assert {status: h["amountMinor"] for status, h in holds.items()} == {
        status: amount
        for status, amount in (("released", released), ("refunded", refunded))
        if amount
    }
    assert holds["released" if released else "refunded"]["id"] == hold_id
    assert reader.campaign(campaign_id)["spentMinor"] == released
    assert_events_show_what_the_api_shows(reader, change)


def test_complete_kyb_verification_announces_it(platform, client, make_key):
    key = make_key(platform.brand, scopes=("read",))

    change = platform.do(complete_kyb_verification, platform.brand, kyb_status="verified")

    assert change.names == ["verification.completed"]
    data = change.data("verification.completed")
    assert (data["brandId"], data["kybStatus"]) == (platform.brand, "verified")
    assert data["completedAt"] == change.events[0]["createdAt"]
    response = client.get(f"/api/v1/brand/{platform.brand}/workspace", headers={"X-Api-Key": key})
    assert assert_success(response)["kybStatus"] == "verified"


# ---------------------------------------------------------------------------------------------
# Budget thresholds


def thresholds(platform: Platform) -> list[int]:
    return [
        event["data"]["thresholdPercent"]
        for event in platform.events()
        if event["type"] == "campaign.budget_threshold"
    ]


def complete_funded_deal(platform: Platform, campaign_id: str, amount_minor: int) -> Change:
    deal_id = platform.accepted(campaign_id, amount_minor)
    platform.verified(deal_id)
    return platform.do(complete_deal, deal_id)


def test_budget_thresholds_are_announced_once_each_as_spend_crosses_them(platform, reader):
    campaign_id = platform.campaign(budget_minor=100_000)

    below = complete_funded_deal(platform, campaign_id, 49_999)
    assert "campaign.budget_threshold" not in below.names

    fifty = complete_funded_deal(platform, campaign_id, 1)  # exactly 50 percent
    assert fifty.names == [
        "escrow.released",
        "campaign.budget_threshold",
        "deal.completed",
        "deal.status_changed",
    ]
    crossed = fifty.data("campaign.budget_threshold")
    assert (crossed["thresholdPercent"], crossed["spentMinor"]) == (50, 50_000)
    assert crossed["id"] == campaign_id
    assert record_part(crossed) == reader.campaign(campaign_id)

    assert (
        "campaign.budget_threshold" not in complete_funded_deal(platform, campaign_id, 20_000).names
    )
    eighty = complete_funded_deal(platform, campaign_id, 15_000)
    assert [d["thresholdPercent"] for d in eighty.all_data("campaign.budget_threshold")] == [80]
    hundred = complete_funded_deal(platform, campaign_id, 15_000)  # 100 percent exactly
    assert [d["thresholdPercent"] for d in hundred.all_data("campaign.budget_threshold")] == [100]
    over = complete_funded_deal(platform, campaign_id, 5_000)  # over budget: nothing new
    assert "campaign.budget_threshold" not in over.names

    assert thresholds(platform) == [50, 80, 100]
    assert reader.campaign(campaign_id)["remainingMinor"] == -5_000


def test_one_release_crossing_two_thresholds_announces_both(platform, reader):
    campaign_id = platform.campaign(budget_minor=100_000)

    change = complete_funded_deal(platform, campaign_id, 85_000)

    assert change.names == [
        "escrow.released",
        "campaign.budget_threshold",
        "campaign.budget_threshold",
        "deal.completed",
        "deal.status_changed",
    ]
    both = change.all_data("campaign.budget_threshold")
    assert [d["thresholdPercent"] for d in both] == [50, 80]
    assert {d["spentMinor"] for d in both} == {85_000}
    assert_events_show_what_the_api_shows(reader, change)

    complete_funded_deal(platform, campaign_id, 20_000)
    assert thresholds(platform) == [50, 80, 100]


def test_refunds_are_not_spend(platform):
    campaign_id = platform.campaign(budget_minor=100_000)
    deal_id = platform.accepted(campaign_id, 90_000)
    platform.do(cancel_deal, deal_id)
    assert thresholds(platform) == []


def test_threshold_event_shows_the_campaign_as_the_api_does_after_a_split(platform, reader):
    """A per-click deal that earned less than it held: the threshold its release crosses is
    announced with the campaign as the read API shows it once the change is committed (the rest
    of the hold refunded, so nothing committed)."""
    campaign_id = platform.campaign(
        pricing_model="per_click", click_rate_minor=10, budget_minor=10_000
    )
    deal_id = platform.accepted(campaign_id, 8_000)
    platform.verified(deal_id, clicks=600)  # earns 6_000 of the 8_000 held

    change = platform.do(complete_deal, deal_id)

    assert [d["thresholdPercent"] for d in change.all_data("campaign.budget_threshold")] == [50]
    campaign = reader.campaign(campaign_id)
    assert (campaign["spentMinor"], campaign["committedMinor"]) == (6_000, 0)
    assert record_part(change.data("campaign.budget_threshold")) == campaign


# ---------------------------------------------------------------------------------------------
# Refused changes change nothing


def _accept_declined(p: Platform):
    deal_id = p.offer(p.campaign())
    p.do(decline_deal, deal_id)
    return lambda: accept_deal(deal_id)


def _decline_accepted(p: Platform):
    deal_id = p.accepted(p.campaign())
    return lambda: decline_deal(deal_id)


def _verify_twice(p: Platform):
    deal_id = p.accepted(p.campaign())
    placement_id = p.verified(deal_id)
    return lambda: verify_placement(placement_id)


def _release_released(p: Platform):
    deal_id = p.accepted(p.campaign())
    p.verified(deal_id)
    p.do(complete_deal, deal_id)
    [hold_id] = p.hold_ids(deal_id)
    return lambda: release_escrow(hold_id)


def _refund_released(p: Platform):
    deal_id = p.accepted(p.campaign())
    p.verified(deal_id)
    p.do(complete_deal, deal_id)
    [hold_id] = p.hold_ids(deal_id)
    return lambda: refund_escrow(hold_id)


def _complete_unverified(p: Platform):
    deal_id = p.accepted(p.campaign())
    p.submit(deal_id)
    return lambda: complete_deal(deal_id)


def _complete_accepted(p: Platform):
    deal_id = p.accepted(p.campaign())
    return lambda: complete_deal(deal_id)


def _complete_twice(p: Platform):
    deal_id = p.accepted(p.campaign())
    p.verified(deal_id)
    p.do(complete_deal, deal_id)
    return lambda: complete_deal(deal_id)


def _cancel_completed(p: Platform):
    deal_id = p.accepted(p.campaign())
    p.verified(deal_id)
    p.do(complete_deal, deal_id)
    return lambda: cancel_deal(deal_id)


def _dispute_offer(p: Platform):
    deal_id = p.offer(p.campaign())
    return lambda: dispute_deal(deal_id)


def _resolve_undisputed(p: Platform):
    deal_id = p.accepted(p.campaign())
    return lambda: resolve_dispute(deal_id, outcome="creator")


def _submit_to_offer(p: Platform):
    deal_id = p.offer(p.campaign())
    return lambda: submit_placement(deal_id=deal_id, platform="instagram", post_url=POST_URL)


def _submit_to_cancelled(p: Platform):
    deal_id = p.accepted(p.campaign())
    p.do(cancel_deal, deal_id)
    return lambda: submit_placement(deal_id=deal_id, platform="instagram", post_url=POST_URL)


def _hold_fully_funded(p: Platform):
    deal_id = p.accepted(p.campaign())
    return lambda: hold_escrow(deal_id)


def _hold_for_offer(p: Platform):
    deal_id = p.offer(p.campaign())
    return lambda: hold_escrow(deal_id, amount_minor=1_000)


def _publish_twice(p: Platform):
    campaign_id = p.campaign()
    return lambda: publish_campaign(campaign_id)


def _complete_cancelled_campaign(p: Platform):
    campaign_id = p.campaign()
    p.accepted(campaign_id)
    p.do(cancel_campaign, campaign_id)
    return lambda: complete_campaign(campaign_id)


def _cancel_completed_campaign(p: Platform):
    campaign_id = p.campaign()
    p.offer(campaign_id)
    p.do(complete_campaign, campaign_id)
    return lambda: cancel_campaign(campaign_id)


def _offer_on_draft(p: Platform):
    campaign_id = p.campaign(publish=False)
    return lambda: offer_deal(
        campaign_id=campaign_id, creator_handle="@early", agreed_amount_minor=1_000
    )


CONFLICTS = [
    _accept_declined,
    _decline_accepted,
    _verify_twice,
    _release_released,
    _refund_released,
    _complete_unverified,
    _complete_accepted,
    _complete_twice,
    _cancel_completed,
    _dispute_offer,
    _resolve_undisputed,
    _submit_to_offer,
    _submit_to_cancelled,
    _hold_fully_funded,
    _hold_for_offer,
    _publish_twice,
    _complete_cancelled_campaign,
    _cancel_completed_campaign,
    _offer_on_draft,
]


@pytest.mark.parametrize("case", CONFLICTS, ids=lambda case: case.__name__.strip("_"))
def test_an_invalid_transition_is_a_conflict_and_changes_nothing(platform, case):
    attempt = case(platform)
    before = platform.world()

    with platform.app.app_context():
        with pytest.raises(Conflict):
            attempt()
        db.session.commit()  # even a caller that commits what is left has nothing half-done

    assert platform.world() == before


def _campaign_kwargs(**changes) -> dict:
    start = utcnow()
    return {
        "name": "Harmattan Glow launch",
        "pricing_model": "fixed_fee",
        "currency": "NGN",
        "budget_minor": 100_000,
        "starts_at": start,
        "ends_at": start + timedelta(days=30),
        **changes,
    }


def _bad_campaign(field: str, **changes):
    def case(p: Platform):
        return lambda: create_campaign(brand_id=p.brand, **_campaign_kwargs(**changes))

    case.__name__ = f"campaign_{field}"
    return field, case


def _bad_offer(field: str, **changes):
    def case(p: Platform):
        campaign_id = p.campaign()
        kwargs = {"creator_handle": "@adaeze", "agreed_amount_minor": 1_000, **changes}
        return lambda: offer_deal(campaign_id=campaign_id, **kwargs)

    case.__name__ = f"offer_{field}"
    return field, case


def _bad_placement(field: str, **changes):
    def case(p: Platform):
        deal_id = p.accepted(p.campaign())
        kwargs = {"platform": "instagram", "post_url": POST_URL, **changes}
        return lambda: submit_placement(deal_id=deal_id, **kwargs)

    case.__name__ = f"placement_{field}"
    return field, case


def _negative_clicks(p: Platform):
    placement_id = p.verified(p.accepted(p.campaign()))
    return lambda: update_placement_metrics(placement_id, clicks=-1)


def _unknown_outcome(p: Platform):
    deal_id = p.accepted(p.campaign())
    p.do(dispute_deal, deal_id)
    return lambda: resolve_dispute(deal_id, outcome="nobody")


def _unknown_kyb_outcome(p: Platform):
    return lambda: complete_kyb_verification(p.brand, kyb_status="approved")


def _zero_hold(p: Platform):
    deal_id = p.accepted(p.campaign())
    return lambda: hold_escrow(deal_id, amount_minor=0)


INVALID = [
    _bad_campaign("name", name="   "),
    _bad_campaign("pricingModel", pricing_model="per_view"),
    _bad_campaign("currency", currency="EUR"),
    _bad_campaign("budgetMinor", budget_minor=0),
    _bad_campaign("endsAt", ends_at=utcnow() - timedelta(days=1)),
    _bad_campaign("clickRateMinor", pricing_model="per_click"),
    _bad_campaign("clickRateMinor", click_rate_minor=25),
    _bad_offer("creatorHandle", creator_handle=" "),
    _bad_offer("agreedAmountMinor", agreed_amount_minor=0),
    _bad_offer("placementsRequired", placements_required=0),
    _bad_placement("platform", platform="myspace"),
    _bad_placement("postUrl", post_url="ftp://example.com/post"),
    _bad_placement("postUrl", post_url="not a url"),
    ("clicks", _negative_clicks),
    ("outcome", _unknown_outcome),
    ("kybStatus", _unknown_kyb_outcome),
    ("amountMinor", _zero_hold),
]


@pytest.mark.parametrize(
    ("field", "case"),
    INVALID,
    ids=[f"{case.__name__.strip('_')}-{field}" for field, case in INVALID],
)
def test_invalid_input_is_a_validation_error_and_changes_nothing(platform, field, case):
    attempt = case(platform)
    before = platform.world()

    with platform.app.app_context():
        with pytest.raises(ValidationFailed) as raised:
            attempt()
        db.session.commit()

    assert field in raised.value.errors
    assert platform.world() == before


def test_a_change_on_an_accepted_deal_with_a_bad_placement_does_not_start_it(platform, reader):
    deal_id = platform.accepted(platform.campaign())
    with platform.app.app_context(), pytest.raises(ValidationFailed):
        submit_placement(deal_id=deal_id, platform="myspace", post_url=POST_URL)
    assert reader.deal(deal_id)["status"] == "accepted"


# ---------------------------------------------------------------------------------------------
# Settled deals stay settled


def test_clicks_after_a_per_click_deal_completed_do_not_reopen_its_settlement(platform, reader):
    """Completing a deal pays what is due and refunds the rest of its escrow; later clicks on
    its post are measured, but must not leave a completed deal owing money nothing holds."""
    campaign_id = platform.campaign(pricing_model="per_click", click_rate_minor=25)
    deal_id = platform.accepted(campaign_id, 10_000)
    placement_id = platform.verified(deal_id, clicks=200)  # 5_000 due
    platform.do(complete_deal, deal_id)
    settled = reader.deal(deal_id)

    change = platform.do(update_placement_metrics, placement_id, clicks=400)

    assert change.names == ["placement.metrics_updated"]
    assert reader.placement(placement_id)["clicks"] == 400
    deal = reader.deal(deal_id)
    assert deal["settlement"]["outstandingMinor"] == 0, deal["settlement"]
    assert deal["settlement"] == settled["settlement"]


def test_verifying_a_post_of_a_cancelled_deal_does_not_make_it_owe(platform, reader):
    deal_id = platform.accepted(platform.campaign())
    placement_id = platform.submit(deal_id)
    platform.do(cancel_deal, deal_id)
    cancelled = reader.deal(deal_id)

    with platform.app.app_context():
        with contextlib.suppress(Conflict):  # refusing is as good as ignoring it
            verify_placement(placement_id)
        db.session.commit()

    deal = reader.deal(deal_id)
    assert deal["settlement"] == cancelled["settlement"], deal["settlement"]


# ---------------------------------------------------------------------------------------------
# Atomicity: an event exists exactly when its change was committed


def test_a_rolled_back_change_leaves_no_record_and_no_event(app, platform):
    campaign_id = platform.campaign()
    deal_id = platform.offer(campaign_id)
    before = platform.world()

    with app.app_context():
        accept_deal(deal_id)
        placement = submit_placement(deal_id=deal_id, platform="instagram", post_url=POST_URL)
        placement_id = placement.id
        db.session.flush()
        assert (
            db.session.scalar(  # written, in this transaction only
                select(func.count())
                .select_from(WebhookEvent)
                .where(WebhookEvent.brand_id == platform.brand)
            )
            == len(before["events"]) + 5
        )
        db.session.rollback()

    assert platform.world() == before
    with app.app_context():
        assert db.session.get(Placement, placement_id) is None


def test_an_event_is_visible_only_with_its_change(app, platform, reader):
    campaign_id = platform.campaign(publish=False)

    def committed_view() -> tuple[str, int]:
        with app.app_context(), db.engine.connect() as other:  # another connection
            status = other.execute(
                text("SELECT status FROM campaigns WHERE id = :id"), {"id": campaign_id}
            ).scalar_one()
            events = other.execute(
                text("SELECT count(*) FROM webhook_events WHERE brand_id = :b"),
                {"b": platform.brand},
            ).scalar_one()
        return status, events

    with app.app_context():
        publish_campaign(campaign_id)
        db.session.flush()
        assert committed_view() == ("draft", 0)
        db.session.commit()

    assert committed_view() == ("active", 1)
    assert reader.campaign(campaign_id)["status"] == "active"
    [event] = platform.events()
    assert event["type"] == "campaign.published"


# ---------------------------------------------------------------------------------------------
# The catalogue's samples are the real shapes


def shape(value):
    """The keys of a JSON value, recursively through objects (values themselves ignored)."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    return None


def every_platform_event(platform: Platform) -> list[dict]:
    """Drive the platform through every change it announces; all the events."""
    platform.do(complete_kyb_verification, platform.brand, kyb_status="verified")
    fixed = platform.campaign(budget_minor=100_000)
    completed = platform.accepted(fixed, 60_000)
    platform.verified(completed, clicks=10)
    platform.do(complete_deal, completed)  # released, threshold, completed
    platform.do(decline_deal, platform.offer(fixed))
    platform.do(expire_deal, platform.offer(fixed))
    disputed = platform.accepted(fixed, 1_001)
    platform.submit(disputed)
    platform.do(dispute_deal, disputed)
    platform.do(resolve_dispute, disputed, outcome="split")
    platform.do(cancel_deal, platform.accepted(fixed, 5_000))  # refunded, cancelled
    platform.offer(fixed)
    platform.do(complete_campaign, fixed)
    per_click = platform.campaign(pricing_model="per_click", click_rate_minor=5, currency="USD")
    platform.accepted(per_click, 2_000)
    platform.do(cancel_campaign, per_click)
    return platform.events()


def test_catalogue_samples_have_the_keys_of_the_real_events(platform):
    produced = every_platform_event(platform)

    names = {event["type"] for event in produced}
    assert names == set(EVENT_NAMES) - NOT_PLATFORM_EVENTS  # the walk covers every one
    contract = contract_of(platform.app)  # and each is what the document's webhooks state
    for event in produced:
        assert shape(event["data"]) == shape(sample_data(event["type"])), event["type"]
        assert contract.body_problems(event) == [], event["type"]


# ---------------------------------------------------------------------------------------------
# End to end: `flask demo simulate` reaches a subscribed endpoint, signed


SUBSCRIBED = [
    "placement.verified",
    "escrow.released",
    "campaign.budget_threshold",
    "deal.completed",
]


def no_more_requests(receiver: Receiver, count: int, within: float) -> None:
    try:
        receiver.wait_for(count + 1, timeout=within)
    except AssertionError:
        return
    extra = [r.headers.get("X-Service-Event") for r in receiver.received[count:]]
    raise AssertionError(f"unexpected request(s) beyond the first {count}: {extra}")


def test_demo_simulate_events_reach_a_subscribed_endpoint_signed(
    app, client, runner, make_key, receiver, webhook_worker
):
    seeded = runner.invoke(args=["demo", "seed"], catch_exceptions=False)
    brand_id = json.loads(seeded.stdout)["brandId"]
    key = make_key(brand_id, scopes=("read", "write"))
    response = client.post(
        f"/api/v1/brand/{brand_id}/webhook/register-endpoint",
        json={"url": receiver.url, "events": SUBSCRIBED},
        headers={"X-Api-Key": key},
    )
    endpoint = assert_success(response, 201)
    receiver.secrets = [endpoint["signingSecret"]]

    printed: list[dict] = []
    for _ in range(2):  # a placement verified, then its deal completed
        result = runner.invoke(args=["demo", "simulate", "--brand", brand_id])
        assert result.exit_code == 0, result.output
        output = json.loads(result.stdout)
        assert set(output) == {"brandId", "step", "events"}
        assert output["brandId"] == brand_id and output["step"]
        printed.extend(output["events"])

    assert [e["type"] for e in printed] == [
        "placement.verified",
        "placement.metrics_updated",
        "escrow.released",
        "campaign.budget_threshold",
        "deal.completed",
        "deal.status_changed",
    ]
    expected = [e for e in printed if e["type"] in SUBSCRIBED]
    received = receiver.wait_for(len(expected), timeout=20)
    no_more_requests(receiver, len(expected), within=1.5)  # unsubscribed events stay home

    by_event = {request.json["id"]: request for request in received}
    assert set(by_event) == {e["id"] for e in expected}
    with app.app_context():
        stored = dict(
            db.session.execute(
                select(WebhookEvent.id, WebhookEvent.body).where(
                    WebhookEvent.id.in_([e["id"] for e in expected])
                )
            ).all()
        )
    contract = contract_of(app)
    for event in expected:
        request = by_event[event["id"]]
        assert request.signature_valid, request.headers
        contract.assert_delivery(request.json, request.headers)
        assert request.headers["X-Service-Event"] == event["type"] == request.json["type"]
        assert request.headers["X-Service-Delivery"].startswith("whd_")
        assert request.json["brandId"] == brand_id
        assert request.body.decode() == stored[event["id"]]
    assert len({r.headers["X-Service-Delivery"] for r in received}) == len(expected)


# ---------------------------------------------------------------------------------------------
# Tracked links


def test_link_creation_and_clicks_are_counted_silently(platform, reader):
    from services.platform_changes.tracked_links import create_tracked_link, record_link_clicks

    campaign_id = platform.campaign(currency="USD")
    deal_id = platform.accepted(campaign_id)
    before = len(platform.events())
    link_id = platform.do(
        create_tracked_link,
        campaign_id=campaign_id,
        deal_id=deal_id,
        code="GLOW-ADAEZE",
        short_url="https://kola.link/GLOW-ADAEZE",
        destination_url="https://kolanaturals.example/glow",
    ).id
    platform.do(record_link_clicks, link_id, clicks=40)
    platform.do(record_link_clicks, link_id, clicks=2)

    link = reader.get(f"tracked-link/{link_id}")
    assert (link["code"], link["dealId"], link["currency"]) == ("GLOW-ADAEZE", deal_id, "USD")
    assert (link["clicks"], link["conversions"], link["conversionValueMinor"]) == (42, 0, 0)
    assert link["lastClickedAt"] is not None
    assert len(platform.events()) == before  # SPEC 6 has no link events

    with pytest.raises(Conflict):  # codes are global: they are short URL paths
        platform.do(
            create_tracked_link,
            campaign_id=campaign_id,
            code="GLOW-ADAEZE",
            short_url="https://kola.link/GLOW-ADAEZE",
            destination_url="https://kolanaturals.example/glow",
        )
    with pytest.raises(NotFound):
        platform.do(record_link_clicks, "lnk_missing", clicks=1)
    with pytest.raises(ValidationFailed):
        platform.do(record_link_clicks, link_id, clicks=0)
    with pytest.raises(ValidationFailed):
        platform.do(
            create_tracked_link,
            campaign_id=campaign_id,
            code="no spaces",
            short_url="https://kola.link/x",
            destination_url="https://kolanaturals.example/glow",
        )
