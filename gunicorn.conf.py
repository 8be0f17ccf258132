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
# (docs/benchmarks.md, "Long-polls"); gunicorn makes the threads as they are needed. Waits may
# hold at most half the threads (EVENT_WAITS_PER_PROCESS, 128, and `post_worker_init` below
# whatever it says; EVENT_WAITS_PER_KEY of one key): past that a long-poll is answered 429 at
# once, so the other half is always there for every other call.
worker_class = "gthread"
threads = 256

# Slow and idle clients (issue 42). What gunicorn bounds, and what it cannot:
# - A request's body is read by the app within a deadline before it takes anything shared
#   (blueprints/admission.py: 408 after 10 s), so a slow body holds only its own thread.
# - A new connection that sends nothing holds a thread for at most 5 s (gunicorn's own wait for
#   first data), then waits in the worker's poller, threadless, and is closed after `keepalive`
#   seconds; so is a kept-alive connection between requests.
# - `worker_connections` bounds the connections one worker holds (idle ones included); more wait
#   in the listen `backlog`, and past that the kernel refuses them.
# - Headers sent a byte at a time hold their thread for as long as the client likes: gthread
#   reads them with no deadline and no setting here bounds it. Only a proxy in front that buffers
#   whole requests (nginx's client_header_timeout and client_body_timeout, deploy/) closes those,
#   and only it can cap connections per client address.
keepalive = 2
worker_connections = 1000
backlog = 2048

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
        _answer_refusals_in_the_envelope(worker.wsgi)
        _keep_threads_for_other_calls(worker)


def _answer_refusals_in_the_envelope(app):
    """gunicorn's own refusals (414, 431, a malformed request) in the envelope, not its HTML
    (blueprints/gunicorn_refusals.py)."""
    from app import STRICT_TRANSPORT_SECURITY
    from blueprints.gunicorn_refusals import answer_refusals_in_the_envelope

    # Another app under this file (bench/postback_ceiling.py's) has no settings: not production.
    settings = app.extensions.get("settings")
    production = settings is not None and settings.is_production
    answer_refusals_in_the_envelope(STRICT_TRANSPORT_SECURITY if production else None)


def _keep_threads_for_other_calls(worker):
    """A worker that runs each request in a thread of its own (gthread, or sync's one) lets
    long-polls wait in at most half of them, whatever EVENT_WAITS_PER_PROCESS says: `--threads
    8` on the command line means 4 waits. An async worker's waits hold no thread."""
    from gunicorn.workers.base_async import AsyncWorker  # type: ignore[import-untyped]

    from services.event_waits import limit_waits_to_threads

    if not isinstance(worker, AsyncWorker):
        limit_waits_to_threads(worker.cfg.threads)


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
