"""The dashboard in Debian's Chromium (tests/browser.py): what a newcomer's fourth first hour
(issue 43) found the pages not saying.

- "Copy as curl" carries the attempt's own timestamp and signatures: beside the button, not in
  the folded command, the page says until when a receiver takes them, and once they are too
  old, says so (and a copy made after that, on a page drawn before, is warned about at once).
- What an endpoint receives (its events, its campaign filter, its order) is on its page's first
  screen and in the overview's list, not only in a folded tab; in that tab, the list of its
  settings no longer runs into the "Edit endpoint" heading below it.
- An event's "Resend to endpoint…" starts on no endpoint unless exactly one got the event, and
  says of each whether it subscribes to it.
- A delivery's page names both signatures it carries, `webhook-signature` included.
- The event catalogue folds its sample bodies: it was ten laptop screens tall.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from extensions import db
from models import WebhookAttempt
from models.columns import utcnow
from models.event_catalog import EVENT_NAMES
from services.delivery.outcomes import AttemptOutcome, RetryPolicy
from services.delivery.queue import claim_attempts, record_attempts
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint
from tests.browser import LAPTOP, PHONE, expect, open_fold, sign_in_with_key
from tests.platform_factory import PlatformFactory

LOCAL = UrlPolicy(https_only=False, allow_local=True)
HOOK = "http://127.0.0.1:9/hooks"
VIEWPORTS = pytest.mark.parametrize("viewport", [LAPTOP, PHONE], ids=["laptop", "phone"])
JAVASCRIPT = pytest.mark.parametrize("javascript", [False, True], ids=["no-js", "js"])


def endpoint(app, brand_id: str, *, events=("deal.completed",), **options) -> str:
    with app.app_context():
        endpoint_id = register_endpoint(
            brand_id=brand_id, url=HOOK, events=list(events), policy=LOCAL, **options
        ).id
        db.session.commit()
        db.session.remove()
    return endpoint_id


def published(app, brand_id: str, name: str, only: list[str] | None = None) -> tuple[str, list]:
    """An event published (to `only` those endpoints, if given): its id and its deliveries."""
    with app.app_context():
        event = publish_event(
            brand_id=brand_id,
            name=name,
            data={"id": "deal_1", "campaignId": None},
            only_endpoint_ids=only,
        )
        db.session.commit()
        db.session.remove()
    return event.event.id, event.delivery_ids


def attempted(app, delivery_id: str, endpoint_id: str, signed: list[datetime]) -> None:
    """Failed attempts of the delivery, one signed at each of `signed`, with the headers a
    worker records (its timestamp among them)."""
    with app.app_context():
        for number, at in enumerate(signed, start=1):
            seconds = str(int(at.timestamp()))
            db.session.add(
                WebhookAttempt(
                    delivery_id=delivery_id,
                    endpoint_id=endpoint_id,
                    attempt_number=number,
                    requested_at=at,
                    duration_ms=12,
                    http_status=500,
                    error="HTTP 500",
                    response_body="",
                    request_headers={
                        "Host": "127.0.0.1:9",
                        "Content-Type": "application/json",
                        "X-Service-Timestamp": seconds,
                        "X-Service-Signature": "sha256=" + "0" * 64,
                        "webhook-timestamp": seconds,
                    },
                )
            )
        db.session.commit()
        db.session.remove()


def shown_utc(moment: datetime) -> str:
    """A time as the dashboard writes it."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


# --- "Copy as curl" says beside its button when its signature goes stale -------------------------


