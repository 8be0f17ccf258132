"""Scale-out benchmark (issue 35): what a claim costs as endpoints grow, one worker's drain rate
as endpoints grow, what more workers add, what a delivery costs on disk, and how a deep page of
the delivery log compares with the first, side by side in one run (see bench/README.md).

Run from the repository root:  .venv/bin/python -m bench.scale

The real schema is seeded with generate_series (brands of 20 endpoints, one event per brand,
`--pending` deliveries spread evenly over the endpoints, each queued and due, every endpoint
ready), once per endpoint count:

1. claim: `claim_attempts(slots=64)` on the real code, in a transaction rolled back after each
   try (so each sees the same backlog): the median time of `--claims` tries, and the buffers
   (shared hit + read) its two statements touch, from EXPLAIN (ANALYZE, BUFFERS), at 100,
   10,000 and 100,000 endpoints. Target: 100,000 endpoints within 2 times 100.
2. drain: `flask --app app worker` processes against an asyncio receiver that answers 200 at
   once (bench/deliveries.py's), over the seeded backlog: receipts per second over `--window`
   seconds after a warm-up. One worker at 100 and at 10,000 endpoints (target: within 1.25
   times); 1, 2 and 4 workers at 10,000 (each with its own metrics directory, so each one's
   attempts are counted: every worker must send). While they run, the CPU of the machine, of
   PostgreSQL's processes and of the workers is read from /proc, and `limited_by` says what
   bounds the rate: the CPU (naming who uses most of it) or neither.
3. storage: bytes per delivery of webhook_deliveries (heap and indexes) and, for a delivered
   one, with its attempt and its share of events; the HOT share of the deliveries' updates
   during the drains (pg_stat_user_tables).
4. reads: one brand with `--log-rows` delivered deliveries over 10 endpoints (1% failed):
   fetch-deliveries page 1 and page 500 (`limit=100`, `endpointId`), through the app (the Flask
   test client: no HTTP server in the figure), median of 15. Target: within 2 times.

It prints progress on stderr and ends with one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BRAND_TEST_BACKENDS", "services")

from services.delivery_attempts import LEASE_SLACK  # noqa: E402

from bench.common import (  # noqa: E402
    Processes,
    app_settings,
    child_environ,
    log,
    run_benchmark,
)
from bench.deliveries import Control, start_receiver  # noqa: E402

# The lease a worker with the default WEBHOOK_TIMEOUT (10 s) takes.
LEASE = timedelta(seconds=10) + LEASE_SLACK

ENDPOINTS_PER_BRAND = 20
CLAIM_SLOTS = 64
WARMUP_SECONDS = 3.0
EVENT_NAME = "conversion.recorded"

SEED_SQL = [
    "TRUNCATE webhook_delivery_leases, webhook_delivery_queue, webhook_attempts,"
    " webhook_deliveries, webhook_events, webhook_event_subjects, webhook_endpoints,"
    " webhook_delivery_loops, brands CASCADE",
    """
    INSERT INTO brands (id, name, plan, kyb_status, subscription_period_start,
                        subscription_period_end, created_at)
    SELECT 'brd_s' || b, 'Scale ' || b, 'growth', 'verified', now(), now() + interval '30 days',
           now()
    FROM generate_series(0, %(brands)s - 1) AS b
    """,
    """
    INSERT INTO webhook_endpoints (id, brand_id, url, events, secret_ciphertext,
        consecutive_failures, created_at, updated_at, ready_at, ordering)
    SELECT 'whe_s' || e, 'brd_s' || (e / %(per_brand)s), %(url)s,
           '["conversion.recorded"]', %(secret)s, 0, now(), now(), now(), 'none'
    FROM generate_series(0, %(endpoints)s - 1) AS e
    """,
    """
    INSERT INTO webhook_events (id, brand_id, name, body, created_at, subject_type, subject_id,
                                sequence)
    SELECT 'evt_s' || b, 'brd_s' || b, 'conversion.recorded', %(body)s, now(), 'conversion',
           'conv_s' || b, 1
    FROM generate_series(0, %(brands)s - 1) AS b
    """,
    """
    INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name, status,
        attempt_count, next_attempt_at, created_at)
    SELECT 'whd_s' || lpad(i::text, 9, '0'), 'brd_s' || ((i %% %(endpoints)s) / %(per_brand)s),
           'whe_s' || (i %% %(endpoints)s), 'evt_s' || ((i %% %(endpoints)s) / %(per_brand)s),
           'conversion.recorded', 'pending', 0, now(),
           now() - interval '1 hour' + i * interval '1 millisecond'
    FROM generate_series(0, %(pending)s - 1) AS i
    """,
    """
    INSERT INTO webhook_delivery_queue (delivery_id, endpoint_id, next_attempt_at, attempt_count)
    SELECT id, endpoint_id, created_at, 0 FROM webhook_deliveries
    """,
    "ANALYZE",
]

# One brand's delivery log for the read figures: delivered, 1% failed (all on whe_log3, which
# the failed-filter reads ask for), over 10 endpoints.
LOG_SQL = [
    """
    INSERT INTO brands (id, name, plan, kyb_status, subscription_period_start,
                        subscription_period_end, created_at)
    VALUES ('brd_log', 'Log', 'growth', 'verified', now(), now() + interval '30 days', now())
    """,
    """
    INSERT INTO webhook_endpoints (id, brand_id, url, events, secret_ciphertext,
        consecutive_failures, created_at, updated_at, ordering)
    SELECT 'whe_log' || e, 'brd_log', %(url)s, '["conversion.recorded"]', %(secret)s, 0,
           now(), now(), 'none'
    FROM generate_series(0, 9) AS e
    """,
    """
    INSERT INTO webhook_events (id, brand_id, name, body, created_at, subject_type, subject_id,
                                sequence)
    VALUES ('evt_log', 'brd_log', 'conversion.recorded', %(body)s, now(), 'conversion',
            'conv_log', 1)
    """,
    """
    INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name, status,
        http_status, attempt_count, delivered_at, failed_at, last_error, created_at)
    SELECT 'whd_log' || lpad(i::text, 9, '0'), 'brd_log', 'whe_log' || (i %% 10), 'evt_log',
           'conversion.recorded',
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
    started = time.monotonic()
    for statement in sql:
        conn.execute(statement, params)
    return time.monotonic() - started


