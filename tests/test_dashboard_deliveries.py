"""The dashboard's delivery log and delivery pages: filters, sort and paging as the API reads
them, rows that refresh while pending and stop once settled, a delivery's payload, headers and
attempts, and redeliver with its scope and CSRF rules (SPEC section 4, CONTRACT 4, 6 and 7).

Data is made through the services: endpoints by register_endpoint, deliveries by publish_event,
and attempts by the worker's own claim_attempts + record_attempts (the last test runs a
real worker against a real receiver).
"""

from __future__ import annotations

import html
import json
import re
import time
from datetime import timedelta

from sqlalchemy import func, select, text

from extensions import db
from models import WebhookDelivery
from models.columns import utcnow
from services.delivery.outcomes import AttemptOutcome, RetryPolicy
from services.delivery.queue import claim_attempts, record_attempts
from services.events import publish_event
from services.signing import delivery_headers
from services.webhook_endpoints import (
    current_url_policy,
    delete_endpoint,
    register_endpoint,
    update_endpoint,
)
from tests.bulk_jobs import run_bulk_jobs
from tests.dashboard import htmx, sign_in
from tests.receiver import Reply

ROW = re.compile(r'<tr id="delivery-(whd_[^"]+)"')
DOWN_URL = "http://127.0.0.1:9/hooks"


# ---- helpers ----


def _endpoint(app, brand_id: str, url: str = DOWN_URL) -> str:
    with app.test_request_context():
        endpoint = register_endpoint(
            brand_id=brand_id,
            url=url,
            events=["deal.completed", "escrow.released"],
            policy=current_url_policy(),
        )
        db.session.commit()
        return endpoint.id


def _publish(app, brand_id: str, name: str = "deal.completed", count: int = 1) -> list[str]:
    """Publish `count` events a second apart; the ids of their deliveries, oldest first."""
    ids = []
    with app.test_request_context():
        start = utcnow()
        for n in range(count):
            published = publish_event(
                brand_id=brand_id,
                name=name,
                data={"dealId": f"deal_{n}", "note": "<b>n</b>"},
                now=start + timedelta(seconds=n),
            )
            ids.extend(published.delivery_ids)
        db.session.commit()
    return ids


def _attempt(
    app, endpoint_id: str, replies: dict, *, retry: bool = False, minutes: int = 1
) -> None:
    """One attempt at each delivery in `replies` ({id: (http_status, body, error)}), recorded as
    the worker records it. A failure ends `failed`, or with `retry` stays pending with a retry
    due in a minute. The attempt is made `minutes` from now."""
    policy = RetryPolicy(
        schedule=(60,) if retry else (),
        disable_failures=1000,
        disable_window=timedelta(hours=1),
    )
    with app.test_request_context():
        now = utcnow() + timedelta(minutes=minutes)
        claimed = claim_attempts(
            slots=100, endpoint_limit=100, token="0000test", lease=policy.lease, now=now
        )
        attempts = [a for a in claimed.attempts if a.endpoint_id == endpoint_id]
        assert attempts, "nothing due"
        results = []
        for attempt in attempts:
            if attempt.delivery_id not in replies:
                continue
            status, body, error = replies[attempt.delivery_id]
            headers = delivery_headers(
                secret="whsec_not_a_real_secret",
                timestamp=int(now.timestamp()),
                raw_body=attempt.body,
                event_name=attempt.event_name,
                event_id=attempt.event_id,
                delivery_id=attempt.delivery_id,
            )
            outcome = AttemptOutcome(
                requested_at=now,
                duration_ms=137,
                request_headers=headers,
                http_status=status,
                error=error,
                response_body=body,
            )
            results.append((attempt, outcome))
        assert all(record_attempts(results, policy=policy))
        # The others were not attempted: back in the queue as before, held by nobody.
        db.session.execute(
            text(
                """
                WITH given_back AS (
                    DELETE FROM webhook_delivery_leases WHERE token = '0000test' RETURNING *
                )
                INSERT INTO webhook_delivery_queue (delivery_id, endpoint_id, next_attempt_at,
                                                    attempt_count)
                SELECT delivery_id, endpoint_id, statement_timestamp(), attempt_count
                FROM given_back
                """
            )
        )
        db.session.commit()


