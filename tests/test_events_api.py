"""The events API (CONTRACT 11.1) against a real gunicorn server with gunicorn.conf.py's settings
(as `make run` and production run it): paging with the cursor, the `types` filter, the
long-poll, retention, another brand's events, and what a waiting request holds."""

from __future__ import annotations

import contextlib
import re
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
import requests
from sqlalchemy import select, text

from extensions import db
from models import WebhookEvent
from models.columns import new_id, utcnow
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.wakeups import conninfo_for
from services.webhook_endpoints import register_endpoint
from tests.server_process import ServerProcess

LOCAL_URLS = UrlPolicy(https_only=False, allow_local=True)


@pytest.fixture(scope="module")
def server(app, app_environ) -> Iterator[ServerProcess]:
    process = ServerProcess(app_environ, threads=None, worker_class=None)
    yield process
    process.stop()


class Feed:
    """A brand's events API on the real server, as a client calls it."""

    def __init__(self, server: ServerProcess, brand_id: str, key: str) -> None:
        self.base = f"{server.url}/api/v1/brand/{brand_id}/event"
        self.headers = {"X-Api-Key": key}

    def get(self, timeout: float = 45, **query) -> requests.Response:
        return requests.get(
            f"{self.base}/fetch-events", params=query, headers=self.headers, timeout=timeout
        )

    def page(self, **query) -> dict:
        response = self.get(**query)
        assert response.status_code == 200, response.text
        return response.json()

    def event(self, event_id: str) -> requests.Response:
        return requests.get(f"{self.base}/{event_id}", headers=self.headers, timeout=10)


@pytest.fixture
def feed(server, brand, read_key) -> Feed:
    return Feed(server, brand, read_key)


def publish(app, brand_id: str, name: str = "deal.completed", count: int = 1, **options) -> list:
    """Publish `count` events, each in its own committed transaction; their ids."""
    ids = []
    with app.app_context():
        for number in range(count):
            published = publish_event(
                brand_id=brand_id, name=name, data={"number": number}, **options
            )
            db.session.commit()
            ids.append(published.event.id)
    return ids


def follow(feed: Feed, after: str | None = None, **query) -> tuple[list[dict], str | None]:
    """Every event after `after`, page by page along nextAfter; (events, last nextAfter)."""
    events = []
    while True:
        body = feed.page(**({"after": after} if after else {}), **query)
        events += body["data"]["events"]
        if not body["data"]["events"]:
            return events, body["meta"]["nextAfter"]
        assert body["meta"]["nextAfter"] == body["data"]["events"][-1]["id"]
        after = body["meta"]["nextAfter"]


def test_a_cursor_pages_through_250_events_once_each_in_publish_order(app, brand, feed):
    published = []
    with app.app_context():  # 25 transactions of 10 events: order across and within them
        for batch in range(25):
            for number in range(10):
                event = publish_event(
                    brand_id=brand, name="deal.completed", data={"batch": batch, "n": number}
                )
                published.append(event.event.id)
            db.session.commit()

    pages, after = [], None
    while True:
        body = feed.page(limit=100, **({"after": after} if after else {}))
        assert body["meta"]["cursorExpired"] is False
        pages.append(body["data"]["events"])
        if not body["data"]["events"]:
            assert body["meta"]["nextAfter"] == after  # nothing new: the same cursor back
            break
        after = body["meta"]["nextAfter"]
    assert [len(page) for page in pages] == [100, 100, 50, 0]
    listed = [event for page in pages for event in page]
    assert [event["id"] for event in listed] == published
    assert listed[17]["data"] == {"batch": 1, "n": 7}
    assert listed[0]["type"] == "deal.completed"
    assert set(listed[0]) == {
        "id",
        "type",
        "createdAt",
        "subject",
        "sequence",
        "data",
        "erasedAt",
    }
    assert listed[0]["erasedAt"] is None  # CONTRACT 13.3: null unless erased

    # From any starting point: what follows it, in the same order.
    assert [event["id"] for event in follow(feed, published[123], limit=37)[0]] == published[124:]
    # The default page is 50.
    assert len(feed.page()["data"]["events"]) == 50


