"""The delivery log with a million deliveries in one brand, on PostgreSQL.

Builds 1,000,000 deliveries for one brand (5 endpoints, 4 event names, 1% failed, 0.1% pending,
one a second going back 11.6 days, each with its attempt; plus 100,000 of another brand) in a
database of its own, then times fetch-deliveries through the app (authentication, query parsing,
the page and its bounded count, the envelope) for each filter, and an endpoint's health of the
last 24 hours (the stats route, and fetch-endpoints with every endpoint's figures: 17,280
attempts per endpoint in the window), against a ceiling measured in the same run: the two
statements of the newest-first page (the count bounded at 10,001 rows and SELECT … ORDER BY …
LIMIT 20) sent as plain SQL on a raw psycopg connection, with no app around them. Ends with one
JSON line: {"median_ms": {case: ms}, "ceiling_ms": ..., "ratio": ceiling / newest first}

    .venv/bin/python -m bench.delivery_log
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BRAND_TEST_BACKENDS", "services")

from bench.common import median_ms, migrated_app_on_postgresql  # noqa: E402

ROWS = 1_000_000
CASES = {
    "newest first": "",
    "oldest first": "sortOrder=asc",
    "status=failed": "status=failed",
    "status=pending": "status=pending",
    "eventName": "eventName=escrow.held",
    "endpointId": "endpointId=whe_bench3",
    "status+endpointId": "status=failed&endpointId=whe_bench2",
    "page 400": "page=400",
    "limit 100": "limit=100",
}

SEED_SQL = [
    "INSERT INTO brands VALUES ('brd_bench','Bench','growth','verified',now(),now(),now()),"
    " ('brd_other','Other','growth','verified',now(),now(),now())",
    "INSERT INTO webhook_endpoints (id, brand_id, url, events, secret_ciphertext,"
    " consecutive_failures, created_at, updated_at)"
    " SELECT 'whe_bench' || i, 'brd_bench', 'https://hooks.example.com', '[]', 'x', 0, now(),"
    " now() FROM generate_series(1, 5) i",
    "INSERT INTO webhook_endpoints (id, brand_id, url, events, secret_ciphertext,"
    " consecutive_failures, created_at, updated_at) VALUES ('whe_other', 'brd_other',"
    " 'https://hooks.example.com', '[]', 'x', 0, now(), now())",
    "INSERT INTO webhook_events (id, brand_id, name, body, created_at)"
    " VALUES ('evt_bench', 'brd_bench', 'deal.completed', '{}', now())",
    f"INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name, status,"
    f" http_status, attempt_count, created_at, next_attempt_at)"
    f" SELECT 'whd_' || lpad(i::text, 10, '0'), 'brd_bench', 'whe_bench' || (i % 5 + 1),"
    f" 'evt_bench', (ARRAY['deal.completed', 'conversion.recorded', 'escrow.held',"
    f" 'placement.verified'])[i % 4 + 1],"
    f" CASE WHEN i % 100 = 0 THEN 'failed' WHEN i % 1000 = 1 THEN 'pending' ELSE 'delivered' END,"
    f" 200, 1, now() - (i || ' seconds')::interval,"
    f" CASE WHEN i % 1000 = 1 THEN now() + interval '1 hour' END"
    f" FROM generate_series(1, {ROWS}) i",
    "INSERT INTO webhook_deliveries (id, brand_id, endpoint_id, event_id, event_name, status,"
    " attempt_count, created_at) SELECT 'whd_o' || i, 'brd_other', 'whe_other', 'evt_bench',"
    " 'deal.completed', 'delivered', 1, now() - (i || ' seconds')::interval"
    " FROM generate_series(1, 100000) i",
    "INSERT INTO webhook_attempts (delivery_id, endpoint_id, attempt_number, requested_at,"
    " duration_ms, http_status, error, request_headers)"
    " SELECT id, endpoint_id, 1, created_at, (random() * 400)::int,"
    " CASE WHEN status = 'failed' THEN 500 ELSE 200 END,"
    " CASE WHEN status = 'failed' THEN 'HTTP 500' END, '{}'"
    " FROM webhook_deliveries WHERE status <> 'pending'",
]
# An endpoint's health of the last 24 hours (CONTRACT 8.4), through the app.
HEALTH_CASES = {
    "stats": "/api/v1/brand/brd_bench/webhook/whe_bench3/stats",
    "fetch-endpoints": "/api/v1/brand/brd_bench/webhook/fetch-endpoints",
}
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
    import psycopg

    from extensions import db
    from services.api_keys import create_api_key

    with migrated_app_on_postgresql("bench-log-") as (app, dsn):
        with psycopg.connect(dsn, autocommit=True) as connection:
            started = time.perf_counter()
            for statement in SEED_SQL:
                connection.execute(statement)
            connection.execute("VACUUM ANALYZE webhook_deliveries")
            connection.execute("VACUUM ANALYZE webhook_attempts")
            print(f"seeded in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        with app.app_context():
            key = create_api_key(
                brand_id="brd_bench", name="bench", scopes=("read",), created_by="bench"
            ).secret
            db.session.commit()
        client = app.test_client()
        url = "/api/v1/brand/brd_bench/webhook/fetch-deliveries?"

        def fetch(query: str):
            response = client.get(url + query, headers={"X-Api-Key": key})
            assert response.status_code == 200, response.get_json()

        results = {name: median_ms(lambda q=query: fetch(q)) for name, query in CASES.items()}

        def fetch_path(path: str):
            response = client.get(path, headers={"X-Api-Key": key})
            assert response.status_code == 200, response.get_json()

        for name, path in HEALTH_CASES.items():
            results[name] = median_ms(lambda p=path: fetch_path(p))
        with psycopg.connect(dsn) as connection:

            def bare_page():
                connection.execute(CEILING_COUNT_SQL).fetchone()
                connection.execute(CEILING_PAGE_SQL).fetchall()

            ceiling = median_ms(bare_page)
        for name, value in results.items():
            print(f"{name:>20}: {value:6.2f} ms", file=sys.stderr)
        print(f"{'ceiling (raw SQL)':>20}: {ceiling:6.2f} ms", file=sys.stderr)
        print(
            json.dumps(
                {
                    "median_ms": results,
                    "ceiling_ms": ceiling,
                    "ratio": round(ceiling / results["newest first"], 3),
                }
            )
        )


if __name__ == "__main__":
    main()
