"""`flask events emit BRAND_ID EVENT_NAME [--data JSON]` (CONTRACT section 2): prints the event
id and nothing else on stdout, fans out like any platform event, and refuses bad input with a
one-line error, creating nothing."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta

import pytest
from rq import Worker
from sqlalchemy import func, select

from extensions import db
from models import WebhookDelivery, WebhookEvent
from models.columns import utcnow
from models.event_catalog import EVENT_NAMES, sample_data
from services.events import publish_event
from tests.command_line import run_flask
from tests.delivery_states import settle, wait_for_a_retry
from tests.helpers import assert_success
from tests.worker_process import WorkerProcess
from workers.connection import redis_connection


def call(client, brand: str, key: str, method: str, path: str, status: int = 200, **kw) -> dict:
    response = client.open(
        f"/api/v1/brand/{brand}/{path}", method=method, headers={"X-Api-Key": key}, **kw
    )
    return assert_success(response, status)


def register(client, brand, key, events: list[str]) -> str:
    return call(
        client,
        brand,
        key,
        "POST",
        "webhook/register-endpoint",
        201,
        json={"url": "http://127.0.0.1:9/hooks", "events": events},
    )["id"]


def deliveries(client, brand, key) -> list[dict]:
    return call(client, brand, key, "GET", "webhook/fetch-deliveries?limit=100")["deliveries"]


def counts(app) -> tuple[int, int]:
    with app.app_context():
        events = db.session.scalar(select(func.count()).select_from(WebhookEvent))
        sent = db.session.scalar(select(func.count()).select_from(WebhookDelivery))
        db.session.remove()
    return events, sent


def test_emit_prints_the_event_id_and_fans_out_to_subscribers(
    app, app_environ, client, brand, write_key
):
    subscribed = register(client, brand, write_key, ["deal.completed", "escrow.held"])
    other = register(client, brand, write_key, ["escrow.released"])
    gone = register(client, brand, write_key, ["deal.completed"])
    call(client, brand, write_key, "DELETE", f"webhook/{gone}/delete-endpoint")

    result = run_flask(app_environ, "events", "emit", brand, "deal.completed")

    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"evt_\w+\n", result.stdout), result.stdout
    event_id = result.stdout.strip()
    [delivery] = deliveries(client, brand, write_key)
    assert delivery["endpointId"] == subscribed
    assert delivery["endpointId"] not in {other, gone}
    assert delivery["eventId"] == event_id
    assert delivery["eventName"] == "deal.completed"
    assert delivery["status"] == "pending"
    detail = call(client, brand, write_key, "GET", f"webhook/deliveries/{delivery['id']}")
    payload = detail["payload"]
    assert payload["id"] == event_id
    assert payload["type"] == "deal.completed"
    assert payload["brandId"] == brand
    assert payload["apiVersion"] == "1"
    assert_a_fresh_sample(payload["data"], "deal.completed")


def assert_a_fresh_sample(data: dict, name: str) -> None:
    """The catalogue's sample for `name`, each of its record ids replaced by a new one."""
    sample = sample_data(name)
    assert data.keys() == sample.keys()
    for key, value in sample.items():
        if isinstance(value, str) and re.fullmatch(r"[a-z]+_[0-9a-z]{26}", value):
            assert data[key] != value and data[key].split("_")[0] == value.split("_")[0], key
        else:
            assert data[key] == value, key


def test_emit_without_data_is_about_a_new_sample_subject_each_time(
    app, runner, client, brand, write_key
):
    """Two emits of the sample are two deals, each at sequence 1 (not one sample deal whose
    sequence climbs across unrelated emits), and the command says which subject it used."""
    register(client, brand, write_key, ["deal.completed", "placement.verified"])
    subjects = []
    for name in ("deal.completed", "deal.completed", "placement.verified"):
        result = runner.invoke(args=["events", "emit", brand, name])
        assert result.exit_code == 0, result.output
        event = call(client, brand, write_key, "GET", f"event/{result.stdout.strip()}")
        assert event["sequence"] == 1
        assert event["subject"]["type"] == "deal"
        # The placement's deal is its subject: the same new id where the sample repeats it.
        assert event["subject"]["id"] == event["data"].get("dealId", event["data"]["id"])
        key = f"deal:{event['subject']['id']}"
        assert f"about a new sample deal ({key}, sequence 1)" in result.stderr, result.stderr
        subjects.append(key)
    assert len(set(subjects)) == 3