def measure_claim(app, conninfo: str, tries: int) -> dict:
    """The claim's median time and its statements' buffers, each try rolled back."""
    import psycopg
    from services.delivery_attempts import _LOCK_READY, _TAKE_DUE, ORDERED_LOOK_AHEAD
    from services.delivery_attempts import claim_attempts as claim
    from services.delivery_queue import PROBING_AFTER_FAILURES

    from extensions import db

    samples = []
    claimed = 0
    with app.app_context():
        for _ in range(tries + 1):
            started = time.perf_counter()
            got = claim(slots=CLAIM_SLOTS, endpoint_limit=2, token="bench000", lease=LEASE)  # noqa: S106 - a lease token
            samples.append((time.perf_counter() - started) * 1000)
            claimed = len(got.attempts)
            db.session.rollback()
        db.session.remove()
    params = {
        "now": None,
        "slots": CLAIM_SLOTS,
        "max_endpoints": CLAIM_SLOTS,
        "endpoint_limit": 2,
        "probing_after": PROBING_AFTER_FAILURES,
        "lease_seconds": LEASE.total_seconds(),
        "token": "bench000",
        "held": [],
        "look_ahead": ORDERED_LOOK_AHEAD,
    }
    buffers = 0
    with psycopg.connect(conninfo) as conn:
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _LOCK_READY, params)
        top = plan.fetchone()[0][0]["Plan"]
        buffers += top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
        ids = [row[0] for row in conn.execute(_LOCK_READY, params)]
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _TAKE_DUE, {**params, "endpoint_ids": ids}
        )
        top = plan.fetchone()[0][0]["Plan"]
        buffers += top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
        conn.rollback()
    return {
        "ms": round(statistics.median(samples[1:]), 2),
        "buffers": buffers,
        "claimed": claimed,
    }


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


