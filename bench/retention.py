"""Retention benchmark: deleting a day of a million expired deliveries while postbacks run at half
load against a real server, and what it does to the postbacks' p99 (see bench/README.md).

Run from the repository root:  .venv/bin/python -m bench.retention

1. Set-up as bench/postbacks.py (`make_data`: a brand, a read key, a campaign with a tracked link,
   one endpoint subscribed to `conversion.recorded`), then `--rows` (1,000,000) deliveries to
   that endpoint created over one day, 31 to 30 days ago (one day past the default
   WEBHOOK_RETENTION_DAYS), each with its own event and its attempts (1% failed after 8
   attempts, the rest delivered at the first), loaded by INSERT ... SELECT generate_series.
2. The load: bench/postbacks.py's ceiling server measured once with wrk; half its rate is the
   rate of every open-loop run below (`half_load_rate_per_s`), as in bench/postbacks.py.
3. Postbacks alone: an open-loop run of the app (bench/postbacks.py's client, latency from the
   scheduled send) before the purge and one after it (`p99_ms_without`: the higher of the two).
4. The purge: `services.retention.delete_expired_deliveries`, the function a worker's purge
   thread runs, on a connection of this process, while open-loop runs of postbacks follow one
   another until it ends. `p99_ms_during` is the median p99 of the runs that ended before the
   purge did (all of them when it outlasted none). Each transaction of the purge is timed
   (`longest_transaction_ms`: the longest any of its row locks was held), and pg_stat_activity
   is sampled every 50 ms for any session of its database waiting on a lock
   (`longest_lock_wait_ms`).
5. Checks: every old delivery, attempt and event deleted; every postback's conversion, event
   and delivery kept; every answer 201.

Stdout gets one JSON line: {"deleted": {...}, "deliveries_per_s": ..., "p99_ms_without": ...,
"p99_ms_during": ..., "ratio": p99 without / p99 during, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BRAND_TEST_BACKENDS", "services")

from bench.common import (  # noqa: E402
    Processes,
    log,
    migrated_app_on_postgresql,
    percentile,
    run_benchmark,
    start_gunicorn,
)
from bench.postbacks import (  # noqa: E402
    GUNICORN_OPTIONS,
    WRK_SCRIPT,
    child_environment,
    find_wrk,
    logged_errors,
    make_data,
    measure_throughput,
    run_open_loop,
    smoke_test,
)

ROWS = 1_000_000
TARGET_P99_MS = 30.0
LOCK_SAMPLE_SECONDS = 0.05

# A conversion.recorded body and the headers of an attempt, about the size of real ones.
EVENT_BODY = json.dumps(
    {
        "id": "evt_01jd3kw3x5y7z9a1b3c5d7e9f1",
        "type": "conversion.recorded",
        "createdAt": "2026-10-26T08:15:00.000Z",
        "brandId": "brd_01jd3kw3x5y7z9a1b3c5d7e9f1",
        "apiVersion": "1",
        "data": {
            "id": "conv_01jd3kw3x5y7z9a1b3c5d7e9f1",
            "idempotencyKey": "order-20931-purchase",
            "eventType": "purchase",
            "clickId": "clk_01jd3kw3x5y7z9a1b3c5d7e9f1",
            "linkCode": "BENCH25",
            "linkId": "lnk_01jd3kw3x5y7z9a1b3c5d7e9f1",
            "campaignId": "cmp_01jd3kw3x5y7z9a1b3c5d7e9f1",
            "dealId": None,
            "valueMinor": 1250,
            "currency": "NGN",
            "metadata": {"orderId": "ORD-20931"},
            "attributed": True,
            "createdAt": "2026-10-26T08:15:00.000Z",
        },
    }
)
ATTEMPT_HEADERS = json.dumps(
    {
        "Content-Type": "application/json",
        "User-Agent": "BrandAPI-Webhooks/1",
        "X-Service-Timestamp": "1761466500",
        "X-Service-Signature": "sha256=" + "5f1c" * 16,
        "X-Service-Event": "conversion.recorded",
        "X-Service-Delivery": "whd_01jd3kt0v2w4x6y8z0a2b4c6d8",
        "webhook-id": "whd_01jd3kt0v2w4x6y8z0a2b4c6d8",
        "webhook-timestamp": "1761466500",
        "webhook-signature": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
    }
)

# One day of deliveries, 31 to 30 days old; ids and times in creation order.
LOAD_SQL = [
    """
    INSERT INTO webhook_events (id, brand_id, name, body, created_at, subject_type, subject_id,
                                sequence)
    SELECT 'evt_old' || lpad(i::text, 8, '0'), %(brand)s, 'conversion.recorded', %(body)s,
           now() - interval '31 days' + i * (interval '1 day' / %(rows)s),
           'conversion', 'conv_old' || lpad(i::text, 8, '0'), 1
    FROM generate_series(0, %(rows)s - 1) AS i
    """,
    """
    INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name, status,
        http_status, attempt_count, last_error, delivered_at, failed_at, created_at)
    SELECT 'whd_old' || substr(id, 8), brand_id, %(endpoint)s, id, name,
           CASE WHEN failed THEN 'failed' ELSE 'delivered' END,
           CASE WHEN failed THEN 500 ELSE 200 END,
           CASE WHEN failed THEN 8 ELSE 1 END,
           CASE WHEN failed THEN 'HTTP 500' END,
           CASE WHEN failed THEN NULL ELSE created_at + interval '40 ms' END,
           CASE WHEN failed THEN created_at + interval '27 hours' END,
           created_at
    FROM (SELECT *, substr(id, 8)::int %% 100 = 0 AS failed FROM webhook_events
          WHERE id LIKE 'evt_old%%') AS event
    """,
    """
    INSERT INTO webhook_attempts (delivery_id, endpoint_id, attempt_number, requested_at,
        duration_ms, http_status, error, response_body, request_headers)
    SELECT d.id, d.endpoint_id, n, d.created_at + (n - 1) * interval '1 hour', 40,
           d.http_status, d.last_error, 'ok', %(headers)s
    FROM webhook_deliveries AS d, generate_series(1, d.attempt_count) AS n
    WHERE d.id LIKE 'whd_old%%'
    """,
]
# Deliveries the purge keeps (created over the last 29 days): the rest of a large table, so
# that the purge and the postbacks run against `--kept-rows` more rows (issue 35: 10M in all).
KEPT_SQL = [
    statement.replace("evt_old", "evt_new")
    .replace("whd_old", "whd_new")
    .replace("'conv_old'", "'conv_new'")
    .replace(
        "now() - interval '31 days' + i * (interval '1 day' / %(rows)s)",
        "now() - interval '29 days' + i * (interval '29 days' / %(rows)s)",
    )
    for statement in LOAD_SQL
]
COUNT_OLD_SQL = """
    SELECT (SELECT count(*) FROM webhook_deliveries WHERE id LIKE 'whd_old%%'),
           (SELECT count(*) FROM webhook_attempts WHERE delivery_id LIKE 'whd_old%%'),
           (SELECT count(*) FROM webhook_events WHERE id LIKE 'evt_old%%')