def test_data_is_what_the_deliveries_carry_and_an_event_lists_its_deliveries(
    app, brand, feed, server, write_key
):
    with app.app_context():
        endpoint = register_endpoint(
            policy=LOCAL_URLS,
            brand_id=brand,
            url="http://127.0.0.1:9/hooks",
            events=["escrow.released"],
        )
        db.session.commit()
        endpoint_id = endpoint.id
    [event_id] = publish(app, brand, "escrow.released")
    [listed] = feed.page()["data"]["events"]

    detail = feed.event(event_id)
    assert detail.status_code == 200, detail.text
    shown = detail.json()["data"]
    [delivery] = shown["deliveries"]
    assert delivery["endpointId"] == endpoint_id
    assert delivery["status"] == "pending"
    assert delivery["attemptCount"] == 0
    assert {key: shown[key] for key in listed} == listed

    sent = requests.get(
        f"{server.url}/api/v1/brand/{brand}/webhook/deliveries/{delivery['id']}",
        headers={"X-Api-Key": write_key},
        timeout=10,
    ).json()["data"]["payload"]
    assert listed["data"] == sent["data"]
    shown_keys = ("id", "type", "createdAt", "subject", "sequence")
    assert {key: listed[key] for key in shown_keys} == {key: sent[key] for key in shown_keys}


def test_types_lists_only_those_types_and_refuses_a_name_that_is_no_event(app, brand, feed):
    names = ["deal.completed", "escrow.released", "conversion.recorded", "escrow.released"]
    published = [(publish(app, brand, name)[0], name) for name in names * 3]

    wanted = {"escrow.released", "conversion.recorded"}
    events, last = follow(feed, types="escrow.released,conversion.recorded", limit=2)
    assert [event["id"] for event in events] == [i for i, name in published if name in wanted]
    assert last == events[-1]["id"]

    # A cursor on an event of another type works, and nothing of the type: nextAfter stays.
    first_deal = published[0][0]
    body = feed.page(after=published[-1][0], types="deal.completed")
    assert body["data"]["events"] == []
    assert body["meta"]["nextAfter"] == published[-1][0]
    assert (
        feed.page(after=first_deal, types="deal.completed")["data"]["events"][0]["id"]
        == (published[4][0])
    )

    refused = feed.get(types="deal.completed,deal.complete,escrow.held,campaign.launch")
    assert refused.status_code == 400
    body = refused.json()
    assert body["errorCode"] == "VALIDATION_ERROR"
    [message] = body["errors"]["types"]
    assert "deal.complete," in message and "campaign.launch" in message
    assert "escrow.held" not in message
    for bad in ("", "deal.completed,", "deal.completed, escrow.held"):
        assert feed.get(types=bad).status_code == 400, bad


@contextlib.contextmanager
def an_open_transaction(app) -> Iterator[psycopg.Connection]:
    """A connection to the app's database whose transaction has taken an id and stays open
    until the block commits it (or ends)."""
    with app.app_context():
        conninfo = conninfo_for(db.engine)
    with psycopg.connect(conninfo) as older:
        older.execute("SELECT pg_current_xact_id()")
        yield older


