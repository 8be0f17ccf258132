"""`flask demo ...`: a workspace to explore the API and dashboard with."""

from __future__ import annotations

import json

import click
from flask.cli import AppGroup

from commands import command_transaction
from services.demo import database_is_empty, seed_demo_workspace

demo = AppGroup("demo", help="The demo workspace.")


@demo.command("seed")
@click.option(
    "--if-empty",
    is_flag=True,
    help="Seed only when there is no brand yet (first run); else print nothing.",
)
def seed_command(if_empty: bool) -> None:
    """Create the demo brand; prints {"brandId", "bootstrapToken"} as JSON."""
    with command_transaction():
        if if_empty and not database_is_empty():
            return
        workspace = seed_demo_workspace()
    click.echo(
        json.dumps({"brandId": workspace.brand.id, "bootstrapToken": workspace.bootstrap_token})
    )