def _deliver(app, endpoint_id: str, *ids: str) -> None:
    _attempt(app, endpoint_id, {i: (200, "ok", None) for i in ids})


def _fail(app, endpoint_id: str, *ids: str) -> None:
    _attempt(app, endpoint_id, {i: (500, "boom", None) for i in ids})


def _text(response) -> str:
    return response.get_data(as_text=True)


def _rows(page: str) -> list[str]:
    return ROW.findall(page)


def _row_tag(page: str, delivery_id: str) -> str:
    match = re.search(rf'<tr id="delivery-{delivery_id}"[^>]*>', page)
    assert match, f"no row for {delivery_id}"
    return match.group(0)


def _row(page: str, delivery_id: str) -> str:
    match = re.search(rf'<tr id="delivery-{delivery_id}".*?</tr>', page, re.S)
    assert match, f"no row for {delivery_id}"
    return match.group(0)


def _count_deliveries(app) -> int:
    with app.app_context():
        return db.session.scalar(select(func.count()).select_from(WebhookDelivery))


# ---- the log ----


def test_the_log_lists_each_delivery_newest_first(app, client, brand, read_key):
    endpoint_id = _endpoint(app, brand)
    first, second, third = _publish(app, brand, count=3)
    _deliver(app, endpoint_id, first)
    _attempt(app, endpoint_id, {second: (503, "busy", None)}, retry=True)
    sign_in(client, read_key)
    page = _text(client.get("/dashboard/deliveries"))
    assert "<h1>Deliveries</h1>" in page
    assert _rows(page) == [third, second, first]
    assert "3 deliveries" in page
    delivered = _row(page, first)
    assert (
        'status-delivered">delivered' in delivered and '<td data-label="HTTP">200</td>' in delivered
    )
    # The row names the endpoint without the scheme every row would repeat; the title has it all.
    shown = DOWN_URL.removeprefix("http://")
    read = delivered.replace("<wbr>", "")
    assert f'href="/dashboard/endpoints/{endpoint_id}" title="{DOWN_URL}">{shown}</a>' in read
    assert "9/<wbr>hooks" in delivered  # it wraps after a slash, not inside a word
    assert f'href="/dashboard/deliveries/{first}">Details</a>' in delivered
    # Pending after a failed attempt: shown as retrying, with what failed and when it is next.
    retrying = _row(page, second)
    assert 'data-status="pending" data-retrying' in retrying
    assert 'status-retrying"' in retrying and ">retrying</span>" in retrying
    assert "HTTP 503" in retrying  # the last error
    note = retrying.rsplit("HTTP 503", 1)[1]
    assert "1 attempt failed · next retry <time datetime=" in note  # and when it is due
    # Pending with no attempt yet: waiting (the API's status, pending, in its title).
    waiting = r'class="status status-waiting" title="Status pending[^"]*">waiting<'
    assert re.search(waiting, _row(page, third))
    assert '<td data-label="Attempts">0</td>' in _row(page, third)  # no attempt yet


