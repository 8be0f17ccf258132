"""Scale-out benchmark (issues 35 and 41): what a claim costs as endpoints grow, one worker's
drain rate as endpoints grow, what more workers add and whether they share, whether they wait on
each other's locks, which updates are HOT, what a pending delivery costs on disk, what a claim
costs after a large drain, what the periodic statements cost, and how a deep page of the delivery
log compares with the first, side by side in one run (see bench/README.md).

Run from the repository root:  .venv/bin/python -m bench.scale

The real schema is seeded with generate_series, with ids as long as the app's (`whd_` and 26
characters: models/columns.py `new_id`): brands of 20 endpoints, one event per brand,
`--pending` deliveries spread evenly over the endpoints, each queued and due; once per endpoint
count:

1. claim: `claim_attempts` as the delivery loop calls it (64 slots, a walk of 128 endpoints),
   each try's leases put back in the queue afterwards, untimed, so that each sees the same
   backlog: the median of `--claims` tries, and the buffers (shared hit + read) its two
   statements (`_PICK`, `_TAKE`) touch, from EXPLAIN (ANALYZE, BUFFERS), at each endpoint count.
   Target: 100,000 endpoints within 2 times 100.
2. drain: `flask --app app worker` processes against an asyncio receiver that answers 200 at
   once (bench/deliveries.py's), over the seeded backlog: receipts per second over `--window`
   seconds after a warm-up. 1 and 2 workers at 100 endpoints, 1, 2 and 4 at 10,000 (each with
   its own metrics directory, so each one's attempts are counted). Targets: one worker at 100
   and at 10,000 endpoints within 1.25 times; 2 workers' shares within 0.4-0.6 at both counts.
   While they run: the CPU of the machine, of PostgreSQL's processes and of the workers (from
   /proc; `limited_by` says what bounds the rate), and `pg_stat_activity` sampled every 20 ms:
   the share of samples in which a worker's backend waited on a lock, and on which. Target: no
   record waits on another worker's lock.
3. HOT: per table the delivery path writes, updates per delivery and the share that were HOT
   during the drains (pg_stat_user_tables). Target: no row updated per delivery unless HOT.
4. storage: bytes per pending delivery, freshly seeded: its webhook_deliveries row and its
   queue row, each with its indexes. Target: at most 700.
5. after a drain (`--drain`, default 1,000,000 over 10,000 endpoints): the claim on the fresh
   table, then after the drain, done in SQL in batches of 5,000 the way the engine writes it
   (each delivery: its queue row deleted, a lease inserted and deleted, its delivery row
   updated `delivered`), with the hot tables' autovacuum as the server has it: right after the
   drain, and (when the server's autovacuum is on) again once autovacuum has visited the queue
   and the leases, or 90 s. Target: within 1.25 times the fresh table's claim.
   `--private-postgres` runs the whole bench on an embedded PostgreSQL of its own with
   autovacuum on (the machine's may have it off: the JSON says which).
6. periodic statements, at the largest endpoint count: what each statement a worker or a
   scrape runs on a timer costs (EXPLAIN ANALYZE: ms and buffers): the secrets sweep, the
   metrics backlog and loop ages, the bulk runner's next job, the heartbeat. Target: none
   grows with the endpoints or the queue.
7. reads: one brand with `--log-rows` delivered deliveries over 10 endpoints (1% failed):
   fetch-deliveries page 1 and page 500 (`limit=100`, `endpointId`), through the app (the Flask
   test client: no HTTP server in the figure), median of 15; the JSON says which page the deep
   read reached (the answer's `meta.page`, its rows checked). Target: within 2 times.

It prints progress on stderr and ends with one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BRAND_TEST_BACKENDS", "services")

from bench.common import (  # noqa: E402
    Processes,
    app_settings,
    child_environ,
    log,
    run_benchmark,
)
from bench.deliveries import Control, start_receiver  # noqa: E402
from services.delivery.outcomes import (  # noqa: E402
    RECORD_SLACK_SECONDS,
    START_WINDOW_SECONDS,
)

# The lease a worker with the default WEBHOOK_TIMEOUT (10 s) takes (RetryPolicy.lease).
LEASE = timedelta(seconds=START_WINDOW_SECONDS + 10 + RECORD_SLACK_SECONDS)

ENDPOINTS_PER_BRAND = 20
CLAIM_SLOTS = 64
WARMUP_SECONDS = 3.0
EVENT_NAME = "conversion.recorded"
# The tables a delivery writes on its way, whose updates must be HOT.
HOT_TABLES = (
    "webhook_deliveries",
    "webhook_endpoints",
    "webhook_delivery_queue",
    "webhook_delivery_leases",
    "webhook_delivery_loops",
    "webhook_endpoint_hours",
)
# An id as long as the app's: a prefix and 26 characters (models/columns.py).
ID_SQL = "{prefix} || lpad(CAST({n} AS text), 26, '0')"


def _id(prefix: str, n: str) -> str:
    return ID_SQL.format(prefix=f"'{prefix}'", n=n)


LOG_BRAND = "brd_" + "log".rjust(26, "0")


def log_endpoint(n: int) -> str:
    return "whe_" + f"log{n}".rjust(26, "0")


SEED_SQL = [
    "TRUNCATE webhook_delivery_leases, webhook_delivery_queue, webhook_attempts,"
    " webhook_deliveries, webhook_events, webhook_event_subjects, webhook_endpoints,"
    " webhook_delivery_loops, webhook_bulk_jobs, webhook_endpoint_hours, brands CASCADE",
    f"""
    INSERT INTO brands (id, name, plan, kyb_status, subscription_period_start,
                        subscription_period_end, created_at)
    SELECT {_id("brd_", "b")}, 'Scale ' || b, 'growth', 'verified', now(),
           now() + interval '30 days', now()
    FROM generate_series(0, %(brands)s - 1) AS b
    """,
    f"""
    INSERT INTO webhook_endpoints (id, brand_id, url, events, secret_ciphertext,
        consecutive_failures, created_at, updated_at, ordering)
    SELECT {_id("whe_", "e")}, {_id("brd_", "e / %(per_brand)s")}, %(url)s,
           '["conversion.recorded"]', %(secret)s, 0, now(), now(), 'none'
    FROM generate_series(0, %(endpoints)s - 1) AS e
    """,
    f"""
    INSERT INTO webhook_events (id, brand_id, name, body, created_at, subject_type, subject_id,
                                sequence)
    SELECT {_id("evt_", "b")}, {_id("brd_", "b")}, 'conversion.recorded', %(body)s, now(),
           'conversion', {_id("conv_", "b")}, 1
    FROM generate_series(0, %(brands)s - 1) AS b
    """,
    f"""
    INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name, status,
        attempt_count, next_attempt_at, created_at)
    SELECT {_id("whd_", "i")}, {_id("brd_", "(i %% %(endpoints)s) / %(per_brand)s")},
           {_id("whe_", "i %% %(endpoints)s")},
           {_id("evt_", "(i %% %(endpoints)s) / %(per_brand)s")},
           'conversion.recorded', 'pending', 0, now(),
           now() - interval '1 hour' + i * interval '1 millisecond'
    FROM generate_series(0, %(pending)s - 1) AS i
    """,
    """
    INSERT INTO webhook_delivery_queue (delivery_id, endpoint_id, next_attempt_at, attempt_count)
    SELECT id, endpoint_id, created_at, 0 FROM webhook_deliveries ORDER BY id
    """,
    "VACUUM (ANALYZE) webhook_deliveries, webhook_delivery_queue, webhook_endpoints",
]

# One brand's delivery log for the read figures: delivered, 1% failed (all on log endpoint 3,
# which the failed-filter reads ask for), over 10 endpoints.
LOG_SQL = [
    f"""
    INSERT INTO brands (id, name, plan, kyb_status, subscription_period_start,
                        subscription_period_end, created_at)
    VALUES ('{LOG_BRAND}', 'Log', 'growth', 'verified', now(), now() + interval '30 days',
            now())
    """,
    f"""
    INSERT INTO webhook_endpoints (id, brand_id, url, events, secret_ciphertext,
        consecutive_failures, created_at, updated_at, ordering)
    SELECT 'whe_' || lpad('log' || e, 26, '0'), '{LOG_BRAND}', %(url)s,
           '["conversion.recorded"]', %(secret)s, 0, now(), now(), 'none'
    FROM generate_series(0, 9) AS e
    """,
    f"""
    INSERT INTO webhook_events (id, brand_id, name, body, created_at, subject_type, subject_id,
                                sequence)
    VALUES ('evt_' || lpad('log', 26, '0'), '{LOG_BRAND}', 'conversion.recorded', %(body)s,
            now(), 'conversion', 'conv_log', 1)
    """,
    f"""
    INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name, status,
        http_status, attempt_count, delivered_at, failed_at, last_error, created_at)
    SELECT 'whd_' || lpad('l' || i, 26, '0'), '{LOG_BRAND}',
           'whe_' || lpad('log' || (i %% 10), 26, '0'),
           'evt_' || lpad('log', 26, '0'), 'conversion.recorded',
           CASE WHEN i %% 100 = 3 THEN 'failed' ELSE 'delivered' END,
           CASE WHEN i %% 100 = 3 THEN 500 ELSE 200 END, 1,
           CASE WHEN i %% 100 = 3 THEN NULL ELSE now() END,
           CASE WHEN i %% 100 = 3 THEN now() END,
           CASE WHEN i %% 100 = 3 THEN 'HTTP 500' END,
           now() - interval '20 days' + i * interval '1 second'
    FROM generate_series(0, %(rows)s - 1) AS i
    """,
    # As autovacuum leaves a log of settled rows: visible to all, so a deep page's walk of an
    # index reads the index alone (an index-only scan needs the visibility map set).
    "VACUUM (ANALYZE) webhook_deliveries",
]


def seed(conn, sql: list[str], params: dict) -> float:
    """Seed, then write the seed out: a million rows leave a checkpoint's worth of writes, and a
    drain timed while the checkpointer flushes them times the disk (one worker at 10,000
    endpoints: 239/s with 0.17 of 2 cores busy, where two made 3,339/s just after)."""
    started = time.monotonic()
    for statement in sql:
        conn.execute(statement, params)
    took = time.monotonic() - started
    conn.execute("CHECKPOINT")
    return took


# Each try's leases back in the queue, as they were (untimed): every try sees the same backlog.
_PUT_BACK = """
    WITH l AS (DELETE FROM webhook_delivery_leases RETURNING *)
    INSERT INTO webhook_delivery_queue (delivery_id, endpoint_id, next_attempt_at, attempt_count)
    SELECT l.delivery_id, l.endpoint_id, d.created_at, l.attempt_count
    FROM l JOIN webhook_deliveries AS d ON d.id = l.delivery_id
