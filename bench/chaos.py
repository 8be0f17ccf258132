"""The faults of an ordinary week under steady load (see bench/README.md, "Chaos").

Conversion postbacks go through the API (gunicorn, as `make run` serves it) at a steady rate to
a brand with 8 endpoints, each postback fanning out as `conversion.recorded` to all 8, while one
`flask worker` delivers to an asyncio receiver. Each scenario then breaks one thing:

  receiver-500-then-200   the receiver answers 500 for 20 s
  receiver-hang-then-200  the receiver never answers for 20 s
  worker-kill-9           the worker is SIGKILLed, and started again 2 s later
  worker-sigterm          the worker is stopped with SIGTERM, and started again 2 s later
  postgres-restart        PostgreSQL stops for 3 s (every connection cut), then starts
  redis-restart           Redis is killed for 10 s, then starts (empty)
  hostile-one             a 9th endpoint of the brand answers 200 with NUL bytes in its body
  hostile-several         5 more endpoints answer: NUL bytes, a gzip bomb (256 MiB inflated),
                          bytes that are not HTTP, 300 headers of 8 KB, a body that drips
  listen-terminated       every LISTEN connection is terminated by PostgreSQL
                          (pg_terminate_backend), three times, 2 s apart
  make-run-worker-kill    under `make run` (scripts/run.py), its worker is SIGKILLed; run.py
                          must start it again by itself (the API answering throughout)
  erase-subject           another brand erases a subject of 100,000 events (each with a
                          delivery and an answer, the newest 100 pending) through the API;
                          the load brand's deliveries must stay at p99 < 1 s (CONTRACT 13.3)

and measures, once the fault is over: every postback the API accepted (201) must reach each
healthy endpoint (a hostile one's deliveries are recorded, not counted here: they are
tests/test_hostile_receivers.py's). Per scenario: events, expected deliveries, delivered,
lost, duplicates (a delivery the receiver accepted with a 2xx more than once; a retry after a
500 or a timeout is not one) and how many of those the fault allows (attempts in flight at a
kill -9), and the seconds from the fault's end until the whole backlog is delivered.
Targets: lost 0 everywhere; duplicates only where allowed; recovery within the largest retry
interval in use plus 10 s.

PostgreSQL and Redis are the run's own (tests/private_servers.py): restarting the machine's
servers would break everything else on it. Progress goes to stderr; stdout gets one JSON line.

    .venv/bin/python -m bench.chaos            (about 6 minutes; --quick: shorter faults)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    HttpRequests,
    Processes,
    app_settings,
    free_port,
    log,
    run_benchmark,
    start_gunicorn,
)

ENDPOINTS = 8
POSTBACKS_PER_SECOND = 20
RETRY_SCHEDULE = "1,2,4,8,8,8,8,8,8,8,8,8,8,8,8,8"
WEBHOOK_TIMEOUT = "5"
MAKE_RUN_GUNICORN = ["--workers", "2", "--threads", "4", "--worker-class", "gthread"]
SCENARIOS = (
    "receiver-500-then-200",
    "receiver-hang-then-200",
    "worker-kill-9",
    "worker-sigterm",
    "postgres-restart",
    "redis-restart",
    "hostile-one",
    "hostile-several",
    "listen-terminated",
    "make-run-worker-kill",
    "erase-subject",
)
# erase-subject: the erased brand's subject, and what the load brand's deliveries may take.
ERASED_EVENTS = 100_000
ERASED_PENDING = 100
ERASE_P99_TARGET_MS = 1000
HOSTILE = {
    "hostile-one": ("/nul",),
    "hostile-several": ("/nul", "/gzip-bomb", "/not-http", "/header-flood", "/drip"),
}

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
_FAIL = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom"
# Like a real receiver, it takes a moment to answer, so a kill -9 finds attempts in flight.
ANSWER_SECONDS = 0.02


# --------------------------------------------------------------------------------------------
# The receiver (a separate process): `/_mode?m=ok|500|hang` switches how it answers.
# --------------------------------------------------------------------------------------------


class _Receiver(HttpRequests):
    mode = "ok"
    received: dict[str, int] = {}
    answered_ok: dict[str, int] = {}

    def handle(self, method: bytes, target: str, headers: dict[bytes, bytes]) -> None:
        if target.startswith("/_mode?m="):
            _Receiver.mode = target.split("=", 1)[1]
            self.transport.write(_OK)
            return
        if target == "/_stats":
            body = json.dumps(
                {"received": _Receiver.received, "ok": _Receiver.answered_ok}
            ).encode()
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            return
        delivery_id = headers.get(b"x-service-delivery", b"").decode()
        _Receiver.received[delivery_id] = _Receiver.received.get(delivery_id, 0) + 1
        if _Receiver.mode == "hang":
            return  # never answered: the sender's timeout ends it
        asyncio.get_running_loop().call_later(
            ANSWER_SECONDS, self._answer, delivery_id, _Receiver.mode == "500"
        )

    def _answer(self, delivery_id: str, fail: bool) -> None:
        if self.transport.is_closing():
            return
        if fail:
            self.transport.write(_FAIL)
            return
        _Receiver.answered_ok[delivery_id] = _Receiver.answered_ok.get(delivery_id, 0) + 1
        self.transport.write(_OK)


def serve_receiver(port: int) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Receiver, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def _get(url: str, timeout: float = 10) -> dict | None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        body = response.read()
    return json.loads(body) if body.startswith(b"{") else None


class Load:
    """Postbacks at a steady rate from a thread; counts what the API accepted."""

    def __init__(self, base: str, brand: str, key: str) -> None:
        self.url = f"{base}/api/v1/brand/{brand}/conversion/record-postback"
        self.key = key
        self.accepted = 0
        self.refused: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        interval = 1 / POSTBACKS_PER_SECOND
        next_at = time.monotonic()
        while not self._stop.is_set():
            request = urllib.request.Request(  # noqa: S310 - our own http:// URL
                self.url,
                method="POST",
                data=b'{"eventType": "purchase", "valueMinor": 1000}',
                headers={
                    "X-Api-Key": self.key,
                    "Idempotency-Key": f"chaos-{uuid.uuid4().hex}",
                    "Content-Type": "application/json",
                },
            )
            try:
                with self._opener.open(request, timeout=10) as response:
                    if response.status == 201:
                        self.accepted += 1
            except urllib.error.HTTPError as error:
                self.refused[error.code] = self.refused.get(error.code, 0) + 1
            except OSError:
                self.refused[0] = self.refused.get(0, 0) + 1
            next_at += interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))


def terminate_listeners(url: str) -> int:
    """PostgreSQL ends every wake-up listener's connection (services/wakeups.py)."""
    import psycopg

    with psycopg.connect(
        url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as admin:
        return admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name LIKE '%listener'"
        ).fetchone()[0]