def test_sort_order_desc_reads_the_same_order_backwards(app, brand, feed):
    """The paging words of fetch-deliveries: `sortOrder=desc` lists newest first, and
    `nextAfter` walks further back; with `types` and `subject` too. `asc` is the default."""
    names = ["deal.completed", "escrow.released", "deal.completed"]
    published = [publish(app, brand, name)[0] for name in names * 4]

    # The horizon errs early: a read that sees another database's transaction end while it
    # looks leaves the newest rows for its next read (services/event_feed.py). Under a loaded
    # suite that happens; a later read lists them, which is what a reader of history sees.
    deadline = time.monotonic() + 10
    while True:
        events, last = follow(feed, sortOrder="desc", limit=5)
        if len(events) >= len(published) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [event["id"] for event in events] == published[::-1]
    assert last == published[0]
    assert [e["id"] for e in feed.page(sortOrder="asc")["data"]["events"]] == published
    assert feed.page()["data"]["events"] == feed.page(sortOrder="asc")["data"]["events"]
    # Before a cursor; of some types only.
    back = feed.page(sortOrder="desc", after=published[5], limit=3)
    assert [event["id"] for event in back["data"]["events"]] == published[4:1:-1]
    assert back["meta"] == {"nextAfter": published[2], "cursorExpired": False}
    escrow, _ = follow(feed, sortOrder="desc", types="escrow.released", limit=2)
    assert [event["id"] for event in escrow] == published[1::3][::-1]
    # Nothing older than the first: an empty page, the cursor back.
    assert feed.page(sortOrder="desc", after=published[0])["data"]["events"] == []

    # One subject's life, newest step first.
    steps = publish_of(
        app,
        brand,
        ("deal.accepted", {"id": "deal_desc"}),
        ("escrow.held", {"id": "esc_1", "dealId": "deal_desc"}),
        ("deal.completed", {"id": "deal_desc"}),
    )
    events, _ = follow(feed, sortOrder="desc", subject="deal:deal_desc", limit=2)
    assert [event["id"] for event in events] == steps[::-1]
    assert [event["sequence"] for event in events] == [3, 2, 1]

    refused = feed.get(sortOrder="newest")
    assert refused.status_code == 400 and set(refused.json()["errors"]) == {"sortOrder"}


def test_sort_order_desc_never_skips_an_event_behind_an_open_transaction(app, brand, feed):
    """Newest first lists only what is final: an event committed while an older transaction
    is open is left out, not listed above a place the older one could still take."""
    [first] = publish(app, brand)
    with an_open_transaction(app) as older:
        [held] = publish(app, brand)
        newest = feed.page(sortOrder="desc")["data"]["events"]
        assert [event["id"] for event in newest] == [first]
        started = time.monotonic()
        assert feed.page(sortOrder="desc", wait=5)["data"]["events"] == newest  # never waits
        assert time.monotonic() - started < 2.5
        older.commit()
    assert [event["id"] for event in feed.page(sortOrder="desc")["data"]["events"]] == [
        held,
        first,
    ]


def publish_of(app, brand_id: str, *events: tuple[str, dict]) -> list[str]:
    """Publish each (name, data) in its own committed transaction; their ids."""
    ids = []
    with app.app_context():
        for name, data in events:
            ids.append(publish_event(brand_id=brand_id, name=name, data=data).event.id)
            db.session.commit()
    return ids


def test_subject_lists_one_records_events_in_sequence_order(app, brand, feed):
    def of_deal(deal_id: str) -> list[tuple[str, dict]]:
        return [
            ("deal.accepted", {"id": deal_id}),
            ("escrow.held", {"id": "esc_1", "dealId": deal_id}),
            ("placement.verified", {"id": "plc_1", "dealId": deal_id}),
            ("deal.completed", {"id": deal_id}),
        ]

    # Two deals' lives interleaved, and a campaign's event between them.
    ours, theirs = of_deal("deal_ours"), of_deal("deal_theirs")
    published = []
    for mine, other in zip(ours, theirs, strict=True):
        published += publish_of(app, brand, mine, other, ("campaign.published", {"id": "cmp_1"}))
    ours_ids = published[0::3]

    events, last = follow(feed, subject="deal:deal_ours", limit=3)
    assert [event["id"] for event in events] == ours_ids
    assert [event["sequence"] for event in events] == [1, 2, 3, 4]
    assert {event["subject"]["type"] for event in events} == {"deal"}
    assert {event["subject"]["id"] for event in events} == {"deal_ours"}
    assert last == ours_ids[-1]
    # The campaign's own events: one a step each of its life.
    campaign = feed.page(subject="campaign:cmp_1")["data"]["events"]
    assert [event["sequence"] for event in campaign] == [1, 2, 3, 4]
    # From one of its events: what follows it; with `types`, those types only.
    after_second = feed.page(subject="deal:deal_ours", after=ours_ids[1])["data"]["events"]
    assert [event["id"] for event in after_second] == ours_ids[2:]
    only = feed.page(subject="deal:deal_ours", types="deal.accepted,deal.completed")
    assert [event["id"] for event in only["data"]["events"]] == [ours_ids[0], ours_ids[3]]
    # Nothing newer: an empty page, the cursor back.
    body = feed.page(subject="deal:deal_ours", after=ours_ids[-1])
    assert body["data"]["events"] == []
    assert body["meta"] == {"nextAfter": ours_ids[-1], "cursorExpired": False}
    # A subject with no event: an empty list, not an error.
    assert feed.page(subject="deal:deal_nobody")["data"]["events"] == []

    # `after` must be one of the subject's events: another subject's is named as the mistake.
    refused = feed.get(subject="deal:deal_ours", after=published[1])
    assert refused.status_code == 400, refused.text
    assert refused.json()["errorCode"] == "VALIDATION_ERROR"
    [message] = refused.json()["errors"]["after"]
    assert "deal:deal_theirs" in message and "deal:deal_ours" in message
    # An id that is no event of the brand: 404, as without `subject`.
    assert feed.get(subject="deal:deal_ours", after=new_id("evt")).status_code == 404