@JAVASCRIPT
def test_copy_as_curl_says_beside_its_button_until_when_a_receiver_takes_it(
    app, open_page, brand, read_key, javascript
):
    endpoint_id = endpoint(app, brand)
    _, [delivery_id] = published(app, brand, "deal.completed")
    now = utcnow().replace(microsecond=0)
    old, recent = now - timedelta(hours=2), now - timedelta(minutes=1)
    attempted(app, delivery_id, endpoint_id, [old, recent])
    page = open_page(javascript=javascript)
    sign_in_with_key(page, read_key)
    page.goto(f"/dashboard/deliveries/{delivery_id}")

    for number, signed, expired in ((2, recent, False), (1, old, True)):
        attempt = page.locator(f"#attempt-{number}")
        command = attempt.locator("details", has=page.locator("summary", has_text="curl"))
        assert not command.evaluate("(details) => details.open")  # the command stays folded
        note = attempt.locator(f"#attempt-{number}-stale")
        expect(note).to_be_visible()  # ...while this is in sight
        expires = shown_utc(signed + timedelta(minutes=5))
        expect(note).to_contain_text(f"made {shown_utc(signed)}")
        if expired:
            expect(note).to_contain_text("Too old to be accepted: ")
            expect(note).to_contain_text(f"refuses them since {expires}")
            expect(note).to_have_class(re.compile(r"\battempt-replay-expired\b"))
        else:
            expect(note).to_contain_text(f"Expires {expires}")
            expect(note).not_to_have_class(re.compile(r"\battempt-replay-expired\b"))
        button = attempt.get_by_role("button", name="Copy as curl")
        if not javascript:
            expect(button).to_be_hidden()  # shown by the script; the command is in the page
            continue
        # Beside the button: on its line, not below the folded command.
        expect(button).to_be_visible()
        button_box, note_box, command_box = laid_out(button, note, command)
        assert abs(note_box["y"] - button_box["y"]) < button_box["height"], (button_box, note_box)
        assert note_box["y"] < command_box["y"]


def laid_out(*locators, timeout: float = 10.0) -> list[dict]:
    """Each element's box once all have one: a loaded browser may not have laid out one yet
    (`bounding_box` is None until it does)."""
    deadline = time.monotonic() + timeout
    while True:
        boxes = [locator.bounding_box() for locator in locators]
        if all(box is not None for box in boxes) or time.monotonic() > deadline:
            assert all(box is not None for box in boxes), boxes
            return boxes
        time.sleep(0.1)


def test_a_copy_made_once_the_signature_is_stale_is_warned_about(app, open_page, brand, read_key):
    """The page was drawn while the command was good; copied after it went stale, the copy
    says so at once, rather than the receiver's 400 later."""
    endpoint_id = endpoint(app, brand)
    _, [delivery_id] = published(app, brand, "deal.completed")
    # Time enough to sign in and draw the page on a loaded machine while it is still good.
    stale_at = utcnow() + timedelta(seconds=10)
    attempted(app, delivery_id, endpoint_id, [stale_at - timedelta(minutes=5)])
    page = open_page(permissions=["clipboard-read", "clipboard-write"])
    sign_in_with_key(page, read_key)
    page.goto(f"/dashboard/deliveries/{delivery_id}")
    note = page.locator("#attempt-1-stale")
    expect(note).to_contain_text("Expires")
    time.sleep(max(0.0, (stale_at - utcnow()).total_seconds()) + 0.5)

    page.locator("#attempt-1").get_by_role("button", name="Copy as curl").click()

    expect(page.locator("#toast")).to_contain_text("Copied, but its timestamp is too old now")
    expect(note).to_have_class(re.compile(r"\battempt-replay-expired\b"))


# --- what an endpoint receives, where it is seen first ----------------------------------------