"""


def measure_claim(app, conninfo: str, tries: int) -> dict:
    """The claim's median time (as the loop makes it) and its two statements' buffers."""
    import psycopg

    from extensions import db
    from services.delivery.queue import (
        _PICK,
        _TAKE,
        CLAIM_LOCK_CLASS,
        LIVE_WORKER_SECONDS,
        ORDERED_LOOK_AHEAD,
        claim_attempts,
    )

    claim = {
        "slots": CLAIM_SLOTS,
        "endpoint_limit": 2,
        "token": "bench000" + "0" * 24,
        "lease": LEASE,
        "walk_max": 2 * CLAIM_SLOTS,
    }
    samples = []
    claimed = 0
    with psycopg.connect(conninfo, autocommit=True) as conn:
        with app.app_context():
            for _ in range(tries + 1):
                started = time.perf_counter()
                got = claim_attempts(**claim)
                samples.append((time.perf_counter() - started) * 1000)
                claimed = len(got.attempts)
                db.session.remove()
                conn.execute(_PUT_BACK)
            db.engine.dispose()
        pick = {
            "now": None,
            "cursor": "",
            "cycle_start": "",
            "walk_max": claim["walk_max"],
            "slots": CLAIM_SLOTS,
            "endpoint_limit": 2,
            "held": [],
            "lock_class": CLAIM_LOCK_CLASS,
        }
        buffers = 0
        conn.autocommit = False
        raw = psycopg.RawCursor(conn)
        plan = raw.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _PICK.sql, _PICK.values(pick)
        )
        buffers += _buffers(plan.fetchone()[0][0]["Plan"])
        rows = raw.execute(_PICK.sql, _PICK.values(pick)).fetchall()
        ids = [row[1] for row in rows if row[0] == "endpoint"]
        take = {
            **pick,
            "endpoint_ids": ids,
            "owner": claim["token"][:8],
            "token": claim["token"],
            "lease_seconds": LEASE.total_seconds(),
            "look_ahead": ORDERED_LOOK_AHEAD,
            "live_seconds": LIVE_WORKER_SECONDS,
        }
        plan = raw.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _TAKE.sql, _TAKE.values(take)
        )
        buffers += _buffers(plan.fetchone()[0][0]["Plan"])
        conn.rollback()
    return {"ms": round(statistics.median(samples[1:]), 2), "buffers": buffers, "claimed": claimed}


def _buffers(plan: dict) -> int:
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)


class Cpu:
    """CPU time of the machine, of PostgreSQL's processes and of given pids, from /proc."""

    def __init__(self, worker_pids: list[int]) -> None:
        self.worker_pids = worker_pids
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.start = self._read()

    def _read(self) -> tuple[float, float, float, float]:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        values = [int(value) for value in fields]
        idle = values[3] + values[4]
        return (
            time.monotonic(),
            sum(values) - idle,
            self._group(_postgres_pids()),
            self._group(self.worker_pids),
        )

    def _group(self, pids) -> float:
        total = 0
        for pid in pids:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(stat[11]) + int(stat[12]) + int(stat[13]) + int(stat[14])
        return total

    def cores(self) -> dict:
        """Cores used since the start: machine, postgresql, workers."""
        now = self._read()
        seconds = now[0] - self.start[0]
        return {
            "machine": round((now[1] - self.start[1]) / self.ticks / seconds, 2),
            "postgresql": round((now[2] - self.start[2]) / self.ticks / seconds, 2),
            "workers": round((now[3] - self.start[3]) / self.ticks / seconds, 2),
        }


