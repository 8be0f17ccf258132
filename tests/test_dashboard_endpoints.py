"""The dashboard's webhook endpoints pages: list and register, the endpoint page's actions, the
scope rules, and verification snippets that really verify (SPEC sections 2-4 and 6, CONTRACT 4,
6 and 7)."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from sqlalchemy import func, select, update

from extensions import db
from models import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent
from models.credentials import SIGNING_SECRET_PREFIX, generate_secret
from models.event_catalog import sample_data
from services.events import publish_event
from services.secret_box import secret_box
from services.signing import delivery_headers, sign
from services.webhook_endpoints import (
    THROUGH_THE_API,
    ChangedBy,
    current_url_policy,
    register_endpoint,
)
from services.webhook_endpoints import update_endpoint as service_update
from tests.dashboard import SIGNING_SECRET, htmx, sign_in
from tests.delivery_states import settle

GROUPS = [
    "campaign",
    "deal",
    "content",
    "placement",
    "escrow",
    "verification",
    "dispute",
    "conversion",
    "webhook",
]


# ---- helpers ----


def _register(app, brand: str, url: str = "http://127.0.0.1:9/hooks", events=None):
    """An endpoint made through the service: (id, signing secret)."""
    with app.test_request_context():
        issued = register_endpoint(
            brand_id=brand,
            url=url,
            events=events or ["deal.completed"],
            policy=current_url_policy(),
        )
        db.session.commit()
        return issued.id, issued.signing_secret


def _publish(app, brand: str, name: str = "deal.completed") -> None:
    with app.test_request_context():
        publish_event(brand_id=brand, name=name, data={"dealId": "deal_x"})
        db.session.commit()


def _endpoint_row(app, endpoint_id: str) -> WebhookEndpoint | None:
    with app.app_context():
        row = db.session.get(WebhookEndpoint, endpoint_id)
        if row is not None:
            db.session.expunge(row)
        return row


def _live_endpoints(app, brand: str) -> int:
    with app.app_context():
        return db.session.scalar(
            select(func.count()).where(
                WebhookEndpoint.brand_id == brand, WebhookEndpoint.deleted_at.is_(None)
            )
        )


def _delivery_statuses(app, endpoint_id: str) -> list[str]:
    with app.app_context():
        return list(
            db.session.scalars(
                select(WebhookDelivery.status).where(WebhookDelivery.endpoint_id == endpoint_id)
            )
        )


def _text(response) -> str:
    """The page's HTML, without the <wbr> marks where a long URL may break (not text)."""
    return response.get_data(as_text=True).replace("<wbr>", "")


def _checked_events(page: str) -> set[str]:
    return set(re.findall(r'name="events" value="([a-z_.]+)" checked', page))


def _snippet(page: str, key: str) -> str:
    match = re.search(rf'<code id="snippet-{key}">(.*?)</code>', page, re.S)
    assert match, f"no {key} snippet on the page"
    return html.unescape(match.group(1))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    return requests.post(url, data=body, headers=headers, timeout=10).status_code


@contextlib.contextmanager
def _serving(command: list[str], port: int, env: dict[str, str], log: Path) -> Iterator[None]:
    """Run a snippet's receiver until it accepts connections on `port`; stop it afterwards."""
    with log.open("wb") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"receiver never listened: {log.read_text()}"
            time.sleep(0.05)
        yield
    finally:
        process.terminate()
        process.wait(10)


def _node() -> str:
    """node is installed here and in CI: a missing one fails the test instead of skipping it."""
    node = shutil.which("node") or "/usr/bin/node"
    assert Path(node).exists(), "node is required for the Node.js snippet test"
    return node


# ---- the list and registering ----


def test_list_shows_each_endpoints_state_and_never_a_secret(app, client, brand, read_key):
    healthy, healthy_secret = _register(app, brand, "http://127.0.0.1:9/healthy")
    failing, _ = _register(
        app,
        brand,
        "http://127.0.0.1:9/failing",
        ["deal.completed", "escrow.held", "dispute.resolved"],
    )
    disabled, _ = _register(app, brand, "http://127.0.0.1:9/disabled")
    with app.test_request_context():
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == failing)
            .values(consecutive_failures=4)
        )
        service_update(
            brand_id=brand,
            endpoint_id=disabled,
            policy=current_url_policy(),
            is_active=False,
            changed_by=ChangedBy(THROUGH_THE_API),
        )
        db.session.commit()
    sign_in(client, read_key)
    page = _text(client.get("/dashboard/endpoints"))
    rows = {
        endpoint_id: re.search(rf'<tr id="endpoint-{endpoint_id}">(.*?)</tr>', page, re.S).group(1)
        for endpoint_id in (healthy, failing, disabled)
    }
    assert "http://127.0.0.1:9/healthy" in rows[healthy]
    assert "status-active" in rows[healthy]
    assert f'href="/dashboard/endpoints/{healthy}"' in rows[healthy]
    assert "status-failing" in rows[failing]
    assert '<td data-label="Failures in a row">4</td>' in rows[failing]
    assert "3 events" in rows[failing]
    assert "status-disabled" in rows[disabled]
    assert "Disabled through the API" in rows[disabled]
    assert "update-endpoint" not in rows[disabled]  # a route's name means nothing here
    assert "since <time" in rows[disabled]
    assert healthy_secret not in page
    assert not SIGNING_SECRET.search(page)


def test_empty_list_says_what_to_do(client, brand, write_key, read_key, app):
    sign_in(client, write_key)
    page = _text(client.get("/dashboard/endpoints"))
    assert "No endpoints yet. Register your receiver's URL below" in page
    reader = app.test_client()
    sign_in(reader, read_key)
    page = _text(reader.get("/dashboard/endpoints"))
    assert "Ask someone with a write key to register one" in page


def test_register_form_groups_events_by_resource_with_the_defaults_ticked(client, brand, write_key):
    sign_in(client, write_key)
    page = _text(client.get("/dashboard/endpoints"))
    assert "Register an endpoint" in page
    assert re.findall(r"<legend>([a-z]+)</legend>", page) == GROUPS
    assert _checked_events(page) == {"deal.completed", "conversion.recorded"}
    assert page.count('name="events"') == 24  # SPEC's 22 and the 2 operational ones (CONTRACT 8.5)
    assert page.count('data-check="all"') == len(GROUPS)
    assert 'aria-label="Select every escrow event"' in page
    assert '<label for="endpoint-url">Endpoint URL</label>' in page


