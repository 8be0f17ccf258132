"""The demo workspace: a month in the life of a mid-size consumer brand, built through the same
platform changes (`services.platform`) that real data arrives by, and moved forward one step at
a time by `flask demo simulate`.

Kola Naturals sells shea butter and skincare in Nigeria and to the diaspora in the US. Its month
has campaigns in every state, deals in every status, escrow held, released and refunded, links
with clicks and the sales its shop reported through postbacks, and placements verified and not,
in NGN and USD. The story is fixed (click counts come from a seeded generator), so every seed
looks alike and tests can rely on its shape.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from models import Brand
from models.campaign import FIXED_FEE, PER_CLICK
from models.columns import utcnow
from services.bootstrap_tokens import issue_bootstrap_token
from services.brands import SUBSCRIPTION_PERIOD, brand_count, create_brand
from services.platform.campaigns import (
    cancel_campaign,
    complete_campaign,
    create_campaign,
    pause_campaign,
    publish_campaign,
)
from services.platform.deals import (
    accept_deal,
    cancel_deal,
    complete_deal,
    decline_deal,
    dispute_deal,
    expire_deal,
    offer_deal,
)
from services.platform.placements import (
    submit_placement,
    update_placement_metrics,
    verify_placement,
)
from services.platform.tracked_links import create_tracked_link, record_link_clicks
from services.platform.workspace import complete_kyb_verification
from services.postbacks import Postback, record_postback

DEMO_BRAND_NAME = "Kola Naturals (demo)"
SHORT_LINK_BASE = "https://kola.link/"
SHOP = "https://kolanaturals.example"
NAIRA = 100  # kobo
DOLLAR = 100  # cents


@dataclass(frozen=True)
class DemoWorkspace:
    brand: Brand
    bootstrap_token: str


@dataclass(frozen=True)
class PlacementPlan:
    platform: str
    verified: bool = False
    clicks: int = 0


@dataclass(frozen=True)
class DealPlan:
    handle: str
    amount_minor: int
    # Where the story ends: offered, accepted, declined, expired, in_progress, completed,
    # cancelled or disputed (a deal in a cancelled campaign ends cancelled with it).
    ends: str
    placements: tuple[PlacementPlan, ...] = ()
    placements_required: int = 1


@dataclass(frozen=True)
class CampaignPlan:
    name: str
    code: str
    currency: str
    budget_minor: int
    pricing_model: str
    starts_day: int  # days from the start of the demo month
    length_days: int
    ends: str  # draft, active, paused, completed or cancelled
    deals: tuple[DealPlan, ...] = ()
    click_rate_minor: int | None = None
    landing: str = "/"


IG, TT, YT, X = "instagram", "tiktok", "youtube", "x"

CAMPAIGNS = (
    CampaignPlan(
        name="Harmattan Glow launch",
        code="GLOW",
        currency="NGN",
        budget_minor=2_000_000 * NAIRA,
        pricing_model=FIXED_FEE,
        starts_day=2,
        length_days=34,
        ends="active",
        landing="/harmattan-glow",
        deals=(
            DealPlan(
                "@adaeze.cooks",
                450_000 * NAIRA,
                "completed",
                (PlacementPlan(IG, True, 1842), PlacementPlan(TT, True, 2710)),
                placements_required=2,
            ),
            DealPlan(
                "@funke.at.home", 350_000 * NAIRA, "completed", (PlacementPlan(IG, True, 960),)
            ),
            DealPlan("@tobi.fits", 300_000 * NAIRA, "in_progress", (PlacementPlan(TT, False),)),
            DealPlan(
                "@zainab.glows",
                400_000 * NAIRA,
                "in_progress",
                (PlacementPlan(IG, True, 1310), PlacementPlan(YT, False)),
                placements_required=2,
            ),
            DealPlan("@chidi.daily", 250_000 * NAIRA, "offered"),
            DealPlan("@mide.makeup", 380_000 * NAIRA, "declined"),
        ),
    ),
    CampaignPlan(
        name="Shea gift sets: US diaspora",
        code="SHEAUS",
        currency="USD",
        budget_minor=6_000 * DOLLAR,
        pricing_model=PER_CLICK,
        click_rate_minor=25,
        starts_day=5,
        length_days=40,
        ends="active",
        landing="/us/gift-sets",
        deals=(
            DealPlan(
                "@naija.in.nyc",
                500 * DOLLAR,
                "completed",
                (PlacementPlan(IG, True, 1600),),
            ),
            DealPlan(
                "@lagos.in.houston",
                800 * DOLLAR,
                "in_progress",
                (PlacementPlan(YT, True, 1240), PlacementPlan(IG, False)),
                placements_required=2,
            ),
            DealPlan("@kofi.in.dc", 600 * DOLLAR, "disputed", (PlacementPlan(TT, True, 310),)),
            DealPlan("@ama.atl", 450 * DOLLAR, "expired"),
        ),
    ),
    CampaignPlan(
        name="Back to school bundle",
        code="SCHOOL",
        currency="NGN",
        budget_minor=1_200_000 * NAIRA,
        pricing_model=FIXED_FEE,
        starts_day=0,
        length_days=14,
        ends="completed",
        landing="/back-to-school",
        deals=(
            DealPlan(
                "@mummy.of.three", 300_000 * NAIRA, "completed", (PlacementPlan(IG, True, 2204),)
            ),
            DealPlan(
                "@teacher.bisi", 200_000 * NAIRA, "completed", (PlacementPlan(TT, True, 1480),)
            ),
            DealPlan("@uni.life.ng", 150_000 * NAIRA, "offered"),  # expires as the campaign ends
        ),
    ),
    CampaignPlan(
        name="Valentine's shea bundle",
        code="VAL",
        currency="NGN",
        budget_minor=900_000 * NAIRA,
        pricing_model=FIXED_FEE,
        starts_day=8,
        length_days=20,
        ends="cancelled",
        landing="/valentine",
        deals=(
            DealPlan("@love.and.lagos", 280_000 * NAIRA, "accepted"),
            DealPlan("@couples.of.abuja", 220_000 * NAIRA, "cancelled"),
        ),
    ),
    CampaignPlan(
        name="Ramadan hampers",
        code="RAMADAN",
        currency="NGN",
        budget_minor=1_000_000 * NAIRA,
        pricing_model=PER_CLICK,
        click_rate_minor=50 * NAIRA,
        starts_day=12,
        length_days=30,
        ends="paused",
        landing="/ramadan",
        deals=(DealPlan("@kano.kitchen", 200_000 * NAIRA, "accepted"),),
    ),
    CampaignPlan(
        name="Detty December teaser",
        code="DETTY",
        currency="NGN",
        budget_minor=1_500_000 * NAIRA,
        pricing_model=FIXED_FEE,
        starts_day=38,
        length_days=21,
        ends="draft",
        landing="/detty-december",
    ),
)


def seed_demo_workspace(now: datetime | None = None) -> DemoWorkspace:
    """Create the demo brand with its month of data, and a bootstrap token for its first key.

    Every change goes through `services.platform`, so the events of that month are recorded
    too; with no endpoint registered yet they are delivered nowhere.
    """
    now = now or utcnow()
    month_start = (now - timedelta(days=30)).replace(hour=9, minute=0, second=0, microsecond=0)
    brand = create_brand(name=DEMO_BRAND_NAME, plan="growth", now=month_start - timedelta(days=3))
    # A customer for a month already: the first period has renewed and the second is running.
    brand.subscription_period_start = brand.subscription_period_start + SUBSCRIPTION_PERIOD
    brand.subscription_period_end = brand.subscription_period_start + SUBSCRIPTION_PERIOD
    complete_kyb_verification(brand.id, kyb_status="verified", now=month_start - timedelta(days=2))
    suffix = brand.id[-4:].upper()
    rng = random.Random(20261101)  # noqa: S311 - a fixed story, not a secret
    for plan in CAMPAIGNS:
        _play_campaign(brand.id, plan, month_start, now, suffix, rng)
    _record_stray_postbacks(brand.id, now)
    issued = issue_bootstrap_token(brand_id=brand.id)
    return DemoWorkspace(brand=brand, bootstrap_token=issued.token)


def database_is_empty() -> bool:
    return brand_count() == 0


def _play_campaign(
    brand_id: str, plan: CampaignPlan, month_start: datetime, now: datetime, suffix: str, rng
) -> None:
    opened = month_start + timedelta(days=plan.starts_day)
    created = min(opened - timedelta(days=2), now - timedelta(days=1))
    campaign = create_campaign(
        brand_id=brand_id,
        name=plan.name,
        pricing_model=plan.pricing_model,
        currency=plan.currency,
        budget_minor=plan.budget_minor,
        click_rate_minor=plan.click_rate_minor,
        starts_at=opened,
        ends_at=opened + timedelta(days=plan.length_days),
        now=created,
    )
    if plan.ends == "draft":
        return
    publish_campaign(campaign.id, now=opened)
    _link(campaign.id, None, f"{plan.code}-{suffix}", plan.landing, opened, now, rng)
    for index, deal_plan in enumerate(plan.deals):
        offered = opened + timedelta(hours=7 + 19 * index)
        _play_deal(campaign.id, plan, deal_plan, offered, now, suffix, rng)
    ended = min(opened + timedelta(days=plan.length_days), now - timedelta(hours=6))
    if plan.ends == "paused":
        pause_campaign(campaign.id, now=now - timedelta(days=3))
    elif plan.ends == "completed":
        complete_campaign(campaign.id, now=ended)
    elif plan.ends == "cancelled":
        cancel_campaign(campaign.id, now=now - timedelta(days=4))


def _play_deal(
    campaign_id: str,
    campaign_plan: CampaignPlan,
    plan: DealPlan,
    offered: datetime,
    now: datetime,
    suffix: str,
    rng,
) -> None:
    step = timedelta(hours=20)
    deal = offer_deal(
        campaign_id=campaign_id,
        creator_handle=plan.handle,
        agreed_amount_minor=plan.amount_minor,
        placements_required=plan.placements_required,
        now=offered,
    )
    if plan.ends == "offered":
        return
    if plan.ends == "declined":
        decline_deal(deal.id, now=offered + step)
        return
    if plan.ends == "expired":
        expire_deal(deal.id, now=offered + 3 * step)
        return
    accept_deal(deal.id, now=offered + step)
    handle = plan.handle.strip("@").split(".")[0].upper()
    link_code = f"{campaign_plan.code}-{handle}-{suffix}"
    link = _link(
        campaign_id,
        deal.id,
        link_code,
        campaign_plan.landing,
        offered + step,
        now,
        rng,
    )
    when = offered + 2 * step
    for number, placement_plan in enumerate(plan.placements, start=1):
        placement = submit_placement(
            deal_id=deal.id,
            platform=placement_plan.platform,
            post_url=post_url(placement_plan.platform, handle, number, rng),
            now=when,
        )
        if placement_plan.verified:
            verify_placement(placement.id, now=when + timedelta(hours=5))
            update_placement_metrics(
                placement.id, clicks=placement_plan.clicks, now=when + timedelta(days=2)
            )
            record_link_clicks(link, clicks=placement_plan.clicks, now=when + timedelta(days=2))
            record_sales(
                brand_id=deal.brand_id,
                link_code=link_code,
                currency=campaign_plan.currency,
                sales=max(1, placement_plan.clicks // 400),
                now=when + timedelta(days=2, hours=1),
                rng=rng,
            )
        when += step
    if plan.ends == "completed":
        complete_deal(deal.id, now=when + step)
    elif plan.ends == "disputed":
        dispute_deal(deal.id, now=when + step)
    elif plan.ends == "cancelled":
        cancel_deal(deal.id, now=when + step)


def _link(
    campaign_id: str,
    deal_id: str | None,
    code: str,
    landing: str,
    created: datetime,
    now: datetime,
    rng,
) -> str:
    link = create_tracked_link(
        campaign_id=campaign_id,
        deal_id=deal_id,
        code=code,
        short_url=SHORT_LINK_BASE + code,
        destination_url=f"{SHOP}{landing}?utm_source=brandapi&utm_content={code}",
        now=created,
    )
    if deal_id is None:  # campaign-wide links are shared widely: a steady trickle of clicks
        record_link_clicks(link.id, clicks=rng.randint(300, 2400), now=now - timedelta(hours=2))
    return link.id


# A basket at the demo shop, in minor units of each currency.
_BASKET = {"NGN": (6_500 * NAIRA, 48_000 * NAIRA), "USD": (18 * DOLLAR, 95 * DOLLAR)}


def record_sales(
    *, brand_id: str, link_code: str, currency: str, sales: int, now: datetime, rng
) -> list[str]:
    """Purchases the shop's backend reports on a link, as its postbacks would; their ids."""
    recorded = []
    for number in range(sales):
        order = f"KN-{now:%y%m%d%H%M}-{number + 1}"
        outcome = record_postback(
            brand_id=brand_id,
            idempotency_key=f"demo-{link_code}-{order}",
            postback=Postback(
                event_type="purchase",
                click_id=f"clk_{rng.randrange(16**10):010x}",
                link_code=link_code,
                value_minor=rng.randint(*_BASKET[currency]),
                currency=currency,
                metadata={"orderId": order, "channel": "web"},
            ),
            now=now + timedelta(minutes=7 * number),
        )
        recorded.append(outcome.conversion.id)
    return recorded


