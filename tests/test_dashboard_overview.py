"""The dashboard overview: workspace, what its webhooks are doing (deliveries of the last day,
the ones retrying now, failed attempts), and its endpoints in the order of every other page."""

from __future__ import annotations

import re
from datetime import timedelta

from sqlalchemy import update

from extensions import db
from models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from models.columns import utcnow
from services.events import publish_event
from services.webhook_endpoints import current_url_policy, register_endpoint
from tests.dashboard import sign_in
from tests.delivery_states import settle


def _endpoint(brand_id: str, url: str) -> str:
    return register_endpoint(
        brand_id=brand_id, url=url, events=["deal.completed"], policy=current_url_policy()
    ).id


COUNTS = ("retrying", "failed-attempts", "waiting", "delivered", "failed")


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
    assert [_count(page, s) for s in COUNTS] == [0, 0, 0, 0, 0]


def test_overview_counts_the_last_days_deliveries_by_status(app, client, brand, read_key):
    with app.test_request_context():
        endpoint_id = _endpoint(brand, "http://127.0.0.1:9/hooks")
        for _ in range(3):
            publish_event(brand_id=brand, name="deal.completed", data={"dealId": "deal_x"})
        db.session.flush()
        ids = list(db.session.scalars(db.select(WebhookDelivery.id).order_by(WebhookDelivery.id)))
        settle([ids[0]], "delivered", http_status=200)
        settle([ids[1]], "failed", http_status=500, last_error="HTTP 500")
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
    # The old pending delivery is still waiting for a first attempt: it counts, whatever its age.
    assert [_count(page, s) for s in COUNTS] == [0, 0, 2, 1, 1]
    assert "Latest failures" in page
    assert f"/dashboard/deliveries/{ids[1]}" in page
    assert "/dashboard/deliveries?status=failed" in page
    assert endpoint_id in page


def test_overview_counts_retrying_deliveries_and_failed_attempts(app, client, brand, read_key):
    """A delivery whose attempts fail stays `pending` for a day: the overview says it is
    retrying, counts its failed attempts, and links to them, instead of "failed 0"."""
    now = utcnow()
    with app.test_request_context():
        _endpoint(brand, "http://127.0.0.1:9/down")
        for _ in range(3):
            publish_event(brand_id=brand, name="deal.completed", data={"dealId": "deal_x"})
        db.session.flush()
        first, second, third = db.session.scalars(
            db.select(WebhookDelivery.id).order_by(WebhookDelivery.id)
        )
        # Two deliveries retrying after 2 and 1 failed attempts; a third delivered at once.
        _attempts(first, [(now - timedelta(minutes=9), 503), (now - timedelta(minutes=4), 503)])
        _attempts(second, [(now - timedelta(minutes=3), None)])
        _attempts(third, [(now - timedelta(minutes=2), 200)])
        # A day-old delivery whose last retry failed an hour ago: that attempt counts too.
        old = publish_event(
            brand_id=brand, name="deal.completed", data={}, now=now - timedelta(hours=26)
        ).delivery_ids[0]
        _attempts(
            old, [(now - timedelta(hours=26), 500), (now - timedelta(hours=1), 500)], final=True
        )
        db.session.commit()
    sign_in(client, read_key)
    page = client.get("/dashboard/").get_data(as_text=True)
    assert [_count(page, s) for s in COUNTS] == [2, 4, 0, 1, 0]
    assert "/dashboard/deliveries?retrying=true" in page
    assert "Retrying now" in page
    assert f"/dashboard/deliveries/{first}" in page and f"/dashboard/deliveries/{second}" in page
    assert "attempt 2 failed: HTTP 503 · next retry <time" in page


def _attempts(delivery_id: str, attempts: list, final: bool = False) -> None:
    """Record attempts (when, HTTP status or None for no answer) as the worker leaves them."""
    endpoint_id = db.session.get(WebhookDelivery, delivery_id).endpoint_id
    for number, (when, status) in enumerate(attempts, start=1):
        failed = status is None or not 200 <= status < 300
        db.session.add(
            WebhookAttempt(
                delivery_id=delivery_id,
                endpoint_id=endpoint_id,
                attempt_number=number,
                requested_at=when,
                duration_ms=10,
                http_status=status,
                error=("Connection refused" if status is None else f"HTTP {status}")
                if failed
                else None,
                response_body=None,
                request_headers={},
            )
        )
    status, when = attempts[-1][1], attempts[-1][0]
    failed = status is None or not 200 <= status < 300
    values = dict(attempt_count=len(attempts), http_status=status)
    if not failed:
        settle([delivery_id], "delivered", delivered_at=when, **values)
    elif final:
        settle([delivery_id], "failed", failed_at=when, last_error=f"HTTP {status}", **values)
    else:
        error = "Connection refused" if status is None else f"HTTP {status}"
        values |= dict(next_attempt_at=when + timedelta(minutes=30), last_error=error)
        db.session.execute(
            update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(**values)
        )


def test_overview_lists_endpoints_in_the_order_of_every_other_page(app, client, brand, read_key):
    """Oldest first, as fetch-endpoints and the endpoints page list them; the state column
    says which need attention."""
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
    ids = (healthy, failing, disabled)
    for path in ("/dashboard/", "/dashboard/endpoints"):
        page = client.get(path).get_data(as_text=True)
        order = [page.index(f"/dashboard/endpoints/{i}") for i in ids]
        assert order == sorted(order), path
        assert 'status-disabled">disabled' in page
        assert 'status-failing">failing' in page
    page = client.get("/dashboard/deliveries").get_data(as_text=True)
    options = [page.index(f'<option value="{i}"') for i in ids]
    assert options == sorted(options)


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
    assert _count(page, "waiting") == 0
