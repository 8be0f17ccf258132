"""`flask events emit BRAND_ID EVENT_NAME [--data JSON]`: publish any event, as the platform
would (CONTRACT section 2). It fans out through the same publishing function as every other
source, so it reaches exactly the endpoints a real event would.

stdout carries the event id only; stderr says what happens next: how many deliveries were
queued, whether a worker is there to send them, and when `data` is the catalogue's sample."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, timedelta
from typing import TYPE_CHECKING

import click
from flask import current_app
from flask.cli import AppGroup

from commands import command_transaction
from extensions import db
from models.columns import utcnow
from models.event_catalog import EVENT_NAMES, fresh_sample_data, is_event_name
from services.retention import BATCH_SIZE, REST_RATIO

if TYPE_CHECKING:
    from rq.worker import BaseWorker

# Each command imports the services it calls when it runs, not when `flask` lists the commands
# (commands/__init__.py).

events = AppGroup("events", help="Webhook events.")
# The count alone on stdout, for a script: what the sentence printed without it starts with.
QUIET = click.option("--quiet", "-q", is_flag=True, help="Print the number alone.")
WORKER_SILENCE = timedelta(seconds=60)

_EVENT_LIST = "\b\nEVENT_NAME is one of:\n" + "\n".join(f"  {name}" for name in EVENT_NAMES)


@events.command("emit", epilog=_EVENT_LIST)
@click.argument("brand_id")
@click.argument("event_name")
@click.option(
    "--data",
    "data_json",
    default=None,
    help="The event's `data` as a JSON object with every field the event has, as the OpenAPI "
    "document's `webhooks` section states it; default: the catalogue's sample for the event, "
    "with new sample ids each time (so a new subject, at sequence 1; they are not records of "
    "the brand).",
)
@click.option(
    "--endpoint",
    "endpoint_id",
    default=None,
    help="Send it to this endpoint of the brand alone, whatever it subscribes to (as its "
    'dashboard page\'s "Send an example event" does).',
)
def emit_command(
    brand_id: str, event_name: str, data_json: str | None, endpoint_id: str | None
) -> None:
    """Publish an event, as the platform would.

    EVENT_NAME for BRAND_ID goes to every endpoint of the brand subscribed to it, or with
    --endpoint to that one alone; prints the event id. The deliveries go out when a webhook
    worker (`flask worker`, or `make run`) picks them up."""
    if not is_event_name(event_name):
        raise click.ClickException(
            f"Unknown event {event_name!r}; one of: {', '.join(EVENT_NAMES)}"
        )
    # A new sample subject each time: one sample deal would climb in sequence across emits
    # that have nothing to do with one another.
    from services.brands import get_brand
    from services.events import publish_event
    from services.webhook_endpoints import send_example_event

    data = (
        fresh_sample_data(event_name) if data_json is None else _event_data(event_name, data_json)
    )
    with command_transaction():
        get_brand(brand_id)  # a clear "no such brand" rather than a foreign-key failure
        if endpoint_id is not None:
            published = send_example_event(
                brand_id=brand_id, endpoint_id=endpoint_id, name=event_name, data=data
            )
        else:
            published = publish_event(brand_id=brand_id, name=event_name, data=data)
    click.echo(published.event.id)
    event = published.event
    if data_json is None:
        click.echo(
            f"No --data: sent the catalogue's sample data for {event_name}, about a new sample "
            f"{event.subject_type} ({event.subject_key}, sequence {event.sequence}); its ids "
            "are samples, not records of this brand.",
            err=True,
        )

    queued = len(published.delivery_ids)
    if not queued:
        click.echo(
            f"No active endpoint of this brand subscribes to {event_name}: nothing to deliver.",
            err=True,
        )
        return
    click.echo(f"Queued {queued} {'delivery' if queued == 1 else 'deliveries'}.", err=True)
    waiting = _why_nothing_sends()
    if waiting:
        click.echo(waiting, err=True)


@events.command("recover")
@click.argument("brand_id")
@click.argument("endpoint_id")
@click.option(
    "--since",
    required=True,
    type=click.DateTime(["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S%z"]),
    help="Failed deliveries created from this moment, with its offset (e.g. "
    "2026-11-20T08:00:00+00:00); at most 14 days ago.",
)
@click.option(
    "--until",
    default=None,
    type=click.DateTime(["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S%z"]),
    help="…and before this one (default: now).",
)
@QUIET
def recover_command(brand_id: str, endpoint_id: str, since, until, quiet: bool) -> None:
    """Send again what failed to an endpoint.

    Every failed delivery of ENDPOINT_ID created in the window, once, in the order they were
    first created (after a receiver's outage); prints how many were queued, in a line that
    says so (with --quiet, the number alone). The same as the API's recover and the endpoint
    page's "Send again what failed"."""
    from services.brands import get_brand
    from services.deliveries import recover_failed_deliveries

    with command_transaction():
        get_brand(brand_id)
        recovered = recover_failed_deliveries(
            brand_id=brand_id, endpoint_id=endpoint_id, since=since, until=until
        )
    click.echo(recovered.queued if quiet else _recovered(recovered.queued, endpoint_id))
    if recovered.queued:
        waiting = _why_nothing_sends()
        if waiting:
            click.echo(waiting, err=True)


@events.command("retry-pending")
@click.argument("brand_id")
@click.argument("endpoint_id")
@QUIET
def retry_pending_command(brand_id: str, endpoint_id: str, quiet: bool) -> None:
    """Send now what waits for a retry to an endpoint.

    Every pending delivery of ENDPOINT_ID waiting for its next retry becomes due now (once its
    receiver is fixed); prints how many, in a line that says so (with --quiet, the number
    alone). The same as the API's retry-pending and the endpoint page's "Retry now"."""
    from services.brands import get_brand
    from services.webhook_endpoints import retry_pending

    with command_transaction():
        get_brand(brand_id)
        due = retry_pending(brand_id=brand_id, endpoint_id=endpoint_id)
    click.echo(due if quiet else _made_due(due, endpoint_id))
    if due:
        waiting = _why_nothing_sends()
        if waiting:
            click.echo(waiting, err=True)


@events.command("purge-expired")
@click.option(
    "--batch-size",
    default=BATCH_SIZE,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Rows deleted per transaction.",
)
@click.option(
    "--rest-ratio",
    default=REST_RATIO,
    show_default=True,
    type=click.FloatRange(0, 100),
    help="After each batch, rest this many times as long as it took (0: flat out).",
)
def purge_expired_command(batch_size: int, rest_ratio: float) -> None:
    """Delete what is older than the retention now.

    Deliveries settled more than WEBHOOK_RETENTION_DAYS ago with their attempts, then events
    no delivery refers to, a batch per transaction (workers do it every few minutes by
    themselves). Prints the counts as JSON; `skipped` is true when another purge was
    running."""
    from services.retention import delete_expired_deliveries, retention_period

    with db.engine.connect() as connection:
        purged = delete_expired_deliveries(
            connection,
            now=utcnow(),
            retention=retention_period(),
            batch_size=batch_size,
            rest_ratio=rest_ratio,
        )
    click.echo(json.dumps(asdict(purged)))


def _made_due(due: int, endpoint_id: str) -> str:
    """What retry-pending did, in a line that starts with the count."""
    if not due:
        return f"0 deliveries to {endpoint_id} were waiting for a retry: nothing to send sooner"
    if due == 1:
        return f"1 delivery to {endpoint_id} waiting for a retry is due now"
    return f"{due} deliveries to {endpoint_id} waiting for a retry are due now"


def _recovered(queued: int, endpoint_id: str) -> str:
    """What recover did, in a line that starts with the count."""
    if not queued:
        return f"0 failed deliveries to {endpoint_id} in that window were left to send again"
    noun = "delivery" if queued == 1 else "deliveries"
    return f"{queued} failed {noun} to {endpoint_id} queued again, as new deliveries"


def _why_nothing_sends() -> str | None:
    """Why the deliveries just queued will wait, or None when a worker is there to send them."""
    import redis
    from rq import Worker

    from workers.connection import redis_connection

    start = "Start one with `.venv/bin/flask --app app worker` (`make run` runs one)."
    try:
        connection = redis_connection(current_app)
        if connection is None:
            return "REDIS_URL is not set: no webhook worker can run. " + start
        if any(_alive(worker) for worker in Worker.all(connection=connection)):
            return None
    except redis.RedisError:
        return (
            "Redis is unreachable: the deliveries wait in the database until it is back and a "
            "worker runs (its sweeper finds them). " + start
        )
    return "No webhook worker is running: the deliveries wait until one starts. " + start


def _alive(worker: BaseWorker) -> bool:
    """A worker beats at least every sweep interval; one killed without unregistering keeps
    its registration for minutes, with an old heartbeat."""
    beat = worker.last_heartbeat
    return beat is not None and utcnow() - beat.replace(tzinfo=UTC) < WORKER_SILENCE


def _event_data(event_name: str, text: str) -> dict:
    """`--data` as the event's publishers would write it, or a one-line error naming each field
    that is wrong: receivers are promised exactly the shape the document states."""
    from marshmallow import ValidationError

    from schemas.events import load_event_data

    try:
        return load_event_data(event_name, _parse_object(text))
    except ValidationError as error:
        problems = "; ".join(
            f"{field}: {' '.join(messages)}"
            for field, messages in error.normalized_messages().items()
        )
        raise click.ClickException(f"--data is not {event_name} data: {problems}") from None


def _parse_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as error:  # a syntax error, or a number too long for an int
        reason = error.msg if isinstance(error, json.JSONDecodeError) else str(error)
        raise click.ClickException(f"--data is not valid JSON: {reason}") from None
    if not isinstance(value, dict):
        raise click.ClickException("--data must be a JSON object")
    return value
