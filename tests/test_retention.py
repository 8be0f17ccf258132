"""Retention (CONTRACT 1, WEBHOOK_RETENTION_DAYS): settled deliveries older than the retention go
with their attempts, then the old events no delivery refers to; in batches, each its own
transaction; a worker does it by itself; the delivery log keeps answering meanwhile; and the log
says how far back it goes."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import select, text, update
from sqlalchemy.exc import IntegrityError

from extensions import db
from models import WebhookAttempt, WebhookDelivery, WebhookEvent
from models.columns import utcnow
from models.webhook_delivery import DELIVERED, FAILED
from services.deliveries import redeliver
from services.events import publish_event
from services.retention import PURGE_LOCK_KEY, delete_expired_deliveries
from tests.dashboard import sign_in
from tests.helpers import assert_success
from tests.worker_process import WorkerProcess
from workers.connection import redis_connection
from workers.retention import PURGE_GATE

HOOK_URL = "https://hooks.brand-example.invalid/x"
RETENTION = timedelta(days=30)


def register(client, brand_id: str, key: str) -> str:
    response = client.post(
        f"/api/v1/brand/{brand_id}/webhook/register-endpoint",
        json={"url": HOOK_URL, "events": ["deal.completed"]},
        headers={"X-Api-Key": key},
    )
    return assert_success(response, 201)["id"]


def publish(app, brand_id: str, *, age: timedelta, status: str, name="deal.completed") -> tuple:
    """An event published `age` ago, its delivery settled as `status` with one attempt; the
    (event id, delivery id or None)."""
    with app.app_context():
        at = utcnow() - age
        published = publish_event(brand_id=brand_id, name=name, data={"x": 1}, now=at)
        delivery_id = (published.delivery_ids or [None])[0]
        if delivery_id is not None and status != "pending":
            _settle(delivery_id, status, at)
        db.session.commit()
        return published.event.id, delivery_id


def _settle(delivery_id: str, status: str, at) -> None:
    delivery = db.session.get(WebhookDelivery, delivery_id)
    db.session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == delivery_id)
        .values(status=status, attempt_count=1, next_attempt_at=None)
    )
    db.session.add(
        WebhookAttempt(
            delivery_id=delivery_id,
            attempt_number=1,
            endpoint_id=delivery.endpoint_id,
            requested_at=at,
            duration_ms=12,
            http_status=200 if status == DELIVERED else 500,
            error=None if status == DELIVERED else "HTTP 500",
            request_headers={},
        )
    )


def purge(app, **options):
    with app.app_context(), db.engine.connect() as connection:
        return delete_expired_deliveries(connection, now=utcnow(), retention=RETENTION, **options)


def remaining(app, model, ids) -> set[str]:
    with app.app_context():
        column = model.id
        found = set(db.session.scalars(select(column).where(column.in_(list(ids)))))
        db.session.remove()
        return found


def insert_old_deliveries(app, brand_id: str, endpoint_id: str, count: int, age: timedelta):
    """`count` delivered deliveries of one event `age` old, each with an attempt (SQL: fast)."""
    with app.app_context():
        params = {"brand": brand_id, "endpoint": endpoint_id, "count": count, "age": age}
        db.session.execute(
            text(
                "INSERT INTO webhook_events (id, brand_id, name, body, created_at,"
                " subject_type, subject_id, sequence)"
                " VALUES ('evt_bulk', :brand, 'deal.completed', '{}', now() - :age,"
                " 'event', 'evt_bulk', 1)"
            ),
            params,
        )
        db.session.execute(
            text(
                "INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name,"
                " status, http_status, attempt_count, created_at)"
                " SELECT 'whd_bulk' || lpad(i::text, 8, '0'), :brand, :endpoint, 'evt_bulk',"
                " 'deal.completed', 'delivered', 200, 1, now() - :age + i * interval '1 ms'"
                " FROM generate_series(1, :count) AS i"
            ),
            params,
        )
        db.session.execute(
            text(
                "INSERT INTO webhook_attempts (delivery_id, endpoint_id, attempt_number,"
                " requested_at, duration_ms, http_status, request_headers)"
                " SELECT id, endpoint_id, 1, created_at, 10, 200, '{}' FROM webhook_deliveries"
                " WHERE event_id = 'evt_bulk'"
            )
        )
        db.session.commit()


def test_only_what_is_old_and_settled_goes(app, client, brand, write_key, make_brand, make_key):
    endpoint = register(client, brand, write_key)
    old_delivered = publish(app, brand, age=timedelta(days=31), status=DELIVERED)
    old_failed = publish(app, brand, age=timedelta(days=40), status=FAILED)
    old_pending = publish(app, brand, age=timedelta(days=31), status="pending")
    young = publish(app, brand, age=timedelta(days=29), status=DELIVERED)
    # An old event nobody subscribes to: no delivery at all.
    old_unsent, _ = publish(
        app, brand, age=timedelta(days=31), status=DELIVERED, name="deal.accepted"
    )
    # An old event redelivered yesterday: its old delivery goes, the event and the new one stay.
    redelivered = publish(app, brand, age=timedelta(days=31), status=FAILED)
    with app.app_context():
        recent = redeliver(
            brand_id=brand, delivery_id=redelivered[1], now=utcnow() - timedelta(days=1)
        )
        db.session.commit()
    other_brand = make_brand("Other")
    make_key(other_brand)
    other = publish(app, other_brand, age=timedelta(days=31), status=DELIVERED)
    assert endpoint and other[1] is None  # the other brand has no endpoint: an event alone

    purged = purge(app)

    assert (purged.deliveries, purged.attempts, purged.events) == (3, 3, 4)
    assert not purged.skipped
    kept = remaining(
        app,
        WebhookDelivery,
        [old_delivered[1], old_failed[1], old_pending[1], young[1], redelivered[1], recent],
    )
    assert kept == {old_pending[1], young[1], recent}
    events = (old_delivered, old_failed, old_pending, young, redelivered, other)
    kept_events = remaining(app, WebhookEvent, [old_unsent, *(pair[0] for pair in events)])
    # The pending delivery's event and the redelivered event are still referred to.
    assert kept_events == {old_pending[0], young[0], redelivered[0]}
    with app.app_context():
        attempts = set(db.session.scalars(select(WebhookAttempt.delivery_id)))
    assert attempts == {young[1]}

    # Nothing more to do; once the old pending delivery settles, it goes with its event.
    assert (purge(app).deliveries, purge(app).events) == (0, 0)
    with app.app_context():
        _settle(old_pending[1], FAILED, utcnow() - timedelta(days=31))
        db.session.commit()
    purged = purge(app)
    assert (purged.deliveries, purged.events) == (1, 1)


def test_each_batch_is_its_own_transaction(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    insert_old_deliveries(app, brand, endpoint, 25, timedelta(days=31))
    seen_between_batches = []

    def count_left() -> bool:
        # Asked before each batch, on another connection: what the batches before committed.
        with app.app_context():
            seen_between_batches.append(
                db.session.scalar(text("SELECT count(*) FROM webhook_deliveries"))
            )
            db.session.remove()
        return True

    commits = []
    with app.app_context(), db.engine.connect() as connection:
        sa_event.listen(connection, "commit", lambda conn: commits.append(1))
        purged = delete_expired_deliveries(
            connection, now=utcnow(), retention=RETENTION, batch_size=10, keep_going=count_left
        )

    assert (purged.deliveries, purged.attempts, purged.events) == (25, 25, 1)
    assert purged.largest_batch == 10
    # 10 + 10 + 5 deliveries and the batch that finds none; the event and the one after it.
    assert purged.batches == 6
    assert seen_between_batches[:4] == [25, 15, 5, 0]
    assert len(commits) >= purged.batches


def test_a_purge_already_running_is_not_doubled(app):
    with app.app_context(), db.engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:key)"), {"key": PURGE_LOCK_KEY})
        try:
            assert purge(app).skipped
        finally:
            holder.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": PURGE_LOCK_KEY})
    assert not purge(app).skipped


def test_an_event_a_delivery_refers_to_cannot_be_deleted(app, client, brand, write_key):
    """The foreign key no longer cascades: a purge racing a redelivery fails its batch rather
    than deleting the young delivery with the old event."""
    register(client, brand, write_key)
    event_id, delivery_id = publish(app, brand, age=timedelta(days=31), status=DELIVERED)
    with app.app_context(), pytest.raises(IntegrityError), db.engine.begin() as connection:
        connection.execute(text("DELETE FROM webhook_events WHERE id = :id"), {"id": event_id})
    assert remaining(app, WebhookDelivery, [delivery_id]) == {delivery_id}


def test_the_delivery_log_keeps_answering_during_a_large_purge(app, client, brand, write_key):
    endpoint = register(client, brand, write_key)
    insert_old_deliveries(app, brand, endpoint, 20_000, timedelta(days=31))
    young = {publish(app, brand, age=timedelta(hours=1), status=DELIVERED)[1] for _ in range(3)}
    batches = []
    midway, read_midway = threading.Event(), threading.Event()

    def keep_going() -> bool:
        batches.append(1)
        if len(batches) == 5:
            # Stop halfway until the log has been read with the purge under way.
            midway.set()
            read_midway.wait(60)
        return True

    result = {}
    purging = threading.Thread(
        target=lambda: result.setdefault(
            "purged", purge(app, batch_size=500, keep_going=keep_going)
        )
    )
    purging.start()
    reads = 0
    reads_during = 0
    try:
        assert midway.wait(60)
        while purging.is_alive() or reads < 6:
            page = client.get(
                f"/api/v1/brand/{brand}/webhook/fetch-deliveries",
                query_string={"limit": 3},
                headers={"X-Api-Key": write_key},
            )
            listed = {delivery["id"] for delivery in assert_success(page)["deliveries"]}
            assert listed == young  # newest first: the young ones, whatever is being deleted
            detail = client.get(
                f"/api/v1/brand/{brand}/webhook/deliveries/{next(iter(young))}",
                headers={"X-Api-Key": write_key},
            )
            assert_success(detail)
            reads += 1
            reads_during += purging.is_alive()
            if reads == 3:
                read_midway.set()
    finally:
        read_midway.set()
        purging.join(120)
    assert result["purged"].deliveries == 20_000
    assert reads_during >= 3
    assert remaining(app, WebhookDelivery, young) == young


def test_the_dashboard_log_says_how_far_back_it_goes(app, client, brand, write_key):
    register(client, brand, write_key)
    sign_in(client, write_key)
    page = client.get("/dashboard/deliveries")
    assert page.status_code == 200
    assert "kept for 30 days" in page.text
    assert "the oldest here" not in page.text  # no delivery yet
    _, oldest = publish(app, brand, age=timedelta(days=3), status=DELIVERED)
    with app.app_context():
        created = db.session.get(WebhookDelivery, oldest).created_at
    page = client.get("/dashboard/deliveries")
    assert "kept for 30 days" in page.text
    assert f'the oldest here was created <time datetime="{created:%Y-%m-%dT%H:%M:%S}' in page.text
    events_page = client.get("/dashboard/events")
    assert "kept for 30 days" in events_page.text


def test_the_command_purges_and_prints_counts(app, client, runner, brand, write_key):
    register(client, brand, write_key)
    publish(app, brand, age=timedelta(days=31), status=DELIVERED)
    result = runner.invoke(args=["events", "purge-expired", "--batch-size", "10"])
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)
    assert counts | {"batches": None} == {
        "deliveries": 1,
        "attempts": 1,
        "events": 1,
        "batches": None,
        "largest_batch": 1,
        "skipped": False,
    }


def test_a_worker_purges_by_itself(app, app_environ, client, brand, write_key):
    register(client, brand, write_key)
    _, old = publish(app, brand, age=timedelta(days=2), status=DELIVERED)
    _, young = publish(app, brand, age=timedelta(hours=2), status=DELIVERED)
    redis_connection(app).delete(PURGE_GATE)  # another test's worker may have purged just now
    worker = WorkerProcess(app_environ, WEBHOOK_RETENTION_DAYS="1")
    try:
        deadline = time.monotonic() + 60
        while remaining(app, WebhookDelivery, [old]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert remaining(app, WebhookDelivery, [old, young]) == {young}, worker.output()
    finally:
        worker.stop()
    assert "retention purge deleted" in worker.output()
