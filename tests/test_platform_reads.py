"""The read-only platform routes (SPEC sections 1-2, CONTRACT sections 3-4): campaigns, deals
with their escrow snapshot and settlement totals, tracked links, placements, escrow holds and
the workspace. Records are built through `services.platform_changes`, the way the platform's changes
arrive, and every answer is checked field by field: filters, paging, brand isolation,
authentication, secrets, and the demo workspace."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from models.campaign import PER_CLICK
from services.platform_changes.campaigns import cancel_campaign, complete_campaign, pause_campaign
from services.platform_changes.deals import accept_deal, cancel_deal, complete_deal, decline_deal
from services.platform_changes.placements import verify_placement
from services.platform_changes.workspace import complete_kyb_verification
from tests.helpers import assert_error, assert_success
from tests.platform_factory import PlatformFactory

# --- the records' fields (CONTRACT section 4; SPEC leaves them "not shown") ----------------------

CAMPAIGN_FIELDS = {
    "id",
    "name",
    "status",
    "pricingModel",
    "clickRateMinor",
    "currency",
    "budgetMinor",
    "spentMinor",
    "committedMinor",
    "remainingMinor",
    "startsAt",
    "endsAt",
    "publishedAt",
    "completedAt",
    "cancelledAt",
    "createdAt",
    "updatedAt",
}
DEAL_FIELDS = {
    "id",
    "campaignId",
    "creatorHandle",
    "status",
    "agreedAmountMinor",
    "currency",
    "escrow",
    "settlement",
    "acceptedAt",
    "completedAt",
    "createdAt",
    "updatedAt",
}
ESCROW_FIELDS = {"heldMinor", "releasedMinor", "refundedMinor", "currency"}
SETTLEMENT_FIELDS = {
    "verifiedPlacements",
    "placementsRequired",
    "amountDueMinor",
    "amountSettledMinor",
    "outstandingMinor",
    "currency",
}
LINK_FIELDS = {
    "id",
    "campaignId",
    "dealId",
    "code",
    "shortUrl",
    "destinationUrl",
    "clicks",
    "conversions",
    "conversionValueMinor",
    "currency",
    "lastClickedAt",
    "createdAt",
}
PLACEMENT_FIELDS = {
    "id",
    "campaignId",
    "dealId",
    "platform",
    "postUrl",
    "clicks",
    "submittedAt",
    "verifiedAt",
    "metricsUpdatedAt",
}
HOLD_FIELDS = {
    "id",
    "dealId",
    "campaignId",
    "amountMinor",
    "currency",
    "status",
    "heldAt",
    "releasedAt",
    "refundedAt",
}
WORKSPACE_FIELDS = {
    "brandId",
    "name",
    "plan",
    "kybStatus",
    "subscriptionPeriod",
    "caller",
    "createdAt",
}
PERIOD_FIELDS = {"start", "end"}
CALLER_FIELDS = {"keyId", "scopes"}
LIST_ENVELOPE_FIELDS = {"status", "statusCode", "message", "data", "requestId", "meta"}

# kind: (list path, key of the list in `data`, get path, record fields, id prefix)
KINDS = {
    "campaigns": ("/campaigns", "campaigns", "/campaigns/{}", CAMPAIGN_FIELDS, "cmp_"),
    "deals": ("/deals", "deals", "/deals/{}", DEAL_FIELDS, "deal_"),
    "links": ("/tracked-link/fetch-links", "links", "/tracked-link/{}", LINK_FIELDS, "lnk_"),
    "placements": (
        "/placement/fetch-placements",
        "placements",
        "/placement/{}",
        PLACEMENT_FIELDS,
        "plc_",
    ),
    "holds": ("/escrow/fetch-holds", "holds", "/escrow/{}", HOLD_FIELDS, "esc_"),
}
LIST_KINDS = list(KINDS)
# Every read route, named: the five lists, the five gets and the workspace.
ROUTES = [*LIST_KINDS, *(f"{kind}/{{id}}" for kind in LIST_KINDS), "workspace"]

T0 = datetime(2025, 11, 3, 9, 0, tzinfo=UTC)
HOOK_URL = "https://hooks.brand-example.invalid/x"
ISO_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


def t(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


# --- calling the API ---------------------------------------------------------------------------


def key_header(secret: str) -> dict:
    return {"X-Api-Key": secret}


def call(client, brand_id: str, path: str, key: str | None = None, headers=None, **query):
    sent = dict(headers or {})
    if key is not None:
        sent.update(key_header(key))
    return client.get(f"/api/v1/brand/{brand_id}{path}", query_string=query, headers=sent)


def listing(client, brand_id: str, key: str, kind: str, **query) -> tuple[list[dict], dict]:
    path, name, *_ = KINDS[kind]
    response = call(client, brand_id, path, key, **query)
    data = assert_success(response)
    assert set(response.get_json()) == LIST_ENVELOPE_FIELDS
    assert set(data) == {name}
    return data[name], response.get_json()["meta"]


def listed_ids(client, brand_id: str, key: str, kind: str, **query) -> list[str]:
    return [item["id"] for item in listing(client, brand_id, key, kind, **query)[0]]


def fetch_one(client, brand_id: str, key: str, kind: str, record_id: str) -> dict:
    response = call(client, brand_id, KINDS[kind][2].format(record_id), key)
    data = assert_success(response)
    assert "meta" not in response.get_json()
    return data


def route_path(route: str, ids: dict[str, str]) -> str:
    """The path of a named route (see ROUTES), with `ids[kind]` for a get."""
    if route == "workspace":
        return "/workspace"
    if route.endswith("/{id}"):
        kind = route.removesuffix("/{id}")
        return KINDS[kind][2].format(ids[kind])
    return KINDS[route][0]


def contract_meta(meta: dict) -> dict:
    """The paging fields CONTRACT section 3 promises (the service may add more)."""
    return {name: meta.get(name) for name in ("page", "limit", "total", "totalPages", "hasNext")}


def parsed(value):
    """Timestamps (ISO 8601 UTC ending in `Z`) as aware datetimes, everywhere in a record; a
    timestamp in any other form stays a string and so never equals an expected datetime."""
    if isinstance(value, dict):
        return {name: parsed(item) for name, item in value.items()}
    if isinstance(value, list):
        return [parsed(item) for item in value]
    if isinstance(value, str) and ISO_Z.match(value):
        return datetime.fromisoformat(value.removesuffix("Z") + "+00:00")
    return value


# --- the data ----------------------------------------------------------------------------------


@pytest.fixture
def factory(app) -> PlatformFactory:
    return PlatformFactory(app)


@dataclass
class Scenario:
    """One brand's campaigns in every status, deals, placements, links and holds (names below),
    and another brand with one record of each kind (`oc`, `od`, `op`, `ol`, `oh`)."""

    brand: str
    other: str
    ids: dict[str, str] = field(default_factory=dict)
    created: dict[str, datetime] = field(default_factory=dict)

    def add(self, name: str, record_id: str, at: datetime) -> str:
        self.ids[name] = record_id
        self.created[name] = at
        return record_id

    def newest_first(self, names) -> list[str]:
        """Record ids in the order every list promises: created_at desc, then id desc."""
        ordered = sorted(names, key=lambda name: (self.created[name], self.ids[name]), reverse=True)
        return [self.ids[name] for name in ordered]

    def value(self, value: str) -> str:
        """A record name as its id; anything else (a status, a code) as itself."""
        return self.ids.get(value, value)


def build_scenario(f: PlatformFactory, brand: str, other: str) -> Scenario:
    """Built in time order, so that each record's `updatedAt` is its latest change."""
    s = Scenario(brand=brand, other=other)
    # Campaigns: cA and cB active, cC draft, cD paused, cE cancelled, cF completed.
    cA = s.add(
        "cA",
        f.campaign(
            brand,
            at=t(0),
            name="Harmattan Glow launch",
            budget_minor=5_000_000,
            published_at=t(10),
        ),
        t(0),
    )
    cB = s.add(
        "cB",
        f.campaign(
            brand,
            at=t(1),
            name="Shea gift sets: US diaspora",
            currency="USD",
            pricing_model=PER_CLICK,
            click_rate_minor=25,
            budget_minor=600_000,
            published_at=t(11),
        ),
        t(1),
    )
    s.add("cC", f.campaign(brand, at=t(2), name="Detty December teaser"), t(2))
    cD = s.add(
        "cD",
        f.campaign(
            brand,
            at=t(3),
            name="Ramadan hampers",
            pricing_model=PER_CLICK,
            click_rate_minor=5_000,
            published_at=t(12),
        ),
        t(3),
    )
    f.apply(pause_campaign, cD, now=t(13))
    cE = s.add("cE", f.campaign(brand, at=t(4), name="Valentine", published_at=t(14)), t(4))
    f.apply(cancel_campaign, cE, now=t(15))
    cF = s.add("cF", f.campaign(brand, at=t(5), name="Back to school", published_at=t(16)), t(5))
    f.apply(complete_campaign, cF, now=t(17))
    s.add("lA", f.link(cA, "GLOW-ALL", at=t(10)), t(10))
    s.add("lB", f.link(cB, "SHEAUS-ALL", at=t(11)), t(11))

    # Deals: d1 offered, d2 and d5 in progress, d3 completed, d4 declined, d6 cancelled.
    s.add("d1", f.deal(cA, at=t(20), handle="@chidi.daily", amount_minor=300_000), t(20))
    d2 = s.add(
        "d2",
        f.deal(
            cA,
            at=t(21),
            handle="@zainab.glows",
            amount_minor=400_000,
            placements_required=2,
            accepted_at=t(30),
        ),
        t(21),
    )
    s.add("h2", f.hold_of(d2), t(30))
    d3 = s.add(
        "d3",
        f.deal(cA, at=t(22), handle="@adaeze.cooks", amount_minor=250_000, accepted_at=t(31)),
        t(22),
    )
    s.add("h3", f.hold_of(d3), t(31))
    d4 = s.add("d4", f.deal(cA, at=t(23), handle="@mide.makeup", amount_minor=380_000), t(23))
    f.apply(decline_deal, d4, now=t(32))
    d5 = s.add(
        "d5",
        f.deal(cB, at=t(24), handle="@naija.in.nyc", amount_minor=50_000, accepted_at=t(33)),
        t(24),
    )
    s.add("h5", f.hold_of(d5), t(33))
    d6 = s.add(
        "d6",
        f.deal(cB, at=t(25), handle="@kofi.in.dc", amount_minor=40_000, accepted_at=t(34)),
        t(25),
    )
    s.add("h6", f.hold_of(d6), t(34))
    s.add("lA2", f.link(cA, "GLOW-ZAINAB", at=t(35), deal_id=d2), t(35))
    s.add("lB5", f.link(cB, "SHEAUS-NYC", at=t(36), deal_id=d5), t(36))

    # Placements: p1 verified with clicks, p2 not verified (d2); p3 verified (d3); p4 (d5).
    p1 = s.add(
        "p1",
        f.placement(d2, at=t(40), post_url="https://www.instagram.com/p/ZAINAB1/"),
        t(40),
    )
    s.add(
        "p2",
        f.placement(
            d2, at=t(41), platform="tiktok", post_url="https://www.tiktok.com/@zainab/video/2"
        ),
        t(41),
    )
    p3 = s.add(
        "p3", f.placement(d3, at=t(42), post_url="https://www.instagram.com/p/ADAEZE1/"), t(42)
    )
    p4 = s.add(
        "p4",
        f.placement(
            d5, at=t(43), platform="youtube", post_url="https://www.youtube.com/watch?v=NYC1"
        ),
        t(43),
    )
    f.apply(verify_placement, p1, now=t(50))
    f.apply(verify_placement, p3, now=t(51))
    f.apply(verify_placement, p4, now=t(52))
    f.metrics(p1, clicks=500, at=t(60))
    f.metrics(p4, clicks=1000, at=t(61))

    # Escrow: an extra hold on d2 released; d3 completed (released); d6 cancelled (refunded).
    h2x = s.add("h2x", f.hold(d2, at=t(70), amount_minor=10_000), t(70))
    f.release(h2x, at=t(71))
    f.apply(complete_deal, d3, now=t(80))
    f.apply(cancel_deal, d6, now=t(81))
    f.clicks(s.ids["lA"], 120, at=t(90))
    f.clicks(s.ids["lA2"], 30, at=t(91))

    # The other brand: one record of each kind.
    oc = s.add("oc", f.campaign(other, at=t(0), name="Other launch", published_at=t(10)), t(0))
    od = s.add("od", f.deal(oc, at=t(20), accepted_at=t(30)), t(20))
    s.add("oh", f.hold_of(od), t(30))
    s.add("op", f.placement(od, at=t(40), post_url="https://x.com/other/status/1"), t(40))
    s.add("ol", f.link(oc, "OTHER-DEAL", at=t(35), deal_id=od), t(35))
    return s


