"""The dashboard in Debian's Chromium (tests/browser.py), with JavaScript off and on, on a laptop
(1280x800) and a phone (390x844): what a newcomer's first hour showed wrong, measured rather
than looked at.

- Layout: no page scrolls sideways, no table is wider than its card, no text is cut (a clipped
  box, an ellipsis, a table's label), every section of the nav is in sight, and long URLs and
  keys break only after a slash, a dash or the like.
- Truth: after an action, every panel it changed says so at once (Disable: the health figures,
  the failures, the recover and example panels, the deliveries).
- Times: absolute to the second in `<time datetime>`, and how long ago or how soon beside it,
  kept current by the page's script.
- "Send an example event": any event of the catalogue, signed and delivered to a real receiver
  by a real worker, and logged like any delivery.
"""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from extensions import db
from fixtures.demo import seed_demo_workspace
from models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from models.columns import utcnow
from models.event_catalog import sample_data
from services.api_keys import create_api_key
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.postbacks import Postback, record_postback
from services.webhook_endpoints import register_endpoint
from tests.browser import LAPTOP, PHONE, expect, open_fold, sign_in_with_key
from tests.worker_process import WorkerProcess

LOCAL = UrlPolicy(https_only=False, allow_local=True)
# Nothing listens on the discard port: every attempt to it is refused at once. Long, in many
# short segments, as a real receiver's URL with a query can be.
LONG_URL = (
    "http://127.0.0.1:9/orders-service/webhooks/production/eu-west-1/brand-api/incoming"
    "?source=brand-api&version=2026-11&team=checkout"
)
LONG_KEY = "order-2026-11-25-lagos-warehouse-7-checkout-session-0f3a9c7e-4b1d-4e2a-purchase"
SETTLE_MS = 20_000

VIEWPORTS = pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["laptop", "phone"])
JAVASCRIPT = pytest.mark.parametrize("javascript", [False, True], ids=["no-js", "js"])


def make_key(app, brand_id: str, scopes=("read", "write"), name: str = "ops") -> str:
    with app.app_context():
        issued = create_api_key(brand_id=brand_id, name=name, scopes=scopes, created_by="tests")
        db.session.commit()
        return issued.secret


def failing_endpoint(app, brand_id: str, *, deliveries: int = 2) -> tuple[str, list[str]]:
    """An endpoint at LONG_URL whose `deliveries` deliveries each failed twice, a second
    apart, a minute ago, and are retrying in 30 minutes: (its id, their ids)."""
    now = utcnow().replace(microsecond=0)
    with app.app_context():
        endpoint_id = register_endpoint(
            brand_id=brand_id,
            url=LONG_URL,
            description="Orders, production",
            events=["deal.completed", "escrow.released"],
            policy=LOCAL,
            now=now - timedelta(minutes=2),
        ).id
        delivery_ids = []
        for _ in range(deliveries):
            published = publish_event(
                brand_id=brand_id, name="deal.completed", data={}, now=now - timedelta(minutes=2)
            )
            delivery_ids += published.delivery_ids
        for delivery_id in delivery_ids:
            for number, seconds in enumerate((61, 60), start=1):
                db.session.add(
                    WebhookAttempt(
                        delivery_id=delivery_id,
                        endpoint_id=endpoint_id,
                        attempt_number=number,
                        requested_at=now - timedelta(seconds=seconds),
                        duration_ms=3,
                        http_status=None,
                        error="Connection refused",
                        response_body=None,
                        request_headers={},
                    )
                )
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id.in_(delivery_ids))
            .values(
                attempt_count=2,
                last_error="Connection refused",
                next_attempt_at=now + timedelta(minutes=30),
            )
        )
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_id)
            .values(consecutive_failures=2 * deliveries, failing_since=now - timedelta(seconds=61))
        )
        db.session.commit()
        db.session.remove()
    return endpoint_id, delivery_ids


# --- item 4: every table fits its card, nothing is cut, at both sizes ----------------------------

