"""`flask events emit BRAND_ID EVENT_NAME [--data JSON]`: publish any event, as the platform
would (CONTRACT section 2). It fans out through the same publishing function as every other
source, so it reaches exactly the endpoints a real event would."""

from __future__ import annotations

import json

import click
from flask.cli import AppGroup

from commands import command_transaction
from models.event_catalog import EVENT_NAMES, is_event_name, sample_data
from services.brands import get_brand
from services.events import publish_event

events = AppGroup("events", help="Webhook events.")


@events.command("emit")
@click.argument("brand_id")
@click.argument("event_name")
@click.option(
    "--data",
    "data_json",
    default=None,
    help="The event's `data` as a JSON object; default: the catalogue's sample for the event.",
)
def emit_command(brand_id: str, event_name: str, data_json: str | None) -> None:
    """Publish EVENT_NAME for BRAND_ID; prints the event id."""
    if not is_event_name(event_name):
        raise click.ClickException(
            f"Unknown event {event_name!r}; one of: {', '.join(EVENT_NAMES)}"
        )
    data = sample_data(event_name) if data_json is None else _parse_object(data_json)
    with command_transaction():
        get_brand(brand_id)  # a clear "no such brand" rather than a foreign-key failure
        published = publish_event(brand_id=brand_id, name=event_name, data=data)
    click.echo(published.event.id)
    click.echo(f"queued {len(published.delivery_ids)} delivery(ies)", err=True)


def _parse_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise click.ClickException(f"--data is not valid JSON: {error.msg}") from None
    if not isinstance(value, dict):
        raise click.ClickException("--data must be a JSON object")
    return value
