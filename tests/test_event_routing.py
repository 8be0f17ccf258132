"""Where an event went, and why (CONTRACT 13.2): decided from what was true when the event was
published, whatever the endpoints became since."""

from __future__ import annotations

import pytest

from extensions import db
from services.events import publish_event
from tests.helpers import assert_error, assert_success
from tests.test_platform_changes import Platform
from tests.test_webhook_delivery import Api, publish

HOOK_URL = "https://hooks.brand-example.invalid/x"


@pytest.fixture
def api(client, brand, write_key) -> Api:
    return Api(client, brand, write_key)


def register(api: Api, events: list[str], **options) -> str:
    return api.register(HOOK_URL, events, **options)["id"]


def update(api: Api, endpoint_id: str, **body) -> None:
    assert_success(
        api.client.patch(
            f"/api/v1/brand/{api.brand}/webhook/{endpoint_id}/update-endpoint",
            json=body,
            headers={"X-Api-Key": api.key},
        )
    )


def routing(api: Api, event_id: str) -> dict:
    return api.call("GET", f"event/{event_id}/routing")


def outcomes(api: Api, event_id: str) -> list[tuple[str, str, str | None]]:
    return [
        (route["endpointId"], route["outcome"], route["deliveryId"])
        for route in routing(api, event_id)["endpoints"]
    ]


def test_each_endpoint_as_things_stood_at_publish_time(api, app, brand):
    platform = Platform(app, brand)
    ours, theirs = platform.campaign(), platform.campaign()
    deleted = register(api, ["deal.completed"])
    sent = register(api, ["deal.completed"])
    unsubscribed = register(api, ["deal.accepted"])
    filtered = register(api, ["deal.completed"], campaignIds=[theirs])
    disabled = register(api, ["deal.completed"])
    closed_and_filtered = register(api, ["deal.completed"], campaignIds=[theirs])
    update(api, disabled, isActive=False)
    update(api, closed_and_filtered, isActive=False)
    api.call("DELETE", f"webhook/{deleted}/delete-endpoint")

    [(event_id, [delivery_id])] = publish(
        app, brand, ("deal.completed", {"id": "deal_1", "campaignId": ours})
    )
    later = register(api, ["deal.completed"])
    expected = [
        (sent, "sent", delivery_id),
        (unsubscribed, "not_subscribed", None),
        (filtered, "filtered", None),
        (disabled, "disabled", None),
        (closed_and_filtered, "filtered", None),  # open, it would not have got it either
    ]
    assert routing(api, event_id)["eventId"] == event_id
    assert outcomes(api, event_id) == expected

    # Whatever the endpoints became since, the answer is what was true then.
    update(api, unsubscribed, events=["deal.completed"])
    update(api, filtered, campaignIds=[])
    update(api, disabled, isActive=True)
    update(api, sent, events=["deal.accepted"], isActive=False)
    assert outcomes(api, event_id) == expected
    assert later not in [endpoint for endpoint, _, _ in outcomes(api, event_id)]

    # A redelivery is not the first delivery; an endpoint deleted since is no longer listed.
    update(api, sent, isActive=True)
    api.call("POST", f"webhook/deliveries/{delivery_id}/redeliver", 202)
    assert outcomes(api, event_id)[0] == (sent, "sent", delivery_id)
    api.call("DELETE", f"webhook/{unsubscribed}/delete-endpoint")
    assert unsubscribed not in [endpoint for endpoint, _, _ in outcomes(api, event_id)]


def test_an_alert_about_an_endpoint_is_filtered_for_it(api, app, brand):
    about = register(api, ["webhook.endpoint_failing"])
    told = register(api, ["webhook.endpoint_failing"])
    with app.app_context():
        published = publish_event(
            brand_id=brand,
            name="webhook.endpoint_failing",
            data={"endpointId": about, "url": HOOK_URL, "consecutiveFailures": 8},
            except_endpoint_ids=[about],
        )
        db.session.commit()
        event_id, [delivery_id] = published.event.id, published.delivery_ids
    assert outcomes(api, event_id) == [(about, "filtered", None), (told, "sent", delivery_id)]


def test_read_scope_and_other_brands(api, app, brand, client, read_key, make_brand):
    register(api, ["deal.completed"])
    [(ours, _)] = publish(app, brand, ("deal.completed", {"id": "deal_1"}))
    [(theirs, _)] = publish(app, make_brand("Other Foods"), ("deal.completed", {"id": "deal_2"}))
    read = client.get(
        f"/api/v1/brand/{brand}/event/{ours}/routing", headers={"X-Api-Key": read_key}
    )
    assert assert_success(read)["endpoints"][0]["outcome"] == "sent"
    for event_id in (theirs, "evt_0000000000000000000000000"):
        assert_error(
            client.get(
                f"/api/v1/brand/{brand}/event/{event_id}/routing",
                headers={"X-Api-Key": read_key},
            ),
            404,
            "NOT_FOUND",
        )