def measure_drain(processes: Processes, env: dict, control, conn, workers: int, window: float):
    """Receipts per second of `workers` worker processes over `window` seconds after a
    warm-up; each worker's share of the attempts; the CPU; the HOT share of the updates."""
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
    table = _deliveries_stats(conn)
    shares_before = [attempts_counted(d) for d in directories]
    cpu = Cpu([process.pid for process in started])
    first = control.get("/_stats").json()["count"]
    t0 = time.monotonic()
    time.sleep(window)
    last = control.get("/_stats").json()["count"]
    elapsed = time.monotonic() - t0
    cores = cpu.cores()
    shares = [
        attempts_counted(d) - before for d, before in zip(directories, shares_before, strict=True)
    ]
    after = _deliveries_stats(conn)
    stats = control.get("/_stats").json()
    for process in started:
        if process.poll() is not None:
            raise RuntimeError("a worker died:\n" + processes.log_of(process))
        processes.stop(process)
    rate = (last - first) / elapsed
    total = sum(shares) or 1
    updates = after[0] - table[0]
    hot = after[1] - table[1]
    log(
        f"{workers} worker(s): {rate:.0f}/s; shares {[round(s / total, 2) for s in shares]}; "
        f"cores {cores}; duplicates {stats['duplicates']}"
    )
    return {
        "per_s": round(rate, 1),
        "shares": [round(share / total, 3) for share in shares],
        "cores": cores,
        "duplicates": stats["duplicates"],
        "updates": updates,
        "hot_updates": hot,
    }


def _deliveries_stats(conn) -> tuple[int, int]:
    conn.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
        " WHERE relname = 'webhook_deliveries'"
    ).fetchone()
    return row[0], row[1]


def limited_by(cores: dict) -> str:
    machine = os.cpu_count() or 1
    if cores["machine"] >= 0.85 * machine:
        who = "postgresql" if cores["postgresql"] >= cores["workers"] else "the workers"
        return f"cpu ({cores['machine']} of {machine} cores busy; {who} use most)"
    return f"neither cpu nor postgresql saturated ({cores['machine']} of {machine} cores busy)"


def storage(conn) -> dict:
    rows = conn.execute("SELECT count(*) FROM webhook_deliveries").fetchone()[0] or 1
    heap, indexes = conn.execute(
        "SELECT pg_relation_size('webhook_deliveries'), pg_indexes_size('webhook_deliveries')"
    ).fetchone()
    attempts = conn.execute(
        "SELECT count(*), pg_total_relation_size('webhook_attempts') FROM webhook_attempts"
    ).fetchone()
    per_attempt = attempts[1] / attempts[0] if attempts[0] else 0
    return {
        "delivery_bytes": round((heap + indexes) / rows),
        "delivery_heap_bytes": round(heap / rows),
        "delivery_index_bytes": round(indexes / rows),
        "attempt_bytes": round(per_attempt),
    }


def measure_reads(app, key: str, tries: int) -> dict:
    client = app.test_client()
    base = "/api/v1/brand/brd_log/webhook/fetch-deliveries"

    def timed(query: dict) -> tuple[float, int]:
        """The median milliseconds of the query, and its total of pages."""
        samples = []
        for _ in range(tries + 1):
            started = time.perf_counter()
            answer = client.get(base, query_string=query, headers={"X-Api-Key": key})
            samples.append((time.perf_counter() - started) * 1000)
            if answer.status_code != 200 or not answer.get_json()["data"]["deliveries"]:
                raise RuntimeError(f"{query}: {answer.status_code} {answer.get_data()[:300]}")
        return round(statistics.median(samples[1:]), 2), answer.get_json()["meta"]["totalPages"]

    figures = {}
    for name, query in {
        "endpoint": {"endpointId": "whe_log3", "limit": 100},
        "failed_endpoint": {"endpointId": "whe_log3", "status": "failed", "limit": 100},
    }.items():
        first, pages = timed({**query, "page": 1})
        # A smaller --log-rows has fewer pages: its last one is the deepest there is.
        deep_page = min(500 if name == "endpoint" else 5, pages)
        deep, _ = timed({**query, "page": deep_page})
        figures[name] = {
            "page_1_ms": first,
            f"page_{deep_page}_ms": deep,
            "ratio": round(deep / first, 2),
        }
    return figures