def test_register_shows_the_signing_secret_once_and_updates_the_list(app, client, brand, write_key):
    token = sign_in(client, write_key)
    response = client.post(
        "/dashboard/endpoints",
        data={"url": "http://127.0.0.1:8123/hooks", "events": ["deal.completed", "escrow.held"]},
        headers=htmx(token),
    )
    assert response.status_code == 201
    fragment = _text(response)
    assert "<html" not in fragment
    secrets_shown = SIGNING_SECRET.findall(fragment)
    assert len(set(secrets_shown)) == 1
    secret = secrets_shown[0]
    assert f'data-copy="{secret}"' in fragment
    assert "Copy this signing secret now." in fragment
    assert "shown this once" in fragment
    assert 'id="endpoint-rows" hx-swap-oob="true"' in fragment
    assert "http://127.0.0.1:8123/hooks" in fragment.split('id="endpoint-rows"')[1]
    assert _live_endpoints(app, brand) == 1
    # the API sees the same endpoint, and the secret signs its deliveries
    api = client.get(
        f"/api/v1/brand/{brand}/webhook/fetch-endpoints", headers={"X-Api-Key": write_key}
    ).get_json()
    [listed] = api["data"]["endpoints"]
    assert listed["url"] == "http://127.0.0.1:8123/hooks"
    assert listed["events"] == ["deal.completed", "escrow.held"]
    # never again: not on the list, not on the endpoint's page
    assert secret not in _text(client.get("/dashboard/endpoints"))
    detail = _text(client.get(f"/dashboard/endpoints/{listed['id']}"))
    assert secret not in detail
    assert not SIGNING_SECRET.search(detail)


def test_register_works_as_a_plain_form(app, client, brand, write_key):
    token = sign_in(client, write_key)
    response = client.post(
        "/dashboard/endpoints",
        data={
            "url": "http://localhost:8000/hooks",
            "events": ["deal.completed"],
            "csrf_token": token,
        },
    )
    assert response.status_code == 303
    assert response.headers["Location"] == "/dashboard/endpoints#endpoint-register"
    page = _text(client.get("/dashboard/endpoints"))
    assert "<html" in page
    assert "Endpoint registered" in page
    [secret] = set(SIGNING_SECRET.findall(page))
    assert page.count('id="endpoint-rows"') == 1
    assert "http://localhost:8000/hooks" in page.split('id="endpoint-rows"')[1]
    # A reload shows the list and the form again: no second endpoint, no secret.
    again = _text(client.get("/dashboard/endpoints"))
    assert secret not in again and "Register an endpoint" in again
    assert _live_endpoints(app, brand) == 1


def test_register_keeps_a_description_and_says_which_event_names_were_dropped(
    app, client, brand, write_key
):
    """CONTRACT 10: the answer names what registration dropped (a form sends only known names,
    but a crafted or stale one may not), and the description tells endpoints apart."""
    token = sign_in(client, write_key)
    response = client.post(
        "/dashboard/endpoints",
        data={
            "url": "http://127.0.0.1:8123/hooks",
            "description": "Orders service, staging",
            "events": ["deal.completed", "deal.finished"],
        },
        headers=htmx(token),
    )
    assert response.status_code == 201
    fragment = _text(response)
    notice = fragment.split("data-dropped-events>")[1].split("</p>")[0]
    assert "<code>deal.finished</code>" in notice and "deal.completed" not in notice
    assert "Orders service, staging" in fragment.split('id="endpoint-rows"')[1]
    [endpoint_id] = re.findall(r'id="endpoint-(whe_\w+)"', fragment)
    assert _endpoint_row(app, endpoint_id).description == "Orders service, staging"
    assert "Orders service, staging" in _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "Orders service, staging" in _text(client.get("/dashboard/deliveries"))
    assert "Orders service, staging" in _text(client.get("/dashboard/"))


def test_edit_changes_and_clears_the_description(app, client, brand, write_key):
    endpoint_id, _ = _register(app, brand)
    token = sign_in(client, write_key)
    fields = {"url": "http://127.0.0.1:9/hooks", "events": ["deal.completed"]}
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}",
        data=fields | {"description": "Billing"},
        headers=htmx(token),
    )
    assert response.status_code == 200
    assert "Billing" in _text(response).split('id="endpoint-summary"')[1]
    assert _endpoint_row(app, endpoint_id).description == "Billing"
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}",
        data=fields | {"description": "bad\x07bell"},
        headers=htmx(token),
    )
    assert response.status_code == 422
    assert "Must not contain control characters" in _text(response)
    assert _endpoint_row(app, endpoint_id).description == "Billing"
    client.post(
        f"/dashboard/endpoints/{endpoint_id}",
        data=fields | {"description": ""},
        headers=htmx(token),
    )
    assert _endpoint_row(app, endpoint_id).description is None


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        (
            {"url": "https://10.0.0.7/hooks", "events": ["deal.completed"]},
            "url",
            "10.0.0.7 is a loopback, private, link-local, multicast or reserved address",
        ),
        (
            {"url": "https://169.254.169.254/latest", "events": ["deal.completed"]},
            "url",
            "webhooks are delivered only to public addresses",
        ),
        (
            {"url": "http://hooks.example.com/x", "events": ["deal.completed"]},
            "url",
            "Must use https://; http:// is accepted only for localhost and 127.0.0.1",
        ),
        (
            {"url": "https://me:pw@hooks.example.com/x", "events": ["deal.completed"]},
            "url",
            "Must not contain credentials (user:password@)",
        ),
        ({"url": "", "events": ["deal.completed"]}, "url", "Length must be between 1 and 2048."),
        ({"url": "http://127.0.0.1:9/hooks"}, "events", "Give at least one of: campaign.published"),
    ],
)
def test_register_refuses_bad_input_with_the_fields_message_and_stores_nothing(
    app, client, brand, write_key, fields, field, message
):
    token = sign_in(client, write_key)
    response = client.post("/dashboard/endpoints", data=fields, headers=htmx(token))
    assert response.status_code == 422
    fragment = _text(response)
    assert html.escape(message, quote=False) in fragment
    assert 'id="endpoint-form-panel"' in fragment
    assert f'value="{html.escape(fields["url"])}"' in fragment  # what was typed stays
    assert _checked_events(fragment) == set(fields.get("events", []))
    if field == "url":
        assert 'aria-invalid="true"' in fragment
    assert not SIGNING_SECRET.search(fragment)
    assert _live_endpoints(app, brand) == 0


# ---- scope, CSRF, other brands ----


