"""Bulk jobs run as a worker's runner runs them (services/delivery/bulk.py), for tests that
have no worker process: batch after batch, each committed, until no job is left open or the
ones left wait for something (attempts in flight). A batch cancelled by its statement timeout
(a loaded machine: two test runs at once made 33 ms batches take over 5 s) is tried again, as
the runner tries it again, a few times."""

from __future__ import annotations

from flask import Flask
from psycopg.errors import QueryCanceled
from sqlalchemy.exc import OperationalError

from extensions import db
from services.delivery.bulk import run_one_batch

# Batches cancelled by their timeout, in a row, before the run gives up.
CANCELLED_TRIES = 5


def run_bulk_jobs(app: Flask, *, max_batches: int = 1000) -> int:
    """Run the open jobs as far as they go now; how many batches changed rows."""
    changed = 0
    idle: set[int] = set()
    cancelled = 0
    with app.app_context():
        for _ in range(max_batches):
            try:
                batch = run_one_batch()
            except OperationalError as error:
                cancelled += 1
                if not isinstance(error.orig, QueryCanceled) or cancelled >= CANCELLED_TRIES:
                    raise
                db.session.remove()
                continue
            cancelled = 0
            if batch is None or batch.job_id in idle:
                db.session.remove()
                return changed
            if batch.changed or batch.finished:
                changed += batch.changed > 0
                idle.clear()
            else:
                idle.add(batch.job_id)
    raise AssertionError(f"bulk jobs still busy after {max_batches} batches")
