"""An endpoint's own limit of attempts in flight (CONTRACT 13.5): `maxInFlight` on register and
update, in every endpoint shape, in the dashboard's settings, and kept by two real workers
sending to receivers that count the requests they hold at once."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from extensions import db
from models import WebhookEndpoint
from tests import test_webhook_delivery as delivery
from tests.dashboard import htmx, sign_in
from tests.helpers import assert_error
from tests.receiver import Receiver, Reply
from tests.test_webhook_delivery import logs, poll, publish

api = delivery.api
workers = delivery.workers
start_worker = delivery.start_worker

HOOK = "http://127.0.0.1:9/hooks"


def _stored_limit(app, endpoint_id: str) -> int | None:
    with app.app_context():
        return db.session.scalar(
            select(WebhookEndpoint.max_in_flight).where(WebhookEndpoint.id == endpoint_id)
        )


def test_max_in_flight_is_kept_shown_everywhere_and_reset_by_null(app, api):
    own = api.register(HOOK, maxInFlight=5)
    default = api.register(HOOK)
    assert (own["maxInFlight"], default["maxInFlight"]) == (5, None)
    assert api.endpoint(own["id"])["maxInFlight"] == 5
    assert api.endpoint(default["id"])["maxInFlight"] is None  # WEBHOOK_ENDPOINT_CONCURRENCY

    path = f"webhook/{own['id']}/update-endpoint"
    assert api.call("PATCH", path, json={"maxInFlight": 50})["maxInFlight"] == 50
    assert api.call("PATCH", path, json={"description": "other"})["maxInFlight"] == 50
    assert api.call("PATCH", path, json={"maxInFlight": None})["maxInFlight"] is None
    assert _stored_limit(app, own["id"]) is None


@pytest.mark.parametrize("value", [0, 51, -1, 2.5, "3", True])
def test_max_in_flight_out_of_range_is_refused_and_changes_nothing(app, api, value):
    response = api.client.post(
        f"/api/v1/brand/{api.brand}/webhook/register-endpoint",
        json={"url": HOOK, "maxInFlight": value},
        headers={"X-Api-Key": api.key},
    )
    assert "maxInFlight" in assert_error(response, 400, "VALIDATION_ERROR")["errors"]
    assert api.call("GET", "webhook/fetch-endpoints")["endpoints"] == []

    endpoint = api.register(HOOK, maxInFlight=4)
    response = api.client.patch(
        f"/api/v1/brand/{api.brand}/webhook/{endpoint['id']}/update-endpoint",
        json={"maxInFlight": value},
        headers={"X-Api-Key": api.key},
    )
    assert "maxInFlight" in assert_error(response, 400, "VALIDATION_ERROR")["errors"]
    assert _stored_limit(app, endpoint["id"]) == 4


def test_dashboard_settings_edit_the_limit(app, client, api, write_key):
    endpoint = api.register(HOOK, events=["deal.completed"])
    token = sign_in(client, write_key)
    page = client.get(f"/dashboard/endpoints/{endpoint['id']}").get_data(as_text=True)
    assert 'name="maxInFlight"' in page
    assert "at most 2 at a time" in page  # the setting's default, said as such
    assert "(the service's limit)" in page

    form = {"url": HOOK, "events": ["deal.completed"], "maxInFlight": "3"}
    response = client.post(f"/dashboard/endpoints/{endpoint['id']}", data=form, headers=htmx(token))
    assert response.status_code == 200, response.get_data(as_text=True)
    assert "at most 3 at a time" in response.get_data(as_text=True)
    assert _stored_limit(app, endpoint["id"]) == 3

    refused = client.post(
        f"/dashboard/endpoints/{endpoint['id']}",
        data={**form, "maxInFlight": "51"},
        headers=htmx(token),
    )
    assert refused.status_code == 422
    assert "less than or equal to 50" in refused.get_data(as_text=True)
    assert _stored_limit(app, endpoint["id"]) == 3

    cleared = client.post(
        f"/dashboard/endpoints/{endpoint['id']}",
        data={**form, "maxInFlight": ""},
        headers=htmx(token),
    )
    assert cleared.status_code == 200
    assert _stored_limit(app, endpoint["id"]) is None


def test_two_workers_never_have_more_than_max_in_flight_on_the_wire(app, api, brand, start_worker):
    """Two workers share the endpoints' limits: the one limited to 2 never holds a third
    request, and meets its limit; the other, on the setting (6), gets 6 at once."""
    narrow, wide = Receiver(), Receiver()
    gate = threading.Event()
    narrow.default = Reply(delay=0.3)
    wide.default = Reply(hold=gate)  # held until six are in at once
    settings = {"WEBHOOK_ENDPOINT_CONCURRENCY": "6", "WEBHOOK_TIMEOUT": "10"}
    try:
        limited = api.register(narrow.url, events=["deal.completed"], maxInFlight=2)
        api.register(wide.url, events=["deal.completed"])
        first, second = start_worker(**settings), start_worker(**settings)
        first.wait_started()
        second.wait_started()
        publish(app, brand, *[("deal.completed", {"n": n}) for n in range(12)])

        wide.wait_for(6, timeout=30)
        assert wide.max_in_flight == 6, logs(first, second)
        gate.set()
        narrow.wait_for(12, timeout=60)
        wide.wait_for(12, timeout=30)
        assert narrow.max_in_flight == 2, logs(first, second)

        # A new limit holds from the next claim on, without a restart.
        api.call("PATCH", f"webhook/{limited['id']}/update-endpoint", json={"maxInFlight": 1})
        poll(lambda: narrow.in_flight, lambda n: n == 0, timeout=10, what="narrow idle")
        narrow.max_in_flight = 0
        publish(app, brand, *[("deal.completed", {"n": n}) for n in range(12, 18)])
        narrow.wait_for(18, timeout=60)
        poll(lambda: narrow.in_flight, lambda n: n == 0, timeout=10, what="narrow idle")
        assert narrow.max_in_flight == 1, logs(first, second)
        assert narrow.overlaps() == [] and wide.overlaps() == []
    finally:
        gate.set()
        narrow.close()
        wide.close()
