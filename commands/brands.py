"""`flask brands ...`: support's workspace and bootstrap-token commands."""

from __future__ import annotations

import click
from flask.cli import AppGroup

from commands import command_transaction
from models.brand import PLANS
from services.bootstrap_tokens import (
    DEFAULT_TTL_HOURS,
    MAX_TTL_HOURS,
    issue_bootstrap_token,
    revoke_bootstrap_tokens,
)
from services.brands import create_brand, list_brands_with_key_counts

brands = AppGroup("brands", help="Brand workspaces and their bootstrap tokens.")


@brands.command("create")
@click.argument("name")
@click.option("--plan", type=click.Choice(PLANS), default="starter", show_default=True)
def create_command(name: str, plan: str) -> None:
    """Create a brand named NAME; prints its id.

    NAME is 1-100 characters. It starts with KYB pending and a 30-day subscription period, and
    no key: issue it a bootstrap token to create the first one.
    """
    with command_transaction():
        brand = create_brand(name=name, plan=plan)
    click.echo(brand.id)


@brands.command("list")
def list_command() -> None:
    """Print every brand as a table."""
    with command_transaction():
        rows = [
            (
                brand.id,
                brand.name,
                brand.plan,
                brand.kyb_status,
                str(active_keys),
                brand.created_at.strftime("%Y-%m-%d %H:%M"),
            )
            for brand, active_keys in list_brands_with_key_counts()
        ]
    header = ("ID", "NAME", "PLAN", "KYB", "ACTIVE KEYS", "CREATED (UTC)")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        click.echo("  ".join(cells).rstrip())


@brands.command(
    "issue-bootstrap-token",
    help=f"""Issue a bootstrap token; prints it, once.

    The token creates BRAND_ID's API keys (create-key, or the dashboard's "create your first
    key" page): as many as you like, until it expires, {DEFAULT_TTL_HOURS} hours after it is
    issued (or --ttl-hours), or `brands revoke-bootstrap-tokens` revokes it. It is stored
    hashed.""",
)
@click.argument("brand_id")
@click.option(
    "--ttl-hours",
    type=click.IntRange(1, MAX_TTL_HOURS),
    default=DEFAULT_TTL_HOURS,
    show_default=True,
    help=f"Hours the token stays valid, 1-{MAX_TTL_HOURS} (30 days).",
)
def issue_token_command(brand_id: str, ttl_hours: int) -> None:
    with command_transaction():
        issued = issue_bootstrap_token(brand_id=brand_id, ttl_hours=ttl_hours)
    click.echo(issued.token)
    click.echo(
        f"Shown once; it creates any number of keys until "
        f"{issued.record.expires_at:%Y-%m-%d %H:%M} UTC, unless revoked.",
        err=True,
    )


@brands.command("revoke-bootstrap-tokens")
@click.argument("brand_id")
def revoke_tokens_command(brand_id: str) -> None:
    """Revoke a brand's bootstrap tokens.

    Every token of BRAND_ID still valid stops creating keys at once; prints how many."""
    with command_transaction():
        count = revoke_bootstrap_tokens(brand_id=brand_id)
    click.echo(count)
