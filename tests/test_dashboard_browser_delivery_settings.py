"""The endpoint page in Debian's Chromium (tests/browser.py), issue 44: a failing endpoint's state
shows its last failure as the alert carries it (CONTRACT 13.4), the answer's start kept inside
the page on a phone; and "Events and settings" edits `maxInFlight` and `traceContext` (13.5,
13.6), with and without JavaScript."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from extensions import db
from models import WebhookAttempt, WebhookEndpoint
from models.columns import utcnow
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint
from tests.browser import LAPTOP, PHONE, expect, open_fold, sign_in_with_key

LOCAL = UrlPolicy(https_only=False, allow_local=True)
HOOK = "http://127.0.0.1:9/hooks"
# A receiver's answer longer than a line of a phone, with no space to wrap at.
ANSWER = "upstream-unavailable;" * 80


def failing_endpoint(app, brand_id: str) -> tuple[str, str]:
    """An endpoint whose last attempts failed with a long answer: its id and the delivery's."""
    with app.app_context():
        endpoint_id = register_endpoint(
            brand_id=brand_id, url=HOOK, events=["deal.completed"], policy=LOCAL
        ).id
        published = publish_event(
            brand_id=brand_id, name="deal.completed", data={"id": "deal_1", "campaignId": None}
        )
        [delivery_id] = published.delivery_ids
        for number in (1, 2):
            db.session.add(
                WebhookAttempt(
                    delivery_id=delivery_id,
                    endpoint_id=endpoint_id,
                    attempt_number=number,
                    requested_at=utcnow(),
                    duration_ms=12,
                    http_status=503,
                    error="HTTP 503",
                    response_body=ANSWER,
                    request_headers={"Content-Type": "application/json"},
                )
            )
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_id)
            .values(consecutive_failures=2, failing_since=utcnow())
        )
        db.session.commit()
        db.session.remove()
    return endpoint_id, delivery_id


def stored(app, endpoint_id: str) -> tuple[int | None, bool]:
    with app.app_context():
        row = db.session.execute(
            select(WebhookEndpoint.max_in_flight, WebhookEndpoint.trace_context).where(
                WebhookEndpoint.id == endpoint_id
            )
        ).one()
        db.session.remove()
    return row.max_in_flight, row.trace_context


@pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["laptop", "phone"])
def test_a_failing_endpoints_state_shows_its_last_failure(
    app, open_page, brand, read_key, viewport
):
    endpoint_id, delivery_id = failing_endpoint(app, brand)
    page = open_page(viewport)
    sign_in_with_key(page, read_key)
    page.goto(f"/dashboard/endpoints/{endpoint_id}")
    notice = page.locator("[data-last-failure]")
    expect(notice).to_contain_text("Last failure: deal.completed")
    # On a laptop it spans the page above the health; on a phone it comes after it (whose
    # latest failures fill the first screen).
    health = page.locator("#endpoint-health").bounding_box()
    if viewport == LAPTOP:
        assert notice.bounding_box()["y"] < health["y"]
        assert notice.bounding_box()["width"] > health["width"]
    else:
        assert notice.bounding_box()["y"] > health["y"]
    expect(notice).to_contain_text(delivery_id)
    expect(notice).to_contain_text("answered HTTP 503")
    expect(notice).not_to_contain_text("HTTP 503: HTTP 503")  # the status once
    expect(notice.locator("pre")).to_have_text(ANSWER[:1024])  # folded, its start in a line
    expect(notice.locator("summary")).to_contain_text(ANSWER[:40])
    notice.locator("summary").click()
    expect(notice.locator("pre")).to_be_visible()
    box = notice.bounding_box()
    assert box["x"] + box["width"] <= viewport["width"], box  # the answer wraps, inside
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= viewport["width"], f"the page is {width} px wide"
    notice.get_by_role("link").click()
    expect(page).to_have_url(
        f"{page.url.split('/dashboard')[0]}/dashboard/deliveries/{delivery_id}#attempt-2"
    )


@pytest.mark.parametrize("javascript", [False, True], ids=["no-js", "js"])
def test_settings_edit_attempts_at_once_and_trace_context(
    app, open_page, brand, write_key, javascript
):
    with app.app_context():
        endpoint_id = register_endpoint(
            brand_id=brand, url=HOOK, events=["deal.completed"], policy=LOCAL
        ).id
        db.session.commit()
        db.session.remove()
    page = open_page(javascript=javascript)
    sign_in_with_key(page, write_key)
    page.goto(f"/dashboard/endpoints/{endpoint_id}")
    open_fold(page, "Events and settings")
    settings = page.locator("#endpoint-settings")
    expect(settings.locator("[data-setting=maxInFlight]")).to_have_text(
        "at most 2 at a time (the service's limit)"
    )
    expect(settings.locator("[data-setting=traceContext]")).to_have_text("not sent")

    page.get_by_label("Attempts at once").fill("5")
    page.get_by_label("Send trace context").check()
    page.get_by_role("button", name="Save changes").click()
    expect(page.locator("#endpoint-settings [data-setting=maxInFlight]")).to_have_text(
        "at most 5 at a time"
    )
    expect(page.locator("#endpoint-settings [data-setting=traceContext]")).to_have_text(
        "a traceparent header with each attempt"
    )
    assert stored(app, endpoint_id) == (5, True)

    open_fold(page, "Events and settings")
    page.get_by_label("Attempts at once").fill("")
    page.get_by_label("Send trace context").uncheck()
    page.get_by_role("button", name="Save changes").click()
    expect(page.locator("#endpoint-settings [data-setting=traceContext]")).to_have_text("not sent")
    assert stored(app, endpoint_id) == (None, False)
