"""Each event's `sequence` in its subject's life (CONTRACT 12.2): 1, 2, 3... per brand and subject,
without a gap or a repeat, whoever publishes, however many at once, and whatever rolls back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from sqlalchemy import select

from extensions import db
from models import WebhookEvent
from services.events import publish_event
from tests.subject_publisher import publish_events

ROOT = Path(__file__).resolve().parent.parent
PUBLISHERS = 8  # threads, and as many processes beside them
EVENTS_EACH = 40
SUBJECTS = 20


def stored_sequences(app, brand_id: str) -> dict[str, list[tuple[int, str, dict]]]:
    """Each subject's stored events: (sequence, id, body), in sequence order."""
    with app.app_context():
        rows = db.session.execute(
            select(
                WebhookEvent.subject_type,
                WebhookEvent.subject_id,
                WebhookEvent.sequence,
                WebhookEvent.id,
                WebhookEvent.body,
            )
            .where(WebhookEvent.brand_id == brand_id)
            .order_by(WebhookEvent.subject_id, WebhookEvent.sequence)
        ).all()
        db.session.rollback()
    found: dict[str, list[tuple[int, str, dict]]] = defaultdict(list)
    for row in rows:
        key = f"{row.subject_type}:{row.subject_id}"
        found[key].append((row.sequence, row.id, json.loads(row.body)))
    return found


def test_parallel_threads_and_processes_number_every_subject_without_gaps(app, app_environ, brand):
    start_at = time.time() + 4  # every publisher connected and waiting for the start line
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.subject_publisher",
                "--brand",
                brand,
                "--tag",
                f"process-{number}",
                "--count",
                str(EVENTS_EACH),
                "--subjects",
                str(SUBJECTS),
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
    lines: list[dict] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def report(line: dict) -> None:
        with lock:
            lines.append(line)

    def thread_publisher(number: int) -> None:
        try:
            publish_events(
                app,
                brand_id=brand,
                tag=f"thread-{number}",
                count=EVENTS_EACH,
                subjects=SUBJECTS,
                start_at=start_at,
                report=report,
            )
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=thread_publisher, args=(n,)) for n in range(PUBLISHERS)]
    for thread in threads:
        thread.start()
    for process in processes:
        output, errors = process.communicate(timeout=180)
        assert process.returncode == 0, errors
        lines += [json.loads(line) for line in output.splitlines()]
    for thread in threads:
        thread.join(180)
    assert failures == []
    assert len(lines) == 2 * PUBLISHERS * EVENTS_EACH

    committed = [line for line in lines if line["committed"]]
    stored = stored_sequences(app, brand)
    assert len(stored) == SUBJECTS
    for deal_number in range(SUBJECTS):
        key = f"deal:deal_{deal_number}"
        events = stored[key]
        # 1..n, no gap, no repeat: and exactly the committed events of that deal.
        assert [sequence for sequence, _, _ in events] == list(range(1, len(events) + 1)), key
        ours = {line["id"]: line for line in committed if line["deal"] == f"deal_{deal_number}"}
        assert {event_id for _, event_id, _ in events} == set(ours), key
        for sequence, event_id, body in events:
            # What the publisher was told is what was stored, and what every delivery sends.
            assert ours[event_id]["sequence"] == sequence
            assert body["sequence"] == sequence
            assert body["subject"] == {"type": "deal", "id": f"deal_{deal_number}"}

    # It was contended: numbers taken by transactions that rolled back were given again.
    given_again = {(line["deal"], line["sequence"]) for line in committed} & {
        (line["deal"], line["sequence"]) for line in lines if not line["committed"]
    }
    assert given_again


def test_a_rolled_back_publish_leaves_no_gap(app, brand):
    with app.app_context():
        first = publish_event(brand_id=brand, name="deal.accepted", data={"id": "deal_r"})
        db.session.commit()
        dropped = publish_event(brand_id=brand, name="escrow.held", data={"dealId": "deal_r"})
        db.session.rollback()
        second = publish_event(brand_id=brand, name="escrow.held", data={"dealId": "deal_r"})
        db.session.commit()
    assert (first.event.sequence, dropped.event.sequence, second.event.sequence) == (1, 2, 2)
    stored = stored_sequences(app, brand)["deal:deal_r"]
    assert [(sequence, event_id) for sequence, event_id, _ in stored] == [
        (1, first.event.id),
        (2, second.event.id),
    ]


def test_subjects_are_numbered_per_brand_and_per_subject(app, brand, make_brand):
    other = make_brand("Other Foods")
    with app.app_context():
        numbers = [
            publish_event(brand_id=brand_id, name=name, data=data).event.sequence
            for brand_id, name, data in (
                (brand, "deal.accepted", {"id": "deal_1"}),
                (other, "deal.accepted", {"id": "deal_1"}),  # another brand's deal_1
                (brand, "campaign.published", {"id": "deal_1"}),  # a campaign of that id
                (brand, "deal.completed", {"id": "deal_1"}),
                (brand, "conversion.recorded", {"id": "conv_1"}),
                (brand, "webhook.test", {"endpointId": "whe_1", "message": "hi"}),
            )
        ]
        db.session.commit()
    assert numbers == [1, 1, 1, 2, 1, 1]
