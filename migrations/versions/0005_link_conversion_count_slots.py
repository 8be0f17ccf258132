"""tracked links' conversion counters in slots, so concurrent postbacks do not queue on a link

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 21:50:00

The link's counters were two columns of its row, raised by every postback in its transaction:
concurrent postbacks of one link waited on that row's lock until each committed. They are now
the sum of the link's rows in tracked_link_conversion_counts; what the columns held moves to
slot 0, and comes back on downgrade.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('tracked_link_conversion_counts',
    sa.Column('link_id', sa.String(length=40), nullable=False),
    sa.Column('slot', sa.SmallInteger(), nullable=False),
    sa.Column('conversions', sa.BigInteger(), nullable=False),
    sa.Column('conversion_value_minor', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['link_id'], ['tracked_links.id'], name=op.f('fk_tracked_link_conversion_counts_link_id_tracked_links'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('link_id', 'slot', name=op.f('pk_tracked_link_conversion_counts'))
    )
    op.execute(
        "INSERT INTO tracked_link_conversion_counts"
        " (link_id, slot, conversions, conversion_value_minor)"
        " SELECT id, 0, conversions, conversion_value_minor FROM tracked_links"
        " WHERE conversions <> 0 OR conversion_value_minor <> 0"
    )
    with op.batch_alter_table('tracked_links', schema=None) as batch_op:
        batch_op.drop_column('conversion_value_minor')
        batch_op.drop_column('conversions')


def downgrade():
    with op.batch_alter_table('tracked_links', schema=None) as batch_op:
        batch_op.add_column(sa.Column('conversions', sa.BigInteger(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('conversion_value_minor', sa.BigInteger(), nullable=False, server_default='0'))
    op.execute(
        "UPDATE tracked_links SET"
        " conversions = (SELECT sum(conversions) FROM tracked_link_conversion_counts AS c"
        " WHERE c.link_id = tracked_links.id),"
        " conversion_value_minor = (SELECT sum(conversion_value_minor)"
        " FROM tracked_link_conversion_counts AS c WHERE c.link_id = tracked_links.id)"
        " WHERE id IN (SELECT link_id FROM tracked_link_conversion_counts)"
    )
    with op.batch_alter_table('tracked_links', schema=None) as batch_op:
        batch_op.alter_column('conversions', server_default=None)
        batch_op.alter_column('conversion_value_minor', server_default=None)
    op.drop_table('tracked_link_conversion_counts')
