"""The workspace view (fetchWorkspace): the brand, its plan and period, and who is asking."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from services.api_keys import normalize_scopes
from services.brands import get_brand


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime


@dataclass(frozen=True)
class WorkspaceCaller:
    key_id: str
    scopes: list[str]


@dataclass(frozen=True)
class Workspace:
    brand_id: str
    name: str
    plan: str
    kyb_status: str
    subscription_period: Period
    caller: WorkspaceCaller
    created_at: datetime


def get_workspace(*, brand_id: str, key_id: str, scopes: frozenset[str]) -> Workspace:
    """:raise NotFound: no such brand (authentication has normally refused it already)."""
    brand = get_brand(brand_id)
    return Workspace(
        brand_id=brand.id,
        name=brand.name,
        plan=brand.plan,
        kyb_status=brand.kyb_status,
        subscription_period=Period(
            start=brand.subscription_period_start, end=brand.subscription_period_end
        ),
        caller=WorkspaceCaller(key_id=key_id, scopes=normalize_scopes(scopes)),
        created_at=brand.created_at,
    )
