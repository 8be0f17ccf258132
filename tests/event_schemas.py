"""A delivery held to the OpenAPI document's `webhooks` entry of its event, as a receiver would
hold it: the body validated with `jsonschema` (Draft 2020-12, formats checked) against the
event's published schema, each header against its parameter's schema."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from flask import Flask
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from models.event_catalog import sample_data
from models.event_subjects import event_subject

_DOCUMENT = "urn:brand-api:openapi"
FORMATS = Draft202012Validator.FORMAT_CHECKER


class WebhookContract:
    """What `document` (GET /api/v1/openapi.json) promises of each event's deliveries."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.document = document
        self.webhooks: Mapping[str, Any] = document["webhooks"]
        self._registry = Registry().with_resource(
            _DOCUMENT, Resource.from_contents(document, default_specification=DRAFT202012)
        )
        self._validators = {
            name: self._validator(self.body_schema_ref(name)) for name in self.webhooks
        }

    def _validator(self, ref: str) -> Draft202012Validator:
        return Draft202012Validator(
            {"$ref": _DOCUMENT + ref}, registry=self._registry, format_checker=FORMATS
        )

    def problems(self, component: str, value: Any) -> list[str]:
        """Why `value` is not valid against the component schema named `component`."""
        validator = self._validator(f"#/components/schemas/{component}")
        return [error.message for error in validator.iter_errors(value)]

    def body_schema_ref(self, name: str) -> str:
        return self.webhooks[name]["post"]["requestBody"]["content"]["application/json"]["schema"][
            "$ref"
        ]

    def body_problems(self, body: Mapping[str, Any]) -> list[str]:
        """Why `body` is not a body of the event its `type` names; empty when it is one."""
        name = body.get("type")
        if name not in self._validators:
            return [f"type {name!r} has no webhooks entry"]
        return [
            f"{name}: {'/'.join(map(str, error.absolute_path)) or '(body)'}: {error.message}"
            for error in self._validators[name].iter_errors(body)
        ]

    def header_problems(self, name: str, headers: Mapping[str, str]) -> list[str]:
        """Why `headers` are not those of a delivery of the event `name`."""
        sent = {header.lower(): value for header, value in headers.items()}
        problems = []
        for parameter in self.webhooks[name]["post"]["parameters"]:
            value = sent.get(parameter["name"].lower())
            if value is None:
                problems.append(f"{parameter['name']} missing")
                continue
            schema = parameter["schema"]
            if "pattern" in schema and not re.search(schema["pattern"], value):
                problems.append(f"{parameter['name']}: {value!r} is not {schema['pattern']}")
            if "enum" in schema and value not in schema["enum"]:
                problems.append(f"{parameter['name']}: {value!r} is not one of {schema['enum']}")
            if "const" in schema and value != schema["const"]:
                problems.append(f"{parameter['name']}: {value!r} is not {schema['const']!r}")
        return problems

    def assert_delivery(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> None:
        problems = self.body_problems(body) + self.header_problems(str(body["type"]), headers)
        assert problems == [], "\n".join(problems)


def contract_of(app: Flask) -> WebhookContract:
    """The contract of the document `app` serves (built once per app)."""
    if "test_webhook_contract" not in app.extensions:
        response = app.test_client().get("/api/v1/openapi.json")
        assert response.status_code == 200
        app.extensions["test_webhook_contract"] = WebhookContract(response.get_json())
    return app.extensions["test_webhook_contract"]


def sample_body(name: str) -> dict[str, Any]:
    """A delivery's body of the event `name` with the catalogue's sample data, the first event
    of its subject."""
    event_id = "evt_01jd3kw3x5y7z9a1b3c5d7e9f1"
    subject = event_subject(name, sample_data(name), event_id=event_id)
    return {
        "id": event_id,
        "type": name,
        "createdAt": "2026-11-20T08:15:00.000Z",
        "brandId": "brd_01jd3k7a9b1c3d5e7f9g1h3j5k",
        "apiVersion": "1",
        "subject": {"type": subject.type, "id": subject.id},
        "sequence": 1,
        "data": sample_data(name),
    }