def test_subject_order_is_the_sequence_even_when_publish_order_differs(app, brand, feed):
    """A transaction that took its id first but numbers its event second: the feed lists it
    first (publish order), the subject's list second (its place in the deal's life)."""
    with app.app_context():
        db.session.execute(text("SELECT pg_current_xact_id()"))  # this transaction's id first
        with app.app_context():  # another session publishes the deal's first event, and commits
            first = publish_event(brand_id=brand, name="deal.accepted", data={"id": "deal_x"})
            db.session.commit()
        second = publish_event(brand_id=brand, name="deal.completed", data={"id": "deal_x"})
        db.session.commit()
    assert (first.event.sequence, second.event.sequence) == (1, 2)
    in_feed = [event["id"] for event in follow(feed)[0]]
    assert in_feed == [second.event.id, first.event.id]
    in_subject = [event["id"] for event in follow(feed, subject="deal:deal_x", limit=1)[0]]
    assert in_subject == [first.event.id, second.event.id]


def test_wait_with_a_subject_answers_with_that_subjects_next_event(app, brand, feed):
    [after] = publish_of(app, brand, ("deal.accepted", {"id": "deal_w"}))
    thread, answer = _wait_in_background(feed, subject="deal:deal_w", after=after, wait=20)
    time.sleep(1.0)
    publish_of(app, brand, ("deal.accepted", {"id": "deal_other"}))  # wakes it, is not its
    time.sleep(1.0)
    assert "at" not in answer
    [next_one] = publish_of(app, brand, ("deal.completed", {"id": "deal_w"}))
    thread.join(25)
    body = answer["response"].json()
    assert [event["id"] for event in body["data"]["events"]] == [next_one]
    assert body["data"]["events"][0]["sequence"] == 2


@pytest.mark.parametrize(
    "subject",
    ["deal", "deal:", ":deal_1", "robot:deal_1", "Deal:deal_1", "deal:" + "x" * 65, "deal:a\tb"],
)
def test_a_malformed_subject_is_refused_naming_it(feed, subject):
    response = feed.get(subject=subject)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["errorCode"] == "VALIDATION_ERROR"
    assert set(body["errors"]) == {"subject"}


@pytest.mark.parametrize(
    "query",
    [
        {"limit": 0},
        {"limit": 101},
        {"limit": "ten"},
        {"wait": 31},
        {"wait": -1},
        {"wait": 1.5},
        {"after": "whd_01jd3kt0v2w4x6y8z0a2b4c6d8"},
        {"after": "evt_UPPER"},
        {"color": "blue"},
    ],
)
def test_out_of_range_or_unknown_query_parameters_are_refused(feed, query):
    response = feed.get(**query)
    assert response.status_code == 400, response.text
    assert response.json()["errorCode"] == "VALIDATION_ERROR"
    assert set(response.json()["errors"]) == set(query)


