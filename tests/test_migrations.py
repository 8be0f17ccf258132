"""Migrations build the schema the models describe on PostgreSQL, and come back down cleanly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from flask_migrate import downgrade, upgrade
from sqlalchemy import inspect, text

from app import create_app
from extensions import db
from models import TrackedLink
from tests.backends import scratch_database


def test_upgrade_matches_the_models_and_downgrade_empties(app_environ, backends):
    with scratch_database(backends) as url:
        scratch = create_app({**app_environ, "DATABASE_URL": url})
        with scratch.app_context():
            upgrade()
            with db.engine.connect() as connection:
                context = MigrationContext.configure(connection, opts={"compare_type": True})
                assert compare_metadata(context, db.metadata) == []
            tables = set(inspect(db.engine).get_table_names())
            assert {"brands", "api_keys", "bootstrap_tokens"} <= tables

            downgrade(revision="base")
            assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}

            upgrade()  # and up again: downgrade left nothing behind that blocks it
            assert {"brands", "api_keys"} <= set(inspect(db.engine).get_table_names())
            db.engine.dispose()


def test_link_counters_move_into_slots_and_back(app_environ, backends):
    """0005 keeps what a link had counted: in slot 0 going up, back in its columns going down."""
    at = "2026-11-01 00:00:00+00:00"
    with scratch_database(backends) as url:
        scratch = create_app({**app_environ, "DATABASE_URL": url})
        with scratch.app_context():
            upgrade(revision="0004")
            with db.engine.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO brands VALUES ('brd_m', 'Mig', 'growth', 'verified', :at,"
                        " :at, :at)"
                    ),
                    {"at": at},
                )
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
                    text(
                        "INSERT INTO tracked_link_conversion_counts VALUES ('lnk_busy', 5, 2, 500)"
                    )
                )
            busy, idle = (db.session.get(TrackedLink, i) for i in ("lnk_busy", "lnk_idle"))
            assert (busy.conversions, busy.conversion_value_minor) == (9, 9250)
            assert (idle.conversions, idle.conversion_value_minor) == (0, 0)
            db.session.remove()

            downgrade(revision="0004")
            with db.engine.connect() as connection:
                rows = connection.execute(
                    text(
                        "SELECT id, conversions, conversion_value_minor FROM tracked_links"
                        " ORDER BY id"
                    )
                ).all()
            assert [tuple(row) for row in rows] == [("lnk_busy", 9, 9250), ("lnk_idle", 0, 0)]
            assert conversion_link() == "lnk_busy"
            assert "tracked_link_conversion_counts" not in inspect(db.engine).get_table_names()
            db.engine.dispose()


def test_subscriptions_become_jsonb_and_back_in_order(app_environ, backends):
    """0006 keeps each endpoint's events, in the order they were given, both ways."""
    at = "2026-11-01 00:00:00+00:00"
    events = '["escrow.released", "deal.completed", "conversion.recorded"]'
    with scratch_database(backends) as url:
        scratch = create_app({**app_environ, "DATABASE_URL": url})
        with scratch.app_context():
            upgrade(revision="0005")
            with db.engine.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO brands VALUES ('brd_m', 'Mig', 'growth', 'verified', :at,"
                        " :at, :at)"
                    ),
                    {"at": at},
                )
                connection.execute(
                    text(
                        "INSERT INTO webhook_endpoints (id, brand_id, url, events,"
                        " secret_ciphertext, consecutive_failures, created_at, updated_at)"
                        " VALUES ('whe_m', 'brd_m', 'https://example.com/h', CAST(:events AS"
                        " json), 'x', 0, :at, :at)"
                    ),
                    {"at": at, "events": events},
                )

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
            db.engine.dispose()


def test_endpoint_descriptions_come_with_0007_and_go_with_its_downgrade(app_environ, backends):
    """0007 gives existing endpoints no description, and its downgrade keeps the endpoints."""
    at = "2026-11-01 00:00:00+00:00"
    with scratch_database(backends) as url:
        scratch = create_app({**app_environ, "DATABASE_URL": url})
        with scratch.app_context():
            upgrade(revision="0006")
            with db.engine.begin() as connection:
                connection.execute(
                    text(
                        "INSERT INTO brands VALUES ('brd_m', 'Mig', 'growth', 'verified', :at,"
                        " :at, :at)"
                    ),
                    {"at": at},
                )
                connection.execute(
                    text(
                        "INSERT INTO webhook_endpoints (id, brand_id, url, events,"
                        " secret_ciphertext, consecutive_failures, created_at, updated_at)"
                        " VALUES ('whe_m', 'brd_m', 'https://example.com/h', '[]', 'x', 0, :at,"
                        " :at)"
                    ),
                    {"at": at},
                )
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
            db.engine.dispose()
