"""The dashboard's endpoint forms with ordering and a campaign filter (CONTRACT 12.2, 12.3), and
the endpoint page's "Retry the N retrying deliveries now" (12.4), server-rendered."""

from __future__ import annotations

import re
from datetime import timedelta

from sqlalchemy import select

from extensions import db
from models import QueuedDelivery, WebhookEndpoint
from models.columns import utcnow
from services.events import publish_event
from services.webhook_endpoints import current_url_policy, register_endpoint
from tests.dashboard import htmx, sign_in
from tests.delivery_states import wait_for_a_retry
from tests.test_platform_changes import Platform

HOOK = "http://127.0.0.1:9/hooks"


def _text(response) -> str:
    return response.get_data(as_text=True).replace("<wbr>", "")


def _endpoint(app, brand: str, **options) -> str:
    with app.test_request_context():
        issued = register_endpoint(
            brand_id=brand,
            url=HOOK,
            events=["deal.completed"],
            policy=current_url_policy(),
            **options,
        )
        db.session.commit()
        return issued.id


def _stored(app, endpoint_id: str) -> tuple[str, list[str] | None]:
    with app.app_context():
        row = db.session.get(WebhookEndpoint, endpoint_id)
        return row.ordering, row.campaign_ids


def _checked_campaigns(page: str) -> set[str]:
    return set(re.findall(r'name="campaignIds" value="(cmp_[0-9a-z]+)" checked', page))


def _selected_ordering(page: str) -> list[str]:
    return re.findall(r'<option value="(none|subject)" selected>', page)


def test_register_form_offers_the_brands_campaigns_and_an_ordering(
    app, client, brand, write_key, make_brand
):
    platform = Platform(app, brand)
    first, second = platform.campaign(), platform.campaign()
    theirs = Platform(app, make_brand("Other Foods")).campaign()
    token = sign_in(client, write_key)

    form = _text(client.get("/dashboard/endpoints")).split('id="endpoint-form-panel"')[1]
    offered = set(re.findall(r'name="campaignIds" value="(cmp_[0-9a-z]+)"', form))
    assert offered == {first, second}  # the brand's own, not another brand's
    assert _checked_campaigns(form) == set()
    assert _selected_ordering(form) == ["none"]

    response = client.post(
        "/dashboard/endpoints",
        data={
            "url": HOOK,
            "events": ["deal.completed"],
            "ordering": "subject",
            "campaignIds": [second],
        },
        headers=htmx(token),
    )
    assert response.status_code == 201, _text(response)
    assert "of 1 campaign only, each subject's events one after another" in _text(response)
    with app.app_context():
        [endpoint] = db.session.scalars(
            select(WebhookEndpoint).where(WebhookEndpoint.brand_id == brand)
        ).all()
        endpoint_id = endpoint.id
    assert _stored(app, endpoint_id) == ("subject", [second])
    row = _text(client.get("/dashboard/endpoints")).split(f'id="endpoint-{endpoint_id}"')[1]
    row = row.split("</tr>")[0]
    assert "1 campaign only" in row and "in order per subject" in row

    # A campaign that is not the brand's, sent by a tampered form: refused by name, nothing kept.
    refused = client.post(
        "/dashboard/endpoints",
        data={"url": HOOK, "events": ["deal.completed"], "campaignIds": [first, theirs]},
        headers=htmx(token),
    )
    assert refused.status_code == 422
    assert theirs in _text(refused)
    assert _checked_campaigns(_text(refused)) == {first}  # the form keeps what was ticked
    with app.app_context():
        assert len(db.session.scalars(select(WebhookEndpoint.id)).all()) == 1


def test_the_endpoint_page_shows_and_edits_ordering_and_campaigns(app, client, brand, write_key):
    platform = Platform(app, brand)
    first, second = platform.campaign(), platform.campaign()
    endpoint_id = _endpoint(app, brand, ordering="subject", campaign_ids=[first])
    token = sign_in(client, write_key)

    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    # Under "Events and settings", with the subscriptions.
    settings = page.split('id="endpoint-settings"')[1].split("</dl>")[0]
    assert f"<code>{first}</code>" in settings and second not in settings
    assert "one after another per subject" in settings
    edit = page.split('id="endpoint-edit-panel"')[1]
    assert _checked_campaigns(edit) == {first}
    assert _selected_ordering(edit) == ["subject"]

    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}",
        data={
            "url": HOOK,
            "events": ["deal.completed"],
            "ordering": "none",
            "campaignIds": [first, second],
        },
        headers=htmx(token),
    )
    assert response.status_code == 200, _text(response)
    assert _stored(app, endpoint_id) == ("none", [first, second])
    fragment = _text(response)
    assert _checked_campaigns(fragment.split('id="endpoint-edit-panel"')[1]) == {first, second}
    assert "as soon as each is due" in fragment.split('id="endpoint-settings"')[1]

    # None ticked: every campaign again.
    client.post(
        f"/dashboard/endpoints/{endpoint_id}",
        data={"url": HOOK, "events": ["deal.completed"], "ordering": "none"},
        headers=htmx(token),
    )
    assert _stored(app, endpoint_id) == ("none", None)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "every campaign's events" in page.split('id="endpoint-settings"')[1]


