"""Platform records for read tests, built the way real data arrives: through the platform
changes of `services.platform_changes`, each one committed in its own app context. Every builder
returns the id of what it made; `at` stamps the change's time (records sort by it)."""

from __future__ import annotations

from datetime import datetime, timedelta

from flask import Flask
from sqlalchemy import select

from extensions import db
from models import EscrowHold
from models.campaign import FIXED_FEE
from services.brands import create_brand
from services.platform_changes import campaigns, deals, escrow, placements, tracked_links


class PlatformFactory:
    def __init__(self, app: Flask) -> None:
        self.app = app

    def apply(self, change, *args, **kwargs):
        """Run one platform change and commit it; the id of the record it returns, if any."""
        with self.app.app_context():
            record = change(*args, **kwargs)
            db.session.commit()
            return getattr(record, "id", None)

    def brand(self, name: str, *, plan: str = "growth", at: datetime) -> str:
        return self.apply(create_brand, name=name, plan=plan, now=at)

    def campaign(
        self,
        brand_id: str,
        *,
        at: datetime,
        name: str = "Harmattan Glow launch",
        currency: str = "NGN",
        pricing_model: str = FIXED_FEE,
        budget_minor: int = 1_000_000,
        click_rate_minor: int | None = None,
        published_at: datetime | None = None,
    ) -> str:
        """A draft campaign created `at`; published (active) at `published_at` if given."""
        campaign_id = self.apply(
            campaigns.create_campaign,
            brand_id=brand_id,
            name=name,
            pricing_model=pricing_model,
            currency=currency,
            budget_minor=budget_minor,
            click_rate_minor=click_rate_minor,
            starts_at=at + timedelta(days=1),
            ends_at=at + timedelta(days=31),
            now=at,
        )
        if published_at is not None:
            self.apply(campaigns.publish_campaign, campaign_id, now=published_at)
        return campaign_id

    def deal(
        self,
        campaign_id: str,
        *,
        at: datetime,
        handle: str = "@adaeze.cooks",
        amount_minor: int = 100_000,
        placements_required: int = 1,
        accepted_at: datetime | None = None,
    ) -> str:
        """An offer made `at`; accepted (escrow held for the agreed amount) at `accepted_at`."""
        deal_id = self.apply(
            deals.offer_deal,
            campaign_id=campaign_id,
            creator_handle=handle,
            agreed_amount_minor=amount_minor,
            placements_required=placements_required,
            now=at,
        )
        if accepted_at is not None:
            self.apply(deals.accept_deal, deal_id, now=accepted_at)
        return deal_id

    def placement(
        self,
        deal_id: str,
        *,
        at: datetime,
        platform: str = "instagram",
        post_url: str = "https://www.instagram.com/p/C9xYz12AbCd/",
        verified_at: datetime | None = None,
    ) -> str:
        placement_id = self.apply(
            placements.submit_placement,
            deal_id=deal_id,
            platform=platform,
            post_url=post_url,
            now=at,
        )
        if verified_at is not None:
            self.apply(placements.verify_placement, placement_id, now=verified_at)
        return placement_id

    def metrics(self, placement_id: str, *, clicks: int, at: datetime) -> None:
        self.apply(placements.update_placement_metrics, placement_id, clicks=clicks, now=at)

    def link(
        self,
        campaign_id: str,
        code: str,
        *,
        at: datetime,
        deal_id: str | None = None,
    ) -> str:
        return self.apply(
            tracked_links.create_tracked_link,
            campaign_id=campaign_id,
            deal_id=deal_id,
            code=code,
            short_url=f"https://kola.link/{code}",
            destination_url=f"https://kolanaturals.example/?utm_content={code}",
            now=at,
        )

    def clicks(self, link_id: str, clicks: int, *, at: datetime) -> None:
        self.apply(tracked_links.record_link_clicks, link_id, clicks=clicks, now=at)

    def hold(self, deal_id: str, *, at: datetime, amount_minor: int | None = None) -> str:
        return self.apply(escrow.hold_escrow, deal_id, amount_minor=amount_minor, now=at)

    def release(self, hold_id: str, *, at: datetime) -> None:
        self.apply(escrow.release_escrow, hold_id, now=at)

    def refund(self, hold_id: str, *, at: datetime) -> None:
        self.apply(escrow.refund_escrow, hold_id, now=at)

    def hold_of(self, deal_id: str) -> str:
        """The id of the deal's only escrow hold (the one accepting it made)."""
        with self.app.app_context():
            [hold_id] = db.session.scalars(
                select(EscrowHold.id).where(EscrowHold.deal_id == deal_id)
            ).all()
            return hold_id