@VIEWPORTS
def test_an_endpoints_campaign_filter_and_order_show_on_its_page_and_the_overview(
    app, open_page, brand, write_key, viewport
):
    platform = PlatformFactory(app)
    now = utcnow()
    glow = platform.campaign(brand, at=now - timedelta(days=2), name="Harmattan Glow launch")
    shea = platform.campaign(brand, at=now - timedelta(days=2), name="Shea Butter Week")
    platform.campaign(brand, at=now - timedelta(days=2), name="Not this one")
    filtered = endpoint(
        app,
        brand,
        events=EVENT_NAMES[:21],
        ordering="subject",
        campaign_ids=[glow, shea],
        description="Deals, in order",
    )
    plain = endpoint(app, brand, events=["deal.completed", "escrow.released"])
    page = open_page(viewport)
    sign_in_with_key(page, write_key)

    page.goto("/dashboard/")
    overview = page.locator(".card", has=page.get_by_role("heading", name="Webhook endpoints"))
    rows = {
        endpoint_id: overview.locator("tr", has=page.locator(f'a[href$="/{endpoint_id}"]'))
        for endpoint_id in (filtered, plain)
    }
    receives = rows[filtered].locator("td[data-label=Receives]")
    expect(receives).to_have_text("21 events · 2 campaigns only · in order per subject")
    expect(rows[plain].locator("td[data-label=Receives]")).to_have_text("2 events")
    assert "subscribed" not in overview.inner_text()  # "21 subscribed" said nothing of filters

    page.goto(f"/dashboard/endpoints/{filtered}")
    head = page.locator(".endpoint-receives")
    expect(head).to_have_text(
        "Receives 21 events · of campaigns Harmattan Glow launch, Shea Butter Week only"
        " · in order per subject"
    )
    box = head.bounding_box()
    assert box["y"] + box["height"] <= viewport["height"], box  # the first screen
    page.goto(f"/dashboard/endpoints/{plain}")
    expect(page.locator(".endpoint-receives")).to_have_text(
        "Receives 2 events · of every campaign · each as soon as it is due"
    )

    # The settings tab: its list, then a gap, then the form's heading.
    page.goto(f"/dashboard/endpoints/{filtered}")
    open_fold(page, "Events and settings")
    order = page.locator("#endpoint-settings dd").last
    expect(order).to_contain_text("one after another per subject")
    heading = page.get_by_role("heading", name="Edit endpoint")
    expect(heading).to_be_visible()
    gap = heading.bounding_box()["y"] - (order.bounding_box()["y"] + order.bounding_box()["height"])
    assert gap >= 12, f"{gap:.0f} px between the settings and the heading below them"


# --- resend starts on no endpoint that does not subscribe ----------------------------------------


@JAVASCRIPT
def test_resend_starts_on_the_endpoint_that_got_the_event_and_never_on_a_stranger(
    app, open_page, brand, write_key, javascript
):
    stranger = endpoint(app, brand, events=["escrow.held"])  # listed first, subscribes elsewhere
    subscriber = endpoint(app, brand, events=["deal.completed"])
    page = open_page(javascript=javascript)
    sign_in_with_key(page, write_key)

    got_it, _ = published(app, brand, "deal.completed")  # delivered to the subscriber only
    page.goto(f"/dashboard/events/{got_it}")
    resend = page.locator("#event-resend")
    expect(resend.locator(f'input[value="{subscriber}"]')).to_be_checked()
    expect(resend.locator(f'input[value="{stranger}"]')).not_to_be_checked()
    choice = {
        e: resend.locator("label", has=page.locator(f'input[value="{e}"]'))
        for e in (stranger, subscriber)
    }
    expect(choice[subscriber]).to_contain_text("got it before")
    expect(choice[stranger]).to_contain_text("not subscribed to deal.completed: gets it this once")

    nobody, _ = published(app, brand, "deal.completed", only=[])  # went nowhere
    page.goto(f"/dashboard/events/{nobody}")
    expect(page.locator("#event-resend input[type=radio]:checked")).to_have_count(0)
    expect(choice[subscriber]).to_contain_text("subscribed to deal.completed")
    # Nothing chosen: sending asks for a choice rather than sending it anywhere.
    page.get_by_role("button", name="Send", exact=True).click()
    expect(page).to_have_url(re.compile(rf"/dashboard/events/{nobody}$"))
    expect(page.get_by_text("Queued as delivery")).to_have_count(0)


# --- the delivery page names both signatures ------------------------------------------------------


