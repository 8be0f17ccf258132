"""Endpoint health (CONTRACT 8.4): the stats route and fetch-endpoints' figures match a count
made by hand from the delivery log, after a real worker delivered to a real receiver; what is
older than 24 hours, or another endpoint's, is left out."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from extensions import db
from models import WebhookAttempt
from services.endpoint_stats import latest_failures
from services.endpoint_urls import UrlPolicy
from services.events import publish_event
from services.webhook_endpoints import register_endpoint
from tests import test_webhook_delivery as delivery
from tests.delivery_states import settle
from tests.helpers import assert_error
from tests.receiver import Receiver, Reply
from tests.test_webhook_delivery import parse_time, publish

api = delivery.api
workers = delivery.workers
start_worker = delivery.start_worker


def percentile(values: list[int], share: float) -> int:
    """Linear interpolation between the closest ranks, as PostgreSQL's percentile_cont."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * share
    low, high = math.floor(position), math.ceil(position)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (position - low))


def add_old_history(app, brand: str, endpoint_id: str) -> None:
    """A delivery and its attempt from 30 hours ago: outside the window."""
    with app.app_context():
        then = datetime.now(UTC) - timedelta(hours=30)
        published = publish_event(
            brand_id=brand,
            name="deal.completed",
            data={},
            only_endpoint_ids=[endpoint_id],
            now=then,
        )
        [old] = published.delivery_ids
        settle([old], "failed", failed_at=then)
        db.session.add(
            WebhookAttempt(
                delivery_id=old,
                endpoint_id=endpoint_id,
                attempt_number=1,
                requested_at=then,
                duration_ms=9999,
                error="HTTP 500",
                request_headers={},
            )
        )
        db.session.commit()


def test_the_stats_match_a_count_by_hand(app, api, brand, receiver, start_worker):
    own = start_worker(WEBHOOK_RETRY_SCHEDULE="1,1", WEBHOOK_ENDPOINT_CONCURRENCY="1")
    endpoint = api.register(receiver.url, events=["deal.completed"])
    other = Receiver()
    try:
        api.register(other.url, events=["deal.completed"])  # its figures are its own
        receiver.reply_with(
            Reply(status=500), Reply(delay=0.05), Reply(status=503), Reply(delay=0.02)
        )
        published = publish(app, brand, *(("deal.completed", {"n": n}) for n in range(4)))
        ids = [d for _, pair in published for d in pair]
        mine = [d for d in ids if api.delivery(d)["endpointId"] == endpoint["id"]]
        for delivery_id in ids:
            api.wait_delivery(delivery_id, "delivered", timeout=20, worker=own)
    finally:
        other.close()
    add_old_history(app, brand, endpoint["id"])

    stats = api.call("GET", f"webhook/{endpoint['id']}/stats")

    attempts = [a for d in mine for a in api.delivery(d)["attempts"]]
    durations = [a["durationMs"] for a in attempts]
    succeeded = [a for a in attempts if a["error"] is None]
    failed = [a for a in attempts if a["error"] is not None]
    assert len(attempts) == 6 and len(succeeded) == 4  # two failures, each retried
    assert stats["endpointId"] == endpoint["id"]
    assert stats["deliveries"] == {"pending": 0, "delivered": 4, "failed": 0}
    assert stats["successRate"] == round(4 / 6, 4)
    assert stats["attemptDurationMs"] == {
        "p50": percentile(durations, 0.5),
        "p95": percentile(durations, 0.95),
    }
    assert stats["lastSuccessAt"] == max(a["requestedAt"] for a in succeeded)
    assert stats["lastFailureAt"] == max(a["requestedAt"] for a in failed)
    window = parse_time(stats["windowEnd"]) - parse_time(stats["windowStart"])
    assert window == timedelta(hours=24)
    assert parse_time(stats["windowEnd"]) <= datetime.now(UTC)

    [listed] = [
        e
        for e in api.call("GET", "webhook/fetch-endpoints")["endpoints"]
        if e["id"] == endpoint["id"]
    ]
    assert listed["successRate24h"] == stats["successRate"]
    assert listed["lastSuccessAt"] == stats["lastSuccessAt"]


def test_an_endpoint_without_attempts_has_empty_figures(api, receiver):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    stats = api.call("GET", f"webhook/{endpoint['id']}/stats")
    assert stats["deliveries"] == {"pending": 0, "delivered": 0, "failed": 0}
    assert stats["successRate"] is None
    assert stats["attemptDurationMs"] == {"p50": None, "p95": None}
    assert stats["lastSuccessAt"] is None and stats["lastFailureAt"] is None


def test_stats_of_another_brands_endpoint_are_not_found(
    api, receiver, make_brand, make_key, client
):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    other = make_brand("Other Foods")
    response = client.get(
        f"/api/v1/brand/{other}/webhook/{endpoint['id']}/stats",
        headers={"X-Api-Key": make_key(other, scopes=("read",))},
    )
    assert_error(response, 404, "NOT_FOUND")


def test_latest_failures_are_each_deliverys_last_failed_attempt_newest_first(app, brand):
    """What the endpoint's dashboard page shows first: one line per delivery that failed (its
    last failed attempt, with the error), newest first; not a success, nor another endpoint's
    failure, nor one older than the window."""
    now = datetime.now(UTC).replace(microsecond=0)
    local = UrlPolicy(https_only=False, allow_local=True)
    with app.app_context():
        endpoint_id, other_id = (
            register_endpoint(brand_id=brand, url=url, events=["deal.completed"], policy=local).id
            for url in ("http://127.0.0.1:9/ours", "http://127.0.0.1:9/theirs")
        )

        def delivery_with(endpoint: str, attempts: list[tuple[int, str | None]]) -> str:
            """A delivery with these attempts (minutes ago, error or None for a success)."""
            [delivery_id] = publish_event(
                brand_id=brand,
                name="deal.completed",
                data={},
                only_endpoint_ids=[endpoint],
                now=now - timedelta(minutes=attempts[0][0] + 1),
            ).delivery_ids
            for number, (minutes, error) in enumerate(attempts, start=1):
                db.session.add(
                    WebhookAttempt(
                        delivery_id=delivery_id,
                        endpoint_id=endpoint,
                        attempt_number=number,
                        requested_at=now - timedelta(minutes=minutes),
                        duration_ms=5,
                        error=error,
                        request_headers={},
                    )
                )
            return delivery_id

        retried = delivery_with(endpoint_id, [(9, "HTTP 500"), (5, "HTTP 503")])
        recovered = delivery_with(endpoint_id, [(8, "Connection refused"), (7, None)])
        delivery_with(endpoint_id, [(25 * 60, "HTTP 500")])  # before the window
        delivery_with(other_id, [(1, "HTTP 500")])  # another endpoint's
        newest = delivery_with(endpoint_id, [(2, "Timed out after 10 s")])
        db.session.commit()
        window = {"start": now - timedelta(hours=24), "end": now}
        failures = latest_failures(endpoint_id, **window, limit=5)
        two = latest_failures(endpoint_id, **window, limit=2)
    shown = [(f.delivery_id, f.attempt_number, f.error) for f in failures]
    assert shown == [
        (newest, 1, "Timed out after 10 s"),
        (retried, 2, "HTTP 503"),
        (recovered, 1, "Connection refused"),
    ]
    assert [f.delivery_id for f in two] == [newest, retried]
    assert {f.event_name for f in failures} == {"deal.completed"}