def test_every_filter_sort_and_page(app, client, brand, read_key):
    endpoint_id = _endpoint(app, brand)
    other_id = _endpoint(app, brand, "http://127.0.0.1:9/other")
    escrow = _publish(app, brand, "escrow.released", 2)  # two events, four deliveries
    deals = _publish(app, brand, "deal.completed", 3)  # three events, six deliveries
    to_endpoint = set(escrow[0::2] + deals[0::2])  # each event's first delivery
    _fail(app, endpoint_id, escrow[0], escrow[2])
    _deliver(app, endpoint_id, deals[0])
    sign_in(client, read_key)

    def rows(query: str) -> list[str]:
        response = client.get(f"/dashboard/deliveries?{query}")
        assert response.status_code == 200, _text(response)
        return _rows(_text(response))

    assert len(rows("")) == 10
    assert set(rows("status=failed")) == {escrow[0], escrow[2]}
    assert rows("status=delivered") == [deals[0]]
    assert len(rows("status=pending")) == 7
    assert rows("retrying=true") == []
    assert len(rows("retrying=false")) == 10
    assert set(rows("eventName=deal.completed")) == set(deals)
    assert rows("eventName=webhook.test") == []
    assert set(rows(f"endpointId={endpoint_id}")) == to_endpoint
    assert set(rows(f"endpointId={other_id}")) == set(escrow + deals) - to_endpoint
    assert set(rows(f"endpointId={endpoint_id}&eventName=escrow.released&status=failed")) == {
        escrow[0],
        escrow[2],
    }
    newest_first = rows("")
    assert rows("sortOrder=desc") == newest_first
    assert rows("sortOrder=asc") == list(reversed(newest_first))
    pages = [rows(f"limit=4&page={n}") for n in (1, 2, 3)]
    assert [len(p) for p in pages] == [4, 4, 2]
    assert [row for page in pages for row in page] == newest_first

    page = _text(client.get(f"/dashboard/deliveries?status=pending&endpointId={other_id}&limit=2"))
    assert "Page 1 of 3" in page
    next_url = (
        f"/dashboard/deliveries?status=pending&amp;endpointId={other_id}&amp;limit=2&amp;page=2"
    )
    assert f'href="{next_url}" hx-get="{next_url}" hx-target="#delivery-results"' in page
    # the filters chosen stay chosen, the limit rides along, and they can be cleared
    assert '<option value="pending" selected>' in page
    assert f'<option value="{other_id}" selected>' in page
    assert '<input type="hidden" name="limit" value="2">' in page
    assert 'href="/dashboard/deliveries">Clear filters</a>' in page
    second = _text(client.get(next_url.replace("&amp;", "&")))
    assert "Page 2 of 3" in second and "← Previous" in second


def test_the_filter_form_offers_every_event_and_endpoint_and_works_without_js(
    app, client, brand, read_key
):
    from models.event_catalog import EVENT_NAMES

    endpoint_id = _endpoint(app, brand)
    disabled_id = _endpoint(app, brand, "http://127.0.0.1:9/disabled")
    with app.test_request_context():
        update_endpoint(
            brand_id=brand, endpoint_id=disabled_id, policy=current_url_policy(), is_active=False
        )
        db.session.commit()
    sign_in(client, read_key)
    page = _text(client.get("/dashboard/deliveries"))
    form = re.search(r'<form id="delivery-filters".*?</form>', page, re.S).group(0)
    assert 'method="get" action="/dashboard/deliveries"' in form
    assert 'hx-get="/dashboard/deliveries" hx-trigger="change, submit"' in form
    assert 'hx-target="#delivery-results"' in form and 'hx-push-url="true"' in form
    for name in ("status", "eventName", "endpointId", "sortOrder"):
        assert f'name="{name}"' in form
    for event in EVENT_NAMES:
        assert f'<option value="{event}">{event}</option>' in form
    assert f'<option value="{endpoint_id}">{DOWN_URL}</option>' in form
    assert f'<option value="{disabled_id}">http://127.0.0.1:9/disabled (disabled)</option>' in form
    assert '<option value="asc">Oldest first</option>' in form
    assert "Apply filters</button>" in form