def _postgres_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def attempts_counted(directory: Path) -> float:
    """A worker's attempts so far, from its own prometheus multiprocess files."""
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    total = 0.0
    for family in registry.collect():
        if family.name == "brand_api_webhook_attempts":
            total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total


class LockWaits:
    """From a thread, every 20 ms: whether any of the workers' backends waits on a lock (their
    connections are named `brand-api pid=<pid>`, app.py), and on which, with its statement's
    first words."""

    def __init__(self, conninfo: str, pids: list[int]) -> None:
        self.conninfo = conninfo
        self.names = [f"brand-api pid={pid}" for pid in pids]
        self.samples = 0
        self.waiting_samples = 0
        self.waits: Counter = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            while not self._stop.wait(0.02):
                # A row lock's waiter holds the tuple lock of the row it waits for: its table.
                rows = conn.execute(
                    "SELECT a.wait_event, left(regexp_replace(a.query, '\\s+', ' ', 'g'), 40),"
                    " (SELECT string_agg(DISTINCT CAST(l.relation::regclass AS text), ',')"
                    "  FROM pg_locks AS l WHERE l.pid = a.pid AND l.locktype = 'tuple')"
                    " FROM pg_stat_activity AS a"
                    " WHERE a.application_name = ANY(%s) AND a.wait_event_type = 'Lock'",
                    [self.names],
                ).fetchall()
                self.samples += 1
                if rows:
                    self.waiting_samples += 1
                    self.waits.update(
                        f"{event} on a row of {table or '?'}: {query}"
                        for event, query, table in rows
                    )

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(5)
        return {
            "samples": self.samples,
            "share_waiting": round(self.waiting_samples / max(1, self.samples), 3),
            "waits": dict(self.waits.most_common(5)),
        }


