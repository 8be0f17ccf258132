"""The dashboard's search box: an id from a receiver's log or an API answer leads to its page,
never to another brand's record; and times read to the second."""

from __future__ import annotations

from datetime import timedelta

import pytest

from extensions import db
from models.columns import utcnow
from services.deliveries import redeliver
from services.events import publish_event
from services.postbacks import Postback, record_postback
from services.webhook_endpoints import current_url_policy, register_endpoint
from tests.dashboard import sign_in


def _records(app, brand_id: str) -> dict[str, str]:
    """An endpoint, an event with its delivery and a redelivery, and a conversion."""
    with app.test_request_context():
        endpoint = register_endpoint(
            brand_id=brand_id,
            url="http://127.0.0.1:9/hooks",
            events=["deal.completed"],
            policy=current_url_policy(),
        ).id
        published = publish_event(
            brand_id=brand_id, name="deal.completed", data={}, now=utcnow() - timedelta(hours=1)
        )
        publish_event(brand_id=brand_id, name="deal.completed", data={})  # another event
        db.session.flush()
        again = redeliver(brand_id=brand_id, delivery_id=published.delivery_ids[0])
        conversion = record_postback(
            brand_id=brand_id,
            idempotency_key="order-0001-purchase",
            postback=Postback(event_type="purchase"),
        ).conversion.id
        db.session.commit()
        return {
            "endpoint": endpoint,
            "event": published.event.id,
            "delivery": published.delivery_ids[0],
            "redelivery": again,
            "conversion": conversion,
        }


def test_every_page_has_the_search_box(client, brand, read_key):
    sign_in(client, read_key)
    for path in ("/dashboard/", "/dashboard/keys", "/dashboard/deliveries", "/dashboard/events"):
        page = client.get(path).get_data(as_text=True)
        assert '<form class="dash-search" method="get" action="/dashboard/search"' in page, path


@pytest.mark.parametrize(
    ("kind", "target"),
    [
        ("delivery", "/dashboard/deliveries/{delivery}"),
        ("event", "/dashboard/events/{event}"),
        ("conversion", "/dashboard/conversions/{conversion}"),
        ("endpoint", "/dashboard/endpoints/{endpoint}"),
    ],
)
def test_an_id_of_the_brand_goes_to_its_page(app, client, brand, read_key, kind, target):
    records = _records(app, brand)
    sign_in(client, read_key)
    response = client.get("/dashboard/search", query_string={"q": f"  {records[kind]} "})
    assert response.status_code == 303
    assert response.headers["Location"] == target.format(**records)
    assert client.get(response.headers["Location"]).status_code == 200


def test_an_event_id_lists_that_events_deliveries_and_redeliveries_only(
    app, client, brand, read_key
):
    records = _records(app, brand)
    sign_in(client, read_key)
    page = client.get(f"/dashboard/deliveries?eventId={records['event']}").get_data(as_text=True)
    rows = set(page.split('id="delivery-results"')[1].split('<tr id="delivery-')[1:])
    listed = {row.split('"')[0] for row in rows}
    assert listed == {records["delivery"], records["redelivery"]}
    assert f'value="{records["event"]}"' in page  # the filter shows, and can be cleared
    assert "2 deliveries match these filters" in page


def test_another_brands_or_an_unknown_id_is_not_found(
    app, client, brand, read_key, make_brand, make_key
):
    theirs = _records(app, make_brand("Other"))
    sign_in(client, read_key)
    for kind, name in [
        ("delivery", "delivery"),
        ("event", "event"),
        ("conversion", "conversion"),
        ("endpoint", "endpoint"),
    ]:
        response = client.get("/dashboard/search", query_string={"q": theirs[kind]})
        assert response.status_code == 200, kind
        page = response.get_data(as_text=True)
        assert f"No {name} with id {theirs[kind]} in this brand." in page
        assert f'value="{theirs[kind]}"' in page  # what was typed stays, to correct it


@pytest.mark.parametrize("query", ["order-0001-purchase", "cmp_01jd3k9m2x4q8r7t6v5w4y3z2a"])
def test_something_that_is_not_a_searchable_id_says_what_is(client, brand, read_key, query):
    sign_in(client, read_key)
    response = client.get("/dashboard/search", query_string={"q": query})
    assert response.status_code == 200
    assert "paste a delivery (whd_…), event (evt_…), conversion (conv_…)" in response.get_data(
        as_text=True
    )


def test_the_search_page_without_a_query_explains_itself(client, brand, read_key):
    sign_in(client, read_key)
    response = client.get("/dashboard/search")
    assert response.status_code == 200
    assert "<h1>Find by id</h1>" in response.get_data(as_text=True)


def test_the_search_needs_a_session(client):
    response = client.get("/dashboard/search?q=whd_x")
    assert response.status_code == 303
    assert "/dashboard/sign-in" in response.headers["Location"]


def test_times_read_to_the_second(app, client, brand, read_key):
    records = _records(app, brand)
    sign_in(client, read_key)
    page = client.get(f"/dashboard/deliveries/{records['delivery']}").get_data(as_text=True)
    shown = page.split("<dt>Created</dt><dd>")[1].split("</dd>")[0]
    stamp = shown.split('datetime="')[1].split('"')[0]  # 2026-11-24T13:25:07.123Z
    assert f">{stamp[:10]} {stamp[11:19]} UTC</time>" in shown
