"""`flask --app app worker [--burst]` (CONTRACT section 2): what it runs is workers/cli.py,
imported when the command runs, not when `flask` lists or finds its commands."""

from __future__ import annotations

import click
from flask.cli import with_appcontext


@click.command("worker")
@click.option("--burst", is_flag=True, help="Deliver what is due and run queued jobs, then exit.")
@with_appcontext
def worker_command(burst: bool) -> None:
    """Run a webhook delivery worker.

    Its delivery loop reads what is due from the database; an RQ worker beside it runs the
    service's jobs (the retention purge) and its maintenance."""
    from workers.cli import run_worker  # RQ, aiohttp: for this command alone

    run_worker(burst)
