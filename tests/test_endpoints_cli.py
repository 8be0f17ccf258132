"""`flask endpoints disable`: the operator's lever, the same rule as the service's own disabling."""

from __future__ import annotations

import json

from sqlalchemy import select

from extensions import db
from models import WebhookDelivery, WebhookEndpoint, WebhookEvent
from tests.helpers import assert_success


def register(client, brand, key, url, events=None) -> dict:
    body = {"url": url} | ({"events": events} if events else {})
    return assert_success(
        client.post(
            f"/api/v1/brand/{brand}/webhook/register-endpoint",
            json=body,
            headers={"X-Api-Key": key},
        ),
        201,
    )


def test_an_operator_disables_an_endpoint_and_the_brand_hears_of_it(
    app, client, runner, brand, write_key
):
    flooded = register(client, brand, write_key, "https://hooks.example.com/flooded")
    watcher = register(
        client, brand, write_key, "https://ops.example.com/in", ["webhook.endpoint_disabled"]
    )
    for _ in range(3):
        assert runner.invoke(args=["events", "emit", brand, "deal.completed"]).exit_code == 0

    result = runner.invoke(
        args=["endpoints", "disable", flooded["id"], "--reason", "flooding\nthe queue"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == flooded["id"]
    with app.app_context():
        endpoint = db.session.get(WebhookEndpoint, flooded["id"])
        assert endpoint.disabled_reason == "Disabled by the service's operators: flooding the queue"
        statuses = db.session.scalars(
            select(WebhookDelivery.status).where(WebhookDelivery.endpoint_id == flooded["id"])
        ).all()
        announced = db.session.scalars(
            select(WebhookDelivery.event_name).where(WebhookDelivery.endpoint_id == watcher["id"])
        ).all()
    assert statuses == ["failed"] * 3
    assert announced == ["webhook.endpoint_disabled"]
    with app.app_context():
        [body] = db.session.scalars(
            select(WebhookEvent.body).where(WebhookEvent.name == "webhook.endpoint_disabled")
        ).all()
    # No attempt made this one: an operator did (CONTRACT 13.4's lastAttempt is null).
    assert json.loads(body)["data"]["lastAttempt"] is None

    again = runner.invoke(args=["endpoints", "disable", flooded["id"], "--reason", "twice"])
    assert again.exit_code == 1
    assert "No open webhook endpoint" in again.output
    unknown = runner.invoke(args=["endpoints", "disable", "whe_missing", "--reason", "x"])
    assert unknown.exit_code == 1
