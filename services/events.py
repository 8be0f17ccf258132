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

from sqlalchemy import ARRAY, String, bindparam, select, text

from extensions import db
from models import WebhookDelivery, WebhookEvent
from models.columns import new_id, utcnow
from models.event_catalog import API_VERSION, EVENT_NAMES, is_event_name
from models.event_subjects import EventSubject, event_subject
from models.webhook_delivery import PENDING
from models.webhook_endpoint import SUBJECT_ORDERING, endpoint_is_open_sql
from models.webhook_event import DISABLED, FILTERED
from observability.tracing import publishing_traceparent
from schemas.base import iso_timestamp
from services.delivery.queue import ENQUEUE_CTES, RECEIVING_COLUMNS
from services.errors import Conflict, ValidationFailed
from services.wakeups import NOTIFY_BRAND_SQL


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
    that receives it: subscribed to it, and either filtering no campaigns or filtering the
    event's (`webhook.*` pass every filter). With `only_endpoint_ids`: to those active endpoints
    whatever their subscriptions and filters (the test ping); with `except_endpoint_ids`: to the
    receiving ones but those (an operational event about one of them).

    The event gets its subject and its number in that subject's life (CONTRACT 12.2) in the
    same statement: publishers of one subject take turns on its counter's row until each
    commits, so the numbers are gapless and in commit order.

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
    subject = event_subject(name, data, event_id=event_id)
    body_head, body_tail = event_body_parts(
        event_id=event_id, name=name, brand_id=brand_id, now=now, subject=subject, data=data
    )
    event = WebhookEvent(
        id=event_id,
        brand_id=brand_id,
        name=name,
        created_at=now,
        subject_type=subject.type,
        subject_id=subject.id,
        campaign_id=subject.campaign_id,
    )
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
    rows = (
        db.session.connection()
        .execute(
            statement,
            {
                "event_id": event_id,
                "brand_id": brand_id,
                "event_name": name,
                "body_head": body_head,
                "body_tail": body_tail,
                "created_at": now,
                "delivery_id_base": new_id("whd"),
                "traceparent": publishing_traceparent(),
                **subject_parameters(subject),
                **parameters,
            },
        )
        .all()
    )
    event.sequence = rows[0].sequence
    event.body = body_head + str(event.sequence) + body_tail
    return PublishedEvent(event=event, delivery_ids=[row.id for row in rows if row.id is not None])


def subject_parameters(subject: EventSubject) -> dict[str, str | None]:
    """What the publishing statements bind of the event's subject."""
    return {
        "subject_type": subject.type,
        "subject_id": subject.id,
        "subject_key": subject.key,
        "campaign_id": subject.campaign_id,
    }


def event_body_parts(
    *,
    event_id: str,
    name: str,
    brand_id: str,
    now: datetime,
    subject: EventSubject,
    data: dict,
    sequence: int | None = None,
) -> tuple[str, str]:
    """The body of an event, compact JSON, cut where its `sequence` goes: `head + N + tail`,
    for the statement that numbers the event. With `sequence` known, the whole body is
    `head + tail`."""
    envelope = _envelope(event_id, name, brand_id, now) | {
        "subject": {"type": subject.type, "id": subject.id}
    }
    head = _dumps(envelope)[:-1] + ',"sequence":'
    tail = ',"data":' + _dumps(data) + "}"
    if sequence is not None:
        return head + str(sequence), tail
    return head, tail


