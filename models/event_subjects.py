"""Which record an event is a step of (CONTRACT 12.2), and which campaign that record belongs to
(CONTRACT 12.3), read from the event's name and `data`: the one rule for both, used by every
publisher (services/events.py) and, in SQL, by migration 0014 for the events stored before it.

- a deal's life: `deal.*`, and `content.*`, `placement.*`, `escrow.*`, `dispute.*`, which all
  name their deal (`dealId`);
- a campaign's: `campaign.*`;
- a conversion's: `conversion.recorded` (its only event);
- an endpoint's: `webhook.*` (`endpointId`);
- the brand's own: `verification.completed`. CONTRACT 12.2 lists `verification.*` with the deal,
  but this service's verification event is the brand's KYB check, which has no deal: its
  subject is the brand (docs/webhooks.md says so).

An event whose `data` does not name its record (only hand-made data in tests and benchmarks:
every publisher dumps `data` through the event's schema, and `events emit` checks it against
that schema) stands alone: its subject is the event itself, `event:evt_…`, sequence 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from models.event_catalog import is_event_name
from models.webhook_event import SUBJECT_ID_MAX_LENGTH

DEAL = "deal"
CAMPAIGN = "campaign"
CONVERSION = "conversion"
ENDPOINT = "endpoint"
BRAND = "brand"
EVENT = "event"
SUBJECT_TYPES = (DEAL, CAMPAIGN, CONVERSION, ENDPOINT, BRAND, EVENT)

# Event family (the name before the dot) -> (subject type, the data key of its id).
_FAMILIES: Mapping[str, tuple[str, str]] = {
    "deal": (DEAL, "id"),
    "content": (DEAL, "dealId"),
    "placement": (DEAL, "dealId"),
    "escrow": (DEAL, "dealId"),
    "dispute": (DEAL, "dealId"),
    "campaign": (CAMPAIGN, "id"),
    "conversion": (CONVERSION, "id"),
    "webhook": (ENDPOINT, "endpointId"),
    "verification": (BRAND, "brandId"),
}
# Events that every endpoint's campaign filter lets through (CONTRACT 12.3).
UNFILTERED_FAMILY = "webhook"


@dataclass(frozen=True)
class EventSubject:
    type: str
    id: str
    # The campaign the subject belongs to, or None (webhook.*, the brand's own, a conversion
    # attributed to no link).
    campaign_id: str | None

    @property
    def key(self) -> str:
        return subject_key(self.type, self.id)


def subject_key(subject_type: str, subject_id: str) -> str:
    """`type:id`: how fetch-events' `subject` names one, and how the delivery queue groups it."""
    return f"{subject_type}:{subject_id}"


def subject_type_of(name: str) -> str:
    """The type of the subject of every event `name` whose `data` names its record (every real
    one): what the OpenAPI document states of its body.

    :raise ValueError: not an event name."""
    if not is_event_name(name):
        raise ValueError(f"{name!r} is not an event name")
    return _FAMILIES[name.split(".", 1)[0]][0]


def event_subject(name: str, data: Mapping[str, Any], *, event_id: str) -> EventSubject:
    """The subject of the event `name` (id `event_id`) with this `data` (camelCase, as
    published).

    :raise ValueError: not an event name.
    """
    if not is_event_name(name):
        raise ValueError(f"{name!r} is not an event name")
    family = name.split(".", 1)[0]
    subject_type, id_key = _FAMILIES[family]
    subject_id = data.get(id_key)
    if not isinstance(subject_id, str) or not 0 < len(subject_id) <= SUBJECT_ID_MAX_LENGTH:
        return EventSubject(type=EVENT, id=event_id, campaign_id=None)
    if family == UNFILTERED_FAMILY or subject_type == BRAND:
        campaign_id = None
    elif subject_type == CAMPAIGN:
        campaign_id = subject_id
    else:
        found = data.get("campaignId")
        campaign_id = found if isinstance(found, str) and found else None
    return EventSubject(type=subject_type, id=subject_id, campaign_id=campaign_id)


def parse_subject_key(value: str) -> tuple[str, str]:
    """fetch-events' `subject=type:id`.

    :raise ValueError: not `type:id` with a known type and a non-empty id."""
    subject_type, separator, subject_id = value.partition(":")
    if not separator or subject_type not in SUBJECT_TYPES or not subject_id:
        raise ValueError(f"Must be type:id, type one of {', '.join(SUBJECT_TYPES)}.")
    return subject_type, subject_id