def measure_drain(
    processes: Processes, env: dict, control, conn, conninfo: str, workers: int, window: float
):
    """Receipts per second of `workers` worker processes over `window` seconds after a
    warm-up; each worker's share of the attempts; the CPU; lock waits; each table's updates."""
    directories = []
    started = []
    for number in range(workers):
        directory = processes.workdir / f"metrics-{workers}-{number}"
        directory.mkdir(exist_ok=True)
        for stale in directory.iterdir():
            stale.unlink()
        directories.append(directory)
        started.append(
            processes.start(
                f"worker{workers}",
                [sys.executable, "-m", "flask", "--app", "app", "worker"],
                {**env, "PROMETHEUS_MULTIPROC_DIR": str(directory)},
            )
        )
    control.get("/_reset")
    deadline = time.monotonic() + 60
    while control.get("/_stats").json()["count"] == 0:
        if time.monotonic() > deadline:
            raise RuntimeError("no delivery arrived:\n" + processes.log_of(started[0]))
        time.sleep(0.1)
    time.sleep(WARMUP_SECONDS)
    tables = table_updates(conn)
    shares_before = [attempts_counted(d) for d in directories]
    cpu = Cpu([process.pid for process in started])
    locks = LockWaits(conninfo, [process.pid for process in started])
    first = control.get("/_stats").json()["count"]
    t0 = time.monotonic()
    time.sleep(window)
    last = control.get("/_stats").json()["count"]
    elapsed = time.monotonic() - t0
    cores = cpu.cores()
    lock_waits = locks.stop()
    shares = [
        attempts_counted(d) - before for d, before in zip(directories, shares_before, strict=True)
    ]
    after = table_updates(conn)
    stats = control.get("/_stats").json()
    for process in started:
        if process.poll() is not None:
            raise RuntimeError("a worker died:\n" + processes.log_of(process))
        processes.stop(process)
    rate = (last - first) / elapsed
    total = sum(shares) or 1
    updates = {
        table: [after[table][0] - tables[table][0], after[table][1] - tables[table][1]]
        for table in HOT_TABLES
    }
    log(
        f"{workers} worker(s): {rate:.0f}/s; shares {[round(s / total, 2) for s in shares]}; "
        f"cores {cores}; lock waits {lock_waits}; duplicates {stats['duplicates']}"
    )
    return {
        "per_s": round(rate, 1),
        "shares": [round(share / total, 3) for share in shares],
        "cores": cores,
        "lock_waits": lock_waits,
        "duplicates": stats["duplicates"],
        "deliveries": last - first,
        "updates": updates,
    }