def test_another_brands_events_are_not_found(app, brand, make_brand, make_key, server, feed):
    other = make_brand("Other Foods")
    [theirs] = publish(app, other)
    [ours] = publish(app, brand)

    response = feed.event(theirs)
    assert response.status_code == 404
    assert response.json()["errorCode"] == "NOT_FOUND"
    after_theirs = feed.get(after=theirs)
    assert after_theirs.status_code == 404
    assert after_theirs.json()["errorCode"] == "NOT_FOUND"
    assert [event["id"] for event in feed.page()["data"]["events"]] == [ours]
    # A made-up id, recent by its look: not found either.
    assert feed.get(after=new_id("evt")).status_code == 404
    # Their key does not read our brand.
    theirs_key = make_key(other, scopes=("read",))
    foreign = Feed(server, brand, theirs_key).get()
    assert foreign.status_code == 403


def test_a_cursor_older_than_what_is_kept_starts_at_the_oldest_kept_event(app, brand, feed):
    long_ago = utcnow() - timedelta(days=31)  # WEBHOOK_RETENTION_DAYS is 30
    [expired] = publish(app, brand, now=long_ago)  # still stored: a delivery could keep it
    kept = publish(app, brand, count=3)

    body = feed.page(after=expired)
    assert body["meta"]["cursorExpired"] is True
    assert [event["id"] for event in body["data"]["events"]] == kept
    assert body["meta"]["nextAfter"] == kept[-1]
    # Not listed from the start either: only what is kept.
    assert [event["id"] for event in feed.page()["data"]["events"]] == kept
    # Following on from there is not expired any more.
    assert feed.page(after=kept[0])["meta"]["cursorExpired"] is False

    # An event retention deleted: its id says it was made long ago.
    deleted = new_id("evt", at=long_ago)
    body = feed.page(after=deleted)
    assert body["meta"]["cursorExpired"] is True
    assert [event["id"] for event in body["data"]["events"]] == kept

    # An expired cursor with nothing kept after it: an empty list, still expired.
    with app.app_context():
        db.session.execute(text("DELETE FROM webhook_events WHERE id = ANY(:ids)"), {"ids": kept})
        db.session.commit()
    body = feed.page(after=expired)
    assert body["data"]["events"] == []
    assert body["meta"] == {"nextAfter": expired, "cursorExpired": True}


def _wait_in_background(feed: Feed, **query) -> tuple[threading.Thread, dict]:
    answer: dict = {}

    def run() -> None:
        response = feed.get(**query)
        answer["at"] = time.monotonic()
        answer["response"] = response

    thread = threading.Thread(target=run)
    thread.start()
    return thread, answer


def test_wait_answers_as_soon_as_an_event_is_published(app, brand, feed):
    [after] = publish(app, brand)
    delays = []
    for _ in range(3):
        thread, answer = _wait_in_background(feed, after=after, wait=20)
        time.sleep(1.0)  # the request is in, and waiting
        assert "at" not in answer, "answered before anything was published"
        [after] = publish(app, brand)
        published_at = time.monotonic()
        thread.join(25)
        body = answer["response"].json()
        assert [event["id"] for event in body["data"]["events"]] == [after]
        assert body["meta"]["nextAfter"] == after
        delays.append(answer["at"] - published_at)
    # Woken by the publish itself, not by a poll or the 20 s running out: each well under a
    # second on a busy machine, and typically a few milliseconds.
    assert max(delays) < 2.0, delays
    assert statistics.median(delays) < 0.5, delays


def test_wait_with_nothing_published_answers_an_empty_list_after_the_wait(
    app, brand, feed, make_brand
):
    [after] = publish(app, brand)
    started = time.monotonic()
    body = feed.page(after=after, wait=2)
    took = time.monotonic() - started
    assert body["data"]["events"] == []
    assert body["meta"] == {"nextAfter": after, "cursorExpired": False}
    assert 2.0 <= took < 3.5, took

    # Another brand's event wakes the waiter's process, but is not ours: still waits it out.
    thread, answer = _wait_in_background(feed, after=after, wait=2)
    started = time.monotonic()
    other = make_brand("Noisy neighbour")
    time.sleep(0.5)
    publish(app, other, count=3)
    thread.join(10)
    assert answer["response"].json()["data"]["events"] == []
    assert answer["at"] - started >= 2.0


