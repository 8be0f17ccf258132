"""The dashboard in a real browser (headless Chromium, see tests/browser.py) against a real
gunicorn server, a real `flask worker` and a real receiver: what a developer does and sees,
from the bootstrap token to being signed out by revoking their key.

BRAND_SCREENSHOTS=docs/screenshots also saves a screenshot of every main page (of the demo
workspace) there; CI leaves it unset, so it never rewrites the committed ones.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests
from sqlalchemy import func, select

from extensions import db
from fixtures.demo import seed_demo_workspace
from fixtures.demo_simulation import simulate_step
from models import WebhookDelivery
from models.event_catalog import EVENT_NAMES, TEST_EVENT
from services.api_keys import create_api_key
from services.endpoint_urls import UrlPolicy
from services.webhook_endpoints import register_endpoint
from tests.browser import (
    PHONE,
    Problems,
    expect,
    open_context,
    open_fold,
    screenshot_folder,
    sign_in_with_key,
)
from tests.dashboard import SIGNING_SECRET
from tests.receiver import Receiver, Reply
from tests.server_process import ServerProcess
from tests.worker_process import WorkerProcess

API_KEY = re.compile(r"svc_live_[0-9A-Za-z]{20,}")
SIGN_IN_URL = re.compile(r"/dashboard/sign-in(\?.*)?$")
# Long enough for the worker to pick a delivery up and the page's polling to show it.
SETTLE_MS = 20_000


@dataclass
class Live:
    server: ServerProcess
    worker: WorkerProcess

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture(scope="module")
def live(browser, app, app_environ) -> Iterator[Live]:
    """One gunicorn server and one worker on the run's database and Redis, for the module."""
    server = ServerProcess(app_environ, workers=1, threads=4)
    try:
        worker = WorkerProcess(app_environ)
    except BaseException:
        server.stop()
        raise
    yield Live(server, worker)
    worker.stop()
    server.stop()


@pytest.fixture
def context(browser, live, problems) -> Iterator:
    """A fresh browser profile at laptop size; no console error may happen in it."""
    context = open_context(browser, live.url, problems)
    yield context
    context.close()
    problems.assert_none()


def assert_readable_width(field) -> None:
    """A signed-out form uses the page's width on a laptop, not a sidebar-sized column."""
    # Measured once the stylesheets have loaded: the heading can show before them, and an
    # unstyled input is 177 px wide (a loaded CI machine measured exactly that).
    field.page.wait_for_load_state("load")
    box = field.bounding_box()
    assert box is not None and box["width"] >= 300, f"the field is {box} wide"


def mark_document(page) -> None:
    """Set a marker on this document; it is gone after any navigation or reload."""
    page.evaluate("window.__sameDocument = true")


def assert_same_document(page) -> None:
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"


def api_get(live: Live, path: str, secret: str) -> requests.Response:
    return requests.get(f"{live.url}/api/v1{path}", headers={"X-Api-Key": secret}, timeout=10)


# --- the whole flow --------------------------------------------------------------------------