def test_an_invalid_filter_shows_the_apis_message_instead_of_a_list(app, client, brand, read_key):
    _endpoint(app, brand)
    _publish(app, brand)
    token = sign_in(client, read_key)
    response = client.get("/dashboard/deliveries?status=lost&limit=500&sortOrder=sideways")
    assert response.status_code == 422
    page = _text(response)
    assert "These filters are not valid" in page
    assert "Status (<code>status</code>): Must be one of: pending, delivered, failed." in page
    assert "Per page (<code>limit</code>)" in page
    assert "Order (<code>sortOrder</code>)" in page
    assert 'id="filter-status" name="status" aria-invalid="true"' in page
    assert _rows(page) == []
    # htmx swaps a 422: the results region says the same
    fragment = _text(client.get("/dashboard/deliveries?page=0", headers=htmx(token)))
    assert fragment.lstrip().startswith('<div id="delivery-results"')
    assert "Page (<code>page</code>)" in fragment


def test_htmx_gets_only_the_results_region(app, client, brand, read_key):
    _endpoint(app, brand)
    [pending] = _publish(app, brand)
    token = sign_in(client, read_key)
    response = client.get("/dashboard/deliveries?status=pending", headers=htmx(token))
    assert response.status_code == 200
    fragment = _text(response)
    assert fragment.lstrip().startswith('<div id="delivery-results" hx-swap="outerHTML">')
    assert "<html" not in fragment and 'id="delivery-filters"' not in fragment
    assert _rows(fragment) == [pending]
    assert "HX-Request" in response.headers["Vary"]
    # the back button restores a whole page, never a fragment
    restore = client.get(
        "/dashboard/deliveries?status=pending",
        headers=htmx(token, **{"HX-History-Restore-Request": "true"}),
    )
    assert "<html" in _text(restore)


def test_empty_states_say_what_to_do(app, client, brand, read_key):
    sign_in(client, read_key)
    page = _text(client.get("/dashboard/deliveries"))
    assert "No deliveries yet." in page
    assert '<a href="/dashboard/endpoints">Register an endpoint</a> and send it a test' in page
    _endpoint(app, brand)
    _publish(app, brand)
    page = _text(client.get("/dashboard/deliveries?status=failed"))
    assert "No delivery matches these filters." in page
    assert '<a href="/dashboard/deliveries">Clear filters</a> to see every delivery' in page
    assert "No deliveries yet" not in page
    page = _text(client.get("/dashboard/deliveries?page=5"))
    assert "No delivery matches these filters on page 5." in page


# ---- rows that refresh themselves ----


def test_a_pending_row_polls_until_it_settles(app, client, brand, read_key):
    endpoint_id = _endpoint(app, brand)
    pending, done = _publish(app, brand, count=2)
    _deliver(app, endpoint_id, done)
    token = sign_in(client, read_key)
    page = _text(client.get("/dashboard/deliveries"))
    pending_tag = _row_tag(page, pending)
    assert f'hx-get="/dashboard/deliveries/{pending}/row?polls=1"' in pending_tag
    assert 'hx-trigger="load delay:2s"' in pending_tag
    assert 'hx-swap="outerHTML"' in pending_tag
    assert 'data-status="pending"' in pending_tag
    done_tag = _row_tag(page, done)
    assert "hx-get" not in done_tag and "hx-trigger" not in done_tag

    # Asked while still pending, the row asks again, counting.
    still = _text(client.get(f"/dashboard/deliveries/{pending}/row?polls=1", headers=htmx(token)))
    assert still.lstrip().startswith(f'<tr id="delivery-{pending}"')
    assert f'hx-get="/dashboard/deliveries/{pending}/row?polls=2"' in _row_tag(still, pending)
    assert 'id="flash"' not in still  # a poll never wipes the page's messages
    # Once delivered, the answer has no trigger: the polling stops.
    _deliver(app, endpoint_id, pending)
    settled = _text(client.get(f"/dashboard/deliveries/{pending}/row?polls=2", headers=htmx(token)))
    tag = _row_tag(settled, pending)
    assert "hx-get" not in tag and "hx-trigger" not in tag and 'data-status="delivered"' in tag
    assert 'status-delivered">delivered' in settled and '<td data-label="HTTP">200</td>' in settled
    assert DOWN_URL in settled  # the endpoint cell is the same as the list's


