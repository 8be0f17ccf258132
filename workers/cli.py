"""What `flask --app app worker [--burst]` runs (the command itself: commands/worker.py, which
imports this module only when it runs, so that other commands start without RQ and aiohttp):
the process's delivery loop (services/delivery/loop.py), which needs only PostgreSQL, beside an
RQ worker for the work that is a job (the retention purge, workers/retention.py) and the
maintenance its tick runs (workers/maintenance.py).

Redis down stops only RQ's part: the worker tries it again every few seconds while deliveries
go on, and SIGTERM or Ctrl-C stops either way: the attempts in flight finish and are recorded.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import signal
import threading
import time

import click
import redis
from flask import Flask, current_app
from rq import SimpleWorker

from extensions import db
from observability.tracing import start_tracing, stop_tracing
from services.delivery.loop import start_delivery_loop, stop_delivery_loop
from workers.connection import QUEUES, redis_connection
from workers.maintenance import run_maintenance
from workers.retention import stop_purge

log = logging.getLogger("brand_api.webhooks")

# While Redis is unreachable, RQ's part is started again after this long (at most).
REDIS_RETRY_MAX_SECONDS = 10.0


class DeliveryWorker(SimpleWorker):
    """SimpleWorker runs jobs in this process, inside the app context the command opened: no
    fork per job, and the app and its connection pool are built once.

    RQ's maintenance tick runs ours every `sweep_interval` and RQ's own registry cleaning at
    RQ's pace; the dequeue wait is cut to the interval so that an idle worker still ticks.
    """

    def __init__(self, *args, app: Flask, sweep_interval: float, **kwargs) -> None:
        self.app = app
        self.sweep_interval = sweep_interval  # read by dequeue_timeout during __init__
        self.stop_asked = threading.Event()
        self._maintained_at: float | None = None
        super().__init__(*args, **kwargs)

    @property
    def dequeue_timeout(self) -> int:
        return max(1, round(self.sweep_interval))

    @property
    def should_run_maintenance_tasks(self) -> bool:
        due = self._maintained_at is None or (
            time.monotonic() - self._maintained_at >= self.sweep_interval
        )
        return due or super().should_run_maintenance_tasks

    def run_maintenance_tasks(self) -> None:
        if super().should_run_maintenance_tasks:
            super().run_maintenance_tasks()
        self._maintained_at = time.monotonic()
        try:
            run_maintenance(self.app)
        except Exception:
            # A database or Redis outage must not stop the worker; the next tick tries again.
            log.warning("worker maintenance failed; trying again next tick", exc_info=True)
            db.session.rollback()

    def request_stop(self, signum, frame):
        self.stop_asked.set()
        stop_purge()
        super().request_stop(signum, frame)


def run_worker(burst: bool) -> None:
    """Run the app's delivery loop and RQ worker until stopped (with `burst`, until nothing is
    due or queued), in the app context the command opened."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]  # a LocalProxy
    connection = redis_connection(app)
    if connection is None:
        raise click.ClickException("REDIS_URL is not set; start Redis or use `make run`")
    settings = app.extensions["settings"]
    worker = DeliveryWorker(
        list(QUEUES), connection=connection, app=app, sweep_interval=settings.webhook_sweep_interval
    )
    _raise_open_files_limit()
    # `webhook.attempt` spans, and the worker's own database and Redis calls, when OTLP export
    # is configured (CONTRACT 13.6); nothing otherwise.
    start_tracing("brand-api-worker")
    loop = start_delivery_loop(app, burst=burst)
    try:
        _work(worker, burst)
        if burst:
            # The queue is empty; the deliveries due may still be going out.
            while not loop.idle() and not worker.stop_asked.is_set():
                time.sleep(0.05)
    finally:
        # SIGTERM ends here too: every attempt in flight ends within the timeout and is
        # recorded. A purge stops between two of its batches.
        stop_purge()
        stop_delivery_loop(grace=settings.webhook_timeout + 2)
        stop_tracing()  # the last attempts' spans leave before the process does


def _raise_open_files_limit() -> None:
    """Up to the hard limit: each attempt in flight holds a socket, and a worker talking to
    thousands of receivers must not fail for want of file descriptors (the soft limit is
    often 1,024 while the hard one is far higher)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and wanted > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _work(worker: DeliveryWorker, burst: bool) -> None:
    """RQ's loop, started again while Redis is unreachable, until a stop is asked (or, in
    burst mode, the queue is empty)."""

    def stop_while_waiting(signum, frame) -> None:
        worker.stop_asked.set()

    pause = 1.0
    warned = False
    while not worker.stop_asked.is_set():
        signal.signal(signal.SIGTERM, stop_while_waiting)
        signal.signal(signal.SIGINT, stop_while_waiting)
        try:
            worker.work(burst=burst)  # installs RQ's own signal handlers
            if burst:
                return
            pause = 1.0
        except redis.RedisError as error:
            if not warned:
                log.warning(
                    "Redis is unreachable (%s): RQ jobs wait, deliveries go on; retrying",
                    type(error).__name__,
                )
                warned = True
        else:
            warned = False
        worker.stop_asked.wait(pause)
        pause = min(pause * 2, REDIS_RETRY_MAX_SECONDS)
