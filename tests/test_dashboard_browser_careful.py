"""The dashboard in Debian's Chromium (tests/browser.py) with JavaScript off and on, on a laptop
and on a phone (390x844): a reload never repeats an action, destructive actions ask first
everywhere, one-time secrets show once, a failing delivery reads "retrying", a code nobody knows
is not called attributed, ids can be searched, times read to the second, and no page scrolls
sideways.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import requests
from sqlalchemy import func, select, update

from extensions import db
from models import QueuedDelivery, WebhookAttempt, WebhookDelivery
from models.columns import utcnow
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.postbacks import Postback, record_postback
from services.webhook_endpoints import register_endpoint
from tests.browser import PHONE, expect, open_context, open_fold, sign_in_with_key
from tests.dashboard import SIGNING_SECRET
from tests.delivery_states import wait_for_a_retry
from tests.test_platform_changes import Platform

API_KEY = re.compile(r"svc_live_[0-9A-Za-z]{20,}")
LOCAL = UrlPolicy(https_only=False, allow_local=True)
DOWN_URL = "http://127.0.0.1:9/orders/webhooks"


def deliveries_of(app, endpoint_id: str) -> int:
    with app.app_context():
        count = db.session.scalar(
            select(func.count()).where(WebhookDelivery.endpoint_id == endpoint_id)
        )
        db.session.remove()
    return count


# --- item 5: careful actions, without JavaScript ------------------------------------------------


def test_without_javascript_the_first_key_survives_a_reload_and_a_pasted_token_is_pointed_on(
    no_js, make_brand, make_bootstrap_token
):
    brand_id = make_brand("Acme Foods")
    token = make_bootstrap_token(brand_id)
    page = no_js.new_page()

    page.goto("/dashboard/sign-in")
    page.get_by_label("API key").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_text("That is a bootstrap token, not an API key")).to_be_visible()
    page.get_by_role("link", name="Create your brand's first key", exact=True).click()

    page.get_by_label("Brand id").fill(brand_id)
    page.get_by_label("Bootstrap token").fill(token)
    page.get_by_role("button", name="Create key and sign in").click()
    expect(page).to_have_url(re.compile(r"/dashboard/first-key/created$"))
    expect(page.get_by_role("heading", name="Key “dashboard” created")).to_be_visible()
    assert API_KEY.search(page.content())
    page.reload()  # no "form expired": a GET, and the secret is gone
    expect(page.get_by_role("heading", name="Acme Foods")).to_be_visible()
    expect(page.get_by_text("its secret was shown once")).to_be_visible()
    assert not API_KEY.search(page.content())


def test_without_javascript_keys_are_made_once_and_revoked_after_a_question(
    app, no_js, brand, write_key, make_key
):
    make_key(brand, name="old-service")
    page = no_js.new_page()
    sign_in_with_key(page, write_key)
    page.goto("/dashboard/keys")

    page.get_by_label("Name").fill("no-js-key")
    page.get_by_role("button", name="Create key").click()
    expect(page.get_by_role("heading", name="Key “no-js-key” created")).to_be_visible()
    page.reload()
    expect(page.get_by_role("heading", name="Create a key")).to_be_visible()
    assert not API_KEY.search(page.content())
    expect(page.get_by_role("row").filter(has_text="no-js-key")).to_have_count(1)

    page.get_by_role("row").filter(has_text="old-service").get_by_role(
        "button", name="Revoke"
    ).click()
    expect(page.get_by_role("heading", name="Revoke the key “old-service”?")).to_be_visible()
    expect(page.get_by_text("Every request with it fails at once")).to_be_visible()
    page.get_by_role("button", name="Revoke key").click()
    expect(page).to_have_url(re.compile(r"/dashboard/keys$"))
    expect(page.get_by_role("row").filter(has_text="old-service")).to_have_count(0)


def test_without_javascript_an_endpoint_is_registered_tested_and_deleted_carefully(
    app, no_js, brand, write_key
):
    page = no_js.new_page()
    sign_in_with_key(page, write_key)
    page.goto("/dashboard/endpoints")
    page.get_by_label("Endpoint URL").fill(DOWN_URL)
    page.get_by_label("Description (optional)").fill("Orders, staging")
    page.get_by_role("button", name="Register endpoint").click()
    expect(page.get_by_role("heading", name="Endpoint registered")).to_be_visible()
    assert SIGNING_SECRET.search(page.content())
    page.reload()
    assert not SIGNING_SECRET.search(page.content())
    page.get_by_role("link", name=DOWN_URL).click()
    expect(page.get_by_text("Orders, staging").first).to_be_visible()
    endpoint_id = page.url.rsplit("/", 1)[1]

    page.get_by_role("button", name="Send test").click()
    expect(page.get_by_text("Test ping queued as delivery")).to_be_visible()
    page.reload()  # reloading reads the page: no second test
    page.reload()
    assert deliveries_of(app, endpoint_id) == 1

    open_fold(page, "Signing secret")
    page.get_by_role("button", name="Rotate secret").click()
    expect(page.get_by_role("heading", name="Rotate the signing secret?")).to_be_visible()
    page.get_by_role("link", name="Cancel").click()
    expect(page.get_by_role("heading", name=DOWN_URL)).to_be_visible()

    open_fold(page, "Delete endpoint")
    page.get_by_role("button", name="Delete endpoint").click()
    expect(page.get_by_role("heading", name="Delete this endpoint?")).to_be_visible()
    page.get_by_role("button", name="Delete endpoint").click()
    expect(page).to_have_url(re.compile(r"/dashboard/endpoints$"))
    expect(page.get_by_text("No endpoints yet")).to_be_visible()


# --- item 5 with JavaScript: the secret box goes with its key -------------------------------------


def test_revoking_the_key_just_made_takes_its_secret_box_away(with_js, brand, write_key):
    page = with_js.new_page()
    sign_in_with_key(page, write_key)
    page.goto("/dashboard/keys")
    page.get_by_label("Name").fill("mistake")
    page.get_by_role("button", name="Create key").click()
    box = page.get_by_role("group", name="API key")
    expect(box).to_be_visible()
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("row").filter(has_text="mistake").get_by_role("button", name="Revoke").click()
    expect(page.get_by_role("row").filter(has_text="mistake")).to_have_count(0)
    expect(box).to_have_count(0)
    expect(page.get_by_role("heading", name="Create a key")).to_be_visible()


# --- items 2, 3 and 6: what the pages say ------------------------------------------------------


def retrying_delivery(app, brand_id: str) -> tuple[str, str]:
    """A delivery whose two attempts a second apart failed, a retry due: (its id, its event)."""
    now = utcnow().replace(microsecond=0)
    with app.app_context():
        register_endpoint(
            brand_id=brand_id,
            url=DOWN_URL,
            description="Orders, production",
            events=["webhook.test", "deal.completed"],
            policy=LOCAL,
        )
        published = publish_event(brand_id=brand_id, name="deal.completed", data={})
        delivery_id = published.delivery_ids[0]
        for number, at in enumerate((now - timedelta(seconds=61), now - timedelta(seconds=60))):
            db.session.add(
                WebhookAttempt(
                    delivery_id=delivery_id,
                    endpoint_id=db.session.get(WebhookDelivery, delivery_id).endpoint_id,
                    attempt_number=number + 1,
                    requested_at=at,
                    duration_ms=3,
                    http_status=None,
                    error="Connection refused",
                    response_body=None,
                    request_headers={},
                )
            )
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == delivery_id)
            .values(
                attempt_count=2,
                last_error="Connection refused",
                next_attempt_at=now + timedelta(minutes=30),
            )
        )
        record_postback(
            brand_id=brand_id,
            idempotency_key="order-0001-unknown",
            postback=Postback(event_type="purchase", link_code="NOT-OURS"),
        )
        db.session.commit()
        db.session.remove()
        return delivery_id, published.event.id


@pytest.mark.parametrize("javascript", [False, True], ids=["no-js", "js"])
def test_a_failing_delivery_reads_retrying_and_can_be_found_by_id(
    app, browser, browser_server, problems, brand, read_key, javascript
):
    delivery_id, event_id = retrying_delivery(app, brand)
    context = open_context(browser, browser_server.url, problems, javascript=javascript)
    try:
        page = context.new_page()
        sign_in_with_key(page, read_key)
        # The overview counts it, instead of "failed 0".
        expect(page.locator('[data-count="retrying"]')).to_have_text("1")
        expect(page.locator('[data-count="failed-attempts"]')).to_have_text("2")
        page.get_by_role("heading", name="Retrying now").scroll_into_view_if_needed()

        # The search box takes the delivery's id to its page; times read to the second.
        page.get_by_label("Find a delivery, event or conversion by id").fill(delivery_id)
        page.get_by_role("button", name="Find", exact=True).first.click()
        expect(page).to_have_url(re.compile(rf"/dashboard/deliveries/{delivery_id}$"))
        expect(page.get_by_text("Its endpoint is failing: 2 attempts failed")).to_be_visible()
        attempts = page.locator("#delivery-attempts .attempt-meta time")
        shown = [text.strip() for text in attempts.all_inner_texts()]
        assert len(shown) == 2 and len(set(shown)) == 2, shown  # a second apart, told apart
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", t) for t in shown), shown

        # An event id lists its deliveries; the row says retrying.
        page.get_by_label("Find a delivery, event or conversion by id").fill(event_id)
        page.get_by_role("button", name="Find", exact=True).first.click()
        row = page.locator(f"#delivery-{delivery_id}")
        expect(row.locator(".status-retrying")).to_have_text("retrying")
        expect(row).to_contain_text("2 attempts failed · next retry")
        expect(row).to_contain_text("Orders, production")

        # A code that is none of the brand's links is not called attributed.
        page.get_by_role("navigation", name="Dashboard").get_by_role(
            "link", name="Conversions"
        ).click()
        unknown = page.get_by_role("row").filter(has_text="NOT-OURS")
        expect(unknown).to_contain_text("code not recognised")
        expect(unknown).to_contain_text("not counted on any link")
        expect(unknown.locator(".badge-counted")).to_have_count(0)
    finally:
        context.close()
    problems.assert_none()


def test_pages_name_an_icon_that_is_served(with_js, browser_server, brand, read_key):
    page = with_js.new_page()
    sign_in_with_key(page, read_key)
    for path in ("/dashboard/", "/docs"):
        page.goto(path)
        for href in page.locator('link[rel="icon"]').evaluate_all(
            "links => links.map((link) => link.href)"
        ):
            assert requests.get(href, timeout=10).status_code == 200, href


# --- item 6: a phone, with and without JavaScript -----------------------------------------------

PAGES = [
    "/dashboard/",
    "/dashboard/keys",
    "/dashboard/endpoints",
    "/dashboard/deliveries",
    "/dashboard/conversions",
    "/dashboard/links",
    "/dashboard/events",
    "/dashboard/search?q=whd_unknown",
]


@pytest.mark.parametrize("javascript", [False, True], ids=["no-js", "js"])
def test_on_a_phone_nothing_scrolls_sideways_and_a_deliverys_status_is_in_sight(
    app, browser, browser_server, problems, brand, read_key, javascript
):
    delivery_id, _ = retrying_delivery(app, brand)
    with app.app_context():
        endpoint_id = db.session.scalar(select(WebhookDelivery.endpoint_id))
    context = open_context(
        browser, browser_server.url, problems, javascript=javascript, viewport=PHONE
    )
    try:
        page = context.new_page()
        sign_in_with_key(page, read_key)
        endpoint_page = f"/dashboard/endpoints/{endpoint_id}"
        for path in [*PAGES, endpoint_page, f"/dashboard/deliveries/{delivery_id}"]:
            page.goto(path)
            page.wait_for_load_state()
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 0, f"{path} scrolls {overflow} px sideways"
            wide = page.evaluate(
                """() => [...document.querySelectorAll('main table')]
                     .filter((t) => t.getBoundingClientRect().right > innerWidth + 1).length"""
            )
            assert wide == 0, f"{path}: a table is wider than the phone"

        page.goto("/dashboard/deliveries")
        status = page.locator(f"#delivery-{delivery_id} .status-retrying")
        expect(status).to_be_visible()
        box = status.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box

        # Event names are one token: `webhook.test` never breaks inside.
        page.goto(endpoint_page)
        open_fold(page, "Events and settings")
        names = page.locator("code.event-name")
        assert names.count() >= 2
        for name in names.all():
            lines = name.evaluate("(el) => el.getClientRects().length")
            assert lines == 1, f"{name.inner_text()} breaks over {lines} lines"
    finally:
        context.close()
    problems.assert_none()


# --- issue 37: an endpoint's ordering, campaigns and "retry now", in a browser -----------------


def test_an_endpoint_is_ordered_filtered_and_its_waiting_retries_sent_now(
    app, with_js, brand, write_key
):
    platform = Platform(app, brand)
    kept, _other = platform.campaign(), platform.campaign()
    later = utcnow() + timedelta(hours=1)
    with app.app_context():
        endpoint = register_endpoint(
            brand_id=brand, url=DOWN_URL, events=["deal.completed"], policy=LOCAL
        )
        endpoint_id = endpoint.id
        [delivery_id] = publish_event(
            brand_id=brand, name="deal.completed", data={"id": "deal_1"}
        ).delivery_ids
        wait_for_a_retry([delivery_id], later, last_error="Connection refused")
        db.session.commit()
        db.session.remove()
    page = with_js.new_page()
    sign_in_with_key(page, write_key)
    page.goto(f"/dashboard/endpoints/{endpoint_id}")

    retry = page.get_by_role("button", name="Retry the 1 retrying delivery now")
    expect(retry).to_be_visible()
    retry.click()
    expect(page.get_by_text("1 retrying delivery is due now")).to_be_visible()
    expect(page.get_by_role("button", name=re.compile(r"^Retry the"))).to_have_count(0)
    with app.app_context():
        due = db.session.get(QueuedDelivery, delivery_id).next_attempt_at
        db.session.remove()
    assert due <= utcnow()

    open_fold(page, "Events and settings")
    edit = page.locator("#endpoint-edit-panel")
    edit.get_by_label("Order of deliveries").select_option("subject")
    edit.locator(f'input[name="campaignIds"][value="{kept}"]').check()
    edit.get_by_role("button", name="Save changes").click()
    settings = page.locator("#endpoint-settings")
    expect(settings).to_contain_text("one after another per subject")
    expect(settings).to_contain_text(kept)
    expect(edit.locator(f'input[name="campaignIds"][value="{kept}"]')).to_be_checked()
