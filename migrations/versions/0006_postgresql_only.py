"""PostgreSQL only: an endpoint's subscribed events as JSONB

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 21:00:00

SQLite is no longer supported, so a column may use PostgreSQL's own types. Publishing an event
asks every endpoint of the brand whether it subscribes (`events ? name`): as JSONB the column is
read without a cast per row and per event. A JSON array keeps its order in JSONB, so the
subscription reads back as it was written; downgrade turns it back into JSON.
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql


# revision identifiers, used by Alembic.
revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade():
    op.alter_column(
        'webhook_endpoints', 'events',
        type_=postgresql.JSONB(astext_type=sa.Text()),
        existing_type=sa.JSON(),
        existing_nullable=False,
        postgresql_using='events::jsonb',
    )


def downgrade():
    op.alter_column(
        'webhook_endpoints', 'events',
        type_=sa.JSON(),
        existing_type=postgresql.JSONB(astext_type=sa.Text()),
        existing_nullable=False,
        postgresql_using='events::json',
    )
