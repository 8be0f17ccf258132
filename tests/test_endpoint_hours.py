"""fetch-endpoints' 24-hour figures (CONTRACT 8.4: `successRate24h`, `lastSuccessAt`) come from
the counts the database keeps per endpoint and hour (models/endpoint_hours.py). They must be
what counting the attempts themselves gives, for any window and however the attempts were
written: many in one statement, one at a time, late into an hour already counted. The
migration counts the attempts already there, and retention drops hours no window reads."""

from __future__ import annotations

from datetime import timedelta

from flask_migrate import downgrade, upgrade
from sqlalchemy import insert, select, text

from extensions import db
from models import EndpointHour, WebhookAttempt
from models.columns import utcnow
from services.endpoint_stats import attempt_figures, counted_figures
from services.events import publish_event
from services.retention import delete_expired_deliveries
from services.webhook_endpoints import current_url_policy, register_endpoint
from tests.helpers import assert_success
from tests.scratch_schema import insert_brand_with_endpoints, migrated_to

WINDOW = timedelta(hours=24)


def _endpoint_with_a_delivery(brand_id: str, name: str) -> tuple[str, str]:
    endpoint = register_endpoint(
        brand_id=brand_id,
        url=f"https://hooks.brand-example.invalid/{name}",
        events=["deal.completed"],
        policy=current_url_policy(),
    )
    [delivery] = publish_event(
        brand_id=brand_id, name="deal.completed", data={}, only_endpoint_ids=[endpoint.id]
    ).delivery_ids
    return endpoint.id, delivery


def _attempt(delivery_id: str, endpoint_id: str, number: int, at, ok: bool) -> dict:
    return {
        "delivery_id": delivery_id,
        "endpoint_id": endpoint_id,
        "attempt_number": number,
        "requested_at": at,
        "duration_ms": 10,
        "http_status": 200 if ok else 500,
        "error": None if ok else "HTTP 500",
        "request_headers": {},
    }


def _history(app, brand: str, now) -> list[str]:
    """Two endpoints' attempts over 30 hours back from `now`, on and around hour boundaries and
    the edges of the window, written in a batch of 60, one by one, and late: an attempt made
    five hours ago written last. The endpoints' ids."""
    with app.test_request_context():
        (first, first_delivery), (second, second_delivery) = (
            _endpoint_with_a_delivery(brand, "a"),
            _endpoint_with_a_delivery(brand, "b"),
        )
        on_the_hour = now.replace(minute=0, second=0, microsecond=0)
        moments = [now - timedelta(minutes=37 * n) for n in range(50)]  # every minute of hours
        moments += [on_the_hour - timedelta(hours=n) for n in range(26)]
        moments += [now, now - WINDOW, now - WINDOW - timedelta(microseconds=1)]
        rows = [
            _attempt(*pair, number, at, ok=number % 3 != 0)
            for number, at in enumerate(moments, start=1)
            for pair in ((first_delivery, first), (second_delivery, second))
            if not (pair[1] == second and number % 2)
        ]
        # Hours are UTC's, whatever the session's time zone (India's is 5:30 off the hour).
        db.session.execute(text("SET LOCAL TIME ZONE 'Asia/Kolkata'"))
        db.session.execute(insert(WebhookAttempt), rows[:60])  # one statement
        for row in rows[60:]:
            db.session.execute(insert(WebhookAttempt), [row])
        late = _attempt(first_delivery, first, 1000, now - timedelta(hours=5, minutes=1), ok=True)
        db.session.execute(insert(WebhookAttempt), [late])
        db.session.commit()
    return [first, second]


def test_hour_counts_give_what_counting_the_attempts_gives_for_any_window(app, brand):
    now = utcnow()
    endpoints = _history(app, brand, now)
    on_the_hour = now.replace(minute=0, second=0, microsecond=0)
    with app.app_context():
        assert db.session.scalar(select(EndpointHour.attempts).limit(1)) is not None
        for end in (
            now,
            on_the_hour,
            on_the_hour + timedelta(minutes=30),
            now - timedelta(hours=3, minutes=11),
            now - timedelta(minutes=20),
        ):
            start = end - WINDOW
            counted = counted_figures(endpoints, start=start, end=end)
            assert counted == attempt_figures(endpoints, start=start, end=end, durations=False)
            assert all(figures.attempts for figures in counted.values())
        # A window shorter than an hour has no whole hour: it reads the attempts.
        end, start = now, now - timedelta(minutes=20)
        assert counted_figures(endpoints, start=start, end=end) == attempt_figures(
            endpoints, start=start, end=end, durations=False
        )


def test_fetch_endpoints_shows_the_counted_figures(app, client, brand, read_key):
    now = utcnow()
    endpoints = _history(app, brand, now - timedelta(minutes=2))  # clear of the window's edges
    response = client.get(
        f"/api/v1/brand/{brand}/webhook/fetch-endpoints", headers={"X-Api-Key": read_key}
    )
    listed = {e["id"]: e for e in assert_success(response)["endpoints"]}
    with app.app_context():
        for endpoint_id in endpoints:
            attempts = list(
                db.session.scalars(
                    select(WebhookAttempt).where(
                        WebhookAttempt.endpoint_id == endpoint_id,
                        WebhookAttempt.requested_at >= now - WINDOW + timedelta(minutes=1),
                    )
                )
            )
            ok = [a.requested_at for a in attempts if a.error is None]
            assert listed[endpoint_id]["successRate24h"] == round(len(ok) / len(attempts), 4)
            last = max(ok).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            assert listed[endpoint_id]["lastSuccessAt"] == last