# The erased brand's subject: events 1..N of one deal, a second apart, each delivered once with
# the receiver's answer stored; the newest ERASED_PENDING still pending, waiting for a retry.
_SEED_SUBJECT = """
    WITH made AS (
        SELECT n, now() - make_interval(secs => :count - n) AS at
        FROM generate_series(1, :count) AS n
    ),
    events AS (
        INSERT INTO webhook_events (
            id, brand_id, name, body, created_at, subject_type, subject_id, sequence
        )
        SELECT 'evt_erase' || n, :brand, 'deal.completed',
               '{"id":"evt_erase' || n || '","type":"deal.completed","sequence":' || n
               || ',"data":{"id":"deal_erased","creator":"Ada Obi","n":' || n || '}}',
               at, 'deal', 'deal_erased', n
        FROM made
    ),
    counter AS (
        INSERT INTO webhook_event_subjects (brand_id, subject_type, subject_id, last_sequence)
        VALUES (:brand, 'deal', 'deal_erased', :count)
    ),
    deliveries AS (
        INSERT INTO webhook_deliveries (
            id, brand_id, endpoint_id, event_id, event_name, status, attempt_count,
            created_at, delivered_at, next_attempt_at
        )
        SELECT 'whd_erase' || n, :brand, :endpoint, 'evt_erase' || n, 'deal.completed',
               CASE WHEN n > :count - :pending THEN 'pending' ELSE 'delivered' END, 1, at,
               CASE WHEN n <= :count - :pending THEN at END,
               CASE WHEN n > :count - :pending THEN now() + interval '1 hour' END
        FROM made
    ),
    queued AS (
        INSERT INTO webhook_delivery_queue (delivery_id, endpoint_id, next_attempt_at,
                                            attempt_count)
        SELECT 'whd_erase' || n, :endpoint, now() + interval '1 hour', 1
        FROM made WHERE n > :count - :pending
    )
    INSERT INTO webhook_attempts (
        delivery_id, endpoint_id, attempt_number, requested_at, duration_ms, http_status,
        error, response_body, request_headers
    )
    SELECT 'whd_erase' || n, :endpoint, 1, at, 20,
           CASE WHEN n > :count - :pending THEN 500 ELSE 200 END,
           CASE WHEN n > :count - :pending THEN 'HTTP 500' END,
           'thanks for deal_erased #' || n || ', Ada Obi', '{}'
    FROM made
"""