@pytest.fixture
def other_brand(make_brand) -> str:
    return make_brand("Other Brand")


@pytest.fixture
def other_key(other_brand, make_key) -> str:
    return make_key(other_brand, scopes=("read",), name="other")


@pytest.fixture
def scenario(factory, brand, other_brand) -> Scenario:
    return build_scenario(factory, brand, other_brand)


def one_of_each(f: PlatformFactory, brand_id: str, code: str) -> dict[str, str]:
    """A published campaign with an accepted deal (so a hold), a placement and a link."""
    campaign = f.campaign(brand_id, at=t(0), published_at=t(1))
    deal = f.deal(campaign, at=t(2), accepted_at=t(3))
    return {
        "campaigns": campaign,
        "deals": deal,
        "holds": f.hold_of(deal),
        "placements": f.placement(deal, at=t(4)),
        "links": f.link(campaign, code, at=t(5), deal_id=deal),
    }


@pytest.fixture
def world(factory, brand) -> dict[str, str]:
    return one_of_each(factory, brand, "WORLD-1")


@pytest.fixture
def other_world(factory, other_brand) -> dict[str, str]:
    return one_of_each(factory, other_brand, "OTHER-1")


# --- records and their values ------------------------------------------------------------------


def test_campaign_records_carry_money_in_minor_units_and_their_lifecycle(
    client, brand, read_key, scenario
):
    s = scenario
    listed, _ = listing(client, brand, read_key, "campaigns")
    assert {item["id"] for item in listed} == {
        s.ids[n] for n in ("cA", "cB", "cC", "cD", "cE", "cF")
    }
    for item in listed:
        assert set(item) == CAMPAIGN_FIELDS
        assert item["id"].startswith("cmp_")
    by_id = {item["id"]: item for item in listed}
    glow = {
        "id": s.ids["cA"],
        "name": "Harmattan Glow launch",
        "status": "active",
        "pricingModel": "fixed_fee",
        "clickRateMinor": None,
        "currency": "NGN",
        "budgetMinor": 5_000_000,
        # released: 10,000 of d2's extra hold and d3's 250,000; held: d2's 400,000
        "spentMinor": 260_000,
        "committedMinor": 400_000,
        "remainingMinor": 4_340_000,
        "startsAt": t(0) + timedelta(days=1),
        "endsAt": t(0) + timedelta(days=31),
        "publishedAt": t(10),
        "completedAt": None,
        "cancelledAt": None,
        "createdAt": t(0),
        "updatedAt": t(80),
    }
    shea = {
        **glow,
        "id": s.ids["cB"],
        "name": "Shea gift sets: US diaspora",
        "pricingModel": "per_click",
        "clickRateMinor": 25,
        "currency": "USD",
        "budgetMinor": 600_000,
        "spentMinor": 0,
        "committedMinor": 50_000,  # d5's hold; d6's was refunded
        "remainingMinor": 550_000,
        "startsAt": t(1) + timedelta(days=1),
        "endsAt": t(1) + timedelta(days=31),
        "publishedAt": t(11),
        "createdAt": t(1),
        "updatedAt": t(81),
    }
    assert parsed(by_id[s.ids["cA"]]) == glow
    assert parsed(by_id[s.ids["cB"]]) == shea
    assert parsed(fetch_one(client, brand, read_key, "campaigns", s.ids["cA"])) == glow
    assert parsed(fetch_one(client, brand, read_key, "campaigns", s.ids["cB"])) == shea

    lifecycle = {name: parsed(by_id[s.ids[name]]) for name in ("cC", "cD", "cE", "cF")}
    assert lifecycle["cC"]["status"] == "draft"
    assert lifecycle["cC"]["publishedAt"] is None
    assert lifecycle["cD"]["status"] == "paused"
    assert lifecycle["cD"]["updatedAt"] == t(13)
    assert lifecycle["cE"]["status"] == "cancelled"
    assert lifecycle["cE"]["cancelledAt"] == t(15)
    assert lifecycle["cE"]["completedAt"] is None
    assert lifecycle["cF"]["status"] == "completed"
    assert lifecycle["cF"]["completedAt"] == t(17)
    assert lifecycle["cF"]["cancelledAt"] is None
    for item in lifecycle.values():
        assert item["remainingMinor"] == item["budgetMinor"] == 1_000_000


