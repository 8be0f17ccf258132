"""Migrations build the schema the models describe on PostgreSQL, and come back down cleanly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from flask_migrate import downgrade, upgrade
from sqlalchemy import inspect, text

from extensions import db
from models import TrackedLink
from tests.scratch_schema import AT, insert_brand_with_endpoints, migrated_to


def test_upgrade_matches_the_models_and_downgrade_empties(app_environ, backends):
    with migrated_to(app_environ, backends):
        with db.engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, db.metadata) == []
        tables = set(inspect(db.engine).get_table_names())
        assert {"brands", "api_keys", "bootstrap_tokens"} <= tables

        downgrade(revision="base")
        assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}

        upgrade()  # and up again: downgrade left nothing behind that blocks it
        assert {"brands", "api_keys"} <= set(inspect(db.engine).get_table_names())


def test_link_counters_move_into_slots_and_back(app_environ, backends):
    """0005 keeps what a link had counted: in slot 0 going up, back in its columns going down."""
    at = AT
    with migrated_to(app_environ, backends, "0004"):
        with db.engine.begin() as connection:
            insert_brand_with_endpoints(connection, endpoints=())
            connection.execute(
                text(
                    "INSERT INTO campaigns (id, brand_id, name, status, pricing_model,"
                    " currency, budget_minor, spent_minor, committed_minor, starts_at,"
                    " ends_at, created_at, updated_at) VALUES ('cmp_m', 'brd_m', 'C',"
                    " 'active', 'fixed_fee', 'NGN', 100, 0, 0, :at, :at, :at, :at)"
                ),
                {"at": at},
            )
            for link_id, conversions, value in (("lnk_busy", 7, 8750), ("lnk_idle", 0, 0)):
                connection.execute(
                    text(
                        "INSERT INTO tracked_links (id, brand_id, campaign_id, code,"
                        " short_url, destination_url, clicks, conversions,"
                        " conversion_value_minor, currency, created_at) VALUES (:id,"
                        " 'brd_m', 'cmp_m', :id, 'https://k.link/x', 'https://x.example',"
                        " 3, :conversions, :value, 'NGN', :at)"
                    ),
                    {"id": link_id, "conversions": conversions, "value": value, "at": at},
                )

            connection.execute(
                text(
                    "INSERT INTO conversions (id, brand_id, idempotency_key, event_type,"
                    " link_id, campaign_id, value_minor, currency, metadata, attributed,"
                    " created_at) VALUES ('conv_m', 'brd_m', 'order-00000001', 'purchase',"
                    " 'lnk_busy', 'cmp_m', 1250, 'NGN', '{}', true, :at)"
                ),
                {"at": at},
            )

        def conversion_link() -> str | None:
            with db.engine.connect() as connection:
                return connection.execute(
                    text("SELECT link_id FROM conversions WHERE id = 'conv_m'")
                ).scalar_one()

        upgrade(revision="0005")
        # Changing tracked_links must not touch what refers to it.
        assert conversion_link() == "lnk_busy"
        with db.engine.begin() as connection:
            slots = connection.execute(
                text("SELECT * FROM tracked_link_conversion_counts ORDER BY link_id")
            ).all()
            assert [tuple(row) for row in slots] == [("lnk_busy", 0, 7, 8750)]
            # A second slot, as a concurrent postback on another connection leaves it.
            connection.execute(
                text("INSERT INTO tracked_link_conversion_counts VALUES ('lnk_busy', 5, 2, 500)")
            )
        busy, idle = (db.session.get(TrackedLink, i) for i in ("lnk_busy", "lnk_idle"))
        assert (busy.conversions, busy.conversion_value_minor) == (9, 9250)
        assert (idle.conversions, idle.conversion_value_minor) == (0, 0)
        db.session.remove()

        downgrade(revision="0004")
        with db.engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT id, conversions, conversion_value_minor FROM tracked_links ORDER BY id"
                )
            ).all()
        assert [tuple(row) for row in rows] == [("lnk_busy", 9, 9250), ("lnk_idle", 0, 0)]
        assert conversion_link() == "lnk_busy"
        assert "tracked_link_conversion_counts" not in inspect(db.engine).get_table_names()


def test_subscriptions_become_jsonb_and_back_in_order(app_environ, backends):
    """0006 keeps each endpoint's events, in the order they were given, both ways."""
    events = '["escrow.released", "deal.completed", "conversion.recorded"]'
    with migrated_to(app_environ, backends, "0005"):
        with db.engine.begin() as connection:
            insert_brand_with_endpoints(connection, events=events)

        def stored() -> tuple[str, list[str]]:
            with db.engine.connect() as connection:
                row = connection.execute(
                    text(
                        "SELECT pg_typeof(events)::text, events FROM webhook_endpoints"
                        " WHERE id = 'whe_m'"
                    )
                ).one()
            return row[0], list(row[1])

        expected = ["escrow.released", "deal.completed", "conversion.recorded"]
        upgrade(revision="0006")
        assert stored() == ("jsonb", expected)
        downgrade(revision="0005")
        assert stored() == ("json", expected)