def test_events_behind_an_older_open_transaction_wait_for_it(app, brand, feed):
    """The guarantee, seen from outside: an event committed while an older transaction is
    still open is not listed yet (the older one could still publish an event before it), and
    is listed the moment that transaction ends."""
    [after] = publish(app, brand)
    with an_open_transaction(app) as older:
        [held] = publish(app, brand)
        assert feed.page(after=after)["data"]["events"] == []
        thread, answer = _wait_in_background(feed, after=after, wait=20)
        time.sleep(1.0)
        assert "at" not in answer
        older.commit()
        ended_at = time.monotonic()
    thread.join(25)
    assert [event["id"] for event in answer["response"].json()["data"]["events"]] == [held]
    # Read again within about a second of it ending (the held-back re-reads back off to 1 s).
    assert answer["at"] - ended_at < 2.5


def test_a_transaction_open_in_another_database_holds_nothing_back(app, brand, feed, backends):
    """Transaction ids are shared by the whole server, but only this database's transactions
    can publish: one left open elsewhere on the server (a report, a pg_dump of another
    database) must not stall every brand's feed."""
    [after] = publish(app, brand)
    with backends.postgres.connect_maintenance() as elsewhere:
        elsewhere.autocommit = False
        elsewhere.execute("SELECT pg_current_xact_id()")  # takes a transaction id, stays open
        published = publish(app, brand, count=2)
        assert [event["id"] for event in feed.page(after=after)["data"]["events"]] == published
        elsewhere.rollback()


def _busy_server_connections(app, server: ServerProcess) -> list[tuple[str, str, str]]:
    """The server's database connections that are in a transaction or running a statement."""
    names = [f"brand-api pid={pid}" for pid in server.pids()]
    assert len(names) >= 2  # the arbiter and its worker
    with app.app_context():
        busy = db.session.execute(
            text(
                "SELECT application_name, state, left(query, 80) FROM pg_stat_activity"
                " WHERE datname = current_database()"
                " AND application_name = ANY(:names) AND state <> 'idle'"
            ),
            # Only the server's: the wake-up listener (named `... listener`) asks its
            # connection `SELECT 1` now and then.
            {"names": names},
        ).all()
        db.session.rollback()
    return [tuple(row) for row in busy]


def test_waiting_requests_hold_no_database_connection_and_keep_no_one_out(
    app, brand, feed, server, make_key
):
    [after] = publish(app, brand)
    # 40 waits from 4 keys, each within its cap (tests/test_event_wait_caps.py).
    feeds = [Feed(server, brand, make_key(brand, scopes=("read",))) for _ in range(4)]
    waiting = [_wait_in_background(each, after=after, wait=20) for each in feeds for _ in range(10)]
    time.sleep(2.0)
    assert not any("at" in answer for _, answer in waiting)
    # Sampled a few times: a waiter's re-read may be caught running once, but a connection held
    # in a transaction or by a running statement shows in every sample.
    samples = []
    for _ in range(5):
        samples.append(_busy_server_connections(app, server))
        if not samples[-1]:
            break
        time.sleep(0.2)
    assert samples[-1] == [], samples  # nothing in a transaction, nothing running: all 40 wait

    # The rest of the API answers meanwhile, as quickly as ever.
    started = time.monotonic()
    for _ in range(10):
        assert feed.page(limit=1)["data"]["events"]
    assert time.monotonic() - started < 5.0

    [event_id] = publish(app, brand)
    for thread, answer in waiting:
        thread.join(25)
        assert [e["id"] for e in answer["response"].json()["data"]["events"]] == [event_id]


