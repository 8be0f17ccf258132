"""`flask worker`: a real RQ worker against this run's Redis."""

from __future__ import annotations

import subprocess

from rq import Queue
from rq.job import JobStatus

from tests.command_line import run_flask
from workers.connection import QUEUES, redis_connection


def run_burst_worker(environ: dict[str, str]) -> subprocess.CompletedProcess:
    return run_flask(environ, "worker", "--burst")


def test_burst_worker_runs_queued_jobs_and_exits(app, app_environ):
    queue = Queue(QUEUES[0], connection=redis_connection(app))
    job = queue.enqueue("json.dumps", {"worker": "ran"})

    result = run_burst_worker(app_environ)

    assert result.returncode == 0, result.stderr
    job.refresh()
    assert job.get_status() == JobStatus.FINISHED
    assert job.return_value() == '{"worker": "ran"}'


def test_worker_without_redis_is_a_clear_error(app_environ):
    result = run_burst_worker({k: v for k, v in app_environ.items() if k != "REDIS_URL"})
    assert result.returncode != 0
    assert "REDIS_URL is not set" in result.stderr