def _write_actions(endpoint_id: str) -> list[tuple[str, dict]]:
    return [
        ("/dashboard/endpoints", {"url": "http://127.0.0.1:9/x", "events": ["deal.completed"]}),
        (
            f"/dashboard/endpoints/{endpoint_id}",
            {"url": "http://127.0.0.1:9/y", "events": ["deal.completed"]},
        ),
        (f"/dashboard/endpoints/{endpoint_id}/disable", {}),
        (f"/dashboard/endpoints/{endpoint_id}/enable", {}),
        (f"/dashboard/endpoints/{endpoint_id}/rotate-secret", {}),
        (f"/dashboard/endpoints/{endpoint_id}/delete", {}),
    ]


def test_read_scope_sees_everything_changes_nothing_but_can_send_a_test(
    app, client, brand, read_key
):
    endpoint_id, secret = _register(app, brand)
    _publish(app, brand)
    token = sign_in(client, read_key)
    listing = _text(client.get("/dashboard/endpoints"))
    assert "http://127.0.0.1:9/hooks" in listing
    assert "Register an endpoint" not in listing
    assert 'name="events"' not in listing
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "Verify signatures" in page
    assert "Recent deliveries" in page
    assert "Send test" in page
    for control in ["Edit endpoint", "Rotate secret", "Delete endpoint", ">Disable<", "hx-confirm"]:
        assert control not in page, control
    for path, data in _write_actions(endpoint_id):
        response = client.post(path, data=data, headers=htmx(token))
        assert response.status_code == 403, path
        assert "Write scope required" in _text(response)
    row = _endpoint_row(app, endpoint_id)
    assert (row.url, row.deleted_at, row.disabled_at) == ("http://127.0.0.1:9/hooks", None, None)
    response = client.post(f"/dashboard/endpoints/{endpoint_id}/send-test", headers=htmx(token))
    assert response.status_code == 202
    assert "Test ping queued" in _text(response)
    assert secret not in page


def test_an_action_without_the_csrf_token_is_refused(app, client, brand, write_key):
    endpoint_id, _ = _register(app, brand)
    sign_in(client, write_key)
    for headers in [{"HX-Request": "true"}, htmx("forged")]:
        response = client.post(f"/dashboard/endpoints/{endpoint_id}/delete", headers=headers)
        assert response.status_code == 403
        assert "did not come from this site" in _text(response)
    assert _live_endpoints(app, brand) == 1


def test_another_brands_endpoint_is_not_found(app, client, brand, write_key, make_brand):
    other = make_brand("Other Brand")
    theirs, _ = _register(app, other, "http://127.0.0.1:9/theirs")
    token = sign_in(client, write_key)
    assert client.get(f"/dashboard/endpoints/{theirs}").status_code == 404
    assert (
        client.get(f"/dashboard/endpoints/{theirs}/deliveries", headers=htmx(token)).status_code
        == 404
    )
    for path, data in [
        *_write_actions(theirs)[1:],
        (f"/dashboard/endpoints/{theirs}/send-test", {}),
    ]:
        response = client.post(path, data=data, headers=htmx(token))
        assert response.status_code == 404, path
        assert "No webhook endpoint with id" in _text(response)
    row = _endpoint_row(app, theirs)
    assert (row.url, row.deleted_at, row.disabled_at) == ("http://127.0.0.1:9/theirs", None, None)
    assert _delivery_statuses(app, theirs) == []
    assert "theirs" not in _text(client.get("/dashboard/endpoints"))


# ---- the endpoint's page and its actions ----


def test_endpoint_page_shows_its_fields_deliveries_and_links(app, client, brand, read_key):
    endpoint_id, _ = _register(app, brand, events=["deal.completed", "escrow.released"])
    _publish(app, brand)
    _publish(app, brand, "escrow.released")
    _publish(app, brand, "campaign.published")  # not subscribed: not listed
    sign_in(client, read_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert endpoint_id in page
    assert "http://127.0.0.1:9/hooks" in page
    assert '<code class="event-name">escrow.released</code>' in page
    deliveries = page.split('id="endpoint-deliveries"')[1].split("</table>")[0]
    assert deliveries.count("<tr id=") == 2
    assert "status-waiting" in deliveries
    assert "campaign.published" not in deliveries
    assert re.search(r'href="/dashboard/deliveries/whd_[^"]+">Details</a>', deliveries)
    assert f'href="/dashboard/deliveries?endpointId={endpoint_id}"' in page
    # a pending delivery keeps the region asking until it settles
    assert f'hx-get="/dashboard/endpoints/{endpoint_id}/deliveries" hx-trigger="every 3s"' in page


def test_recent_deliveries_region_stops_polling_once_settled(app, client, brand, read_key):
    endpoint_id, _ = _register(app, brand)
    _publish(app, brand)
    token = sign_in(client, read_key)
    with app.app_context():
        db.session.execute(update(WebhookDelivery).values(status="delivered", http_status=200))
        db.session.commit()
    response = client.get(f"/dashboard/endpoints/{endpoint_id}/deliveries", headers=htmx(token))
    assert response.status_code == 200
    fragment = _text(response)
    assert 'id="endpoint-deliveries"' in fragment and "<html" not in fragment
    assert "status-delivered" in fragment
    assert "hx-trigger" not in fragment
    # without htmx it is the full log of this endpoint
    plain = client.get(f"/dashboard/endpoints/{endpoint_id}/deliveries")
    assert plain.status_code == 303
    assert plain.headers["Location"] == f"/dashboard/deliveries?endpointId={endpoint_id}"


def test_endpoint_without_deliveries_says_what_to_do(app, client, brand, read_key):
    endpoint_id, _ = _register(app, brand)
    sign_in(client, read_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "No deliveries yet. Send a test to see one here" in page


def test_edit_changes_url_and_events(app, client, brand, write_key):
    endpoint_id, _ = _register(app, brand)
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert _checked_events(page.split('id="endpoint-edit-panel"')[1]) == {"deal.completed"}
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}",
        data={
            "url": "http://localhost:7000/v2/hooks",
            "events": ["escrow.held", "escrow.released"],
        },
        headers=htmx(token),
    )
    assert response.status_code == 200
    fragment = _text(response)
    assert "Endpoint updated." in fragment
    assert 'id="endpoint-summary" hx-swap-oob="true"' in fragment
    assert 'id="endpoint-verify" hx-swap-oob="true"' in fragment
    assert "http://localhost:7000/v2/hooks" in fragment.split('id="endpoint-summary"')[1]
    assert '"/v2/hooks"' in _snippet(fragment, "python")  # the snippets follow the new URL
    row = _endpoint_row(app, endpoint_id)
    assert row.url == "http://localhost:7000/v2/hooks"
    assert row.events == ["escrow.held", "escrow.released"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"url": "https://192.168.1.20/hooks", "events": ["escrow.held"]},
            "192.168.1.20 is a loopback",
        ),
        ({"url": "http://127.0.0.1:9/other"}, "Give at least one of: campaign.published"),
        ({"url": "x" * 2049, "events": ["escrow.held"]}, "Length must be between 1 and 2048."),
    ],
)
def test_edit_refuses_bad_input_and_changes_nothing(app, client, brand, write_key, fields, message):
    endpoint_id, _ = _register(app, brand)
    token = sign_in(client, write_key)
    response = client.post(f"/dashboard/endpoints/{endpoint_id}", data=fields, headers=htmx(token))
    assert response.status_code == 422
    fragment = _text(response)
    assert message in fragment
    assert 'id="endpoint-edit-panel"' in fragment
    assert "Endpoint updated." not in fragment
    row = _endpoint_row(app, endpoint_id)
    assert (row.url, row.events) == ("http://127.0.0.1:9/hooks", ["deal.completed"])