def test_a_failed_row_stops_polling_and_polling_is_bounded(app, client, brand, read_key):
    endpoint_id = _endpoint(app, brand)
    failing, waiting = _publish(app, brand, count=2)
    token = sign_in(client, read_key)
    _fail(app, endpoint_id, failing)
    row = _text(client.get(f"/dashboard/deliveries/{failing}/row?polls=3", headers=htmx(token)))
    assert "hx-trigger" not in _row_tag(row, failing)
    assert 'status-failed">failed' in row and "HTTP 500" in row
    # After five minutes of asking, a pending row stops and offers to check again.
    tired = _text(client.get(f"/dashboard/deliveries/{waiting}/row?polls=149", headers=htmx(token)))
    assert "hx-trigger" not in _row_tag(tired, waiting)
    assert "Check again</a>" in tired
    assert f'hx-get="/dashboard/deliveries/{waiting}/row"' in tired


def test_the_row_route_without_htmx_and_for_another_brand(app, client, brand, read_key, make_brand):
    _endpoint(app, brand)
    [mine] = _publish(app, brand)
    other = make_brand("Other Brand")
    _endpoint(app, other)
    [theirs] = _publish(app, other)
    token = sign_in(client, read_key)
    response = client.get(f"/dashboard/deliveries/{mine}/row")
    assert response.status_code == 303
    assert response.headers["Location"].endswith(f"/dashboard/deliveries/{mine}")
    assert client.get(f"/dashboard/deliveries/{theirs}/row", headers=htmx(token)).status_code == 404


# ---- one delivery ----


def test_a_pending_delivery_shows_its_payload_and_the_headers_it_will_send(
    app, client, brand, read_key
):
    endpoint_id = _endpoint(app, brand)
    [pending] = _publish(app, brand)
    token = sign_in(client, read_key)
    page = _text(client.get(f"/dashboard/deliveries/{pending}"))
    assert "Delivery of <code>deal.completed</code>" in page
    assert f'href="/dashboard/endpoints/{endpoint_id}">{DOWN_URL}</a>' in page.replace("<wbr>", "")
    assert "No attempt yet" in page
    assert "This page updates by itself" in page
    region = re.search(r'<div id="delivery-progress"[^>]*>', page).group(0)
    assert f'hx-get="/dashboard/deliveries/{pending}/progress?polls=1"' in region
    assert 'hx-trigger="load delay:2s"' in region
    # the headers it will carry, no secret among them
    assert "X-Service-Event: deal.completed" in page
    assert f"X-Service-Delivery: {pending}" in page
    assert "Content-Type: application/json" in page
    assert "whsec_" not in page
    # the exact payload, pretty-printed and escaped
    payload = re.search(r'<pre class="block"><code>(\{.*?)</code></pre>', page, re.S).group(1)
    body = json.loads(html.unescape(payload))
    assert body["type"] == "deal.completed" and body["brandId"] == brand
    assert body["data"] == {"dealId": "deal_0", "note": "<b>n</b>"}
    assert "&lt;b&gt;n&lt;/b&gt;" in payload
    # the region's own route, for htmx only
    fragment = _text(
        client.get(f"/dashboard/deliveries/{pending}/progress?polls=1", headers=htmx(token))
    )
    assert fragment.lstrip().startswith('<div id="delivery-progress"')
    assert "/progress?polls=2" in fragment.split(">")[0]
    assert "<html" not in fragment
    plain = client.get(f"/dashboard/deliveries/{pending}/progress")
    assert plain.status_code == 303


