"""`flask demo ...`: a workspace to explore the API and dashboard with."""

from __future__ import annotations

import json

import click
from flask.cli import AppGroup

from commands import command_transaction

demo = AppGroup("demo", help="The demo workspace.")


@demo.command("seed")
@click.option(
    "--if-empty",
    is_flag=True,
    help="Seed only when there is no brand yet (first run); else print nothing.",
)
def seed_command(if_empty: bool) -> None:
    """Create a demo brand with a month of data.

    Its campaigns, deals, escrow, links and placements; prints {"brandId", "bootstrapToken",
    "bootstrapTokenExpiresAt", "linkCode"} as JSON (the token creates any number of keys until
    it expires; linkCode: a tracked link of a deal in progress, for conversion postbacks).

    The first demo brand of a database is "Kola Naturals (demo)", the one `demo brand` prints;
    later ones are "Kola Naturals (demo 2)" and on, with codes of their own (GLOW-TOBI-7K3Q),
    and leave `demo brand` as it was."""
    # Imported by each command that runs (see commands/__init__.py).
    from fixtures.demo import database_is_empty, seed_demo_workspace
    from schemas.base import iso_timestamp

    with command_transaction():
        if if_empty and not database_is_empty():
            return
        workspace = seed_demo_workspace()
    click.echo(
        json.dumps(
            {
                "brandId": workspace.brand.id,
                "bootstrapToken": workspace.bootstrap_token,
                "bootstrapTokenExpiresAt": iso_timestamp(workspace.bootstrap_token_expires_at),
                "linkCode": workspace.link_code,
            }
        )
    )


@demo.command("brand")
def brand_command() -> None:
    """Print the demo brand's id.

    The demo brand is the one `make run` created, "Kola Naturals (demo)", whatever `demo seed`
    made since. Its name and a link code for postbacks go to stderr."""
    from fixtures.demo import demo_link_code
    from fixtures.demo_simulation import demo_brand

    with command_transaction():
        brand = demo_brand()
        link_code = demo_link_code(brand.id)
    click.echo(brand.id)
    link = f"; link code {link_code} for conversion postbacks" if link_code else ""
    click.echo(f"{brand.name}{link}", err=True)


@demo.command("simulate")
@click.option(
    "--brand",
    "brand_id",
    default=None,
    help="The brand to move; default: the demo brand (`demo brand`).",
)
def simulate_command(brand_id: str | None) -> None:
    """Move the demo workspace one step forward.

    A placement verified, a deal completed, a budget threshold crossed...; prints {"brandId",
    "step", "events"} as JSON, and the events reach the brand's endpoints like any platform
    event. A brand with nothing to move (no active campaign) is an error."""
    from fixtures.demo_simulation import simulate_step

    with command_transaction():
        step = simulate_step(brand_id=brand_id)
    click.echo(
        json.dumps(
            {
                "brandId": step.brand_id,
                "step": step.description,
                "events": [{"id": event_id, "type": name} for event_id, name in step.events],
            }
        )
    )
