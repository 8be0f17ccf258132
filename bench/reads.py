"""The brand's platform data read through the API, with a million placements, on PostgreSQL.

Builds, with plain SQL in a database of its own, one big brand (`brd_bench`: 200 campaigns,
5,000 deals in every status, 100,000 tracked links, 1,000,000 placements, 10,000 escrow holds,
created over the last month) and three others holding about 12% more rows beside it
(`brd_other` a tenth of its size; `brd_small` and `brd_old` a hundredth each, `brd_old`'s rows
all three to four weeks old), so that every ownership filter has rows to skip. Then it times
every read route through the app (authentication, query parsing, the page and its bounded
count, the envelope; Flask's test client, no HTTP), median of 25 after a warm-up: each list
unfiltered and with each of its filters, a deep page, `limit=100`, each get-by-id, the
workspace, and the placements of the other brands, first and 200th page (placements have no
brand id: a brand's are found through its campaigns, the case most at risk for a small brand).

The ceiling, measured in the same run: the two statements of brd_bench's first placements page
(the count bounded at 10,001 rows and SELECT ... ORDER BY ... LIMIT 20, joined to campaigns as
the app joins them) sent as plain SQL on a raw psycopg connection. Ends with one JSON line:
{"median_ms": {case: ms}, "ceiling_ms": ..., "ratio": ceiling / placements}

    .venv/bin/python -m bench.reads [--explain]

`--explain` prints EXPLAIN (ANALYZE, BUFFERS) of every SELECT that each case's request ran;
without it, only for cases whose median is over the 20 ms target.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BRAND_TEST_BACKENDS", "services")

from bench.common import median_ms, migrated_app_on_postgresql  # noqa: E402

TARGET_MS = 20.0
BENCH = "brd_bench"


@dataclass(frozen=True)
class BrandData:
    id: str
    tag: str  # one letter in every id and link code of the brand: ids stay unique
    campaigns: int
    deals: int
    links: int
    placements: int
    holds: int
    newest_days: int = 0  # the brand's placements were created between these two ages
    oldest_days: int = 30


BRANDS = (
    BrandData(BENCH, "b", 200, 5_000, 100_000, 1_000_000, 10_000),
    BrandData("brd_other", "o", 20, 500, 10_000, 100_000, 1_000),
    BrandData("brd_small", "s", 4, 40, 1_000, 10_000, 100),
    BrandData("brd_old", "x", 4, 40, 1_000, 10_000, 100, newest_days=21, oldest_days=30),
)

# A tenth of campaigns are drafts (no deals), most are active.
CAMPAIGN_STATUSES = ["active"] * 6 + ["paused", "completed", "cancelled", "draft"]
# Deals with work under way or done have links and placements; these and cancelled ones held
# escrow at some point.
WORK_STATUSES = ("accepted", "in_progress", "completed", "disputed")
DEAL_STATUSES = (*WORK_STATUSES, "offered", "declined", "expired", "cancelled")
HOLD_STATUSES = (*WORK_STATUSES, "cancelled")


def _array(values) -> str:
    return "ARRAY[" + ", ".join(f"'{value}'" for value in values) + "]"


def _in(values) -> str:
    return "(" + ", ".join(f"'{value}'" for value in values) + ")"


def _spread(position: str, oldest_days: float, newest_days: float) -> str:
    """A timestamp from `oldest_days` ago (position 0) to `newest_days` ago (position 1)."""
    return (
        f"(now() - interval '{oldest_days} days'"
        f" + ({position}) * interval '{oldest_days - newest_days} days')"
    )


def _numbered(table: str, columns: str, where: str) -> str:
    return f"SELECT {columns}, row_number() OVER (ORDER BY id) - 1 AS n FROM {table} WHERE {where}"


def seed_brand(connection, brand: BrandData) -> None:
    """Insert one brand's rows, oldest first within each table (as production inserts them)."""
    b, t = brand.id, brand.tag
    old, new = brand.oldest_days, brand.newest_days

    def count(sql: str) -> int:
        return connection.execute(sql).fetchone()[0]

    connection.execute(
        "INSERT INTO brands (id, name, plan, kyb_status, subscription_period_start,"
        " subscription_period_end, created_at) VALUES (%s, %s, 'growth', 'verified',"
        " date_trunc('month', now()), date_trunc('month', now()) + interval '1 month',"
        " now() - interval '90 days')",
        (b, f"Brand {b}"),
    )
    connection.execute(
        "INSERT INTO campaigns (id, brand_id, name, status, pricing_model, click_rate_minor,"
        " currency, budget_minor, spent_minor, committed_minor, starts_at, ends_at, published_at,"
        " completed_at, cancelled_at, created_at, updated_at)"
        f" SELECT id, '{b}', 'Campaign ' || i, status,"
        " CASE WHEN i % 4 = 0 THEN 'per_click' ELSE 'fixed_fee' END,"
        " CASE WHEN i % 4 = 0 THEN 2500 END, CASE WHEN i % 3 = 0 THEN 'USD' ELSE 'NGN' END,"
        " 500000000 + i * 100000, i * 1000000, i * 2000000, at, at + interval '60 days',"
        " CASE WHEN status <> 'draft' THEN at + interval '1 hour' END,"
        " CASE WHEN status = 'completed' THEN now() - interval '1 day' END,"
        " CASE WHEN status = 'cancelled' THEN now() - interval '2 days' END, at, at"
        f" FROM (SELECT i, 'cmp_{t}' || lpad(i::text, 6, '0') AS id,"
        f" ({_array(CAMPAIGN_STATUSES)})[i % {len(CAMPAIGN_STATUSES)} + 1] AS status,"
        f" {_spread(f'i::float8 / {brand.campaigns}', old + 14, old)} AS at"
        f" FROM generate_series(1, {brand.campaigns}) i) s"
    )
    live = count(f"SELECT count(*) FROM campaigns WHERE brand_id = '{b}' AND status <> 'draft'")
    live_campaigns = _numbered(
        "campaigns", "id, currency", f"brand_id = '{b}' AND status <> 'draft'"
    )
    # Deal i goes to live campaign (i - 1) % live; its status cycles within each campaign.
    connection.execute(
        f"WITH c AS ({live_campaigns})"
        " INSERT INTO deals (id, brand_id, campaign_id, creator_handle, status,"
        " agreed_amount_minor, currency, placements_required, escrow_held_minor,"
        " escrow_released_minor, escrow_refunded_minor, verified_placements, amount_due_minor,"
        " accepted_at, completed_at, created_at, updated_at)"
        f" SELECT id, '{b}', campaign_id, '@creator' || (i % 997), status, amount, currency,"
        " required,"
        " CASE WHEN status IN ('accepted', 'in_progress', 'disputed') THEN amount ELSE 0 END,"
        " CASE WHEN status = 'completed' THEN amount ELSE 0 END,"
        " CASE WHEN status = 'cancelled' THEN amount ELSE 0 END,"
        " CASE status WHEN 'completed' THEN required WHEN 'in_progress' THEN 1 ELSE 0 END,"
        " CASE WHEN status = 'completed' THEN amount ELSE 0 END,"
        f" CASE WHEN status IN {_in(HOLD_STATUSES)} THEN at + interval '1 day' END,"
        " CASE WHEN status = 'completed' THEN now() - interval '1 day' END, at, at"
        f" FROM (SELECT i, 'deal_{t}' || lpad(i::text, 7, '0') AS id, c.id AS campaign_id,"
        f" ({_array(DEAL_STATUSES)})[((i - 1) / {live}) % {len(DEAL_STATUSES)} + 1] AS status,"
        " CASE c.currency WHEN 'USD' THEN 50000 + (i % 20) * 5000"
        " ELSE 15000000 + (i % 20) * 1000000 END AS amount, c.currency, i % 4 + 1 AS required,"
        f" {_spread(f'i::float8 / {brand.deals}', old + 7, new)} AS at"
        f" FROM generate_series(1, {brand.deals}) i JOIN c ON c.n = (i - 1) % {live}) s"
    )
    working = count(
        f"SELECT count(*) FROM deals WHERE brand_id = '{b}' AND status IN {_in(WORK_STATUSES)}"
    )
    work_deals = _numbered(
        "deals", "id, campaign_id, currency", f"brand_id = '{b}' AND status IN {_in(WORK_STATUSES)}"
    )
    # A tenth of links are campaign-wide (no deal). Codes are global: the tag keeps them apart.
    connection.execute(
        f"WITH d AS ({work_deals})"
        " INSERT INTO tracked_links (id, brand_id, campaign_id, deal_id, code, short_url,"
        " destination_url, clicks, currency, last_clicked_at, created_at)"
        f" SELECT 'lnk_{t}' || lpad(i::text, 8, '0'), '{b}', d.campaign_id,"
        f" CASE WHEN i % 10 = 0 THEN NULL ELSE d.id END, '{t}' || i,"
        f" 'https://kola.link/{t}' || i, 'https://shop.example.com/p/' || (i % 500),"
        " (i * 37) % 3000, d.currency,"
        " CASE WHEN (i * 37) % 3000 > 0 THEN now() - ((i % 600) || ' minutes')::interval END,"
        f" {_spread(f'i::float8 / {brand.links}', old + 3, new)}"
        f" FROM generate_series(1, {brand.links}) i JOIN d ON d.n = (i - 1) % {working}"
    )
    # The counters of a link with conversions, spread over up to 8 slots as concurrent
    # postbacks leave them (models.tracked_link).
    connection.execute(
        "INSERT INTO tracked_link_conversion_counts"
        " (link_id, slot, conversions, conversion_value_minor)"
        f" SELECT 'lnk_{t}' || lpad(i::text, 8, '0'), slot, 1 + (i * 37) % 5,"
        " (1 + (i * 37) % 5) * 250000"
        f" FROM generate_series(1, {brand.links}) i, generate_series(0, (i * 37) % 8) slot"
        " WHERE (i * 37) % 40 > 0"
    )
    connection.execute(
        f"WITH d AS ({work_deals})"
        " INSERT INTO placements (id, campaign_id, deal_id, platform, post_url, clicks,"
        " verified_at, metrics_updated_at, created_at)"
        f" SELECT 'plc_{t}' || lpad(i::text, 9, '0'), d.campaign_id, d.id,"
        " (ARRAY['instagram', 'tiktok', 'youtube', 'x'])[i % 4 + 1],"
        f" 'https://posts.example.com/{t}' || i, (i * 37) % 20000,"
        " CASE WHEN i % 5 <> 0 THEN at + interval '2 hours' END,"
        " CASE WHEN i % 5 <> 0 THEN now() - interval '1 hour' END, at"
        f" FROM (SELECT i, {_spread(f'i::float8 / {brand.placements}', old, new)} AS at"
        f" FROM generate_series(1, {brand.placements}) i) s"
        f" JOIN d ON d.n = (i - 1) % {working}"
    )
    holding = count(
        f"SELECT count(*) FROM deals WHERE brand_id = '{b}' AND status IN {_in(HOLD_STATUSES)}"
    )
    hold_deals = _numbered(
        "deals",
        "id, campaign_id, currency, status, agreed_amount_minor",
        f"brand_id = '{b}' AND status IN {_in(HOLD_STATUSES)}",
    )
    connection.execute(
        f"WITH d AS ({hold_deals})"
        " INSERT INTO escrow_holds (id, brand_id, campaign_id, deal_id, amount_minor, currency,"
        " status, released_at, refunded_at, created_at)"
        f" SELECT id, '{b}', campaign_id, deal_id, amount, currency, status,"
        " CASE WHEN status = 'released' THEN at + interval '3 days' END,"
        " CASE WHEN status = 'refunded' THEN at + interval '3 days' END, at"
        f" FROM (SELECT i, 'esc_{t}' || lpad(i::text, 7, '0') AS id, d.campaign_id,"
        " d.id AS deal_id, d.agreed_amount_minor / 2 AS amount, d.currency,"
        " CASE d.status WHEN 'completed' THEN 'released' WHEN 'cancelled' THEN 'refunded'"
        " ELSE CASE WHEN i % 4 = 0 THEN 'released' ELSE 'held' END END AS status,"
        f" {_spread(f'i::float8 / {brand.holds}', old + 7, new)} AS at"
        f" FROM generate_series(1, {brand.holds}) i JOIN d ON d.n = (i - 1) % {holding}) s"
    )


