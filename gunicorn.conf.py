"""gunicorn's settings for this app, read by `gunicorn "app:create_app()"` from the repository
root (gunicorn loads ./gunicorn.conf.py by default; `make run` names it explicitly).

Only what every deployment needs is here; the number of workers and binding stay on the command
line.
"""

import gc
import os
import signal

from observability.logs import gunicorn_logconfig
from observability.metrics import mark_process_dead

# A thread per request held open, and many held: a long-poll of the events API waits up to 30 s
# in its thread, doing nothing and holding no database connection, while the requests doing
# work take turns at the app's work slots (services/work_slots.py; app.WORK_SLOTS_PER_PROCESS,
# what `--threads` was before). 200 waiting clients on `make run` cost each worker about one
# thread and about 80 KiB of RSS per client waiting there, no CPU and no connection
# (docs/benchmarks.md, "Long-polls"); gunicorn makes the threads as they are needed. Past
# `threads` requests held at once, more queue behind them: add workers.
worker_class = "gthread"
threads = 256

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
    if worker is not None:
        _answer_waits_on_stop()


def _answer_waits_on_stop():
    """A worker asked to stop (SIGTERM: a deploy, Ctrl-C on `make run`) answers its waiting
    long-polls at once with what they have, instead of holding them until gunicorn's graceful
    timeout cuts them off: their clients reconnect, to another worker, without an error."""
    from services.event_waits import stop_every_wait

    graceful = signal.getsignal(signal.SIGTERM)

    def stop(signum, frame):
        stop_every_wait()
        if callable(graceful):
            graceful(signum, frame)
        else:  # not gunicorn's handler: stop as SIGTERM would have
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)


def child_exit(server, worker):
    """prometheus_client's multiprocess mode is told when a worker is gone."""
    mark_process_dead(worker.pid)