def seed_erased_subject(app, receiver: str) -> tuple[str, str]:
    """A brand with one endpoint and a subject of ERASED_EVENTS events; its id and a key."""
    from sqlalchemy import text

    from extensions import db
    from services.api_keys import create_api_key
    from services.brands import create_brand
    from services.endpoint_urls import UrlPolicy
    from services.webhook_endpoints import register_endpoint

    started = time.monotonic()
    with app.app_context():
        brand = create_brand(name="Chaos erased", plan="growth").id
        key = create_api_key(
            brand_id=brand, name="erase", scopes=("read", "write"), created_by="bench"
        ).secret
        endpoint = register_endpoint(
            brand_id=brand,
            url=f"{receiver}/erased",
            events=["deal.completed"],
            policy=UrlPolicy(https_only=False, allow_local=True),
        ).id
        db.session.execute(
            text(_SEED_SUBJECT),
            {
                "brand": brand,
                "endpoint": endpoint,
                "count": ERASED_EVENTS,
                "pending": ERASED_PENDING,
            },
        )
        db.session.commit()
        db.session.execute(text("ANALYZE webhook_events, webhook_deliveries, webhook_attempts"))
        db.session.commit()
        db.session.remove()
    log(f"erase-subject: {ERASED_EVENTS} events seeded in {time.monotonic() - started:.1f} s")
    return brand, key


