"""A publishing process for tests/test_event_feed_order.py: publishes `--count` events of one
brand, each in its own transaction held open a random few milliseconds after the insert (so that
transactions that took their ids later often commit first), and prints one JSON line per event:
its id, its transaction's id and when it committed (time.monotonic(), one clock for every
process on Linux).

    python -m tests.event_publisher --brand BRAND --tag NAME --count N   (the app's env vars)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from sqlalchemy import text

from app import create_app
from extensions import db
from services.events import publish_event


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--brand", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--start-at", type=float, required=True, help="time.time() to start at")
    arguments = parser.parse_args()
    app = create_app(os.environ)
    rng = random.Random(arguments.tag)
    with app.app_context():
        db.session.execute(text("SELECT 1"))  # connected before the start line
        db.session.rollback()
        time.sleep(max(0.0, arguments.start_at - time.time()))
        for number in range(arguments.count):
            published = publish_event(
                brand_id=arguments.brand,
                name="deal.completed",
                data={"publisher": arguments.tag, "number": number},
            )
            xact_id = db.session.execute(
                text("SELECT CAST(CAST(pg_current_xact_id() AS TEXT) AS BIGINT)")
            ).scalar_one()
            time.sleep(rng.uniform(0, 0.03))
            db.session.commit()
            committed_at = time.monotonic()
            line = {"id": published.event.id, "xact_id": xact_id, "committed_at": committed_at}
            print(json.dumps(line), flush=True)
            time.sleep(rng.uniform(0, 0.005))


if __name__ == "__main__":
    main()
