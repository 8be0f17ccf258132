"""Webhook endpoints pages: list and register, and per endpoint its details, edit, disable and
re-enable, rotate the signing secret, delete, send a test, its latest deliveries and working
signature-verification snippets (SPEC sections 2-4 and 6, CONTRACT 4 and 6).

Every action calls the service function the JSON route in blueprints/api/webhooks.py calls, with
the same URL policy; records are the API's response schemas' dumps, so no secret is ever listed.

htmx posts get the fragment that changed; a plain form's post is answered with a 303 to a page
(a reload never repeats the action), a new secret reaching that page once (`one_time`).
Disabling, rotating and deleting ask first: htmx with a dialog, a plain form with a page.
"""

from __future__ import annotations

import json
import shlex
from datetime import timedelta
from urllib.parse import urlsplit

from flask import current_app, flash, redirect, request, url_for

from blueprints.dashboard import dashboard, one_time
from blueprints.dashboard.rendering import (
    load,
    load_form,
    render,
    render_confirmation,
)
from blueprints.dashboard.session import current_caller, is_htmx, signed_in
from extensions import db
from models.columns import utcnow
from models.event_catalog import DEFAULT_SUBSCRIPTION, EVENT_NAMES, EVENT_TYPES, TEST_EVENT
from models.webhook_endpoint import MAX_IN_FLIGHT_RANGE, NO_ORDERING, SUBJECT_ORDERING
from schemas.base import iso_timestamp
from schemas.campaigns import CampaignSchema
from schemas.dashboard import ExampleEventSchema
from schemas.events import event_data
from schemas.webhooks import (
    DeliverySchema,
    EndpointRegisterSchema,
    EndpointSchema,
    EndpointStatsSchema,
    EndpointUpdateSchema,
    IssuedEndpointSchema,
    ListedEndpointSchema,
    RotatedSecretSchema,
    RotateSecretSchema,
)
from services.campaigns import campaign_choices
from services.deliveries import list_deliveries, recover_failed_deliveries
from services.delivery.backlog import waiting_retries
from services.endpoint_stats import endpoint_stats, latest_failures, with_health
from services.errors import ValidationFailed
from services.events import API_VERSION
from services.signing import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
)
from services.webhook_endpoints import (
    FROM_THE_DASHBOARD,
    TEST_MESSAGE,
    ChangedBy,
    current_url_policy,
    delete_endpoint,
    get_endpoint,
    list_endpoints,
    register_endpoint,
    retry_pending,
    rotate_signing_secret,
    send_example_event,
    send_test_ping,
    signs_with_an_older_secret,
    update_endpoint,
)

# The latest deliveries the page lists (its first screen has the failures; the log has all).
RECENT_DELIVERIES = 5
# The failed attempts the page shows first, with their errors (the log has every one).
LATEST_FAILURES = 3
# Where the snippets' receiver listens when the endpoint URL names no port (behind a proxy
# that terminates TLS, typically).
DEFAULT_RECEIVER_PORT = 8000

_endpoints = ListedEndpointSchema(many=True)
_health = EndpointStatsSchema()
_endpoint = EndpointSchema()
_issued = IssuedEndpointSchema()
_rotated = RotatedSecretSchema()
_rotate_form = RotateSecretSchema()
# The windows the recover form offers, back from now (the API takes any, up to 14 days).
RECOVER_WINDOWS = (
    (3600, "hour"),
    (86400, "24 hours"),
    (7 * 86400, "7 days"),
    (14 * 86400, "14 days"),
)
# The overlaps the rotate form offers (the API takes any number of seconds up to a week).
OVERLAP_CHOICES = (
    (0, "None: the current secret stops at once"),
    (3600, "1 hour"),
    (86400, "24 hours"),
    (604800, "7 days"),
)
# The orderings the forms offer, in the words of the page.
ORDERING_CHOICES = (
    (NO_ORDERING, "As soon as each is due (fastest; a deal's events may arrive out of order)"),
    (SUBJECT_ORDERING, "One after another per deal, campaign or conversion (in sequence)"),
)
_campaigns = CampaignSchema(many=True)
_deliveries = DeliverySchema(many=True)
_register_form = EndpointRegisterSchema()
_example_form = ExampleEventSchema()
_update_form = EndpointUpdateSchema()