def test_a_deliverys_page_names_both_signatures_it_carries(app, open_page, brand, read_key):
    endpoint(app, brand)
    event_id, [delivery_id] = published(app, brand, "deal.completed")
    page = open_page()
    sign_in_with_key(page, read_key)
    page.goto(f"/dashboard/deliveries/{delivery_id}")
    payload = page.locator("#delivery-payload")
    expect(payload).to_contain_text("X-Service-Signature covers {X-Service-Timestamp}.{body}")
    expect(payload).to_contain_text(
        "webhook-signature covers {webhook-id}.{webhook-timestamp}.{body}, webhook-id being "
        f"the event id {event_id}"
    )


# --- the event catalogue folds its sample bodies ------------------------------------------------

# The catalogue was 10,100 px tall on a laptop and 17,418 px on a phone, every body unfolded;
# folded, about 5,100 and 7,000 (24 entries of a title, a line and a fold each).
CATALOGUE_HEIGHT = {"laptop": 6000, "phone": 8500}


@VIEWPORTS
def test_the_event_catalogue_folds_its_sample_bodies(app, open_page, brand, read_key, viewport):
    page = open_page(viewport)
    sign_in_with_key(page, read_key)
    page.goto("/dashboard/event-types")
    height = page.evaluate("() => document.documentElement.scrollHeight")
    name = "laptop" if viewport == LAPTOP else "phone"
    assert height <= CATALOGUE_HEIGHT[name], f"{height} px tall"
    entry = page.locator("article[id='deal.completed']")
    sample = entry.locator("details.event-sample-fold")
    expect(sample.locator("summary")).to_contain_text("Sample body")
    expect(entry.locator("pre")).to_be_hidden()
    sample.locator("summary").click()
    expect(entry.locator("pre")).to_contain_text('"type": "deal.completed"')

    # A link to one event's entry opens its body.
    page.goto("/dashboard/event-types#escrow.released")
    expect(page.locator("article[id='escrow.released'] pre")).to_be_visible()


# --- held is not waiting (CONTRACT 13.1) ---------------------------------------------------------


@JAVASCRIPT
def test_a_held_delivery_is_called_held_and_links_the_one_it_waits_behind(
    app, open_page, brand, write_key, javascript
):
    """An ordered endpoint's second event of a deal waits behind the first, which failed and
    waits for its retry: the endpoint page counts one held and one retrying (never "2
    waiting"), its button retries the one retrying delivery, and the held delivery's page says
    held and links the delivery it waits behind."""
    endpoint_id = endpoint(
        app, brand, events=("deal.accepted", "deal.completed"), ordering="subject"
    )
    _, [first] = published(app, brand, "deal.accepted")
    _, [second] = published(app, brand, "deal.completed")
    with app.app_context():
        [attempt] = claim_attempts(
            slots=10, endpoint_limit=2, token="0000aaaa", lease=timedelta(seconds=30)
        ).attempts
        db.session.commit()
        assert attempt.delivery_id == first
        failed = AttemptOutcome(
            requested_at=utcnow(),
            duration_ms=3,
            request_headers={},
            http_status=500,
            error="HTTP 500",
        )
        record_attempts(
            [(attempt, failed)], policy=RetryPolicy.from_settings(app.extensions["settings"])
        )
        db.session.remove()
    page = open_page(javascript=javascript)
    sign_in_with_key(page, write_key)
    page.goto(f"/dashboard/endpoints/{endpoint_id}")
    expect(page.get_by_text("0 waiting · 1 held · 1 retrying")).to_be_visible()
    expect(page.get_by_role("button", name="Retry the 1 retrying delivery now")).to_be_visible()

    page.goto(f"/dashboard/deliveries/{second}")
    status = page.locator("#delivery-status")
    expect(status.locator(".status-held")).to_have_text("held")
    expect(status.get_by_text("0 waiting")).to_have_count(0)
    link = status.get_by_role("link", name=first)
    expect(link).to_be_visible()
    link.click()
    expect(page).to_have_url(re.compile(f"/dashboard/deliveries/{first}$"))
    expect(page.locator("#delivery-status .status-retrying")).to_have_text("retrying")
