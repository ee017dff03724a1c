"""Control loops and problems: decisions carry their loop, problem and observation; a decision
is unique per (loop, iteration_key) instead of globally; actions and per-target state carry
their loop. Every existing row is kept: it belongs to loop `default` of problem `autoscaling`
(server defaults fill the new columns).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("decisions") as b:
        b.add_column(sa.Column("loop", sa.String(length=64), server_default="default", nullable=False))
        b.add_column(sa.Column("problem", sa.String(length=64), server_default="autoscaling", nullable=False))
        b.add_column(sa.Column("observation", sa.JSON(), nullable=True))
        b.drop_constraint("uq_decisions_iteration_key", type_="unique")
        b.create_unique_constraint("uq_decisions_loop_iteration_key", ["loop", "iteration_key"])
        b.create_index("ix_decisions_loop", ["loop"])
    with op.batch_alter_table("actions") as b:
        b.add_column(sa.Column("loop", sa.String(length=64), server_default="default", nullable=False))
    with op.batch_alter_table("group_state") as b:
        b.add_column(sa.Column("loop", sa.String(length=64), server_default="default", nullable=False))
        b.drop_constraint("pk_group_state", type_="primary")
        b.create_primary_key("pk_group_state", ["loop", "group_name"])


def downgrade() -> None:
    # only loop `default` can go back to one global key space: other loops' rows would be
    # taken for its own, and their decisions' iteration keys (window ends, as the default
    # loop's) would break the global unique constraint
    op.execute("DELETE FROM group_state WHERE loop <> 'default'")
    op.execute("DELETE FROM actions WHERE loop <> 'default' "
               "OR decision_id IN (SELECT id FROM decisions WHERE loop <> 'default')")
    op.execute("DELETE FROM decisions WHERE loop <> 'default'")
    with op.batch_alter_table("group_state") as b:
        b.drop_constraint("pk_group_state", type_="primary")
        b.create_primary_key("pk_group_state", ["group_name"])
        b.drop_column("loop")
    with op.batch_alter_table("actions") as b:
        b.drop_column("loop")
    with op.batch_alter_table("decisions") as b:
        b.drop_index("ix_decisions_loop")
        b.drop_constraint("uq_decisions_loop_iteration_key", type_="unique")
        b.create_unique_constraint("uq_decisions_iteration_key", ["iteration_key"])
        b.drop_column("observation")
        b.drop_column("problem")
        b.drop_column("loop")