def _record_stray_postbacks(brand_id: str, now: datetime) -> None:
    """What real postback logs also hold: a signup with a click id and no code, a code from a
    retired link (stored, counted nowhere), and a newsletter signup with neither."""
    strays = (
        Postback(event_type="signup", click_id="clk_7e21c0d9aa"),
        Postback(event_type="purchase", link_code="SUMMER-OLD", value_minor=12_000 * NAIRA),
        Postback(event_type="newsletter_signup", metadata={"list": "weekly-glow"}),
    )
    for number, postback in enumerate(strays):
        record_postback(
            brand_id=brand_id,
            idempotency_key=f"demo-stray-postback-{number}",
            postback=postback,
            now=now - timedelta(hours=30 - 9 * number),
        )


def post_url(platform: str, handle: str, number: int, rng) -> str:
    token = "".join(
        rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnpqrstuvwxyz23456789") for _ in range(11)
    )
    return {
        "instagram": f"https://www.instagram.com/p/{token}/",
        "tiktok": f"https://www.tiktok.com/@{handle.lower()}/video/{rng.randint(10**18, 10**19)}",
        "youtube": f"https://www.youtube.com/watch?v={token}",
        "x": f"https://x.com/{handle.lower()}/status/{rng.randint(10**18, 10**19)}",
    }[platform]
