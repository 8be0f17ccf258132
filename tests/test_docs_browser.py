"""/docs in a real browser (headless Chromium, see tests/browser.py) against a real gunicorn
server: Scalar renders the document offline, from the app's own files only, shows an operation
with our curl command and an event's webhook, and the console reports no CSP violation or error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.browser import LAPTOP, PHONE, Problems, expect, open_context

RENDER_MS = 30_000


class Offline:
    """Every request a context makes that is not to the server: refused, and remembered."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.refused: list[str] = []

    def route(self, route) -> None:
        if route.request.url.startswith(self.origin):
            route.continue_()
        else:
            self.refused.append(route.request.url)
            route.abort()


@pytest.fixture
def open_docs(browser, browser_server) -> Iterator:
    """`open_docs(path, viewport=LAPTOP)`: a page on `path` in a context of its own, with no
    network beyond the server; what the browser reported is checked afterwards."""
    opened: list[tuple] = []

    def open_page(path: str = "/docs", viewport: dict = LAPTOP):
        problems = Problems()
        context = open_context(
            browser, browser_server.url, problems, viewport=viewport, timeout_ms=20_000
        )
        offline = Offline(browser_server.url)
        context.route("**/*", offline.route)
        opened.append((context, problems, offline))
        page = context.new_page()
        page.goto(path)
        # The placeholder goes once Scalar's bundle has run and the document has arrived: under
        # CI's four sessions on two cores, Chromium took over expect's 5 s to get there.
        page.locator("[data-loading]").wait_for(state="detached", timeout=RENDER_MS)
        return page

    yield open_page
    for context, problems, offline in opened:
        context.close()
        assert offline.refused == [], f"the page asked for other sites: {offline.refused}"
        problems.assert_none()


def test_the_reference_shows_an_operation_and_an_event_offline_without_csp_violations(
    open_docs,
):
    page = open_docs()
    expect(page.get_by_role("heading", name="Brand Server-to-Server API")).to_be_visible(
        timeout=RENDER_MS
    )
    # The introduction keeps the envelope's and the error codes' tables.
    sidebar = page.get_by_role("complementary")
    sidebar.get_by_role("button", name="Open Group - Introduction").click()
    sidebar.get_by_role("link", name="Errors", exact=True).click()
    errors = page.locator("table").filter(has_text="SERVICE_UNAVAILABLE")
    expect(errors).to_contain_text("RATE_LIMITED")
    expect(errors).to_contain_text("429")

    # An operation, with the curl command of this deployment.
    sidebar.get_by_role(
        "link", name=re.compile("^Create an API key with a bootstrap token")
    ).click()
    operation = page.get_by_role("heading", name="Create an API key with a bootstrap token")
    expect(operation).to_be_visible()
    curl = page.locator(".scalar-code-block, pre").filter(has_text="X-Service-Bootstrap-Token")
    expect(curl.first).to_contain_text("/api/v1/brand/$BRAND/api-key/create-key")
    expect(curl.first).to_contain_text('"name": "orders-service"')

    # An event: its webhook with the headers and the body's example.
    sidebar.get_by_role("button", name="Open Group - Webhook events").click()
    sidebar.get_by_role("link", name=re.compile(r"^deal\.completed\b")).click()
    expect(page.get_by_role("heading", name="deal.completed", exact=True)).to_be_visible()
    expect(
        page.get_by_text("A deal's placements were verified and it is settled.").first
    ).to_be_visible()
    expect(page.get_by_text("X-Service-Signature", exact=True).first).to_be_visible()
    expect(page.get_by_text("webhook-signature", exact=True).first).to_be_visible()
    body = page.locator(".scalar-code-block, pre").filter(has_text='"type": "deal.completed"')
    expect(body.first).to_contain_text('"amountSettledMinor"')


def test_the_dashboards_link_fills_the_brands_id_into_the_curl_commands(open_docs, brand, read_key):
    page = open_docs("/dashboard/sign-in")
    page.get_by_label("API key").fill(read_key)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("link", name=re.compile("API reference")).click()
    # The reference's own scroll spy may add the section it shows as a fragment.
    expect(page).to_have_url(re.compile(rf"/docs\?brandId={brand}(#[\w/-]*)?$"))
    page.locator("[data-loading]").wait_for(state="detached", timeout=RENDER_MS)
    sidebar = page.get_by_role("complementary")
    sidebar.get_by_role("button", name="Open Group - Webhook endpoints").click()
    sidebar.get_by_role("link", name=re.compile("^Send a test ping to an endpoint")).click()
    curl = page.locator(".scalar-code-block, pre").filter(has_text="send-test")
    expect(curl.first).to_contain_text(f"/api/v1/brand/{brand}/webhook/$ENDPOINT/send-test")
    expect(curl.first).not_to_contain_text("$BRAND")


def test_the_license_link_of_the_document_lands_on_its_section(open_docs, browser_server):
    document = open_docs("/api/v1/openapi.json").evaluate(
        "() => JSON.parse(document.body.innerText)"
    )
    page = open_docs(document["info"]["license"]["url"].removeprefix(browser_server.url))
    heading = page.get_by_role("heading", name="License", exact=True)
    expect(heading).to_be_in_viewport()
    expect(page.get_by_text("Proprietary: this interface")).to_be_visible()


def test_on_a_phone_the_reference_does_not_scroll_sideways(open_docs):
    page = open_docs(viewport=PHONE)
    expect(page.get_by_role("heading", name="Brand Server-to-Server API")).to_be_visible(
        timeout=RENDER_MS
    )
    overflow = page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"/docs scrolls {overflow} px sideways on a phone"
