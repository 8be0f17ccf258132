"""The dashboard at a glance, in Debian's Chromium (tests/browser.py), on a laptop (1280x800) and
a phone (390x844), with JavaScript off and on: what the newcomer's first hour (issue 36, item
11) could not tell from the pages.

- The overview's failing deliveries say which endpoint they go to, and link to it.
- An event's "Resend to endpoint…" shows each endpoint's URL whole, not cut to its first letters.
- A delivery's state reads the same word on every page: waiting, retrying, delivered or failed.
- An endpoint's page answers "is it working, and what failed" on its first screen (its state,
  its health, its latest failures with their errors); the rest is folded behind a menu whose
  links work without a script, so the page is under two screens tall on a laptop.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from sqlalchemy import update

from extensions import db
from models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from models.columns import utcnow
from models.event_catalog import EVENT_NAMES
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint
from tests.browser import LAPTOP, PHONE, expect, sign_in_with_key
from tests.delivery_states import settle

LOCAL = UrlPolicy(https_only=False, allow_local=True)
# Nothing listens on the discard port: a real worker's attempts would be refused.
ORDERS_URL = (
    "http://127.0.0.1:9/orders-service/webhooks/production/eu-west-1/brand-api/incoming"
    "?source=brand-api&version=2026-11"
)
BILLING_URL = "http://127.0.0.1:9/billing/hooks"
# The words a delivery's state is said in, everywhere on the dashboard.
STATES = ("waiting", "retrying", "delivered", "failed")

VIEWPORTS = pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["laptop", "phone"])
JAVASCRIPT = pytest.mark.parametrize("javascript", [False, True], ids=["no-js", "js"])


def endpoint(app, brand_id: str, url: str, description: str | None = None, events=None) -> str:
    with app.app_context():
        endpoint_id = register_endpoint(
            brand_id=brand_id,
            url=url,
            description=description,
            events=list(events or ["deal.completed"]),
            policy=LOCAL,
            now=utcnow() - timedelta(hours=1),
        ).id
        db.session.commit()
        db.session.remove()
    return endpoint_id


def delivery(
    app,
    brand_id: str,
    endpoint_id: str,
    state: str,
    *,
    event: str = "deal.completed",
    errors: tuple[str, ...] = ("Connection refused", "Connection refused"),
    last_at: datetime | None = None,
) -> str:
    """A delivery of a new `event` to the endpoint alone, left as a worker leaves one in
    `state`: waiting (no attempt), retrying or failed (its attempts failed with `errors`, a
    minute apart, the last at `last_at`), delivered (one attempt, 200). Its id."""
    last_at = (last_at or utcnow() - timedelta(minutes=1)).replace(microsecond=0)
    with app.app_context():
        [delivery_id] = publish_event(
            brand_id=brand_id,
            name=event,
            data={},
            only_endpoint_ids=[endpoint_id],
            now=last_at - timedelta(minutes=len(errors) + 1),
        ).delivery_ids
        outcomes = [(None, error) for error in errors] if state != "delivered" else [(200, None)]
        if state == "waiting":
            outcomes = []
        for number, (http_status, error) in enumerate(outcomes, start=1):
            db.session.add(
                WebhookAttempt(
                    delivery_id=delivery_id,
                    endpoint_id=endpoint_id,
                    attempt_number=number,
                    requested_at=last_at - timedelta(minutes=len(outcomes) - number),
                    duration_ms=12,
                    http_status=http_status,
                    error=error,
                    response_body=None,
                    request_headers={},
                )
            )
        values: dict = {"attempt_count": len(outcomes)}
        if state == "delivered":
            settle([delivery_id], "delivered", http_status=200, delivered_at=last_at, **values)
        elif state == "failed":
            settle([delivery_id], "failed", failed_at=last_at, last_error=errors[-1], **values)
        else:
            if state == "retrying":
                values |= {"last_error": errors[-1]}
                values |= {"next_attempt_at": last_at + timedelta(minutes=30)}
            db.session.execute(
                update(WebhookDelivery).where(WebhookDelivery.id == delivery_id).values(**values)
            )
        if state in ("retrying", "failed"):
            db.session.execute(
                update(WebhookEndpoint)
                .where(WebhookEndpoint.id == endpoint_id)
                .values(consecutive_failures=WebhookEndpoint.consecutive_failures + len(errors))
            )
        db.session.commit()
        db.session.remove()
    return delivery_id


def in_first_screen(locator, viewport: dict) -> bool:
    """Whether the element shows, whole, in the window before any scrolling."""
    box = locator.bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= viewport["height"]


# --- the overview names each failing delivery's endpoint ------------------------------------------


@VIEWPORTS
def test_the_overviews_failing_deliveries_name_their_endpoint_and_link_to_it(
    app, open_page, brand, read_key, viewport
):
    orders = endpoint(app, brand, ORDERS_URL, "Orders, production")
    billing = endpoint(app, brand, BILLING_URL)
    retrying = {
        orders: [delivery(app, brand, orders, "retrying") for _ in range(2)],
        billing: [delivery(app, brand, billing, "retrying") for _ in range(2)],
    }
    failed = delivery(app, brand, billing, "failed")
    page = open_page(viewport)
    sign_in_with_key(page, read_key)
    page.goto("/dashboard/")

    # An endpoint with a description is named by it; one without, by its URL in brief: host and
    # path, no scheme. Either way the whole URL and the id are in the link's title.
    names = {orders: "Orders, production", billing: "127.0.0.1:9/billing/hooks"}
    urls = {orders: ORDERS_URL, billing: BILLING_URL}
    rows = page.get_by_role("heading", name="Retrying now").locator(
        "xpath=following-sibling::ul[1]/li"
    )
    expect(rows).to_have_count(4)
    for endpoint_id, delivery_ids in retrying.items():
        for delivery_id in delivery_ids:
            row = rows.filter(has=page.locator(f'a[href="/dashboard/deliveries/{delivery_id}"]'))
            link = row.locator("a.endpoint-ref")
            expect(link).to_have_text(names[endpoint_id])
            expect(link).to_have_attribute("href", f"/dashboard/endpoints/{endpoint_id}")
            expect(link).to_have_attribute("title", f"{urls[endpoint_id]} ({endpoint_id})")
            expect(row).to_contain_text("attempt 2 failed: Connection refused")
    texts = {" ".join(text.split()[:4]) for text in rows.all_inner_texts()}
    assert len(texts) == 2, texts  # two endpoints: two different lines, not four alike
    failures = page.get_by_role("heading", name="Latest failures").locator(
        "xpath=following-sibling::ul[1]/li"
    )
    failure = failures.filter(has=page.locator(f'a[href="/dashboard/deliveries/{failed}"]'))
    expect(failure.locator("a.endpoint-ref")).to_have_text(names[billing])

    # The name leads to the endpoint.
    rows.first.locator("a.endpoint-ref").click()
    expect(page).to_have_url(re.compile(r"/dashboard/endpoints/whe_\w+$"))
    expect(page.locator(".endpoint-title")).to_be_visible()


# --- an event's resend list shows whole URLs ------------------------------------------------------


@VIEWPORTS
@JAVASCRIPT
def test_resending_an_event_offers_each_endpoint_by_its_whole_url(
    app, open_page, brand, write_key, viewport, javascript
):
    # Two URLs alike until their last segment: a list cut to its first letters cannot tell them
    # apart.
    first = endpoint(app, brand, "http://127.0.0.1:8000/hooks/orders-service/production")
    second = endpoint(app, brand, "http://127.0.0.1:8000/hooks/orders-service/staging", "Staging")
    third = endpoint(app, brand, ORDERS_URL, "Orders, production")
    with app.app_context():  # an event none of them subscribes to: no delivery yet
        event_id = publish_event(brand_id=brand, name="escrow.held", data={}).event.id
        db.session.commit()
    page = open_page(viewport, javascript)
    sign_in_with_key(page, write_key)
    page.goto(f"/dashboard/events/{event_id}")
    resend = page.locator("#event-resend")
    for endpoint_id, url in [
        (first, "http://127.0.0.1:8000/hooks/orders-service/production"),
        (second, "http://127.0.0.1:8000/hooks/orders-service/staging"),
        (third, ORDERS_URL),
    ]:
        # All of it, in sight, not clipped by its box, and the endpoint's id beside it.
        shown = resend.get_by_text(url, exact=True)
        expect(shown).to_be_visible()
        assert shown.evaluate("(el) => el.scrollWidth <= el.clientWidth + 1")
        box = shown.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"], box
        choice = resend.get_by_role("radio", name=url)
        expect(choice).to_have_value(endpoint_id)
        label = resend.locator("label", has=page.get_by_role("radio", name=url))
        assert label.get_attribute("title") == (f"{url} ({endpoint_id})")
    expect(resend.get_by_role("radio")).to_have_count(3)
    expect(page.locator("#event-resend").get_by_text("Staging", exact=True)).to_be_visible()

    # Choosing one by its URL and sending it makes a delivery there.
    page.get_by_label(re.compile(r"orders-service/\s*staging")).check()
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page.get_by_text("Queued as delivery")).to_be_visible()
    rows = page.locator("#event-deliveries tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.locator(f'a[href="/dashboard/endpoints/{second}"]')).to_have_count(1)


# --- one word for a delivery's state, on every page -----------------------------------------------


def test_a_deliverys_state_reads_the_same_word_on_every_page(app, open_page, brand, read_key):
    orders = endpoint(app, brand, ORDERS_URL, "Orders, production", events=EVENT_NAMES)
    ids = {
        state: delivery(app, brand, orders, state, event=event)
        for state, event in zip(
            STATES,
            ["deal.completed", "escrow.released", "deal.accepted", "escrow.held"],
            strict=True,
        )
    }
    with app.app_context():
        event_ids = {
            state: db.session.get(WebhookDelivery, delivery_id).event_id
            for state, delivery_id in ids.items()
        }
        db.session.remove()
    page = open_page()
    sign_in_with_key(page, read_key)

    def badge(scope) -> str:
        """The one state word shown in `scope`."""
        words = scope.locator(".status").all_inner_texts()
        said = [word for word in words if word in (*STATES, "pending")]
        assert len(said) == 1, words
        return said[0]

    for state, delivery_id in ids.items():
        seen = {}
        page.goto("/dashboard/deliveries")
        seen["deliveries"] = badge(page.locator(f"#delivery-{delivery_id} td[data-label=Status]"))
        page.goto(f"/dashboard/deliveries/{delivery_id}")
        seen["delivery"] = badge(page.locator("#delivery-status h2"))
        page.goto(f"/dashboard/events/{event_ids[state]}")
        seen["event"] = badge(page.locator(f"#delivery-{delivery_id} td[data-label=Status]"))
        page.goto("/dashboard/events")
        seen["events"] = badge(page.locator(f"#event-{event_ids[state]} [data-deliveries]"))
        page.goto(f"/dashboard/endpoints/{orders}")
        seen["endpoint"] = badge(page.locator(f"#endpoint-deliveries #delivery-{delivery_id}"))
        assert seen == dict.fromkeys(seen, state), seen

    # Counted, in the same words and order: the endpoint's health, and the overview's tiles.
    page.goto(f"/dashboard/endpoints/{orders}")
    deliveries = page.locator("#endpoint-health dt", has_text="Deliveries").locator(
        "xpath=./following-sibling::dd[1]"
    )
    expect(deliveries).to_have_text("1 waiting · 1 retrying · 1 delivered · 1 failed")
    page.goto("/dashboard/")
    tiles = page.locator(".health-tiles .tile-label .status").all_text_contents()
    assert tiles == ["retrying", "waiting", "delivered", "failed"]
    # `pending` is named only as the API's status, never as a delivery's state.
    for path, deliveries_shown in [
        ("/dashboard/", ".health-tiles, #retrying-now, #latest-failures"),
        ("/dashboard/deliveries", "#delivery-results"),
        ("/dashboard/events", "#event-results"),
        (f"/dashboard/endpoints/{orders}", "#endpoint-health, #endpoint-deliveries"),
    ]:
        page.goto(path)
        shown = page.locator(deliveries_shown)
        expect(shown.first).to_be_visible()
        assert not re.search(r"\bpending\b", " ".join(shown.all_inner_texts())), path


# --- an endpoint's page: what matters first, the rest a menu away ---------------------------------

# Two laptop screens: the state and actions, the health and latest failures, the recent
# deliveries and the folded sections' titles. Everything the page held before (the snippets, the
# forms) is one click away, so a longer page would be one nobody folded.
LAPTOP_HEIGHT = 2 * LAPTOP["height"]
# A phone stacks each delivery of a table into a card of six lines, and the frame's nav alone
# takes a sixth of the screen: four of its screens.
PHONE_HEIGHT = 4 * PHONE["height"]
# What a failing endpoint's page adds on a phone, before its folded sections: the few lines of
# its last failure (CONTRACT 13.4: delivery, event, status, error; the answer folded).
LAST_FAILURE_NOTICE = 150


def endpoint_in_trouble(app, brand_id: str) -> tuple[str, str]:
    """An endpoint at ORDERS_URL subscribed to every event, with the recent history of one that
    broke: deliveries that arrived, then ones retrying; its latest failed attempt said
    "HTTP 503: upstream timeout". (Its id, that failure's delivery.)"""
    endpoint_id = endpoint(app, brand_id, ORDERS_URL, "Orders, production", events=EVENT_NAMES)
    now = utcnow()
    for minutes in range(40, 20, -3):
        delivery(app, brand_id, endpoint_id, "delivered", last_at=now - timedelta(minutes=minutes))
    for minutes in (12, 8):
        delivery(app, brand_id, endpoint_id, "retrying", last_at=now - timedelta(minutes=minutes))
    latest = delivery(
        app,
        brand_id,
        endpoint_id,
        "retrying",
        event="escrow.released",
        errors=("Connection refused", "HTTP 503: upstream timeout"),
        last_at=now - timedelta(minutes=2),
    )
    return endpoint_id, latest


@VIEWPORTS
@JAVASCRIPT
def test_an_endpoints_first_screen_says_if_it_works_and_what_failed(
    app, open_page, brand, write_key, viewport, javascript
):
    endpoint_id, latest = endpoint_in_trouble(app, brand)
    page = open_page(viewport, javascript)
    sign_in_with_key(page, write_key)
    page.goto(f"/dashboard/endpoints/{endpoint_id}")
    page.wait_for_load_state("load")

    # Its state, its success rate and its latest failure with the error, before any scrolling.
    title = page.locator(".endpoint-title")
    expect(title).to_contain_text("failing")
    rate = page.locator("#endpoint-health dt", has_text="Success rate").locator(
        "xpath=./following-sibling::dd[1]"
    )
    expect(rate).to_have_text(re.compile(r"^\d+\.\d% of attempts$"))
    failure = page.locator("#endpoint-health .failure-list li").first
    expect(failure).to_contain_text("escrow.released attempt 2: HTTP 503: upstream timeout")
    expect(failure.locator(f'a[href^="/dashboard/deliveries/{latest}"]')).to_have_count(1)
    for shown in (title, rate, failure):
        assert in_first_screen(shown, viewport), (shown, shown.bounding_box())
    if viewport == LAPTOP:  # a phone has them next, after the health
        assert in_first_screen(page.get_by_role("button", name="Send test"), viewport)

    # Not the whole of everything: under the bound before anything is opened.
    height = page.evaluate("document.documentElement.scrollHeight")
    bound = LAPTOP_HEIGHT if viewport == LAPTOP else PHONE_HEIGHT + LAST_FAILURE_NOTICE
    assert height <= bound, f"the page is {height} px tall, more than {bound}"

    # The rest is folded under its title, in a row right after the first screen; a title opens
    # its section (no script needed).
    folds = page.get_by_role("group", name="More about this endpoint")
    titles = folds.locator("summary").all_inner_texts()
    assert [title.split("\n")[0] for title in titles] == [
        "Events and settings",
        "Send an example event",
        "Verify signatures",
        "Signing secret",
        "Send again what failed",
        "Delete endpoint",
    ]
    top = folds.bounding_box()["y"]
    if viewport == LAPTOP:
        assert top < 1.25 * viewport["height"]
    else:
        assert top < PHONE_HEIGHT / 2 + LAST_FAILURE_NOTICE
    expect(page.locator("#snippet-python")).not_to_be_visible()
    folds.locator("summary", has_text="Verify signatures").click()
    expect(page.locator("#snippet-python")).to_be_visible()
    folds.locator("summary", has_text="Events and settings").click()
    expect(page.locator("#endpoint-settings code.event-name").first).to_be_visible()
    expect(page.get_by_label("Endpoint URL")).to_have_value(ORDERS_URL)
    # A link to a section opens it too (a redirect's #anchor, a link shared).
    page.goto(f"/dashboard/endpoints/{endpoint_id}#endpoint-recover")
    expect(page.get_by_role("button", name="Send again")).to_be_visible()
    expect(page.get_by_role("button", name="Rotate secret")).not_to_be_visible()
