"""Erasure by subject (CONTRACT 13.3), as a brand sees it: through the API, with a real
`flask worker` sending to real receivers, and over a subject large enough to need many batches."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from extensions import db
from models.columns import utcnow
from schemas.events import event_data
from services.delivery.bulk import ERASE_BATCH_EVENTS, run_one_batch
from services.events import publish_event
from tests.helpers import assert_error
from tests.receiver import Receiver, Reply
from tests.test_webhook_delivery import Api, poll, publish
from tests.worker_process import WorkerProcess, workers_started_by_test


@pytest.fixture
def api(client, brand, write_key) -> Api:
    return Api(client, brand, write_key)


@pytest.fixture
def start_worker(app_environ) -> Iterator[Callable[..., WorkerProcess]]:
    with workers_started_by_test(app_environ) as start:
        yield start


@pytest.fixture
def receivers() -> Iterator[Callable[[], Receiver]]:
    made: list[Receiver] = []

    def make() -> Receiver:
        made.append(Receiver())
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


def deal(deal_id: str, **more) -> dict:
    return {"id": deal_id, "status": "completed", "agreedAmountMinor": 45000000, **more}


def erase(api: Api, subject: str, status: int = 202) -> dict:
    return api.call("POST", f"subject/{subject}/erase", status)


def event(api: Api, event_id: str) -> dict:
    return api.call("GET", f"event/{event_id}")


def requests_for(receiver: Receiver, delivery_ids: set[str]) -> int:
    return sum(1 for request in list(receiver.received) if request.delivery_id in delivery_ids)


def test_pending_deliveries_end_erased_and_are_never_sent(api, app, brand, receivers, start_worker):
    """Deliveries waiting for a retry and one on the wire when the erasure came: all end
    `failed` with `erased`, none is sent again, the one on the wire is not recorded, and the
    receiver's answers are gone while statuses and headers stay."""
    held = threading.Event()
    erased_receiver, other_receiver = receivers(), receivers()
    # The first request is held on the wire; the others are refused (a retry in 30 s).
    erased_receiver.default = Reply(status=503, body=b"answer naming the creator")
    erased_receiver.reply_with(Reply(status=200, body=b"thanks, creator", hold=held))
    endpoint = api.register(erased_receiver.url, ["deal.completed"])["id"]
    other = api.register(other_receiver.url, ["deal.accepted"])["id"]
    worker = start_worker(WEBHOOK_RETRY_SCHEDULE="30,30")

    published = publish(
        app,
        brand,
        ("deal.completed", deal("deal_x", note="one")),
        ("deal.completed", deal("deal_x", note="two")),
        ("deal.completed", deal("deal_x", note="three")),
        ("deal.accepted", deal("deal_y")),
    )
    erased_events = [event_id for event_id, _ in published[:3]]
    erased_deliveries = {ids[0] for _, ids in published[:3]}
    [(kept_event, [kept_delivery])] = published[3:]
    erased_receiver.wait_for(3)
    refused = poll(
        lambda: [api.delivery(d) for d in erased_deliveries],
        lambda ds: sorted(d["attemptCount"] for d in ds) == [0, 1, 1],
        timeout=20,
        what="two attempts refused, one on the wire",
        worker=worker,
    )
    [on_the_wire] = [d["id"] for d in refused if d["attemptCount"] == 0]
    api.wait_delivery(kept_delivery, "delivered", worker=worker)

    answer = erase(api, "deal:deal_x")
    sent_before = requests_for(erased_receiver, erased_deliveries)
    assert answer == {"subject": {"type": "deal", "id": "deal_x"}, "events": 3}
    # Within the request: the subject's newest events are erased before the answer.
    for delivery_id in erased_deliveries:
        ended = api.delivery(delivery_id)
        assert (ended["status"], ended["lastError"]) == ("failed", "erased"), ended
        assert ended["nextRetryAt"] is None
    held.set()  # the attempt on the wire is answered 200 now: too late to count

    # The endpoint goes on: a later event of another subject is sent, after any retry that
    # retry-now would have brought forward had an erased delivery still been waiting.
    erased_receiver.default = Reply(status=200)
    api.call("POST", f"webhook/{endpoint}/retry-pending", 202)
    [(_, [later])] = publish(app, brand, ("deal.completed", deal("deal_z")))
    api.wait_delivery(later, "delivered", timeout=40, worker=worker)
    assert requests_for(erased_receiver, erased_deliveries) == sent_before

    held_one = api.delivery(on_the_wire)
    assert (held_one["status"], held_one["lastError"]) == ("failed", "erased")
    assert held_one["attempts"] == []  # its record was discarded with its lease
    for delivery_id in erased_deliveries - {on_the_wire}:
        detail = api.delivery(delivery_id)
        [attempt] = detail["attempts"]
        assert attempt["httpStatus"] == 503
        assert attempt["responseBody"] is None
        assert attempt["requestHeaders"]["X-Service-Delivery"] == delivery_id
        assert attempt["requestedAt"] and attempt["durationMs"] is not None
        assert detail["payload"]["data"] is None
        assert detail["payload"]["subject"] == {"type": "deal", "id": "deal_x"}
    for event_id in erased_events:
        shown = event(api, event_id)
        assert shown["data"] is None and shown["erasedAt"] is not None
        assert shown["subject"] == {"type": "deal", "id": "deal_x"}
    assert event(api, kept_event)["data"] == deal("deal_y")
    assert event(api, kept_event)["erasedAt"] is None
    assert api.delivery(kept_delivery)["attempts"][0]["responseBody"] == "ok"
    assert other  # the other endpoint got its own subject's event, untouched