def _event_groups() -> list[tuple[str, list[tuple[str, str]]]]:
    """The catalogue's events grouped by resource (the part before the dot), in its order."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for event in EVENT_TYPES.values():
        groups.setdefault(event.resource, []).append((event.name, event.description))
    return list(groups.items())


EVENT_GROUPS = _event_groups()


# ---- the list and the register form ----


def _list_context(**extra) -> dict:
    brand_id = current_caller().brand_id
    context = {
        "endpoints": _endpoints.dump(with_health(list_endpoints(brand_id), now=utcnow())),
        "event_groups": EVENT_GROUPS,
        "test_event": TEST_EVENT,
        "url_policy": current_url_policy(),
        "form": {
            "url": "",
            "description": "",
            "events": list(DEFAULT_SUBSCRIPTION),
            "ordering": NO_ORDERING,
            "campaignIds": [],
            "maxInFlight": None,
            "traceContext": False,
        },
        "errors": {},
    } | _filter_choices(brand_id, extra.get("form", {}).get("campaignIds", []))
    return context | extra


def _filter_choices(brand_id: str, chosen: list[str]) -> dict:
    """What the ordering, campaign and in-flight fields of an endpoint form offer: the brand's
    campaigns, with those `chosen` among them, and the limit an endpoint without its own has."""
    return {
        "ordering_choices": ORDERING_CHOICES,
        "campaigns": _campaigns.dump(campaign_choices(brand_id, including=chosen)),
        "max_in_flight_range": MAX_IN_FLIGHT_RANGE,
        "default_max_in_flight": current_app.extensions["settings"].webhook_endpoint_concurrency,
    }


@dashboard.get("/endpoints")
@signed_in()
def endpoints():
    return render(
        "dashboard/endpoints.html", registered=one_time.take("endpoint"), **_list_context()
    )


@dashboard.post("/endpoints")
@signed_in(write=True)
def create_endpoint():
    """registerWebhookEndpoint: the signing secret is shown in this answer only."""
    try:
        fields = load_form(_register_form)
        issued = register_endpoint(
            brand_id=current_caller().brand_id, policy=current_url_policy(), **fields
        )
    except ValidationFailed as error:
        db.session.rollback()
        return render(
            "dashboard/endpoints.html",
            fragment="dashboard/_endpoint_form.html",
            status=422,
            **_list_context(form=_submitted_form(), errors=error.errors),
        )
    registered = _issued.dump(issued)
    db.session.commit()
    if not is_htmx():
        one_time.stash("endpoint", registered)
        return redirect(url_for("dashboard.endpoints", _anchor="endpoint-register"), code=303)
    return render(
        "dashboard/endpoints.html",
        fragment="dashboard/_endpoint_registered.html",
        status=201,
        registered=registered,
        rows_out_of_band=is_htmx(),
        **_list_context(),
    )


def _submitted_form() -> dict:
    return {
        "url": request.form.get("url", ""),
        "description": request.form.get("description", ""),
        "events": request.form.getlist("events"),
        "ordering": request.form.get("ordering", NO_ORDERING),
        "campaignIds": request.form.getlist("campaignIds"),
        "maxInFlight": request.form.get("maxInFlight", ""),
        "traceContext": "true" in request.form.getlist("traceContext"),
    }


# ---- one endpoint ----


def _detail_context(record, **extra) -> dict:
    """What the endpoint page shows. An action's answer swaps in the panels it changed
    (`refresh`: "summary", "health", "deliveries", "retry", "recover", "example", "verify"; see
    _endpoint_refreshed.html) beside its own, so no panel goes on saying what was true before:
    the health figures and latest failures (four queries) are drawn for every answer."""
    endpoint = _endpoint.dump(record)
    stats = endpoint_stats(brand_id=record.brand_id, endpoint_id=record.id, now=utcnow())
    failures = latest_failures(
        record.id, start=stats.window_start, end=stats.window_end, limit=LATEST_FAILURES
    )
    form = extra.get("form") or {}
    chosen = list({*endpoint["campaignIds"], *form.get("campaignIds", [])})
    choices = _filter_choices(record.brand_id, chosen)
    context = {
        "endpoint": endpoint,
        "health": _health.dump(stats) | {"states": stats.states},
        "failures": [
            {
                "deliveryId": failure.delivery_id,
                "eventId": failure.event_id,
                "eventName": failure.event_name,
                "attemptNumber": failure.attempt_number,
                "requestedAt": iso_timestamp(failure.requested_at),
                "error": failure.error,
                "httpStatus": failure.http_status,
                "responseBody": failure.response_body,
            }
            for failure in failures
        ],
        "chart": _health_chart(stats.hours),
        "refresh": (),
        "example_sent": None,
        "example_choice": _example_choice(endpoint["events"]),
        "deliveries": _recent_deliveries(endpoint["id"]),
        "snippet": _snippet_values(
            endpoint, record.brand_id, older_secret=signs_with_an_older_secret(record)
        ),
        "event_groups": EVENT_GROUPS,
        "test_event": TEST_EVENT,
        "url_policy": current_url_policy(),
        "form": {
            "url": endpoint["url"],
            "description": endpoint["description"],
            "events": endpoint["events"],
            "ordering": endpoint["ordering"],
            "campaignIds": endpoint["campaignIds"],
            "maxInFlight": endpoint["maxInFlight"],
            "traceContext": endpoint["traceContext"],
        },
        "errors": {},
        **choices,
        "campaign_names": {campaign["id"]: campaign["name"] for campaign in choices["campaigns"]},
        "waiting_retries": waiting_retries(record.id) if record.is_active else 0,
        "retried": None,
        "dropped_events": [],
        "rotated": None,
        "overlap_choices": OVERLAP_CHOICES,
        "recover_windows": RECOVER_WINDOWS,
        "recovered": None,
        "queued": None,
        "confirmations": _confirmations(endpoint),
    }
    return context | extra


def _confirmations(endpoint: dict) -> dict[str, dict]:
    """What each destructive action says before it is done, as a dialog (htmx) or a page."""
    endpoint_id = endpoint["id"]
    return {
        "delete": {
            "title": "Delete this endpoint?",
            "consequence": f"Delete the endpoint {endpoint['url']}? Its pending deliveries end "
            "as failed, and nothing more is sent to it. Its past deliveries stay in the log. "
            "This cannot be undone.",
            "button": "Delete endpoint",
            "action": url_for("dashboard.remove_endpoint", endpoint_id=endpoint_id),
        },
        "rotate": {
            "title": "Rotate the signing secret?",
            "consequence": "Rotate the signing secret? With an overlap, the current secret "
            "goes on signing every delivery beside the new one until the overlap ends; "
            "without one it stops verifying at once, and every delivery from now on, retries "
            "included, is signed with the new one only.",
            "button": "Rotate secret",
            "action": url_for("dashboard.rotate_endpoint_secret", endpoint_id=endpoint_id),
        },
        "disable": {
            "title": "Disable this endpoint?",
            "consequence": "Disable this endpoint? It stops receiving events, and its pending "
            "deliveries end as failed. You can re-enable it later.",
            "button": "Disable",
            "action": url_for("dashboard.disable_endpoint", endpoint_id=endpoint_id),
        },
    }


def _confirm(endpoint_id: str, action: str):
    endpoint = _endpoint.dump(_load(endpoint_id))
    back = url_for("dashboard.endpoint", endpoint_id=endpoint_id)
    return render_confirmation(_confirmations(endpoint)[action], back=back)


def _recent_deliveries(endpoint_id: str) -> list[dict]:
    page = list_deliveries(
        brand_id=current_caller().brand_id,
        page=1,
        limit=RECENT_DELIVERIES,
        endpoint_id=endpoint_id,
    )
    return _deliveries.dump(page.items)


def _load(endpoint_id: str):
    """The caller's brand's endpoint: another brand's id is NotFound, as in the API."""
    return get_endpoint(current_caller().brand_id, endpoint_id)