# Everything on the page that a person would find cut off or overflowing, as sentences.
_LAYOUT_PROBLEMS = """() => {
  const problems = [];
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth) {
    problems.push(`the page scrolls ${root.scrollWidth - root.clientWidth} px sideways`);
  }
  const inner = (box) => {
    const style = getComputedStyle(box);
    return box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  };
  for (const table of document.querySelectorAll("main table")) {
    const card = table.closest(".card") || table.parentElement;
    const width = table.getBoundingClientRect().width;
    if (width > inner(card) + 1) {
      const head = (card.querySelector("h1, h2") || {}).textContent || card.className;
      const sizes = `${Math.round(width)} px wide in a ${inner(card)} px card`;
      problems.push(`a table ${sizes} (${head.trim()})`);
    }
  }
  // A box that clips or scrolls what it holds (a code block scrolls by design; the hidden
  // headers of a phone's stacked tables are for screen readers).
  const skip = "pre, pre *, .visually-hidden, .skip-link, thead, thead *, svg, svg *, "
    + "select, input, textarea";
  for (const element of document.body.querySelectorAll("*")) {
    if (element.matches(skip) || !element.getClientRects().length) continue;
    const style = getComputedStyle(element);
    if (style.overflowX === "visible") continue;
    if (element.scrollWidth > element.clientWidth + 1) {
      const text = (element.textContent || "").trim().slice(0, 40);
      const name = `${element.tagName.toLowerCase()}.${element.className}`;
      problems.push(`cut (${style.overflowX}): ${name} "${text}"`);
    }
  }
  // The labels a phone's stacked table puts before each value.
  const canvas = document.createElement("canvas").getContext("2d");
  for (const cell of document.querySelectorAll("main td[data-label]")) {
    const label = getComputedStyle(cell, "::before");
    if (label.content === "none" || label.display === "none") continue;
    if (!cell.getClientRects().length) continue;
    let text = cell.dataset.label;
    if (label.textTransform === "uppercase") text = text.toUpperCase();
    canvas.font = `${label.fontWeight} ${label.fontSize} ${label.fontFamily}`;
    const spacing = parseFloat(label.letterSpacing) || 0;
    const needed = canvas.measureText(text).width + spacing * text.length;
    if (needed > parseFloat(label.width) + 1) {
      problems.push(`the label "${cell.dataset.label}" is cut`);
    }
  }
  const nav = document.querySelector(".dash-nav");
  if (nav) {
    if (nav.scrollWidth > nav.clientWidth + 1) problems.push("the nav scrolls sideways");
    for (const link of nav.querySelectorAll("a")) {
      const box = link.getBoundingClientRect();
      if (box.left < 0 || box.right > innerWidth + 0.5) {
        problems.push(`the nav's "${link.textContent.trim()}" is cut`);
      }
    }
  }
  return problems;
}"""

# Where each long token (a URL, an id, a key) breaks across lines: the characters either side
# of every break that is not after a separator.
_BAD_BREAKS = """() => {
  const sensible = "/?&=_-.:,";
  const tokens = document.querySelectorAll(
    "main .wrap a, main a.wrap, main code.wrap, main .endpoint-title .wrap, "
    + "main td.delivery-endpoint a, main td.link-url"
  );
  const bad = [];
  for (const element of tokens) {
    if (!element.getClientRects().length) continue;
    const letters = [];
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const rects = range.getClientRects();
        if (rects.length && rects[0].width > 0) letters.push([node.data[i], rects[0].top]);
      }
    }
    for (let i = 1; i < letters.length; i++) {
      const [before, top] = letters[i - 1];
      const [after, nextTop] = letters[i];
      if (nextTop > top + 2 && !sensible.includes(before) && before.trim() && after.trim()) {
        const where = `broken between "${before}" and "${after}"`;
        bad.push(`${element.textContent.trim().slice(0, 60)}: ${where}`);
      }
    }
  }
  return bad;
}"""