def _waiting_for_a_retry(app, brand: str, count: int) -> list[str]:
    """`count` deliveries to the brand's endpoint whose first attempt failed, their retry an hour
    away (as a worker leaves them after a 500 with an hour's schedule)."""
    with app.app_context():
        ids = [
            publish_event(
                brand_id=brand, name="deal.completed", data={"id": f"deal_{n}"}
            ).delivery_ids[0]
            for n in range(count)
        ]
        wait_for_a_retry(ids, utcnow() + timedelta(hours=1), http_status=500)
        db.session.commit()
    return ids


def _due(app, delivery_ids: list[str]) -> list[bool]:
    with app.app_context():
        rows = db.session.execute(
            select(QueuedDelivery.next_attempt_at).where(
                QueuedDelivery.delivery_id.in_(delivery_ids)
            )
        ).all()
        return [row.next_attempt_at <= utcnow() for row in rows]


BUTTON = re.compile(r"Retry the (\d+) retrying deliver(?:y|ies) now")


def test_retry_the_waiting_deliveries_from_the_endpoint_page(
    app, client, brand, write_key, read_key
):
    endpoint_id = _endpoint(app, brand)
    token = sign_in(client, read_key)
    assert not BUTTON.search(_text(client.get(f"/dashboard/endpoints/{endpoint_id}")))
    waiting = _waiting_for_a_retry(app, brand, 3)
    # A read key sees no button.
    assert not BUTTON.search(_text(client.get(f"/dashboard/endpoints/{endpoint_id}")))

    client.post("/dashboard/sign-out", data={"csrf_token": token})
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert BUTTON.search(page).group(1) == "3"
    form = page.split('id="endpoint-retry"')[1].split("</div>")[0]
    assert f'action="/dashboard/endpoints/{endpoint_id}/retry-pending"' in form
    assert 'name="csrf_token"' in form

    # Without the CSRF token: refused, nothing due.
    refused = client.post(
        f"/dashboard/endpoints/{endpoint_id}/retry-pending", headers={"HX-Request": "true"}
    )
    assert refused.status_code in (400, 403)
    assert _due(app, waiting) == [False] * 3

    response = client.post(f"/dashboard/endpoints/{endpoint_id}/retry-pending", headers=htmx(token))
    assert response.status_code == 202
    fragment = _text(response)
    assert "3 retrying deliveries are due now" in fragment
    assert not BUTTON.search(fragment)  # nothing waits any more
    assert 'id="endpoint-deliveries" hx-swap-oob="true"' in fragment
    assert _due(app, waiting) == [True] * 3
    assert not BUTTON.search(_text(client.get(f"/dashboard/endpoints/{endpoint_id}")))


def test_retry_without_javascript_answers_with_the_endpoint_page(app, client, brand, write_key):
    endpoint_id = _endpoint(app, brand)
    waiting = _waiting_for_a_retry(app, brand, 1)
    token = sign_in(client, write_key)
    assert BUTTON.search(_text(client.get(f"/dashboard/endpoints/{endpoint_id}"))).group(1) == "1"
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/retry-pending", data={"csrf_token": token}
    )
    assert response.status_code == 303
    assert response.headers["Location"].endswith(f"/dashboard/endpoints/{endpoint_id}")
    page = _text(client.get(response.headers["Location"]))
    assert "1 retrying delivery is due now" in page
    assert _due(app, waiting) == [True]


def test_retry_is_for_write_keys_and_active_endpoints(app, client, brand, write_key, read_key):
    endpoint_id = _endpoint(app, brand)
    _waiting_for_a_retry(app, brand, 1)
    token = sign_in(client, read_key)
    response = client.post(f"/dashboard/endpoints/{endpoint_id}/retry-pending", headers=htmx(token))
    assert response.status_code == 403
    client.post("/dashboard/sign-out", data={"csrf_token": token})
    token = sign_in(client, write_key)
    client.post(f"/dashboard/endpoints/{endpoint_id}/disable", headers=htmx(token))
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert not BUTTON.search(page)  # disabling failed what was pending
    response = client.post(f"/dashboard/endpoints/{endpoint_id}/retry-pending", headers=htmx(token))
    assert response.status_code == 404
