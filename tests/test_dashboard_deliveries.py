"""The dashboard's delivery log and delivery pages: filters, sort, paging, rows that refresh
while pending, a delivery's payload, headers and attempts from a real worker, and redeliver."""

from __future__ import annotations

import re
import time
from datetime import timedelta

from sqlalchemy import func, select, update

from extensions import db
from models import WebhookDelivery
from models.columns import utcnow
from services.events import publish_event
from services.webhook_endpoints import current_url_policy, register_endpoint
from tests.dashboard import htmx, sign_in
from tests.receiver import Reply

ROW = re.compile(r'<tr id="delivery-(whd_[^"]+)"')


def _endpoint(app, brand_id: str, url: str = "http://127.0.0.1:9/hooks") -> str:
    with app.test_request_context():
        endpoint = register_endpoint(
            brand_id=brand_id,
            url=url,
            events=["deal.completed", "escrow.released"],
            policy=current_url_policy(),
        )
        db.session.commit()
        return endpoint.id


def _publish(app, brand_id: str, name: str, count: int = 1, **status) -> list[str]:
    """Publish `count` events; optionally settle their deliveries as the worker would."""
    ids = []
    with app.test_request_context():
        for n in range(count):
            published = publish_event(
                brand_id=brand_id, name=name, data={"n": n}, now=utcnow() + timedelta(seconds=n)
            )
            ids.extend(published.delivery_ids)
        if status:
            db.session.execute(
                update(WebhookDelivery).where(WebhookDelivery.id.in_(ids)).values(**status)
            )
        db.session.commit()
    return ids


def _rows(page: str) -> list[str]:
    return ROW.findall(page)


def test_the_log_lists_newest_first_with_endpoint_status_and_details(app, client, brand, read_key):
    endpoint_id = _endpoint(app, brand)
    [first, second] = _publish(app, brand, "deal.completed", 2)
    sign_in(client, read_key)
    page = client.get("/dashboard/deliveries").get_data(as_text=True)
    assert _rows(page) == [second, first]
    assert "http://127.0.0.1:9/hooks" in page
    assert f"/dashboard/endpoints/{endpoint_id}" in page
    assert f"/dashboard/deliveries/{first}" in page
    assert 'status-pending">pending' in page


def test_filters_sort_and_paging(app, client, brand, read_key):
    endpoint_id = _endpoint(app, brand)
    other_endpoint = _endpoint(app, brand, "http://127.0.0.1:9/other")
    failed = _publish(app, brand, "escrow.released", 2, status="failed", last_error="HTTP 500")
    delivered = _publish(app, brand, "deal.completed", 3, status="delivered", http_status=200)
    sign_in(client, read_key)

    def rows(query: str) -> list[str]:
        response = client.get(f"/dashboard/deliveries?{query}")
        assert response.status_code == 200
        return _rows(response.get_data(as_text=True))

    assert len(rows("")) == 10  # every event went to both endpoints
    assert set(rows("status=failed")) == set(failed)
    assert set(rows("eventName=deal.completed")) == set(delivered)
    per_endpoint = rows(f"endpointId={endpoint_id}")
    assert len(per_endpoint) == 5
    assert not set(per_endpoint) & set(rows(f"endpointId={other_endpoint}"))
    assert rows("sortOrder=asc") == list(reversed(rows("sortOrder=desc")))
    first_page, second_page = rows("limit=4"), rows("limit=4&page=2")
    assert len(first_page) == 4 and len(second_page) == 4
    assert not set(first_page) & set(second_page)
    page = client.get("/dashboard/deliveries?limit=4&status=delivered").get_data(as_text=True)
    assert "Page 1 of 2" in page
    assert "/dashboard/deliveries?status=delivered&amp;limit=4&amp;page=2" in page
    # the filters chosen stay selected
    assert '<option value="delivered" selected>' in page


def test_an_invalid_filter_says_which_and_lists_nothing(app, client, brand, read_key):
    _publish(app, brand, "deal.completed")
    sign_in(client, read_key)
    response = client.get("/dashboard/deliveries?status=lost&limit=500")
    assert response.status_code == 400
    page = response.get_data(as_text=True)
    assert "These filters are not valid" in page
    assert "status" in page and "Must be one of: pending, delivered, failed." in page
    assert "limit" in page
    assert _rows(page) == []


def test_htmx_gets_only_the_results(app, client, brand, read_key):
    _publish(app, brand, "deal.completed", 2)
    _endpoint(app, brand)
    token = sign_in(client, read_key)
    response = client.get("/dashboard/deliveries?status=pending", headers=htmx(token))
    fragment = response.get_data(as_text=True)
    assert fragment.lstrip().startswith('<div id="delivery-results">')
    assert "<html" not in fragment
    # the back button restores a whole page, never a fragment
    restore = client.get(
        "/dashboard/deliveries?status=pending",
        headers=htmx(token, **{"HX-History-Restore-Request": "true"}),
    )
    assert "<html" in restore.get_data(as_text=True)


def test_empty_states_say_what_to_do(app, client, brand, read_key):
    sign_in(client, read_key)
    page = client.get("/dashboard/deliveries").get_data(as_text=True)
    assert "No deliveries yet" in page and "Register an endpoint" in page
    page = client.get("/dashboard/deliveries?status=failed").get_data(as_text=True)
    assert "No delivery matches these filters" in page and "Clear filters" in page