def test_a_delivery_shows_each_attempt_with_its_answer(app, client, brand, read_key):
    endpoint_id = _endpoint(app, brand)
    [delivery_id] = _publish(app, brand)
    _attempt(app, endpoint_id, {delivery_id: (500, '{"error": "<db down>"}', None)}, retry=True)
    token = sign_in(client, read_key)
    page = _text(client.get(f"/dashboard/deliveries/{delivery_id}"))
    assert '<h2>Status <span class="status status-retrying"' in page
    assert 'Its endpoint is failing: <span class="retry-note">1 attempt failed · next retry' in page
    assert "Attempt 1" in page and "HTTP 500" in page and "137 ms" in page
    assert "{&#34;error&#34;: &#34;&lt;db down&gt;&#34;}" in page  # the response body, escaped
    assert "Next retry</dt><dd><time" in page
    # A second attempt succeeds: the region, asked again, shows both and stops asking.
    _attempt(app, endpoint_id, {delivery_id: (204, "", None)}, minutes=10)
    fragment = _text(
        client.get(f"/dashboard/deliveries/{delivery_id}/progress?polls=4", headers=htmx(token))
    )
    assert "hx-trigger" not in fragment.split(">")[0]
    assert 'status-delivered">delivered' in fragment
    assert "Attempt 2" in fragment and "HTTP 204" in fragment and "Attempt 1" in fragment
    assert fragment.index("Attempt 2") < fragment.index("Attempt 1")  # newest first
    assert "As attempt 2 sent them" in fragment
    assert re.search(r"X-Service-Signature: sha256=[0-9a-f]{64}", fragment)
    assert "whsec_" not in fragment  # the signature, never the secret
    assert "X-Service-Timestamp: " in fragment
    assert "Delivered at</dt><dd><time" in fragment


def test_a_pending_detail_stops_asking_after_five_minutes(app, client, brand, read_key):
    _endpoint(app, brand)
    [pending] = _publish(app, brand)
    token = sign_in(client, read_key)
    url = f"/dashboard/deliveries/{pending}/progress"
    asking = _text(client.get(f"{url}?polls=148", headers=htmx(token)))
    assert f'hx-get="{url}?polls=149"' in asking.lstrip().split(">")[0]
    tired = _text(client.get(f"{url}?polls=149", headers=htmx(token)))
    assert "hx-trigger" not in tired.lstrip().split(">")[0]
    assert f'Still waiting. <a href="/dashboard/deliveries/{pending}" hx-get="{url}"' in tired


def test_a_deleted_endpoints_deliveries_stay_in_the_log(app, client, brand, read_key):
    endpoint_id = _endpoint(app, brand)
    [delivery_id] = _publish(app, brand)
    with app.test_request_context():
        delete_endpoint(brand_id=brand, endpoint_id=endpoint_id)
        db.session.commit()
    run_bulk_jobs(app)  # the job that ends its pending deliveries, as a worker runs it
    token = sign_in(client, read_key)
    page = _text(client.get("/dashboard/deliveries"))
    row = _row(page, delivery_id)
    assert f'<code>{endpoint_id}</code> <span class="muted">(deleted)</span>' in row
    assert 'status-failed">failed' in row and "hx-trigger" not in _row_tag(page, delivery_id)
    polled = _text(client.get(f"/dashboard/deliveries/{delivery_id}/row", headers=htmx(token)))
    assert f'<code>{endpoint_id}</code> <span class="muted">(deleted)</span>' in polled
    # still a filter value, though no longer in the endpoint list
    page = _text(client.get(f"/dashboard/deliveries?endpointId={endpoint_id}"))
    assert _rows(page) == [delivery_id]
    assert f'<option value="{endpoint_id}" selected>{endpoint_id} (deleted)</option>' in page


def test_a_long_response_body_is_shown_as_stored_its_first_2_kib(app, client, brand, read_key):
    endpoint_id = _endpoint(app, brand)
    [delivery_id] = _publish(app, brand)
    _attempt(app, endpoint_id, {delivery_id: (None, None, "Connection refused")})
    sign_in(client, read_key)
    page = _text(client.get(f"/dashboard/deliveries/{delivery_id}"))
    assert "no answer" in page and "Connection refused" in page
    assert 'Response body <span class="muted">(first 2 KiB)</span>' in page
    assert 'status-failed">failed' in page