@dashboard.get("/endpoints/<id(whe):endpoint_id>")
@signed_in()
def endpoint(endpoint_id: str):
    rotated = one_time.take(f"signing-secret:{endpoint_id}")
    return render("dashboard/endpoint.html", **_detail_context(_load(endpoint_id), rotated=rotated))


@dashboard.get("/endpoints/<id(whe):endpoint_id>/deliveries")
@signed_in()
def endpoint_deliveries(endpoint_id: str):
    """The latest deliveries region of the detail page (it polls this while one is pending),
    with the health figures those deliveries move."""
    record = _load(endpoint_id)
    if not is_htmx():
        return redirect(url_for("dashboard.deliveries", endpointId=endpoint_id), code=303)
    return render(
        "dashboard/endpoint.html",
        fragment="dashboard/_endpoint_deliveries_polled.html",
        **_detail_context(record, refresh=("health", "retry")),
    )


@dashboard.post("/endpoints/<id(whe):endpoint_id>")
@signed_in(write=True)
def edit_endpoint(endpoint_id: str):
    """updateWebhookEndpoint with the settings form's fields."""
    try:
        fields = load_form(_update_form)
        record = update_endpoint(
            brand_id=current_caller().brand_id,
            endpoint_id=endpoint_id,
            policy=current_url_policy(),
            **fields,
        )
    except ValidationFailed as error:
        db.session.rollback()
        return render(
            "dashboard/endpoint.html",
            fragment="dashboard/_endpoint_edit.html",
            status=422,
            **_detail_context(_load(endpoint_id), form=_submitted_form(), errors=error.errors),
        )
    db.session.commit()
    flash("Endpoint updated.", "success")
    if not is_htmx():
        _flash_dropped(record.dropped_events)
        return _back_to(endpoint_id)
    return render(
        "dashboard/endpoint.html",
        fragment="dashboard/_endpoint_edited.html",
        **_detail_context(record, dropped_events=record.dropped_events),
    )