def table_updates(conn) -> dict[str, tuple[int, int]]:
    """Per table of the delivery path: (updates, HOT updates) so far."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    rows = conn.execute(
        "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = ANY(%s)",
        [list(HOT_TABLES)],
    ).fetchall()
    found = {name: (updates, hot) for name, updates, hot in rows}
    return {table: found.get(table, (0, 0)) for table in HOT_TABLES}


def hot_summary(drains: dict) -> dict:
    """Per table, over every drain: updates per delivery and the share that were HOT."""
    deliveries = sum(d["deliveries"] for d in drains.values()) or 1
    summary = {}
    for table in HOT_TABLES:
        updates = sum(d["updates"][table][0] for d in drains.values())
        hot = sum(d["updates"][table][1] for d in drains.values())
        summary[table] = {
            "updates_per_delivery": round(updates / deliveries, 3),
            "hot_share": round(hot / updates, 3) if updates else None,
        }
    return summary


def limited_by(cores: dict) -> str:
    machine = os.cpu_count() or 1
    if cores["machine"] >= 0.85 * machine:
        who = "postgresql" if cores["postgresql"] >= cores["workers"] else "the workers"
        return f"cpu ({cores['machine']} of {machine} cores busy; {who} use most)"
    return f"neither cpu nor postgresql saturated ({cores['machine']} of {machine} cores busy)"


def storage(conn) -> dict:
    """Bytes per pending delivery, freshly seeded: its delivery row and its queue row, each with
    its indexes (and, for a delivered one, its attempt)."""
    sizes = {}
    for table in ("webhook_deliveries", "webhook_delivery_queue"):
        rows, heap, indexes = conn.execute(
            f"SELECT (SELECT count(*) FROM {table}), pg_relation_size('{table}'),"
            f" pg_indexes_size('{table}')"
        ).fetchone()
        sizes[table] = (heap / max(1, rows), indexes / max(1, rows))
    deliveries, queue = sizes["webhook_deliveries"], sizes["webhook_delivery_queue"]
    return {
        "pending_delivery_bytes": round(sum(deliveries) + sum(queue)),
        "delivery_heap_bytes": round(deliveries[0]),
        "delivery_index_bytes": round(deliveries[1]),
        "queue_heap_bytes": round(queue[0]),
        "queue_index_bytes": round(queue[1]),
        "id_length": conn.execute("SELECT max(length(id)) FROM webhook_deliveries").fetchone()[0],
    }


def attempt_bytes(conn) -> int:
    count, size = conn.execute(
        "SELECT count(*), pg_total_relation_size('webhook_attempts') FROM webhook_attempts"
    ).fetchone()
    return round(size / count) if count else 0


def measure_reads(app, key: str, tries: int) -> dict:
    client = app.test_client()
    base = f"/api/v1/brand/{LOG_BRAND}/webhook/fetch-deliveries"

    def timed(query: dict) -> tuple[float, dict]:
        """The median milliseconds of the query, and its answer's meta."""
        samples = []
        for _ in range(tries + 1):
            started = time.perf_counter()
            answer = client.get(base, query_string=query, headers={"X-Api-Key": key})
            samples.append((time.perf_counter() - started) * 1000)
            if answer.status_code != 200 or not answer.get_json()["data"]["deliveries"]:
                raise RuntimeError(f"{query}: {answer.status_code} {answer.get_data()[:300]}")
        return round(statistics.median(samples[1:]), 2), answer.get_json()["meta"]

    figures = {}
    for name, query, deep_page in (
        ("endpoint", {"endpointId": log_endpoint(3), "limit": 100}, 500),
        ("failed_endpoint", {"endpointId": log_endpoint(3), "status": "failed", "limit": 100}, 5),
    ):
        first, _ = timed({**query, "page": 1})
        # Asked for by number: totalPages stops counting at COUNT_LIMIT rows (services/
        # pagination.py), so it is not the deepest page there is. A smaller --log-rows has
        # fewer pages: the deepest there is then, by totalPages.
        try:
            deep, meta = timed({**query, "page": deep_page})
        except RuntimeError:
            _, meta = timed({**query, "page": 1})
            deep, meta = timed({**query, "page": meta["totalPages"]})
        figures[name] = {
            "page_1_ms": first,
            "deep_page_ms": deep,
            "page_reached": meta["page"],
            "ratio": round(deep / first, 2),
        }
    return figures


