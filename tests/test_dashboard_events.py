"""The dashboard's Events page: the brand's events newest first with their deliveries, a filter by
type, finding one by id; an event's page with its body and deliveries; "resend to endpoint…"."""

from __future__ import annotations

import re

from sqlalchemy import select

from extensions import db
from models import WebhookDelivery
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint, update_endpoint
from tests.dashboard import sign_in

LOCAL_URLS = UrlPolicy(https_only=False, allow_local=True)
ROW = re.compile(r'<tr id="event-(evt_[0-9a-z]+)">')


def _endpoint(app, brand: str, path: str, events: list[str]) -> str:
    with app.app_context():
        endpoint = register_endpoint(
            policy=LOCAL_URLS, brand_id=brand, url=f"http://127.0.0.1:9/{path}", events=events
        )
        db.session.commit()
        return endpoint.id


def _publish(app, brand: str, *names: str) -> list[str]:
    ids = []
    with app.app_context():
        for name in names:
            ids.append(publish_event(brand_id=brand, name=name, data={"name": name}).event.id)
            db.session.commit()
    return ids


def _deliveries_of(app, event_id: str) -> list[WebhookDelivery]:
    with app.app_context():
        rows = db.session.scalars(
            select(WebhookDelivery)
            .where(WebhookDelivery.event_id == event_id)
            .order_by(WebhookDelivery.created_at, WebhookDelivery.id)
        ).all()
        db.session.expunge_all()
        return rows


def test_events_are_listed_newest_first_with_their_deliveries(app, client, brand, read_key):
    _endpoint(app, brand, "deals", ["deal.completed"])
    ids = _publish(app, brand, "deal.completed", "escrow.released", "deal.completed")
    sign_in(client, read_key)
    page = client.get("/dashboard/events").get_data(as_text=True)
    assert ROW.findall(page) == ids[::-1]
    assert "3 events" in page
    rows = dict(zip(ROW.findall(page), page.split('<tr id="event-')[1:], strict=True))
    assert re.search(r'1 <span class="status status-waiting"[^>]*>waiting</span>', rows[ids[0]])
    assert 'data-deliveries><span class="muted">none</span>' in rows[ids[1]]
    assert 'href="/dashboard/events/' + ids[1] + '"' in rows[ids[1]]


def test_the_type_filter_and_paging(app, client, brand, read_key):
    ids = _publish(app, brand, *["deal.completed", "escrow.released"] * 3)
    sign_in(client, read_key)
    page = client.get("/dashboard/events?type=escrow.released&limit=2").get_data(as_text=True)
    assert ROW.findall(page) == [ids[5], ids[3]]
    assert "Page 1 of 2" in page
    second = client.get("/dashboard/events?type=escrow.released&limit=2&page=2")
    assert ROW.findall(second.get_data(as_text=True)) == [ids[1]]
    refused = client.get("/dashboard/events?type=deal.done")
    assert refused.status_code == 422
    assert "These filters are not valid" in refused.get_data(as_text=True)


def test_finding_an_event_by_id(app, client, brand, read_key, make_brand):
    [ours] = _publish(app, brand, "deal.completed")
    [theirs] = _publish(app, make_brand("Other Foods"), "deal.completed")
    sign_in(client, read_key)
    found = client.get(f"/dashboard/events?eventId={ours}")
    assert found.status_code == 303
    assert found.headers["Location"] == f"/dashboard/events/{ours}"
    missing = client.get(f"/dashboard/events?eventId={theirs}").get_data(as_text=True)
    assert f"No event with id <code>{theirs}</code> in this brand" in missing
    assert client.get(f"/dashboard/events/{theirs}").status_code == 404
    search = client.get("/dashboard/search", query_string={"q": ours})
    assert search.headers["Location"] == f"/dashboard/events/{ours}"


def test_an_events_page_shows_its_body_and_deliveries_and_read_keys_cannot_resend(
    app, client, brand, read_key
):
    endpoint = _endpoint(app, brand, "deals", ["deal.completed"])
    [event_id] = _publish(app, brand, "deal.completed")
    [delivery] = _deliveries_of(app, event_id)
    sign_in(client, read_key)
    page = client.get(f"/dashboard/events/{event_id}").get_data(as_text=True)
    assert f'href="/dashboard/deliveries/{delivery.id}"' in page
    assert f'href="/dashboard/endpoints/{endpoint}"' in page
    assert f"&#34;id&#34;: &#34;{event_id}&#34;" in page  # the body, indented
    assert "Resend to endpoint" not in page
    refused = client.post(f"/dashboard/events/{event_id}/resend", data={"endpointId": endpoint})
    assert refused.status_code in (400, 403)
    assert len(_deliveries_of(app, event_id)) == 1


