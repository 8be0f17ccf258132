"""The event page's "Where it went, and why" with "send it now" for an endpoint it skipped
(CONTRACT 13.2), and erasing the event's subject behind a confirmation (CONTRACT 13.3)."""

from __future__ import annotations

import re

import pytest

from extensions import db
from services.webhook_endpoints import update_endpoint
from tests.browser import expect, sign_in_with_key
from tests.dashboard import htmx, sign_in
from tests.test_dashboard_events import LOCAL_URLS, _deliveries_of, _endpoint
from tests.test_webhook_delivery import publish

ROUTE = re.compile(r'<tr id="route-(whe_[0-9a-z]+)" data-outcome="([a-z_]+)">')


def _disable(app, brand: str, endpoint_id: str, active: bool = False) -> None:
    with app.app_context():
        update_endpoint(
            brand_id=brand, endpoint_id=endpoint_id, policy=LOCAL_URLS, is_active=active
        )
        db.session.commit()


def test_where_it_went_and_sending_it_now_to_an_endpoint_it_skipped(app, client, brand, write_key):
    sent = _endpoint(app, brand, "deals", ["deal.completed"])
    unsubscribed = _endpoint(app, brand, "escrow", ["escrow.released"])
    disabled = _endpoint(app, brand, "off", ["deal.completed"])
    _disable(app, brand, disabled)
    [(event_id, [delivery])] = publish(app, brand, ("deal.completed", {"id": "deal_1"}))
    token = sign_in(client, write_key)

    page = client.get(f"/dashboard/events/{event_id}").get_data(as_text=True)
    assert ROUTE.findall(page) == [
        (sent, "sent"),
        (unsubscribed, "not_subscribed"),
        (disabled, "disabled"),
    ]
    assert f'href="/dashboard/deliveries/{delivery}"' in page
    rows = dict(zip(ROUTE.findall(page), page.split('<tr id="route-')[1:], strict=True))
    assert "Send it now" not in rows[(sent, "sent")]
    assert "Send it now" in rows[(unsubscribed, "not_subscribed")]
    assert "re-enable it to send it" in rows[(disabled, "disabled")]

    # Re-enabled, the endpoint the event skipped can be sent it now; it was still skipped then.
    _disable(app, brand, disabled, active=True)
    page = client.get(f"/dashboard/events/{event_id}").get_data(as_text=True)
    rows = dict(zip(ROUTE.findall(page), page.split('<tr id="route-')[1:], strict=True))
    assert "Send it now" in rows[(disabled, "disabled")]
    answer = client.post(
        f"/dashboard/events/{event_id}/resend", data={"endpointId": disabled, "csrf_token": token}
    )
    assert answer.status_code == 303
    [_, now_sent] = _deliveries_of(app, event_id)
    assert now_sent.endpoint_id == disabled
    page = client.get(answer.headers["Location"]).get_data(as_text=True)
    assert (disabled, "sent") in ROUTE.findall(page)


def test_erasing_the_subject_asks_first_then_erases(app, client, brand, write_key, read_key):
    _endpoint(app, brand, "deals", ["deal.completed"])
    [(first, [delivery]), (second, _)] = publish(
        app,
        brand,
        ("deal.completed", {"id": "deal_1", "creator": "Ada Obi"}),
        ("deal.completed", {"id": "deal_1", "creator": "Ada Obi"}),
    )
    [(other, _)] = publish(app, brand, ("deal.completed", {"id": "deal_2", "creator": "Bola Ade"}))

    sign_in(client, read_key)
    page = client.get(f"/dashboard/events/{first}").get_data(as_text=True)
    assert "Erase…" not in page
    refused = client.post(f"/dashboard/events/{first}/erase-subject")
    assert refused.status_code in (400, 403)

    token = sign_in(client, write_key)
    page = client.get(f"/dashboard/events/{first}").get_data(as_text=True)
    assert f'hx-post="/dashboard/events/{first}/erase-subject"' in page
    assert 'hx-confirm="Erase the data of every event of deal deal_1?' in page
    # Without JavaScript, the button opens a page that asks first.
    asked = client.get(f"/dashboard/events/{first}/erase-subject").get_data(as_text=True)
    assert "Erase the data of deal deal_1?" in asked
    assert f'action="/dashboard/events/{first}/erase-subject"' in asked
    assert "Ada Obi" in client.get(f"/dashboard/events/{second}").get_data(as_text=True)

    done = client.post(f"/dashboard/events/{first}/erase-subject", data={"csrf_token": token})
    assert done.status_code == 303
    page = client.get(done.headers["Location"]).get_data(as_text=True)
    assert "Erasing the data of 2 event(s) of deal deal_1" in page
    assert "Its data was erased" in page
    assert "Ada Obi" not in client.get(f"/dashboard/events/{second}").get_data(as_text=True)
    assert "&#34;data&#34;: null" in page
    assert "Resend to endpoint" not in page and "Send it now" not in page
    assert "Bola Ade" in client.get(f"/dashboard/events/{other}").get_data(as_text=True)
    refused = client.post(f"/dashboard/deliveries/{delivery}/redeliver", data={"csrf_token": token})
    assert refused.status_code == 409
    assert "was erased" in refused.get_data(as_text=True)

    # With htmx, the dialog asked; the answer sends the page to the event again.
    again = client.post(f"/dashboard/events/{first}/erase-subject", headers=htmx(token))
    assert again.headers["HX-Redirect"] == f"/dashboard/events/{first}"


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "no-js"])
def test_in_a_browser_send_it_now_then_erase_behind_a_confirmation(
    app, brand, write_key, open_page, javascript
):
    skipped = _endpoint(app, brand, "later", ["escrow.released"])
    [(event_id, _)] = publish(app, brand, ("deal.completed", {"id": "deal_1", "creator": "Ada"}))
    page = open_page(javascript=javascript)
    sign_in_with_key(page, write_key)
    page.goto(f"/dashboard/events/{event_id}")
    row = page.locator(f"#route-{skipped}")
    expect(row).to_contain_text("not subscribed")
    row.get_by_role("button", name="Send it now").click()
    expect(page.locator(f"#route-{skipped}")).to_contain_text("sent")

    dialogs: list[str] = []

    def confirm(dialog) -> None:
        dialogs.append(dialog.message)
        dialog.accept()

    page.once("dialog", confirm)
    page.get_by_role("button", name="Erase…").click()
    if not javascript:  # a page asks first
        expect(page.get_by_role("heading", name="Erase the data of deal deal_1?")).to_be_visible()
        page.get_by_role("button", name="Erase subject's data").click()
    expect(page.get_by_text("Its data was erased")).to_be_visible()
    expect(page.get_by_text("Erasing the data of 1 event(s) of deal deal_1")).to_be_visible()
    assert page.url.endswith(f"/dashboard/events/{event_id}")
    assert "Ada" not in page.locator("#event-body").inner_text()
    assert len(dialogs) == (1 if javascript else 0)