"""
LOCK_WAIT_SQL = """
    SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start)), 0)
    FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()
"""


def load_old_deliveries(conninfo: str, data: dict, rows: int, kept: int = 0) -> dict:
    import psycopg

    started = time.perf_counter()
    params = {
        "brand": data["brand_id"],
        "endpoint": data["endpoint_id"],
        "rows": rows,
        "body": EVENT_BODY,
        "headers": ATTEMPT_HEADERS,
    }
    with psycopg.connect(conninfo, autocommit=True) as connection:
        if kept:
            for statement in KEPT_SQL:
                connection.execute(statement, {**params, "rows": kept})
            log(
                f"loaded {kept} deliveries the purge keeps in {time.perf_counter() - started:.0f} s"
            )
        for statement in LOAD_SQL:
            connection.execute(statement, params)
        for table in ("webhook_events", "webhook_deliveries", "webhook_attempts"):
            connection.execute(f"VACUUM ANALYZE {table}")
        deliveries, attempts, events = connection.execute(COUNT_OLD_SQL).fetchone()
    log(
        f"loaded {deliveries} deliveries, {attempts} attempts and {events} events created "
        f"31 to 30 days ago in {time.perf_counter() - started:.0f} s"
    )
    return {"deliveries": deliveries, "attempts": attempts, "events": events}


class LockWatch:
    """Samples pg_stat_activity for sessions waiting on a lock, until stopped."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.longest_s = 0.0
        self.samples_waiting = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LockWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.conninfo, autocommit=True) as connection:
            while not self._stop.wait(LOCK_SAMPLE_SECONDS):
                [waited] = connection.execute(LOCK_WAIT_SQL).fetchone()
                self.samples += 1
                self.samples_waiting += waited > 0
                self.longest_s = max(self.longest_s, float(waited))