def demo_with_long_tokens(app) -> tuple[str, str, str, str]:
    """The demo workspace (`flask demo seed`), an endpoint at LONG_URL with deliveries
    retrying, a conversion under LONG_KEY with a code nobody knows: (brand, endpoint,
    delivery, conversion)."""
    with app.app_context():
        brand_id = seed_demo_workspace().brand.id
        db.session.commit()
    endpoint_id, [delivery_id, _] = failing_endpoint(app, brand_id)
    with app.app_context():
        conversion_id = record_postback(
            brand_id=brand_id,
            idempotency_key=LONG_KEY,
            postback=Postback(event_type="newsletter_signup_from_footer", link_code="NOT-OURS"),
        ).conversion.id
        db.session.commit()
    return brand_id, endpoint_id, delivery_id, conversion_id


@VIEWPORTS
@JAVASCRIPT
def test_every_page_fits_its_width_cuts_no_text_and_breaks_urls_at_sensible_points(
    app, open_page, viewport, javascript
):
    brand_id, endpoint_id, delivery_id, conversion_id = demo_with_long_tokens(app)
    page = open_page(viewport, javascript)
    sign_in_with_key(page, make_key(app, brand_id, scopes=("read",)))
    pages = [
        "/dashboard/",
        "/dashboard/keys",
        "/dashboard/endpoints",
        "/dashboard/deliveries",
        "/dashboard/conversions",
        "/dashboard/links",
        "/dashboard/events",
        f"/dashboard/search?q={delivery_id}",
        f"/dashboard/endpoints/{endpoint_id}",
        f"/dashboard/deliveries/{delivery_id}",
        f"/dashboard/conversions/{conversion_id}",
    ]
    found = {}
    for path in pages:
        page.goto(path)
        page.wait_for_load_state()
        # What a folded section holds must fit too, at the width it is shown at: opened.
        page.evaluate("document.querySelectorAll('main details').forEach((d) => (d.open = true))")
        problems = page.evaluate(_LAYOUT_PROBLEMS) + page.evaluate(_BAD_BREAKS)
        if problems:
            found[path] = problems
    assert found == {}

    # The long key and URL were there to be measured, and did wrap.
    page.goto("/dashboard/conversions")
    key = page.locator("code.wrap").filter(has_text=LONG_KEY)
    assert key.evaluate("(el) => el.getClientRects().length") >= 2
    page.goto(f"/dashboard/endpoints/{endpoint_id}")
    title = page.locator(".endpoint-title .wrap")
    assert title.inner_text().replace("\n", "") == LONG_URL


# --- item 6: an action refreshes every panel it changed ------------------------------------------


def health_deliveries(page) -> str:
    figures = page.locator("#endpoint-health dt", has_text="Deliveries").locator(
        "xpath=./following-sibling::dd[1]"
    )
    return " ".join(figures.inner_text().split())