def test_a_developer_goes_from_bootstrap_token_to_signed_webhooks_and_revokes_their_key(
    live, context, make_brand, make_bootstrap_token, receiver
):
    brand_id = make_brand("Acme Foods")
    token = make_bootstrap_token(brand_id)
    page = context.new_page()

    # Signed out, the dashboard asks to sign in; a bootstrap token makes the first key.
    page.goto("/dashboard/")
    expect(page).to_have_url(SIGN_IN_URL)
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert_readable_width(page.get_by_label("API key"))
    page.get_by_role("link", name="create your brand's first key").click()
    expect(page.get_by_role("heading", name="Create your first API key")).to_be_visible()
    assert_readable_width(page.get_by_label("Brand id"))
    page.get_by_label("Brand id").fill(brand_id)
    page.get_by_label("Bootstrap token").fill(token)
    page.get_by_role("button", name="Create key and sign in").click()

    # The secret, once, with a warning and a copy button; the session is signed in with it.
    expect(page.get_by_role("heading", name="Key “dashboard” created")).to_be_visible()
    shown = page.get_by_role("group", name="API key")
    expect(shown.get_by_text("It is shown this once")).to_be_visible()
    expect(shown.get_by_role("button", name="Copy")).to_be_visible()
    secret = shown.get_by_text(API_KEY).inner_text().strip()
    assert API_KEY.fullmatch(secret), secret
    assert api_get(live, f"/brand/{brand_id}/api-key/fetch-keys", secret).status_code == 200

    page.get_by_role("link", name="I stored it: continue to the dashboard").click()
    expect(page.get_by_role("heading", name="Acme Foods")).to_be_visible()
    expect(page.get_by_text("read + write")).to_be_visible()

    # The keys page lists the key by its prefix, and never shows the secret again.
    page.get_by_role("navigation", name="Dashboard").get_by_role("link", name="API keys").click()
    expect(page.get_by_role("heading", name="API keys", exact=True)).to_be_visible()
    own_row = page.get_by_role("row").filter(has_text="this session")
    expect(own_row).to_contain_text(secret[:12])
    assert secret not in page.content()
    page.reload()
    expect(own_row).to_be_visible()
    assert secret not in page.content()

    register_endpoint_and_watch_a_test_ping(live, page, receiver)

    # Revoking the session's own key, after confirming, signs the session out at once.
    page.goto("/dashboard/keys")
    dialogs: list[str] = []

    def confirm(dialog) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.once("dialog", confirm)
    own_row.get_by_role("button", name="Revoke").click()
    expect(page).to_have_url(SIGN_IN_URL)
    assert len(dialogs) == 1 and "this session ends" in dialogs[0], dialogs
    expect(page.get_by_text("You revoked the key this session signed in with")).to_be_visible()
    page.goto("/dashboard/keys")
    expect(page).to_have_url(SIGN_IN_URL)
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(page.get_by_role("navigation", name="Dashboard")).to_have_count(0)
    assert api_get(live, f"/brand/{brand_id}/api-key/fetch-keys", secret).status_code == 401


def register_endpoint_and_watch_a_test_ping(live: Live, page, receiver: Receiver) -> None:
    """Register the receiver's URL, keep the signing secret shown once, send a test ping and
    watch it arrive, then read its delivery's detail."""
    page.get_by_role("navigation", name="Dashboard").get_by_role(
        "link", name="Webhook endpoints"
    ).click()
    expect(page.get_by_role("heading", name="Webhook endpoints", exact=True)).to_be_visible()
    expect(page.get_by_text("No endpoints yet")).to_be_visible()

    # Registering: the default events are ticked; the answer swaps in without a reload.
    mark_document(page)
    page.get_by_label("Endpoint URL").fill(receiver.url)
    events = page.get_by_role("group", name="Events", exact=True)
    assert events.get_by_role("checkbox", checked=True).count() > 0
    page.get_by_role("button", name="Register endpoint").click()
    expect(page.get_by_role("heading", name="Endpoint registered")).to_be_visible()
    shown = page.get_by_role("group", name="signing secret")
    expect(shown.get_by_text("It is shown this once")).to_be_visible()
    signing_secret = shown.get_by_text(SIGNING_SECRET).inner_text().strip()
    assert SIGNING_SECRET.fullmatch(signing_secret), signing_secret
    receiver.secrets.append(signing_secret)
    expect(page.get_by_role("row").filter(has_text=receiver.url)).to_contain_text("active")
    assert_same_document(page)

    # The endpoint's page: never the secret again; snippets to verify signatures, by language.
    page.get_by_role("link", name="Open the endpoint").click()
    expect(page.get_by_role("heading", name=receiver.url)).to_be_visible()
    assert signing_secret not in page.content()
    verify = page.locator("section").filter(
        has=page.get_by_role("heading", name="Verify signatures")
    )
    # Folded until opened. The tab row appears once the page's script runs; then one panel
    # shows at a time.
    open_fold(page, "Verify signatures")
    expect(verify.get_by_role("tab", name="Python", exact=True)).to_be_visible()
    expect(verify.get_by_role("tabpanel")).to_contain_text("WEBHOOK_SECRET")
    verify.get_by_role("tab", name="Standard Webhooks (Python)").click()
    expect(verify.get_by_role("tabpanel")).to_contain_text("from standardwebhooks import")
    verify.get_by_role("tab", name="Node.js").click()
    expect(verify.get_by_role("tab", name="Node.js")).to_have_attribute("aria-selected", "true")
    expect(verify.get_by_role("tabpanel")).to_contain_text("createHmac")
    verify.get_by_role("tab", name="curl + openssl").click()
    expect(verify.get_by_role("tabpanel")).to_contain_text(receiver.url)

    # A test ping: its row turns `delivered` by itself, the page never reloading.
    mark_document(page)
    page.get_by_role("button", name="Send test").click()
    expect(page.get_by_text("Test ping queued as delivery")).to_be_visible()
    recent = page.locator("section").filter(
        has=page.get_by_role("heading", name="Recent deliveries")
    )
    ping_row = recent.get_by_role("row").filter(has_text="webhook.test")
    expect(ping_row).to_contain_text("delivered", timeout=SETTLE_MS)
    expect(ping_row).to_contain_text("200")
    assert_same_document(page)

    # The receiver really got it, signed with the secret the page showed once.
    (received,) = receiver.wait_for(1)
    assert received.json["type"] == "webhook.test"
    assert received.signature_valid, received.headers
    assert received.headers["X-Service-Event"] == "webhook.test"

    open_delivery_detail(page, ping_row, received)