def _flash_dropped(names: list[str]) -> None:
    if names:
        flash(f"Dropped unsupported event names: {', '.join(names)}.", "warning")


def _back_to(endpoint_id: str):
    """A plain form's answer: the endpoint's page, which a reload only reads."""
    return redirect(url_for("dashboard.endpoint", endpoint_id=endpoint_id), code=303)


@dashboard.get("/endpoints/<id(whe):endpoint_id>/disable")
@signed_in(write=True)
def confirm_disable_endpoint(endpoint_id: str):
    return _confirm(endpoint_id, "disable")


@dashboard.post("/endpoints/<id(whe):endpoint_id>/disable")
@signed_in(write=True)
def disable_endpoint(endpoint_id: str):
    """updateWebhookEndpoint with `isActive: false`: its pending deliveries end failed."""
    return _set_active(endpoint_id, False)


@dashboard.post("/endpoints/<id(whe):endpoint_id>/enable")
@signed_in(write=True)
def enable_endpoint(endpoint_id: str):
    """updateWebhookEndpoint with `isActive: true`: the failure count starts again at zero."""
    return _set_active(endpoint_id, True)


def _set_active(endpoint_id: str, active: bool):
    record = update_endpoint(
        brand_id=current_caller().brand_id,
        endpoint_id=endpoint_id,
        policy=current_url_policy(),
        is_active=active,
        changed_by=ChangedBy(FROM_THE_DASHBOARD, current_caller().key_id),
    )
    db.session.commit()
    if active:
        flash("Endpoint re-enabled; its failure count starts again at zero.", "success")
    else:
        flash("Endpoint disabled; its pending deliveries ended as failed.", "info")
    if not is_htmx():
        return _back_to(endpoint_id)
    return render(
        "dashboard/endpoint.html",
        fragment="dashboard/_endpoint_state_changed.html",
        **_detail_context(record, refresh=("health", "deliveries", "retry", "recover", "example")),
    )


