"""dashboard sessions and their one-time secrets, kept on the server

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 09:00:00

CONTRACT 11.3: signing out ends a dashboard session on the server, so a copy of its cookie
opens nothing afterwards; a secret shown once is shown once, whatever cookie is replayed. The
cookie now carries only a random token; `dashboard_sessions` holds its SHA-256, the key it
signed in with and when it started and was last used. Sessions signed in before this
migration (their key id was in the cookie) are signed out: they find no row.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        'dashboard_sessions',
        sa.Column('token_hash', sa.String(length=64), nullable=False),
        sa.Column('brand_id', sa.String(length=40), nullable=False),
        sa.Column('key_id', sa.String(length=40), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['brand_id'], ['brands.id'], name=op.f('fk_dashboard_sessions_brand_id_brands'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['key_id'], ['api_keys.id'], name=op.f('fk_dashboard_sessions_key_id_api_keys'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('token_hash', name=op.f('pk_dashboard_sessions')),
    )
    op.create_index(op.f('ix_dashboard_sessions_key_id'), 'dashboard_sessions', ['key_id'], unique=False)
    op.create_index(op.f('ix_dashboard_sessions_created_at'), 'dashboard_sessions', ['created_at'], unique=False)
    op.create_index(op.f('ix_dashboard_sessions_last_seen_at'), 'dashboard_sessions', ['last_seen_at'], unique=False)
    op.create_table(
        'dashboard_one_time_secrets',
        sa.Column('session_hash', sa.String(length=64), nullable=False),
        sa.Column('kind', sa.String(length=100), nullable=False),
        sa.Column('sealed', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['session_hash'], ['dashboard_sessions.token_hash'], name=op.f('fk_dashboard_one_time_secrets_session_hash_dashboard_sessions'), ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('session_hash', 'kind', name=op.f('pk_dashboard_one_time_secrets')),
    )


def downgrade():
    op.drop_table('dashboard_one_time_secrets')
    op.drop_index(op.f('ix_dashboard_sessions_last_seen_at'), table_name='dashboard_sessions')
    op.drop_index(op.f('ix_dashboard_sessions_created_at'), table_name='dashboard_sessions')
    op.drop_index(op.f('ix_dashboard_sessions_key_id'), table_name='dashboard_sessions')
    op.drop_table('dashboard_sessions')
