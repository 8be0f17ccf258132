"""`flask --app app endpoints disable ENDPOINT_ID`: the operator's lever on an endpoint that floods
the queue or harms a receiver (docs/operations.md). stdout: the endpoint id."""

from __future__ import annotations

import click
from flask.cli import AppGroup

from commands import command_transaction
from models.columns import utcnow
from models.webhook_endpoint import DISABLED_REASON_MAX_LENGTH

endpoints = AppGroup("endpoints", help="Webhook endpoints, for operators.")
OPERATOR_PREFIX = "Disabled by the service's operators: "


@endpoints.command("disable")
@click.argument("endpoint_id")
@click.option("--reason", required=True, help="Shown to the brand with the endpoint.")
def disable(endpoint_id: str, reason: str) -> None:
    """Disable an endpoint, as the service does.

    Its pending deliveries end `failed` and the brand's other endpoints hear
    `webhook.endpoint_disabled`. The brand re-enables it."""
    from services.delivery.health import disable_endpoint  # see commands/__init__.py

    text = (OPERATOR_PREFIX + " ".join(reason.split()))[:DISABLED_REASON_MAX_LENGTH]
    with command_transaction():
        disabled = disable_endpoint(
            endpoint_id, reason=text, now=utcnow(), by_service=True, first_batch=True
        )
    if not disabled:
        raise click.ClickException(f"No open webhook endpoint with id {endpoint_id!r}")
    click.echo(endpoint_id)