def test_emit_sends_the_given_data(app, runner, client, brand, write_key):
    endpoint = register(client, brand, write_key, ["conversion.recorded"])
    data = sample_data("conversion.recorded") | {
        "id": "conv_1",
        "valueMinor": 990,
        "currency": "USD",
        "metadata": {"a": [1, 2]},
        "linkId": None,
    }

    result = runner.invoke(
        args=["events", "emit", brand, "conversion.recorded", "--data", json.dumps(data)]
    )

    assert result.exit_code == 0, result.output
    event_id = result.stdout.strip()
    assert re.fullmatch(r"evt_\w+", event_id) and result.stdout == event_id + "\n"
    [delivery] = deliveries(client, brand, write_key)
    assert delivery["endpointId"] == endpoint
    detail = call(client, brand, write_key, "GET", f"webhook/deliveries/{delivery['id']}")
    assert detail["payload"]["id"] == event_id
    assert detail["payload"]["data"] == data


def test_emit_to_one_endpoint_sends_it_the_sample_whatever_it_subscribes_to(
    app, runner, client, brand, write_key
):
    """`--endpoint`: what the endpoint page's "Send an example event" does, from a terminal."""
    chosen = register(client, brand, write_key, ["conversion.recorded"])
    register(client, brand, write_key, ["deal.completed"])  # subscribed, but not chosen

    result = runner.invoke(args=["events", "emit", brand, "deal.completed", "--endpoint", chosen])

    assert result.exit_code == 0, result.output
    event_id = result.stdout.strip()
    [delivery] = deliveries(client, brand, write_key)
    assert (delivery["endpointId"], delivery["eventId"]) == (chosen, event_id)
    detail = call(client, brand, write_key, "GET", f"webhook/deliveries/{delivery['id']}")
    assert_a_fresh_sample(detail["payload"]["data"], "deal.completed")


def test_emit_to_a_disabled_or_unknown_endpoint_is_a_one_line_error(
    app, runner, client, brand, write_key
):
    disabled = register(client, brand, write_key, ["deal.completed"])
    call(
        client,
        brand,
        write_key,
        "PATCH",
        f"webhook/{disabled}/update-endpoint",
        json={"isActive": False},
    )
    for endpoint in (disabled, "whe_01jd3kr7s9t1v3w5x7y9z1a3b5"):
        result = runner.invoke(
            args=["events", "emit", brand, "deal.completed", "--endpoint", endpoint]
        )
        assert result.exit_code != 0 and result.stdout == ""
        assert result.stderr.strip().count("\n") == 0 and endpoint in result.stderr
    assert counts(app) == (0, 0)


def test_emit_to_a_brand_without_subscribers_records_the_event_only(app, runner, brand):
    result = runner.invoke(args=["events", "emit", brand, "campaign.published"])

    assert result.exit_code == 0, result.output
    assert re.fullmatch(r"evt_\w+\n", result.stdout)
    assert counts(app) == (1, 0)