def test_disable_fails_pending_deliveries_and_re_enable_clears_the_failures(
    app, client, brand, write_key
):
    endpoint_id, _ = _register(app, brand)
    _publish(app, brand)
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "its pending deliveries end as failed" in page  # the confirm says so
    response = client.post(f"/dashboard/endpoints/{endpoint_id}/disable", headers=htmx(token))
    assert response.status_code == 200
    fragment = _text(response)
    assert "Endpoint disabled; its pending deliveries ended as failed." in fragment
    assert "status-disabled" in fragment
    # What the person did, in their words: where, and with which key (its name and prefix).
    said = f"Disabled from the dashboard by key “test key” ({write_key[:12]}…)"
    assert said in fragment
    assert "update-endpoint" not in fragment
    assert ">Re-enable</button>" in fragment
    assert "Send test</button>" not in fragment
    assert 'id="endpoint-deliveries" hx-swap-oob="true"' in fragment
    assert "status-failed" in fragment.split('id="endpoint-deliveries"')[1]
    assert _delivery_statuses(app, endpoint_id) == ["failed"]
    with app.app_context():
        last_error = db.session.scalar(
            select(WebhookDelivery.last_error).where(WebhookDelivery.endpoint_id == endpoint_id)
        )
    assert (
        last_error == f"Endpoint disabled from the dashboard by key “test key” ({write_key[:12]}…)"
    )
    with app.app_context():
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_id)
            .values(consecutive_failures=15)
        )
        db.session.commit()
    response = client.post(f"/dashboard/endpoints/{endpoint_id}/enable", headers=htmx(token))
    assert response.status_code == 200
    fragment = _text(response)
    assert "Endpoint re-enabled; its failure count starts again at zero." in fragment
    assert "status-active" in fragment
    assert ">Disable</button>" in fragment
    row = _endpoint_row(app, endpoint_id)
    assert (row.disabled_at, row.consecutive_failures) == (None, 0)


def test_rotate_secret_shows_the_new_secret_once(app, client, brand, write_key):
    endpoint_id, old_secret = _register(app, brand)
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "without one it stops verifying at once" in page  # the dialog says so first
    response = client.post(f"/dashboard/endpoints/{endpoint_id}/rotate-secret", headers=htmx(token))
    assert response.status_code == 200
    fragment = _text(response)
    assert "<html" not in fragment
    assert 'id="endpoint-secret-panel"' in fragment
    [new_secret] = set(SIGNING_SECRET.findall(fragment))
    assert new_secret != old_secret
    assert f'data-copy="{new_secret}"' in fragment
    assert "shown this once" in fragment
    assert "The old secret stopped working at once" in fragment
    later = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert new_secret not in later and old_secret not in later
    # deliveries are now signed with the new one
    with app.app_context():
        from services.secret_box import secret_box

        stored = db.session.get(WebhookEndpoint, endpoint_id).secret_ciphertext
        assert secret_box().decrypt(stored) == new_secret


def test_rotate_secret_without_js_shows_it_on_the_page(app, client, brand, write_key):
    endpoint_id, _ = _register(app, brand)
    token = sign_in(client, write_key)
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/rotate-secret", data={"csrf_token": token}
    )
    assert response.status_code == 303
    assert response.headers["Location"] == (
        f"/dashboard/endpoints/{endpoint_id}#endpoint-secret-panel"
    )
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "<html" in page and "Verify signatures" in page
    [secret] = set(SIGNING_SECRET.findall(page))
    with app.test_request_context():
        assert secret_box().decrypt(_endpoint_row(app, endpoint_id).secret_ciphertext) == secret
    # Shown once: a reload reads the page without it, and rotates nothing.
    again = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert not SIGNING_SECRET.search(again)
    with app.test_request_context():
        assert secret_box().decrypt(_endpoint_row(app, endpoint_id).secret_ciphertext) == secret


def test_rotate_with_an_overlap_keeps_the_old_secret_signing_until_shown(
    app, client, brand, write_key
):
    """The overlap chosen on the page reaches the service, with JavaScript (the form's value
    in htmx's post) and without (through the confirmation page's hidden field)."""
    endpoint_id, old_secret = _register(app, brand)
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert '<select id="overlap-seconds" name="overlapSeconds">' in page
    assert '<option value="86400">24 hours</option>' in page

    # Without JavaScript: the GET form asks first, and carries the choice to the POST.
    question = _text(
        client.get(f"/dashboard/endpoints/{endpoint_id}/rotate-secret?overlapSeconds=86400")
    )
    assert "with an overlap of 24 hours?" in question
    assert '<input type="hidden" name="overlapSeconds" value="86400">' in question
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/rotate-secret",
        data={"csrf_token": token, "overlapSeconds": "86400"},
    )
    assert response.status_code == 303
    shown = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    [new_secret] = set(SIGNING_SECRET.findall(shown))
    assert "signed with both this secret and the previous one" in shown
    with app.test_request_context():
        row = _endpoint_row(app, endpoint_id)
        assert secret_box().decrypt(row.previous_secret_ciphertext) == old_secret
        assert secret_box().decrypt(row.secret_ciphertext) == new_secret
        until = row.previous_secret_expires_at
    later = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "The previous secret also signs every delivery until" in later
    assert until.strftime("%Y-%m-%d %H:%M:%S") in later

    # With htmx, no overlap: the old one stops at once, and the page says nothing of it.
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/rotate-secret",
        headers=htmx(token),
        data={"overlapSeconds": "0"},
    )
    assert "The old secret stopped working at once" in _text(response)
    with app.test_request_context():
        assert _endpoint_row(app, endpoint_id).previous_secret_ciphertext is None
    assert "previous secret also signs" not in _text(
        client.get(f"/dashboard/endpoints/{endpoint_id}")
    )