def open_delivery_detail(page, row, received) -> None:
    """The delivery's page: what was sent, and the attempt that succeeded."""
    row.get_by_role("link", name="Details").click()
    expect(page).to_have_url(re.compile(rf"/dashboard/deliveries/{received.delivery_id}$"))
    expect(page.get_by_role("heading", name="Delivery of webhook.test")).to_be_visible()
    expect(page.get_by_role("heading", name="Payload")).to_be_visible()
    expect(page.get_by_text(received.json["id"]).first).to_be_visible()
    expect(page.get_by_role("heading", name=re.compile(r"Attempt 1\s+HTTP 200"))).to_be_visible()


# --- a phone, and the console watch itself -----------------------------------------------------


_WIDER_THAN_THE_PAGE = """() => {
  // The elements whose right edge makes the page as wide as it is.
  const edge = document.documentElement.scrollWidth - 1;
  return [...document.body.querySelectorAll("*")]
    .filter((el) => el.getBoundingClientRect().right >= edge)
    .slice(-5)
    .map((el) => `${el.tagName.toLowerCase()}.${el.className}`);
}"""


def assert_no_sideways_scroll(page) -> None:
    """The page itself never scrolls sideways; a table may, inside its card."""
    # Measured once its stylesheets apply: a URL changes when a navigation commits, before.
    page.wait_for_load_state()
    overflow = page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"{page.url} scrolls {overflow} px sideways; too wide: " + ", ".join(
        page.evaluate(_WIDER_THAN_THE_PAGE)
    )


def test_on_a_phone_the_nav_works_and_only_tables_scroll_sideways(
    browser, live, problems, brand, write_key
):
    context = browser.new_context(viewport=PHONE, base_url=live.url, is_mobile=True, has_touch=True)
    problems.watch(context)
    try:
        page = context.new_page()
        sign_in_with_key(page, write_key)
        expect(page.get_by_role("heading", name="Acme Foods")).to_be_visible()
        assert_no_sideways_scroll(page)
        nav = page.get_by_role("navigation", name="Dashboard")
        # The nav is one row across the top; its last link is reachable and works by touch.
        nav_box = nav.bounding_box()
        assert nav_box is not None and nav_box["width"] <= PHONE["width"]
        nav.get_by_role("link", name="API keys").tap()
        expect(page.get_by_role("heading", name="API keys", exact=True)).to_be_visible()
        assert_no_sideways_scroll(page)
        nav.get_by_role("link", name="Events").tap()
        expect(page).to_have_url(re.compile(r"/dashboard/events$"))
        assert_no_sideways_scroll(page)
    finally:
        context.close()
    problems.assert_none()


