"""Traces from postback to webhook (CONTRACT 13.6).

With OTLP export configured, a postback through a real gunicorn server and its delivery by a
real worker are one trace at an OTLP/HTTP receiver of the test's own: the request's server span
(a child of the caller's `traceparent`), its PostgreSQL and Redis spans, and the attempt's
`webhook.attempt` span under it. An endpoint with `traceContext` receives that trace's
`traceparent`; one without receives neither `traceparent` nor `tracestate`. Without export, an
endpoint with `traceContext` still receives a valid `traceparent`, in the caller's trace."""

from __future__ import annotations

import secrets

import requests

from observability.tracing import parse_traceparent
from tests import test_webhook_delivery as delivery
from tests.dashboard import htmx, sign_in
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.receiver import Receiver
from tests.server_process import ServerProcess
from tests.test_webhook_delivery import logs, publish
from tests.worker_process import workers_started_by_test

api = delivery.api
workers = delivery.workers
start_worker = delivery.start_worker

EVENTS = ["conversion.recorded", "deal.completed"]


def header(received, name: str) -> str | None:
    """A request header, whatever its case on the wire."""
    return next((v for k, v in received.headers.items() if k.lower() == name), None)


def caller_trace() -> tuple[str, str, str]:
    """A caller's own trace: (traceparent, trace id, its span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def postback(url: str, brand: str, key: str, traceparent: str) -> dict:
    answer = requests.post(
        f"{url}/api/v1/brand/{brand}/conversion/record-postback",
        json={"eventType": "purchase", "valueMinor": 1250},
        headers={
            "X-Api-Key": key,
            "Idempotency-Key": secrets.token_hex(8),
            "traceparent": traceparent,
        },
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["data"]


def db_system(span: ReceivedSpan) -> str | None:
    return span.attributes.get("db.system.name") or span.attributes.get("db.system")


def test_a_postback_and_its_attempts_are_one_exported_trace(app, app_environ, api, brand):
    otlp, traced_receiver, plain_receiver = OtlpReceiver(), Receiver(), Receiver()
    environ = {
        **app_environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # milliseconds between exports
    }
    traced = api.register(traced_receiver.url, events=EVENTS, traceContext=True)
    plain = api.register(plain_receiver.url, events=EVENTS)
    assert (traced["traceContext"], plain["traceContext"]) == (True, False)
    server = ServerProcess(environ, workers=1, threads=4)
    try:
        with workers_started_by_test(environ) as start:
            worker = start()
            traceparent, trace_id, caller_span = caller_trace()
            postback(server.url, brand, api.key, traceparent)
            [sent] = traced_receiver.wait_for(1)
            [unsent] = plain_receiver.wait_for(1)

            # The traced endpoint gets the caller's trace, with the attempt span as parent.
            received = parse_traceparent(header(sent, "traceparent"))
            assert received is not None, sent.headers
            assert received[0] == trace_id, logs(worker)
            attempt_span_id = received[1]
            assert header(unsent, "traceparent") is None and header(unsent, "tracestate") is None

            spans = otlp.wait_for(
                lambda spans: (
                    {s.span_id for s in spans if s.name == "webhook.attempt"} >= {attempt_span_id}
                    and sum(s.name == "webhook.attempt" for s in spans) >= 2
                    and any(s.kind == "server" and s.trace_id == trace_id for s in spans)
                ),
                what="both attempt spans and the request's",
            )
    finally:
        server.stop()
        otlp.close()
        traced_receiver.close()
        plain_receiver.close()

    in_trace = [s for s in spans if s.trace_id == trace_id]
    [request_span] = [s for s in in_trace if s.kind == "server"]
    assert request_span.parent_span_id == caller_span  # the caller's traceparent is its parent
    assert request_span.service == "brand-api"
    assert "record-postback" in request_span.name
    below_request = [s for s in in_trace if s.parent_span_id == request_span.span_id]
    assert "postgresql" in {db_system(s) for s in below_request}  # -psycopg
    assert "redis" in {db_system(s) for s in below_request}  # -redis (the key's rate limit)

    attempts = {s.span_id: s for s in in_trace if s.name == "webhook.attempt"}
    assert len(attempts) == 2  # one per endpoint, each a child of the publishing request
    attempt = attempts[attempt_span_id]
    assert attempt.parent_span_id == request_span.span_id
    assert (attempt.service, attempt.kind) == ("brand-api-worker", "client")
    detail = api.delivery(sent.delivery_id)
    assert attempt.attributes == {
        "brand.id": brand,
        "event.id": detail["eventId"],
        "event.type": "conversion.recorded",
        "webhook.endpoint.id": traced["id"],
        "webhook.delivery.id": sent.delivery_id,
        "webhook.attempt.number": 1,
        "http.response.status_code": 200,
    }
    [other] = [s for s in attempts.values() if s is not attempt]
    assert other.attributes["webhook.endpoint.id"] == plain["id"]
    assert other.parent_span_id == request_span.span_id

    # The attempt's record shows the header it was sent; the other endpoint's shows none.
    [record] = detail["attempts"]
    assert record["requestHeaders"]["traceparent"] == header(sent, "traceparent")
    [plain_record] = api.delivery(unsent.delivery_id)["attempts"]
    assert {name.lower() for name in plain_record["requestHeaders"]} & {
        "traceparent",
        "tracestate",
    } == set()


def test_without_export_a_traced_endpoint_still_gets_a_traceparent(
    app, client, api, brand, start_worker
):
    traced_receiver, plain_receiver = Receiver(), Receiver()
    try:
        traced = api.register(traced_receiver.url, events=EVENTS, traceContext=True)
        api.register(plain_receiver.url, events=EVENTS)
        worker = start_worker()
        traceparent, trace_id, caller_span = caller_trace()
        response = client.post(
            f"/api/v1/brand/{brand}/conversion/record-postback",
            json={"eventType": "purchase", "valueMinor": 1250},
            headers={
                "X-Api-Key": api.key,
                "Idempotency-Key": secrets.token_hex(8),
                "traceparent": traceparent,
            },
        )
        assert response.status_code == 201, response.get_json()
        [sent] = traced_receiver.wait_for(1)
        # An event no request published (the platform's own): a trace of its own.
        publish(app, brand, ("deal.completed", {"id": "deal_1", "status": "completed"}))
        [_, alone] = traced_receiver.wait_for(2)
        plain_receiver.wait_for(2)

        joined = parse_traceparent(header(sent, "traceparent"))
        assert joined is not None, logs(worker)
        assert joined[0] == trace_id  # the caller's trace, a span id of the attempt's own
        assert joined[1] != caller_span and joined[2] == "01"
        started = parse_traceparent(header(alone, "traceparent"))
        assert started is not None and started[0] != trace_id  # valid: ids not all zeros
        assert all(
            header(r, "traceparent") is None and header(r, "tracestate") is None
            for r in plain_receiver.received
        )
        [record] = api.delivery(sent.delivery_id)["attempts"]
        assert record["requestHeaders"]["traceparent"] == header(sent, "traceparent")
        assert api.endpoint(traced["id"])["traceContext"] is True
    finally:
        traced_receiver.close()
        plain_receiver.close()


def test_trace_context_is_set_and_cleared_from_the_api_and_the_dashboard(client, api, write_key):
    endpoint = api.register("http://127.0.0.1:9/hooks", events=["deal.completed"])
    path = f"webhook/{endpoint['id']}/update-endpoint"
    assert api.call("PATCH", path, json={"traceContext": True})["traceContext"] is True
    refused = client.patch(
        f"/api/v1/brand/{api.brand}/{path}",
        json={"traceContext": "yes"},
        headers={"X-Api-Key": api.key},
    )
    assert refused.status_code == 400
    assert "traceContext" in refused.get_json()["errors"]
    assert api.endpoint(endpoint["id"])["traceContext"] is True

    token = sign_in(client, write_key)
    page = f"/dashboard/endpoints/{endpoint['id']}"
    shown = client.get(page).get_data(as_text=True)
    assert 'name="traceContext" value="true" checked' in shown
    form = {"url": "http://127.0.0.1:9/hooks", "events": ["deal.completed"]}
    # Unticked: only the hidden "false" is sent.
    edited = client.post(page, data={**form, "traceContext": "false"}, headers=htmx(token))
    assert edited.status_code == 200
    assert "not sent" in edited.get_data(as_text=True)
    assert api.endpoint(endpoint["id"])["traceContext"] is False
    ticked = client.post(
        page, data={**form, "traceContext": ["false", "true"]}, headers=htmx(token)
    )
    assert ticked.status_code == 200
    assert api.endpoint(endpoint["id"])["traceContext"] is True
    # A form without the field leaves it as it is.
    client.post(page, data=form, headers=htmx(token))
    assert api.endpoint(endpoint["id"])["traceContext"] is True