def test_resend_to_an_endpoint(app, client, brand, write_key):
    subscribed = _endpoint(app, brand, "deals", ["deal.completed"])
    other = _endpoint(app, brand, "escrow", ["escrow.released"])
    disabled = _endpoint(app, brand, "off", ["deal.completed"])
    with app.app_context():
        update_endpoint(brand_id=brand, endpoint_id=disabled, policy=LOCAL_URLS, is_active=False)
        db.session.commit()
    [event_id] = _publish(app, brand, "deal.completed")
    [first] = _deliveries_of(app, event_id)
    token = sign_in(client, write_key)

    page = client.get(f"/dashboard/events/{event_id}").get_data(as_text=True)
    choices = re.findall(r'type="radio" name="endpointId" value="(whe_[0-9a-z]+)"', page)
    assert sorted(choices) == sorted([subscribed, other])  # active ones only

    # To the endpoint that had it: a redelivery of its delivery there.
    sent = client.post(
        f"/dashboard/events/{event_id}/resend",
        data={"endpointId": subscribed, "csrf_token": token},
    )
    assert sent.status_code == 303
    deliveries = _deliveries_of(app, event_id)
    assert len(deliveries) == 2
    assert deliveries[0].redelivered_as == deliveries[1].id
    assert deliveries[1].endpoint_id == subscribed
    after = client.get(sent.headers["Location"]).get_data(as_text=True)
    assert f"Queued as delivery {deliveries[1].id}" in after

    # To one that is not subscribed to it: a first delivery there.
    client.post(
        f"/dashboard/events/{event_id}/resend", data={"endpointId": other, "csrf_token": token}
    )
    deliveries = _deliveries_of(app, event_id)
    assert [d.endpoint_id for d in deliveries] == [subscribed, subscribed, other]
    assert deliveries[2].status == "pending" and deliveries[2].redelivered_as is None
    assert first.id == deliveries[0].id

    # A disabled endpoint, or no endpoint at all: refused, nothing queued.
    for endpoint_id in (disabled, "", "whe_nope\x00"):
        refused = client.post(
            f"/dashboard/events/{event_id}/resend",
            data={"endpointId": endpoint_id, "csrf_token": token},
        )
        assert refused.status_code == 404, endpoint_id
    assert len(_deliveries_of(app, event_id)) == 3


def test_an_events_page_lists_its_subjects_events_in_sequence(app, client, brand, read_key):
    def publish(name: str, deal_id: str) -> str:
        data = {"id": deal_id} if name.startswith("deal.") else {"dealId": deal_id}
        with app.app_context():
            event_id = publish_event(brand_id=brand, name=name, data=data).event.id
            db.session.commit()
        return event_id

    life = ["deal.accepted", "escrow.held", "placement.verified", "deal.completed"]
    ours = []
    for name in life:
        ours.append(publish(name, "deal_ours"))
        publish(name, "deal_other")  # another deal's life, interleaved
    sign_in(client, read_key)

    page = client.get(f"/dashboard/events/{ours[2]}").get_data(as_text=True)
    section = page.split('id="event-subject"')[1].split("</section>")[0]
    assert "Step 3 of deal <code>deal_ours</code>" in section
    assert "fetch-events?subject=deal:deal_ours" in section
    steps = re.findall(r'<li value="(\d+)"', section)
    assert steps == ["1", "2", "3", "4"]
    # Each other step links to its page; this one is marked, not linked.
    linked = re.findall(r'href="/dashboard/events/(evt_[0-9a-z]+)"', section)
    assert linked == [ours[0], ours[1], ours[3]]
    assert '<li value="3" aria-current="page">' in section
    assert "deal_other" not in section

    # A subject of one event: a list of one.
    [alone] = _publish(app, brand, "conversion.recorded")
    section = client.get(f"/dashboard/events/{alone}").get_data(as_text=True)
    section = section.split('id="event-subject"')[1].split("</section>")[0]
    assert re.findall(r'<li value="(\d+)"', section) == ["1"]


def test_a_long_subject_lists_the_events_around_this_one(app, client, brand, read_key):
    with app.app_context():
        ids = [
            publish_event(
                brand_id=brand, name="placement.metrics_updated", data={"dealId": "deal_busy"}
            ).event.id
            for _ in range(60)
        ]
        db.session.commit()
    sign_in(client, read_key)
    page = client.get(f"/dashboard/events/{ids[29]}").get_data(as_text=True)  # sequence 30
    section = page.split('id="event-subject"')[1].split("</section>")[0]
    assert re.findall(r'<li value="(\d+)"', section) == [str(n) for n in range(10, 51)]
    assert "Earlier ones" in section and "Later ones" in section
    first = client.get(f"/dashboard/events/{ids[0]}").get_data(as_text=True)
    section = first.split('id="event-subject"')[1].split("</section>")[0]
    assert re.findall(r'<li value="(\d+)"', section) == [str(n) for n in range(1, 22)]
    assert "Earlier ones" not in section and "Later ones" in section