@dashboard.get("/endpoints/<id(whe):endpoint_id>/rotate-secret")
@signed_in(write=True)
def confirm_rotate_endpoint_secret(endpoint_id: str):
    endpoint = _endpoint.dump(_load(endpoint_id))
    overlap = _overlap_seconds(request.args)
    confirmation = _confirmations(endpoint)["rotate"] | {
        "fields": {"overlapSeconds": overlap},
        "consequence": _overlap_consequence(overlap),
    }
    back = url_for("dashboard.endpoint", endpoint_id=endpoint_id)
    return render_confirmation(confirmation, back=back)


def _overlap_seconds(values) -> int:
    """The form's overlap, through the API's schema (a form sends the number as text)."""
    raw = values.get("overlapSeconds", "0")
    return load(_rotate_form, {"overlapSeconds": int(raw) if raw.isdigit() else raw})[
        "overlap_seconds"
    ]


def _overlap_consequence(overlap: int) -> str:
    if not overlap:
        return (
            "Rotate the signing secret with no overlap? The current secret stops verifying at "
            "once: every delivery from now on, retries included, is signed with the new one "
            "only."
        )
    label = dict(OVERLAP_CHOICES).get(overlap, f"{overlap} seconds")
    return (
        f"Rotate the signing secret with an overlap of {label}? Until it ends every delivery "
        "is signed with both the new and the current secret, so receivers with either "
        "verify it; after that only the new one signs."
    )


@dashboard.post("/endpoints/<id(whe):endpoint_id>/rotate-secret")
@signed_in(write=True)
def rotate_endpoint_secret(endpoint_id: str):
    """rotateWebhookSecret: the new secret is shown once, in this answer or the page after."""
    issued = rotate_signing_secret(
        brand_id=current_caller().brand_id,
        endpoint_id=endpoint_id,
        overlap_seconds=_overlap_seconds(request.form),
    )
    rotated = _rotated.dump(issued)
    db.session.commit()
    if not is_htmx():
        one_time.stash(f"signing-secret:{endpoint_id}", rotated)
        return redirect(
            url_for("dashboard.endpoint", endpoint_id=endpoint_id, _anchor="endpoint-secret-panel"),
            code=303,
        )
    # The verify panel too: an endpoint leaving an older secret gets the library's usual call.
    return render(
        "dashboard/endpoint.html",
        fragment="dashboard/_endpoint_secret_rotated.html",
        **_detail_context(issued.record, rotated=rotated, refresh=("verify",)),
    )


@dashboard.post("/endpoints/<id(whe):endpoint_id>/recover")
@signed_in(write=True)
def recover_endpoint_deliveries(endpoint_id: str):
    """recoverWebhookDeliveries over the chosen window back from now."""
    window = _int(request.form.get("window"))
    if window not in dict(RECOVER_WINDOWS):
        raise ValidationFailed("Choose one of the windows offered", {"window": ["Not offered."]})
    now = utcnow()
    recovered = recover_failed_deliveries(
        brand_id=current_caller().brand_id,
        endpoint_id=endpoint_id,
        since=now - timedelta(seconds=window),
        now=now,
    )
    db.session.commit()
    if not is_htmx():
        flash(
            f"{recovered.queued} failed deliveries queued again."
            if recovered.queued
            else "Nothing to send again in that window.",
            "success" if recovered.queued else "info",
        )
        return _back_to(endpoint_id)
    return render(
        "dashboard/endpoint.html",
        fragment="dashboard/_endpoint_recovered.html",
        status=202,
        **_detail_context(
            _load(endpoint_id), recovered=recovered, refresh=("health", "deliveries")
        ),
    )