@VIEWPORTS
@JAVASCRIPT
def test_disable_and_re_enable_refresh_every_panel_they_change(
    app, open_page, brand, viewport, javascript
):
    endpoint_id, delivery_ids = failing_endpoint(app, brand)
    key = make_key(app, brand)
    page = open_page(viewport, javascript)
    sign_in_with_key(page, key)
    page.goto(f"/dashboard/endpoints/{endpoint_id}")
    assert health_deliveries(page) == "0 waiting · 2 retrying · 0 delivered · 0 failed"
    summary = page.locator("#endpoint-summary")
    expect(summary.locator("dd").filter(has_text=re.compile(r"^4$"))).to_have_count(1)
    if javascript:
        page.evaluate("window.__sameDocument = true")
        page.once("dialog", lambda dialog: dialog.accept())
        page.get_by_role("button", name="Disable", exact=True).click()
    else:
        page.get_by_role("button", name="Disable", exact=True).click()
        page.get_by_role("button", name="Disable", exact=True).click()  # the confirmation page
    expect(
        page.get_by_text("Endpoint disabled; its pending deliveries ended as failed.")
    ).to_be_visible()

    # Every panel the change touched says so now, without a reload.
    by = f"Disabled from the dashboard by key “ops” ({key[:12]}…)"
    expect(summary).to_contain_text(by)
    expect(summary).to_contain_text("4 when it was disabled; nothing is attempted while it is")
    expect(summary.get_by_role("button", name="Send test")).to_have_count(0)
    assert health_deliveries(page) == "0 waiting · 0 retrying · 0 delivered · 2 failed"
    expect(page.locator("#endpoint-recover")).to_contain_text("Re-enable the endpoint first")
    expect(page.locator("#endpoint-example")).to_contain_text("Re-enable the endpoint first")
    for delivery_id in delivery_ids:
        expect(page.locator(f"#delivery-{delivery_id} .status-failed")).to_be_visible()
    if javascript:
        assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
    # And what the deliveries' log says of them, in the same words.
    page.goto(f"/dashboard/deliveries/{delivery_ids[0]}")
    expect(
        page.get_by_text("Endpoint disabled from the dashboard by key “ops”").first
    ).to_be_visible()
    assert "update-endpoint" not in page.locator("main").inner_text()

    page.goto(f"/dashboard/endpoints/{endpoint_id}")
    if javascript:
        page.evaluate("window.__sameDocument = true")
    page.get_by_role("button", name="Re-enable").click()
    expect(page.get_by_text("Endpoint re-enabled")).to_be_visible()
    expect(summary.locator("dd").filter(has_text=re.compile(r"^0$"))).to_have_count(1)
    open_fold(page, "Send again what failed")
    open_fold(page, "Send an example event")
    expect(
        page.locator("#endpoint-recover").get_by_role("button", name="Send again")
    ).to_be_visible()
    expect(
        page.locator("#endpoint-example").get_by_role("button", name="Send example")
    ).to_be_visible()

    # A test ping: the health figures count it at once (no worker runs here: it stays pending).
    summary.get_by_role("button", name="Send test").click()
    expect(page.get_by_text("Test ping queued as delivery")).to_be_visible()
    expect(page.locator("#endpoint-health")).to_contain_text(
        "1 waiting · 0 retrying · 0 delivered · 2 failed"
    )
    if javascript:
        assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"


# --- item 9: times read absolute and relative --------------------------------------------------


@VIEWPORTS
@JAVASCRIPT
def test_times_read_to_the_second_with_how_long_ago_beside_them(
    app, open_page, brand, read_key, viewport, javascript
):
    endpoint_id, [delivery_id, _] = failing_endpoint(app, brand)
    page = open_page(viewport, javascript)
    if javascript:
        page.clock.install()  # the page's own clock, moved on below
    sign_in_with_key(page, read_key)
    page.goto(f"/dashboard/deliveries/{delivery_id}")

    created = page.locator("dt", has_text="Created").locator("xpath=./following-sibling::dd[1]")
    stamp = created.locator("time")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", stamp.inner_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp.get_attribute("datetime"))
    assert stamp.get_attribute("title") == stamp.inner_text()
    expect(created.locator(".ago")).to_have_text("2 min ago")
    next_retry = page.locator("dt", has_text="Next retry").locator(
        "xpath=./following-sibling::dd[1]"
    )
    expect(next_retry.locator(".ago")).to_have_text(re.compile(r"^in (29|30) min$"))
    assert next_retry.locator(".ago").get_attribute("title").endswith(" UTC")

    # A table: the time, and under it how long ago.
    page.goto("/dashboard/deliveries")
    cell = page.locator(f"#delivery-{delivery_id} td").first
    expect(cell.locator("time")).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"))
    expect(cell.locator(".ago")).to_have_text("2 min ago")
    box, ago = cell.locator("time").bounding_box(), cell.locator(".ago").bounding_box()
    assert ago["y"] >= box["y"] + box["height"] - 1, "how long ago goes under the time"

    # The health chart: a caption with dates, and the card's whole width.
    page.goto(f"/dashboard/endpoints/{endpoint_id}")
    caption = page.locator("#endpoint-health figcaption").inner_text()
    assert re.match(r"From \d{4}-\d\d-\d\d \d\d:\d\d to \d{4}-\d\d-\d\d \d\d:\d\d UTC", caption), (
        caption
    )
    chart = page.locator("#endpoint-health svg").bounding_box()
    card = page.locator("#endpoint-health").evaluate(
        "(card) => card.clientWidth - parseFloat(getComputedStyle(card).paddingLeft)"
        " - parseFloat(getComputedStyle(card).paddingRight)"
    )
    assert abs(chart["width"] - card) <= 2, (chart, card)

    if javascript:
        # A page left open keeps its relative times true (the endpoint's summary: a region no
        # poll redraws; what polls redraw, the server writes anew).
        created = page.locator("#endpoint-summary dt", has_text="Created").locator(
            "xpath=./following-sibling::dd[1]"
        )
        expect(created.locator(".ago")).to_have_text("2 min ago")
        page.clock.fast_forward("01:00:00")
        expect(created.locator(".ago")).to_have_text("1 h ago")