def test_a_bad_overlap_from_the_page_changes_nothing(app, client, brand, write_key):
    endpoint_id, _ = _register(app, brand)
    token = sign_in(client, write_key)
    with app.test_request_context():
        before = _endpoint_row(app, endpoint_id).secret_ciphertext
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/rotate-secret",
        headers=htmx(token),
        data={"overlapSeconds": "9999999"},
    )
    assert response.status_code in (400, 422)
    with app.test_request_context():
        assert _endpoint_row(app, endpoint_id).secret_ciphertext == before


def test_destructive_endpoint_actions_ask_on_a_page_without_javascript(
    app, client, brand, write_key
):
    endpoint_id, _ = _register(app, brand)
    sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    for action, title, button in [
        ("delete", "Delete this endpoint?", "Delete endpoint"),
        ("rotate-secret", "Rotate the signing secret?", "Rotate secret"),
        ("disable", "Disable this endpoint?", "Disable"),
    ]:
        url = f"/dashboard/endpoints/{endpoint_id}/{action}"
        # The button is a GET form to the question; htmx posts after its own dialog.
        assert f'<form method="get" action="{url}"\n' in page, action
        assert f'hx-post="{url}"' in page, action
        question = _text(client.get(url))
        assert f'<h1 id="confirm-title">{title}</h1>' in question
        assert f'<form method="post" action="{url}"' in question
        assert f'<button type="submit" class="button button-danger">{button}</button>' in question
        assert f'href="/dashboard/endpoints/{endpoint_id}">Cancel</a>' in question
    row = _endpoint_row(app, endpoint_id)
    assert (row.deleted_at, row.disabled_at) == (None, None)  # asking changed nothing


def test_every_plain_form_post_answers_with_a_redirect_to_a_page(app, client, brand, write_key):
    """Without JavaScript a reload of what a POST answered must never repeat it."""
    endpoint_id, _ = _register(app, brand)
    token = sign_in(client, write_key)
    fields = {"url": "http://127.0.0.1:9/hooks", "events": ["deal.completed"]}
    for path, data in [
        ("/dashboard/endpoints", fields),
        (f"/dashboard/endpoints/{endpoint_id}", fields),
        (f"/dashboard/endpoints/{endpoint_id}/send-test", {}),
        (f"/dashboard/endpoints/{endpoint_id}/disable", {}),
        (f"/dashboard/endpoints/{endpoint_id}/enable", {}),
        (f"/dashboard/endpoints/{endpoint_id}/rotate-secret", {}),
        (f"/dashboard/endpoints/{endpoint_id}/delete", {}),
    ]:
        response = client.post(path, data=data | {"csrf_token": token})
        assert response.status_code == 303, path
        target = response.headers["Location"]
        assert client.get(target).status_code == 200, (path, target)


def test_delete_returns_to_the_list_and_the_endpoint_is_gone(app, client, brand, write_key):
    endpoint_id, _ = _register(app, brand)
    keep, _ = _register(app, brand, "http://127.0.0.1:9/keep")
    _publish(app, brand)
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert re.search(r'hx-confirm="Delete the endpoint [^"]*pending deliveries end as failed', page)
    response = client.post(f"/dashboard/endpoints/{endpoint_id}/delete", headers=htmx(token))
    assert response.status_code == 200
    assert response.headers["HX-Redirect"] == "/dashboard/endpoints"
    listing = _text(client.get("/dashboard/endpoints"))
    assert "deleted; its pending deliveries ended as failed" in listing
    assert f'id="endpoint-{endpoint_id}"' not in listing
    assert f'id="endpoint-{keep}"' in listing
    assert client.get(f"/dashboard/endpoints/{endpoint_id}").status_code == 404
    assert _delivery_statuses(app, endpoint_id) == ["failed"]
    assert _delivery_statuses(app, keep) == ["pending"]
    # and as a plain form
    response = client.post(f"/dashboard/endpoints/{keep}/delete", data={"csrf_token": token})
    assert response.status_code == 303
    assert response.headers["Location"] == "/dashboard/endpoints"
    assert _live_endpoints(app, brand) == 0


def test_send_test_queues_a_ping_and_links_its_delivery(app, client, brand, write_key):
    endpoint_id, _ = _register(app, brand)
    token = sign_in(client, write_key)
    response = client.post(f"/dashboard/endpoints/{endpoint_id}/send-test", headers=htmx(token))
    assert response.status_code == 202
    fragment = _text(response)
    delivery_id = re.search(
        r"Test ping queued as delivery <a href=\"/dashboard/deliveries/(whd_\w+)\"", fragment
    ).group(1)
    assert 'id="endpoint-deliveries" hx-swap-oob="true"' in fragment
    assert f'<tr id="delivery-{delivery_id}">' in fragment
    assert "webhook.test" in fragment
    assert "hx-trigger" in fragment.split('id="endpoint-deliveries"')[1]
    with app.app_context():
        delivery = db.session.get(WebhookDelivery, delivery_id)
        assert (delivery.endpoint_id, delivery.event_name) == (endpoint_id, "webhook.test")
    # As a plain form: back to the endpoint's page, which says so; a reload sends nothing.
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/send-test", data={"csrf_token": token}
    )
    assert response.status_code == 303
    assert response.headers["Location"] == f"/dashboard/endpoints/{endpoint_id}"
    page = _text(client.get(response.headers["Location"]))
    assert "Test ping queued as delivery whd_" in page
    client.get(response.headers["Location"])
    assert _delivery_statuses(app, endpoint_id) == ["pending", "pending"]


def test_send_test_on_a_disabled_endpoint_is_not_found(app, client, brand, write_key):
    endpoint_id, _ = _register(app, brand)
    with app.test_request_context():
        service_update(
            brand_id=brand, endpoint_id=endpoint_id, policy=current_url_policy(), is_active=False
        )
        db.session.commit()
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "Send test</button>" not in page
    assert "A disabled endpoint receives nothing, test pings included." in page
    response = client.post(f"/dashboard/endpoints/{endpoint_id}/send-test", headers=htmx(token))
    assert response.status_code == 404
    assert "is disabled; re-enable it" in _text(response)
    assert _delivery_statuses(app, endpoint_id) == []


