"""Reading a brand's events as a feed (CONTRACT 11.1): in publish order after a cursor, every
event exactly once, and waiting for the next one without holding anything while it waits.

Publish order, and why a cursor never skips an event
----------------------------------------------------
Events are inserted by many processes at once, and a transaction that inserted an event early
may commit after one that inserted later. An order by insertion (an id, a sequence, a time)
would let a follower pass a row that is not committed yet: when it commits, it lands behind the
cursor and is never seen.

So each event row records the publishing transaction's id (`xact_id`, PostgreSQL's 64-bit
`pg_current_xact_id()`) and its place among that transaction's events (`position`, a
sequence), both filled by column defaults (models/webhook_event.py), and the feed is ordered by
(xact_id, position). A read lists only rows whose transaction is older than its snapshot's
horizon: the oldest transaction of this database its snapshot saw running, else the snapshot's
`xmax`. Every transaction of this database below the horizon has ended, so those rows are
final, and every transaction that could still add a row (running, or yet to take an id) has an
id at or above it, which is above every row listed. Transaction ids are shared by the whole
server; a transaction of another database (read off `pg_stat_activity`, whose `backend_xid`
every role may see) can never write an event, so it does not hold the horizon. One the read
cannot place (a prepared transaction, a backend gone meanwhile) counts as ours: the horizon
only ever errs early, which delays a row, never skips it. Nothing can ever
appear before a cursor the feed handed out: a follower passing `nextAfter` sees each event once,
in one order that every follower shares.

"Publish order" is therefore the order in which publishing transactions took their ids (for
events of one transaction, the order they were written). Two transactions committing at the
same moment are ordered by that, which every reader agrees on; a process publishing one event
after another's commit always lists after it.

What it costs: an event is listed only once every transaction that took an id before its own
has ended. Transactions here last milliseconds, but one left open on this database holds back
every event published after it began, until it ends: a postback hung in its transaction for up to
`POSTBACK_IN_FLIGHT_WINDOW` (120 s), a migration, a session left idle in a transaction. A
waiting reader sees such held-back events and reads again shortly (`HELD_BACK_PAUSES`) instead
of waiting for a wake-up that their own commit already sent.

Newest first
------------
`sort_order="desc"` walks the same order backwards: the newest events first, `after` then meaning
"published before this one". It lists only rows already below the horizon, so a walk back from
its first page never passes a row to come: a row not yet settled when the walk began belongs
after its start, not inside the range it walks. It never waits (nothing older than a cursor can
be published): it is for reading history, the feed with `asc` for following it.

Waiting
-------
`fetch_events(..., wait=N)` with nothing to list registers a waiter for the brand
(services/event_waits.py), returns its database connection to the pool, and sleeps until this
process's wake-up listener (services/wakeups.py: PostgreSQL LISTEN/NOTIFY) says the brand
published, then reads again. It holds no connection while it sleeps, and reads the database
only when woken (and, rarely, while committed events are held back, above). It does hold its
thread, so before it first sleeps it must be admitted under the caps on waiting requests (per
API key and per process, services/event_waits.py); past one, it answers 429 at once. Only
waiting is refused: a request with something to list gets it, at any cap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

from sqlalchemy import bindparam, func, select, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import String

from extensions import db
from models import WebhookDelivery, WebhookEvent
from models.columns import id_time, utcnow
from models.event_catalog import EVENT_NAMES
from models.event_subjects import subject_key
from models.paging import ASCENDING, DESCENDING
from schemas.event_feed import FEED_DEFAULT_LIMIT
from services import work_slots
from services.deliveries import count_states, state_columns
from services.errors import NotFound, ValidationFailed
from services.event_waits import refuse_if_caught_up, wait_for_brand
from services.pagination import Page, paginate
from services.psycopg_direct import fetch_all_on_psycopg, fetch_first_on_psycopg, psycopg_sql
from services.retention import retention_period

# How soon a waiting reader reads again while committed events wait for an older transaction
# to end (see the module's doc): quickly at first, then once a second.
HELD_BACK_PAUSES = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# Before every (xact_id, position) of a real event: the start of the feed.
_START = (-1, -1)


@dataclass(frozen=True)
class Subject:
    type: str
    id: str


@dataclass(frozen=True)
class FeedEvent:
    """An event as the feed lists it: the fields of the body its deliveries send."""

    id: str
    type: str
    created_at: datetime
    subject: Subject
    sequence: int
    # Null once erased (CONTRACT 13.3), with `erased_at` set.
    data: dict | None
    erased_at: datetime | None

    @classmethod
    def of_row(cls, row) -> FeedEvent:
        """From a row with the event's id, name, created_at, subject_type, subject_id,
        sequence, body and erased_at."""
        return cls(
            id=row.id,
            type=row.name,
            created_at=row.created_at.astimezone(UTC),  # psycopg's rows: the session's zone
            subject=Subject(type=row.subject_type, id=row.subject_id),
            sequence=row.sequence,
            data=json.loads(row.body)["data"],
            erased_at=row.erased_at and row.erased_at.astimezone(UTC),
        )


@dataclass(frozen=True)
class EventPage:
    events: list[FeedEvent]
    # The cursor to pass next: the last event's id, or `after` itself when none came.
    next_after: str | None
    # `after` was older than what is kept: the page starts at the oldest kept event.
    cursor_expired: bool = False
    # Committed events of the brand after the page wait for an older transaction to end.
    held_back: bool = False


@dataclass(frozen=True)
class _Cursor:
    after: str | None
    position: tuple[int, int]
    expired: bool


def fetch_events(
    *,
    brand_id: str,
    key_id: str,
    after: str | None = None,
    limit: int = FEED_DEFAULT_LIMIT,
    types: Sequence[str] | None = None,
    subject: tuple[str, str] | None = None,
    wait: float = 0,
    sort_order: str = ASCENDING,
    now: datetime | None = None,
) -> EventPage:
    """The brand's events after `after` (an event id; None: from the oldest kept), oldest
    first, at most `limit`, of the `types` named (None: every type), of the `subject` (type,
    id) given (None: every subject). With `wait` > 0 and nothing to list, waits up to `wait`
    seconds for an event and answers as soon as one can be listed, a wait counted against the
    caps of API key `key_id` (see the module's doc). `sort_order` "desc": newest first, before
    `after` (None: from the newest), never waiting.

    :raise NotFound: `after` is not an event of the brand (and not one retention deleted).
    :raise ValidationFailed: with `subject`, `after` is an event of another subject.
    :raise RateLimited: it would have to wait, and the key or the process is at its cap.
    """
    kept_since = (now or utcnow()) - retention_period()
    names = list(types) if types else list(EVENT_NAMES)
    if sort_order == DESCENDING:
        return _read_back(brand_id, after, names, limit, subject, kept_since)
    reading = (after, tuple(names), subject)
    if wait > 0:
        refuse_if_caught_up(brand_id, key_id, wait, reading)  # past a cap, nothing new: 429
    if subject is None:
        cursor = _cursor(brand_id, after, kept_since)

        def read() -> EventPage:
            return _read(brand_id, cursor, names, limit, kept_since)

    else:
        subject_cursor = _subject_cursor(brand_id, subject, after, kept_since)

        def read() -> EventPage:
            return _read_subject(brand_id, subject, subject_cursor, names, limit, kept_since)

    if wait <= 0:
        return read()
    deadline = time.monotonic() + wait
    held_back_reads = 0
    with wait_for_brand(brand_id, key_id, wait) as woken:
        while True:
            # Cleared before reading: a wake-up from now on makes the wait below return at once.
            woken.clear()
            page = read()
            remaining = deadline - time.monotonic()
            if page.events or remaining <= 0 or woken.stopping:
                return page
            woken.admit()  # past a cap: 429 now, instead of a thread held for the wait
            # Nothing held while asleep: the request's transaction ends and its connection
            # goes back to the pool (the next read takes one again).
            db.session.commit()
            pause = remaining
            if page.held_back:
                last = len(HELD_BACK_PAUSES) - 1
                pause = min(pause, HELD_BACK_PAUSES[min(held_back_reads, last)])
                held_back_reads += 1
            with work_slots.set_aside():
                woken.wait(pause, caught_up_on=None if page.held_back else reading)


def _cursor(brand_id: str, after: str | None, kept_since: datetime) -> _Cursor:
    """Where the feed resumes after `after`. An event retention deleted (its id tells when it
    was made), or one older than the retention, restarts the feed at the oldest kept event.

    :raise NotFound: `after` is no event of the brand, and not an expired one."""
    if after is None:
        return _Cursor(after=None, position=_START, expired=False)
    row = fetch_first_on_psycopg(
        db.session.connection(), _CURSOR, {"after": after, "brand_id": brand_id}
    )
    if row is not None:
        xact_id, position, created_at = row
        if created_at >= kept_since:
            return _Cursor(after=after, position=(xact_id, position), expired=False)
    made_at = id_time(after)
    if row is not None or (made_at is not None and made_at < kept_since):
        return _Cursor(after=after, position=_START, expired=True)
    raise NotFound(f"No event with id {after!r} in this brand")


# Every read of the feed runs this and `_FEED` (a follower loops on them, and a long-poll
# refused past a cap reads before it is refused): on psycopg directly (services.psycopg_direct).
_CURSOR = psycopg_sql(
    select(WebhookEvent.xact_id, WebhookEvent.position, WebhookEvent.created_at).where(
        WebhookEvent.id == bindparam("after"), WebhookEvent.brand_id == bindparam("brand_id")
    )
)


def _read(
    brand_id: str, cursor: _Cursor, names: list[str], limit: int, kept_since: datetime
) -> EventPage:
    rows = [
        _FeedRow(*row)
        for row in fetch_all_on_psycopg(
            db.session.connection(),
            _FEED,
            {
                "brand_id": brand_id,
                "names": names,
                "after_xact_id": cursor.position[0],
                "after_position": cursor.position[1],
                "kept_since": kept_since,
                "limit": limit,
            },
        )
    ]
    # Rows come in feed order; those of a transaction not yet below the horizon end the page.
    events = []
    for row in rows:
        if not row.settled:
            break
        events.append(FeedEvent.of_row(row))
    return EventPage(
        events=events,
        next_after=events[-1].id if events else cursor.after,
        cursor_expired=cursor.expired,
        held_back=len(events) < len(rows),
    )


class _FeedRow(NamedTuple):
    id: str
    name: str
    created_at: datetime
    subject_type: str
    subject_id: str
    sequence: int
    body: str
    erased_at: datetime | None
    settled: bool


# The brand's events of the names asked for, after the cursor, in feed order: for each name an
# index range of ix_webhook_events_feed (brand, name, xact_id, position), merged. `settled`: the
# row's transaction is below this statement's snapshot's horizon (see the module's doc); the
# snapshot that reads the rows is the one that says so, since both are one statement.
# The horizon of the statement's snapshot (see the module's doc): `horizon.xmin`, below which
# every transaction of this database has ended. Both orders of the feed start with it.
_HORIZON = """
    WITH snapshot AS MATERIALIZED (
        SELECT pg_current_snapshot() AS taken
    ),
    horizon AS MATERIALIZED (
        SELECT coalesce(
            (
                SELECT min(running.id)
                FROM (
                    SELECT CAST(CAST(xid AS TEXT) AS BIGINT) AS id
                    FROM pg_snapshot_xip(snapshot.taken) AS xip(xid)
                ) AS running
                -- backend_xid is the 32-bit form of the same id.
                WHERE running.id % 4294967296 NOT IN (
                    SELECT CAST(CAST(activity.backend_xid AS TEXT) AS BIGINT)
                    FROM pg_stat_activity AS activity
                    WHERE activity.datname <> current_database()
                      AND activity.backend_xid IS NOT NULL
                )
            ),
            CAST(CAST(pg_snapshot_xmax(snapshot.taken) AS TEXT) AS BIGINT)
        ) AS xmin
        FROM snapshot
    ),
"""

_FEED = psycopg_sql(
    text(
        _HORIZON  # noqa: S608 - constant SQL, put together at import
        + """
    candidates AS (
        SELECT page.id, page.xact_id, page.position
        FROM unnest(CAST(:names AS varchar[])) AS wanted(name)
        CROSS JOIN LATERAL (
            SELECT event.id, event.xact_id, event.position
            FROM webhook_events AS event
            WHERE event.brand_id = :brand_id
              AND event.name = wanted.name
              AND (event.xact_id, event.position) > (:after_xact_id, :after_position)
              AND event.created_at >= :kept_since
            ORDER BY event.xact_id, event.position
            LIMIT :limit
        ) AS page
        ORDER BY page.xact_id, page.position
        LIMIT :limit
    )
    SELECT event.id, event.name, event.created_at, event.subject_type, event.subject_id,
           event.sequence, event.body, event.erased_at,
           candidates.xact_id < horizon.xmin AS settled
    FROM candidates
    JOIN webhook_events AS event ON event.id = candidates.id
    CROSS JOIN horizon
    ORDER BY candidates.xact_id, candidates.position
    """
    )
)


# ---- newest first ----


def _read_back(
    brand_id: str,
    before: str | None,
    names: list[str],
    limit: int,
    subject: tuple[str, str] | None,
    kept_since: datetime,
) -> EventPage:
    """The brand's (or the subject's) kept events published before `before`, newest first.
    `before` deleted by retention, or older than it keeps: nothing older is kept, so the page
    is empty and says the cursor expired.

    :raise NotFound: `before` is no event of the brand, and not an expired one.
    :raise ValidationFailed: with `subject`, `before` is an event of another subject."""
    if subject is not None:
        subject_cursor = _subject_cursor(brand_id, subject, before, kept_since)
        if subject_cursor.expired:
            return EventPage(events=[], next_after=before, cursor_expired=True)
        events = subject_events(
            brand_id,
            subject,
            newest_first=True,
            before_sequence=subject_cursor.sequence if before is not None else None,
            limit=limit,
            names=names,
            kept_since=kept_since,
        )
    else:
        cursor = _cursor(brand_id, before, kept_since)
        if cursor.expired:
            return EventPage(events=[], next_after=before, cursor_expired=True)
        position = cursor.position if before is not None else _END
        events = [
            FeedEvent.of_row(_FeedRow(*row))
            for row in fetch_all_on_psycopg(
                db.session.connection(),
                _FEED_BACK,
                {
                    "brand_id": brand_id,
                    "names": names,
                    "before_xact_id": position[0],
                    "before_position": position[1],
                    "kept_since": kept_since,
                    "limit": limit,
                },
            )
        ]
    return EventPage(events=events, next_after=events[-1].id if events else before)


# After every (xact_id, position) of a real event (both are bigint): the end of the feed.
_END = (2**63 - 1, 2**63 - 1)

# `_FEED` backwards: the brand's settled events of the names asked for, before the cursor, newest
# first (each name's index range walked backwards, merged). Rows above the horizon are left out
# rather than ending the page: see the module's doc, "Newest first".
_FEED_BACK = psycopg_sql(
    text(
        _HORIZON  # noqa: S608 - constant SQL, put together at import
        + """
    candidates AS (
        SELECT page.id, page.xact_id, page.position
        FROM unnest(CAST(:names AS varchar[])) AS wanted(name)
        CROSS JOIN horizon
        CROSS JOIN LATERAL (
            SELECT event.id, event.xact_id, event.position
            FROM webhook_events AS event
            WHERE event.brand_id = :brand_id
              AND event.name = wanted.name
              AND (event.xact_id, event.position) < (:before_xact_id, :before_position)
              AND event.xact_id < horizon.xmin
              AND event.created_at >= :kept_since
            ORDER BY event.xact_id DESC, event.position DESC
            LIMIT :limit
        ) AS page
        ORDER BY page.xact_id DESC, page.position DESC
        LIMIT :limit
    )
    SELECT event.id, event.name, event.created_at, event.subject_type, event.subject_id,
           event.sequence, event.body, event.erased_at, TRUE AS settled
    FROM candidates
    JOIN webhook_events AS event ON event.id = candidates.id
    ORDER BY candidates.xact_id DESC, candidates.position DESC
    """
    )
)


# ---- one subject's events ----
#
# A subject's events are listed in `sequence` order, which needs no horizon: a publisher takes
# the subject's next number under a lock on its counter held until its transaction ends
# (services/events.py), so an event numbered n + 1 is written only after the one numbered n has
# committed. Whoever sees n + 1 sees n: a cursor on a sequence never passes an event to come.


@dataclass(frozen=True)
class _SubjectCursor:
    after: str | None
    sequence: int
    expired: bool


def _subject_cursor(
    brand_id: str, subject: tuple[str, str], after: str | None, kept_since: datetime
) -> _SubjectCursor:
    """Where a subject's events resume after `after`, one of them (or one retention deleted:
    from the oldest kept).

    :raise NotFound: `after` is no event of the brand, and not an expired one.
    :raise ValidationFailed: `after` is an event of another subject."""
    if after is None:
        return _SubjectCursor(after=None, sequence=0, expired=False)
    row = db.session.execute(
        select(
            WebhookEvent.subject_type,
            WebhookEvent.subject_id,
            WebhookEvent.sequence,
            WebhookEvent.created_at,
        ).where(WebhookEvent.id == after, WebhookEvent.brand_id == brand_id)
    ).first()
    if row is not None and (row.subject_type, row.subject_id) != subject:
        raise ValidationFailed(
            "`after` is an event of another subject",
            {
                "after": [
                    f"Event {after} is of {subject_key(row.subject_type, row.subject_id)}, not "
                    f"{subject_key(*subject)}: pass one of that subject's events, or leave "
                    "`after` out to start at its first."
                ]
            },
        )
    if row is not None and row.created_at >= kept_since:
        return _SubjectCursor(after=after, sequence=row.sequence, expired=False)
    made_at = id_time(after)
    if row is not None or (made_at is not None and made_at < kept_since):
        return _SubjectCursor(after=after, sequence=0, expired=True)
    raise NotFound(f"No event with id {after!r} in this brand")


def _read_subject(
    brand_id: str,
    subject: tuple[str, str],
    cursor: _SubjectCursor,
    names: list[str],
    limit: int,
    kept_since: datetime,
) -> EventPage:
    events = subject_events(
        brand_id,
        subject,
        after_sequence=cursor.sequence,
        limit=limit,
        names=names,
        kept_since=kept_since,
    )
    return EventPage(
        events=events,
        next_after=events[-1].id if events else cursor.after,
        cursor_expired=cursor.expired,
    )


def subject_events(
    brand_id: str,
    subject: tuple[str, str],
    *,
    after_sequence: int = 0,
    limit: int,
    names: Sequence[str] | None = None,
    kept_since: datetime | None = None,
    newest_first: bool = False,
    before_sequence: int | None = None,
) -> list[FeedEvent]:
    """The kept events of the brand's `subject` (type, id) numbered after `after_sequence`, in
    sequence order, at most `limit`, of the `names` given (None: every one). `newest_first`:
    in the opposite order, those numbered below `before_sequence` (None: from the newest)."""
    subject_type, subject_id = subject
    statement = (
        select(
            WebhookEvent.id,
            WebhookEvent.name,
            WebhookEvent.created_at,
            WebhookEvent.subject_type,
            WebhookEvent.subject_id,
            WebhookEvent.sequence,
            WebhookEvent.body,
            WebhookEvent.erased_at,
        )
        # One range of ix_webhook_events_subject (brand, subject type, subject id, sequence).
        .where(
            WebhookEvent.brand_id == brand_id,
            WebhookEvent.subject_type == subject_type,
            WebhookEvent.subject_id == subject_id,
            WebhookEvent.sequence > after_sequence,
            WebhookEvent.created_at
            >= (kept_since if kept_since is not None else utcnow() - retention_period()),
        )
        .order_by(WebhookEvent.sequence.desc() if newest_first else WebhookEvent.sequence)
        .limit(limit)
    )
    if before_sequence is not None:
        statement = statement.where(WebhookEvent.sequence < before_sequence)
    if names is not None and set(names) != set(EVENT_NAMES):
        statement = statement.where(WebhookEvent.name.in_(list(names)))
    return [FeedEvent.of_row(row) for row in db.session.execute(statement)]


# ---- one event, and the brand's events newest first (the dashboard) ----


@dataclass(frozen=True)
class EventDelivery:
    id: str
    endpoint_id: str
    status: str
    attempt_count: int
    created_at: datetime


@dataclass(frozen=True)
class EventDetail:
    id: str
    type: str
    created_at: datetime
    subject: Subject
    sequence: int
    data: dict | None
    body: str
    erased_at: datetime | None
    deliveries: list[EventDelivery] = field(default_factory=list)


def get_event(brand_id: str, event_id: str) -> EventDetail:
    """One stored event of the brand, with each of its deliveries (redeliveries included),
    oldest first.

    :raise NotFound: no such event in this brand (another brand's included)."""
    event = db.session.scalar(
        select(WebhookEvent).where(WebhookEvent.id == event_id, WebhookEvent.brand_id == brand_id)
    )
    if event is None:
        raise NotFound(f"No event with id {event_id!r} in this brand")
    deliveries = db.session.execute(
        select(
            WebhookDelivery.id,
            WebhookDelivery.endpoint_id,
            WebhookDelivery.status,
            WebhookDelivery.attempt_count,
            WebhookDelivery.created_at,
        )
        .where(WebhookDelivery.event_id == event.id)
        .order_by(WebhookDelivery.created_at, WebhookDelivery.id)
    ).all()
    return EventDetail(
        id=event.id,
        type=event.name,
        created_at=event.created_at,
        subject=Subject(type=event.subject_type, id=event.subject_id),
        sequence=event.sequence,
        data=json.loads(event.body)["data"],
        body=event.body,
        erased_at=event.erased_at,
        deliveries=[EventDelivery(**row._mapping) for row in deliveries],
    )


@dataclass(frozen=True)
class ListedEvent:
    id: str
    type: str
    created_at: datetime
    # Its deliveries by state (services.deliveries.DELIVERY_STATES: `waiting`, `held`,
    # `retrying`, `delivered`, `failed`), redeliveries included.
    deliveries: dict[str, int]


def list_events(
    *,
    brand_id: str,
    page: int,
    limit: int,
    event_type: str | None = None,
    now: datetime | None = None,
) -> Page:
    """The brand's kept events newest first (the feed's order, reversed), of one type or all,
    each with its deliveries counted by state."""
    kept_since = (now or utcnow()) - retention_period()
    names = [event_type] if event_type else list(EVENT_NAMES)
    parameters = {"brand_id": brand_id, "names": names, "kept_since": kept_since}

    def page_statement(offset: int, size: int):
        # The rows without their bodies: a page shows ids, types and times only.
        return select(WebhookEvent).from_statement(
            _NEWEST_FIRST.bindparams(offset=offset, limit=size, **parameters)
        )

    counted = select(WebhookEvent.id).where(
        WebhookEvent.brand_id == brand_id,
        WebhookEvent.name.in_(names),
        WebhookEvent.created_at >= kept_since,
    )
    listed = paginate(page_statement, page=page, limit=limit, count=counted)
    ids = [event.id for event in listed.items]
    rows: dict[str, list[tuple[str, bool, bool, int]]] = {event_id: [] for event_id in ids}
    if ids:
        states = state_columns()  # one set of expressions: GROUP BY must match SELECT's
        for event_id, status, is_retrying, is_held, count in db.session.execute(
            select(WebhookDelivery.event_id, *states, func.count())
            .where(WebhookDelivery.event_id.in_(ids))
            .group_by(WebhookDelivery.event_id, *states)
        ):
            rows[event_id].append((status, is_retrying, is_held, count))
    items = [
        ListedEvent(
            id=event.id,
            type=event.name,
            created_at=event.created_at,
            deliveries=count_states(rows[event.id]),
        )
        for event in listed.items
    ]
    return Page(
        items=items,
        page=listed.page,
        limit=listed.limit,
        total=listed.total,
        total_exact=listed.total_exact,
    )


# The feed's order reversed, a page at a time: each name's newest `offset + limit` rows (one
# index range each), merged.
_NEWEST_FIRST = text(
    """
    SELECT page.id, page.brand_id, page.name, page.created_at, page.xact_id, page.position
    FROM unnest(:names) AS wanted(name)
    CROSS JOIN LATERAL (
        SELECT event.id, event.brand_id, event.name, event.created_at, event.xact_id,
               event.position
        FROM webhook_events AS event
        WHERE event.brand_id = :brand_id
          AND event.name = wanted.name
          AND event.created_at >= :kept_since
        ORDER BY event.xact_id DESC, event.position DESC
        LIMIT :offset + :limit
    ) AS page
    ORDER BY page.xact_id DESC, page.position DESC
    OFFSET :offset LIMIT :limit
    """
).bindparams(
    bindparam("names", type_=ARRAY(String)),
    bindparam("kept_since", type_=WebhookEvent.__table__.c.created_at.type),
)
