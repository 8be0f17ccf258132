"""The OpenAPI document's `webhooks` section (OpenAPI 3.1): one entry per event of the catalogue,
its body the event's JSON Schema, generated from the marshmallow schema its publishers dump the
event through. Every catalogue sample, and every delivery a real worker makes from every source
of events, is validated against it with `jsonschema` (Draft 2020-12), the way a receiver would;
a field a publisher adds without its schema fails."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator

import pytest
from openapi_spec_validator import validate
from sqlalchemy import func, select

from extensions import db
from models import WebhookEvent
from models.event_catalog import EVENT_NAMES, EVENT_TYPES, sample_data
from schemas.events import EVENT_DATA_SCHEMAS, event_component_name, event_data, event_data_schema
from services.platform_changes import tracked_links
from services.signing import delivery_headers
from tests.event_schemas import FORMATS, WebhookContract, contract_of, sample_body
from tests.helpers import EVENT_ENVELOPE_KEYS, assert_success
from tests.receiver import Receiver, Reply
from tests.test_platform_changes import Platform, every_platform_event
from tests.worker_process import WorkerProcess

HEADERS = {
    "X-Service-Timestamp",
    "X-Service-Signature",
    "X-Service-Event",
    "X-Service-Delivery",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "User-Agent",
}


@pytest.fixture(scope="module")
def contract(app) -> WebhookContract:
    return contract_of(app)


@pytest.fixture(scope="module")
def document(contract) -> dict:
    return contract.document


# --- the section ------------------------------------------------------------------------------


def test_the_document_is_openapi_3_1_with_one_webhook_per_event(document):
    validate(document)  # openapi-spec-validator picks the 3.1 schema from `openapi`
    assert document["openapi"] == "3.1.0"
    assert list(document["webhooks"]) == list(EVENT_NAMES)
    schemas = document["components"]["schemas"]
    for name, item in document["webhooks"].items():
        delivery = item["post"]
        assert EVENT_TYPES[name].description in delivery["description"]
        headers = {p["name"]: p for p in delivery["parameters"]}
        assert set(headers) == HEADERS
        assert all(p["in"] == "header" and p["required"] for p in headers.values())
        assert headers["X-Service-Event"]["schema"]["const"] == name
        body = delivery["requestBody"]["content"]["application/json"]
        component = schemas[event_component_name(name)]
        assert body["schema"] == {"$ref": f"#/components/schemas/{event_component_name(name)}"}
        assert body["example"] == component["example"] == sample_body(name)
        assert component["required"] == EVENT_ENVELOPE_KEYS
        subject = schemas[component["properties"]["subject"]["$ref"].rsplit("/", 1)[1]]
        assert subject["properties"]["type"]["const"] == sample_body(name)["subject"]["type"]
        assert subject["required"] == ["type", "id"]
        assert component["properties"]["sequence"]["minimum"] == 1
        assert component["additionalProperties"] is False
        assert component["properties"]["type"]["const"] == name
        assert component["properties"]["createdAt"]["format"] == "date-time"
        assert {"2XX", "410", "default"} <= set(delivery["responses"])
    # The old callback on registerWebhookEndpoint is gone: the webhooks say it all, once.
    assert all("callbacks" not in op for item in document["paths"].values() for op in item.values())


def test_any_event_is_one_schema_told_apart_by_its_type(document, contract):
    any_event = document["components"]["schemas"]["WebhookEvent"]
    assert any_event["discriminator"]["propertyName"] == "type"
    assert set(any_event["discriminator"]["mapping"]) == set(EVENT_NAMES)
    assert len(any_event["oneOf"]) == len(EVENT_NAMES)
    for name in EVENT_NAMES:  # `oneOf`: exactly one event's schema takes each body
        assert contract.problems("WebhookEvent", sample_body(name)) == [], name
    assert contract.problems("WebhookEvent", sample_body("deal.completed") | {"type": "x"})


def test_every_catalogue_sample_validates_against_its_events_schema(contract):
    for name in EVENT_NAMES:
        assert contract.body_problems(sample_body(name)) == [], name


def test_the_data_schema_is_the_one_the_publisher_dumps_through(document):
    """The published `data` has exactly the fields the event's marshmallow schema writes,
    every one required and none other allowed."""
    assert set(EVENT_DATA_SCHEMAS) == set(EVENT_NAMES)
    schemas = document["components"]["schemas"]
    for name in EVENT_NAMES:
        body = schemas[event_component_name(name)]
        data = schemas[body["properties"]["data"]["$ref"].rsplit("/", 1)[1]]
        written = [f.data_key for f in event_data_schema(name).dump_fields.values()]
        assert list(data["properties"]) == written, name
        assert data["required"] == written, name
        assert data["additionalProperties"] is False, name
        assert set(sample_data(name)) == set(written), name  # the catalogue keeps up too


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda body: body["data"].update(newField=1), "Additional properties"),
        (lambda body: body.update(newField=1), "Additional properties"),
        (lambda body: body["data"]["escrow"].update(newField=1), "Additional properties"),
        (lambda body: body["data"].pop("previousStatus"), "'previousStatus' is a required"),
        (lambda body: body["data"]["settlement"].pop("currency"), "'currency' is a required"),
        (lambda body: body["data"].update(status="done"), "'done' is not one of"),
        (lambda body: body["data"].update(acceptedAt="yesterday"), "is not a 'date-time'"),
        (lambda body: body.update(createdAt="2026-11-20 08:15"), "is not a 'date-time'"),
        (lambda body: body.update(apiVersion="2"), "'1' was expected"),
        (lambda body: body.update(type="deal.cancelled"), "'deal.completed' was expected"),
        (lambda body: body["data"].update(agreedAmountMinor="450"), "is not of type 'integer'"),
    ],
    ids=[
        "unknown-data-field",
        "unknown-envelope-field",
        "unknown-nested-field",
        "missing-field",
        "missing-nested-field",
        "not-a-status",
        "not-a-timestamp",
        "not-an-iso-timestamp",
        "another-version",
        "another-events-type",
        "a-string-amount",
    ],
)
def test_a_body_the_schema_does_not_describe_is_refused(contract, change, problem):
    assert "date-time" in FORMATS.checkers  # formats really are checked (rfc3339-validator)
    body = sample_body("deal.completed")
    mutated = copy.deepcopy(body)
    change(mutated)
    problems = contract.problems("DealCompletedEvent", mutated)
    assert any(problem in p for p in problems), problems
    assert contract.problems("DealCompletedEvent", body) == []


def test_a_field_a_publisher_adds_without_its_schema_is_refused(contract):
    """What a publisher writing one field more than its schema looks like to a receiver."""
    data = event_data(
        "verification.completed",
        {"brand_id": "brd_1", "kyb_status": "verified", "completed_at": None},
    )
    body = sample_body("verification.completed") | {"data": data | {"reviewer": "ops"}}
    assert any("'reviewer' was unexpected" in p for p in contract.body_problems(body))
    with pytest.raises(ValueError, match="no field for"):
        event_data("deal.completed", object(), reviewer="ops")


# --- real deliveries of every source ------------------------------------------------------------


@pytest.fixture
def receivers() -> Iterator[tuple[Receiver, Receiver]]:
    watching, failing = Receiver(), Receiver()
    yield watching, failing
    watching.close()
    failing.close()


@pytest.fixture
def worker(app, app_environ) -> Iterator[WorkerProcess]:
    """A real worker that calls an endpoint failing after one failed attempt."""
    process = WorkerProcess(app_environ, WEBHOOK_DISABLE_FAILURES="2")
    yield process
    process.stop()


def test_every_delivery_from_every_source_matches_its_events_schema(
    app, client, runner, brand, write_key, receivers, worker, contract
):
    """Every event name, from every place that publishes one (the platform's changes, a
    postback with and without a link, send-test, `events emit`, the operational events),
    delivered by a real worker to a real receiver: each body and its headers as documented."""
    watching, failing = receivers
    headers = {"X-Api-Key": write_key}

    def register(url: str, events: list[str]) -> dict:
        response = client.post(
            f"/api/v1/brand/{brand}/webhook/register-endpoint",
            json={"url": url, "events": events},
            headers=headers,
        )
        return assert_success(response, 201)

    watcher = register(watching.url, list(EVENT_NAMES))
    watching.secrets = [watcher["signingSecret"]]
    failing.reply_with(Reply(status=500))  # failing at once (half of 2), then 410: disabled
    failing.default = Reply(status=410)
    register(failing.url, ["conversion.recorded"])

    platform = Platform(app, brand)
    every_platform_event(platform)
    campaign_id = platform.campaign()
    link = platform.do(
        tracked_links.create_tracked_link,
        campaign_id=campaign_id,
        code="GLOW25",
        short_url="https://kola.link/GLOW25",
        destination_url="https://kolanaturals.example/glow",
    )
    for key, body in (
        (
            "order-20931-purchase",
            {"eventType": "purchase", "linkCode": "GLOW25", "valueMinor": 1250},
        ),
        (
            "order-20932-signup",
            {"eventType": "signup", "clickId": "clk_1", "metadata": {"a": [1, None]}},
        ),
    ):
        response = client.post(
            f"/api/v1/brand/{brand}/conversion/record-postback",
            json=body,
            headers=headers | {"Idempotency-Key": key},
        )
        assert_success(response, 201)
    assert_success(
        client.post(f"/api/v1/brand/{brand}/webhook/{watcher['id']}/send-test", headers=headers),
        202,
    )
    emitted = runner.invoke(args=["events", "emit", brand, "content.submitted"])
    assert emitted.exit_code == 0, emitted.output

    def published() -> int:
        with app.app_context():
            return (
                db.session.scalar(select(func.count()).where(WebhookEvent.brand_id == brand)) or 0
            )

    # Each event of the brand reaches the watcher once, the failing endpoint's two included.
    deadline = time.monotonic() + 60
    while True:
        names = {json.loads(r.body)["type"] for r in watching.received}
        operational = {"webhook.endpoint_failing", "webhook.endpoint_disabled"}
        if operational <= names and len(watching.received) >= published():
            break
        assert time.monotonic() < deadline, (sorted(names), worker.output()[-3000:])
        time.sleep(0.1)

    assert {json.loads(r.body)["type"] for r in watching.received} == set(EVENT_NAMES)
    assert link.id in {
        json.loads(r.body)["data"]["linkId"]
        for r in watching.received
        if json.loads(r.body)["type"] == "conversion.recorded"
    }
    for request in watching.received:
        assert request.signature_valid
        contract.assert_delivery(json.loads(request.body), request.headers)
    for request in failing.received:  # the deliveries that failed were well formed too
        contract.assert_delivery(json.loads(request.body), request.headers)


def test_the_header_schemas_take_what_the_signer_writes_during_a_rotation(contract):
    """Two secrets at once (a rotation's overlap): both signatures, in each header's form."""
    sent = delivery_headers(
        secret="whsec_new",
        previous_secret="whsec_old",
        timestamp=1795162500,
        raw_body=b"{}",
        event_name="deal.completed",
        event_id="evt_01jd3kw3x5y7z9a1b3c5d7e9f1",
        delivery_id="whd_01jd3kt0v2w4x6y8z0a2b4c6d801",
    )
    assert contract.header_problems("deal.completed", sent) == []
    assert contract.header_problems("deal.cancelled", sent) == [
        "X-Service-Event: 'deal.completed' is not 'deal.cancelled'"
    ]