def test_deal_records_carry_their_escrow_snapshot_and_settlement(client, brand, read_key, scenario):
    s = scenario
    listed, _ = listing(client, brand, read_key, "deals")
    for item in listed:
        assert set(item) == DEAL_FIELDS
        assert set(item["escrow"]) == ESCROW_FIELDS
        assert set(item["settlement"]) == SETTLEMENT_FIELDS
        assert item["id"].startswith("deal_")
    by_id = {item["id"]: parsed(item) for item in listed}
    expected = {
        # in progress: one of two placements verified, 10,000 of an extra hold released
        "d2": {
            "id": s.ids["d2"],
            "campaignId": s.ids["cA"],
            "creatorHandle": "@zainab.glows",
            "status": "in_progress",
            "agreedAmountMinor": 400_000,
            "currency": "NGN",
            "escrow": {
                "heldMinor": 400_000,
                "releasedMinor": 10_000,
                "refundedMinor": 0,
                "currency": "NGN",
            },
            "settlement": {
                "verifiedPlacements": 1,
                "placementsRequired": 2,
                "amountDueMinor": 200_000,
                "amountSettledMinor": 10_000,
                "outstandingMinor": 190_000,
                "currency": "NGN",
            },
            "acceptedAt": t(30),
            "completedAt": None,
            "createdAt": t(21),
            "updatedAt": t(71),
        },
        # completed: everything due released
        "d3": {
            "id": s.ids["d3"],
            "campaignId": s.ids["cA"],
            "creatorHandle": "@adaeze.cooks",
            "status": "completed",
            "agreedAmountMinor": 250_000,
            "currency": "NGN",
            "escrow": {
                "heldMinor": 0,
                "releasedMinor": 250_000,
                "refundedMinor": 0,
                "currency": "NGN",
            },
            "settlement": {
                "verifiedPlacements": 1,
                "placementsRequired": 1,
                "amountDueMinor": 250_000,
                "amountSettledMinor": 250_000,
                "outstandingMinor": 0,
                "currency": "NGN",
            },
            "acceptedAt": t(31),
            "completedAt": t(80),
            "createdAt": t(22),
            "updatedAt": t(80),
        },
        # per click: 1,000 clicks at 25 cents, under the agreed 50,000
        "d5": {
            "id": s.ids["d5"],
            "campaignId": s.ids["cB"],
            "creatorHandle": "@naija.in.nyc",
            "status": "in_progress",
            "agreedAmountMinor": 50_000,
            "currency": "USD",
            "escrow": {
                "heldMinor": 50_000,
                "releasedMinor": 0,
                "refundedMinor": 0,
                "currency": "USD",
            },
            "settlement": {
                "verifiedPlacements": 1,
                "placementsRequired": 1,
                "amountDueMinor": 25_000,
                "amountSettledMinor": 0,
                "outstandingMinor": 25_000,
                "currency": "USD",
            },
            "acceptedAt": t(33),
            "completedAt": None,
            "createdAt": t(24),
            "updatedAt": t(61),
        },
        # cancelled: its hold refunded
        "d6": {
            "id": s.ids["d6"],
            "campaignId": s.ids["cB"],
            "creatorHandle": "@kofi.in.dc",
            "status": "cancelled",
            "agreedAmountMinor": 40_000,
            "currency": "USD",
            "escrow": {
                "heldMinor": 0,
                "releasedMinor": 0,
                "refundedMinor": 40_000,
                "currency": "USD",
            },
            "settlement": {
                "verifiedPlacements": 0,
                "placementsRequired": 1,
                "amountDueMinor": 0,
                "amountSettledMinor": 0,
                "outstandingMinor": 0,
                "currency": "USD",
            },
            "acceptedAt": t(34),
            "completedAt": None,
            "createdAt": t(25),
            "updatedAt": t(81),
        },
        # an offer nobody answered: nothing held, nothing due
        "d1": {
            "id": s.ids["d1"],
            "campaignId": s.ids["cA"],
            "creatorHandle": "@chidi.daily",
            "status": "offered",
            "agreedAmountMinor": 300_000,
            "currency": "NGN",
            "escrow": {"heldMinor": 0, "releasedMinor": 0, "refundedMinor": 0, "currency": "NGN"},
            "settlement": {
                "verifiedPlacements": 0,
                "placementsRequired": 1,
                "amountDueMinor": 0,
                "amountSettledMinor": 0,
                "outstandingMinor": 0,
                "currency": "NGN",
            },
            "acceptedAt": None,
            "completedAt": None,
            "createdAt": t(20),
            "updatedAt": t(20),
        },
    }
    for name, deal in expected.items():
        assert by_id[s.ids[name]] == deal, name
        assert parsed(fetch_one(client, brand, read_key, "deals", s.ids[name])) == deal, name
    assert by_id[s.ids["d4"]]["status"] == "declined"
    assert by_id[s.ids["d4"]]["updatedAt"] == t(32)


