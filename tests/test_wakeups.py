"""Wake-ups (services/wakeups.py): a committed event reaches every listening process as one
NOTIFY naming its brand; a rolled-back one reaches nobody; a listener that loses its connection
tells its subscribers "anything may have happened" and listens again."""

from __future__ import annotations

import queue

import psycopg
import pytest

from extensions import db
from services.events import publish_event
from services.wakeups import (
    CHANNEL,
    PAYLOAD_MAX_BYTES,
    WakeupListener,
    conninfo_for,
    notifier,
    payloads,
)


@pytest.fixture
def listener(app):
    with app.app_context():
        conninfo = conninfo_for(db.engine)
    listener = WakeupListener(conninfo)
    assert listener.wait_listening(10)
    return listener


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
        publish_event(brand_id=brand, name="deal.completed", data={"dealId": "deal_1"})
        publish_event(brand_id=other, name="deal.completed", data={"dealId": "deal_2"})
        db.session.commit()
    assert notifier().flush(5)
    brands = set().union(*_drain(heard, 5))
    assert brands == {brand, other}


def test_a_rolled_back_event_wakes_nobody(app, brand, listener):
    heard = _heard(listener)
    with app.app_context():
        publish_event(brand_id=brand, name="deal.completed", data={"dealId": "deal_1"})
        db.session.rollback()
        db.session.commit()
    assert notifier().flush(5)
    assert _drain(heard, 1.0) == []


def test_a_listener_whose_connection_dies_says_so_and_listens_again(app, brand, listener):
    heard = _heard(listener)
    with app.app_context(), psycopg.connect(conninfo_for(db.engine), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE %s AND query LIKE %s",
            ("%listener", f"%LISTEN {CHANNEL}%"),
        )
    assert None in _drain(heard, 10)  # "anything may have happened"
    assert listener.wait_listening(10)
    with app.app_context():
        publish_event(brand_id=brand, name="deal.completed", data={"dealId": "deal_1"})
        db.session.commit()
    assert notifier().flush(5)
    assert any(item and brand in item for item in _drain(heard, 5))


def test_payloads_stay_under_the_notify_limit():
    brand_ids = [f"brd_{index:026d}" for index in range(1000)]
    chunks = payloads(brand_ids + brand_ids[:10])
    assert len(chunks) > 1
    assert all(len(chunk.encode()) <= PAYLOAD_MAX_BYTES for chunk in chunks)
    assert sorted(" ".join(chunks).split()) == sorted(brand_ids)