def run_purge(app, batch_size: int, rest_ratio: float, outcome: dict) -> None:
    """The worker's purge, on a connection of this process, each transaction timed."""
    from sqlalchemy import event

    from extensions import db
    from models.columns import utcnow
    from services.retention import delete_expired_deliveries, retention_period

    durations: list[float] = []
    began: list[float] = []

    def on_begin(connection) -> None:
        began.append(time.perf_counter())

    def on_end(connection) -> None:
        if began:
            durations.append((time.perf_counter() - began.pop()) * 1000)

    with app.app_context(), db.engine.connect() as connection:
        # A transaction begins implicitly at a statement outside one (the advisory lock, the
        # brand list) or explicitly (each batch); both are timed to their end.
        event.listen(connection, "begin", on_begin)
        event.listen(connection, "commit", on_end)
        event.listen(connection, "rollback", on_end)
        started = time.perf_counter()
        purged = delete_expired_deliveries(
            connection,
            now=utcnow(),
            retention=retention_period(),
            batch_size=batch_size,
            rest_ratio=rest_ratio,
        )
        outcome["seconds"] = time.perf_counter() - started
    outcome["purged"] = purged
    outcome["transaction_ms"] = durations


def explain_batch(app, brand_id: str, batch_size: int) -> None:
    """The plan of one batch's statement, on stderr: it must walk the brand's index."""
    from sqlalchemy import text

    from extensions import db
    from models.columns import utcnow
    from services.retention import _DELETE_DELIVERIES

    with app.app_context():
        plan = db.session.execute(
            text("EXPLAIN " + _DELETE_DELIVERIES.text),
            {
                "brand_id": brand_id,
                "cutoff": utcnow(),
                "after_created_at": utcnow().replace(year=1970),
                "after_id": "",
                "batch_size": batch_size,
            },
        ).scalars()
        log("plan of one deliveries batch:\n    " + "\n    ".join(plan))
        db.session.rollback()


def check(conninfo: str, runs: list[dict], kept: int = 0) -> list[str]:
    import psycopg

    problems = []
    with psycopg.connect(conninfo) as connection:
        left = connection.execute(COUNT_OLD_SQL).fetchone()
        conversions, events, deliveries = connection.execute(
            "SELECT (SELECT count(*) FROM conversions),"
            " (SELECT count(*) FROM webhook_events WHERE name = 'conversion.recorded'"
            "  AND id NOT LIKE 'evt_new%'),"
            " (SELECT count(*) FROM webhook_deliveries WHERE id NOT LIKE 'whd_new%')"
        ).fetchone()
        still_kept = connection.execute(
            "SELECT count(*) FROM webhook_deliveries WHERE id LIKE 'whd_new%'"
        ).fetchone()[0]
    if any(left):
        problems.append(f"old rows left (deliveries, attempts, events): {left}")
    if still_kept != kept:
        problems.append(f"{kept - still_kept} of the {kept} recent deliveries were deleted")
    if not conversions == events == deliveries:
        problems.append(
            f"postbacks' rows not all kept: {conversions} conversions, {events} events, "
            f"{deliveries} deliveries"
        )
    for run in runs:
        if set(run["statuses"]) != {"201"}:
            problems.append(f"an open-loop run answered {run['statuses']}")
    return problems


