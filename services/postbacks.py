"""Recording a conversion postback exactly once per `Idempotency-Key` (SPEC sections 2 and 4,
CONTRACT section 5).

Partners retry aggressively and in parallel, so the key is taken, the conversion stored, the
link's counters raised and `conversion.recorded` published in ONE database transaction:

- The key is taken by the INSERT of the conversion itself (unique per brand and key). On
  PostgreSQL the same statement first takes a transaction-scoped advisory lock on the key,
  without waiting: a second request with the key while the first is still in its transaction
  finds the lock taken and answers 409 at once instead of queueing behind it.
- A request that dies lets go of the key with its transaction: PostgreSQL rolls back when the
  connection drops. A request that hangs (the process is stopped, a statement waits forever)
  is ended by the database when the in-flight window has passed (the statement and
  idle-in-transaction timeouts are set for this transaction by that same statement), and then
  the key can be taken over. Nothing of a dead request is ever half-written.
- A key whose conversion is committed is a replay forever: the first conversion is returned,
  whatever the new body, and nothing is counted or published again.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from datetime import datetime

from psycopg.types.json import Json
from sqlalchemy import BigInteger, String, Text, bindparam, select, text

from extensions import db
from models import Conversion, TrackedLink
from models.columns import new_id, utcnow
from models.event_subjects import CONVERSION as CONVERSION_SUBJECT
from models.event_subjects import EventSubject
from models.money import NGN
from models.tracked_link import CONVERSION_COUNT_SLOTS
from models.webhook_delivery import PENDING
from models.webhook_endpoint import SUBJECT_ORDERING
from observability.tracing import publishing_traceparent
from schemas.events import event_data
from services.errors import Conflict
from services.events import (
    PUBLISH_CTES_WAKING_NOBODY,
    WOKEN,
    event_body_around,
    subject_parameters,
)
from services.failpoints import failpoint
from services.psycopg_direct import fetch_first_on_psycopg, psycopg_sql
from services.wakeups import wake_after_commit

DEFAULT_IN_FLIGHT_WINDOW_SECONDS = 120
# In flight almost always means "a few milliseconds from committing".
CONFLICT_RETRY_AFTER_SECONDS = 1
CONVERSION_RECORDED = "conversion.recorded"
# Namespaces this module's advisory locks among any others on the database.
_LOCK_NAMESPACE = b"brand-api:postback:"


@dataclass(frozen=True)
class Postback:
    """The body of a postback, validated (schemas.conversions.PostbackSchema)."""

    event_type: str
    click_id: str | None = None
    link_code: str | None = None
    value_minor: int = 0
    currency: str = NGN
    metadata: dict = field(default_factory=dict)

    @property
    def attributed(self) -> bool:
        # SPEC 2, rule 2, read literally (CONTRACT 5): present, whether or not it is known.
        return self.link_code is not None or self.click_id is not None


@dataclass
class RecordedConversion:
    """A conversion as a postback's answer and event carry it: the row's columns, plain.

    Not an ORM instance, because nothing here goes through the session (the statements are Core
    or psycopg), and building and reading an instrumented `Conversion` was 7% of a postback's CPU
    (callgrind: 3.75 -> 3.44 million instructions per postback)."""

    id: str
    brand_id: str
    idempotency_key: str
    event_type: str
    click_id: str | None
    link_code: str | None
    value_minor: int
    currency: str
    details: dict
    attributed: bool
    created_at: datetime
    link_id: str | None = None
    campaign_id: str | None = None
    deal_id: str | None = None


_RECORDED_FIELDS = tuple(column.name for column in fields(RecordedConversion))


@dataclass(frozen=True)
class PostbackOutcome:
    conversion: RecordedConversion
    replay: bool


def record_postback(
    *,
    brand_id: str,
    idempotency_key: str,
    postback: Postback,
    in_flight_window: int = DEFAULT_IN_FLIGHT_WINDOW_SECONDS,
    now: datetime | None = None,
) -> PostbackOutcome:
    """Store the postback as a new conversion, or return the conversion stored under the key.

    Runs in the caller's transaction, which the caller commits. `idempotency_key` has been
    checked against `models.conversion.IDEMPOTENCY_KEY_PATTERN`. On PostgreSQL the rest of
    that transaction is bounded by `in_flight_window` (seconds): a statement or an idle pause
    longer than that ends it.

    :raise Conflict: another request with this key is still in its transaction.
    """
    now = now or utcnow()
    conversion = RecordedConversion(
        id=new_id("conv", at=now),
        brand_id=brand_id,
        idempotency_key=idempotency_key,
        event_type=postback.event_type,
        click_id=postback.click_id,
        link_code=postback.link_code,
        value_minor=postback.value_minor,
        currency=postback.currency,
        details=postback.metadata,
        attributed=postback.attributed,
        created_at=now,
    )
    # Pending changes of the caller's (a link created in this transaction, say) first: the
    # statements below go through Core, which does not flush the session.
    db.session.flush()
    connection = db.session.connection()
    parameters = {f"new_{name}": getattr(conversion, attribute) for name, attribute in _INSERTED}
    return _record_in_one_statement(connection, conversion, parameters, in_flight_window)


def _record_in_one_statement(
    connection, conversion: RecordedConversion, parameters: dict, in_flight_window: int
) -> PostbackOutcome:
    """Everything in ONE statement (`_RECORD`): take the key, store the
    conversion on its link, raise the link's counters, publish `conversion.recorded` with its
    deliveries. The event's body is written by the statement around the link, campaign and
    deal it finds (`event_body_around`), byte for byte what `publish_event` would write."""
    event_id = new_id("evt")
    # A conversion's life has one event, this one: the first of its subject, numbered 1 without
    # a counter (a later event of it, `events emit` by hand, is numbered after it).
    subject = EventSubject(type=CONVERSION_SUBJECT, id=conversion.id, campaign_id=None)
    # The event's data, less what only the statement knows: its link, campaign and deal.
    body_head, body_tail = event_body_around(
        event_id=event_id,
        name=CONVERSION_RECORDED,
        brand_id=conversion.brand_id,
        now=conversion.created_at,
        subject=subject,
        sequence=1,
        data=event_data(CONVERSION_RECORDED, conversion),
        keys=_FOUND_BY_THE_STATEMENT,
    )
    parameters |= {
        "lock_id": _lock_id(conversion.brand_id, conversion.idempotency_key),
        "window_ms": str(in_flight_window * 1000),
        "event_id": event_id,
        "brand_id": conversion.brand_id,
        "created_at": conversion.created_at,
        "body_head": body_head,
        "body_tail": body_tail,
        "delivery_id_base": new_id("whd"),
        "event_name": CONVERSION_RECORDED,
        "pending": PENDING,
        "subject_ordering": SUBJECT_ORDERING,
        "traceparent": publishing_traceparent(),
        **subject_parameters(subject),
    }
    del parameters["campaign_id"]  # the statement's: the link's campaign
    parameters["new_metadata"] = Json(parameters["new_metadata"])
    recorded = fetch_first_on_psycopg(connection, _RECORD, parameters)
    if recorded is None:
        # The key was in flight elsewhere, or its conversion exists: nothing was written.
        return PostbackOutcome(
            conversion=_stored(conversion.brand_id, conversion.idempotency_key), replay=True
        )
    conversion.link_id, conversion.campaign_id, conversion.deal_id, _woken = recorded
    # After the commit, not in it: a notifying commit holds a lock for the whole server until
    # it is on disk (services/wakeups.py).
    wake_after_commit(connection, conversion.brand_id)
    # The last moment before the caller commits: the key, the conversion, the counters and the
    # event are all written and none is visible yet. Tests crash or hang a server here.
    failpoint("postback.before_commit")
    return PostbackOutcome(conversion=conversion, replay=False)


def _stored(brand_id: str, idempotency_key: str) -> RecordedConversion:
    """The conversion committed under the key, or Conflict when the key is in flight."""
    stored = db.session.scalar(
        select(Conversion).where(
            Conversion.brand_id == brand_id, Conversion.idempotency_key == idempotency_key
        )
    )
    if stored is None:
        raise Conflict(
            "A postback with this Idempotency-Key is still being recorded; retry shortly",
            retry_after=CONFLICT_RETRY_AFTER_SECONDS,
        )
    return RecordedConversion(**{name: getattr(stored, name) for name in _RECORDED_FIELDS})


# The statements of a new postback are built once: building and caching a statement per
# request cost more CPU than running it (every round trip and every millisecond shows in
# bench/postbacks.py).

_conversions = Conversion.__table__.c
_links = TrackedLink.__table__.c
# (column, Conversion attribute) of what the INSERT takes from the request.
_INSERTED = (
    ("id", "id"),
    ("brand_id", "brand_id"),
    ("idempotency_key", "idempotency_key"),
    ("event_type", "event_type"),
    ("click_id", "click_id"),
    ("link_code", "link_code"),
    ("value_minor", "value_minor"),
    ("currency", "currency"),
    ("metadata", "details"),
    ("attributed", "attributed"),
    ("created_at", "created_at"),
)


# The keys of the event's data that the statement fills in, in the order of its schema's.
_FOUND_BY_THE_STATEMENT = ("linkId", "campaignId", "dealId")
# Raise a link's counters in one of its slots (models.tracked_link). A conversion in another
# currency than the link's is counted, but its value is not added: there is no rate to convert
# it at. (The WHERE tells the upsert's ON CONFLICT from a join's ON.)
_COUNT_IN_SLOT = """
        INSERT INTO tracked_link_conversion_counts
            (link_id, slot, conversions, conversion_value_minor)
        SELECT link.id, {slot}, 1,
               CASE WHEN link.currency = :new_currency THEN :new_value_minor ELSE 0 END
        FROM {links} WHERE {where}
        ON CONFLICT (link_id, slot) DO UPDATE
        SET conversions = tracked_link_conversion_counts.conversions + 1,
            conversion_value_minor = tracked_link_conversion_counts.conversion_value_minor
                + excluded.conversion_value_minor"""
# A new postback is one statement and its commit:
# - `claim` takes the key's advisory lock without waiting, and bounds this transaction by the
#   in-flight window (a hung request is ended by the database when the window has passed);
# - `link` is the calling brand's link of that code (rule 1); an unknown code, or another
#   brand's, finds none and the conversion is stored on no link (rule 3);
# - `conversion` inserts it, only when the key was taken and is new (ON CONFLICT: a replay);
# - `counted` raises the link's counters in the slot of this database connection (a connection
#   runs one transaction at a time, so concurrent postbacks of a link seldom share a slot and do
#   not queue on one row's lock until each commits; models.tracked_link);
# - `event` and `deliveries` publish conversion.recorded (services.events), its body the JSON
#   that publish_event would write, with the link, campaign and deal found here spliced in
#   (every id is plain ASCII, so to_json writes them as json.dumps does).
# It returns one row when it recorded the postback; none when the key was in flight elsewhere
# or its conversion exists, and then it wrote nothing.
_CLAIM_AND_INSERT = """
    WITH claim AS (
        SELECT pg_try_advisory_xact_lock(:lock_id) AS taken,
               set_config('statement_timeout', :window_ms, true) AS statement_limit,
               set_config('idle_in_transaction_session_timeout', :window_ms, true) AS idle_limit
    ),
    link AS (
        SELECT id, campaign_id, deal_id, currency FROM tracked_links
        WHERE brand_id = :new_brand_id AND code = :new_link_code
    ),
    conversion AS (
        INSERT INTO conversions (
            id, brand_id, idempotency_key, event_type, click_id, link_code, value_minor,
            currency, metadata, attributed, created_at, link_id, campaign_id, deal_id
        )
        SELECT :new_id, :new_brand_id, :new_idempotency_key, :new_event_type, :new_click_id,
               :new_link_code, :new_value_minor, :new_currency, :new_metadata,
               :new_attributed, :new_created_at, link.id, link.campaign_id, link.deal_id
        FROM claim LEFT JOIN link ON true
        WHERE claim.taken
        ON CONFLICT (brand_id, idempotency_key) DO NOTHING
        RETURNING link_id, campaign_id, deal_id
    ),"""
_TAKE_KEY_AND_COUNT = (
    _CLAIM_AND_INSERT
    + "\n    counted AS ("
    + _COUNT_IN_SLOT.format(
        slot=f"pg_backend_pid() % {CONVERSION_COUNT_SLOTS}",
        links="conversion JOIN link ON link.id = conversion.link_id",
        where="true",
    )
    + """
        RETURNING link_id
    ),"""
)
_RECORD_STATEMENT = text(
    _TAKE_KEY_AND_COUNT  # noqa: S608 - constant SQL, put together at import
    + PUBLISH_CTES_WAKING_NOBODY.format(
        source="conversion",
        sequence="1",
        campaign="conversion.campaign_id",
        body=":body_head"
        """ || '"linkId":' || coalesce(to_json(conversion.link_id)::text, 'null')"""
        """ || ',"campaignId":' || coalesce(to_json(conversion.campaign_id)::text, 'null')"""
        """ || ',"dealId":' || coalesce(to_json(conversion.deal_id)::text, 'null')"""
        " || :body_tail",
    )
    + """
    SELECT conversion.link_id, conversion.campaign_id, conversion.deal_id, """
    + WOKEN
    + """ AS woken
    FROM conversion
    """
).bindparams(
    bindparam("lock_id", type_=BigInteger),
    bindparam("window_ms", type_=Text),
    *(bindparam(f"new_{name}", type_=_conversions[name].type) for name, _ in _INSERTED),
    bindparam("event_name", type_=String()),
    bindparam("created_at", type_=_conversions["created_at"].type),
    bindparam("pending", type_=String()),
    bindparam("subject_ordering", type_=String()),
)
# Every new postback runs it: through psycopg itself (services.psycopg_direct).
_RECORD = psycopg_sql(_RECORD_STATEMENT)


def _lock_id(brand_id: str, idempotency_key: str) -> int:
    """A signed 64-bit advisory lock id for the key; a collision only makes an unrelated key
    wait as if in flight, for the few milliseconds of a transaction."""
    digest = hashlib.blake2b(
        _LOCK_NAMESPACE + f"{brand_id}\x00{idempotency_key}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big", signed=True)