# ---- redeliver ----


def test_redeliver_queues_a_new_delivery_of_the_same_event(app, client, brand, write_key):
    endpoint_id = _endpoint(app, brand)
    [original] = _publish(app, brand)
    _fail(app, endpoint_id, original)
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/deliveries/{original}"))
    assert f'hx-post="/dashboard/deliveries/{original}/redeliver"' in page
    assert ">Redeliver</button>" in page
    response = client.post(f"/dashboard/deliveries/{original}/redeliver", headers=htmx(token))
    assert response.status_code == 202
    fragment = _text(response)
    assert fragment.lstrip().startswith('<div id="delivery-redeliver">')
    new_id = re.search(
        r'Redelivery queued as delivery <a href="/dashboard/deliveries/(whd_[^"]+)"', fragment
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
        assert rows[new_id].endpoint_id == endpoint_id
        assert rows[new_id].status == "pending" and rows[original].status == "failed"
    assert _rows(_text(client.get("/dashboard/deliveries")))[0] == new_id


def test_redeliver_works_as_a_plain_form(app, client, brand, write_key):
    _endpoint(app, brand)
    [original] = _publish(app, brand)
    token = sign_in(client, write_key)
    response = client.post(
        f"/dashboard/deliveries/{original}/redeliver", data={"csrf_token": token}
    )
    # To the new delivery's page: reloading it reads it, and queues nothing more.
    assert response.status_code == 303
    new_id = response.headers["Location"].removeprefix("/dashboard/deliveries/")
    assert new_id.startswith("whd_") and new_id != original
    page = _text(client.get(response.headers["Location"]))
    assert "<html" in page and f"Redelivery queued: this is the new delivery of {original}" in page
    _text(client.get(response.headers["Location"]))
    assert _count_deliveries(app) == 2


def test_redeliver_to_a_disabled_or_deleted_endpoint_is_refused(app, client, brand, write_key):
    endpoint_id = _endpoint(app, brand)
    [original] = _publish(app, brand)
    with app.test_request_context():
        update_endpoint(
            brand_id=brand, endpoint_id=endpoint_id, policy=current_url_policy(), is_active=False
        )
        db.session.commit()
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/deliveries/{original}"))
    assert "This delivery's endpoint is disabled" in page
    response = client.post(f"/dashboard/deliveries/{original}/redeliver", headers=htmx(token))
    assert response.status_code == 404
    assert "re-enable it with update-endpoint first" in _text(response)
    with app.test_request_context():
        delete_endpoint(brand_id=brand, endpoint_id=endpoint_id)
        db.session.commit()
    page = _text(client.get(f"/dashboard/deliveries/{original}"))
    assert "This delivery's endpoint was deleted" in page
    assert f'<code>{endpoint_id}</code> <span class="muted">(deleted)</span>' in page
    response = client.post(f"/dashboard/deliveries/{original}/redeliver", headers=htmx(token))
    assert response.status_code == 404
    assert "The endpoint of this delivery was deleted" in _text(response)
    assert _count_deliveries(app) == 1


def test_read_scope_sees_no_redeliver_and_is_refused(app, client, brand, read_key):
    _endpoint(app, brand)
    [original] = _publish(app, brand)
    token = sign_in(client, read_key)
    page = _text(client.get(f"/dashboard/deliveries/{original}"))
    assert "Redeliver" not in page and "/redeliver" not in page
    response = client.post(f"/dashboard/deliveries/{original}/redeliver", headers=htmx(token))
    assert response.status_code == 403
    assert _count_deliveries(app) == 1


def test_redeliver_without_the_csrf_token_is_refused(app, client, brand, write_key):
    _endpoint(app, brand)
    [original] = _publish(app, brand)
    sign_in(client, write_key)
    response = client.post(
        f"/dashboard/deliveries/{original}/redeliver", headers={"HX-Request": "true"}
    )
    assert response.status_code == 403
    assert "did not come from this site" in _text(response)
    response = client.post(
        f"/dashboard/deliveries/{original}/redeliver", data={"csrf_token": "forged"}
    )
    assert response.status_code == 403
    assert _count_deliveries(app) == 1


def test_another_brands_delivery_is_not_found(app, client, brand, write_key, make_brand):
    other = make_brand("Other Brand")
    other_endpoint = _endpoint(app, other)
    [theirs] = _publish(app, other)
    token = sign_in(client, write_key)
    assert client.get(f"/dashboard/deliveries/{theirs}").status_code == 404
    assert client.get(f"/dashboard/deliveries/{theirs}/progress").status_code == 404
    response = client.post(f"/dashboard/deliveries/{theirs}/redeliver", headers=htmx(token))
    assert response.status_code == 404
    assert _rows(_text(client.get("/dashboard/deliveries"))) == []
    assert _rows(_text(client.get(f"/dashboard/deliveries?endpointId={other_endpoint}"))) == []
    assert _count_deliveries(app) == 1


def test_a_delivery_page_is_under_deliveries_in_the_nav(app, client, brand, read_key):
    _endpoint(app, brand)
    [delivery_id] = _publish(app, brand)
    sign_in(client, read_key)
    page = _text(client.get(f"/dashboard/deliveries/{delivery_id}"))
    assert '<a href="/dashboard/deliveries" aria-current="page">Deliveries</a>' in page


# Last in the module: once the module's worker runs, it would also attempt the other tests'
# deliveries while their tables are being emptied.
def test_a_real_test_ping_turns_delivered_with_what_the_receiver_got(
    app, client, brand, write_key, receiver, webhook_worker
):
    endpoint_id = _endpoint(app, brand, receiver.url)
    receiver.reply_with(Reply(status=200, body=b'{"received": true, "by": "<receiver>"}'))
    token = sign_in(client, write_key)
    sent = client.post(f"/dashboard/endpoints/{endpoint_id}/send-test", headers=htmx(token))
    assert sent.status_code == 202
    delivery_id = re.search(r"(whd_[0-9a-z]+)", _text(sent)).group(1)
    page = _text(client.get(f"/dashboard/deliveries?endpointId={endpoint_id}"))
    polls = re.search(r'hx-get="([^"]+/row\?polls=1)"', _row_tag(page, delivery_id))
    url = polls.group(1) if polls else None  # the worker may already have delivered it
    row = page
    deadline = time.monotonic() + 20
    while url and time.monotonic() < deadline:
        row = _text(client.get(url, headers=htmx(token)))
        next_poll = re.search(r'hx-get="([^"]+/row\?polls=\d+)"', _row_tag(row, delivery_id))
        url = next_poll.group(1) if next_poll else None
        time.sleep(0.2)
    assert 'status-delivered">delivered' in _row(row, delivery_id), webhook_worker.output()[-2000:]
    [received] = receiver.wait_for(1)
    assert received.delivery_id == delivery_id
    page = _text(client.get(f"/dashboard/deliveries/{delivery_id}"))
    assert "Delivery of <code>webhook.test</code>" in page
    assert "Attempt 1" in page and "HTTP 200" in page
    assert "&lt;receiver&gt;" in page  # the response body, escaped
    assert f"X-Service-Signature: {received.headers['X-Service-Signature']}" in page
    assert f"X-Service-Timestamp: {received.headers['X-Service-Timestamp']}" in page
    assert f"X-Service-Delivery: {delivery_id}" in page
    sent_body = json.loads(received.body)
    assert json.dumps(sent_body, indent=2) in html.unescape(page)