def erase_under_load(app, base: str, erased_brand: str, key: str, load_brand: str) -> dict:
    """Erase the subject through the API, wait for its job to finish, and measure the load
    brand's deliveries meanwhile (created after the request, until the job finished): the
    time from the event to its delivery's 2xx."""
    from sqlalchemy import text

    from extensions import db

    def now_in_database():
        with app.app_context():
            value = db.session.execute(text("SELECT statement_timestamp()")).scalar_one()
            db.session.remove()
        return value

    window_start = now_in_database()
    request = urllib.request.Request(  # noqa: S310 - our own http:// URL
        f"{base}/api/v1/brand/{erased_brand}/subject/deal:deal_erased/erase",
        method="POST",
        headers={"X-Api-Key": key},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    asked = time.monotonic()
    with opener.open(request, timeout=30) as response:
        answer = json.loads(response.read())
        status = response.status
    request_ms = (time.monotonic() - asked) * 1000
    log(f"erase-subject: {status} {answer['data']} in {request_ms:.0f} ms")
    finished = False
    batches_seen = set()
    until = time.monotonic() + 600
    while time.monotonic() < until:
        with app.app_context():
            job = db.session.execute(
                text(
                    "SELECT done, finished_at FROM webhook_bulk_jobs"
                    " WHERE kind = 'erase_subject' AND brand_id = :brand"
                ),
                {"brand": erased_brand},
            ).one()
            db.session.remove()
        batches_seen.add(job.done)
        if job.finished_at is not None:
            finished = True
            break
        time.sleep(0.2)
    erase_seconds = time.monotonic() - asked
    window_end = now_in_database()
    log(f"erase-subject: job finished={finished} after {erase_seconds:.1f} s")
    lags = text(
        """
        SELECT count(*) AS deliveries,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50,
               percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) AS p99,
               max(lag) AS worst
        FROM (SELECT CAST(EXTRACT(EPOCH FROM delivered_at - created_at) AS float) * 1000 AS lag
              FROM webhook_deliveries
              WHERE brand_id = :brand AND created_at BETWEEN :start AND :end
                AND status = 'delivered') AS d
        """
    )
    with app.app_context():
        figures = db.session.execute(
            lags, {"brand": load_brand, "start": window_start, "end": window_end}
        ).one()
        # The same load in the 4 s before the request: the run's own ceiling to compare with.
        before = db.session.execute(
            lags,
            {
                "brand": load_brand,
                "start": window_start - timedelta(seconds=4),
                "end": window_start,
            },
        ).one()
        left = db.session.execute(
            text(
                """
                SELECT (SELECT count(*) FROM webhook_events
                        WHERE brand_id = :brand AND erased_at IS NULL) AS events_left,
                       (SELECT count(*) FROM webhook_attempts
                        WHERE delivery_id LIKE 'whd_erase%' AND response_body IS NOT NULL)
                           AS answers_left,
                       (SELECT count(*) FROM webhook_deliveries
                        WHERE brand_id = :brand AND status = 'pending') AS pending_left,
                       (SELECT count(*) FROM webhook_deliveries
                        WHERE brand_id = :brand AND last_error = 'erased') AS ended_erased
                """
            ),
            {"brand": erased_brand},
        ).one()
        db.session.remove()
    return {
        "erase_events": answer["data"]["events"],
        "erase_request_ms": round(request_ms, 1),
        "erase_seconds": round(erase_seconds, 1),
        "erase_finished": finished
        and left.events_left == 0
        and left.answers_left == 0
        and left.pending_left == 0
        and left.ended_erased == ERASED_PENDING,
        "erase_progress_samples": len(batches_seen),
        "deliveries_during_erase": figures.deliveries,
        "erase_p50_ms": round(figures.p50 or 0, 1),
        "erase_p99_ms": round(figures.p99 or 0, 1),
        "erase_worst_ms": round(figures.worst or 0, 1),
        "before_p50_ms": round(before.p50 or 0, 1),
        "before_p99_ms": round(before.p99 or 0, 1),
    }


def start_make_run(processes: Processes, env: dict[str, str]):
    """`make run`'s supervisor (scripts/run.py) on the run's PostgreSQL and Redis; its URL."""
    port = free_port()
    state = processes.workdir / "make-run-state"
    state.mkdir(exist_ok=True)
    supervisor = processes.start(
        "make-run",
        [sys.executable, str(ROOT / "scripts" / "run.py")],
        {**env, "PORT": str(port), "RUN_STATE_DIR": str(state)},
    )
    base = f"http://127.0.0.1:{port}"
    until = time.monotonic() + 120
    while time.monotonic() < until:
        try:
            _get(f"{base}/healthz", timeout=2)
            if make_run_worker(supervisor.pid) is not None:
                return supervisor, base
        except OSError:
            pass
        if supervisor.poll() is not None:
            raise RuntimeError("make run exited:\n" + processes.log_of(supervisor))
        time.sleep(0.2)
    raise RuntimeError("make run did not serve in 120 s")


def make_run_worker(supervisor_pid: int) -> int | None:
    """The pid of the `flask worker` that run.py started, if one runs."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == supervisor_pid and b"worker" in command:
            return int(entry.name)
    return None


class HealthWatch:
    """GET /healthz every 0.1 s from a thread: how many checks, how many failed."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.checks = self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.checks += 1
            try:
                _get(f"{self.base}/healthz", timeout=2)
            except OSError:
                self.failures += 1
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def __str__(self) -> str:
        return f"{self.checks - self.failures}/{self.checks} answered"


def run(workdir: Path, processes: Processes, args) -> dict:
    from sqlalchemy import func, select

    from app import create_app
    from extensions import db
    from models import DeliveryLease, WebhookDelivery
    from services.api_keys import create_api_key
    from services.brands import create_brand
    from services.endpoint_urls import UrlPolicy
    from services.webhook_endpoints import register_endpoint
    from tests.private_servers import PrivatePostgres, PrivateRedis

    postgres, redis_server = PrivatePostgres(), PrivateRedis()
    try:
        environ = {**app_settings(postgres.url, redis_server.url), "PATH": "/usr/bin:/bin"}
        postgres.migrate(environ)
        app = create_app(environ)
        worker_env = {
            **environ,
            "WEBHOOK_RETRY_SCHEDULE": RETRY_SCHEDULE,
            "WEBHOOK_TIMEOUT": WEBHOOK_TIMEOUT,
        }
        port = free_port()
        processes.start(
            "receiver", [sys.executable, "-m", "bench.chaos", "--receiver", str(port)], environ
        )
        receiver = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                _get(f"{receiver}/_stats")
                break
            except OSError:
                time.sleep(0.1)
        base, gunicorn = start_gunicorn(
            processes, "gunicorn", "app:create_app()", environ, MAKE_RUN_GUNICORN
        )
        hostile_process = processes.start(
            "hostile",
            [sys.executable, "-m", "tests.hostile_receiver", "0"],
            environ,
            stdout=subprocess.PIPE,
        )
        hostile = "http://127.0.0.1:" + hostile_process.stdout.readline().split()[1].decode()

        def start_worker():
            argv = [sys.executable, "-m", "flask", "--app", "app", "worker"]
            return processes.start("worker", argv, worker_env)

        worker = start_worker()

        def pending_of(endpoints: list[str]) -> tuple[int, int]:
            for _ in range(50):
                try:
                    with app.app_context():
                        total, delivered = db.session.execute(
                            select(
                                func.count(),
                                func.count().filter(WebhookDelivery.status == "delivered"),
                            ).where(WebhookDelivery.endpoint_id.in_(endpoints))
                        ).one()
                        db.session.remove()
                        return total, delivered
                except Exception:  # the database restarting
                    with app.app_context():
                        db.session.remove()
                        db.engine.dispose()
                    time.sleep(0.2)
            raise RuntimeError("the database did not come back")

        def leased_ids(brand: str) -> set[str]:
            with app.app_context():
                held = set(
                    db.session.scalars(
                        select(WebhookDelivery.id)
                        .join(DeliveryLease, DeliveryLease.delivery_id == WebhookDelivery.id)
                        .where(WebhookDelivery.brand_id == brand)
                    )
                )
                db.session.remove()
            return held

        results = {}
        fault_seconds = 8 if args.quick else 20
        for scenario in args.scenarios:
            with app.app_context():
                brand = create_brand(name=f"Chaos {scenario}", plan="growth").id
                key = create_api_key(
                    brand_id=brand, name="chaos", scopes=("read", "write"), created_by="bench"
                ).secret
                local = UrlPolicy(https_only=False, allow_local=True)
                healthy = [
                    register_endpoint(
                        brand_id=brand,
                        url=f"{receiver}/{scenario}/{number}",
                        events=["conversion.recorded"],
                        policy=local,
                    ).id
                    for number in range(ENDPOINTS)
                ]
                for path in HOSTILE.get(scenario, ()):
                    register_endpoint(
                        brand_id=brand,
                        url=f"{hostile}{path}",
                        events=["conversion.recorded"],
                        policy=local,
                    )
                db.session.commit()
            if scenario == "erase-subject":
                erased_brand, erased_key = seed_erased_subject(app, receiver)
            if scenario == "make-run-worker-kill":
                # From here on, `make run` serves the API and runs the worker.
                processes.stop(worker)
                processes.stop(gunicorn)
                supervisor, base = start_make_run(processes, worker_env)
            log(f"{scenario}: steady load")
            extra: dict = {}
            load = Load(base, brand, key)
            load.start()
            time.sleep(5)
            allowed: set[str] = set()
            log(f"{scenario}: fault")
            if scenario.startswith("receiver-"):
                _get(f"{receiver}/_mode?m={'500' if '500' in scenario else 'hang'}")
                time.sleep(fault_seconds)
                _get(f"{receiver}/_mode?m=ok")
            elif scenario == "worker-kill-9":
                # Kill it with attempts on the wire, the case that may send twice.
                aim_until = time.monotonic() + 2
                while not leased_ids(brand) and time.monotonic() < aim_until:
                    time.sleep(0.002)
                worker.send_signal(signal.SIGKILL)
                worker.wait(10)
                allowed = leased_ids(brand)
                processes.stop(worker)
                time.sleep(2)
                worker = start_worker()
            elif scenario == "worker-sigterm":
                worker.send_signal(signal.SIGTERM)
                worker.wait(30)
                processes.stop(worker)
                time.sleep(2)
                worker = start_worker()
            elif scenario == "postgres-restart":
                postgres.stop()
                time.sleep(3)
                postgres.start()
            elif scenario == "redis-restart":
                redis_server.stop()
                time.sleep(10 if not args.quick else 5)
                redis_server.start()
            elif scenario in HOSTILE:
                time.sleep(fault_seconds)  # the hostile answers go on; this is how long
            elif scenario == "listen-terminated":
                for _ in range(3):
                    terminated = terminate_listeners(postgres.url)
                    log(f"{scenario}: terminated {terminated} LISTEN connection(s)")
                    time.sleep(2)
            elif scenario == "make-run-worker-kill":
                child = make_run_worker(supervisor.pid)
                health = HealthWatch(base)
                os.kill(child, signal.SIGKILL)
                allowed = leased_ids(brand)
                restarted = None
                until = time.monotonic() + 60
                while restarted is None and time.monotonic() < until:
                    found = make_run_worker(supervisor.pid)
                    restarted = found if found not in (None, child) else None
                    time.sleep(0.1)
                if restarted is None:
                    raise RuntimeError("make run did not start its worker again")
                time.sleep(2)
                health.stop()
                log(f"{scenario}: worker {child} killed, {restarted} started; /healthz {health}")
                extra["healthz_failures"] = health.failures
                extra["healthz_checks"] = health.checks
            elif scenario == "erase-subject":
                extra.update(erase_under_load(app, base, erased_brand, erased_key, brand))
            fault_over = time.monotonic()
            log(f"{scenario}: fault over; load goes on 3 s")
            time.sleep(3)
            load.stop()
            expected = load.accepted * ENDPOINTS
            deadline = time.monotonic() + 120
            recovered_in = None
            while time.monotonic() < deadline:
                total, delivered = pending_of(healthy)
                if delivered >= expected and total == expected:
                    recovered_in = time.monotonic() - fault_over
                    break
                time.sleep(0.2)
            total, delivered = pending_of(healthy)
            stats = _get(f"{receiver}/_stats")
            with app.app_context():
                ids = set(
                    db.session.scalars(
                        select(WebhookDelivery.id).where(WebhookDelivery.endpoint_id.in_(healthy))
                    )
                )
                db.session.remove()
            # A delivery the receiver accepted (answered 2xx) more than once: a duplicate it
            # must dedupe. A 500 or an unanswered request followed by a 200 is a retry.
            counts = {k: v for k, v in stats["ok"].items() if k in ids}
            duplicates = {k for k, v in counts.items() if v > 1}
            received_ok = set(counts)
            results[scenario] = {
                "events": load.accepted,
                "refused_postbacks": load.refused,
                "expected_deliveries": expected,
                "recorded_deliveries": total,
                "delivered": delivered,
                "received_ok": len(received_ok),
                "lost": expected - len(received_ok),
                "duplicates": sum(counts[k] - 1 for k in duplicates),
                "duplicates_allowed": len(allowed),
                "unexpected_duplicates": len(duplicates - allowed),
                "recovery_seconds": round(recovered_in, 1) if recovered_in is not None else None,
                **extra,
            }
            log(f"{scenario}: {results[scenario]}")
        target = max(int(n) for n in RETRY_SCHEDULE.split(",")) + 10
        met = all(
            r["lost"] == 0
            and r["unexpected_duplicates"] == 0
            and r["recovery_seconds"] is not None
            and r["recovery_seconds"] <= target
            and r.get("healthz_failures", 0) == 0
            and r.get("erase_p99_ms", 0) < ERASE_P99_TARGET_MS
            and r.get("erase_finished", True)
            for r in results.values()
        )
        return {
            "postbacks_per_s": POSTBACKS_PER_SECOND,
            "endpoints": ENDPOINTS,
            "recovery_target_s": target,
            "scenarios": results,
            "targets_met": met,
        }
    finally:
        processes.stop_all()
        redis_server.close()
        postgres.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--receiver", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="8-second faults instead of 20")
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--logs", help="keep the processes' logs in this directory")
    args = parser.parse_args()
    if args.receiver:
        serve_receiver(args.receiver)
        return
    run_benchmark("chaos-", lambda workdir, processes: run(workdir, processes, args), args.logs)


if __name__ == "__main__":
    main()