# The bench brand's first placements page as the app sends it, as plain SQL: the ceiling.
CEILING_COUNT_SQL = (
    "SELECT count(*) FROM (SELECT 1 FROM placements JOIN campaigns"
    " ON campaigns.id = placements.campaign_id WHERE campaigns.brand_id = 'brd_bench'"
    " LIMIT 10001) AS bounded"
)
CEILING_PAGE_SQL = (
    "SELECT placements.id, placements.campaign_id, placements.deal_id, placements.platform,"
    " placements.post_url, placements.clicks, placements.verified_at,"
    " placements.metrics_updated_at, placements.created_at FROM placements JOIN campaigns"
    " ON campaigns.id = placements.campaign_id WHERE campaigns.brand_id = 'brd_bench'"
    " ORDER BY placements.created_at DESC, placements.id DESC LIMIT 20"
)

PICK_SQL = {
    # An in-progress deal of the bench brand with holds, links and placements, and its campaign.
    "deal": "SELECT id, campaign_id FROM deals d WHERE brand_id = 'brd_bench'"
    " AND status = 'in_progress'"
    " AND EXISTS (SELECT 1 FROM escrow_holds h WHERE h.deal_id = d.id)"
    " AND EXISTS (SELECT 1 FROM tracked_links l WHERE l.deal_id = d.id)"
    " AND EXISTS (SELECT 1 FROM placements p WHERE p.deal_id = d.id)"
    " ORDER BY id OFFSET 100 LIMIT 1",
    # Records from the middle of each table, for the get-by-id routes.
    "link": "SELECT id, code FROM tracked_links WHERE brand_id = 'brd_bench'"
    " ORDER BY id OFFSET 50000 LIMIT 1",
    "placement": "SELECT id FROM placements WHERE id LIKE 'plc_b%' ORDER BY id"
    " OFFSET 500000 LIMIT 1",
    "hold": "SELECT id FROM escrow_holds WHERE brand_id = 'brd_bench' ORDER BY id"
    " OFFSET 5000 LIMIT 1",
}

