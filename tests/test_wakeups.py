"""Wake-ups (services/wakeups.py): a committed event reaches every listening process as a
NOTIFY naming its brand, sent by the very statement that publishes it (the postback's too); a
rolled-back one reaches nobody; a listener that loses its connection tells its subscribers
"anything may have happened" and listens again."""

from __future__ import annotations

import logging
import os
import queue
import time

import psycopg
import pytest

from extensions import db
from services.events import publish_event
from services.postbacks import Postback, record_postback
from services.wakeups import HEALTH_CHECK_SECONDS, WakeupListener, conninfo_for


@pytest.fixture
def listener(app):
    with app.app_context():
        conninfo = conninfo_for(db.engine)
    listener = WakeupListener(conninfo)
    assert listener.wait_listening(10)
    yield listener
    listener.stop()


def _heard(listener) -> queue.Queue:
    heard: queue.Queue = queue.Queue()
    listener.subscribe(heard.put)
    return heard


def _drain(heard: queue.Queue, timeout: float) -> list:
    got = []
    try:
        got.append(heard.get(timeout=timeout))
        while True:
            got.append(heard.get(timeout=0.3))
    except queue.Empty:
        return got


def test_a_committed_event_wakes_listeners_with_its_brand(app, brand, make_brand, listener):
    other = make_brand("Other Foods")
    heard = _heard(listener)
    with app.app_context():
        # One brand with no endpoint at all: its event still wakes its readers.
        publish_event(brand_id=brand, name="deal.completed", data={"dealId": "deal_1"})
        publish_event(brand_id=other, name="deal.completed", data={"dealId": "deal_2"})
        db.session.commit()
    brands = set().union(*_drain(heard, 5))
    assert brands == {brand, other}


def test_a_postback_wakes_listeners_with_its_brand(client, brand, read_key, listener):
    heard = _heard(listener)
    answer = client.post(
        f"/api/v1/brand/{brand}/conversion/record-postback",
        json={"eventType": "purchase"},
        headers={"X-Api-Key": read_key, "Idempotency-Key": "wakeup-order-00001"},
    )
    assert answer.status_code == 201
    assert _drain(heard, 5) == [frozenset({brand})]
    replay = client.post(
        f"/api/v1/brand/{brand}/conversion/record-postback",
        json={"eventType": "purchase"},
        headers={"X-Api-Key": read_key, "Idempotency-Key": "wakeup-order-00001"},
    )
    assert replay.status_code == 200
    assert _drain(heard, 1.0) == []  # a replay publishes nothing


def test_a_postback_wakes_its_brand_once_committed_and_a_rolled_back_one_nobody(
    app, brand, listener
):
    # Its transaction sends no NOTIFY (it would hold PostgreSQL's server-wide notify lock until
    # the commit is on disk); the wake-up follows the commit (services/wakeups.py).
    heard = _heard(listener)
    with app.app_context():
        record_postback(
            brand_id=brand, idempotency_key="wakeup-later-00001", postback=Postback("purchase")
        )
        assert _drain(heard, 1.0) == []  # not yet committed: nobody could read it
        db.session.commit()
        assert _drain(heard, 5) == [frozenset({brand})]
        record_postback(
            brand_id=brand, idempotency_key="wakeup-later-00002", postback=Postback("purchase")
        )
        db.session.rollback()
        db.session.remove()
    assert _drain(heard, 1.0) == []


def test_a_rolled_back_event_wakes_nobody(app, brand, listener):
    heard = _heard(listener)
    with app.app_context():
        publish_event(brand_id=brand, name="deal.completed", data={"dealId": "deal_1"})
        db.session.rollback()
    assert _drain(heard, 1.0) == []


def test_a_listener_whose_connection_dies_says_so_and_listens_again(app, brand, listener):
    heard = _heard(listener)
    with app.app_context(), psycopg.connect(conninfo_for(db.engine), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE %s",
            ("%listener",),
        )
    assert None in _drain(heard, 10)  # "anything may have happened"
    assert listener.wait_listening(10)
    with app.app_context():
        publish_event(brand_id=brand, name="deal.completed", data={"dealId": "deal_1"})
        db.session.commit()
    assert any(item and brand in item for item in _drain(heard, 5))


def test_a_stopped_listener_closes_its_connection_without_a_word(app, caplog):
    with app.app_context():
        conninfo = conninfo_for(db.engine)

    def listening_backends() -> set[int]:
        with psycopg.connect(conninfo) as admin:
            rows = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                (f"brand-api pid={os.getpid()} listener",),
            )
            return {pid for (pid,) in rows}

    others = listening_backends()
    listener = WakeupListener(conninfo)
    assert listener.wait_listening(10)
    # Listeners of earlier tests may still be ending: theirs can only leave the set.
    [own] = listening_backends() - others
    caplog.set_level(logging.WARNING, logger="brand_api.wakeups")
    listener.stop()
    deadline = time.monotonic() + HEALTH_CHECK_SECONDS + 5
    while own in listening_backends() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert own not in listening_backends()
    assert not listener.wait_listening(0)
    assert not [record for record in caplog.records if "lost its connection" in record.message]
