"""`GET /metrics` (CONTRACT 9.2): Prometheus text, its token, the backlog read from the database,
and counters that add up across gunicorn's workers and the delivery worker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from app import create_app
from tests.bulk_jobs import run_bulk_jobs
from tests.helpers import assert_error, assert_success
from tests.receiver import Reply
from tests.server_process import ServerProcess
from tests.worker_process import WorkerProcess


def samples(text: str) -> list:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    return sum(
        sample.value
        for sample in samples(text)
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def test_metrics_are_prometheus_text_that_counts_requests(client, brand, read_key):
    before = client.get("/metrics").get_data(as_text=True)
    for _ in range(3):
        assert_success(
            client.get(f"/api/v1/brand/{brand}/api-key/fetch-keys", headers={"X-Api-Key": read_key})
        )
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    after = response.get_data(as_text=True)
    counted = {"operation": "fetchKeys", "method": "GET", "status": "200"}
    assert (
        value(after, "brand_api_http_requests_total", **counted)
        - value(before, "brand_api_http_requests_total", **counted)
        == 3
    )
    assert value(after, "brand_api_http_request_duration_seconds_count", operation="fetchKeys")
    assert value(after, "brand_api_database_up") == 1


def test_a_metrics_token_is_required_when_set(app_environ):
    client = create_app({**app_environ, "METRICS_TOKEN": "scrape-me-please"}).test_client()
    assert_error(client.get("/metrics"), 401, "UNAUTHORIZED")
    wrong = client.get("/metrics", headers={"Authorization": "Bearer scrape-me-not"})
    assert_error(wrong, 401, "UNAUTHORIZED")
    assert "scrape-me" not in wrong.get_data(as_text=True)
    right = client.get("/metrics", headers={"Authorization": "Bearer scrape-me-please"})
    assert right.status_code == 200
    assert "brand_api_http_requests_total" in right.get_data(as_text=True)


def test_the_backlog_gauges_read_the_database(client, brand, write_key, runner):
    # No worker runs in this test: what is emitted stays pending, and no loop says how late.
    registered = assert_success(
        client.post(
            f"/api/v1/brand/{brand}/webhook/register-endpoint",
            json={"url": "https://hooks.example.com/in"},
            headers={"X-Api-Key": write_key},
        ),
        201,
    )
    for _ in range(4):
        result = runner.invoke(args=["events", "emit", brand, "deal.completed"])
        assert result.exit_code == 0, result.output
    time.sleep(1.1)
    text = client.get("/metrics").get_data(as_text=True)
    assert value(text, "brand_api_webhook_deliveries_pending") == 4
    assert value(text, "brand_api_webhook_oldest_due_delivery_age_seconds") == 0
    assert value(text, "brand_api_webhook_endpoints_disabled") == 0

    assert_success(
        client.patch(
            f"/api/v1/brand/{brand}/webhook/{registered['id']}/update-endpoint",
            json={"isActive": False},
            headers={"X-Api-Key": write_key},
        )
    )
    run_bulk_jobs(client.application)  # ends them, as a worker would
    text = client.get("/metrics").get_data(as_text=True)
    assert value(text, "brand_api_webhook_endpoints_disabled") == 1
    assert value(text, "brand_api_webhook_deliveries_pending") == 0


@pytest.fixture
def metrics_dir(tmp_path) -> Path:
    directory = tmp_path / "metrics"
    directory.mkdir()
    return directory


def test_counts_add_up_across_gunicorn_workers_and_the_delivery_worker(
    app_environ, brand, write_key, receiver, metrics_dir
):
    """Two gunicorn servers of one worker each (which process answers is chosen here, not by
    the accept race) and a delivery worker, all writing to one metrics directory, as the
    processes of one machine do: one scrape counts them all."""
    shared = {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    first = ServerProcess(app_environ, workers=1, threads=4, **shared)
    second = ServerProcess(app_environ, workers=1, threads=4, **shared)
    worker = WorkerProcess(app_environ, **shared)
    try:
        headers = {"X-Api-Key": write_key}
        for server in (first, second):
            for _ in range(20):
                answer = requests.get(
                    f"{server.url}/api/v1/brand/{brand}/api-key/fetch-keys",
                    headers=headers,
                    timeout=10,
                )
                assert answer.status_code == 200

        api = f"{second.url}/api/v1/brand/{brand}"
        endpoint = requests.post(
            f"{api}/webhook/register-endpoint",
            json={"url": receiver.url},
            headers=headers,
            timeout=10,
        ).json()["data"]
        receiver.reply_with(Reply(status=500))  # one failed attempt, then its retry succeeds
        for _ in range(2):
            sent = requests.post(
                f"{api}/webhook/{endpoint['id']}/send-test", headers=headers, timeout=10
            )
            assert sent.status_code == 202
        receiver.wait_for(3)

        deadline = time.monotonic() + 20
        while True:
            text = requests.get(f"{first.url}/metrics", timeout=10).text
            if value(text, "brand_api_webhook_attempts_total") >= 3:
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
    finally:
        worker.stop()
        first.stop()
        second.stop()

    assert value(text, "brand_api_http_requests_total", operation="fetchKeys", status="200") == 40
    assert value(text, "brand_api_http_requests_total", operation="registerWebhookEndpoint") == 1
    assert value(text, "brand_api_webhook_attempts_total", outcome="succeeded") == 2
    assert value(text, "brand_api_webhook_attempts_total", outcome="http_error") == 1
    assert value(text, "brand_api_webhook_attempt_duration_seconds_count") == 3