_DEAL = sample_data("deal.completed")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["brd_does_not_exist", "deal.completed"], "brd_does_not_exist"),
        (["BRAND", "deal.finished"], "deal.finished"),
        (["BRAND", "deal.completed", "--data", "{not json"], "not valid JSON"),
        (["BRAND", "deal.completed", "--data", '{"n": ' + "1" * 5000 + "}"], "4300 digits"),
        (["BRAND", "deal.completed", "--data", "[1, 2]"], "JSON object"),
        (["BRAND", "deal.completed", "--data", '"text"'], "JSON object"),
        (["BRAND", "deal.completed", "--data", "null"], "JSON object"),
        # Receivers are promised the shape the document states: every field, nothing else.
        (["BRAND", "deal.completed", "--data", "{}"], "agreedAmountMinor: Missing"),
        (
            ["BRAND", "deal.completed", "--data", json.dumps(_DEAL | {"extra": 1})],
            "extra: Unknown field",
        ),
        (
            ["BRAND", "deal.completed", "--data", json.dumps(_DEAL | {"status": "done"})],
            "status: Must be one of",
        ),
        (
            ["BRAND", "escrow.held", "--data", json.dumps(sample_data("deal.completed"))],
            "is not escrow.held data",
        ),
    ],
    ids=[
        "unknown-brand",
        "unknown-event",
        "invalid-json",
        "long-int",
        "array",
        "string",
        "null",
        "empty-data",
        "unknown-field",
        "not-a-status",
        "another-events-data",
    ],
)
def test_emit_refuses_bad_input_and_creates_nothing(
    app, runner, client, brand, write_key, args, message
):
    register(client, brand, write_key, ["deal.completed"])

    result = runner.invoke(args=["events", "emit", *[brand if a == "BRAND" else a for a in args]])

    assert result.exit_code != 0
    assert result.stdout == ""
    error = result.stderr.strip()
    assert "\n" not in error, error
    assert error.startswith("Error:"), error
    assert message in error, error
    assert counts(app) == (0, 0)


def test_emit_error_in_a_real_process(app, app_environ, brand):
    result = run_flask(app_environ, "events", "emit", brand, "deal.finished")

    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "deal.finished" in lines[0], result.stderr
    assert counts(app) == (0, 0)


def test_emit_says_the_sample_ids_are_samples_and_the_delivery_waits_for_a_worker(
    app, runner, client, brand, write_key
):
    """No worker runs in this test: the command says the delivery waits for one."""
    register(client, brand, write_key, ["deal.completed"])
    with app.app_context():  # what earlier tests' killed workers left registered
        for stale in Worker.all(connection=redis_connection(app)):
            stale.register_death()

    result = runner.invoke(args=["events", "emit", brand, "deal.completed"])

    assert result.exit_code == 0, result.output
    assert re.fullmatch(r"evt_\w+\n", result.stdout)
    notes = result.stderr
    assert "No --data: sent the catalogue's sample data for deal.completed" in notes
    assert "its ids are samples, not records of this brand" in notes
    assert "Queued 1 delivery." in notes
    assert "No webhook worker is running: the deliveries wait until one starts." in notes
    assert "`.venv/bin/flask --app app worker`" in notes


def test_emit_with_data_and_a_running_worker_says_only_what_it_queued(
    app, app_environ, runner, client, brand, write_key
):
    register(client, brand, write_key, ["deal.completed"])
    worker = WorkerProcess(app_environ)
    try:
        deadline = time.monotonic() + 20
        with app.app_context():
            while not Worker.all(connection=redis_connection(app)):
                assert time.monotonic() < deadline, worker.output()
                time.sleep(0.1)
        data = json.dumps(sample_data("deal.completed"))
        result = runner.invoke(args=["events", "emit", brand, "deal.completed", "--data", data])
    finally:
        worker.stop()
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == "Queued 1 delivery."


def test_emit_to_nobody_says_nothing_is_delivered(runner, brand):
    data = json.dumps(sample_data("escrow.held"))
    result = runner.invoke(args=["events", "emit", brand, "escrow.held", "--data", data])
    assert result.exit_code == 0
    assert "No active endpoint of this brand subscribes to escrow.held" in result.stderr


def test_emit_help_lists_every_event_name(runner):
    result = runner.invoke(args=["events", "emit", "--help"])
    assert result.exit_code == 0
    listed = result.output.split("EVENT_NAME is one of:")[1].split()
    assert listed == list(EVENT_NAMES)