def test_pending_rows_poll_and_settled_rows_do_not(app, client, brand, read_key):
    _endpoint(app, brand)
    [pending] = _publish(app, brand, "deal.completed")
    [done] = _publish(app, brand, "escrow.released", status="delivered", http_status=200)
    sign_in(client, read_key)
    page = client.get("/dashboard/deliveries").get_data(as_text=True)
    pending_row = re.search(rf'<tr id="delivery-{pending}"[^>]*>', page).group(0)
    done_row = re.search(rf'<tr id="delivery-{done}"[^>]*>', page).group(0)
    assert f'hx-get="/dashboard/deliveries/{pending}/row"' in pending_row
    assert 'hx-trigger="load delay:2s"' in pending_row
    assert "hx-get" not in done_row
    # once it settles, the row fragment stops asking
    with app.app_context():
        db.session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == pending)
            .values(status="delivered", http_status=204)
        )
        db.session.commit()
    row = client.get(f"/dashboard/deliveries/{pending}/row", headers={"HX-Request": "true"})
    fragment = row.get_data(as_text=True)
    assert fragment.lstrip().startswith(f'<tr id="delivery-{pending}"')
    assert "hx-get" not in fragment.split(">")[0]
    assert 'status-delivered">delivered' in fragment


def test_a_pending_detail_refreshes_itself(app, client, brand, read_key):
    _endpoint(app, brand)
    [pending] = _publish(app, brand, "deal.completed")
    sign_in(client, read_key)
    page = client.get(f"/dashboard/deliveries/{pending}").get_data(as_text=True)
    region = page.split('id="delivery-progress"')[1].split(">")[0]
    assert f'hx-get="/dashboard/deliveries/{pending}"' in region
    assert "No attempt yet" in page
    fragment = client.get(
        f"/dashboard/deliveries/{pending}", headers={"HX-Request": "true"}
    ).get_data(as_text=True)
    assert fragment.lstrip().startswith('<div id="delivery-progress"')
    assert "<html" not in fragment


def test_redeliver_queues_a_new_delivery_of_the_same_event(app, client, brand, write_key):
    _endpoint(app, brand)
    [original] = _publish(app, brand, "deal.completed", status="failed", last_error="HTTP 500")
    token = sign_in(client, write_key)
    response = client.post(f"/dashboard/deliveries/{original}/redeliver", headers=htmx(token))
    assert response.status_code == 202
    new_id = re.search(
        r"Redelivery queued as <a href=\"/dashboard/deliveries/(whd_[^\"]+)\"",
        response.get_data(as_text=True),
    ).group(1)
    assert new_id != original
    with app.app_context():
        rows = {
            d.id: d
            for d in db.session.scalars(
                select(WebhookDelivery).where(WebhookDelivery.id.in_([original, new_id]))
            )
        }
        assert rows[new_id].event_id == rows[original].event_id
        assert rows[new_id].status == "pending"


def test_redeliver_needs_write_scope_and_the_csrf_token(app, client, brand, read_key, make_key):
    _endpoint(app, brand)
    [original] = _publish(app, brand, "deal.completed")
    token = sign_in(client, read_key)
    page = client.get(f"/dashboard/deliveries/{original}").get_data(as_text=True)
    assert "Redeliver" not in page
    response = client.post(f"/dashboard/deliveries/{original}/redeliver", headers=htmx(token))
    assert response.status_code == 403
    writer = app.test_client()
    sign_in(writer, make_key(brand, name="writer"))
    response = writer.post(
        f"/dashboard/deliveries/{original}/redeliver", headers={"HX-Request": "true"}
    )
    assert response.status_code == 403
    with app.app_context():
        assert db.session.scalar(select(func.count()).select_from(WebhookDelivery)) == 1


def test_another_brands_delivery_is_not_found(app, client, brand, write_key, make_brand):
    other = make_brand("Other Brand")
    _endpoint(app, other)
    [theirs] = _publish(app, other, "deal.completed")
    token = sign_in(client, write_key)
    assert client.get(f"/dashboard/deliveries/{theirs}").status_code == 404
    assert client.get(f"/dashboard/deliveries/{theirs}/row").status_code == 404
    response = client.post(f"/dashboard/deliveries/{theirs}/redeliver", headers=htmx(token))
    assert response.status_code == 404
    assert _rows(client.get("/dashboard/deliveries").get_data(as_text=True)) == []


# Last in the module: once the module's worker runs, it would also attempt the other tests'
# deliveries while their tables are being emptied.
def test_a_real_delivery_shows_payload_headers_and_attempts(
    app, client, brand, write_key, receiver, webhook_worker
):
    endpoint_id = _endpoint(app, brand, receiver.url)
    receiver.reply_with(Reply(status=200, body=b'{"received": true, "by": "<receiver>"}'))
    token = sign_in(client, write_key)
    sent = client.post(f"/dashboard/endpoints/{endpoint_id}/send-test", headers=htmx(token))
    assert sent.status_code == 202
    delivery_id = re.search(r"(whd_[0-9a-z]+)", sent.get_data(as_text=True)).group(1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        row = client.get(
            f"/dashboard/deliveries/{delivery_id}/row", headers={"HX-Request": "true"}
        ).get_data(as_text=True)
        if "status-delivered" in row:
            break
        time.sleep(0.2)
    assert "status-delivered" in row, webhook_worker.output()[-2000:]
    [received] = receiver.wait_for(1)
    page = client.get(f"/dashboard/deliveries/{delivery_id}").get_data(as_text=True)
    assert "webhook.test" in page
    assert "Attempt 1" in page and "HTTP 200" in page
    assert "&lt;receiver&gt;" in page  # the response body, escaped
    assert received.headers["X-Service-Signature"] in page  # the headers sent
    assert f"X-Service-Delivery: {delivery_id}" in page
    assert f"&#34;endpointId&#34;: &#34;{endpoint_id}&#34;" in page  # the payload
    assert "hx-trigger" not in page.split('id="delivery-progress"')[1].split(">")[0]