def run(args, workdir: Path, processes: Processes) -> dict:
    import psycopg
    from flask_migrate import upgrade

    from app import create_app
    from extensions import db
    from services.api_keys import create_api_key
    from services.secret_box import secret_box
    from tests.backends import open_backends

    backends = open_backends()
    result: dict = {"pending": args.pending, "claim": {}, "drain": {}}
    try:
        env = {**app_settings(backends.database_url, backends.redis_url), "LOG_FORMAT": "text"}
        child_env = child_environ(env)
        receiver_url = start_receiver(processes)
        control = Control(receiver_url)
        app = create_app(env)
        with app.app_context():
            upgrade()
            secret = secret_box().encrypt("whsec_" + base64.b64encode(b"k" * 32).decode())
        conninfo = backends.database_url.replace("postgresql+psycopg://", "postgresql://", 1)
        body = json.dumps({"id": "evt_s", "type": EVENT_NAME, "data": {"n": 1}})
        with psycopg.connect(conninfo, autocommit=True) as conn:
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
                claim = measure_claim(app, conninfo, args.claims)
                log(f"claim at {endpoints} endpoints: {claim}")
                result["claim"][str(endpoints)] = claim
                if endpoints in (100, 10_000):
                    one = measure_drain(processes, child_env, control, conn, 1, args.window)
                    result["drain"][f"1_worker_{endpoints}_endpoints"] = one
                if endpoints == 10_000:
                    for workers in (2, 4):
                        many = measure_drain(
                            processes, child_env, control, conn, workers, args.window
                        )
                        result["drain"][f"{workers}_workers_{endpoints}_endpoints"] = many
                    result["storage"] = storage(conn)
            updates = sum(d["updates"] for d in result["drain"].values())
            hot = sum(d["hot_updates"] for d in result["drain"].values())
            result.setdefault("storage", {})["hot_share"] = (
                round(hot / updates, 3) if updates else None
            )
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
        with app.app_context():
            key = create_api_key(
                brand_id="brd_log", name="bench", scopes=("read",), created_by="bench"
            ).secret
            db.session.commit()
            result["reads"] = measure_reads(app, key, 15)
            db.engine.dispose()
    finally:
        processes.stop_all()
        backends.close()
    claims = result["claim"]
    if "100" in claims and "100000" in claims:
        result["claim_ratio_100k_to_100"] = round(claims["100000"]["ms"] / claims["100"]["ms"], 2)
    drains = result["drain"]
    if "1_worker_100_endpoints" in drains and "1_worker_10000_endpoints" in drains:
        result["drain_ratio_100_to_10k"] = round(
            drains["1_worker_100_endpoints"]["per_s"] / drains["1_worker_10000_endpoints"]["per_s"],
            2,
        )
    busiest = max(
        (d for key, d in drains.items() if key.endswith("10000_endpoints")),
        key=lambda d: d["per_s"],
        default=None,
    )
    if busiest is not None:
        result["limited_by"] = limited_by(busiest["cores"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument(
        "--endpoints", type=lambda v: [int(n) for n in v.split(",")], default=[100, 10_000, 100_000]
    )
    parser.add_argument("--claims", type=int, default=15, help="claims timed per count")
    parser.add_argument("--window", type=float, default=15.0, help="seconds each drain is timed")
    parser.add_argument("--log-rows", type=int, default=1_000_000)
    parser.add_argument("--logs", help="keep the processes' logs in this directory")
    args = parser.parse_args()
    run_benchmark(
        "bench-scale-", lambda workdir, processes: run(args, workdir, processes), args.logs
    )


if __name__ == "__main__":
    main()