@dashboard.post("/endpoints/<id(whe):endpoint_id>/retry-pending")
@signed_in(write=True)
def retry_endpoint_pending(endpoint_id: str):
    """retryPendingWebhookDeliveries: what waits for a retry goes now."""
    due = retry_pending(brand_id=current_caller().brand_id, endpoint_id=endpoint_id)
    db.session.commit()
    if not is_htmx():
        flash(_retried_words(due), "success" if due else "info")
        return _back_to(endpoint_id)
    return render(
        "dashboard/endpoint.html",
        fragment="dashboard/_endpoint_retried.html",
        status=202,
        **_detail_context(
            _load(endpoint_id), retried=_retried_words(due), refresh=("health", "deliveries")
        ),
    )


def _retried_words(due: int) -> str:
    if not due:
        return "Nothing was waiting for a retry: every pending delivery is due or on its way."
    noun = "retrying delivery is" if due == 1 else "retrying deliveries are"
    return f"{due} {noun} due now: watch them under “Recent deliveries”."


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


@dashboard.get("/endpoints/<id(whe):endpoint_id>/delete")
@signed_in(write=True)
def confirm_remove_endpoint(endpoint_id: str):
    return _confirm(endpoint_id, "delete")


@dashboard.post("/endpoints/<id(whe):endpoint_id>/delete")
@signed_in(write=True)
def remove_endpoint(endpoint_id: str):
    """deleteWebhookEndpoint, then back to the list."""
    deleted = delete_endpoint(brand_id=current_caller().brand_id, endpoint_id=endpoint_id)
    db.session.commit()
    flash(
        f"Endpoint {deleted.url} deleted; its pending deliveries ended as failed, and its past "
        "deliveries stay in the log.",
        "info",
    )
    target = url_for("dashboard.endpoints")
    if is_htmx():
        return "", 200, {"HX-Redirect": target}
    return redirect(target, code=303)


@dashboard.post("/endpoints/<id(whe):endpoint_id>/send-test")
@signed_in()
def send_endpoint_test(endpoint_id: str):
    """sendWebhookTest (read scope is enough). A disabled endpoint is NotFound, as in the API."""
    delivery_id = send_test_ping(brand_id=current_caller().brand_id, endpoint_id=endpoint_id)
    db.session.commit()
    if not is_htmx():
        flash(
            f"Test ping queued as delivery {delivery_id}: watch it under “Recent deliveries”.",
            "success",
        )
        return _back_to(endpoint_id)
    return render(
        "dashboard/endpoint.html",
        fragment="dashboard/_endpoint_test_sent.html",
        status=202,
        **_detail_context(_load(endpoint_id), queued=delivery_id, refresh=("health", "deliveries")),
    )


@dashboard.post("/endpoints/<id(whe):endpoint_id>/send-example")
@signed_in(write=True)
def send_endpoint_example(endpoint_id: str):
    """An event of the catalogue with its sample body, to this endpoint alone. Write scope,
    unlike the test ping: a receiver may act on a `deal.completed`, sample or not."""
    try:
        name = load_form(_example_form)["event_name"]
    except ValidationFailed as error:
        return render(
            "dashboard/endpoint.html",
            fragment="dashboard/_endpoint_example.html",
            status=422,
            **_detail_context(_load(endpoint_id), errors=error.errors),
        )
    published = send_example_event(
        brand_id=current_caller().brand_id, endpoint_id=endpoint_id, name=name
    )
    db.session.commit()
    sent = {"event": name, "delivery_id": published.delivery_ids[0]}
    if not is_htmx():
        flash(
            f"Example {name} queued as delivery {sent['delivery_id']}: watch it under "
            "“Recent deliveries”.",
            "success",
        )
        return _back_to(endpoint_id)
    return render(
        "dashboard/endpoint.html",
        fragment="dashboard/_endpoint_example_sent.html",
        status=202,
        **_detail_context(
            _load(endpoint_id),
            example_sent=sent,
            example_choice=name,
            refresh=("health", "deliveries"),
        ),
    )


