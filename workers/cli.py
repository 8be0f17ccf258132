"""`flask --app app worker [--burst]`: an RQ worker with its scheduler (CONTRACT section 2)."""

from __future__ import annotations

import click
from flask import current_app
from flask.cli import with_appcontext
from rq import SimpleWorker

from workers.connection import QUEUES, redis_connection


@click.command("worker")
@click.option("--burst", is_flag=True, help="Work until the queues are empty, then exit.")
@with_appcontext
def worker_command(burst: bool) -> None:
    """Run an RQ worker (with its scheduler) on the service's queues."""
    connection = redis_connection(current_app)
    if connection is None:
        raise click.ClickException("REDIS_URL is not set; start Redis or use `make run`")
    # SimpleWorker runs jobs in this process, inside the app context opened above: no fork per
    # job (about 16 jobs/s with the forking worker here, 200+ without) and the app, its
    # connection pool and its HTTP session are built once.
    worker = SimpleWorker(list(QUEUES), connection=connection)
    worker.work(burst=burst, with_scheduler=True)