def test_send_example_publishes_the_catalogues_sample_to_this_endpoint_alone(
    app, client, brand, write_key
):
    endpoint_id, _ = _register(app, brand, events=["conversion.recorded"])
    other_id, _ = _register(app, brand, "http://127.0.0.1:9/other", ["deal.completed"])
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "Send an example event" in page
    assert '<option value="conversion.recorded" selected>' in page  # what it subscribes to

    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/send-example",
        data={"eventName": "deal.completed"},
        headers=htmx(token),
    )
    assert response.status_code == 202
    fragment = _text(response)
    delivery_id = re.search(
        r"queued as delivery <a href=\"/dashboard/deliveries/(whd_\w+)\"", fragment
    )[1]
    # The panels it changed come with it: the deliveries and the health figures.
    assert 'id="endpoint-deliveries" hx-swap-oob="true"' in fragment
    assert (
        'id="endpoint-health" aria-labelledby="endpoint-health-title" hx-swap-oob="true"'
        in fragment
    )
    assert "1 waiting · 0 retrying · 0 delivered · 0 failed" in fragment
    with app.app_context():
        delivery = db.session.get(WebhookDelivery, delivery_id)
        assert (delivery.endpoint_id, delivery.event_name) == (endpoint_id, "deal.completed")
        body = json.loads(db.session.get(WebhookEvent, delivery.event_id).body)
        assert body["data"] == sample_data("deal.completed")
    assert _delivery_statuses(app, other_id) == []  # subscribed, but not the one chosen

    # As a plain form: back to the page, which says so.
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/send-example",
        data={"eventName": "escrow.released", "csrf_token": token},
    )
    assert response.status_code == 303
    assert "Example escrow.released queued as delivery whd_" in _text(
        client.get(response.headers["Location"])
    )


def test_send_example_refuses_what_is_no_event_a_read_key_and_a_disabled_endpoint(
    app, client, brand, write_key, read_key
):
    endpoint_id, _ = _register(app, brand)
    token = sign_in(client, write_key)
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/send-example",
        data={"eventName": "deal.finished"},
        headers=htmx(token),
    )
    assert response.status_code == 422
    assert "Not an event: choose one of the list." in _text(response)

    reader = app.test_client()
    reader_token = sign_in(reader, read_key)
    assert "Send an example event" not in _text(reader.get(f"/dashboard/endpoints/{endpoint_id}"))
    response = reader.post(
        f"/dashboard/endpoints/{endpoint_id}/send-example",
        data={"eventName": "deal.completed"},
        headers=htmx(reader_token),
    )
    assert response.status_code == 403

    with app.test_request_context():
        service_update(
            brand_id=brand, endpoint_id=endpoint_id, policy=current_url_policy(), is_active=False
        )
        db.session.commit()
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/send-example",
        data={"eventName": "deal.completed"},
        headers=htmx(token),
    )
    assert response.status_code == 404
    assert _delivery_statuses(app, endpoint_id) == []


def test_the_deliveries_poll_brings_the_health_figures_with_it(app, client, brand, read_key):
    endpoint_id, _ = _register(app, brand)
    _publish(app, brand)
    token = sign_in(client, read_key)
    response = client.get(f"/dashboard/endpoints/{endpoint_id}/deliveries", headers=htmx(token))
    fragment = _text(response)
    assert fragment.lstrip().startswith('<div id="endpoint-deliveries"')
    assert (
        'id="endpoint-health" aria-labelledby="endpoint-health-title" hx-swap-oob="true"'
        in fragment
    )
    assert "1 waiting · 0 retrying · 0 delivered · 0 failed" in fragment


# ---- the verification snippets, run for real ----


def _signed(
    secret: str, body: bytes, timestamp: int | None = None, previous: str | None = None
) -> dict[str, str]:
    """Headers exactly as the worker sends them (services.signing); with `previous`, as during
    a rotation's overlap."""
    return delivery_headers(
        secret=secret,
        previous_secret=previous,
        timestamp=int(time.time()) if timestamp is None else timestamp,
        raw_body=body,
        event_name="deal.completed",
        event_id="evt_snippet",
        delivery_id="whd_snippet_test",
    )


