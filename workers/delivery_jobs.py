"""The RQ job: "these endpoints may have due deliveries". It hands them to this worker
process's delivery engine (workers/engine.py) and returns at once, so that RQ goes on taking
jobs while the engine keeps many attempts in flight."""

from __future__ import annotations

from flask import current_app
from rq import get_current_job

from workers import dispatch
from workers.engine import engine_for


def drain_endpoints(endpoint_ids: list[str]) -> None:
    app = current_app._get_current_object()
    dispatch.drain_started(app, endpoint_ids)
    job = get_current_job()
    engine_for(app).wake(endpoint_ids, job.id if job else None)


def drain_endpoint(endpoint_id: str) -> None:
    """The job of one endpoint, as releases before drains named several queued it: a job still
    in Redis across an upgrade runs."""
    drain_endpoints([endpoint_id])
