"""The delivery log with a million deliveries in one brand, on PostgreSQL.

Builds, in a database of its own and in the real schema, 1,000,000 deliveries for one brand (5
endpoints, one a second going back 11.6 days; 200,000 events of 4 names, each delivered to the
5 endpoints; 0.1% pending, in the delivery queue or leased, two in five of them retrying;
failed: a third of the deliveries of endpoint 5, which was often down, and 1% of the others,
75,934 in all; each settled or retrying delivery with its attempt), 100,000 deliveries of
another brand (10% pending: queue rows of its own), and a small brand (5 endpoints, 1,000
deliveries in the last day). Then it times, through the app (authentication, query parsing,
the page and its bounded count, the envelope):

- fetch-deliveries for each filter, page 1 of 20 (`CASES`);
- deep pages against page 1, 100 a page (`DEEP_PAGES`): the whole log, `endpointId` (both
  orders), `status=failed&endpointId` and `status=delivered` at page 500, the same page read
  with `after` (the cursor of page 499's `meta.nextAfter`), and the whole log's page 5,000;
  `deep_ratio` is each over its page 1, target 2 at page 500;
- an endpoint's health of the last 24 hours (the stats route, and fetch-endpoints with every
  endpoint's figures: 17,280 attempts per endpoint in the window) for the big brand and the
  small one; `health_ratio` is big over small;

each the median of 25 after a warm-up; the cases compared (a page 1 and its deep pages, the
two brands' health) are timed in turns, so that a spell of load slows them alike. All against
a ceiling measured in the same run: the two statements of the newest-first page (the
count bounded at 10,001 rows and SELECT … ORDER BY … LIMIT 20) sent as plain SQL on a raw
psycopg connection, with no app around them. `--explain` prints each case's statements' plans
(EXPLAIN (ANALYZE, BUFFERS)). Ends with one JSON line:
{"median_ms": {case: ms}, "ceiling_ms": ..., "ratio": ceiling / newest first,
 "deep_ratio": {case: ms / page 1 ms}, "health_ratio": {case: big / small}}

    .venv/bin/python -m bench.delivery_log [--explain]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BRAND_TEST_BACKENDS", "services")

from bench.common import (  # noqa: E402
    interleaved_medians_ms,
    median_ms,
    migrated_app_on_postgresql,
)

ROWS = 1_000_000
OTHER_ROWS = 100_000
SMALL_ROWS = 1_000
BRAND = "/api/v1/brand/brd_bench/webhook"
LOG = f"{BRAND}/fetch-deliveries?"
CASES = {
    "newest first": "",
    "oldest first": "sortOrder=asc",
    "status=failed": "status=failed",
    "status=pending": "status=pending",
    "status=pending asc": "status=pending&sortOrder=asc",
    "retrying=true": "retrying=true",
    "status=delivered": "status=delivered",
    "eventName": "eventName=escrow.held",
    "eventId": "eventId=evt_0000100000",
    "endpointId": "endpointId=whe_bench3",
    "status=failed&endpointId": "status=failed&endpointId=whe_bench5",
    "status=failed&endpointId (none failed)": "status=failed&endpointId=whe_bench2",
    "page 400": "page=400",
    "limit 100": "limit=100",
}
# Page 1 and page 500 of 100 (and page 500 through `after`) of these lists.
DEEP_PAGES = {
    "log": "limit=100",
    "endpointId": "endpointId=whe_bench3&limit=100",
    "status=failed&endpointId": "status=failed&endpointId=whe_bench5&limit=100",
    "endpointId asc": "endpointId=whe_bench3&sortOrder=asc&limit=100",
    # No index of its own (most of the log matches): the walk reads each row's status.
    "status=delivered": "status=delivered&limit=100",
}
DEEP_PAGE = 500
# How a page's cost grows with depth: the whole log's page 5,000 of 100 (500,000 rows deep).
DEEPEST_PAGE = 5000
# An endpoint's health of the last 24 hours (CONTRACT 8.4), through the app.
HEALTH_CASES = {
    "stats": "/api/v1/brand/{brand}/webhook/{brand_endpoint}3/stats",
    "fetch-endpoints": "/api/v1/brand/{brand}/webhook/fetch-endpoints",
}
HEALTH_BRANDS = {"": ("brd_bench", "whe_bench"), "small brand: ": ("brd_small", "whe_small")}
NAMES = "(ARRAY['deal.completed', 'conversion.recorded', 'escrow.held', 'placement.verified'])"

SEED_SQL = [
    "INSERT INTO brands VALUES ('brd_bench','Bench','growth','verified',now(),now(),now()),"
    " ('brd_other','Other','growth','verified',now(),now(),now()),"
    " ('brd_small','Small','growth','verified',now(),now(),now())",
    "INSERT INTO webhook_endpoints (id, brand_id, url, events, secret_ciphertext,"
    " consecutive_failures, created_at, updated_at)"
    " SELECT prefix || i, brand, 'https://hooks.example.com', '[]', 'x', 0, now(), now()"
    " FROM generate_series(1, 5) i,"
    " (VALUES ('whe_bench', 'brd_bench'), ('whe_small', 'brd_small')) AS b(prefix, brand)",
    "INSERT INTO webhook_endpoints (id, brand_id, url, events, secret_ciphertext,"
    " consecutive_failures, created_at, updated_at) VALUES ('whe_other', 'brd_other',"
    " 'https://hooks.example.com', '[]', 'x', 0, now(), now())",
    # An event every 5 seconds, each delivered to the 5 endpoints (its deliveries are made
    # with it or just after).
    f"INSERT INTO webhook_events (id, brand_id, name, body, created_at, subject_type,"
    f" subject_id, sequence)"
    f" SELECT 'evt_' || lpad(j::text, 10, '0'), 'brd_bench', {NAMES}[j % 4 + 1], '{{}}',"
    f" now() - (j * 5 || ' seconds')::interval, 'event', 'evt_' || lpad(j::text, 10, '0'), 1"
    f" FROM generate_series(1, {ROWS // 5}) j",
    f"INSERT INTO webhook_events (id, brand_id, name, body, created_at, subject_type,"
    f" subject_id, sequence)"
    f" SELECT 'evt_o' || j, brand, 'deal.completed', '{{}}',"
    f" now() - (j || ' seconds')::interval, 'event', 'evt_o' || j, 1"
    f" FROM generate_series(1, {OTHER_ROWS}) j, (VALUES ('brd_other')) AS b(brand)"
    f" UNION ALL SELECT 'evt_s' || j, 'brd_small', 'deal.completed', '{{}}',"
    f" now() - (j * 86 || ' seconds')::interval, 'event', 'evt_s' || j, 1"
    f" FROM generate_series(1, {SMALL_ROWS}) j",
    # Delivery i: endpoint i % 5 + 1, event (i + 4) / 5; pending: 0.1% (the even ones
    # retrying); failed: a third of endpoint 5's (i % 5 = 4), 1% of the others'.
    f"""
    INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name, status,
        http_status, attempt_count, last_error, delivered_at, next_attempt_at, failed_at,
        created_at)
    SELECT 'whd_' || lpad(i::text, 10, '0'), 'brd_bench', 'whe_bench' || (i % 5 + 1),
        'evt_' || lpad(((i + 4) / 5)::text, 10, '0'), {NAMES}[(i + 4) / 5 % 4 + 1], status,
        CASE status WHEN 'delivered' THEN 200 WHEN 'failed' THEN 500
                    ELSE CASE WHEN retrying THEN 503 END END,
        CASE WHEN status <> 'pending' OR retrying THEN 1 ELSE 0 END,
        CASE WHEN status = 'failed' OR retrying THEN 'HTTP 5xx' END,
        CASE WHEN status = 'delivered' THEN created_at END,
        CASE WHEN status = 'pending' THEN now() + interval '1 hour' END,
        CASE WHEN status = 'failed' THEN created_at + interval '1 minute' END,
        created_at
    FROM (
        SELECT i, now() - (i || ' seconds')::interval AS created_at, i % 2 = 0 AS retrying,
            CASE WHEN i / 5 % 1000 = 1 THEN 'pending'
                 WHEN (i % 5 = 4 AND i / 5 % 3 = 0) OR i / 5 % 100 = 0 THEN 'failed'
                 ELSE 'delivered' END AS status
        FROM generate_series(1, {ROWS}) i
    ) AS seeded
    """,
    f"INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name, status,"
    f" attempt_count, next_attempt_at, delivered_at, created_at)"
    f" SELECT 'whd_o' || i, 'brd_other', 'whe_other', 'evt_o' || i, 'deal.completed',"
    f" CASE WHEN i % 10 = 0 THEN 'pending' ELSE 'delivered' END,"
    f" CASE WHEN i % 10 = 0 THEN 0 ELSE 1 END,"
    f" CASE WHEN i % 10 = 0 THEN now() END,"
    f" CASE WHEN i % 10 <> 0 THEN now() - (i || ' seconds')::interval END,"
    f" now() - (i || ' seconds')::interval FROM generate_series(1, {OTHER_ROWS}) i",
    f"INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name, status,"
    f" http_status, attempt_count, delivered_at, created_at)"
    f" SELECT 'whd_s' || i, 'brd_small', 'whe_small' || (i % 5 + 1), 'evt_s' || i,"
    f" 'deal.completed', 'delivered', 200, 1, now() - (i * 86 || ' seconds')::interval,"
    f" now() - (i * 86 || ' seconds')::interval FROM generate_series(1, {SMALL_ROWS}) i",
    # Pending work: a fifth of the big brand's on the wire, the rest queued.
    "INSERT INTO webhook_delivery_leases (delivery_id, endpoint_id, token, leased_until,"
    " attempt_count) SELECT id, endpoint_id, 'bench', now() + interval '1 minute',"
    " attempt_count FROM webhook_deliveries"
    " WHERE status = 'pending' AND brand_id = 'brd_bench' AND right(id, 1) = '5'",
    "INSERT INTO webhook_delivery_queue (delivery_id, endpoint_id, next_attempt_at,"
    " attempt_count) SELECT id, endpoint_id, next_attempt_at, attempt_count"
    " FROM webhook_deliveries AS d WHERE status = 'pending'"
    " AND NOT EXISTS (SELECT FROM webhook_delivery_leases AS l WHERE l.delivery_id = d.id)",
    "INSERT INTO webhook_attempts (delivery_id, endpoint_id, attempt_number, requested_at,"
    " duration_ms, http_status, error, request_headers)"
    " SELECT id, endpoint_id, 1, created_at, (random() * 400)::int,"
    " CASE WHEN last_error IS NULL THEN 200 ELSE 500 END, last_error, '{}'"
    " FROM webhook_deliveries WHERE attempt_count > 0",
]
CEILING_COUNT_SQL = (
    "SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries WHERE brand_id = 'brd_bench'"
    " LIMIT 10001) AS bounded"
)
CEILING_PAGE_SQL = (
    "SELECT id, endpoint_id, event_id, event_name, status, http_status, attempt_count,"
    " last_error, delivered_at, next_attempt_at, created_at FROM webhook_deliveries"
    " WHERE brand_id = 'brd_bench' ORDER BY created_at DESC, id DESC LIMIT 20"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--explain", action="store_true", help="print each case's plans on stderr")
    explain = parser.parse_args().explain

    import psycopg
    from sqlalchemy import event, text

    from extensions import db
    from services.api_keys import create_api_key

    with migrated_app_on_postgresql("bench-log-") as (app, dsn):
        with psycopg.connect(dsn, autocommit=True) as connection:
            started = time.perf_counter()
            for statement in SEED_SQL:
                connection.execute(statement)
            for table in (
                "webhook_deliveries",
                "webhook_attempts",
                "webhook_events",
                "webhook_delivery_queue",
                "webhook_delivery_leases",
                "webhook_endpoint_hours",
            ):
                connection.execute(f"VACUUM ANALYZE {table}")
            print(f"seeded in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        keys = {}
        with app.app_context():
            for brand in ("brd_bench", "brd_small"):
                keys[brand] = create_api_key(
                    brand_id=brand, name="bench", scopes=("read",), created_by="bench"
                ).secret
            db.session.commit()
        client = app.test_client()

        def get(path: str, brand: str = "brd_bench") -> dict:
            response = client.get(path, headers={"X-Api-Key": keys[brand]})
            assert response.status_code == 200, response.get_json()
            return response.get_json()

        if explain:
            _explain_every_statement(app, db, event, text)

        results = {}
        for name, query in CASES.items():
            results[name] = median_ms(lambda q=query, n=name: _explained(n, get, LOG + q))
        deep_ratio = {}
        for name, query in DEEP_PAGES.items():
            first = f"{name} page 1"
            deep = f"{name} page {DEEP_PAGE}"
            cursor = f"{name} after (page {DEEP_PAGE})"
            after = get(f"{LOG}{query}&page={DEEP_PAGE - 1}")["meta"]["nextAfter"]
            by_page = get(f"{LOG}{query}&page={DEEP_PAGE}")["data"]["deliveries"]
            by_cursor = get(f"{LOG}{query}&after={after}")["data"]["deliveries"]
            assert len(by_page) == 100 and by_page == by_cursor, name
            urls = {
                first: f"{LOG}{query}",
                deep: f"{LOG}{query}&page={DEEP_PAGE}",
                cursor: f"{LOG}{query}&after={after}",
            }
            if name == "log":
                deepest = f"log page {DEEPEST_PAGE}"
                urls[deepest] = f"{LOG}{query}&page={DEEPEST_PAGE}"
            results |= interleaved_medians_ms(
                {case: lambda u=url, c=case: _explained(c, get, u) for case, url in urls.items()}
            )
            for case in urls:
                if case != first:
                    deep_ratio[case] = round(results[case] / results[first], 2)
        health_ratio = {}
        for name, path in HEALTH_CASES.items():
            runs = {}
            for label, (brand, endpoint_prefix) in HEALTH_BRANDS.items():
                url = path.format(brand=brand, brand_endpoint=endpoint_prefix)
                runs[label + name] = lambda u=url, b=brand, c=label + name: _explained(c, get, u, b)
            results |= interleaved_medians_ms(runs)
            health_ratio[name] = round(results[name] / results["small brand: " + name], 2)
        with psycopg.connect(dsn) as connection:

            def bare_page():
                connection.execute(CEILING_COUNT_SQL).fetchone()
                connection.execute(CEILING_PAGE_SQL).fetchall()

            ceiling = median_ms(bare_page)
        for name, value in results.items():
            print(f"{name:>44}: {value:7.2f} ms", file=sys.stderr)
        print(f"{'ceiling (raw SQL)':>44}: {ceiling:7.2f} ms", file=sys.stderr)
        print(
            json.dumps(
                {
                    "median_ms": results,
                    "ceiling_ms": ceiling,
                    "ratio": round(ceiling / results["newest first"], 3),
                    "deep_ratio": deep_ratio,
                    "health_ratio": health_ratio,
                }
            )
        )


# With --explain: the case whose statements are being explained, and those already explained.
_explaining: dict = {"case": None, "done": set()}


def _explained(case: str, get, *args):
    """`get(*args)`, and with --explain, each statement it runs explained the first time."""
    _explaining["case"] = case if case not in _explaining["done"] else None
    try:
        return get(*args)
    finally:
        _explaining["done"].add(case)
        _explaining["case"] = None


def _explain_every_statement(app, db, event, text) -> None:
    """Print EXPLAIN (ANALYZE, BUFFERS) of every SELECT the case being explained runs."""
    with app.app_context():
        engine = db.engine

    @event.listens_for(engine, "before_cursor_execute")
    def explain(connection, cursor, statement, parameters, context, executemany):
        case = _explaining["case"]
        if case is None or not statement.lstrip().upper().startswith(("SELECT", "WITH")):
            return
        if "api_keys" in statement or "FROM brands" in statement:
            return  # authentication: the same in every case
        plan = connection.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters
        ).scalars()
        print(f"--- {case}\n" + "\n".join(plan), file=sys.stderr)


if __name__ == "__main__":
    main()