def drain_by_sql(conn, rows: int, batch: int = 5_000) -> float:
    """`rows` queued deliveries (oldest id first, so every endpoint's queue shrinks alike, as
    the walk drains it) delivered as the engine writes it: the queue row deleted and a lease
    inserted (the claim), then the lease deleted and the delivery updated (the record), a
    transaction each per batch. Seconds it took."""
    started = time.monotonic()
    done = 0
    while done < rows:
        taken = conn.execute(
            """
            WITH q AS (
                DELETE FROM webhook_delivery_queue WHERE delivery_id IN (
                    SELECT delivery_id FROM webhook_delivery_queue ORDER BY delivery_id
                    LIMIT %(batch)s)
                RETURNING delivery_id, endpoint_id, attempt_count
            ), l AS (
                INSERT INTO webhook_delivery_leases (delivery_id, endpoint_id, token,
                                                     leased_until, attempt_count)
                SELECT delivery_id, endpoint_id, 'benchsql', now() + interval '18 seconds',
                       attempt_count FROM q
                RETURNING 1
            )
            SELECT count(*) FROM l
            """,
            {"batch": min(batch, rows - done)},
        ).fetchone()[0]
        conn.execute(
            """
            WITH l AS (DELETE FROM webhook_delivery_leases WHERE token = 'benchsql'
                       RETURNING delivery_id)
            UPDATE webhook_deliveries AS d
            SET status = 'delivered', delivered_at = now(), attempt_count = 1, http_status = 200,
                next_attempt_at = NULL
            FROM l WHERE d.id = l.delivery_id
            """
        )
        if not taken:
            break
        done += taken
    return time.monotonic() - started


def measure_after_drain(app, conn, conninfo: str, args, fresh: dict) -> dict:
    """The claim after a large drain: at once, and once autovacuum has been (if it is on)."""
    autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]
    queued = conn.execute("SELECT count(*) FROM webhook_delivery_queue").fetchone()[0]
    rows = min(args.drain, max(0, queued - args.keep))
    took = drain_by_sql(conn, rows)
    drained_at = conn.execute("SELECT now()").fetchone()[0]
    log(f"drained {rows} by SQL in {took:.0f}s; autovacuum {autovacuum}")
    result: dict = {
        "autovacuum": autovacuum,
        "drained": rows,
        "left_queued": queued - rows,
        "fresh_claim_ms": fresh["ms"],
        "fresh_buffers": fresh["buffers"],
    }
    at_once = measure_claim(app, conninfo, args.claims)
    result["at_once"] = {**at_once, "ratio": round(at_once["ms"] / fresh["ms"], 2)}
    log(f"claim after the drain, at once: {result['at_once']}")
    if autovacuum == "on":
        deadline = time.monotonic() + 90
        visited = False
        while time.monotonic() < deadline and not visited:
            time.sleep(2)
            visited = conn.execute(
                "SELECT count(*) = 2 FROM pg_stat_user_tables WHERE relname IN"
                " ('webhook_delivery_queue', 'webhook_delivery_leases')"
                " AND last_autovacuum > %s",
                [drained_at],
            ).fetchone()[0]
        waited = round(time.monotonic() - deadline + 90)
        later = measure_claim(app, conninfo, args.claims)
        result["after_autovacuum"] = {
            **later,
            "ratio": round(later["ms"] / fresh["ms"], 2),
            "autovacuum_visited": visited,
            "waited_s": waited,
        }
        log(f"claim after the drain, after autovacuum: {result['after_autovacuum']}")
    return result


