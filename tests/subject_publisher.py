"""A publisher of events of many subjects at once, for tests/test_event_sequences.py: `--count`
events of deals `deal_0` .. `deal_{subjects - 1}` of one brand, each deal chosen at random, each
event in its own transaction held open a few random milliseconds; about one in eight is rolled
back instead of committed. Prints one JSON line per event: its id, deal, sequence, and whether
it was committed. Run in threads (`publish_events`) or as its own process:

    python -m tests.subject_publisher --brand BRAND --tag NAME --count N --subjects S \
        --start-at T   (the app's env vars)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Callable

from flask import Flask

from app import create_app
from extensions import db
from services.events import publish_event

ROLLED_BACK_SHARE = 1 / 8


def publish_events(
    app: Flask,
    *,
    brand_id: str,
    tag: str,
    count: int,
    subjects: int,
    start_at: float,
    report: Callable[[dict], None],
) -> None:
    rng = random.Random(tag)
    with app.app_context():
        db.session.connection()  # connected before the start line
        db.session.rollback()
        time.sleep(max(0.0, start_at - time.time()))
        for number in range(count):
            deal_id = f"deal_{rng.randrange(subjects)}"
            name = rng.choice(("deal.status_changed", "escrow.held", "placement.verified"))
            data = {"id": deal_id} if name.startswith("deal.") else {"dealId": deal_id}
            published = publish_event(brand_id=brand_id, name=name, data=data | {"n": number})
            time.sleep(rng.uniform(0, 0.01))
            committed = rng.random() >= ROLLED_BACK_SHARE
            if committed:
                db.session.commit()
            else:
                db.session.rollback()
            report(
                {
                    "id": published.event.id,
                    "deal": deal_id,
                    "sequence": published.event.sequence,
                    "committed": committed,
                }
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--brand", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--subjects", type=int, required=True)
    parser.add_argument("--start-at", type=float, required=True, help="time.time() to start at")
    arguments = parser.parse_args()
    publish_events(
        create_app(os.environ),
        brand_id=arguments.brand,
        tag=arguments.tag,
        count=arguments.count,
        subjects=arguments.subjects,
        start_at=arguments.start_at,
        report=lambda line: print(json.dumps(line), flush=True),
    )


if __name__ == "__main__":
    main()