def _event_body(brand: str) -> bytes:
    body = {"id": "evt_snippet", "type": "deal.completed", "brandId": brand, "data": {"x": "é"}}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def _endpoint_page(app, client, brand, read_key, url: str) -> tuple[str, str, str]:
    endpoint_id, secret = _register(app, brand, url)
    sign_in(client, read_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert secret not in page
    return endpoint_id, secret, page


def _check_receiver(url: str, secret: str, brand: str, signature_header: str) -> None:
    """A receiver snippet accepts what the service signs, with this secret alone or beside
    another during a rotation's overlap, and refuses every forgery."""
    body = _event_body(brand)
    other = "whsec_" + "x" * 40
    assert _post(url, body, _signed(secret, body)) == 200
    assert _post(url, body, _signed(other, body, previous=secret)) == 200  # not deployed yet
    assert _post(url, body, _signed(secret, body, previous=other)) == 200  # deployed already
    tampered = body.replace(b'"x"', b'"y"')
    assert _post(url, tampered, _signed(secret, body)) == 400
    stale = int(time.time()) - 6 * 60
    assert _post(url, body, _signed(secret, body, stale)) == 400
    assert _post(url, body, _signed(other, body)) == 400
    assert _post(url, body, _signed(other, body, previous="whsec_" + "y" * 40)) == 400
    assert _post(url, body, {"Content-Type": "application/json"}) == 400
    headers = _signed(secret, body)
    headers[signature_header] = headers[signature_header][:-2] + "zz"
    assert _post(url, body, headers) == 400
    assert _post(url.rsplit("/", 1)[0] + "/elsewhere", body, _signed(secret, body)) == 404


def _run_shell_snippet(snippet: str, secret: str, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["bash", "-e", "-c", snippet],
        cwd=cwd,
        env={"PATH": os.environ["PATH"], "WEBHOOK_SECRET": secret},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


SNIPPET_LABELS = {
    "python": "Python",
    "node": "Node.js",
    "standard": "Standard Webhooks (Python)",
}


def _snippet_command(language: str, script_dir: Path, code: str) -> list[str]:
    script = script_dir / ("receiver.js" if language == "node" else "receiver.py")
    script.write_text(code)
    return [_node(), str(script)] if language == "node" else [sys.executable, str(script)]


@pytest.mark.parametrize("language", list(SNIPPET_LABELS))
def test_receiver_snippets_accept_signed_deliveries_and_refuse_forgeries(
    app, client, brand, read_key, tmp_path, language
):
    port = _free_port()
    url = f"http://127.0.0.1:{port}/brand-hooks"
    endpoint_id, secret, page = _endpoint_page(app, client, brand, read_key, url)
    code = _snippet(page, language)
    assert endpoint_id in code and url in code
    assert "WEBHOOK_SECRET" in code and secret not in code
    label = re.escape(SNIPPET_LABELS[language])
    copied = re.search(rf'data-copy="([^"]*)" aria-label="Copy the {label} snippet"', page)
    assert html.unescape(copied.group(1)) == code
    command = _snippet_command(language, tmp_path, code)
    # no PORT: the snippet listens on the port of the endpoint's URL, filled in
    env = {"PATH": os.environ["PATH"], "WEBHOOK_SECRET": secret}
    log = tmp_path / "receiver.log"
    signature_header = "webhook-signature" if language == "standard" else "X-Service-Signature"
    with _serving(command, port, env, log):
        _check_receiver(url, secret, brand, signature_header)
        if language != "standard":  # the shell snippet signs our X-Service-Signature only
            # the curl + openssl snippet signs as the service does: this receiver accepts it
            result = _run_shell_snippet(_snippet(page, "shell"), secret, tmp_path)
            assert result.stdout.strip().endswith("HTTP 200"), result.stdout + result.stderr
    output = log.read_text()
    # accepted three times: one secret, then either side of a rotation's overlap; the Standard
    # Webhooks receiver prints webhook-id, the event id (CONTRACT 12.1), the others both ids
    accepted = "deal.completed evt_snippet" + (
        "\n" if language == "standard" else " whd_snippet_test"
    )
    assert output.count(accepted) == 3
    if language != "standard":
        assert "webhook.test evt_manual_check whd_manual_check" in output


def test_an_endpoint_with_an_older_secret_gets_a_snippet_that_verifies_it(
    app, client, brand, write_key, tmp_path
):
    """An endpoint registered before secrets were base64 (CONTRACT 12.1): its page says so, and
    its Standard Webhooks snippet gives the library the secret as bytes, which verifies what the
    service signs with it. Once rotated, the page's snippet is the library's usual call."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/hooks"
    endpoint_id, new_secret = _register(app, brand, url)
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert 'Webhook(os.environ["WEBHOOK_SECRET"])' in _snippet(page, "standard")
    assert "issued before secrets were base64" not in page

    older = generate_secret(SIGNING_SECRET_PREFIX)  # as register minted them before
    with app.app_context():
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == endpoint_id)
            .values(secret_ciphertext=secret_box().encrypt(older))
        )
        db.session.commit()
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "signing secret was issued before secrets were base64" in page
    code = _snippet(page, "standard")
    assert 'Webhook(os.environ["WEBHOOK_SECRET"].encode())' in code
    env = {"PATH": os.environ["PATH"], "WEBHOOK_SECRET": older}
    with _serving(_snippet_command("standard", tmp_path, code), port, env, tmp_path / "log"):
        _check_receiver(url, older, brand, "webhook-signature")

    response = client.post(f"/dashboard/endpoints/{endpoint_id}/rotate-secret", headers=htmx(token))
    fragment = _text(response)
    [rotated] = set(SIGNING_SECRET.findall(fragment))
    assert rotated != older and rotated != new_secret
    # The verify panel comes along, out of band: no longer the older secret's call.
    assert '<div id="endpoint-verify" hx-swap-oob="true">' in fragment
    assert 'Webhook(os.environ["WEBHOOK_SECRET"])' in _snippet(fragment, "standard")
    assert "issued before secrets were base64" not in fragment


def test_shell_snippet_signs_like_the_service_and_posts_to_the_receiver(
    app, client, brand, read_key, receiver, tmp_path
):
    endpoint_id, secret, page = _endpoint_page(app, client, brand, read_key, receiver.url)
    receiver.secrets.append(secret)
    code = _snippet(page, "shell")
    assert "openssl dgst -sha256 -hmac" in code and "WEBHOOK_SECRET" in code
    result = _run_shell_snippet(code, secret, tmp_path)
    timestamp = int(re.search(r"^X-Service-Timestamp: (\d+)$", result.stdout, re.M).group(1))
    signature = re.search(r"^X-Service-Signature: (\S+)$", result.stdout, re.M).group(1)
    body = (tmp_path / "body.json").read_bytes()
    assert signature == sign(secret, timestamp, body)
    assert result.stdout.strip().endswith("HTTP 200")
    [request] = receiver.wait_for(1)
    assert request.signature_valid
    assert request.body == body
    assert request.headers["X-Service-Event"] == "webhook.test"
    assert request.json["data"]["endpointId"] == endpoint_id
    assert request.json["brandId"] == brand
    # without the secret it stops before signing anything
    failed = subprocess.run(
        ["bash", "-c", code],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert failed.returncode != 0
    assert "set WEBHOOK_SECRET" in failed.stderr
    assert len(receiver.received) == 1


@pytest.mark.parametrize("language", list(SNIPPET_LABELS))
def test_receiver_snippets_accept_a_real_test_ping_from_the_worker(
    app, client, brand, write_key, webhook_worker, tmp_path, language
):
    """Registered and pinged through the dashboard, delivered by a real worker: the snippet
    running with the secret the page showed once answers 200, so the delivery is `delivered`."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}/hooks"
    token = sign_in(client, write_key)
    response = client.post(
        "/dashboard/endpoints",
        data={"url": url, "events": ["deal.completed"]},
        headers=htmx(token),
    )
    [secret] = set(SIGNING_SECRET.findall(_text(response)))
    endpoint_id = re.search(r'href="/dashboard/endpoints/(whe_\w+)"', _text(response)).group(1)
    code = _snippet(_text(client.get(f"/dashboard/endpoints/{endpoint_id}")), language)
    command = _snippet_command(language, tmp_path, code)
    env = {"PATH": os.environ["PATH"], "WEBHOOK_SECRET": secret}
    log = tmp_path / "receiver.log"
    with _serving(command, port, env, log):
        sent = client.post(f"/dashboard/endpoints/{endpoint_id}/send-test", headers=htmx(token))
        delivery_id = re.search(r"/dashboard/deliveries/(whd_\w+)", _text(sent)).group(1)
        deadline = time.monotonic() + 20
        while _delivery_statuses(app, endpoint_id) != ["delivered"]:
            assert time.monotonic() < deadline, (
                _delivery_statuses(app, endpoint_id),
                log.read_text(),
                webhook_worker.output()[-2000:],
            )
            time.sleep(0.1)
    assert "webhook.test evt_" in log.read_text()
    if language != "standard":  # that one prints webhook-id, the event id (CONTRACT 12.1)
        assert delivery_id in log.read_text()
    region = _text(
        client.get(f"/dashboard/endpoints/{endpoint_id}/deliveries", headers=htmx(token))
    )
    assert "status-delivered" in region and "hx-trigger" not in region


def test_the_endpoint_page_is_under_webhook_endpoints_in_the_nav(app, client, brand, read_key):
    endpoint_id, _ = _register(app, brand)
    sign_in(client, read_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert '<a href="/dashboard/endpoints" aria-current="page">Webhook endpoints</a>' in page


def test_register_errors_without_js_show_the_whole_page(app, client, brand, write_key):
    token = sign_in(client, write_key)
    response = client.post(
        "/dashboard/endpoints",
        data={"url": "https://127.0.0.2/x", "events": ["deal.completed"], "csrf_token": token},
    )
    assert response.status_code == 422
    page = _text(response)
    assert "<html" in page and "Register an endpoint" in page
    assert "127.0.0.2 is a loopback, private, link-local" in page
    assert _live_endpoints(app, brand) == 0


# ---- docs/webhooks.md shows shorter versions of the same checks: they must agree ----

DOCS = Path(__file__).resolve().parent.parent / "docs" / "webhooks.md"

_DOCS_PYTHON_HARNESS = """
import json, sys
for case in json.loads(sys.stdin.read()):
    print(verify(case["secret"], case["headers"], case["body"].encode()))
"""
_DOCS_NODE_HARNESS = """
let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  for (const c of JSON.parse(input)) {
    const pairs = Object.entries(c.headers).map(([k, v]) => [k.toLowerCase(), v]);
    const headers = Object.fromEntries(pairs);
    console.log(verify(c.secret, headers, Buffer.from(c.body)) ? "True" : "False");
  }
});
"""


def _docs_block(language: str) -> str:
    section = DOCS.read_text().split("### Verifying a signature", 1)[1]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def test_the_docs_verification_snippets_agree_with_the_signer(tmp_path):
    secret = "whsec_" + "a1B2" * 8
    body = '{"id":"evt_docs","type":"deal.completed","data":{"x":"é"}}'
    raw = body.encode()
    now = int(time.time())
    good = _signed(secret, raw, now)
    during_overlap = _signed("whsec_newer", raw, now, previous=secret)
    cases = [
        {"secret": secret, "headers": good, "body": body},
        {"secret": secret, "headers": during_overlap, "body": body},
        {"secret": "whsec_newer", "headers": during_overlap, "body": body},
        {"secret": secret, "headers": good, "body": body.replace("x", "y")},
        {"secret": secret, "headers": _signed(secret, raw, now - 360), "body": body},
        {"secret": "whsec_other", "headers": good, "body": body},
        {"secret": "whsec_other", "headers": during_overlap, "body": body},
    ]
    expected = "True\nTrue\nTrue\nFalse\nFalse\nFalse\nFalse\n"
    python = subprocess.run(
        [sys.executable, "-c", _docs_block("python") + _DOCS_PYTHON_HARNESS],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert python.stdout == expected, python.stderr
    node = subprocess.run(
        [_node(), "-e", _docs_block("js") + _DOCS_NODE_HARNESS],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert node.stdout == expected, node.stderr
    (tmp_path / "body.json").write_bytes(raw)
    shell = subprocess.run(
        ["bash", "-c", _docs_block("sh")],
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "TS": str(now), "SECRET": secret},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shell.stdout.strip() == sign(secret, now, raw) == good["X-Service-Signature"]


def test_send_again_what_failed_from_the_endpoint_page(app, client, brand, write_key, read_key):
    endpoint_id, _ = _register(app, brand)
    with app.app_context():
        delivery_ids = [
            publish_event(brand_id=brand, name="deal.completed", data={"n": n}).delivery_ids[0]
            for n in range(3)
        ]
        settle(delivery_ids[:2], "failed", last_error="HTTP 503")
        db.session.commit()
    sign_in(client, read_key)
    assert 'id="endpoint-recover"' not in _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    token = sign_in(client, write_key)
    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert '<select id="recover-window" name="window">' in page
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/recover", headers=htmx(token), data={"window": "3600"}
    )
    assert response.status_code == 202
    assert "2 failed deliveries queued again" in _text(response)
    # Without JavaScript, asking again: back to the page, which says nothing was left.
    response = client.post(
        f"/dashboard/endpoints/{endpoint_id}/recover",
        data={"window": "3600", "csrf_token": token},
    )
    assert response.status_code == 303
    assert "Nothing to send again in that window." in _text(
        client.get(response.headers["Location"])
    )
    assert _delivery_statuses(app, endpoint_id).count("pending") == 3  # 1 original + 2 new
    bad = client.post(
        f"/dashboard/endpoints/{endpoint_id}/recover", headers=htmx(token), data={"window": "5"}
    )
    assert bad.status_code in (400, 422)
    assert _delivery_statuses(app, endpoint_id).count("pending") == 3


def test_the_endpoint_pages_show_its_last_24_hours(app, client, brand, read_key):
    endpoint_id, _ = _register(app, brand)
    now = datetime.now(UTC)
    with app.app_context():
        [delivery_id] = publish_event(
            brand_id=brand, name="deal.completed", data={}, only_endpoint_ids=[endpoint_id]
        ).delivery_ids
        for number, (ago, error, ms) in enumerate(
            [
                (timedelta(minutes=5), None, 40),
                (timedelta(minutes=20), None, 60),
                (timedelta(minutes=40), None, 80),
                (timedelta(hours=3, minutes=10), "HTTP 503", 200),
                (timedelta(hours=30), None, 5),  # outside the window
            ],
            start=1,
        ):
            db.session.add(
                WebhookAttempt(
                    delivery_id=delivery_id,
                    endpoint_id=endpoint_id,
                    attempt_number=number,
                    requested_at=now - ago,
                    duration_ms=ms,
                    error=error,
                    request_headers={},
                )
            )
        db.session.commit()
    sign_in(client, read_key)
    listing = _text(client.get("/dashboard/endpoints"))
    assert '<td data-label="Success, 24 h">75.0%</td>' in listing

    page = _text(client.get(f"/dashboard/endpoints/{endpoint_id}"))
    assert "Health, last 24 hours" in page
    assert "75.0% of attempts" in page
    assert "70 ms median" in page  # 40, 60, 80, 200: percentile_cont(0.5) = 70
    hours = re.findall(r"<title>From (\d\d:\d\d) UTC: (\d+) succeeded, (\d+) failed</title>", page)
    assert len(hours) == 24
    assert hours[-1][1:] == ("3", "0")  # the last hour: three successes
    assert hours[-4][1:] == ("0", "1")  # three to four hours ago: the failure
    assert sum(int(ok) + int(bad) for _, ok, bad in hours) == 4
