"""Publishing events: the one function every source of events calls (an outbox).

`publish_event` writes the event and one delivery per receiving endpoint in the caller's database
transaction, so an event exists exactly when what caused it was committed. It sends nothing and
touches no queue: the same statement sends a NOTIFY (services/wakeups.py), which PostgreSQL
delivers when that transaction commits (and only then), and the delivery loop of every worker
finds the new deliveries due in the database, woken by it or by its own poll a second later.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import ARRAY, String, Table, bindparam, insert, text

from extensions import db
from models import WebhookDelivery, WebhookEvent
from models.columns import new_id, utcnow
from models.event_catalog import API_VERSION, EVENT_NAMES, is_event_name
from models.webhook_delivery import PENDING
from models.webhook_endpoint import endpoint_is_open_sql
from schemas.base import iso_timestamp
from services.errors import ValidationFailed
from services.wakeups import NOTIFY_BRAND_SQL, notify_brand


@dataclass(frozen=True)
class PublishedEvent:
    event: WebhookEvent
    delivery_ids: list[str]


def publish_event(
    *,
    brand_id: str,
    name: str,
    data: dict,
    only_endpoint_ids: Collection[str] | None = None,
    except_endpoint_ids: Collection[str] | None = None,
    now: datetime | None = None,
) -> PublishedEvent:
    """Record the event `name` for the brand and a pending delivery to every active endpoint
    subscribed to it (or, with `only_endpoint_ids`, to those active endpoints whatever their
    subscriptions: the test ping; with `except_endpoint_ids`, to the subscribed ones but those:
    an operational event about one of them).

    The brand must exist (callers hold its records; `events emit` checks an id typed by hand):
    reading it again here would cost every postback a round trip.

    :raise ValidationFailed: unknown event name, or `data` that is not a JSON object.
    """
    if not is_event_name(name):
        raise ValidationFailed(
            "Unknown event name",
            {"name": [f"Must be one of: {', '.join(EVENT_NAMES)}."]},
        )
    if not isinstance(data, dict):
        raise ValidationFailed("Event data must be a JSON object", {"data": ["Not an object."]})
    now = now or utcnow()
    event_id = new_id("evt")
    body = _dumps(_envelope(event_id, name, brand_id, now) | {"data": data})
    event = WebhookEvent(id=event_id, brand_id=brand_id, name=name, body=body, created_at=now)
    # The caller's pending changes first (a brand created in this transaction, say): the
    # event's rows go in through Core, which does not flush the session.
    db.session.flush()
    # One round trip for the event and its fan-out (every event, a postback's among them, runs
    # this). The deliveries' ids share one new id and end in two digits, one per endpoint:
    # unique, and sorted together in the delivery log.
    statement, parameters = _PUBLISH, {}
    if only_endpoint_ids is not None:
        statement, parameters = _PUBLISH_TO_NAMED, {"only_endpoint_ids": list(only_endpoint_ids)}
    elif except_endpoint_ids is not None:
        statement = _PUBLISH_TO_OTHERS
        parameters = {"except_endpoint_ids": list(except_endpoint_ids)}
    delivered = (
        db.session.connection()
        .execute(
            statement,
            {
                "event_id": event_id,
                "brand_id": brand_id,
                "event_name": name,
                "body": body,
                "created_at": now,
                "delivery_id_base": new_id("whd"),
                **parameters,
            },
        )
        .all()
    )
    return PublishedEvent(
        event=event, delivery_ids=[row.id for row in delivered if row.id is not None]
    )


def event_body_around(
    *, event_id: str, name: str, brand_id: str, now: datetime, data: dict, keys: Sequence[str]
) -> tuple[str, str]:
    """The body `publish_event` would write, cut where the consecutive `keys` of `data` go:
    (head, tail) such that the body is `head + '"k1":v1,"k2":v2' + tail` (compact JSON, the
    keys in that order). For a statement that learns those values itself and writes the event
    in the same round trip (a postback's link, campaign and deal)."""
    names = list(data)
    start = names.index(keys[0])
    if names[start : start + len(keys)] != list(keys):
        raise ValueError(f"{keys} are not consecutive in the event data")
    before = {key: data[key] for key in names[:start]}
    after = {key: data[key] for key in names[start + len(keys) :]}
    # json.dumps writes an object as "{" + members joined by "," + "}": cut at the members.
    head = _dumps(_envelope(event_id, name, brand_id, now))[:-1] + ',"data":'
    head += _dumps(before)[:-1] + ("," if before else "")
    tail = ("," if after else "") + _dumps(after)[1:] + "}"
    return head, tail


def deliver_again(
    *,
    brand_id: str,
    endpoint_id: str,
    events: Sequence[tuple[str, str]],
    now: datetime | None = None,
) -> list[str]:
    """One more delivery of each stored event, `(event id, event name)`, to one endpoint
    (redeliver, recover): the same body, a new delivery id. Their ids, which sort in the order
    given, so the worker sends them in that order."""
    now = now or utcnow()
    delivery_ids = [new_id("whd") for _ in events]
    if delivery_ids:
        db.session.execute(
            _INSERT_DELIVERY,
            [
                {
                    "id": delivery_id,
                    "brand_id": brand_id,
                    "endpoint_id": endpoint_id,
                    "event_id": event_id,
                    "event_name": event_name,
                    "status": PENDING,
                    "attempt_count": 0,
                    "next_attempt_at": now,
                    "created_at": now,
                }
                for delivery_id, (event_id, event_name) in zip(delivery_ids, events, strict=True)
            ],
        )
        notify_brand(brand_id)
    return delivery_ids


def _envelope(event_id: str, name: str, brand_id: str, now: datetime) -> dict:
    return {
        "id": event_id,
        "type": name,
        "createdAt": iso_timestamp(now),
        "brandId": brand_id,
        "apiVersion": API_VERSION,
    }


def _dumps(value: dict) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# A declarative model's `__table__` is typed as any FromClause; a mapped_column model's is a Table.
_INSERT_DELIVERY = insert(cast(Table, WebhookDelivery.__table__))
# Who receives an event, decided here only: the brand's open endpoints subscribed to it; for the
# test ping (`only_endpoint_ids`), the brand's open endpoints among those named, whatever
# their subscriptions; for an operational event (`except_endpoint_ids`), the subscribed ones
# but the endpoint it is about.
_SUBSCRIBED = endpoint_is_open_sql("endpoint") + " AND endpoint.events ? event.name"
_NAMED = endpoint_is_open_sql("endpoint") + " AND endpoint.id = ANY(:only_endpoint_ids)"
_SUBSCRIBED_OTHERS = _SUBSCRIBED + " AND endpoint.id <> ALL(:except_endpoint_ids)"


# The event, and a pending delivery to each endpoint that `{receives}` it (at most
# MAX_ENDPOINTS_PER_BRAND, so two digits number them), as two CTEs of one statement: `event`
# inserts the event from the rows of `{source}` (one row, or none to publish nothing) with the
# body `{body}`, an SQL expression; `deliveries` returns each delivery's (id, endpoint_id). The
# statement binds :event_id, :brand_id, :event_name, :created_at, :delivery_id_base and
# :pending (PENDING).
_PUBLISH_CTES_TEMPLATE = """
    event AS (
        INSERT INTO webhook_events (id, brand_id, name, body, created_at)
        SELECT :event_id, :brand_id, :event_name, {body}, :created_at FROM {source}
        RETURNING id, brand_id, name, created_at
    ),
    deliveries AS (
        INSERT INTO webhook_deliveries (
            id, brand_id, endpoint_id, event_id, event_name, status, attempt_count,
            next_attempt_at, created_at
        )
        SELECT :delivery_id_base
                   || lpad(CAST(row_number() OVER (ORDER BY endpoint.id) AS TEXT), 2, '0'),
               event.brand_id, endpoint.id, event.id, event.name, :pending, 0,
               event.created_at, event.created_at
        FROM event JOIN webhook_endpoints AS endpoint ON endpoint.brand_id = event.brand_id
        WHERE {receives}
        RETURNING id, endpoint_id
    ),
    woken AS (
        SELECT {notify} FROM event
    )"""


def _publish_ctes(receives: str) -> str:
    return _PUBLISH_CTES_TEMPLATE.replace("{receives}", receives).replace(
        "{notify}", NOTIFY_BRAND_SQL.format(brand="event.brand_id")
    )


# For statements that publish an event themselves (a postback's): `.format(source=, body=)`.
# `woken` sends the wake-up (services/wakeups.py) with the commit: a statement must read it
# (`WOKEN`) for PostgreSQL to run it.
PUBLISH_CTES = _publish_ctes(_SUBSCRIBED)
WOKEN = "(SELECT count(*) FROM woken)"


def _publish_statement(ctes: str):
    return text(
        "WITH"  # noqa: S608 - constant SQL, put together at import
        + ctes.format(body=":body", source="(SELECT 1) AS one")
        # One row even when no endpoint receives the event, so that the wake-up is sent.
        + "\n    SELECT deliveries.id, deliveries.endpoint_id FROM "
        + WOKEN
        + " AS notified LEFT JOIN deliveries ON true"
    ).bindparams(
        bindparam("created_at", type_=WebhookEvent.__table__.c.created_at.type),
        pending=PENDING,
    )


_PUBLISH = _publish_statement(PUBLISH_CTES)
_PUBLISH_TO_NAMED = _publish_statement(_publish_ctes(_NAMED)).bindparams(
    bindparam("only_endpoint_ids", type_=ARRAY(String))
)
_PUBLISH_TO_OTHERS = _publish_statement(_publish_ctes(_SUBSCRIBED_OTHERS)).bindparams(
    bindparam("except_endpoint_ids", type_=ARRAY(String))
)