def test_link_records_carry_code_short_url_and_counters(client, brand, read_key, scenario):
    s = scenario
    listed, _ = listing(client, brand, read_key, "links")
    for item in listed:
        assert set(item) == LINK_FIELDS
        assert item["id"].startswith("lnk_")
    by_id = {item["id"]: parsed(item) for item in listed}
    campaign_wide = {
        "id": s.ids["lA"],
        "campaignId": s.ids["cA"],
        "dealId": None,
        "code": "GLOW-ALL",
        "shortUrl": "https://kola.link/GLOW-ALL",
        "destinationUrl": "https://kolanaturals.example/?utm_content=GLOW-ALL",
        "clicks": 120,
        "conversions": 0,
        "conversionValueMinor": 0,
        "currency": "NGN",
        "lastClickedAt": t(90),
        "createdAt": t(10),
    }
    never_clicked = {
        "id": s.ids["lB5"],
        "campaignId": s.ids["cB"],
        "dealId": s.ids["d5"],
        "code": "SHEAUS-NYC",
        "shortUrl": "https://kola.link/SHEAUS-NYC",
        "destinationUrl": "https://kolanaturals.example/?utm_content=SHEAUS-NYC",
        "clicks": 0,
        "conversions": 0,
        "conversionValueMinor": 0,
        "currency": "USD",
        "lastClickedAt": None,
        "createdAt": t(36),
    }
    assert by_id[s.ids["lA"]] == campaign_wide
    assert by_id[s.ids["lB5"]] == never_clicked
    assert parsed(fetch_one(client, brand, read_key, "links", s.ids["lA"])) == campaign_wide
    assert parsed(fetch_one(client, brand, read_key, "links", s.ids["lB5"])) == never_clicked
    assert by_id[s.ids["lA2"]]["dealId"] == s.ids["d2"]
    assert by_id[s.ids["lA2"]]["clicks"] == 30
    assert by_id[s.ids["lA2"]]["lastClickedAt"] == t(91)


def test_placement_records_carry_post_url_clicks_and_verification(
    client, brand, read_key, scenario
):
    s = scenario
    listed, _ = listing(client, brand, read_key, "placements")
    for item in listed:
        assert set(item) == PLACEMENT_FIELDS
        assert item["id"].startswith("plc_")
    by_id = {item["id"]: parsed(item) for item in listed}
    verified = {
        "id": s.ids["p1"],
        "campaignId": s.ids["cA"],
        "dealId": s.ids["d2"],
        "platform": "instagram",
        "postUrl": "https://www.instagram.com/p/ZAINAB1/",
        "clicks": 500,
        "submittedAt": t(40),
        "verifiedAt": t(50),
        "metricsUpdatedAt": t(60),
    }
    waiting = {
        "id": s.ids["p2"],
        "campaignId": s.ids["cA"],
        "dealId": s.ids["d2"],
        "platform": "tiktok",
        "postUrl": "https://www.tiktok.com/@zainab/video/2",
        "clicks": 0,
        "submittedAt": t(41),
        "verifiedAt": None,
        "metricsUpdatedAt": None,
    }
    assert by_id[s.ids["p1"]] == verified
    assert by_id[s.ids["p2"]] == waiting
    assert parsed(fetch_one(client, brand, read_key, "placements", s.ids["p1"])) == verified
    assert parsed(fetch_one(client, brand, read_key, "placements", s.ids["p2"])) == waiting
    assert by_id[s.ids["p4"]]["campaignId"] == s.ids["cB"]
    assert by_id[s.ids["p4"]]["clicks"] == 1000


def test_escrow_hold_records_carry_amount_status_and_when(client, brand, read_key, scenario):
    s = scenario
    listed, _ = listing(client, brand, read_key, "holds")
    for item in listed:
        assert set(item) == HOLD_FIELDS
        assert item["id"].startswith("esc_")
    by_id = {item["id"]: parsed(item) for item in listed}
    expected = {
        "h2": {
            "id": s.ids["h2"],
            "dealId": s.ids["d2"],
            "campaignId": s.ids["cA"],
            "amountMinor": 400_000,
            "currency": "NGN",
            "status": "held",
            "heldAt": t(30),
            "releasedAt": None,
            "refundedAt": None,
        },
        "h2x": {
            "id": s.ids["h2x"],
            "dealId": s.ids["d2"],
            "campaignId": s.ids["cA"],
            "amountMinor": 10_000,
            "currency": "NGN",
            "status": "released",
            "heldAt": t(70),
            "releasedAt": t(71),
            "refundedAt": None,
        },
        "h3": {
            "id": s.ids["h3"],
            "dealId": s.ids["d3"],
            "campaignId": s.ids["cA"],
            "amountMinor": 250_000,
            "currency": "NGN",
            "status": "released",
            "heldAt": t(31),
            "releasedAt": t(80),
            "refundedAt": None,
        },
        "h6": {
            "id": s.ids["h6"],
            "dealId": s.ids["d6"],
            "campaignId": s.ids["cB"],
            "amountMinor": 40_000,
            "currency": "USD",
            "status": "refunded",
            "heldAt": t(34),
            "releasedAt": None,
            "refundedAt": t(81),
        },
    }
    assert set(by_id) == {s.ids[name] for name in ("h2", "h2x", "h3", "h5", "h6")}
    for name, hold in expected.items():
        assert by_id[s.ids[name]] == hold, name
        assert parsed(fetch_one(client, brand, read_key, "holds", s.ids[name])) == hold, name


@pytest.mark.parametrize("kind", LIST_KINDS)
def test_every_listed_record_is_the_same_when_fetched_by_id(
    client, brand, read_key, scenario, kind
):
    listed, _ = listing(client, brand, read_key, kind, limit=100)
    assert listed
    for item in listed:
        assert fetch_one(client, brand, read_key, kind, item["id"]) == item
        assert set(item) == KINDS[kind][3]
        for name, value in item.items():
            if name.endswith("At") and value is not None:
                assert ISO_Z.match(value), (name, value)


def test_a_deal_read_follows_acceptance_verification_and_completion(
    client, factory, brand, read_key
):
    campaign = factory.campaign(brand, at=t(0), budget_minor=1_000_000, published_at=t(1))
    deal = factory.deal(campaign, at=t(2), amount_minor=300_000, placements_required=2)

    def read() -> dict:
        return fetch_one(client, brand, read_key, "deals", deal)

    def money(held, released, refunded, verified, due, settled, outstanding) -> tuple:
        return (
            {
                "heldMinor": held,
                "releasedMinor": released,
                "refundedMinor": refunded,
                "currency": "NGN",
            },
            {
                "verifiedPlacements": verified,
                "placementsRequired": 2,
                "amountDueMinor": due,
                "amountSettledMinor": settled,
                "outstandingMinor": outstanding,
                "currency": "NGN",
            },
        )

    def snapshot() -> tuple:
        data = read()
        return data["escrow"], data["settlement"]

    assert snapshot() == money(0, 0, 0, 0, 0, 0, 0)
    factory.apply(accept_deal, deal, now=t(3))
    assert read()["status"] == "accepted"
    assert snapshot() == money(300_000, 0, 0, 0, 0, 0, 0)
    [hold] = listing(client, brand, read_key, "holds", dealId=deal)[0]
    assert (hold["amountMinor"], hold["status"]) == (300_000, "held")

    first = factory.placement(deal, at=t(4))
    assert read()["status"] == "in_progress"
    factory.apply(verify_placement, first, now=t(5))
    assert snapshot() == money(300_000, 0, 0, 1, 150_000, 0, 150_000)
    second = factory.placement(deal, at=t(6), post_url="https://www.instagram.com/p/TWO/")
    assert snapshot() == money(300_000, 0, 0, 1, 150_000, 0, 150_000)  # submitted, not verified
    factory.apply(verify_placement, second, now=t(7))
    assert snapshot() == money(300_000, 0, 0, 2, 300_000, 0, 300_000)

    factory.apply(complete_deal, deal, now=t(8))
    data = read()
    assert data["status"] == "completed"
    assert parsed(data["completedAt"]) == t(8)
    assert (data["escrow"], data["settlement"]) == money(0, 300_000, 0, 2, 300_000, 300_000, 0)
    [hold] = listing(client, brand, read_key, "holds", dealId=deal)[0]
    assert (hold["status"], parsed(hold["releasedAt"])) == ("released", t(8))
    spent = fetch_one(client, brand, read_key, "campaigns", campaign)
    assert (spent["spentMinor"], spent["committedMinor"], spent["remainingMinor"]) == (
        300_000,
        0,
        700_000,
    )


