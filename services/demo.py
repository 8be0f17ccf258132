"""The demo workspace a newcomer meets on the first `make run`."""

from __future__ import annotations

from dataclasses import dataclass

from models import Brand
from services.bootstrap_tokens import issue_bootstrap_token
from services.brands import brand_count, create_brand

DEMO_BRAND_NAME = "Kola Naturals (demo)"


@dataclass(frozen=True)
class DemoWorkspace:
    brand: Brand
    bootstrap_token: str


def seed_demo_workspace() -> DemoWorkspace:
    """A verified growth-plan brand and a bootstrap token to create its first key."""
    brand = create_brand(name=DEMO_BRAND_NAME, plan="growth")
    brand.kyb_status = "verified"
    issued = issue_bootstrap_token(brand_id=brand.id)
    return DemoWorkspace(brand=brand, bootstrap_token=issued.token)


def database_is_empty() -> bool:
    return brand_count() == 0
