"""Bulk jobs run as a worker's runner runs them (services/delivery/bulk.py), for tests that
have no worker process: batch after batch, each committed, until no job is left open or the
ones left wait for something (attempts in flight)."""

from __future__ import annotations

from flask import Flask

from extensions import db
from services.delivery.bulk import run_one_batch


def run_bulk_jobs(app: Flask, *, max_batches: int = 1000) -> int:
    """Run the open jobs as far as they go now; how many batches changed rows."""
    changed = 0
    idle: set[int] = set()
    with app.app_context():
        for _ in range(max_batches):
            batch = run_one_batch()
            if batch is None or batch.job_id in idle:
                db.session.remove()
                return changed
            if batch.changed or batch.finished:
                changed += batch.changed > 0
                idle.clear()
            else:
                idle.add(batch.job_id)
    raise AssertionError(f"bulk jobs still busy after {max_batches} batches")