def test_a_per_click_deal_releases_what_clicks_earned_and_refunds_the_rest(
    client, factory, brand, read_key
):
    campaign = factory.campaign(
        brand,
        at=t(0),
        currency="USD",
        pricing_model=PER_CLICK,
        click_rate_minor=25,
        budget_minor=600_000,
        published_at=t(1),
    )
    deal = factory.deal(campaign, at=t(2), amount_minor=50_000, accepted_at=t(3))
    placement = factory.placement(deal, at=t(4))
    factory.apply(verify_placement, placement, now=t(5))
    factory.metrics(placement, clicks=1000, at=t(6))
    assert fetch_one(client, brand, read_key, "deals", deal)["settlement"]["amountDueMinor"] == (
        25_000
    )
    factory.apply(complete_deal, deal, now=t(7))

    data = fetch_one(client, brand, read_key, "deals", deal)
    assert data["escrow"] == {
        "heldMinor": 0,
        "releasedMinor": 25_000,
        "refundedMinor": 25_000,
        "currency": "USD",
    }
    assert data["settlement"] == {
        "verifiedPlacements": 1,
        "placementsRequired": 1,
        "amountDueMinor": 25_000,
        "amountSettledMinor": 25_000,
        "outstandingMinor": 0,
        "currency": "USD",
    }
    holds, meta = listing(client, brand, read_key, "holds", dealId=deal)
    assert meta["total"] == 2
    assert sorted((hold["status"], hold["amountMinor"]) for hold in holds) == [
        ("refunded", 25_000),
        ("released", 25_000),
    ]
    assert {parsed(hold["heldAt"]) for hold in holds} == {t(3)}
    assert {hold["currency"] for hold in holds} == {"USD"}


# --- filters -----------------------------------------------------------------------------------

# (kind, query, the names of the records it must return); record names become their ids.
FILTER_CASES = [
    ("campaigns", {"status": "active"}, {"cA", "cB"}),
    ("campaigns", {"status": "draft"}, {"cC"}),
    ("campaigns", {"status": "paused"}, {"cD"}),
    ("campaigns", {"status": "cancelled"}, {"cE"}),
    ("campaigns", {"status": "completed"}, {"cF"}),
    ("deals", {"status": "offered"}, {"d1"}),
    ("deals", {"status": "in_progress"}, {"d2", "d5"}),
    ("deals", {"status": "completed"}, {"d3"}),
    ("deals", {"status": "declined"}, {"d4"}),
    ("deals", {"status": "cancelled"}, {"d6"}),
    ("deals", {"status": "disputed"}, set()),
    ("deals", {"campaignId": "cA"}, {"d1", "d2", "d3", "d4"}),
    ("deals", {"campaignId": "cB"}, {"d5", "d6"}),
    ("deals", {"campaignId": "cC"}, set()),
    ("deals", {"campaignId": "cA", "status": "in_progress"}, {"d2"}),
    ("deals", {"campaignId": "cB", "status": "completed"}, set()),
    ("links", {"campaignId": "cA"}, {"lA", "lA2"}),
    ("links", {"campaignId": "cB"}, {"lB", "lB5"}),
    ("links", {"dealId": "d2"}, {"lA2"}),
    ("links", {"dealId": "d3"}, set()),
    ("links", {"code": "SHEAUS-NYC"}, {"lB5"}),
    ("links", {"code": "sheaus-nyc"}, set()),  # codes are case-sensitive
    ("links", {"code": "SHEAUS"}, set()),  # exact, not a prefix
    ("links", {"campaignId": "cB", "dealId": "d5"}, {"lB5"}),
    ("links", {"campaignId": "cA", "dealId": "d5"}, set()),
    ("links", {"campaignId": "cA", "code": "SHEAUS-ALL"}, set()),
    ("links", {"campaignId": "cB", "code": "SHEAUS-ALL"}, {"lB"}),
    ("placements", {"campaignId": "cA"}, {"p1", "p2", "p3"}),
    ("placements", {"campaignId": "cB"}, {"p4"}),
    ("placements", {"dealId": "d2"}, {"p1", "p2"}),
    ("placements", {"campaignId": "cA", "dealId": "d3"}, {"p3"}),
    ("placements", {"campaignId": "cB", "dealId": "d2"}, set()),
    ("holds", {"campaignId": "cA"}, {"h2", "h2x", "h3"}),
    ("holds", {"campaignId": "cB"}, {"h5", "h6"}),
    ("holds", {"dealId": "d2"}, {"h2", "h2x"}),
    ("holds", {"status": "held"}, {"h2", "h5"}),
    ("holds", {"status": "released"}, {"h2x", "h3"}),
    ("holds", {"status": "refunded"}, {"h6"}),
    ("holds", {"campaignId": "cA", "status": "released"}, {"h2x", "h3"}),
    ("holds", {"dealId": "d6", "status": "refunded"}, {"h6"}),
    ("holds", {"campaignId": "cB", "status": "released"}, set()),
    ("holds", {"campaignId": "cA", "dealId": "d5"}, set()),
]


def test_filters_return_exactly_the_matching_records_newest_first(
    client, brand, read_key, scenario
):
    """One scenario, every filter of every list (each case named in the failure)."""
    for kind, query, names in FILTER_CASES:
        sent = {name: scenario.value(value) for name, value in query.items()}
        listed, meta = listing(client, brand, read_key, kind, **sent)
        case = (kind, query)
        assert [item["id"] for item in listed] == scenario.newest_first(names), case
        assert meta["total"] == len(names), case
        assert meta["hasNext"] is False, case


def test_unfiltered_lists_hold_every_record_of_the_brand_newest_first(
    client, brand, read_key, scenario
):
    everything = {
        "campaigns": ["cA", "cB", "cC", "cD", "cE", "cF"],
        "deals": ["d1", "d2", "d3", "d4", "d5", "d6"],
        "links": ["lA", "lA2", "lB", "lB5"],
        "placements": ["p1", "p2", "p3", "p4"],
        "holds": ["h2", "h2x", "h3", "h5", "h6"],
    }
    for kind, names in everything.items():
        listed, meta = listing(client, brand, read_key, kind)
        assert [item["id"] for item in listed] == scenario.newest_first(names), kind
        assert meta["total"] == len(names), kind


@pytest.mark.parametrize(
    ("kind", "parameter", "name"),
    [
        ("deals", "campaignId", "oc"),
        ("links", "campaignId", "oc"),
        ("links", "dealId", "od"),
        ("placements", "campaignId", "oc"),
        ("placements", "dealId", "od"),
        ("holds", "campaignId", "oc"),
        ("holds", "dealId", "od"),
    ],
)
def test_a_filter_on_another_brands_record_is_an_empty_page(
    client, brand, read_key, other_key, scenario, kind, parameter, name
):
    record_id = scenario.ids[name]
    # The other brand's own key finds its record with that very filter...
    assert listed_ids(client, scenario.other, other_key, kind, **{parameter: record_id})
    # ...and this brand's key finds nothing, as a success.
    listed, meta = listing(client, brand, read_key, kind, **{parameter: record_id})
    assert listed == []
    assert meta["total"] == 0