def test_retention_drops_the_hours_no_window_reads(app, brand):
    now = utcnow()
    with app.test_request_context():
        endpoint, _ = _endpoint_with_a_delivery(brand, "a")
        for age in (timedelta(days=3), timedelta(days=2, hours=1), timedelta(hours=30)):
            hour = (now - age).replace(minute=0, second=0, microsecond=0)
            db.session.add(EndpointHour(endpoint_id=endpoint, hour=hour, attempts=1, succeeded=1))
        db.session.commit()
        with db.engine.connect() as connection:
            delete_expired_deliveries(connection, now=now, retention=timedelta(days=30))
        kept = list(db.session.scalars(select(EndpointHour.hour)))
    assert kept == [(now - timedelta(hours=30)).replace(minute=0, second=0, microsecond=0)]


def test_the_migration_counts_the_attempts_already_made_and_goes_down(app_environ, backends):
    with migrated_to(app_environ, backends, "0014"):
        with db.engine.begin() as connection:
            insert_brand_with_endpoints(connection)
            for statement in (
                "INSERT INTO webhook_events (id, brand_id, name, body, created_at,"
                " subject_type, subject_id, sequence) VALUES ('evt_m', 'brd_m',"
                " 'deal.completed', '{}', now(), 'event', 'evt_m', 1)",
                "INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id,"
                " event_name, status, attempt_count, created_at) VALUES ('whd_m', 'brd_m',"
                " 'whe_m', 'evt_m', 'deal.completed', 'delivered', 4, now())",
                # Two failures and a success this hour; one a week ago, counted nowhere.
                "INSERT INTO webhook_attempts (delivery_id, endpoint_id, attempt_number,"
                " requested_at, duration_ms, error, request_headers)"
                " SELECT 'whd_m', 'whe_m', n, CASE n WHEN 1 THEN now() - interval '7 days'"
                " ELSE date_trunc('hour', now()) + (n || ' seconds')::interval END, 10,"
                " CASE WHEN n < 4 THEN 'HTTP 500' END, '{}' FROM generate_series(1, 4) n",
            ):
                connection.execute(text(statement))
        upgrade(revision="0015")
        with db.engine.begin() as connection:
            hours = connection.execute(
                text("SELECT attempts, succeeded FROM webhook_endpoint_hours")
            ).all()
            assert [tuple(row) for row in hours] == [(3, 1)]
        downgrade(revision="0014")
        with db.engine.begin() as connection:
            connection.execute(
                text(
                    "INSERT INTO webhook_attempts (delivery_id, endpoint_id, attempt_number,"
                    " requested_at, duration_ms, request_headers) VALUES ('whd_m', 'whe_m',"
                    " 5, now(), 10, '{}')"
                )
            )


def test_two_sessions_count_one_endpoints_hour_without_waiting_for_each_other(app, brand):
    """Two workers recording attempts of one endpoint in the same hour: the second's insert
    goes on while the first's transaction is still open (it used to wait for that commit on
    the hour's one counter row), and the figures count both."""
    now = utcnow()
    with app.test_request_context():
        endpoint, delivery = _endpoint_with_a_delivery(brand, "a")
        db.session.commit()
        first, second = db.engine.connect(), db.engine.connect()
        try:
            first.execute(insert(WebhookAttempt), [_attempt(delivery, endpoint, 1, now, ok=True)])
            second.execute(text("SET LOCAL lock_timeout = '2s'"))
            second.execute(insert(WebhookAttempt), [_attempt(delivery, endpoint, 2, now, ok=False)])
            second.commit()
            first.commit()
        finally:
            first.close()
            second.close()
        writers = db.session.scalars(
            select(EndpointHour.writer).where(EndpointHour.endpoint_id == endpoint)
        ).all()
        assert len(set(writers)) == 2
        hour = now.replace(minute=0, second=0, microsecond=0)
        counted = counted_figures([endpoint], start=hour, end=hour + timedelta(hours=1))
        assert (counted[endpoint].attempts, counted[endpoint].succeeded) == (2, 1)


def test_the_per_session_rows_sum_back_into_one_going_down(app_environ, backends):
    with migrated_to(app_environ, backends, "0020"):
        with db.engine.begin() as connection:
            insert_brand_with_endpoints(connection)
            connection.execute(
                text(
                    "INSERT INTO webhook_endpoint_hours (endpoint_id, hour, writer, attempts,"
                    " succeeded, last_success_at, last_failure_at) VALUES"
                    " ('whe_m', '2026-11-28 10:00Z', 11, 3, 1, '2026-11-28 10:05Z',"
                    " '2026-11-28 10:03Z'), ('whe_m', '2026-11-28 10:00Z', 12, 2, 2,"
                    " '2026-11-28 10:09Z', NULL)"
                )
            )
        downgrade(revision="0019")
        with db.engine.begin() as connection:
            rows = connection.execute(
                text(
                    "SELECT attempts, succeeded, to_char(last_success_at AT TIME ZONE 'UTC',"
                    " 'HH24:MI'), to_char(last_failure_at AT TIME ZONE 'UTC', 'HH24:MI')"
                    " FROM webhook_endpoint_hours"
                )
            ).all()
        assert [tuple(row) for row in rows] == [(5, 3, "10:09", "10:03")]
        upgrade(revision="0020")
        with db.engine.begin() as connection:
            writers = connection.execute(text("SELECT writer FROM webhook_endpoint_hours")).all()
        assert [tuple(row) for row in writers] == [(0,)]
