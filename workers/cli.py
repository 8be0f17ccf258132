"""`flask --app app worker [--burst]`: an RQ worker with its scheduler (CONTRACT section 2), the
process's delivery engine that its jobs hand endpoints to (workers/engine.py), and the retention
purge its sweeper starts (workers/retention.py)."""

from __future__ import annotations

import logging
import time

import click
from flask import current_app
from flask.cli import with_appcontext
from rq import SimpleWorker

from extensions import db
from workers.connection import QUEUES, redis_connection
from workers.engine import engine_for, stop_engine
from workers.retention import stop_purge
from workers.sweeper import sweep

log = logging.getLogger("brand_api.webhooks")


class DeliveryWorker(SimpleWorker):
    """SimpleWorker runs jobs in this process, inside the app context the command opened: no
    fork per job (about 16 jobs/s with the forking worker here, 200+ without), and the app, its
    connection pool and its HTTP session are built once.

    RQ's maintenance tick runs the sweeper every `sweep_interval` and RQ's own registry
    cleaning at RQ's pace; the dequeue wait is cut to the sweep interval so that an idle worker
    still ticks on time.
    """

    def __init__(self, *args, sweep_interval: float, **kwargs) -> None:
        self.sweep_interval = sweep_interval  # read by dequeue_timeout during __init__
        self._swept_at: float | None = None
        super().__init__(*args, **kwargs)

    @property
    def dequeue_timeout(self) -> int:
        return max(1, round(self.sweep_interval))

    @property
    def should_run_maintenance_tasks(self) -> bool:
        sweep_due = self._swept_at is None or (
            time.monotonic() - self._swept_at >= self.sweep_interval
        )
        return sweep_due or super().should_run_maintenance_tasks

    def run_maintenance_tasks(self) -> None:
        if super().should_run_maintenance_tasks:
            super().run_maintenance_tasks()
        self._swept_at = time.monotonic()
        try:
            sweep(current_app._get_current_object())
        except Exception:
            # A database or Redis outage must not stop the worker; the next tick sweeps again.
            log.exception("webhook sweep failed")
            db.session.rollback()


@click.command("worker")
@click.option("--burst", is_flag=True, help="Work until the queues are empty, then exit.")
@with_appcontext
def worker_command(burst: bool) -> None:
    """Run a webhook delivery worker.

    An RQ worker, with its scheduler and the delivery sweeper, on the service's queues."""
    connection = redis_connection(current_app)
    if connection is None:
        raise click.ClickException("REDIS_URL is not set; start Redis or use `make run`")
    app = current_app._get_current_object()
    settings = app.extensions["settings"]
    worker = DeliveryWorker(
        list(QUEUES), connection=connection, sweep_interval=settings.webhook_sweep_interval
    )
    engine = engine_for(app)
    try:
        worker.work(burst=burst, with_scheduler=True)
        if burst:
            # The queue is empty; the attempts its jobs started are not over yet.
            while not engine.idle():
                time.sleep(0.05)
    finally:
        # A warm shutdown (SIGTERM) ends here too: every attempt in flight ends within the
        # timeout, and what was claimed but not started goes back. A purge stops between two
        # of its batches.
        stop_engine(grace=settings.webhook_timeout + 1)
        stop_purge(timeout=settings.webhook_timeout + 1)
