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

On SQLite (a developer's laptop) writes are serialized by the database, so a second request
with the key waits for the first to commit and then replays it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import and_, case, func, literal, select, true, update
from sqlalchemy.dialects import postgresql, sqlite

from extensions import db
from models import Conversion, TrackedLink
from models.columns import new_id, utcnow
from models.money import NGN
from schemas.conversions import ConversionSchema
from services.errors import Conflict
from services.events import publish_event
from services.failpoints import failpoint

DEFAULT_IN_FLIGHT_WINDOW_SECONDS = 120
# In flight almost always means "a few milliseconds from committing".
CONFLICT_RETRY_AFTER_SECONDS = 1
CONVERSION_RECORDED = "conversion.recorded"
# Namespaces this module's advisory locks among any others on the database.
_LOCK_NAMESPACE = b"brand-api:postback:"

_conversion_schema = ConversionSchema()


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


@dataclass(frozen=True)
class PostbackOutcome:
    conversion: Conversion
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
    conversion_id = new_id("conv", at=now)
    taken = db.session.execute(
        _take_key_and_insert(
            brand_id, idempotency_key, postback, conversion_id, now, in_flight_window
        )
    ).first()
    if taken is None:
        return PostbackOutcome(conversion=_stored(brand_id, idempotency_key), replay=True)

    conversion = Conversion(
        id=conversion_id,
        brand_id=brand_id,
        idempotency_key=idempotency_key,
        event_type=postback.event_type,
        click_id=postback.click_id,
        link_code=postback.link_code,
        link_id=taken.link_id,
        campaign_id=taken.campaign_id,
        deal_id=taken.deal_id,
        value_minor=postback.value_minor,
        currency=postback.currency,
        details=postback.metadata,
        attributed=postback.attributed,
        created_at=now,
    )
    publish_event(
        brand_id=brand_id,
        name=CONVERSION_RECORDED,
        data=_conversion_schema.dump(conversion),
        now=now,
    )
    if taken.link_id is not None:
        # Last before the commit: the link's row stays locked from here to the commit, and a
        # popular link's postbacks queue on that lock.
        _count_on_link(taken.link_id, postback)
    # The last moment before the caller commits: the key, the conversion, the event and the
    # counters are all written and none is visible yet. Tests crash or hang a server here.
    failpoint("postback.before_commit")
    return PostbackOutcome(conversion=conversion, replay=False)


def _take_key_and_insert(
    brand_id: str,
    idempotency_key: str,
    postback: Postback,
    conversion_id: str,
    now: datetime,
    in_flight_window: int,
):
    """One statement: take the key, look up the link, insert the conversion (one round trip).

    Returns a row (link_id, campaign_id, deal_id) when this request took the key and inserted;
    no row when the key was in flight elsewhere or its conversion already exists.
    """
    dialect = db.session.get_bind().dialect.name
    if dialect == "postgresql":
        window_ms = str(in_flight_window * 1000)
        claim = select(
            func.pg_try_advisory_xact_lock(_lock_id(brand_id, idempotency_key)).label("taken"),
            # Local to this transaction: a hung request is ended when the window has passed.
            func.set_config("statement_timeout", window_ms, True).label("statement_limit"),
            func.set_config("idle_in_transaction_session_timeout", window_ms, True).label(
                "idle_limit"
            ),
        ).cte("claim")
        taken = claim.c.taken
        insert = postgresql.insert
    else:
        claim, taken, insert = None, true(), sqlite.insert

    columns = Conversion.__table__.c
    values = {
        "id": conversion_id,
        "brand_id": brand_id,
        "idempotency_key": idempotency_key,
        "event_type": postback.event_type,
        "click_id": postback.click_id,
        "link_code": postback.link_code,
        "value_minor": postback.value_minor,
        "currency": postback.currency,
        "metadata": postback.metadata,
        "attributed": postback.attributed,
        "created_at": now,
    }
    link = TrackedLink.__table__.c
    source = select(
        *(literal(value, columns[name].type).label(name) for name, value in values.items()),
        link.id.label("link_id"),
        link.campaign_id,
        link.deal_id,
    )
    # The link must be the calling brand's (rule 1); an unknown code, or another brand's,
    # joins nothing and the conversion is stored unattributed to any link (rule 3).
    on_brand_link = and_(link.brand_id == brand_id, link.code == postback.link_code)
    if claim is not None:
        source = source.select_from(claim.outerjoin(TrackedLink.__table__, on_brand_link))
    else:
        one_row = select(literal(1).label("one")).subquery("one_row")
        source = source.select_from(one_row.outerjoin(TrackedLink.__table__, on_brand_link))
    # SQLite needs the WHERE to tell an upsert's ON from a join's.
    source = source.where(taken)
    return (
        insert(Conversion.__table__)
        .from_select([*values, "link_id", "campaign_id", "deal_id"], source)
        .on_conflict_do_nothing(index_elements=["brand_id", "idempotency_key"])
        .returning(columns.link_id, columns.campaign_id, columns.deal_id)
    )


def _stored(brand_id: str, idempotency_key: str) -> Conversion:
    """The conversion committed under the key, or Conflict when the key is in flight."""
    conversion = db.session.scalar(
        select(Conversion).where(
            Conversion.brand_id == brand_id, Conversion.idempotency_key == idempotency_key
        )
    )
    if conversion is None:
        raise Conflict(
            "A postback with this Idempotency-Key is still being recorded; retry shortly",
            retry_after=CONFLICT_RETRY_AFTER_SECONDS,
        )
    return conversion


def _count_on_link(link_id: str, postback: Postback) -> None:
    """Raise the link's counters atomically. A conversion in another currency than the link's
    is counted, but its value is not added: there is no rate to convert it at."""
    link = TrackedLink.__table__.c
    db.session.execute(
        update(TrackedLink.__table__)
        .where(link.id == link_id)
        .values(
            conversions=link.conversions + 1,
            conversion_value_minor=link.conversion_value_minor
            + case((link.currency == postback.currency, postback.value_minor), else_=0),
        )
    )


def _lock_id(brand_id: str, idempotency_key: str) -> int:
    """A signed 64-bit advisory lock id for the key; a collision only makes an unrelated key
    wait as if in flight, for the few milliseconds of a transaction."""
    digest = hashlib.blake2b(
        _LOCK_NAMESPACE + f"{brand_id}\x00{idempotency_key}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big", signed=True)
