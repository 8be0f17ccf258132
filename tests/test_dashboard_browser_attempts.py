"""A delivery's attempts in Chromium (tests/browser.py): the timing bar is drawn to its figures
under the CSP, "Copy as curl" puts the page's command on the clipboard, and without JavaScript
the command is still there to read, collapsed (CONTRACT 12.5)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import update

from extensions import db
from models import WebhookAttempt, WebhookDelivery
from models.columns import utcnow
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.signing import delivery_headers
from services.webhook_endpoints import register_endpoint
from tests.browser import expect, open_context, sign_in_with_key

LOCAL = UrlPolicy(https_only=False, allow_local=True)
URL = "http://localhost:8099/orders/webhooks"


def answered_delivery(app, brand_id: str) -> str:
    """A delivery answered 200 after 40 ms of connect and 300 of waiting, as the worker records
    one: its id."""
    with app.app_context():
        endpoint = register_endpoint(
            brand_id=brand_id, url=URL, events=["deal.completed"], policy=LOCAL
        )
        published = publish_event(
            brand_id=brand_id, name="deal.completed", data={"id": "deal_1", "note": "it's"}
        )
        [delivery_id] = published.delivery_ids
        body = published.event.body.encode()
        headers = {
            "Host": "localhost:8099",
            "Accept": "*/*",
            "Accept-Encoding": "identity",
            **delivery_headers(
                secret="whsec_not_a_real_secret",
                timestamp=int(utcnow().timestamp()),
                raw_body=body,
                event_name="deal.completed",
                event_id=published.event.id,
                delivery_id=delivery_id,
            ),
            "Content-Length": str(len(body)),
        }
        db.session.add(
            WebhookAttempt(
                delivery_id=delivery_id,
                endpoint_id=endpoint.id,
                attempt_number=1,
                requested_at=utcnow(),
                duration_ms=400,
                http_status=200,
                error=None,
                response_body="ok",
                request_headers=headers,
                response_headers={"Content-Type": "text/plain", "Server": "edge"},
                remote_address="127.0.0.1",
                dns_ms=None,
                connect_ms=40,
                tls_ms=None,
                first_byte_ms=300,
            )
        )
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == delivery_id)
            .values(status="delivered", attempt_count=1, http_status=200, delivered_at=utcnow())
        )
        db.session.commit()
        db.session.remove()
        return delivery_id


@pytest.fixture
def with_clipboard(browser, browser_server, problems) -> Iterator:
    context = open_context(
        browser,
        browser_server.url,
        problems,
        permissions=["clipboard-read", "clipboard-write"],
    )
    yield context
    context.close()
    problems.assert_none()


def test_copy_as_curl_puts_the_pages_command_on_the_clipboard(app, with_clipboard, brand, read_key):
    delivery_id = answered_delivery(app, brand)
    page = with_clipboard.new_page()
    sign_in_with_key(page, read_key)
    page.goto(f"/dashboard/deliveries/{delivery_id}")
    attempt = page.locator("#attempt-1")

    # The bar's segments are as wide as their share: 40, 300 and the 60 ms left of 400.
    bar = attempt.locator(".timing-bar")
    expect(bar).to_be_visible()
    full = bar.bounding_box()["width"]
    for key, share in (("connect", 0.10), ("wait", 0.75), ("rest", 0.15)):
        width = attempt.locator(f".timing-bar .timing-{key}").bounding_box()["width"]
        assert abs(width / full - share) < 0.01, (key, width, full)
    expect(attempt.locator(".timing-legend")).to_contain_text("Waiting for the first byte300 ms")

    expect(attempt.get_by_role("button", name="Copy as curl")).to_be_visible()
    copy = attempt.locator("button[data-copy-from]")
    command = attempt.locator("#attempt-1-curl").text_content()
    copy.click()
    expect(copy).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == command
    assert command.startswith(f"curl --include --http1.1 -X POST {URL} \\\n")
    assert "--resolve localhost:8099:127.0.0.1" in command
    # It stays collapsed until asked for.
    expect(attempt.locator("#attempt-1-curl")).to_be_hidden()
    expect(attempt.get_by_text("Response headers")).to_be_visible()
    expect(attempt.get_by_text("Server: edge")).to_be_hidden()


def test_without_javascript_the_command_is_there_to_read(app, no_js, brand, read_key):
    delivery_id = answered_delivery(app, brand)
    page = no_js.new_page()
    sign_in_with_key(page, read_key)
    page.goto(f"/dashboard/deliveries/{delivery_id}")
    attempt = page.locator("#attempt-1")

    expect(attempt.get_by_role("button", name="Copy as curl")).to_have_count(0)  # no dead button
    expect(attempt.locator(".timing-bar .timing-wait")).to_be_visible()
    attempt.get_by_text("As a curl command").click()
    expect(attempt.locator("#attempt-1-curl")).to_be_visible()
    expect(attempt.locator("#attempt-1-curl")).to_contain_text("--data-raw")