def test_the_feed_order_is_the_publishing_transactions_order(app, brand):
    """What the columns hold: the transaction's id and the order within it, filled by the
    database on every insert."""
    with app.app_context():
        first = publish_event(brand_id=brand, name="deal.completed", data={}).event.id
        second = publish_event(brand_id=brand, name="deal.completed", data={}).event.id
        db.session.commit()
        [third] = publish(app, brand)
        rows = {
            row.id: row
            for row in db.session.execute(
                select(WebhookEvent.id, WebhookEvent.xact_id, WebhookEvent.position)
            )
        }
        db.session.rollback()
    assert rows[first].xact_id == rows[second].xact_id < rows[third].xact_id
    assert rows[first].position < rows[second].position


def test_the_document_states_every_rule_of_the_events_routes(client):
    spec = client.get("/api/v1/openapi.json").get_json()
    feed = spec["paths"]["/brand/{brandId}/event/fetch-events"]["get"]
    one = spec["paths"]["/brand/{brandId}/event/{eventId}"]["get"]
    subject = re.compile(
        next(p for p in feed["parameters"] if p["name"] == "subject")["schema"]["pattern"]
    )
    assert subject.match("deal:deal_01jd3kf5g7h9j1k3m5n7p9q1r3") and subject.match("brand:brd_1")
    for refused in ("deal", "deal:", "robot:1", "deal:" + "x" * 65):
        assert not subject.match(refused), refused
    assert feed["operationId"] == "fetchEvents" and one["operationId"] == "fetchEvent"
    assert feed["x-required-scope"] == one["x-required-scope"] == "read"
    assert {"400", "401", "403", "404", "429"} <= set(feed["responses"])
    assert "404" in one["responses"]
    query = {p["name"]: p["schema"] for p in feed["parameters"] if p["in"] == "query"}
    assert set(query) == {"after", "limit", "types", "subject", "wait", "sortOrder"}
    assert query["sortOrder"]["enum"] == ["asc", "desc"]
    assert query["sortOrder"]["default"] == "asc"
    assert (query["limit"]["minimum"], query["limit"]["maximum"], query["limit"]["default"]) == (
        1,
        100,
        50,
    )
    assert (query["wait"]["minimum"], query["wait"]["maximum"], query["wait"]["default"]) == (
        0,
        30,
        0,
    )
    assert query["after"]["pattern"] == "^evt_[0-9a-z]{1,36}$"
    types = re.compile(query["types"]["pattern"])
    assert types.match("deal.completed") and types.match("escrow.released,deal.completed")
    for refused in ("", "deal.completed,", "deal.complete", "deal.completed, escrow.held"):
        assert not types.match(refused), refused
    [path_id] = [p for p in one["parameters"] if p["name"] == "eventId"]
    assert path_id["schema"]["pattern"] == "^evt_[0-9a-z]{1,36}$"

    schemas = spec["components"]["schemas"]
    envelope = feed["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    properties = schemas[envelope.split("/")[-1]]["properties"]
    meta = schemas[properties["meta"]["$ref"].split("/")[-1]]["properties"]
    assert set(meta) == {"nextAfter", "cursorExpired"}
    assert meta["nextAfter"]["type"] == ["string", "null"]  # OpenAPI 3.1's nullable
    data = schemas[properties["data"]["$ref"].split("/")[-1]]["properties"]
    event = schemas[data["events"]["items"]["$ref"].split("/")[-1]]["properties"]
    assert set(event) == {"id", "type", "createdAt", "subject", "sequence", "data", "erasedAt"}
    assert event["erasedAt"]["type"] == ["string", "null"]


def test_a_stopping_worker_answers_its_waiting_requests_at_once(app, app_environ, brand, feed):
    [after] = publish(app, brand)
    own = ServerProcess(app_environ, workers=1, threads=None, worker_class=None)
    try:
        waiting = Feed(own, brand, feed.headers["X-Api-Key"])
        thread, answer = _wait_in_background(waiting, after=after, wait=25)
        time.sleep(1.0)
        stopped_at = time.monotonic()
        own.process.send_signal(signal.SIGTERM)
        thread.join(20)
        body = answer["response"].json()
        assert body["data"]["events"] == []
        assert body["meta"]["nextAfter"] == after
        assert answer["at"] - stopped_at < 1.5  # not held until the graceful timeout
    finally:
        own.stop()