def run(args, workdir: Path, processes: Processes) -> dict:
    from bench import postback_ceiling
    from extensions import db
    from scripts.run import gunicorn_control_socket_args

    wrk = find_wrk()
    script = workdir / "postback.lua"
    script.write_text(WRK_SCRIPT)
    options = [*GUNICORN_OPTIONS, "--graceful-timeout", "5", *gunicorn_control_socket_args()]
    args.run_id = "rt-" + secrets.token_hex(4)
    args.splits = {}

    with migrated_app_on_postgresql("bench-retention-") as (app, conninfo):
        try:
            data = make_data(app)
            args.api_key = data["api_key"]
            loaded = load_old_deliveries(conninfo, data, args.rows, args.kept_rows)
            explain_batch(app, data["brand_id"], args.batch_size)
            env = child_environment(app)
            postback_ceiling.create_table(env["DATABASE_URL"])
            with app.app_context():
                db.engine.dispose()
            path = f"/api/v1/brand/{data['brand_id']}/conversion/record-postback"
            ceiling_base, ceiling_server = start_gunicorn(
                processes, "ceiling", "bench.postback_ceiling:create_app()", env, options
            )
            smoke_test(f"{ceiling_base}{path}", data["api_key"], f"{args.run_id}-smoke-0-1")
            ceiling_rate = measure_throughput(
                wrk, script, ceiling_base, path, "ceiling", "c0", args, None
            )
            processes.stop(ceiling_server)
            half = args.latency_rate or round(ceiling_rate / 2)

            app_base, app_server = start_gunicorn(
                processes, "app", "app:create_app()", env, options
            )
            url = f"{app_base}{path}"
            smoke_test(url, data["api_key"], f"{args.run_id}-smoke-0-2")
            runs = []

            def open_loop(phase: str) -> dict:
                result = run_open_loop(url, half, args, f"{args.run_id}-{phase}")
                log(
                    f"{phase}: postbacks at {half}/s: p50 {result['p50_ms']} ms, p99 "
                    f"{result['p99_ms']} ms, max {result['max_ms']} ms; achieved "
                    f"{result['achieved_rate_per_s']}/s; split {result['split']}"
                )
                runs.append(result)
                return result

            before = open_loop("before")
            outcome: dict = {}
            purging = threading.Thread(
                target=run_purge, args=(app, args.batch_size, args.rest_ratio, outcome), daemon=True
            )
            log(
                f"purging {args.rows} deliveries, {args.batch_size} rows per transaction, "
                f"resting {args.rest_ratio} times each batch's duration after it"
            )
            during = []
            with LockWatch(conninfo) as locks:
                purging.start()
                round_ = 0
                while purging.is_alive():
                    round_ += 1
                    result = open_loop(f"during{round_}")
                    result["inside"] = purging.is_alive()
                    during.append(result)
                purging.join()
            if "purged" not in outcome:
                raise RuntimeError("the purge failed (see the traceback above)")
            after = open_loop("after")

            app_log = processes.log_path_of(app_server)
            processes.stop_all()
            problems = check(conninfo, runs, args.kept_rows)
            errors = logged_errors(app_log)
            if errors:
                problems.append(f"the app server logged {len(errors)} errors, first: {errors[0]}")
            if problems:
                raise RuntimeError("checks failed:\n  " + "\n  ".join(problems))
        finally:
            processes.stop_all()

    purged, seconds = outcome["purged"], outcome["seconds"]
    transactions = outcome["transaction_ms"]
    inside = [run for run in during if run["inside"]] or during
    if len(inside) < len(during) and not [run for run in during if run["inside"]]:
        log("WARNING: the purge ended before a whole open-loop run: p99 during is of one run")
    p99_during = sorted(run["p99_ms"] for run in inside)[len(inside) // 2]
    p99_without = max(before["p99_ms"], after["p99_ms"])
    deleted = {
        "deliveries": purged.deliveries,
        "attempts": purged.attempts,
        "events": purged.events,
    }
    if deleted != loaded:
        raise RuntimeError(f"deleted {deleted}, loaded {loaded}")
    verdict = "<" if p99_during < TARGET_P99_MS else "NOT <"
    log(f"target: p99 during the purge {p99_during} ms {verdict} {TARGET_P99_MS:g} ms")
    return {
        "deleted": deleted,
        "purge_seconds": round(seconds, 1),
        "deliveries_per_s": round(purged.deliveries / seconds),
        "rows_per_s": round(sum(deleted.values()) / seconds),
        "batch_size": args.batch_size,
        "rest_ratio": args.rest_ratio,
        "transactions": len(transactions),
        "largest_batch": purged.largest_batch,
        "transaction_p50_ms": round(statistics.median(transactions), 2),
        "transaction_p99_ms": round(percentile(transactions, 99), 2),
        "longest_transaction_ms": round(max(transactions), 2),
        "longest_lock_wait_ms": round(locks.longest_s * 1000, 1),
        "lock_wait_samples": f"{locks.samples_waiting}/{locks.samples}",
        "half_load_rate_per_s": half,
        "ceiling_per_s": round(ceiling_rate, 1),
        "p99_ms_without": p99_without,
        "p99_ms_during": p99_during,
        "ratio": round(p99_without / p99_during, 3),
        "p99_ms_runs": {
            "before": before["p99_ms"],
            "during": [run["p99_ms"] for run in during],
            "after": after["p99_ms"],
        },
        "p50_ms_runs": {
            "before": before["p50_ms"],
            "during": [run["p50_ms"] for run in during],
            "after": after["p50_ms"],
        },
        "achieved_rate_per_s_during": [run["achieved_rate_per_s"] for run in during],
        "runs_inside_purge": sum(1 for run in during if run["inside"]),
    }


def main() -> None:
    from services.retention import BATCH_SIZE, REST_RATIO

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=ROWS, help="expired deliveries to load")
    parser.add_argument(
        "--kept-rows", type=int, default=0, help="recent deliveries the purge keeps, loaded first"
    )
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="rows per transaction")
    parser.add_argument(
        "--rest-ratio",
        type=float,
        default=REST_RATIO,
        help="rest after each batch, as a multiple of its duration",
    )
    parser.add_argument("--duration", type=int, default=10, help="seconds of the ceiling's run")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of warm-up before each")
    parser.add_argument(
        "--latency-duration", type=int, default=10, help="seconds of each open-loop run"
    )
    parser.add_argument(
        "--latency-rate", type=int, default=0, help="open-loop rate (default: half the ceiling)"
    )
    parser.add_argument("--logs", metavar="DIR", help="keep the servers' logs in DIR")
    args = parser.parse_args()

    run_benchmark(
        "bench-retention-", lambda workdir, processes: run(args, workdir, processes), args.logs
    )


if __name__ == "__main__":
    main()