def test_an_erased_event_is_not_sent_again(api, app, brand, client, write_key):
    endpoint = api.register("https://hooks.brand-example.invalid/x", ["deal.completed"])["id"]
    [(erased, [delivery])] = publish(app, brand, ("deal.completed", deal("deal_x")))
    [(kept, [kept_delivery])] = publish(app, brand, ("deal.completed", deal("deal_y")))
    erase(api, "deal:deal_x")

    refused = client.post(
        f"/api/v1/brand/{brand}/webhook/deliveries/{delivery}/redeliver",
        headers={"X-Api-Key": write_key},
    )
    assert_error(refused, 409, "CONFLICT")
    assert "erased" in refused.get_json()["message"]
    # Recover leaves the erased one out and still sends the others that failed.
    with app.app_context():
        db.session.execute(
            text(
                "UPDATE webhook_deliveries SET status = 'failed', failed_at = now() WHERE id = :id"
            ),
            {"id": kept_delivery},
        )
        db.session.execute(
            text("DELETE FROM webhook_delivery_queue WHERE delivery_id = :id"),
            {"id": kept_delivery},
        )
        db.session.commit()
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    recovered = api.call("POST", f"webhook/{endpoint}/recover", 202, json={"since": since})
    assert recovered["queued"] == 1
    deliveries, _ = api.deliveries(eventId=erased)
    assert [d["id"] for d in deliveries] == [delivery]
    assert len(api.deliveries(eventId=kept)[0]) == 2


def test_an_alert_loses_its_copy_of_an_erased_events_answer(api, app, brand):
    """CONTRACT 13.4 copies the answer that made an alert into the alert's data; erasing the
    subject of the event that answer was about erases that copy too, and nothing else."""
    sick = api.register("https://hooks.brand-example.invalid/x", ["deal.completed"])["id"]
    [(erased, [delivery])] = publish(app, brand, ("deal.completed", deal("deal_x")))
    [(kept, [kept_delivery])] = publish(app, brand, ("deal.completed", deal("deal_y")))

    def alert_about(event_id: str, delivery_id: str) -> str:
        with app.app_context():
            published = publish_event(
                brand_id=brand,
                name="webhook.endpoint_failing",
                data=event_data(
                    "webhook.endpoint_failing",
                    {
                        "endpoint_id": sick,
                        "url": "https://hooks.brand-example.invalid/x",
                        "consecutive_failures": 8,
                        "last_error": "HTTP 500",
                        "disabled_at": None,
                        "last_attempt": {
                            "delivery_id": delivery_id,
                            "event_id": event_id,
                            "event_type": "deal.completed",
                            "http_status": 500,
                            "error": "HTTP 500",
                            "response_body": f"no such deal as the one in {event_id}",
                        },
                    },
                ),
            )
            db.session.commit()
            return published.event.id

    about_erased = alert_about(erased, delivery)
    about_kept = alert_about(kept, kept_delivery)
    erase(api, "deal:deal_x")

    stripped = event(api, about_erased)["data"]["lastAttempt"]
    assert stripped["responseBody"] is None
    assert stripped["eventId"] == erased and stripped["httpStatus"] == 500  # the rest stays
    assert event(api, about_kept)["data"]["lastAttempt"]["responseBody"] == (
        f"no such deal as the one in {kept}"
    )