def event_body_around(
    *,
    event_id: str,
    name: str,
    brand_id: str,
    now: datetime,
    subject: EventSubject,
    sequence: int,
    data: dict,
    keys: Sequence[str],
) -> tuple[str, str]:
    """The body `publish_event` would write (its `sequence` given), cut where the consecutive
    `keys` of `data` go: (head, tail) such that the body is `head + '"k1":v1,"k2":v2' + tail`
    (compact JSON, the keys in that order). For a statement that learns those values itself
    and writes the event in the same round trip (a postback's link, campaign and deal)."""
    names = list(data)
    start = names.index(keys[0])
    if names[start : start + len(keys)] != list(keys):
        raise ValueError(f"{keys} are not consecutive in the event data")
    before = {key: data[key] for key in names[:start]}
    after = {key: data[key] for key in names[start + len(keys) :]}
    envelope_head, _ = event_body_parts(
        event_id=event_id,
        name=name,
        brand_id=brand_id,
        now=now,
        subject=subject,
        data={},
        sequence=sequence,
    )
    # json.dumps writes an object as "{" + members joined by "," + "}": cut at the members.
    head = envelope_head + ',"data":' + _dumps(before)[:-1] + ("," if before else "")
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
    (redeliver, recover, resend): the same body, a new delivery id, due now. Their ids, which
    sort in the order given, so the worker sends them in that order (an endpoint that orders
    by subject holds each behind any earlier one of its subject still pending).

    :raise Conflict: one of the events was erased (CONTRACT 13.3): it is never sent again."""
    now = now or utcnow()
    delivery_ids = [new_id("whd") for _ in events]
    # Read under a share lock, which an erasure's batch waits for (and this for it): an event
    # is erased either after these deliveries exist (and ends them) or before (and refuses).
    erased = [
        row.id
        for row in db.session.execute(
            select(WebhookEvent.id, WebhookEvent.is_erased.label("erased"))
            .where(WebhookEvent.id.in_({event_id for event_id, _ in events}))
            .order_by(WebhookEvent.id)
            .with_for_update(read=True, of=WebhookEvent)
        )
        if row.erased
    ]
    if erased:
        raise Conflict(f"Event {erased[0]} was erased: its data is gone and it is not sent again")
    if delivery_ids:
        db.session.execute(
            _DELIVER_AGAIN,
            {
                "delivery_ids": delivery_ids,
                "event_ids": [event_id for event_id, _ in events],
                "event_names": [event_name for _, event_name in events],
                "brand_id": brand_id,
                "endpoint_id": endpoint_id,
                "created_at": now,
            },
        )
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


# Who receives an event, decided here only, and why a subscribed endpoint that exists does not
# (CONTRACT 13.2: stored with the event, as `passed_over`). Each rule is (the endpoints it
# considers, which of them receive it, why one considered is passed over, or NULL):
# - an event of the brand: its endpoints subscribed to it; the open ones whose campaign filter
#   lets it through (CONTRACT 12.3) receive it; the others were `filtered` (the filter first:
#   a closed endpoint that filters the event out would not have got it open) or `disabled`;
# - the test ping and an example (`only_endpoint_ids`): the open endpoints named, whatever
#   their subscriptions and filters; none is passed over (the others were not addressed);
# - an operational event (`except_endpoint_ids`): as an event of the brand, but the endpoint
#   it is about, which the service filters out (`disabled` when it was closed).
# An endpoint that existed and got nothing and is not listed was not subscribed.
_OPEN = endpoint_is_open_sql("endpoint")
_FILTERED_IN = (
    "(endpoint.campaign_ids IS NULL OR CAST(:event_name AS varchar) LIKE 'webhook.%'"
    " OR COALESCE({campaign} = ANY(endpoint.campaign_ids), false))"
)
_SUBSCRIBED_TO_IT = "endpoint.events ? CAST(:event_name AS varchar)"
_SUBSCRIBED = (
    _SUBSCRIBED_TO_IT,
    f"{_OPEN} AND {_FILTERED_IN}",
    f"CASE WHEN NOT {_FILTERED_IN} THEN '{FILTERED}' WHEN NOT ({_OPEN}) THEN '{DISABLED}' END",
)
_NAMED = ("endpoint.id = ANY(:only_endpoint_ids)", _OPEN, "NULL")
_SUBSCRIBED_OTHERS = (
    _SUBSCRIBED_TO_IT,
    f"{_OPEN} AND {_FILTERED_IN} AND endpoint.id <> ALL(:except_endpoint_ids)",
    f"CASE WHEN NOT {_FILTERED_IN} THEN '{FILTERED}' WHEN NOT ({_OPEN}) THEN '{DISABLED}'"
    f" WHEN endpoint.id = ANY(:except_endpoint_ids) THEN '{FILTERED}' END",
)

# The event and its fan-out, as CTEs of one statement:
# - `subject_counted` (with `{sequence}` reading it) numbers the event in its subject's life; a
#   subject's first event starts after any stored before its counter existed (a postback's
#   conversion, numbered 1 without one);
# - `event` inserts the event from the rows of `{source}` (one row, or none to publish nothing)
#   with the body `{body}` and the campaign `{campaign}`, SQL expressions;
# - `considered` locks the endpoints the rule considers FOR KEY SHARE (one closed meanwhile is
#   read again as it is now); `event` keeps why it passed over those that do not receive it,
#   `receiving` are the others; `deliveries` and `queued` queue the work
#   (services/delivery/queue.py);
# - `woken` sends the wake-up (services/wakeups.py) with the commit: a statement must read it
#   (`WOKEN`) for PostgreSQL to run it.
# The statement binds :event_id, :brand_id, :event_name, :created_at, :subject_type,
# :subject_id, :subject_key, :delivery_id_base, :pending, :subject_ordering and :traceparent
# (`publishing_traceparent()`: the publishing request's trace context, CONTRACT 13.6).
SUBJECT_COUNTED = """
    subject_counted AS (
        INSERT INTO webhook_event_subjects AS counter (
            brand_id, subject_type, subject_id, last_sequence
        )
        SELECT given.brand_id, given.subject_type, given.subject_id,
               1 + COALESCE((SELECT max(stored.sequence) FROM webhook_events AS stored
                             WHERE stored.brand_id = given.brand_id
                               AND stored.subject_type = given.subject_type
                               AND stored.subject_id = given.subject_id), 0)
        FROM (SELECT CAST(:brand_id AS varchar) AS brand_id,
                     CAST(:subject_type AS varchar) AS subject_type,
                     CAST(:subject_id AS varchar) AS subject_id) AS given
        ON CONFLICT (brand_id, subject_type, subject_id)
        DO UPDATE SET last_sequence = counter.last_sequence + 1
        RETURNING last_sequence
    ),"""
COUNTED_SEQUENCE = "(SELECT last_sequence FROM subject_counted)"
_PUBLISH_CTES_TEMPLATE = (
    """
    considered AS (
        SELECT """  # noqa: S608 - constant SQL, put together at import
    + RECEIVING_COLUMNS
    + """, {receives} AS receives, {passed_over} AS passed_over
        FROM {source} CROSS JOIN webhook_endpoints AS endpoint
        WHERE endpoint.brand_id = :brand_id AND endpoint.deleted_at IS NULL AND {considers}
        FOR KEY SHARE OF endpoint
    ),
    event AS (
        INSERT INTO webhook_events (
            id, brand_id, name, body, created_at, subject_type, subject_id, sequence,
            campaign_id, traceparent, passed_over
        )
        SELECT :event_id, :brand_id, :event_name, {body}, :created_at, :subject_type,
               :subject_id, {sequence}, {campaign}, :traceparent,
               (SELECT jsonb_object_agg(considered.id, considered.passed_over)
                FROM considered WHERE considered.passed_over IS NOT NULL)
        FROM {source}
        RETURNING id, brand_id, name, created_at, sequence, campaign_id
    ),
    receiving AS (
        SELECT * FROM considered WHERE receives
    ),"""
    + ENQUEUE_CTES.replace(
        "{delivery_id}",
        ":delivery_id_base || lpad(CAST(row_number() OVER (ORDER BY receiving.id) AS TEXT), 2,"
        " '0')",
    )
    .replace("{created_at}", "event.created_at")
    .replace("{deliveries_from}", "event CROSS JOIN receiving")
    .replace("{event_of_delivery}", "event ON event.id = deliveries.event_id")
    .replace("{subject_key}", ":subject_key")
    + """,
    woken AS (
        SELECT {notify} FROM event
    )"""
)


def _publish_ctes(
    rule: tuple[str, str, str], notify: str = NOTIFY_BRAND_SQL.format(brand="event.brand_id")
) -> str:
    considers, receives, passed_over = rule
    return (
        _PUBLISH_CTES_TEMPLATE.replace("{considers}", considers)
        .replace("{receives}", receives)
        .replace("{passed_over}", passed_over)
        .replace("{notify}", notify)
    )


# For statements that publish an event themselves (a postback's):
# `.format(source=, body=, sequence=, campaign=)`.
PUBLISH_CTES = _publish_ctes(_SUBSCRIBED)
# The same, waking nobody: the caller wakes the brand after its commit (a postback:
# services/wakeups.py, `wake_after_commit`, says why).
PUBLISH_CTES_WAKING_NOBODY = _publish_ctes(_SUBSCRIBED, notify="NULL")
WOKEN = "(SELECT count(*) FROM woken)"


def _publish_statement(ctes: str):
    return text(
        "WITH"  # noqa: S608 - constant SQL, put together at import
        + SUBJECT_COUNTED
        + ctes.format(
            body=":body_head || CAST(" + COUNTED_SEQUENCE + " AS TEXT) || :body_tail",
            source="(SELECT 1) AS one",
            sequence=COUNTED_SEQUENCE,
            campaign=":campaign_id",
        )
        # One row even when no endpoint receives the event, so that the wake-up is sent.
        + "\n    SELECT deliveries.id, deliveries.endpoint_id, "
        + COUNTED_SEQUENCE
        + " AS sequence FROM "
        + WOKEN
        + " AS notified LEFT JOIN deliveries ON true"
    ).bindparams(
        bindparam("created_at", type_=WebhookEvent.__table__.c.created_at.type),
        pending=PENDING,
        subject_ordering=SUBJECT_ORDERING,
    )


_PUBLISH = _publish_statement(PUBLISH_CTES)
_PUBLISH_TO_NAMED = _publish_statement(_publish_ctes(_NAMED)).bindparams(
    bindparam("only_endpoint_ids", type_=ARRAY(String))
)
_PUBLISH_TO_OTHERS = _publish_statement(_publish_ctes(_SUBSCRIBED_OTHERS)).bindparams(
    bindparam("except_endpoint_ids", type_=ARRAY(String))
)

# Stored events again to one endpoint, whatever its subscriptions (the caller checked it is
# open): the same fan-out, for the events given (`given`: delivery id, event id, in order).
_DELIVER_AGAIN = text(
    """
    WITH given AS (
        SELECT * FROM unnest(CAST(:delivery_ids AS varchar[]), CAST(:event_ids AS varchar[]))
                      WITH ORDINALITY AS given(delivery_id, event_id, place)
    ),
    receiving AS (
        SELECT """  # noqa: S608 - constant SQL, put together at import
    + RECEIVING_COLUMNS
    + """
        FROM webhook_endpoints AS endpoint
        WHERE endpoint.id = :endpoint_id AND endpoint.brand_id = :brand_id
        FOR KEY SHARE OF endpoint
    ),"""
    + ENQUEUE_CTES.replace("{delivery_id}", "given.delivery_id")
    .replace("{created_at}", ":created_at")
    .replace(
        "{deliveries_from}",
        "given JOIN webhook_events AS event ON event.id = given.event_id CROSS JOIN receiving",
    )
    .replace("{event_of_delivery}", "webhook_events AS event ON event.id = deliveries.event_id")
    .replace("{subject_key}", "event.subject_type || ':' || event.subject_id")
    + """,
    woken AS (
        SELECT """
    + NOTIFY_BRAND_SQL.format(brand=":brand_id")
    + """
    )
    SELECT count(*) FROM woken
    """
).bindparams(
    bindparam("created_at", type_=WebhookDelivery.__table__.c.created_at.type),
    pending=PENDING,
    subject_ordering=SUBJECT_ORDERING,
)