@pytest.mark.parametrize(
    ("kind", "parameter", "value"),
    [
        ("deals", "campaignId", "deals"),  # a deal id passed as a campaign id
        ("deals", "campaignId", "foo"),
        ("links", "campaignId", "deals"),
        ("links", "campaignId", "foo"),
        ("links", "dealId", "campaigns"),  # a campaign id passed as a deal id
        ("links", "dealId", "foo"),
        ("placements", "campaignId", "placements"),
        ("placements", "campaignId", "foo"),
        ("placements", "dealId", "campaigns"),
        ("placements", "dealId", "foo"),
        ("holds", "campaignId", "holds"),
        ("holds", "campaignId", "foo"),
        ("holds", "dealId", "links"),
        ("holds", "dealId", "foo"),
        ("holds", "dealId", ""),
    ],
)
def test_a_filter_id_of_the_wrong_kind_is_a_validation_error(
    client, brand, read_key, world, kind, parameter, value
):
    """`value` names a kind whose real id (of this brand) is sent, or is sent as it is."""
    sent = world.get(value, value)
    response = call(client, brand, KINDS[kind][0], read_key, **{parameter: sent})
    body = assert_error(response, 400, "VALIDATION_ERROR")
    assert list(body["errors"]) == [parameter]
    assert body["errors"][parameter]


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("campaigns", "live"),
        ("campaigns", "ACTIVE"),
        ("campaigns", ""),
        ("deals", "open"),
        ("deals", "held"),  # a hold status is not a deal status
        ("holds", "pending"),
        ("holds", "active"),
    ],
)
def test_an_unknown_status_is_a_validation_error(client, brand, read_key, world, kind, value):
    response = call(client, brand, KINDS[kind][0], read_key, status=value)
    body = assert_error(response, 400, "VALIDATION_ERROR")
    assert list(body["errors"]) == ["status"]


@pytest.mark.parametrize(
    ("kind", "parameter"),
    [
        ("campaigns", "bogus"),
        ("campaigns", "campaignId"),  # campaigns are not filtered by campaign
        ("deals", "dealId"),
        ("deals", "campaign_id"),  # the snake_case spelling is not the parameter
        ("links", "status"),
        ("placements", "status"),
        ("placements", "code"),
        ("holds", "code"),
        ("holds", "sortOrder"),
    ],
)
def test_an_unknown_query_parameter_is_a_validation_error(
    client, brand, read_key, world, kind, parameter
):
    response = call(client, brand, KINDS[kind][0], read_key, **{parameter: "x"})
    body = assert_error(response, 400, "VALIDATION_ERROR")
    assert parameter in body["errors"]


# --- paging ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", LIST_KINDS)
@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ({"page": "0"}, "page"),
        ({"page": "-1"}, "page"),
        ({"page": "abc"}, "page"),
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "abc"}, "limit"),
    ],
)
def test_paging_out_of_range_is_a_validation_error(client, brand, read_key, kind, query, parameter):
    response = call(client, brand, KINDS[kind][0], read_key, **query)
    body = assert_error(response, 400, "VALIDATION_ERROR")
    assert list(body["errors"]) == [parameter]


@pytest.mark.parametrize("kind", LIST_KINDS)
def test_a_page_far_beyond_the_end_is_not_a_server_error(client, brand, read_key, world, kind):
    """`page` stops at 1,000,000, so its offset never overflows the database's integers: a
    huge one is a 400 on `page`, never a 500; the largest allowed is an empty page."""
    response = call(client, brand, KINDS[kind][0], read_key, page="1000000000000000000")
    body = assert_error(response, 400, "VALIDATION_ERROR")
    assert list(body["errors"]) == ["page"]
    response = call(client, brand, KINDS[kind][0], read_key, page="1000000", limit="100")
    assert assert_success(response)[KINDS[kind][1]] == []
    assert response.get_json()["meta"]["hasNext"] is False


@pytest.mark.parametrize(
    ("kind", "parameter", "value"),
    [
        ("links", "code", "GLOW\x00ALL"),
        ("deals", "campaignId", "cmp_\x00"),
        ("links", "dealId", "deal_\x00"),
        ("placements", "campaignId", "cmp_\x00"),
        ("holds", "dealId", "deal_\x00"),
    ],
)
def test_a_nul_character_in_a_filter_is_not_a_server_error(
    client, brand, read_key, world, kind, parameter, value
):
    """PostgreSQL refuses NUL in text: a 400 on that parameter, never a 500."""
    response = call(client, brand, KINDS[kind][0], read_key, **{parameter: value})
    body = assert_error(response, 400, "VALIDATION_ERROR")
    assert list(body["errors"]) == [parameter]


@pytest.mark.parametrize("kind", LIST_KINDS)
def test_a_nul_character_in_an_id_is_not_found(client, brand, read_key, world, kind):
    response = call(client, brand, KINDS[kind][2].format(world[kind] + "%00"), read_key)
    assert_error(response, 404, "NOT_FOUND")


def build_timeline(f: PlatformFactory, brand_id: str, kind: str) -> list[tuple[datetime, str]]:
    """Five records of `kind`, two of them created in the same instant: (created, id) each."""
    times = [t(10), t(11), t(11), t(12), t(13)]
    if kind == "campaigns":
        return [(at, f.campaign(brand_id, at=at, name=f"Campaign {at:%M}")) for at in times]
    campaign = f.campaign(brand_id, at=t(0), published_at=t(1))
    if kind == "deals":
        return [(at, f.deal(campaign, at=at, handle=f"@creator.{i}")) for i, at in enumerate(times)]
    if kind == "links":
        return [(at, f.link(campaign, f"CODE-{i}", at=at)) for i, at in enumerate(times)]
    deal = f.deal(campaign, at=t(2), amount_minor=500_000, accepted_at=times[0])
    if kind == "holds":
        first = [(times[0], f.hold_of(deal))]
        return first + [(at, f.hold(deal, at=at, amount_minor=1_000)) for at in times[1:]]
    return [
        (at, f.placement(deal, at=at, post_url=f"https://www.instagram.com/p/P{i}/"))
        for i, at in enumerate(times)
    ]


@pytest.mark.parametrize("kind", LIST_KINDS)
def test_pages_walk_every_record_once_newest_first(
    client, factory, brand, read_key, other_world, kind
):
    timeline = build_timeline(factory, brand, kind)
    expected = [record_id for _, record_id in sorted(timeline, reverse=True)]

    pages = []
    for page in (1, 2, 3):
        listed, meta = listing(client, brand, read_key, kind, limit=2, page=page)
        assert contract_meta(meta) == {
            "page": page,
            "limit": 2,
            "total": 5,
            "totalPages": 3,
            "hasNext": page < 3,
        }
        assert len(listed) == (2 if page < 3 else 1)
        pages.append([item["id"] for item in listed])
    walked = [record_id for page in pages for record_id in page]
    assert walked == expected  # newest first; the two of one instant by id, descending
    assert len(set(walked)) == 5

    beyond, meta = listing(client, brand, read_key, kind, limit=2, page=4)
    assert beyond == []
    assert contract_meta(meta) == {
        "page": 4,
        "limit": 2,
        "total": 5,
        "totalPages": 3,
        "hasNext": False,
    }
    everything, meta = listing(client, brand, read_key, kind, limit=100)
    assert [item["id"] for item in everything] == expected
    assert contract_meta(meta) == {
        "page": 1,
        "limit": 100,
        "total": 5,
        "totalPages": 1,
        "hasNext": False,
    }
    default, meta = listing(client, brand, read_key, kind)
    assert [item["id"] for item in default] == expected
    assert (meta["page"], meta["limit"]) == (1, 20)


