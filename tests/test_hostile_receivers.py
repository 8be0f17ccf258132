"""A receiver's answer is untrusted input (issue 34): whatever one endpoint's receiver answers, a
real worker records it, bounded and safe, and every other endpoint's deliveries (another
brand's included) arrive on time; the worker's memory stays bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy import select

from extensions import db
from models import DeliveryLoopHeartbeat, WebhookAttempt, WebhookDelivery
from services.delivery.transport import NOT_HTTP
from services.events import publish_event
from tests.receiver import Receiver
from tests.test_webhook_delivery import Api
from tests.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
# Answers with a 200 status line: each is delivered, whatever follows it.
DELIVERED = ("/nul", "/utf16", "/binary", "/gzip-bomb", "/drip", "/gzip-small", "/many-headers")
# Not HTTP at all, or past its limits (300 headers of 8 KB: at most 128): each attempt fails,
# is recorded as such, and the breaker holds the receiver to one attempt at a time.
FAILED = ("/not-http", "/header-flood")
EVENTS = 6
# Healthy deliveries arrive this soon after their publish, hostile neighbours or not (the worker
# is not otherwise busy; the figure under load is bench/chaos.py's).
ON_TIME_SECONDS = 3.0
TIMEOUT_SECONDS = 3
# A failing receiver is probed one attempt at a time, at most a timeout apart: its EVENTS x 4
# attempts take about that many timeouts (a minute), plus slack for a loaded CI machine.
FAILED_SETTLE_SECONDS = EVENTS * 4 * TIMEOUT_SECONDS + 45


@pytest.fixture
def hostile():
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.hostile_receiver", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert line.startswith("listening "), line
    yield f"http://127.0.0.1:{int(line.split()[1])}"
    process.kill()
    process.wait(10)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_hostile_answers_are_recorded_and_hold_back_nobody(
    app, app_environ, client, make_brand, make_key, hostile
):
    healthy_here, healthy_elsewhere = Receiver(), Receiver()
    worker = None
    try:
        brand, other_brand = make_brand("Hostile Foods"), make_brand("Neighbour Foods")
        here = Api(client, brand, make_key(brand))
        elsewhere = Api(client, other_brand, make_key(other_brand))
        hostile_endpoints = {
            path: here.register(hostile + path, events=["deal.completed"])["id"]
            for path in DELIVERED + FAILED
        }
        here.register(healthy_here.url, events=["deal.completed"])
        elsewhere.register(healthy_elsewhere.url, events=["deal.completed"])
        worker = WorkerProcess(
            app_environ, WEBHOOK_TIMEOUT=str(TIMEOUT_SECONDS), WEBHOOK_RETRY_SCHEDULE="1,1,1"
        )
        wait_until_looping(app, worker)  # "on time" counts from a running worker, not its start
        published_at: dict[str, float] = {}
        peak_rss = 0.0
        for number in range(EVENTS):
            with app.app_context():
                for brand_id in (brand, other_brand):
                    event = publish_event(
                        brand_id=brand_id, name="deal.completed", data={"n": number}
                    ).event
                    db.session.commit()
                    published_at[event.id] = time.monotonic()
            time.sleep(0.5)
            peak_rss = max(peak_rss, rss_mib(worker.pid))
        for receiver in (healthy_here, healthy_elsewhere):
            received = receiver.wait_for(EVENTS, timeout=30)
            late = [
                (r.json["id"], round(r.received_at - published_at[r.json["id"]], 2))
                for r in received
                if r.received_at - published_at[r.json["id"]] > ON_TIME_SECONDS
            ]
            assert not late, (late, worker.output()[-3000:])

        deadline = time.monotonic() + FAILED_SETTLE_SECONDS
        while time.monotonic() < deadline:
            peak_rss = max(peak_rss, rss_mib(worker.pid))
            statuses = delivery_statuses(app, hostile_endpoints)
            if all(status != "pending" for per in statuses.values() for status in per):
                break
            time.sleep(0.5)
        assert worker.process.poll() is None, worker.output()[-3000:]
        for path in DELIVERED:
            assert statuses[path] == ["delivered"] * EVENTS, (path, statuses, worker.output())
        for path in FAILED:
            assert statuses[path] == ["failed"] * EVENTS, (path, statuses)
        with urllib.request.urlopen(hostile + "/_counts", timeout=5) as answer:  # noqa: S310
            counts = json.loads(answer.read())
        assert counts["/not-http"] == EVENTS * 4  # every attempt made, each recorded

        with app.app_context():
            stored = {
                path: db.session.scalars(
                    select(WebhookAttempt)
                    .join(WebhookDelivery, WebhookDelivery.id == WebhookAttempt.delivery_id)
                    .where(WebhookDelivery.endpoint_id == endpoint_id)
                ).all()
                for path, endpoint_id in hostile_endpoints.items()
            }
            db.session.remove()
        nul = stored["/nul"][0]
        assert nul.http_status == 200 and "\x00" not in nul.response_body
        assert nul.response_body.startswith("OK\ufffd")
        assert stored["/utf16"][0].response_body == "OK, received"
        assert stored["/gzip-small"][0].response_body.startswith("compressed fine")
        bomb = stored["/gzip-bomb"][0]
        assert bomb.response_body == "\ufffd" * 2048  # zeros, inflated only as far as kept
        assert all(a.error.startswith(NOT_HTTP) for a in stored["/header-flood"])
        many = stored["/many-headers"][0]
        assert len(many.response_headers) == 32
        assert all(
            len(value) == 256 for name, value in many.response_headers.items() if "Many" in name
        )
        assert stored["/drip"][0].http_status == 200
        assert all(a.error.startswith(NOT_HTTP) for a in stored["/not-http"])
        # Every answer went through bounded buffers: nothing near the bomb's 256 MiB.
        assert peak_rss < 250, peak_rss
    finally:
        healthy_here.close()
        healthy_elsewhere.close()
        if worker is not None:
            worker.stop()


def delivery_statuses(app, endpoints: dict[str, str]) -> dict[str, list[str]]:
    with app.app_context():
        statuses = {
            path: list(
                db.session.scalars(
                    select(WebhookDelivery.status)
                    .where(WebhookDelivery.endpoint_id == endpoint_id)
                    .order_by(WebhookDelivery.created_at)
                )
            )
            for path, endpoint_id in endpoints.items()
        }
        db.session.remove()
    return statuses


def wait_until_looping(app, worker: WorkerProcess) -> None:
    """Until the worker's delivery loop has finished a round (its heartbeat row)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with app.app_context():
            pids = set(db.session.scalars(select(DeliveryLoopHeartbeat.pid)))
            db.session.remove()
        if worker.pid in pids:
            return
        assert worker.process.poll() is None, worker.output()
        time.sleep(0.1)
    raise AssertionError("the worker's loop did not start:\n" + worker.output())