LIST_KEYS = {
    "campaigns": "campaigns",
    "deals": "deals",
    "tracked-link/fetch-links": "links",
    "placement/fetch-placements": "placements",
    "escrow/fetch-holds": "holds",
}


def build_cases(picked: dict) -> dict[str, tuple[str, str]]:
    """case name: (brand, path after /api/v1/brand/<brand>/ with its query)."""
    deal, campaign = picked["deal"]
    link, code = picked["link"]
    (placement,) = picked["placement"]
    (hold,) = picked["hold"]
    return {
        "campaigns": (BENCH, "campaigns"),
        "campaigns ?status": (BENCH, "campaigns?status=paused"),
        "deals": (BENCH, "deals"),
        "deals ?status": (BENCH, "deals?status=disputed"),
        "deals ?campaignId": (BENCH, f"deals?campaignId={campaign}"),
        "links": (BENCH, "tracked-link/fetch-links"),
        "links ?campaignId": (BENCH, f"tracked-link/fetch-links?campaignId={campaign}"),
        "links ?dealId": (BENCH, f"tracked-link/fetch-links?dealId={deal}"),
        "links ?code": (BENCH, f"tracked-link/fetch-links?code={code}"),
        "links page 200": (BENCH, "tracked-link/fetch-links?page=200"),
        "links limit 100": (BENCH, "tracked-link/fetch-links?limit=100"),
        "placements": (BENCH, "placement/fetch-placements"),
        "placements ?campaignId": (BENCH, f"placement/fetch-placements?campaignId={campaign}"),
        "placements ?dealId": (BENCH, f"placement/fetch-placements?dealId={deal}"),
        "placements page 200": (BENCH, "placement/fetch-placements?page=200"),
        "placements limit 100": (BENCH, "placement/fetch-placements?limit=100"),
        "holds": (BENCH, "escrow/fetch-holds"),
        "holds ?campaignId": (BENCH, f"escrow/fetch-holds?campaignId={campaign}"),
        "holds ?dealId": (BENCH, f"escrow/fetch-holds?dealId={deal}"),
        "holds ?status": (BENCH, "escrow/fetch-holds?status=refunded"),
        "campaign by id": (BENCH, f"campaigns/{campaign}"),
        "deal by id": (BENCH, f"deals/{deal}"),
        "link by id": (BENCH, f"tracked-link/{link}"),
        "placement by id": (BENCH, f"placement/{placement}"),
        "hold by id": (BENCH, f"escrow/{hold}"),
        "workspace": (BENCH, "workspace"),
        "small brand placements": ("brd_small", "placement/fetch-placements"),
        "small brand page 200": ("brd_small", "placement/fetch-placements?page=200"),
        "small brand links": ("brd_small", "tracked-link/fetch-links"),
        "old brand placements": ("brd_old", "placement/fetch-placements"),
        "other brand page 200": ("brd_other", "placement/fetch-placements?page=200"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--explain", action="store_true", help="EXPLAIN every case's SELECTs")
    options = parser.parse_args()

    import psycopg
    from sqlalchemy import event

    from extensions import db
    from services.api_keys import create_api_key

    with migrated_app_on_postgresql("bench-reads-") as (app, dsn):
        # One access line per request would bury the table (Alembic's logging config prints
        # each twice); the medians leave out writing them.
        logging.getLogger("brand_api.access").setLevel(logging.WARNING)
        with psycopg.connect(dsn, autocommit=True) as connection:
            started = time.perf_counter()
            for brand in BRANDS:
                seed_brand(connection, brand)
            connection.execute("VACUUM ANALYZE")
            print(f"seeded in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            picked = {name: connection.execute(sql).fetchone() for name, sql in PICK_SQL.items()}
        cases = build_cases(picked)
        with app.app_context():
            keys = {
                brand: create_api_key(
                    brand_id=brand, name="bench", scopes=("read",), created_by="bench"
                ).secret
                for brand in {brand for brand, _ in cases.values()}
            }
            db.session.commit()
        client = app.test_client()

        def fetch(brand: str, path: str) -> None:
            response = client.get(
                f"/api/v1/brand/{brand}/{path}", headers={"X-Api-Key": keys[brand]}
            )
            assert response.status_code == 200, (path, response.get_json())
            listed = LIST_KEYS.get(path.partition("?")[0])
            if listed is not None:  # every list measured here has rows
                assert response.get_json()["data"][listed], (path, response.get_json())

        results = {
            name: median_ms(lambda brand=brand, path=path: fetch(brand, path))
            for name, (brand, path) in cases.items()
        }
        with psycopg.connect(dsn) as connection:

            def bare_page():
                connection.execute(CEILING_COUNT_SQL).fetchone()
                connection.execute(CEILING_PAGE_SQL).fetchall()

            ceiling = median_ms(bare_page)

        for name, value in results.items():
            flag = "  OVER TARGET" if value > TARGET_MS else ""
            print(f"{name:>24}: {value:6.2f} ms{flag}", file=sys.stderr)
        print(f"{'ceiling (raw SQL)':>24}: {ceiling:6.2f} ms", file=sys.stderr)

        slow = [name for name, value in results.items() if options.explain or value > TARGET_MS]
        if slow:
            explain(app, db, event, psycopg, dsn, {name: cases[name] for name in slow}, fetch)

        print(
            json.dumps(
                {
                    "median_ms": results,
                    "ceiling_ms": ceiling,
                    "ratio": round(ceiling / results["placements"], 3),
                }
            )
        )


def explain(app, db, event, psycopg, dsn, cases, fetch) -> None:
    """Run each case once more, catching its statements, and EXPLAIN ANALYZE its SELECTs."""
    caught: list[tuple[str, object]] = []

    def catch(_conn, _cursor, statement, parameters, _context, _many):
        caught.append((statement, parameters))

    with app.app_context():
        engine = db.engine
    event.listen(engine, "before_cursor_execute", catch)
    try:
        with psycopg.connect(dsn) as connection:
            for name, (brand, path) in cases.items():
                caught.clear()
                fetch(brand, path)
                for statement, parameters in list(caught):
                    if not statement.lstrip().upper().startswith("SELECT"):
                        continue
                    if "api_keys" in statement:
                        continue  # authentication: the same in every case
                    plan = connection.execute(
                        "EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters
                    ).fetchall()
                    print(
                        f"\n--- {name}: {brand}/{path}\n{statement}\n{parameters}", file=sys.stderr
                    )
                    print("\n".join(row[0] for row in plan), file=sys.stderr)
    finally:
        event.remove(engine, "before_cursor_execute", catch)


if __name__ == "__main__":
    main()