def _example_choice(subscribed: list[str]) -> str:
    """The event the example form offers first: the endpoint's first subscribed one."""
    return next((name for name in subscribed if name != TEST_EVENT), EVENT_NAMES[0])


# ---- the health chart ----

CHART_BAR_WIDTH, CHART_GAP, CHART_HEIGHT = 16, 4, 100


def _health_chart(hours) -> dict:
    """An hour a bar, successes at the bottom and failures stacked on them, scaled to the
    busiest hour; drawn by _endpoint_health.html as SVG."""
    peak = max([hour.succeeded + hour.failed for hour in hours] + [1])
    base = CHART_HEIGHT - 5
    scale = (CHART_HEIGHT - 10) / peak
    bars = []
    for index, hour in enumerate(hours):
        ok_height = round(hour.succeeded * scale, 1)
        bad_height = round(hour.failed * scale, 1)
        bars.append(
            {
                "x": index * (CHART_BAR_WIDTH + CHART_GAP) + CHART_GAP // 2,
                "ok_y": round(base - ok_height, 1),
                "ok_height": ok_height,
                "bad_y": round(base - ok_height - bad_height, 1),
                "bad_height": bad_height,
                "label": f"From {hour.start:%H:%M} UTC: {hour.succeeded} succeeded, "
                f"{hour.failed} failed",
            }
        )
    return {
        "bars": bars,
        "peak": peak if any(h.succeeded or h.failed for h in hours) else 0,
        "width": len(hours) * (CHART_BAR_WIDTH + CHART_GAP),
        "height": CHART_HEIGHT,
        "base": base + 0.5,
        "bar_width": CHART_BAR_WIDTH,
        # The window's ends, with their dates: 24 hours span two days.
        "since": f"{hours[0].start:%Y-%m-%d %H:%M}",
        "until": f"{hours[-1].start + timedelta(hours=1):%Y-%m-%d %H:%M}",
    }


# ---- the verification snippets' values ----


def _snippet_values(endpoint: dict, brand_id: str, *, older_secret: bool) -> dict:
    """What the snippets fill in for this endpoint, and the literals they quote it with
    (JSON strings are valid Python and JavaScript string literals). `older_secret`: its secret
    predates base64 secrets, so a Standard Webhooks library takes it as bytes (CONTRACT 12.1)."""
    url = endpoint["url"]
    parts = urlsplit(url)
    sample_body = json.dumps(
        {
            "id": "evt_manual_check",
            "type": TEST_EVENT,
            "createdAt": iso_timestamp(utcnow()),
            "brandId": brand_id,
            "apiVersion": API_VERSION,
            "data": event_data(
                TEST_EVENT, {"endpoint_id": endpoint["id"], "message": TEST_MESSAGE}
            ),
        },
        separators=(",", ":"),
    )
    return {
        "endpoint_id": endpoint["id"],
        "url": url,
        "path": parts.path or "/",
        "port": parts.port or DEFAULT_RECEIVER_PORT,
        "headers": {
            "timestamp": TIMESTAMP_HEADER,
            "signature": SIGNATURE_HEADER,
            "event": EVENT_HEADER,
            "delivery": DELIVERY_HEADER,
        },
        "test_event": TEST_EVENT,
        "older_secret": older_secret,
        "shell_url": shlex.quote(url),
        "shell_body": shlex.quote(sample_body),
    }