def test_endpoint_descriptions_come_with_0007_and_go_with_its_downgrade(app_environ, backends):
    """0007 gives existing endpoints no description, and its downgrade keeps the endpoints."""
    with migrated_to(app_environ, backends, "0006"):
        with db.engine.begin() as connection:
            insert_brand_with_endpoints(connection)
        upgrade(revision="0007")
        with db.engine.begin() as connection:
            query = "SELECT description FROM webhook_endpoints WHERE id = 'whe_m'"
            assert connection.execute(text(query)).scalar_one() is None
            connection.execute(text("UPDATE webhook_endpoints SET description = 'Orders'"))
            assert connection.execute(text(query)).scalar_one() == "Orders"
        downgrade(revision="0006")
        columns = {c["name"] for c in inspect(db.engine).get_columns("webhook_endpoints")}
        assert "description" not in columns
        with db.engine.connect() as connection:
            count = "SELECT count(*) FROM webhook_endpoints WHERE id = 'whe_m'"
            assert connection.execute(text(count)).scalar_one() == 1


def test_0014_queues_pending_work_numbers_events_and_comes_back_down(app_environ, backends):
    """0014 with data in the tables: pending deliveries go to the queue with their time, their
    endpoints ready; failed ones get `failed_at`; stored events get their subject and gapless
    sequences from their bodies; a counter per subject. Its downgrade puts the pending work
    back on the deliveries and keeps every row."""
    at = AT
    with migrated_to(app_environ, backends, "0013"):
        with db.engine.begin() as connection:
            insert_brand_with_endpoints(
                connection,
                (("whe_m", "https://example.com/h"), ("whe_idle", "https://example.com/i")),
            )
            events = [
                ("evt_1", "deal.accepted", '{"data": {"id": "deal_x", "campaignId": "cmp_1"}}'),
                (
                    "evt_2",
                    "escrow.held",
                    '{"data": {"dealId": "deal_x", "campaignId": "cmp_1"}}',
                ),
                (
                    "evt_3",
                    "deal.completed",
                    '{"data": {"id": "deal_x", "campaignId": "cmp_1"}}',
                ),
                (
                    "evt_4",
                    "conversion.recorded",
                    '{"data": {"id": "conv_1", "campaignId": null}}',
                ),
                ("evt_5", "webhook.test", '{"data": {"endpointId": "whe_m"}}'),
                ("evt_6", "deal.completed", '{"data": {"n": 1}}'),
            ]
            for event_id, name, body in events:
                connection.execute(
                    text(
                        "INSERT INTO webhook_events (id, brand_id, name, body, created_at)"
                        " VALUES (:id, 'brd_m', :name, :body, :at)"
                    ),
                    {"id": event_id, "name": name, "body": body, "at": at},
                )
            for delivery_id, status, attempts in (
                ("whd_pending", "pending", 2),
                ("whd_failed", "failed", 8),
                ("whd_done", "delivered", 1),
            ):
                connection.execute(
                    text(
                        "INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id,"
                        " event_name, status, attempt_count, next_attempt_at, created_at)"
                        " VALUES (:id, 'brd_m', 'whe_m', 'evt_1', 'deal.accepted', :status,"
                        " :attempts, CASE WHEN CAST(:status AS varchar) = 'pending' THEN"
                        " CAST(:at AS timestamptz) + interval '1 hour' END, :at)"
                    ),
                    {"id": delivery_id, "status": status, "attempts": attempts, "at": at},
                )
            connection.execute(
                text(
                    "INSERT INTO webhook_attempts (delivery_id, endpoint_id, attempt_number,"
                    " requested_at, duration_ms, http_status, error, request_headers)"
                    " VALUES ('whd_failed', 'whe_m', 8, CAST(:at AS timestamptz)"
                    " + interval '1 day', 10, 500, 'HTTP 500', '{}')"
                ),
                {"at": at},
            )

        upgrade(revision="0014")
        with db.engine.connect() as connection:
            queued = connection.execute(
                text(
                    "SELECT delivery_id, next_attempt_at, attempt_count FROM webhook_delivery_queue"
                )
            ).all()
            assert [(row[0], row[2]) for row in queued] == [("whd_pending", 2)]
            assert str(queued[0][1]).startswith("2026-11-01 01:00:00")
            ready = dict(
                connection.execute(text("SELECT id, ready_at FROM webhook_endpoints")).all()
            )
            assert ready["whe_m"] is not None and ready["whe_idle"] is None
            failed_at = connection.execute(
                text("SELECT failed_at FROM webhook_deliveries WHERE id = 'whd_failed'")
            ).scalar_one()
            assert str(failed_at).startswith("2026-11-02")
            subjects = connection.execute(
                text(
                    "SELECT id, subject_type, subject_id, sequence, campaign_id"
                    " FROM webhook_events ORDER BY id"
                )
            ).all()
            assert [tuple(row) for row in subjects] == [
                ("evt_1", "deal", "deal_x", 1, "cmp_1"),
                ("evt_2", "deal", "deal_x", 2, "cmp_1"),
                ("evt_3", "deal", "deal_x", 3, "cmp_1"),
                ("evt_4", "conversion", "conv_1", 1, None),
                ("evt_5", "endpoint", "whe_m", 1, None),
                ("evt_6", "event", "evt_6", 1, None),
            ]
            counters = connection.execute(
                text(
                    "SELECT subject_type, subject_id, last_sequence"
                    " FROM webhook_event_subjects ORDER BY subject_type"
                )
            ).all()
            assert ("deal", "deal_x", 3) in [tuple(row) for row in counters]

        downgrade(revision="0013")
        with db.engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT id, status, next_attempt_at, lease_token FROM webhook_deliveries"
                    " ORDER BY id"
                )
            ).all()
            assert [(row[0], row[1], row[3]) for row in rows] == [
                ("whd_done", "delivered", None),
                ("whd_failed", "failed", None),
                ("whd_pending", "pending", None),
            ]
            assert str(rows[2][2]).startswith("2026-11-01 01:00:00")
            count = connection.execute(text("SELECT count(*) FROM webhook_events")).scalar_one()
            assert count == 6
        upgrade()


