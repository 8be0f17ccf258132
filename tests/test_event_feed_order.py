"""Order and completeness of the events API (CONTRACT 11.1, services/event_feed.py): while
several processes publish at once, in transactions that commit out of the order they began,
and a gunicorn server records postbacks (whose event is written by one statement of its own),
a follower passing `nextAfter` sees every event of the brand exactly once, in one order that a
later reader from the start sees too: the order of the publishing transactions."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from sqlalchemy import select

from extensions import db
from models import WebhookEvent
from tests.server_process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
PUBLISHERS = 4
EVENTS_EACH = 60
POSTBACKS = 80


def test_a_follower_sees_every_event_once_in_order_while_many_publish(
    app, app_environ, brand, make_key
):
    key = make_key(brand, scopes=("read", "write"))
    server = ServerProcess(app_environ, threads=None, worker_class=None)
    try:
        feed_url = f"{server.url}/api/v1/brand/{brand}/event/fetch-events"
        headers = {"X-Api-Key": key}
        expected = PUBLISHERS * EVENTS_EACH + POSTBACKS
        seen: list[dict] = []
        reads = {"pages": 0, "non_empty": 0}
        done = threading.Event()

        def follower() -> None:
            rng = random.Random(7)
            after = None
            deadline = time.monotonic() + 120
            while len(seen) < expected and time.monotonic() < deadline:
                query = {"limit": rng.randint(1, 100), "wait": 2}
                if after:
                    query["after"] = after
                body = requests.get(feed_url, params=query, headers=headers, timeout=30).json()
                reads["pages"] += 1
                reads["non_empty"] += bool(body["data"]["events"])
                seen.extend(body["data"]["events"])
                after = body["meta"]["nextAfter"]
            done.set()

        following = threading.Thread(target=follower)
        following.start()

        start_at = time.time() + 3  # every publisher connected and waiting for the start line
        publishers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.event_publisher",
                    "--brand",
                    brand,
                    "--tag",
                    f"p{number}",
                    "--count",
                    str(EVENTS_EACH),
                    "--start-at",
                    str(start_at),
                ],
                cwd=ROOT,
                env={**app_environ, "PATH": os.environ["PATH"]},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for number in range(PUBLISHERS)
        ]

        def postback(number: int) -> str:
            response = requests.post(
                f"{server.url}/api/v1/brand/{brand}/conversion/record-postback",
                json={"eventType": "purchase", "valueMinor": number},
                headers={**headers, "Idempotency-Key": f"order-{uuid.uuid4().hex}"},
                timeout=30,
            )
            assert response.status_code == 201, response.text
            return response.json()["data"]["conversionId"]

        time.sleep(max(0.0, start_at - time.time()))
        with ThreadPoolExecutor(4) as pool:
            conversions = list(pool.map(postback, range(POSTBACKS)))

        lines = []
        for process in publishers:
            output, errors = process.communicate(timeout=120)
            assert process.returncode == 0, errors
            lines += [json.loads(line) for line in output.splitlines()]
        following.join(150)
        assert done.is_set(), f"the follower saw {len(seen)} of {expected}"

        # The scenario really happened: transactions committed out of the order they took
        # their ids, so a cursor by insertion order could have passed an uncommitted event.
        overtaken = sum(
            1
            for earlier in lines
            for later in lines
            if earlier["xact_id"] < later["xact_id"]
            and earlier["committed_at"] > later["committed_at"]
        )
        assert overtaken > 0
        assert reads["non_empty"] > 10, reads  # it followed live, not once at the end

        # Exactly once each, and nothing else.
        ids = [event["id"] for event in seen]
        assert len(ids) == len(set(ids)) == expected
        published = {line["id"] for line in lines}
        assert published <= set(ids)
        conversion_events = {
            event["data"]["id"] for event in seen if event["type"] == "conversion.recorded"
        }
        assert conversion_events == set(conversions)

        # In order: each publisher's events in the order it published them, and the same order
        # as a reader from the start sees afterwards and as the database's (xact_id, position).
        for tag in {event["data"].get("publisher") for event in seen} - {None}:
            numbers = [e["data"]["number"] for e in seen if e["data"].get("publisher") == tag]
            assert numbers == list(range(EVENTS_EACH))
        again, after = [], None
        while True:
            query = {"limit": 100, **({"after": after} if after else {})}
            body = requests.get(feed_url, params=query, headers=headers, timeout=30).json()
            if not body["data"]["events"]:
                break
            again += [event["id"] for event in body["data"]["events"]]
            after = body["meta"]["nextAfter"]
        assert again == ids
        with app.app_context():
            stored = db.session.scalars(
                select(WebhookEvent.id)
                .where(WebhookEvent.brand_id == brand)
                .order_by(WebhookEvent.xact_id, WebhookEvent.position)
            ).all()
            db.session.rollback()
        assert stored == ids
    finally:
        server.stop()