def test_the_console_watch_reports_a_csp_violation(browser, live):
    """The flows above assert that the console stays clean; that check must be able to fail."""
    watched = Problems()
    context = browser.new_context(base_url=live.url)
    watched.watch(context)
    try:
        page = context.new_page()
        page.goto("/dashboard/sign-in")
        page.evaluate(
            "document.body.insertAdjacentHTML('beforeend', '<p style=\"color:red\">x</p>')"
        )
        page.wait_for_timeout(200)
    finally:
        context.close()
    assert any("CSP violation: style-src" in problem for problem in watched.seen), watched.seen


# --- screenshots of the demo workspace ------------------------------------------------------


def test_every_main_page_shows_the_demo_workspace(browser, live, context, app, receiver):
    """The demo workspace (`flask demo seed`) with two endpoints, one healthy and one down, and
    a few simulated steps: every page shows it in the browser with a clean console. With
    BRAND_SCREENSHOTS set, each page is saved there."""
    folder = screenshot_folder()
    demo = seed_demo_with_deliveries(app, receiver)

    def shoot(page, name: str, **options) -> None:
        if folder is not None:
            page.screenshot(path=folder / f"{name}.png", animations="disabled", **options)

    page = context.new_page()
    page.goto("/dashboard/sign-in")
    shoot(page, "sign-in")
    page.get_by_role("link", name="create your brand's first key").click()
    page.get_by_label("Brand id").fill(demo.brand_id)
    page.get_by_label("Bootstrap token").fill(demo.bootstrap_token)
    page.get_by_role("button", name="Create key and sign in").click()
    page.get_by_role("link", name="I stored it: continue to the dashboard").click()
    expect(page.get_by_role("heading", name=demo.name)).to_be_visible()
    expect(page.get_by_role("row").filter(has_text=DOWN_URL)).to_contain_text("failing")
    shoot(page, "overview", full_page=True)

    nav = page.get_by_role("navigation", name="Dashboard")
    for label, name in [
        ("API keys", "keys"),
        ("Webhook endpoints", "endpoints"),
        ("Deliveries", "deliveries"),
        ("Conversions", "conversions"),
        ("Tracked links", "links"),
        ("Events", "events"),
        ("Event types", "event-types"),
    ]:
        nav.get_by_role("link", name=label, exact=True).click()
        expect(page.get_by_role("heading", name=label, exact=True)).to_be_visible()
        shoot(page, name, full_page=True)

    # A filter swaps the results in place and puts a shareable URL in the address bar: the
    # chosen filters only, not the form's empty fields.
    nav.get_by_role("link", name="Deliveries", exact=True).click()
    expect(page.get_by_role("heading", name="Deliveries", exact=True)).to_be_visible()
    # htmx wires the filter form once the page has loaded: a change before then (a loaded CI
    # machine) would go unheard.
    page.wait_for_load_state("load")
    mark_document(page)
    page.get_by_label("Status").select_option("failed")
    expect(page).to_have_url(re.compile(r"/dashboard/deliveries\?status=failed(&sortOrder=desc)?$"))
    rows = page.locator("#delivery-results tbody tr")
    expect(rows.first).to_have_attribute("data-status", "failed")
    statuses = rows.evaluate_all("rows => rows.map((row) => row.dataset.status)")
    assert statuses and set(statuses) == {"failed"}, statuses
    assert_same_document(page)
    page.reload()  # the URL is the view: a reload shows the same rows
    expect(page.get_by_label("Status")).to_have_value("failed")
    expect(rows.first).to_have_attribute("data-status", "failed")

    # The healthy endpoint's page as it opens: its state, health and latest failures, the rest
    # (the verification snippets among it) folded under titles.
    nav.get_by_role("link", name="Webhook endpoints").click()
    page.get_by_role("link", name=receiver.url).click()
    expect(page.get_by_role("heading", name="Health, last 24 hours")).to_be_visible()
    expect(page.get_by_role("heading", name="Verify signatures")).to_be_visible()
    shoot(page, "endpoint", full_page=True)

    # A delivery that failed once and then arrived: both attempts, and what was sent.
    page.goto(f"/dashboard/deliveries/{demo.retried_delivery_id}")
    expect(page.get_by_text("upstream timeout").first).to_be_visible()
    shoot(page, "delivery", full_page=True)

    phone = browser.new_context(
        viewport=PHONE,
        base_url=live.url,
        is_mobile=True,
        has_touch=True,
        storage_state=context.storage_state(),
    )
    try:
        phone_page = phone.new_page()
        phone_page.goto("/dashboard/")
        expect(phone_page.get_by_role("heading", name=demo.name)).to_be_visible()
        assert_no_sideways_scroll(phone_page)
        shoot(phone_page, "overview-phone", full_page=True)
    finally:
        phone.close()


