"""an optional description of each webhook endpoint

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 09:00:00

CONTRACT 10: endpoints take an optional `description` (at most 200 characters), so that two
endpoints with one URL can be told apart. Existing endpoints have none.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('webhook_endpoints', schema=None) as batch_op:
        batch_op.add_column(sa.Column('description', sa.String(length=200), nullable=True))


def downgrade():
    with op.batch_alter_table('webhook_endpoints', schema=None) as batch_op:
        batch_op.drop_column('description')