def measure_periodic(app) -> dict:
    """What each statement a worker or a scrape runs on a timer costs now."""
    from sqlalchemy import text

    from extensions import db
    from services.delivery import backlog, bulk, loop

    statements = {
        "secrets_sweep": (
            "UPDATE webhook_endpoints SET previous_secret_ciphertext = NULL,"
            " previous_secret_expires_at = NULL WHERE previous_secret_expires_at <= now()",
            {},
        ),
        "metrics_backlog": (backlog._BACKLOG.text, {"cap": backlog.COUNT_EXACT_UP_TO}),
        "metrics_forget_loops": (backlog._FORGET_LOOPS.text, {}),
        "metrics_loop_ages": (backlog._LOOP_AGES.text, {}),
        "bulk_next_job": (bulk._NEXT_JOB.text, {}),
        "bulk_forget_finished": (bulk._FORGET_FINISHED.text, {}),
        "heartbeat": (
            loop._HEARTBEAT.text,
            {"id": "benchloop", "hostname": "bench", "pid": 1, "oldest_due_at": None},
        ),
    }
    figures = {}
    with app.app_context():
        for name, (sql, params) in statements.items():
            plan = db.session.execute(
                text("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql), params
            ).scalar_one()
            db.session.rollback()
            figures[name] = {
                "ms": round(plan[0]["Execution Time"], 2),
                "buffers": _buffers(plan[0]["Plan"]),
            }
        db.session.remove()
    return figures


def run(args, workdir: Path, processes: Processes) -> dict:
    import psycopg
    from flask_migrate import upgrade

    from app import create_app
    from extensions import db
    from services.api_keys import create_api_key
    from services.secret_box import secret_box

    if args.private_postgres:
        from tests.private_servers import PrivatePostgres, PrivateRedis

        postgres, redis_server = PrivatePostgres(), PrivateRedis()
        database_url, redis_url = postgres.url, redis_server.url

        def close() -> None:
            redis_server.close()
            postgres.close()
    else:
        from tests.backends import open_backends

        backends = open_backends()
        database_url, redis_url = backends.database_url, backends.redis_url
        close = backends.close
    result: dict = {"pending": args.pending, "claim": {}, "drain": {}}
    try:
        env = {**app_settings(database_url, redis_url), "LOG_FORMAT": "text"}
        child_env = child_environ(env)
        receiver_url = start_receiver(processes)
        control = Control(receiver_url)
        app = create_app(env)
        with app.app_context():
            upgrade()
            secret = secret_box().encrypt("whsec_" + base64.b64encode(b"k" * 32).decode())
        conninfo = database_url.replace("postgresql+psycopg://", "postgresql://", 1)
        body = json.dumps({"id": "evt_s", "type": EVENT_NAME, "data": {"n": 1}})
        with psycopg.connect(conninfo, autocommit=True) as conn:
            result["server"] = {
                "version": conn.execute("SHOW server_version").fetchone()[0],
                "autovacuum": conn.execute("SHOW autovacuum").fetchone()[0],
            }
            for endpoints in args.endpoints:
                params = {
                    "brands": -(-endpoints // ENDPOINTS_PER_BRAND),
                    "per_brand": ENDPOINTS_PER_BRAND,
                    "endpoints": endpoints,
                    "pending": args.pending,
                    "url": f"{receiver_url}/hooks",
                    "secret": secret,
                    "body": body,
                }
                took = seed(conn, SEED_SQL, params)
                log(f"seeded {args.pending} pending over {endpoints} endpoints in {took:.0f}s")
                if "storage" not in result:
                    result["storage"] = storage(conn)
                    log(f"storage: {result['storage']}")
                claim = measure_claim(app, conninfo, args.claims)
                log(f"claim at {endpoints} endpoints: {claim}")
                result["claim"][str(endpoints)] = claim
                if endpoints in (100, 10_000):
                    for workers in (1, 2) if endpoints == 100 else (1, 2, 4):
                        result["drain"][f"{workers}_workers_{endpoints}_endpoints"] = measure_drain(
                            processes, child_env, control, conn, conninfo, workers, args.window
                        )
                if endpoints == 10_000:
                    result["storage"]["attempt_bytes"] = attempt_bytes(conn)
                    if args.drain:
                        result["after_drain"] = measure_after_drain(
                            app, conn, conninfo, args, claim
                        )
            result["periodic"] = measure_periodic(app)
            log(f"periodic statements at {args.endpoints[-1]} endpoints: {result['periodic']}")
            result["hot"] = hot_summary(result["drain"]) if result["drain"] else {}
            if args.log_rows:
                took = seed(
                    conn,
                    SEED_SQL[:1] + LOG_SQL,
                    {
                        "url": f"{receiver_url}/hooks",
                        "secret": secret,
                        "body": body,
                        "rows": args.log_rows,
                    },
                )
                log(f"seeded a delivery log of {args.log_rows} rows in {took:.0f}s")
        if args.log_rows:
            with app.app_context():
                key = create_api_key(
                    brand_id=LOG_BRAND, name="bench", scopes=("read",), created_by="bench"
                ).secret
                db.session.commit()
                result["reads"] = measure_reads(app, key, 15)
                db.engine.dispose()
        with app.app_context():
            db.engine.dispose()
    finally:
        processes.stop_all()
        close()
    for drain in result["drain"].values():
        del drain["updates"]  # summed in "hot"
    claims = result["claim"]
    if "100" in claims and "100000" in claims:
        result["claim_ratio_100k_to_100"] = round(claims["100000"]["ms"] / claims["100"]["ms"], 2)
    drains = result["drain"]
    if "1_workers_100_endpoints" in drains and "1_workers_10000_endpoints" in drains:
        result["drain_ratio_100_to_10k"] = round(
            drains["1_workers_100_endpoints"]["per_s"]
            / drains["1_workers_10000_endpoints"]["per_s"],
            2,
        )
    busiest = max(
        (d for key, d in drains.items() if key.endswith("10000_endpoints")),
        key=lambda d: d["per_s"],
        default=None,
    )
    if busiest is not None:
        result["limited_by"] = limited_by(busiest["cores"])
    result["targets"] = targets(result)
    return result


def targets(result: dict) -> dict:
    """Each target of bench/README.md: met (true/false), or None where this run did not
    measure it."""
    drains = result["drain"]
    two = [d for key, d in drains.items() if key.startswith("2_workers")]
    after = result.get("after_drain", {})
    worst_after = max(
        (after[k]["ratio"] for k in ("at_once", "after_autovacuum") if k in after), default=None
    )
    final_after = after.get("after_autovacuum", after.get("at_once"))
    hot = result.get("hot", {})
    return {
        "claim_100k_within_2x_100": (
            result["claim_ratio_100k_to_100"] <= 2 if "claim_ratio_100k_to_100" in result else None
        ),
        "drain_100_within_1_25x_10k": (
            result["drain_ratio_100_to_10k"] <= 1.25 if "drain_ratio_100_to_10k" in result else None
        ),
        "two_workers_share_0_4_to_0_6": (
            all(0.4 <= s <= 0.6 for d in two for s in d["shares"]) if two else None
        ),
        "no_lock_waits": (
            all(d["lock_waits"]["share_waiting"] == 0 for d in drains.values()) if drains else None
        ),
        "updates_per_delivery_hot": (
            all(
                t["updates_per_delivery"] < 0.05 or (t["hot_share"] or 0) >= 0.95
                for t in hot.values()
            )
            if hot
            else None
        ),
        "pending_delivery_at_most_700_bytes": result["storage"]["pending_delivery_bytes"] <= 700,
        "claim_after_drain_within_1_25x": (
            final_after["ratio"] <= 1.25 if final_after is not None else None
        ),
        "claim_after_drain_worst_ratio": worst_after,
        "reads_deep_within_2x": (
            all(r["ratio"] <= 2 for r in result["reads"].values()) if "reads" in result else None
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument(
        "--endpoints", type=lambda v: [int(n) for n in v.split(",")], default=[100, 10_000, 100_000]
    )
    parser.add_argument("--claims", type=int, default=15, help="claims timed per count")
    parser.add_argument("--window", type=float, default=15.0, help="seconds each drain is timed")
    parser.add_argument(
        "--drain", type=int, default=1_000_000, help="rows drained by SQL at 10,000 endpoints"
    )
    parser.add_argument("--keep", type=int, default=50_000, help="rows left queued by --drain")
    parser.add_argument("--log-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--private-postgres",
        action="store_true",
        help="an embedded PostgreSQL of the bench's own (autovacuum on)",
    )
    parser.add_argument("--logs", help="keep the processes' logs in this directory")
    args = parser.parse_args()
    run_benchmark(
        "bench-scale-", lambda workdir, processes: run(args, workdir, processes), args.logs
    )


if __name__ == "__main__":
    main()