# --- item 11: send an example event ----------------------------------------------------------


@VIEWPORTS
@JAVASCRIPT
def test_an_example_event_reaches_the_receiver_signed_and_logged(
    app, app_environ, open_page, brand, receiver, viewport, javascript
):
    with app.app_context():
        issued = register_endpoint(
            brand_id=brand, url=receiver.url, events=["conversion.recorded"], policy=LOCAL
        )
        db.session.commit()
        endpoint_id = issued.id
    receiver.secrets.append(issued.signing_secret)
    worker = WorkerProcess(app_environ)
    try:
        page = open_page(viewport, javascript)
        sign_in_with_key(page, make_key(app, brand))
        page.goto(f"/dashboard/endpoints/{endpoint_id}")
        open_fold(page, "Send an example event")
        panel = page.locator("#endpoint-example")
        expect(panel.get_by_label("Event")).to_have_value("conversion.recorded")  # subscribed
        panel.get_by_label("Event").select_option("deal.completed")  # not subscribed
        panel.get_by_role("button", name="Send example").click()
        shown = page.get_by_text(re.compile(r"Example deal\.completed queued as delivery whd_\w+"))
        expect(shown.first).to_be_visible()

        (received,) = receiver.wait_for(1)
        assert received.signature_valid, received.headers
        assert received.headers["X-Service-Event"] == "deal.completed"
        assert received.json["data"] == sample_data("deal.completed")
        row = page.locator(f"#delivery-{received.delivery_id}")
        expect(row).to_contain_text("deal.completed")
        # Without a script the page shows what was true when it was drawn: reload to see more.
        deadline = time.monotonic() + SETTLE_MS / 1000
        while not javascript and "delivered" not in row.inner_text():
            assert time.monotonic() < deadline, row.inner_text()
            page.wait_for_timeout(500)
            page.reload()
        expect(row).to_contain_text("delivered", timeout=SETTLE_MS)
    finally:
        worker.stop()
    with app.app_context():
        logged = db.session.scalar(
            select(WebhookDelivery).where(WebhookDelivery.id == received.delivery_id)
        )
        assert (logged.endpoint_id, logged.event_name, logged.status) == (
            endpoint_id,
            "deal.completed",
            "delivered",
        )


def test_a_read_key_is_offered_no_example_to_send(app, open_page, brand, read_key):
    with app.app_context():
        endpoint_id = register_endpoint(
            brand_id=brand, url=LONG_URL, events=["deal.completed"], policy=LOCAL
        ).id
        db.session.commit()
    page = open_page(LAPTOP, True)
    sign_in_with_key(page, read_key)
    page.goto(f"/dashboard/endpoints/{endpoint_id}")
    expect(page.get_by_role("button", name="Send test")).to_be_visible()
    expect(page.locator("#endpoint-example")).to_have_count(0)
