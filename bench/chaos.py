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
from collections import Counter
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
    percentile,
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
    "backlog-410",
    "backlog-recovery",
    "retry-pending",
    "row-lock",
    "heartbeat-stall",
    "record-delay",
    "ordered-lapse",
    "make-run-worker-kill",
    "erase-subject",
)
# erase-subject: the erased brand's subject, and what the load brand's deliveries may take.
ERASED_EVENTS = 100_000
ERASED_PENDING = 100
ERASE_P99_TARGET_MS = 1000
BOUNDED_SCENARIOS = SCENARIOS[SCENARIOS.index("backlog-410") : SCENARIOS.index("ordered-lapse") + 1]
HOSTILE = {
    "hostile-one": ("/nul",),
    "hostile-several": ("/nul", "/gzip-bomb", "/not-http", "/header-flood", "/drip"),
}

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
_FAIL = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom"
_GONE = b"HTTP/1.1 410 Gone\r\nContent-Length: 4\r\n\r\ngone"
# Like a real receiver, it takes a moment to answer, so a kill -9 finds attempts in flight.
ANSWER_SECONDS = 0.02


# --------------------------------------------------------------------------------------------
# The receiver (a separate process): `/_mode?m=ok|500|hang` switches how it answers.
# --------------------------------------------------------------------------------------------


