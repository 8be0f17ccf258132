"""Migrations build the schema the models describe, on this run's database kind (PostgreSQL in
CI, SQLite on a laptop), and come back down cleanly."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from flask_migrate import downgrade, upgrade
from sqlalchemy import inspect

from app import create_app
from extensions import db
from tests.backends import scratch_database


def test_upgrade_matches_the_models_and_downgrade_empties(app_environ, backends):
    with scratch_database(backends) as url:
        scratch = create_app({**app_environ, "DATABASE_URL": url})
        with scratch.app_context():
            upgrade()
            with db.engine.connect() as connection:
                context = MigrationContext.configure(
                    connection, opts={"compare_type": True, "render_as_batch": True}
                )
                assert compare_metadata(context, db.metadata) == []
            tables = set(inspect(db.engine).get_table_names())
            assert {"brands", "api_keys", "bootstrap_tokens"} <= tables

            downgrade(revision="base")
            assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}

            upgrade()  # and up again: downgrade left nothing behind that blocks it
            assert {"brands", "api_keys"} <= set(inspect(db.engine).get_table_names())
            db.engine.dispose()
