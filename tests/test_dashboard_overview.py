"""The dashboard overview: workspace, the last day's deliveries by status, endpoints needing
attention first."""

from __future__ import annotations

import re
from datetime import timedelta

from sqlalchemy import update

from extensions import db
from models import WebhookDelivery, WebhookEndpoint
from models.columns import utcnow
from services.events import publish_event
from services.webhook_endpoints import current_url_policy, register_endpoint
from tests.dashboard import sign_in


def _endpoint(brand_id: str, url: str) -> str:
    return register_endpoint(
        brand_id=brand_id, url=url, events=["deal.completed"], policy=current_url_policy()
    ).id


def _count(page: str, status: str) -> int:
    return int(re.search(rf'data-count="{status}">(\d+)<', page).group(1))


def test_overview_shows_the_workspace(client, brand, read_key):
    sign_in(client, read_key)
    page = client.get("/dashboard/").get_data(as_text=True)
    assert "Acme Foods" in page
    assert brand in page
    assert "growth" in page
    assert "pending" in page  # KYB status of a new brand
    assert "No endpoints yet" in page
    assert [_count(page, s) for s in ("delivered", "pending", "failed")] == [0, 0, 0]


def test_overview_counts_the_last_days_deliveries_by_status(app, client, brand, read_key):
    with app.test_request_context():
        endpoint_id = _endpoint(brand, "http://127.0.0.1:9/hooks")
        for _ in range(3):
            publish_event(brand_id=brand, name="deal.completed", data={"dealId": "deal_x"})
        db.session.flush()
        ids = list(db.session.scalars(db.select(WebhookDelivery.id).order_by(WebhookDelivery.id)))
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == ids[0])
            .values(status="delivered", http_status=200)
        )
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == ids[1])
            .values(status="failed", http_status=500, last_error="HTTP 500")
        )
        # older than a day: not counted
        publish_event(
            brand_id=brand,
            name="deal.completed",
            data={"dealId": "deal_y"},
            now=utcnow() - timedelta(hours=25),
        )
        db.session.commit()
    sign_in(client, read_key)
    page = client.get("/dashboard/").get_data(as_text=True)
    assert [_count(page, s) for s in ("delivered", "pending", "failed")] == [1, 1, 1]
    assert "Latest failures" in page
    assert f"/dashboard/deliveries/{ids[1]}" in page
    assert "/dashboard/deliveries?status=failed" in page
    assert endpoint_id in page


def test_overview_puts_disabled_then_failing_endpoints_first(app, client, brand, read_key):
    with app.test_request_context():
        healthy = _endpoint(brand, "http://127.0.0.1:9/healthy")
        failing = _endpoint(brand, "http://127.0.0.1:9/failing")
        disabled = _endpoint(brand, "http://127.0.0.1:9/disabled")
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == failing)
            .values(consecutive_failures=3)
        )
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == disabled)
            .values(disabled_at=utcnow(), consecutive_failures=15, disabled_reason="15 failures")
        )
        db.session.commit()
    sign_in(client, read_key)
    page = client.get("/dashboard/").get_data(as_text=True)
    order = [page.index(f"/dashboard/endpoints/{i}") for i in (disabled, failing, healthy)]
    assert order == sorted(order)
    assert 'status-disabled">disabled' in page
    assert 'status-failing">failing' in page


def test_overview_shows_only_the_sessions_brand(app, client, brand, read_key, make_brand):
    other = make_brand("Other Brand")
    with app.test_request_context():
        other_endpoint = _endpoint(other, "http://127.0.0.1:9/theirs")
        publish_event(brand_id=other, name="deal.completed", data={})
        db.session.commit()
    sign_in(client, read_key)
    page = client.get("/dashboard/").get_data(as_text=True)
    assert other_endpoint not in page
    assert "Other Brand" not in page
    assert _count(page, "pending") == 0