class _Receiver(HttpRequests):
    """`/_mode?m=ok|500|hang|410` sets how every path answers; `&p=/prefix` sets it for the
    paths under that prefix only. Per delivery (`X-Service-Delivery`): requests received, 2xx
    answers, the first arrival (time.monotonic(), one clock for all processes), and overlaps:
    a request that arrives while another of the same delivery is still open (not answered,
    its connection not closed) is one delivery on the wire twice at once."""

    mode = "ok"
    modes: dict[str, str] = {}
    received: dict[str, int] = {}
    answered_ok: dict[str, int] = {}
    first_at: dict[str, float] = {}
    by_prefix: dict[str, int] = {}
    open_now: dict[str, int] = {}
    overlaps: list[str] = []

    paths_of: dict[str, set[str]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.current: str | None = None

    def handle(self, method: bytes, target: str, headers: dict[bytes, bytes]) -> None:
        if target.startswith("/_mode?"):
            query = dict(part.split("=", 1) for part in target.split("?", 1)[1].split("&"))
            if "p" in query:
                _Receiver.modes[query["p"]] = query["m"]
            else:
                _Receiver.mode = query["m"]
                _Receiver.modes.clear()
            self.transport.write(_OK)
            return
        if target.startswith("/_stats"):
            # `?p=/prefix`: the deliveries under that prefix only (and the overlaps anywhere).
            prefix = target.split("p=", 1)[1] if "p=" in target else ""
            ids = _Receiver.paths_of.get(prefix) if prefix else None
            body = json.dumps(
                {
                    "received": _Receiver.received
                    if ids is None
                    else _pick(_Receiver.received, ids),
                    "ok": _Receiver.answered_ok
                    if ids is None
                    else _pick(_Receiver.answered_ok, ids),
                    "first_at": _Receiver.first_at
                    if ids is None
                    else _pick(_Receiver.first_at, ids),
                    "by_prefix": _Receiver.by_prefix,
                    "overlaps": _Receiver.overlaps,
                }
            ).encode()
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            return
        delivery_id = headers.get(b"x-service-delivery", b"").decode()
        _Receiver.received[delivery_id] = _Receiver.received.get(delivery_id, 0) + 1
        _Receiver.first_at.setdefault(delivery_id, time.monotonic())
        prefix = "/" + target.split("/")[1]
        _Receiver.by_prefix[prefix] = _Receiver.by_prefix.get(prefix, 0) + 1
        _Receiver.paths_of.setdefault(prefix, set()).add(delivery_id)
        if _Receiver.open_now.get(delivery_id):
            _Receiver.overlaps.append(delivery_id)
        _Receiver.open_now[delivery_id] = _Receiver.open_now.get(delivery_id, 0) + 1
        self.current = delivery_id
        mode = _Receiver.mode
        for start, chosen in _Receiver.modes.items():
            if target.startswith(start):
                mode = chosen
        if mode == "hang":
            return  # never answered: the sender's timeout ends it
        asyncio.get_running_loop().call_later(ANSWER_SECONDS, self._answer, delivery_id, mode)

    def _close_current(self) -> None:
        if self.current is not None:
            _Receiver.open_now[self.current] -= 1
            self.current = None

    def connection_lost(self, exc) -> None:
        self._close_current()

    def _answer(self, delivery_id: str, mode: str) -> None:
        if self.transport.is_closing():
            return
        self._close_current()
        if mode == "500":
            self.transport.write(_FAIL)
            return
        if mode == "410":
            self.transport.write(_GONE)
            return
        _Receiver.answered_ok[delivery_id] = _Receiver.answered_ok.get(delivery_id, 0) + 1
        self.transport.write(_OK)


def _pick(values: dict, ids: set) -> dict:
    return {k: v for k, v in values.items() if k in ids}


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

    def __init__(self, base: str, brand: str, key: str, rate: float = POSTBACKS_PER_SECOND):
        self.url = f"{base}/api/v1/brand/{brand}/conversion/record-postback"
        self.key = key
        self.rate = rate
        self.accepted = 0
        # conversion id -> when its postback's 201 came back (time.monotonic())
        self.returned: dict[str, float] = {}
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
        interval = 1 / self.rate
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
                        answer = json.loads(response.read())
                        self.returned[answer["data"]["conversionId"]] = time.monotonic()
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


# --------------------------------------------------------------------------------------------
# Issue 41's scenarios: one brand's endpoint under attack, another brand delivering beside it
# --------------------------------------------------------------------------------------------

# A pending backlog, written as the publisher writes it (one event, its deliveries queued):
# through the API, 250,000 deliveries would take most of an hour. Ids as long as the app's.
SEED_BACKLOG = """
    WITH made AS (
        INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name, status,
            attempt_count, next_attempt_at, created_at)
        SELECT 'whd_' || %(tag)s || lpad(CAST(i AS text), 22, '0'), %(brand_id)s,
               %(endpoint_id)s, %(event_id)s, 'deal.completed', 'pending', %(attempts)s,
               statement_timestamp() + make_interval(secs => %(delay)s),
               statement_timestamp() - interval '1 minute'
        FROM generate_series(CAST(%(first)s AS int), CAST(%(last)s AS int)) AS i
        RETURNING id, next_attempt_at
    )
    INSERT INTO webhook_delivery_queue (delivery_id, endpoint_id, next_attempt_at, attempt_count)
    SELECT id, %(endpoint_id)s, next_attempt_at, %(attempts)s FROM made
"""
SEED_ROWS = 5_000
# The bounded scenarios' workers: one, or two where the scenario is about two.
TWO_WORKERS = ("heartbeat-stall", "record-delay", "ordered-lapse")
OTHER_P99_TARGET_MS = 1000


class Bounded:
    """One of issue 41's scenarios, with what every one of them shares: the other brand's
    steady postbacks (the Load, 8 endpoints), its deliveries' latency and losses, overlaps
    counted at the receiver, and the attacked brand's endpoint beside it."""

    def __init__(self, scenario: str, ctx: dict, args) -> None:
        self.scenario = scenario
        self.ctx = ctx
        self.args = args
        self.app = ctx["app"]
        self.receiver = ctx["receiver"]
        self.conninfo = ctx["database_url"].replace("postgresql+psycopg://", "postgresql://")
        self.workers: list = []
        self.extra: dict = {}
        self.allowed: set[str] = set()

    # --- set-up ----------------------------------------------------------------------------

    def brand(self, name: str, endpoints: list[tuple[str, dict]]) -> tuple[str, str, list[str]]:
        """A brand with a read-write key and endpoints at (path, options): (brand, key, ids)."""
        from extensions import db
        from services.api_keys import create_api_key
        from services.brands import create_brand
        from services.endpoint_urls import UrlPolicy
        from services.webhook_endpoints import register_endpoint

        with self.app.app_context():
            brand = create_brand(name=name, plan="growth").id
            key = create_api_key(
                brand_id=brand, name="chaos", scopes=("read", "write"), created_by="bench"
            ).secret
            local = UrlPolicy(https_only=False, allow_local=True)
            ids = [
                register_endpoint(
                    brand_id=brand,
                    url=f"{self.receiver}{path}",
                    events=options.get("events", ["conversion.recorded", "deal.completed"]),
                    policy=local,
                    ordering=options.get("ordering", "none"),
                ).id
                for path, options in endpoints
            ]
            db.session.commit()
            db.session.remove()
        return brand, key, ids

    def seed(self, endpoint_id: str, count: int, *, waiting_for_a_retry: bool) -> float:
        """`count` pending deliveries of one event to the endpoint, due now or waiting for a
        retry an hour away after a failed first attempt; seconds it took."""
        import psycopg

        from extensions import db
        from services.events import publish_event

        with self.app.app_context():
            brand_id = self.endpoint_row(endpoint_id)["brand_id"]
            event = publish_event(
                brand_id=brand_id,
                name="deal.completed",
                data={"n": -1},
                only_endpoint_ids=[endpoint_id],
            ).event
            db.session.commit()
            db.session.remove()
        started = time.monotonic()
        # In commits of SEED_ROWS, as publishers commit (a postback is one small commit): one
        # transaction of 250,000 rows would leave that many uncommitted entries in the queue's
        # index for every claim's walk to step over until it commits, which no publisher does.
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            for first in range(1, count + 1, SEED_ROWS):
                conn.execute(
                    SEED_BACKLOG,
                    {
                        "tag": f"{SCENARIOS.index(self.scenario):04d}",
                        "brand_id": brand_id,
                        "endpoint_id": endpoint_id,
                        "event_id": event.id,
                        "first": first,
                        "last": min(count, first + SEED_ROWS - 1),
                        "attempts": 1 if waiting_for_a_retry else 0,
                        "delay": 3600 if waiting_for_a_retry else 0,
                    },
                )
        return time.monotonic() - started

    def sql(self, statement: str, params: dict | None = None) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            cursor = conn.execute(statement, params or {})
            return cursor.fetchall() if cursor.description else []

    def endpoint_row(self, endpoint_id: str) -> dict:
        [(brand_id, disabled_at, failures)] = self.sql(
            "SELECT brand_id, disabled_at, consecutive_failures FROM webhook_endpoints"
            " WHERE id = %(id)s",
            {"id": endpoint_id},
        )
        return {"brand_id": brand_id, "disabled": disabled_at is not None, "failures": failures}

    def queued(self, endpoint_id: str, *, waiting: bool = False) -> int:
        where = " AND next_attempt_at > now()" if waiting else ""
        return self.sql(
            f"SELECT count(*) FROM webhook_delivery_queue WHERE endpoint_id = %(id)s{where}",
            {"id": endpoint_id},
        )[0][0]

    def statuses(self, endpoint_id: str) -> dict[str, int]:
        return dict(
            self.sql(
                "SELECT status, count(*) FROM webhook_deliveries WHERE endpoint_id = %(id)s"
                " GROUP BY status",
                {"id": endpoint_id},
            )
        )

    def start_worker(self, **settings: str):
        argv = [sys.executable, "-m", "flask", "--app", "app", "worker"]
        worker = self.ctx["processes"].start("worker", argv, {**self.ctx["worker_env"], **settings})
        self.workers.append(worker)
        return worker

    def wait_ready(self, worker) -> None:
        """Until the worker's delivery loop has written its first heartbeat (it claims)."""
        self.poll(
            "the worker's first round",
            lambda: self.sql(
                "SELECT 1 FROM webhook_delivery_loops WHERE pid = %(pid)s", {"pid": worker.pid}
            ),
            60,
            every=0.1,
        )

    def poll(self, what: str, check, timeout: float, every: float = 0.5) -> float:
        """Seconds until `check()` is true; raises after `timeout`."""
        started = time.monotonic()
        while not check():
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"{self.scenario}: {what} not within {timeout:.0f}s")
            for worker in self.workers:
                if worker.poll() is not None and worker not in self.ctx.get("killed", []):
                    raise RuntimeError(
                        f"{self.scenario}: a worker died:\n" + self.ctx["processes"].log_of(worker)
                    )
            time.sleep(every)
        return time.monotonic() - started

    def delivered_count(self, endpoint_id: str) -> int:
        return self.statuses(endpoint_id).get("delivered", 0)

    def rate_over(self, endpoint_id: str, seconds: float) -> float:
        before = self.delivered_count(endpoint_id)
        time.sleep(seconds)
        return round((self.delivered_count(endpoint_id) - before) / seconds, 1)

    # --- the run ---------------------------------------------------------------------------

    def run(self) -> dict:
        scenario = self.scenario
        other, other_key, _ = self.brand(
            f"Chaos {scenario} bystander",
            [(f"/{scenario}/{n}", {"events": ["conversion.recorded"]}) for n in range(ENDPOINTS)],
        )
        ordered = {"ordering": "subject"} if scenario == "ordered-lapse" else {}
        attacked_brand, attacked_key, [attacked] = self.brand(
            f"Chaos {scenario} attacked", [(f"/{scenario}-attacked/0", ordered)]
        )
        self.attacked, self.attacked_brand, self.attacked_key = (
            attacked,
            attacked_brand,
            attacked_key,
        )
        self.wait_ready(self.start_worker())
        load = Load(self.ctx["base"], other, other_key)
        load.start()
        log(f"{scenario}: steady load")
        time.sleep(5)
        log(f"{scenario}: fault")
        self.fault_at = time.monotonic()
        try:
            getattr(self, scenario.replace("-", "_"))()
        finally:
            time.sleep(3)
            load.stop()
            for attack in self.extra.pop("_loads", []):
                attack.stop()
        # Every accepted postback reaches each healthy endpoint.
        expected = load.accepted * ENDPOINTS
        ids_by_conversion = self.deliveries_by_conversion(other)
        wanted = {d for ids in ids_by_conversion.values() for d in ids}
        if len(wanted) != expected:
            raise RuntimeError(f"{scenario}: {len(wanted)} deliveries for {expected} expected")
        deadline = time.monotonic() + 120
        while True:
            stats = _get(f"{self.receiver}/_stats?p=/{scenario}")
            if wanted <= set(stats["ok"]) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        timed = [
            (load.returned[conversion], (stats["first_at"][d] - load.returned[conversion]) * 1000)
            for conversion, ids in ids_by_conversion.items()
            for d in ids
            if d in stats["first_at"] and conversion in load.returned
        ]
        latencies = sorted(latency for _, latency in timed)
        # When the late ones were published: seconds since the fault began -> how many.
        late = Counter(
            int(returned - self.fault_at) for returned, latency in timed if latency >= 1000
        )
        everything = _get(f"{self.receiver}/_stats?p=/{scenario}-attacked")
        for worker in self.workers:
            self.ctx["processes"].stop(worker)
        result = {
            "events": load.accepted,
            "refused_postbacks": load.refused,
            "expected_deliveries": expected,
            "lost": len(wanted - set(stats["ok"])),
            "duplicates": sum(v - 1 for k, v in stats["ok"].items() if k in wanted and v > 1),
            "duplicates_allowed": len(self.allowed),
            "unexpected_duplicates": len(
                {k for k, v in stats["ok"].items() if k in wanted and v > 1} - self.allowed
            ),
            "overlaps": len(everything["overlaps"]),
            "other_p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
            "other_p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
            "other_max_ms": round(latencies[-1], 1) if latencies else None,
            "other_late_by_second_of_fault": dict(sorted(late.items())),
            **self.extra,
        }
        result["met"] = (
            result["lost"] == 0
            and result["overlaps"] == 0
            and result["unexpected_duplicates"] == 0
            and result["other_p99_ms"] is not None
            and result["other_p99_ms"] < OTHER_P99_TARGET_MS
            and result.pop("_met", True)
        )
        log(f"{scenario}: {result}")
        return result

    def deliveries_by_conversion(self, brand: str) -> dict[str, list[str]]:
        rows = self.sql(
            "SELECT CAST(e.body AS jsonb) -> 'data' ->> 'id', d.id FROM webhook_deliveries AS d"
            " JOIN webhook_events AS e ON e.id = d.event_id"
            " WHERE d.brand_id = %(brand)s AND d.event_name = 'conversion.recorded'",
            {"brand": brand},
        )
        found: dict[str, list[str]] = {}
        for conversion, delivery in rows:
            found.setdefault(conversion, []).append(delivery)
        return found

    def mode(self, mode: str) -> None:
        _get(f"{self.receiver}/_mode?m={mode}&p=/{self.scenario}-attacked")

    # --- the attacks -----------------------------------------------------------------------

    def backlog_410(self) -> None:
        """The attacked receiver answers 410 over a backlog: its endpoint is disabled at the
        first answer and nothing more is sent; a job fails the backlog in batches."""
        self.mode("410")
        took = self.seed(self.attacked, self.args.backlog, waiting_for_a_retry=False)
        log(f"{self.scenario}: seeded {self.args.backlog} due in {took:.1f}s")
        disabled = self.poll(
            "the endpoint disabled", lambda: self.endpoint_row(self.attacked)["disabled"], 60
        )
        ended = self.poll(
            "the backlog failed", lambda: self.queued(self.attacked) == 0, 1800, every=1
        )
        statuses = self.statuses(self.attacked)
        sent = _get(f"{self.receiver}/_stats?p=/{self.scenario}-attacked")["by_prefix"].get(
            f"/{self.scenario}-attacked", 0
        )
        self.extra.update(
            backlog=self.args.backlog,
            disabled_after_s=round(disabled, 1),
            backlog_ended_after_s=round(disabled + ended, 1),
            backlog_failed_per_s=round(self.args.backlog / max(ended, 0.001)),
            attacked_statuses=statuses,
            attacked_requests=sent,
            _met=statuses.get("pending", 0) == 0 and sent <= 2,
        )

    def backlog_recovery(self) -> None:
        """The attacked endpoint was down (its breaker engaged) with a backlog waiting for a
        retry; it answers again: its probe succeeds, a catch-up job brings the backlog forward
        in batches, and it is delivered at the endpoint's pace."""
        took = self.seed(self.attacked, self.args.backlog, waiting_for_a_retry=True)
        log(f"{self.scenario}: seeded {self.args.backlog} waiting for a retry in {took:.1f}s")
        self.sql(
            "UPDATE webhook_endpoints SET consecutive_failures = 5, failing_since = now(),"
            " next_probe_at = now() WHERE id = %(id)s",
            {"id": self.attacked},
        )
        self.publish_to_attacked({"n": 0})  # the probe, which succeeds
        recovered = self.poll(
            "the probe's success", lambda: self.endpoint_row(self.attacked)["failures"] == 0, 60
        )
        caught_up, rate = self.caught_up()
        self.extra.update(
            backlog=self.args.backlog,
            probe_succeeded_after_s=round(recovered, 1),
            caught_up_after_s=round(recovered + caught_up, 1),
            brought_forward_per_s=round(self.args.backlog / max(caught_up, 0.001)),
            attacked_delivered_per_s=rate,
        )

    def caught_up(self) -> tuple[float, float]:
        """Seconds until no delivery of the attacked endpoint waits for a retry any more, and
        the rate it is delivered at over the next 20 s."""
        caught_up = self.poll(
            "every retry brought forward",
            lambda: self.queued(self.attacked, waiting=True) == 0,
            1800,
            every=1,
        )
        return caught_up, self.rate_over(self.attacked, 20)

    def retry_pending(self) -> None:
        """retry-pending from the API over a backlog waiting for a retry: it answers at once
        (the first batch in the request), a job brings the rest forward."""
        took = self.seed(self.attacked, self.args.backlog, waiting_for_a_retry=True)
        log(f"{self.scenario}: seeded {self.args.backlog} waiting for a retry in {took:.1f}s")
        request = urllib.request.Request(  # noqa: S310 - our own http:// URL
            f"{self.ctx['base']}/api/v1/brand/{self.attacked_brand}/webhook/{self.attacked}"
            "/retry-pending",
            method="POST",
            headers={"X-Api-Key": self.attacked_key},
        )
        started = time.monotonic()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=30) as response:
            answer = json.loads(response.read())
        answered_ms = (time.monotonic() - started) * 1000
        caught_up, rate = self.caught_up()
        self.extra.update(
            backlog=self.args.backlog,
            api_ms=round(answered_ms, 1),
            api_due=answer["data"]["due"],
            caught_up_after_s=round(caught_up, 1),
            brought_forward_per_s=round(self.args.backlog / max(caught_up, 0.001)),
            attacked_delivered_per_s=rate,
        )

    def row_lock(self) -> None:
        """A session holds the attacked endpoint's row FOR NO KEY UPDATE while its own brand's
        postbacks go on too: nothing in a round waits for it."""
        import psycopg

        attack = Load(self.ctx["base"], self.attacked_brand, self.attacked_key, rate=5)
        attack.start()
        self.extra["_loads"] = [attack]
        with psycopg.connect(self.conninfo) as holder:
            holder.execute(
                "SELECT 1 FROM webhook_endpoints WHERE id = %s FOR NO KEY UPDATE", [self.attacked]
            )
            time.sleep(self.args.lock_seconds)
            holder.rollback()
        attack.stop()
        self.extra["_loads"] = []
        expected = attack.accepted
        done = self.poll(
            "the attacked brand's deliveries",
            lambda: self.delivered_count(self.attacked) >= expected,
            60,
        )
        self.extra.update(
            lock_held_s=self.args.lock_seconds,
            attacked_events=expected,
            attacked_delivered=self.delivered_count(self.attacked),
            attacked_all_delivered_after_unlock_s=round(done, 1),
        )

    def heartbeat_stall(self) -> None:
        """A second worker stalls 10 s right after its first claim (a frozen process), past
        its attempts' start window: it must not send them late beside the worker that takes
        them over when their leases lapse."""
        stalled = self.start_worker(FAILPOINTS="delivery.after_claim=sleep-once:10")
        time.sleep(10 + 13 + 5)  # the stall, the lease (2 + 5 + 6 s), and a margin
        log_text = self.ctx["processes"].log_of(stalled)
        self.extra["not_started_in_stalled_worker"] = log_text.count("not started")

    def record_delay(self) -> None:
        """A second worker's first record waits 10 s (past the old 5 s lease slack, within
        the lease of 2 + 5 + 6 s): nothing it sent is taken and sent again."""
        self.start_worker(FAILPOINTS="delivery.before_record=sleep-once:10")
        time.sleep(10 + 13 + 5)

    def ordered_lapse(self) -> None:
        """An ordered endpoint with a delivery of subject X on the wire (its receiver hangs):
        disabled, re-enabled, then the worker holding the lease dies (kill -9). X's later
        events are delivered, in order, once the lease has lapsed: the earlier delivery, ended
        by the disable's job, holds nothing. Nobody restarts anything."""
        # Both live, so that each takes its share of the other brand's endpoints' limits (the
        # one killed must not hold both slots of one: those wait for their leases).
        self.wait_ready(self.start_worker())
        time.sleep(2)
        self.mode("hang")
        first = self.publish_to_attacked({"id": "deal_chaos_x", "n": 1})
        self.poll(
            "the first delivery leased",
            lambda: self.sql(
                "SELECT 1 FROM webhook_delivery_leases WHERE delivery_id = %(id)s", {"id": first}
            ),
            30,
            every=0.05,
        )
        [(token,)] = self.sql(
            "SELECT token FROM webhook_delivery_leases WHERE delivery_id = %(id)s", {"id": first}
        )
        [(pid,)] = self.sql(
            "SELECT pid FROM webhook_delivery_loops WHERE id LIKE %(owner)s",
            {"owner": token[:8] + "-%"},
        )
        for active in (False, True):
            self.api("PATCH", f"webhook/{self.attacked}/update-endpoint", {"isActive": active})
        holder = next(w for w in self.workers if w.pid == pid)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        # What it had on the wire may have reached its receiver unrecorded: sent again once
        # its lease lapses (after, never beside: overlaps are counted apart).
        self.allowed = {
            delivery
            for (delivery,) in self.sql(
                "SELECT delivery_id FROM webhook_delivery_leases WHERE token LIKE %(owner)s",
                {"owner": token[:8] + "%"},
            )
        }
        self.ctx.setdefault("killed", []).append(holder)
        killed_at = time.monotonic()
        self.mode("ok")
        later = [self.publish_to_attacked({"id": "deal_chaos_x", "n": n}) for n in (2, 3)]
        delivered = self.poll(
            "the subject's later events",
            lambda: all(
                status == "delivered"
                for (status,) in self.sql(
                    "SELECT status FROM webhook_deliveries WHERE id = ANY(%(ids)s)", {"ids": later}
                )
            ),
            60,
        )
        first_at = _get(f"{self.receiver}/_stats?p=/{self.scenario}-attacked")["first_at"]
        [(first_status,)] = self.sql(
            "SELECT status FROM webhook_deliveries WHERE id = %(id)s", {"id": first}
        )
        in_order = later[0] in first_at and first_at[later[0]] <= first_at.get(later[1], 1e18)
        self.extra.update(
            worker_killed=pid,
            workers_left_running=sum(w.poll() is None for w in self.workers),
            later_events_delivered_after_kill_s=round(time.monotonic() - killed_at, 1),
            waited_s=round(delivered, 1),
            first_delivery=first_status,
            later_in_order=in_order,
            _met=first_status == "failed" and in_order,
        )

    def publish_to_attacked(self, data: dict) -> str:
        from extensions import db
        from services.events import publish_event

        with self.app.app_context():
            published = publish_event(
                brand_id=self.attacked_brand,
                name="deal.completed",
                data=data,
                only_endpoint_ids=[self.attacked],
            )
            db.session.commit()
            db.session.remove()
        return published.delivery_ids[0]

    def api(self, method: str, path: str, body: dict) -> dict:
        request = urllib.request.Request(  # noqa: S310 - our own http:// URL
            f"{self.ctx['base']}/api/v1/brand/{self.attacked_brand}/{path}",
            method=method,
            data=json.dumps(body).encode(),
            headers={"X-Api-Key": self.attacked_key, "Content-Type": "application/json"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=30) as response:
            return json.loads(response.read())


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
        ctx = {
            "app": app,
            "receiver": receiver,
            "database_url": postgres.url,
            "processes": processes,
            "worker_env": worker_env,
        }
        for scenario in args.scenarios:
            if scenario in BOUNDED_SCENARIOS:
                processes.stop(worker)
                results[scenario] = Bounded(scenario, {**ctx, "base": base}, args).run()
                worker = start_worker()
                continue
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
            r["met"]
            if "met" in r
            else (
                r["lost"] == 0
                and r["unexpected_duplicates"] == 0
                and r["recovery_seconds"] is not None
                and r["recovery_seconds"] <= target
                and r.get("healthz_failures", 0) == 0
                and r.get("erase_p99_ms", 0) < ERASE_P99_TARGET_MS
                and r.get("erase_finished", True)
            )
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
    parser.add_argument(
        "--backlog",
        type=int,
        default=50_000,
        help="the attacked endpoint's backlog (issue 41's size: 250000)",
    )
    parser.add_argument(
        "--lock-seconds",
        type=float,
        default=20,
        help="how long row-lock holds the row (issue 41's: 60)",
    )
    parser.add_argument("--logs", help="keep the processes' logs in this directory")
    args = parser.parse_args()
    if args.receiver:
        serve_receiver(args.receiver)
        return
    run_benchmark("chaos-", lambda workdir, processes: run(workdir, processes, args), args.logs)


if __name__ == "__main__":
    main()