def test_the_request_rules(api, app, brand, client, read_key, make_brand, make_key):
    publish(app, brand, ("deal.completed", deal("deal_x")), ("deal.completed", deal("deal_x")))
    [(kept, _)] = publish(app, brand, ("deal.completed", deal("deal_y")))
    other_brand = make_brand("Other Foods")
    publish(app, other_brand, ("deal.completed", deal("deal_theirs")))

    assert erase(api, "deal:deal_x")["events"] == 2
    assert erase(api, "deal:deal_x") == {"subject": {"type": "deal", "id": "deal_x"}, "events": 2}
    for subject in ("deal:deal_none", "deal:deal_theirs", "conversion:deal_x"):
        assert_error(
            client.post(
                f"/api/v1/brand/{brand}/subject/{subject}/erase",
                headers={"X-Api-Key": api.key},
            ),
            404,
            "NOT_FOUND",
        )
    for malformed in ("deal_x", "planet:deal_x", "deal:", ":deal_x"):
        body = assert_error(
            client.post(
                f"/api/v1/brand/{brand}/subject/{malformed}/erase",
                headers={"X-Api-Key": api.key},
            ),
            400,
            "VALIDATION_ERROR",
        )
        assert "subject" in body["errors"]
    read_only = client.post(
        f"/api/v1/brand/{brand}/subject/deal:deal_y/erase", headers={"X-Api-Key": read_key}
    )
    assert read_only.status_code == 403
    assert event(api, kept)["data"] == deal("deal_y")

    listed = api.call("GET", "event/fetch-events", query_string={"subject": "deal:deal_x"})
    assert [(e["sequence"], e["data"]) for e in listed["events"]] == [(1, None), (2, None)]
    assert all(e["erasedAt"] for e in listed["events"])
    everything = api.call("GET", "event/fetch-events")["events"]
    assert [e["erasedAt"] is None for e in everything] == [False, False, True]
    # The other brand's subject of that name is untouched.
    with app.app_context():
        theirs = db.session.execute(
            text("SELECT erased_at FROM webhook_events WHERE brand_id = :b"), {"b": other_brand}
        ).scalar_one()
    assert theirs is None