@pytest.mark.parametrize("kind", LIST_KINDS)
def test_an_empty_list_is_a_success(client, brand, read_key, other_world, kind):
    """Nothing of this brand's, while another brand has a record of every kind."""
    listed, meta = listing(client, brand, read_key, kind)
    assert listed == []
    assert contract_meta(meta) == {
        "page": 1,
        "limit": 20,
        "total": 0,
        "totalPages": 0,
        "hasNext": False,
    }


# --- isolation between brands ------------------------------------------------------------------


@pytest.mark.parametrize("kind", LIST_KINDS)
def test_another_brands_record_is_not_found(
    client, brand, read_key, world, other_brand, other_world, other_key, kind
):
    record_id = other_world[kind]
    assert fetch_one(client, other_brand, other_key, kind, record_id)["id"] == record_id
    response = call(client, brand, KINDS[kind][2].format(record_id), read_key)
    assert_error(response, 404, "NOT_FOUND")
    # ...the same answer as an id nobody has.
    missing = KINDS[kind][4] + "0" * 26
    assert_error(call(client, brand, KINDS[kind][2].format(missing), read_key), 404, "NOT_FOUND")


def test_a_placement_of_another_brands_campaign_is_neither_found_nor_listed(
    client, brand, read_key, world, other_brand, other_world, other_key
):
    """Placements carry no brand id: ownership is via their campaign."""
    theirs = other_world["placements"]
    assert_error(call(client, brand, f"/placement/{theirs}", read_key), 404, "NOT_FOUND")
    assert listed_ids(client, brand, read_key, "placements") == [world["placements"]]
    assert listed_ids(client, other_brand, other_key, "placements") == [theirs]


def test_another_brands_records_are_never_listed(client, brand, read_key, other_key, scenario):
    theirs = {scenario.ids[name] for name in ("oc", "od", "oh", "op", "ol")}
    for kind in LIST_KINDS:
        ours = set(listed_ids(client, brand, read_key, kind, limit=100))
        assert ours
        assert not ours & theirs, kind
        their_list = set(listed_ids(client, scenario.other, other_key, kind, limit=100))
        assert len(their_list) == 1
        assert their_list <= theirs
        assert not their_list & ours


@pytest.mark.parametrize("route", ROUTES)
def test_a_key_of_another_brand_is_forbidden(
    client, brand, read_key, other_brand, other_world, route
):
    response = call(client, other_brand, route_path(route, other_world), read_key)
    assert_error(response, 403, "FORBIDDEN", "API key does not belong to this brand")


# --- authentication ----------------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_a_read_key_reads_every_route(client, brand, read_key, world, route):
    path = route_path(route, world)
    assert_success(call(client, brand, path, read_key))
    assert_success(call(client, brand, path, headers={"Authorization": f"Bearer {read_key}"}))


@pytest.mark.parametrize("route", ROUTES)
def test_no_key_is_unauthorized(client, brand, world, route):
    assert_error(call(client, brand, route_path(route, world)), 401, "UNAUTHORIZED")


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("header", ["X-Service-Bootstrap-Token", "X-Api-Key", "Authorization"])
def test_a_bootstrap_token_is_unauthorized(
    client, brand, world, make_bootstrap_token, route, header
):
    token = make_bootstrap_token(brand)
    value = f"Bearer {token}" if header == "Authorization" else token
    response = call(client, brand, route_path(route, world), headers={header: value})
    assert_error(response, 401, "UNAUTHORIZED")


# --- workspace ---------------------------------------------------------------------------------


def key_id_named(client, brand_id: str, key: str, name: str) -> str:
    response = client.get(f"/api/v1/brand/{brand_id}/api-key/fetch-keys", headers=key_header(key))
    [key_id] = [item["id"] for item in assert_success(response) if item["name"] == name]
    return key_id


def test_workspace_describes_the_brand_and_the_calling_key(client, factory, make_key):
    signed_up = datetime(2025, 10, 1, 12, 30, tzinfo=UTC)
    brand = factory.brand("Kola Naturals", plan="enterprise", at=signed_up)
    reader = make_key(brand, scopes=("read",), name="reader")
    make_key(brand, scopes=("read", "write"), name="writer")
    reader_id = key_id_named(client, brand, reader, "reader")

    response = call(client, brand, "/workspace", reader)
    data = assert_success(response)
    assert "meta" not in response.get_json()
    assert set(data) == WORKSPACE_FIELDS
    assert set(data["subscriptionPeriod"]) == PERIOD_FIELDS
    assert set(data["caller"]) == CALLER_FIELDS
    assert parsed(data) == {
        "brandId": brand,
        "name": "Kola Naturals",
        "plan": "enterprise",
        "kybStatus": "pending",
        "subscriptionPeriod": {"start": signed_up, "end": signed_up + timedelta(days=30)},
        "caller": {"keyId": reader_id, "scopes": ["read"]},
        "createdAt": signed_up,
    }


def test_workspace_of_a_write_key_shows_both_scopes_and_its_own_id(client, brand, make_key):
    writer = make_key(brand, scopes=("read", "write"), name="writer")
    reader = make_key(brand, scopes=("read",), name="reader")
    caller = assert_success(call(client, brand, "/workspace", writer))["caller"]
    assert caller == {
        "keyId": key_id_named(client, brand, reader, "writer"),
        "scopes": ["read", "write"],
    }
    caller = assert_success(call(client, brand, "/workspace", reader))["caller"]
    assert caller == {"keyId": key_id_named(client, brand, writer, "reader"), "scopes": ["read"]}


def test_workspace_follows_kyb_verification(client, factory, brand, read_key):
    assert assert_success(call(client, brand, "/workspace", read_key))["kybStatus"] == "pending"
    factory.apply(complete_kyb_verification, brand, kyb_status="verified", now=t(0))
    assert assert_success(call(client, brand, "/workspace", read_key))["kybStatus"] == "verified"


# --- secrets -----------------------------------------------------------------------------------

SECRET_PREFIXES = ("svc_live_", "bst_", "whsec_")


def test_no_read_response_contains_a_secret(
    client, brand, read_key, write_key, make_bootstrap_token, scenario
):
    token = make_bootstrap_token(brand)
    registered = client.post(
        f"/api/v1/brand/{brand}/webhook/register-endpoint",
        json={"url": HOOK_URL},
        headers=key_header(write_key),
    )
    signing_secret = assert_success(registered, 201)["signingSecret"]
    assert signing_secret.startswith("whsec_")

    said: list[str] = []

    def read(path: str, key: str, **query):
        response = call(client, brand, path, key, **query)
        said.append(response.get_data(as_text=True))
        return response

    for key in (read_key, write_key):
        assert_success(read("/workspace", key))
        for kind in LIST_KINDS:
            listed = assert_success(read(KINDS[kind][0], key, limit=100))[KINDS[kind][1]]
            assert listed
            for item in listed:
                assert_success(read(KINDS[kind][2].format(item["id"]), key))
        # Errors say nothing secret either.
        read("/deals", key, campaignId=read_key)
        read("/deals", key, status=write_key)
        read("/campaigns/cmp_00000000000000000000000000", key)
        read(f"/escrow/{scenario.ids['oh']}", key)
    assert len(said) > 40
    for text in said:
        for secret in (read_key, write_key, token, signing_secret):
            assert secret not in text
            assert secret[12:] not in text
        for prefix in SECRET_PREFIXES:
            assert prefix not in text