# Nothing listens on the discard port: every attempt to it is refused at once.
DOWN_URL = "http://127.0.0.1:9/orders/webhooks"


@dataclass
class Demo:
    brand_id: str
    name: str
    bootstrap_token: str
    retried_delivery_id: str


def seed_demo_with_deliveries(app, receiver: Receiver) -> Demo:
    """`flask demo seed`, a second key, an endpoint at the receiver (whose first answer is a
    500) and one that is down, then `flask demo simulate` until there are deliveries of every
    status; waits until none is pending."""
    local = UrlPolicy(https_only=False, allow_local=True)
    receiver.reply_with(Reply(status=500, body=b"upstream timeout"))
    with app.app_context():
        workspace = seed_demo_workspace()
        db.session.commit()
        demo = Demo(workspace.brand.id, workspace.brand.name, workspace.bootstrap_token, "")
        create_api_key(
            brand_id=demo.brand_id,
            name="orders-service",
            scopes=("read", "write"),
            created_by="tests",
        )
        every_event = [name for name in EVENT_NAMES if name != TEST_EVENT]
        issued = register_endpoint(
            brand_id=demo.brand_id, url=receiver.url, events=every_event, policy=local
        )
        receiver.secrets.append(issued.signing_secret)
        healthy_endpoint_id = issued.id
        register_endpoint(
            brand_id=demo.brand_id,
            url=DOWN_URL,
            events=["deal.completed", "escrow.released"],
            policy=local,
        )
        db.session.commit()
        for _ in range(8):
            simulate_step(brand_id=demo.brand_id)
            db.session.commit()
    wait_until_settled(app, demo.brand_id)
    with app.app_context():
        demo.retried_delivery_id = db.session.scalar(
            select(WebhookDelivery.id).where(
                WebhookDelivery.brand_id == demo.brand_id,
                WebhookDelivery.endpoint_id == healthy_endpoint_id,
                WebhookDelivery.status == "delivered",
                WebhookDelivery.attempt_count == 2,
            )
        )
        db.session.remove()
    assert demo.retried_delivery_id, "no delivery was retried"
    return demo


def wait_until_settled(app, brand_id: str, timeout: float = 60.0) -> None:
    """Until no delivery of the brand is pending (the worker retries after 1 s, twice). The
    down endpoint's 8 deliveries take 3 attempts each, and its breaker spaces them a second
    apart (WEBHOOK_TIMEOUT): about 24 s on a quiet machine, so the deadline leaves room for a
    loaded one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with app.app_context():
            pending = db.session.scalar(
                select(func.count()).where(
                    WebhookDelivery.brand_id == brand_id, WebhookDelivery.status == "pending"
                )
            )
            db.session.remove()
        if not pending:
            return
        time.sleep(0.25)
    raise AssertionError(f"{pending} deliveries still pending after {timeout} s")