def test_a_large_subject_is_erased_in_bounded_batches(api, app, brand):
    """20,000 events of one deal, each delivered with an answer, one still pending: the request
    erases the newest batch and answers; each further batch erases at most one batch more,
    newest first, until every event and answer is erased. Another deal's are untouched."""
    endpoint = api.register("https://hooks.brand-example.invalid/x", ["deal.completed"])["id"]
    count = 20_000
    with app.app_context():
        db.session.execute(_MANY_EVENTS, {"brand": brand, "endpoint": endpoint, "count": count})
        db.session.commit()
    [(other_event, [other_delivery])] = publish(app, brand, ("deal.completed", deal("deal_y")))

    assert erase(api, "deal:deal_big")["events"] == count

    def state() -> tuple[int, int, int, str]:
        with app.app_context():
            row = db.session.execute(_ERASED_SO_FAR, {"brand": brand}).one()
            db.session.remove()
            return tuple(row)

    erased, min_erased_sequence, answers_left, oldest_status = state()
    assert erased == ERASE_BATCH_EVENTS  # one batch, and the newest
    assert min_erased_sequence == count - ERASE_BATCH_EVENTS + 1
    assert answers_left == count - ERASE_BATCH_EVENTS
    assert oldest_status == "pending"  # the oldest event's delivery waits for its batch

    each_batch = []
    while True:
        with app.app_context():
            ran = run_one_batch()
            db.session.remove()
        if ran is None:
            break
        now_erased = state()[0]
        each_batch.append(now_erased - erased)
        erased = now_erased
    # Every batch a full one, then one that finds nothing left and ends the job.
    assert each_batch == [ERASE_BATCH_EVENTS] * (count // ERASE_BATCH_EVENTS - 1) + [0]
    assert state() == (count, 1, 0, "failed")
    with app.app_context():
        job = db.session.execute(
            text("SELECT done, finished_at FROM webhook_bulk_jobs WHERE kind = 'erase_subject'")
        ).one()
        queued = db.session.execute(
            text("SELECT count(*) FROM webhook_delivery_queue WHERE delivery_id = 'whd_big1'")
        ).scalar_one()
    assert job.done == count and job.finished_at is not None
    assert queued == 0
    oldest = api.delivery("whd_big1")
    assert (oldest["status"], oldest["lastError"]) == ("failed", "erased")
    assert event(api, other_event)["erasedAt"] is None
    assert api.delivery(other_delivery)["status"] == "pending"


# One deal's events 1..count (published in order, a second apart), each with a delivered
# delivery and its attempt's answer; the oldest one's delivery is still pending, queued.
_MANY_EVENTS = text(
    """
    WITH made AS (
        SELECT n, CAST(:now AS timestamptz) - make_interval(secs => :count - n) AS at
        FROM generate_series(1, :count) AS n
    ),
    events AS (
        INSERT INTO webhook_events (
            id, brand_id, name, body, created_at, subject_type, subject_id, sequence
        )
        SELECT 'evt_big' || n, :brand, 'deal.completed',
               '{"id":"evt_big' || n || '","type":"deal.completed","sequence":' || n
               || ',"data":{"id":"deal_big","n":' || n || '}}',
               at, 'deal', 'deal_big', n
        FROM made
    ),
    deliveries AS (
        INSERT INTO webhook_deliveries (
            id, brand_id, endpoint_id, event_id, event_name, status, attempt_count,
            created_at, delivered_at, next_attempt_at
        )
        SELECT 'whd_big' || n, :brand, :endpoint, 'evt_big' || n, 'deal.completed',
               CASE WHEN n = 1 THEN 'pending' ELSE 'delivered' END, 1, at,
               CASE WHEN n > 1 THEN at END, CASE WHEN n = 1 THEN at + interval '1 hour' END
        FROM made
    ),
    queued AS (
        INSERT INTO webhook_delivery_queue (delivery_id, endpoint_id, next_attempt_at,
                                            attempt_count)
        VALUES ('whd_big1', :endpoint, CAST(:now AS timestamptz) + interval '1 hour', 1)
    )
    INSERT INTO webhook_attempts (
        delivery_id, endpoint_id, attempt_number, requested_at, duration_ms, http_status,
        error, response_body, request_headers
    )
    SELECT 'whd_big' || n, :endpoint, 1, at, 12, CASE WHEN n = 1 THEN 500 ELSE 200 END,
           CASE WHEN n = 1 THEN 'HTTP 500' END, 'the answer about deal_big #' || n, '{}'
    FROM made
    """
).bindparams(now=utcnow())
_ERASED_SO_FAR = text(
    """
    SELECT count(*) FILTER (WHERE e.erased_at IS NOT NULL AND e.body LIKE '%"data"\\:null}'),
           min(e.sequence) FILTER (WHERE e.erased_at IS NOT NULL),
           (SELECT count(*) FROM webhook_attempts
            WHERE delivery_id LIKE 'whd_big%' AND response_body IS NOT NULL),
           (SELECT status FROM webhook_deliveries WHERE id = 'whd_big1')
    FROM webhook_events AS e
    WHERE e.brand_id = :brand AND e.subject_id = 'deal_big'
    """
)
