"""gunicorn's settings for this app, read by `gunicorn "app:create_app()"` from the repository
root (gunicorn loads ./gunicorn.conf.py by default; `make run` names it explicitly).

Only what every deployment needs is here; workers, threads and binding stay on the command line.
"""

import gc
import os

from observability.logs import gunicorn_logconfig
from observability.metrics import mark_process_dead

# LOG_FORMAT=json: gunicorn's own lines are JSON objects too, like the app's.
logconfig_dict = gunicorn_logconfig(os.environ.get("LOG_FORMAT", "text").strip().lower()) or {}


def post_worker_init(worker):
    """Freeze what start-up allocated (the app, its models, schemas and routes) out of the
    garbage collector's reach.

    A full collection walks every tracked object: in a worker with the app loaded that is
    about 140,000 objects and a 33-50 ms pause, during which none of the worker's threads
    runs, so every request in flight in that worker waits for it (bench/postbacks.py saw
    those pauses in its worst latencies). Frozen objects are never walked again, so a full
    collection only sees what requests allocated since: 0.1 ms, measured the same way. What is
    frozen was built once and lives as long as the worker anyway.
    """
    gc.collect()
    gc.freeze()


def child_exit(server, worker):
    """prometheus_client's multiprocess mode is told when a worker is gone."""
    mark_process_dead(worker.pid)
