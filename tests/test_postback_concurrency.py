"""recordPostback under load and under failure, against real gunicorn server processes
(tests/server_process.py): partners retry aggressively and in parallel, and servers die or hang
in the middle of a request.

What a brand must be able to count on:
- one Idempotency-Key is one conversion, however many requests carry it at once: one row, the
  link counted once, one `conversion.recorded` and one delivery per subscribed endpoint;
- concurrent postbacks with different keys on one link lose no count;
- a request that fails, dies or hangs between taking the key and committing leaves nothing
  behind, and its key can be taken by a retry (at once when it died; after the in-flight window
  when it hangs);
- the route is not throttled per client address.

PostgreSQL and SQLite differ where the SPEC lets them: on PostgreSQL a duplicate that arrives
while the first request is in its transaction is refused at once (409 CONFLICT, Retry-After); on
SQLite writers are serialized, so it waits for the first to commit and replays it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import requests
from sqlalchemy import func, select, text

from app import create_app
from extensions import db
from models import (
    Conversion,
    TrackedLink,
    TrackedLinkConversionCount,
    WebhookDelivery,
    WebhookEvent,
)
from services.endpoint_urls import UrlPolicy
from services.webhook_endpoints import register_endpoint
from tests.helpers import assert_error, assert_success
from tests.platform_factory import PlatformFactory
from tests.server_process import ServerProcess

CONVERSION_RECORDED = "conversion.recorded"
LINK_CODE = "GLOW25"
VALUE_MINOR = 500
CONCURRENT_REQUESTS = 50
SEQUENTIAL_REQUESTS = 200
# Short for the test; production's default is 120 s.
IN_FLIGHT_WINDOW = 2
# How long the hung server sleeps between writing everything and committing: it outlasts the
# window by enough for a retry to take the key over while it still hangs.
HANG_SECONDS = 6
LOCAL_URLS = UrlPolicy(https_only=False, allow_local=True)
T0 = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


# --- the brand, its link and its endpoints ----------------------------------------------------


@dataclass(frozen=True)
class Shop:
    brand_id: str
    api_key: str  # a read key: any key of the brand may record a postback
    campaign_id: str
    deal_id: str
    link_id: str
    subscribed: tuple[str, ...]  # active endpoints subscribed to conversion.recorded
    unsubscribed: str  # an active endpoint that is not

    @property
    def endpoints(self) -> tuple[str, ...]:
        return (*self.subscribed, self.unsubscribed)


@pytest.fixture
def shop(app, make_brand, make_key) -> Shop:
    brand_id = make_brand("Kola Naturals")
    factory = PlatformFactory(app)
    campaign_id = factory.campaign(brand_id, at=T0, published_at=T0 + timedelta(hours=1))
    deal_id = factory.deal(
        campaign_id, at=T0 + timedelta(hours=2), accepted_at=T0 + timedelta(hours=3)
    )
    link_id = factory.link(campaign_id, LINK_CODE, at=T0 + timedelta(hours=4), deal_id=deal_id)
    with app.app_context():
        subscribed = tuple(
            register_endpoint(
                brand_id=brand_id,
                url=f"http://127.0.0.1:9/hooks/{number}",
                events=events,
                policy=LOCAL_URLS,
            ).id
            for number, events in enumerate(
                ([CONVERSION_RECORDED], [CONVERSION_RECORDED, "deal.completed"])
            )
        )
        unsubscribed = register_endpoint(
            brand_id=brand_id,
            url="http://127.0.0.1:9/hooks/deals-only",
            events=["deal.completed"],
            policy=LOCAL_URLS,
        ).id
        db.session.commit()
    return Shop(
        brand_id=brand_id,
        api_key=make_key(brand_id, scopes=("read",)),
        campaign_id=campaign_id,
        deal_id=deal_id,
        link_id=link_id,
        subscribed=subscribed,
        unsubscribed=unsubscribed,
    )


@pytest.fixture(scope="module")
def server(app, app_environ) -> Iterator[ServerProcess]:
    """One normal server (production's settings) shared by the module's tests."""
    process = ServerProcess(app_environ)
    yield process
    process.stop()


# --- what the database holds --------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    conversion: str
    idempotency_key: str
    value_minor: int
    metadata: dict


@dataclass(frozen=True)
class Snapshot:
    """Everything a postback writes, as committed (what any reader sees)."""

    conversions: tuple[Stored, ...]
    link_conversions: int
    link_value_minor: int
    events: int  # conversion.recorded events
    deliveries: dict[str, int]  # endpoint id -> conversion.recorded deliveries, every endpoint


def snapshot(app, shop: Shop) -> Snapshot:
    with app.app_context():
        conversions = tuple(
            Stored(row.id, row.idempotency_key, row.value_minor, row.details)
            for row in db.session.scalars(
                select(Conversion)
                .where(Conversion.brand_id == shop.brand_id)
                .order_by(Conversion.idempotency_key)
            )
        )
        link = db.session.get(TrackedLink, shop.link_id)
        events = db.session.scalar(
            select(func.count()).where(
                WebhookEvent.brand_id == shop.brand_id, WebhookEvent.name == CONVERSION_RECORDED
            )
        )
        per_endpoint = dict(
            db.session.execute(
                select(WebhookDelivery.endpoint_id, func.count())
                .where(
                    WebhookDelivery.brand_id == shop.brand_id,
                    WebhookDelivery.event_name == CONVERSION_RECORDED,
                )
                .group_by(WebhookDelivery.endpoint_id)
            ).all()
        )
        return Snapshot(
            conversions=conversions,
            link_conversions=link.conversions,
            link_value_minor=link.conversion_value_minor,
            events=events,
            deliveries={endpoint: per_endpoint.get(endpoint, 0) for endpoint in shop.endpoints},
        )


def count_slots(app, shop: Shop) -> int:
    with app.app_context():
        return db.session.scalar(
            select(func.count()).where(TrackedLinkConversionCount.link_id == shop.link_id)
        )


def recorded(shop: Shop, count: int, value_minor: int) -> dict:
    """The counts `count` conversions worth `value_minor` in all leave behind."""
    return {
        "conversions": count,
        "link_conversions": count,
        "link_value_minor": value_minor,
        "events": count,
        "deliveries": {
            **{endpoint: count for endpoint in shop.subscribed},
            shop.unsubscribed: 0,
        },
    }


def counts(state: Snapshot) -> dict:
    return {
        "conversions": len(state.conversions),
        "link_conversions": state.link_conversions,
        "link_value_minor": state.link_value_minor,
        "events": state.events,
        "deliveries": state.deliveries,
    }


# --- talking to a real server -------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict
    retry_after: str | None
    elapsed: float

    @property
    def data(self) -> dict:
        return self.body["data"]


def new_key(label: str = "order") -> str:
    return f"{label}-{uuid.uuid4().hex}"


def send_postback(
    base_url: str,
    shop: Shop,
    key: str,
    *,
    value_minor: int = VALUE_MINOR,
    metadata: dict | None = None,
    session: requests.Session | None = None,
    timeout: float = 30.0,
) -> Answer:
    started = time.monotonic()
    response = (session or requests).post(
        f"{base_url}/api/v1/brand/{shop.brand_id}/conversion/record-postback",
        headers={"X-Api-Key": shop.api_key, "Idempotency-Key": key},
        json={
            "eventType": "purchase",
            "linkCode": LINK_CODE,
            "clickId": "clk_8f2a61",
            "valueMinor": value_minor,
            "currency": "NGN",
            "metadata": metadata or {},
        },
        timeout=timeout,
    )
    body = response.json()
    assert body["statusCode"] == response.status_code, body
    assert body["requestId"] == response.headers["X-Request-Id"], body
    return Answer(
        response.status_code,
        body,
        response.headers.get("Retry-After"),
        time.monotonic() - started,
    )


def assert_created(answer: Answer, shop: Shop) -> str:
    """A new conversion, counted on the shop's link; its id."""
    assert answer.status == 201, answer.body
    assert answer.body["status"] is True
    data = answer.data
    assert data["replay"] is False, data
    assert data["attributed"] is True
    assert (data["campaignId"], data["dealId"]) == (shop.campaign_id, shop.deal_id)
    return data["conversionId"]


def assert_replay(answer: Answer, conversion_id: str) -> None:
    assert answer.status == 200, answer.body
    assert answer.body["status"] is True
    assert answer.data["replay"] is True, answer.data
    assert answer.data["conversionId"] == conversion_id


def assert_conflict(answer: Answer) -> None:
    assert answer.status == 409, answer.body
    assert answer.body["status"] is False
    assert answer.body["errorCode"] == "CONFLICT", answer.body
    assert answer.retry_after is not None and answer.retry_after.isdigit(), answer.retry_after
    assert int(answer.retry_after) >= 1


def all_at_once(count: int, send: Callable[[int], Answer]) -> list[Answer]:
    """`send(i)` for i in range(count), each in its own thread, released together."""
    barrier = threading.Barrier(count)

    def one(number: int) -> Answer:
        barrier.wait(timeout=30)
        return send(number)

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(one, range(count)))


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str) -> float:
    """Poll `condition` until true; when it became true (time.monotonic())."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


# --- 1. concurrent retries ----------------------------------------------------------------------


def test_fifty_concurrent_postbacks_with_one_key_record_one_conversion(app, server, shop):
    key = new_key()
    # Every request carries its own body; the one answered 201 is the one stored and counted.
    answers = all_at_once(
        CONCURRENT_REQUESTS,
        lambda number: send_postback(
            server.url,
            shop,
            key,
            value_minor=VALUE_MINOR + number,
            metadata={"attempt": number},
        ),
    )

    statuses = Counter(answer.status for answer in answers)
    assert set(statuses) <= {200, 201, 409}, [a.body for a in answers if a.status >= 400]
    winners = [number for number, answer in enumerate(answers) if answer.status == 201]
    assert len(winners) == 1, statuses
    winner = winners[0]
    conversion_id = assert_created(answers[winner], shop)
    for answer in answers:
        if answer.status == 200:
            assert_replay(answer, conversion_id)
        elif answer.status == 409:
            assert_conflict(answer)

    state = snapshot(app, shop)
    assert state.conversions == (
        Stored(conversion_id, key, VALUE_MINOR + winner, {"attempt": winner}),
    )
    assert counts(state) == recorded(shop, 1, VALUE_MINOR + winner)

    # Once the storm is over, the key replays the winner, whatever this body says.
    assert_replay(send_postback(server.url, shop, key, value_minor=1), conversion_id)
    assert snapshot(app, shop) == state


def test_fifty_concurrent_postbacks_with_different_keys_lose_no_count(app, server, shop):
    keys = [new_key(f"order-{number:02d}") for number in range(CONCURRENT_REQUESTS)]
    answers = all_at_once(
        CONCURRENT_REQUESTS,
        lambda number: send_postback(
            server.url, shop, keys[number], value_minor=VALUE_MINOR + number
        ),
    )

    conversion_ids = [assert_created(answer, shop) for answer in answers]
    assert len(set(conversion_ids)) == CONCURRENT_REQUESTS
    state = snapshot(app, shop)
    assert {(c.idempotency_key, c.conversion) for c in state.conversions} == set(
        zip(keys, conversion_ids, strict=True)
    )
    total = sum(VALUE_MINOR + number for number in range(CONCURRENT_REQUESTS))
    assert counts(state) == recorded(shop, CONCURRENT_REQUESTS, total)
    # Counted in more than one of the link's slots: they did not all queue on one row.
    assert count_slots(app, shop) > 1


# --- 2. failure between taking the key and committing -------------------------------------------


def test_an_unexpected_error_before_commit_leaves_nothing_and_frees_the_key(
    app, app_environ, client, shop
):
    nothing = snapshot(app, shop)
    assert counts(nothing) == recorded(shop, 0, 0)
    key = new_key()
    path = f"/api/v1/brand/{shop.brand_id}/conversion/record-postback"
    headers = {"X-Api-Key": shop.api_key, "Idempotency-Key": key}
    body = {"eventType": "purchase", "linkCode": LINK_CODE, "valueMinor": VALUE_MINOR}

    failing = create_app({**app_environ, "FAILPOINTS": "postback.before_commit=raise"})
    try:
        response = failing.test_client().post(path, headers=headers, json=body)
    finally:
        with failing.app_context():
            db.engine.dispose()
    assert_error(response, 500, "INTERNAL_ERROR")
    assert snapshot(app, shop) == nothing

    # The key is free: the retry records the conversion (not a replay) and counts it once.
    data = assert_success(client.post(path, headers=headers, json=body), 201)
    assert data["replay"] is False
    assert (data["campaignId"], data["dealId"]) == (shop.campaign_id, shop.deal_id)
    again = assert_success(client.post(path, headers=headers, json=body), 200)
    assert (again["replay"], again["conversionId"]) == (True, data["conversionId"])
    state = snapshot(app, shop)
    assert [c.conversion for c in state.conversions] == [data["conversionId"]]
    assert counts(state) == recorded(shop, 1, VALUE_MINOR)


def test_a_server_dying_before_commit_leaves_nothing_and_frees_the_key(
    app, app_environ, server, shop
):
    nothing = snapshot(app, shop)
    key = new_key()
    with ExitStack() as cleanup:
        crashing = ServerProcess(app_environ, FAILPOINTS="postback.before_commit=exit")
        cleanup.callback(crashing.stop)

        # The worker process ends mid-request: the client gets no answer at all.
        with pytest.raises(requests.ConnectionError):
            send_postback(crashing.url, shop, key, timeout=10)
        wait_until(
            lambda: "exited with code 70" in crashing.output(),
            timeout=10,
            what="gunicorn reports its worker died at the failpoint (os._exit(70))",
        )
        assert snapshot(app, shop) == nothing

        # The dead request let go of its key at once: the retry is a new conversion.
        retry = send_postback(server.url, shop, key)
        conversion_id = assert_created(retry, shop)
    assert_replay(send_postback(server.url, shop, key), conversion_id)
    state = snapshot(app, shop)
    assert [c.conversion for c in state.conversions] == [conversion_id]
    assert counts(state) == recorded(shop, 1, VALUE_MINOR)


def in_flight_probe(app) -> Callable[[], bool]:
    """True while some request is inside a postback transaction that has taken a key."""

    def advisory_lock_held() -> bool:
        with app.app_context():
            return bool(
                db.session.scalar(
                    text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND granted AND database = "
                        "(SELECT oid FROM pg_database WHERE datname = current_database())"
                    )
                )
            )

    return advisory_lock_held


def test_a_hung_postback_holds_its_key_until_the_in_flight_window_ends(app, app_environ, shop):
    hang = HANG_SECONDS
    window = {"POSTBACK_IN_FLIGHT_WINDOW": str(IN_FLIGHT_WINDOW)}
    nothing = snapshot(app, shop)
    key = new_key()
    with ExitStack() as cleanup:
        hung = ServerProcess(
            app_environ, FAILPOINTS=f"postback.before_commit=sleep:{hang}", **window
        )
        cleanup.callback(hung.stop)
        other = ServerProcess(app_environ, **window)
        cleanup.callback(other.stop)
        # Use the key once first, so that the only writer from now on is the postback.
        assert requests.get(
            f"{hung.url}/api/v1/brand/{shop.brand_id}/conversion/fetch-postbacks",
            headers={"X-Api-Key": shop.api_key},
            timeout=10,
        ).ok

        first: dict[str, Answer | BaseException] = {}

        def send_to_hung_server() -> None:
            try:
                first["answer"] = send_postback(hung.url, shop, key, timeout=hang + 20)
            except BaseException as error:  # reported by the assertions below
                first["answer"] = error

        hanging = threading.Thread(target=send_to_hung_server, daemon=True)
        hanging.start()
        in_flight = in_flight_probe(app)
        took_key_at = wait_until(
            lambda: in_flight() or not hanging.is_alive(),
            timeout=10,
            what="the first request takes the key and hangs before committing",
        )
        assert hanging.is_alive(), first
        # Everything is written and nothing is visible: no reader sees half a conversion.
        assert snapshot(app, shop) == nothing

        # Refused at once, not queued behind the hung request.
        conflict = send_postback(other.url, shop, key)
        assert_conflict(conflict)
        assert conflict.elapsed < 1.0, conflict.elapsed

        # The database ends the hung transaction when the window has passed; the key is
        # then free for a retry, while the first request still hangs.
        deadline = took_key_at + IN_FLIGHT_WINDOW + 10
        retry = send_postback(other.url, shop, key)
        while retry.status == 409 and time.monotonic() < deadline:
            assert_conflict(retry)
            time.sleep(0.2)
            retry = send_postback(other.url, shop, key)
        taken_over_at = time.monotonic()
        conversion_id = assert_created(retry, shop)
        assert taken_over_at - took_key_at >= IN_FLIGHT_WINDOW / 2
        assert hanging.is_alive(), "the takeover came only after the hung request ended"

        hanging.join(hang + 25)
        answer = first.get("answer", "no answer yet")
        assert isinstance(answer, Answer), answer
        # Its session was terminated: when it wakes it cannot commit, and says the
        # database is unavailable (retry), not that something unexpected broke.
        assert answer.status == 503, answer.body
        assert answer.body["errorCode"] == "SERVICE_UNAVAILABLE"

        assert_replay(send_postback(other.url, shop, key), conversion_id)
        state = snapshot(app, shop)
        assert [c.conversion for c in state.conversions] == [conversion_id]
        assert counts(state) == recorded(shop, 1, VALUE_MINOR)


# --- 3. no throttling per address ---------------------------------------------------------------


def test_two_hundred_postbacks_from_one_address_are_all_recorded_quickly(app, server, shop):
    keys = [new_key(f"order-{number:03d}") for number in range(SEQUENTIAL_REQUESTS)]
    started = time.monotonic()
    with requests.Session() as session:
        answers = [send_postback(server.url, shop, key, session=session) for key in keys]
    elapsed = time.monotonic() - started

    assert Counter(answer.status for answer in answers) == {201: SEQUENTIAL_REQUESTS}
    assert all(answer.retry_after is None for answer in answers)
    assert elapsed < 20, f"{SEQUENTIAL_REQUESTS} postbacks took {elapsed:.1f} s"
    state = snapshot(app, shop)
    assert counts(state) == recorded(shop, SEQUENTIAL_REQUESTS, SEQUENTIAL_REQUESTS * VALUE_MINOR)
