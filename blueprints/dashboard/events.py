"""Event types: the catalogue of SPEC section 6 grouped by resource, each event with what it
means, the body a receiver gets for it, the default subscription, and which of the brand's
endpoints subscribe to it (CONTRACT 6.1). The events that happened are the Events page
(blueprints/dashboard/event_log.py).

The bodies are the OpenAPI document's samples (the catalogue's `sample_data`, as `flask events
emit` uses it, in the envelope `publish_event` writes), with this brand's id.
"""

from __future__ import annotations

import json

from blueprints.api.webhook_events import sample_body
from blueprints.dashboard import dashboard
from blueprints.dashboard.rendering import render
from blueprints.dashboard.session import current_caller, signed_in
from models.event_catalog import DEFAULT_SUBSCRIPTION, EVENT_TYPES, TEST_EVENT
from models.event_subjects import subject_type_of
from schemas.webhooks import EndpointSchema
from services.retention import retention_period
from services.webhook_endpoints import list_endpoints

_endpoints = EndpointSchema(many=True)


def _sample_body(name: str, brand_id: str) -> str:
    return json.dumps(sample_body(name, brand_id), indent=2, ensure_ascii=False)


@dashboard.get("/event-types")
@signed_in()
def event_types():
    brand_id = current_caller().brand_id
    endpoints = _endpoints.dump(list_endpoints(brand_id))
    groups: dict[str, list[dict]] = {}
    for event in EVENT_TYPES.values():
        groups.setdefault(event.resource, []).append(
            {
                "name": event.name,
                "description": event.description,
                "default": event.name in DEFAULT_SUBSCRIPTION,
                "test": event.name == TEST_EVENT,
                "subject_type": subject_type_of(event.name),
                "subscribers": [e for e in endpoints if event.name in e["events"]],
                "sample": _sample_body(event.name, brand_id),
            }
        )
    return render(
        "dashboard/events.html",
        groups=list(groups.items()),
        endpoints=endpoints,
        default_subscription=DEFAULT_SUBSCRIPTION,
        retention_days=retention_period().days,
    )