# --- the demo workspace ------------------------------------------------------------------------


@pytest.fixture
def demo(runner, client) -> tuple[str, str, str]:
    """`flask demo seed` on the empty database, and the brand's first key made with its
    bootstrap token: (brand id, key, bootstrap token)."""
    result = runner.invoke(args=["demo", "seed"])
    assert result.exit_code == 0, result.output
    seeded = json.loads(result.stdout)
    assert set(seeded) == {"brandId", "bootstrapToken", "bootstrapTokenExpiresAt", "linkCode"}
    created = client.post(
        f"/api/v1/brand/{seeded['brandId']}/api-key/create-key",
        json={"name": "first", "scopes": ["read"]},
        headers={"X-Service-Bootstrap-Token": seeded["bootstrapToken"]},
    )
    key = assert_success(created, 201)["secret"]
    return seeded["brandId"], key, seeded["bootstrapToken"]


def demo_lists(client, brand_id: str, key: str) -> dict[str, list[dict]]:
    lists = {}
    for kind in LIST_KINDS:
        listed, meta = listing(client, brand_id, key, kind, limit=100)
        assert meta["total"] == len(listed), kind  # all of it on one page
        lists[kind] = listed
    return lists


def test_demo_seed_fills_every_read_route(client, demo):
    brand_id, key, token = demo
    lists = demo_lists(client, brand_id, key)
    said = []
    for kind, listed in lists.items():
        assert listed, kind
        for item in listed:
            assert set(item) == KINDS[kind][3], kind
            response = call(client, brand_id, KINDS[kind][2].format(item["id"]), key)
            assert assert_success(response) == item
            said.append(response.get_data(as_text=True))
    workspace = assert_success(call(client, brand_id, "/workspace", key))
    assert workspace["brandId"] == brand_id
    assert workspace["name"]
    assert workspace["kybStatus"] == "verified"
    assert workspace["caller"] == {
        "keyId": key_id_named(client, brand_id, key, "first"),
        "scopes": ["read"],
    }

    campaigns, deals = lists["campaigns"], lists["deals"]
    assert {item["status"] for item in campaigns} == {
        "draft",
        "active",
        "paused",
        "completed",
        "cancelled",
    }
    assert {item["status"] for item in deals} == {
        "offered",
        "accepted",
        "declined",
        "expired",
        "in_progress",
        "completed",
        "cancelled",
        "disputed",
    }
    assert {item["status"] for item in lists["holds"]} == {"held", "released", "refunded"}
    assert {item["currency"] for item in campaigns} == {"NGN", "USD"}
    assert {item["currency"] for item in deals} == {"NGN", "USD"}
    verified = [item["verifiedAt"] is not None for item in lists["placements"]]
    assert any(verified)
    assert not all(verified)
    assert any(item["clicks"] > 0 for item in lists["links"])
    assert any(item["clicks"] > 0 for item in lists["placements"])

    said.append(json.dumps(lists))
    for text in said:
        assert token not in text
        assert key not in text
        for prefix in SECRET_PREFIXES:
            assert prefix not in text


def test_demo_deals_agree_with_their_holds_placements_and_campaigns(client, demo):
    """What a deal says about escrow and settlement is what its holds and placements show, and
    a campaign's committed and spent money is its holds'."""
    brand_id, key, _ = demo
    lists = demo_lists(client, brand_id, key)
    campaigns = {item["id"]: item for item in lists["campaigns"]}
    for deal in lists["deals"]:
        holds = [hold for hold in lists["holds"] if hold["dealId"] == deal["id"]]
        placements = [item for item in lists["placements"] if item["dealId"] == deal["id"]]

        def held_as(status: str, holds=holds) -> int:
            return sum(hold["amountMinor"] for hold in holds if hold["status"] == status)

        name = deal["creatorHandle"]
        assert deal["escrow"] == {
            "heldMinor": held_as("held"),
            "releasedMinor": held_as("released"),
            "refundedMinor": held_as("refunded"),
            "currency": deal["currency"],
        }, name
        settlement = deal["settlement"]
        verified = [item for item in placements if item["verifiedAt"] is not None]
        assert settlement["verifiedPlacements"] == len(verified), name
        assert settlement["amountSettledMinor"] == deal["escrow"]["releasedMinor"], name
        assert settlement["outstandingMinor"] == max(
            settlement["amountDueMinor"] - settlement["amountSettledMinor"], 0
        ), name
        assert settlement["amountDueMinor"] <= deal["agreedAmountMinor"], name
        assert settlement["currency"] == deal["currency"]
        assert deal["currency"] == campaigns[deal["campaignId"]]["currency"], name
        assert {hold["currency"] for hold in holds} <= {deal["currency"]}, name
        if deal["status"] in ("offered", "declined", "expired"):
            assert holds == [], name
    for campaign in campaigns.values():
        holds = [hold for hold in lists["holds"] if hold["campaignId"] == campaign["id"]]
        committed = sum(hold["amountMinor"] for hold in holds if hold["status"] == "held")
        spent = sum(hold["amountMinor"] for hold in holds if hold["status"] == "released")
        assert (campaign["committedMinor"], campaign["spentMinor"]) == (committed, spent)
        assert campaign["remainingMinor"] == campaign["budgetMinor"] - spent - committed


def test_placements_read_the_same_whether_merged_per_campaign_or_walked(
    app, client, brand, read_key, factory, other_brand, monkeypatch
):
    """On PostgreSQL a brand with few campaigns has its placements merged campaign by campaign;
    one with many is walked through the join. Both must give the same pages: interleaved
    campaigns, ties broken by id, another brand's rows in between, deep pages."""
    import services.placements

    expected_ids = []
    for index in range(3):
        campaign = factory.campaign(brand, at=t(index), published_at=t(index))
        deal = factory.deal(campaign, at=t(5), accepted_at=t(6), placements_required=9)
        for minute in (10, 10, 20 + index, 30 + 2 * index):
            expected_ids.append(
                (
                    t(minute),
                    factory.placement(deal, at=t(minute), post_url=f"https://x.com/p/{minute}"),
                )
            )
    theirs = factory.campaign(other_brand, at=t(0), published_at=t(0))
    their_deal = factory.deal(theirs, at=t(5), accepted_at=t(6), placements_required=9)
    factory.placement(their_deal, at=t(21))
    newest_first = [pid for _, pid in sorted(expected_ids, reverse=True)]

    def pages(limit: int) -> list[str]:
        seen, page = [], 1
        while True:
            response = call(
                client, brand, "/placement/fetch-placements", read_key, page=page, limit=limit
            )
            data = assert_success(response)["placements"]
            seen += [item["id"] for item in data]
            if not response.get_json()["meta"]["hasNext"]:
                return seen
            page += 1

    def merged() -> bool:
        with app.app_context():
            return services.placements._newest_across_campaigns(brand) is not None

    assert merged()
    for limit in (1, 5, 100):
        assert pages(limit) == newest_first, limit
    monkeypatch.setattr(services.placements, "MERGE_CAMPAIGNS_MAX", 2)  # 3 campaigns: walk
    assert not merged()
    for limit in (1, 5, 100):
        assert pages(limit) == newest_first, limit