def test_0017_adds_trace_context_off_and_its_downgrade_keeps_the_rows(app_environ, backends):
    """0017: today's endpoints send no traceparent, today's events have none; down again, both
    keep their rows."""
    with migrated_to(app_environ, backends, "0016"):
        with db.engine.begin() as connection:
            insert_brand_with_endpoints(connection)
            connection.execute(
                text(
                    "INSERT INTO webhook_events (id, brand_id, name, body, created_at,"
                    " subject_type, subject_id, sequence) VALUES ('evt_m', 'brd_m',"
                    " 'deal.completed', '{}', :at, 'deal', 'deal_m', 1)"
                ),
                {"at": AT},
            )
        upgrade(revision="0017")
        with db.engine.begin() as connection:
            endpoint = "SELECT trace_context FROM webhook_endpoints WHERE id = 'whe_m'"
            event = "SELECT traceparent FROM webhook_events WHERE id = 'evt_m'"
            assert connection.execute(text(endpoint)).scalar_one() is False
            assert connection.execute(text(event)).scalar_one() is None
            connection.execute(text("UPDATE webhook_endpoints SET trace_context = true"))
        downgrade(revision="0016")
        assert "trace_context" not in {
            c["name"] for c in inspect(db.engine).get_columns("webhook_endpoints")
        }
        assert "traceparent" not in {
            c["name"] for c in inspect(db.engine).get_columns("webhook_events")
        }
        with db.engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM webhook_endpoints")).scalar() == 1
            assert connection.execute(text("SELECT count(*) FROM webhook_events")).scalar() == 1


def test_0018_adds_routing_and_erasure_columns_and_comes_back_down(app_environ, backends):
    """0018: events stored before it were passed over nowhere and never erased; its downgrade
    drops the columns and keeps every event and job."""
    with migrated_to(app_environ, backends, "0016"):
        with db.engine.begin() as connection:
            insert_brand_with_endpoints(connection)
            connection.execute(
                text(
                    "INSERT INTO webhook_events (id, brand_id, name, body, created_at,"
                    " subject_type, subject_id, sequence) VALUES ('evt_m', 'brd_m',"
                    " 'deal.completed', '{\"data\": {}}', :at, 'deal', 'deal_m', 1)"
                ),
                {"at": AT},
            )
        upgrade(revision="0018")
        with db.engine.begin() as connection:
            row = connection.execute(
                text("SELECT passed_over, erased_at FROM webhook_events WHERE id = 'evt_m'")
            ).one()
            assert tuple(row) == (None, None)
            connection.execute(
                text(
                    'UPDATE webhook_events SET passed_over = \'{"whe_m": "filtered"}\','
                    " erased_at = :at"
                ),
                {"at": AT},
            )
            connection.execute(
                text(
                    "INSERT INTO webhook_bulk_jobs (kind, brand_id, subject_key, position,"
                    " requested_at, last_run_at) VALUES ('erase_subject', 'brd_m',"
                    " 'deal:deal_m', 1, :at, :at)"
                ),
                {"at": AT},
            )
        downgrade(revision="-1")
        assert "passed_over" not in {
            c["name"] for c in inspect(db.engine).get_columns("webhook_events")
        }
        assert "position" not in {
            c["name"] for c in inspect(db.engine).get_columns("webhook_bulk_jobs")
        }
        with db.engine.connect() as connection:
            assert connection.execute(text("SELECT count(*) FROM webhook_events")).scalar_one() == 1
            assert (
                connection.execute(text("SELECT count(*) FROM webhook_bulk_jobs")).scalar_one() == 1
            )