def test_recover_prints_how_many_failures_it_queued_again(app, runner, brand, write_key, client):
    endpoint = call(
        client,
        brand,
        write_key,
        "POST",
        "webhook/register-endpoint",
        201,
        json={"url": "http://127.0.0.1:9/hooks", "events": ["deal.completed"]},
    )
    with app.app_context():
        failed = publish_event(brand_id=brand, name="deal.completed", data={}).delivery_ids[0]
        settle([failed], "failed")
        db.session.commit()
    since = "2020-01-01T00:00:00+00:00"
    too_old = runner.invoke(args=["events", "recover", brand, endpoint["id"], "--since", since])
    assert too_old.exit_code != 0 and "at most 14 days ago" in too_old.output
    recent = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 3600))
    result = runner.invoke(args=["events", "recover", brand, endpoint["id"], "--since", recent])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"1 failed delivery to {endpoint['id']} queued again, as new deliveries\n"
    )
    again = runner.invoke(args=["events", "recover", brand, endpoint["id"], "--since", recent])
    assert again.stdout == (
        f"0 failed deliveries to {endpoint['id']} in that window were left to send again\n"
    )
    quiet = ["events", "recover", brand, endpoint["id"], "--since", recent, "--quiet"]
    assert runner.invoke(args=quiet).stdout == "0\n"  # for a script: the number alone
    unknown = runner.invoke(args=["events", "recover", brand, "whe_nope", "--since", recent])
    assert unknown.exit_code != 0 and "whe_nope" in unknown.output


def wait_for_a_retry_in_an_hour(app, delivery_id: str) -> None:
    """The delivery's first attempt failed and its retry is an hour away (as the worker leaves
    it after a 500 with WEBHOOK_RETRY_SCHEDULE=3600)."""
    with app.app_context():
        wait_for_a_retry(
            [delivery_id], utcnow() + timedelta(hours=1), http_status=500, last_error="HTTP 500"
        )
        db.session.commit()


def test_retry_pending_says_how_many_it_made_due_now(app, app_environ, client, brand, write_key):
    """One line that says what was done, its count first; `--quiet`: the count alone."""
    endpoint = register(client, brand, write_key, ["deal.completed"])
    with app.app_context():
        published = [
            publish_event(brand_id=brand, name="deal.completed", data={"id": f"deal_{n}"})
            for n in range(3)
        ]
        db.session.commit()
    for event in published[:2]:
        wait_for_a_retry_in_an_hour(app, event.delivery_ids[0])
    retrying = call(client, brand, write_key, "GET", "webhook/fetch-deliveries?retrying=true")
    assert all(d["nextRetryAt"] > d["createdAt"] for d in retrying["deliveries"])

    result = run_flask(app_environ, "events", "retry-pending", brand, endpoint)

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"2 deliveries to {endpoint} waiting for a retry are due now\n"
    for delivery in deliveries(client, brand, write_key):
        assert delivery["nextRetryAt"] is None or delivery["nextRetryAt"] <= iso_now()
    again = run_flask(app_environ, "events", "retry-pending", brand, endpoint)
    assert (again.returncode, again.stdout) == (
        0,
        f"0 deliveries to {endpoint} were waiting for a retry: nothing to send sooner\n",
    )
    wait_for_a_retry_in_an_hour(app, published[2].delivery_ids[0])
    one = run_flask(app_environ, "events", "retry-pending", brand, endpoint)
    assert one.stdout == f"1 delivery to {endpoint} waiting for a retry is due now\n"
    quiet = run_flask(app_environ, "events", "retry-pending", "--quiet", brand, endpoint)
    assert (quiet.returncode, quiet.stdout) == (0, "0\n")


def test_retry_pending_of_an_unknown_brand_or_endpoint_is_a_one_line_error(
    app_environ, client, brand, write_key
):
    endpoint = register(client, brand, write_key, ["deal.completed"])
    for arguments, named in (
        (("brd_01jd3k7a9b1c3d5e7f9g1h3j5k", endpoint), "brd_01jd3k7a9b1c3d5e7f9g1h3j5k"),
        ((brand, "whe_01jd3kr7s9t1v3w5x7y9z1a3b5"), "whe_01jd3kr7s9t1v3w5x7y9z1a3b5"),
    ):
        result = run_flask(app_environ, "events", "retry-pending", *arguments)
        assert result.returncode != 0
        assert result.stdout == ""
        assert result.stderr.strip().count("\n") == 0 and named in result.stderr, result.stderr
    path = f"webhook/{endpoint}/update-endpoint"
    call(client, brand, write_key, "PATCH", path, json={"isActive": False})
    disabled = run_flask(app_environ, "events", "retry-pending", brand, endpoint)
    assert disabled.returncode != 0 and "disabled" in disabled.stderr


def iso_now() -> str:
    return utcnow().isoformat(timespec="milliseconds").replace("+00:00", "Z")
