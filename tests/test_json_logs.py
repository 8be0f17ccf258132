"""`LOG_FORMAT=json`: a whole run of gunicorn and the delivery worker logs one JSON object per
line, requests and attempts carry their ids, and no secret the run created is anywhere in it."""

from __future__ import annotations

import json
import time

import requests

from tests.receiver import Reply
from tests.server_process import ServerProcess
from tests.test_secrets_never_leak import fragments
from tests.worker_process import WorkerProcess


def test_a_runs_json_logs_parse_carry_their_ids_and_hold_no_secret(
    app_environ, brand, make_bootstrap_token, receiver
):
    server = ServerProcess(app_environ, workers=2, threads=4, LOG_FORMAT="json")
    worker = WorkerProcess(app_environ, LOG_FORMAT="json")
    token = make_bootstrap_token(brand)
    secrets_created = [token]
    try:
        api = f"{server.url}/api/v1/brand/{brand}"
        created = requests.post(
            f"{api}/api-key/create-key",
            json={"name": "logs", "scopes": ["read", "write"]},
            headers={"X-Service-Bootstrap-Token": token},
            timeout=10,
        ).json()["data"]
        key = created["secret"]
        headers = {"X-Api-Key": key}
        rotated = requests.post(
            f"{api}/api-key/rotate-key",
            json={"name": "logs 2", "scopes": ["read", "write"]},
            headers=headers,
            timeout=10,
        ).json()["data"]
        secrets_created += [key, rotated["secret"]]
        headers = {"X-Api-Key": rotated["secret"]}

        registered = requests.post(
            f"{api}/webhook/register-endpoint",
            json={"url": receiver.url},
            headers=headers,
            timeout=10,
        )
        assert registered.status_code == 201, registered.text
        endpoint = registered.json()["data"]
        new_secret = requests.post(
            f"{api}/webhook/{endpoint['id']}/rotate-secret",
            json={"overlapSeconds": 3600},
            headers=headers,
            timeout=10,
        ).json()["data"]["signingSecret"]
        secrets_created += [endpoint["signingSecret"], new_secret]

        receiver.reply_with(Reply(status=500))  # a failed attempt is logged at INFO
        sent = requests.post(
            f"{api}/webhook/{endpoint['id']}/send-test", headers=headers, timeout=10
        )
        delivery_id = sent.json()["data"]["deliveryId"]
        posted = requests.post(
            f"{api}/conversion/record-postback",
            json={"eventType": "purchase"},
            headers={**headers, "Idempotency-Key": "json-logs-order-0001"},
            timeout=10,
        )
        assert posted.status_code == 201
        # Wrong and revoked credentials: errors that must not echo them.
        requests.get(f"{api}/api-key/fetch-keys", headers={"X-Api-Key": key[:-1] + "x"}, timeout=10)
        requests.get(f"{api}/api-key/fetch-keys", headers={"X-Api-Key": key}, timeout=10)
        receiver.wait_for(2)
        time.sleep(0.5)  # the attempts' records and their lines
    finally:
        worker.stop()
        server.stop()

    lines = [line for line in (server.output() + worker.output()).splitlines() if line.strip()]
    objects = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(line) for line in objects)

    everything = "\n".join(lines)
    for secret in secrets_created:
        for fragment in fragments(secret):
            assert fragment not in everything

    by_operation = {
        line["operation"]: line for line in objects if line["logger"] == "brand_api.access"
    }
    created_line = by_operation["createKey"]
    assert created_line["status"] == 201
    assert created_line["brand_id"] == brand
    assert created_line["request_id"].startswith("req_")
    assert created_line["duration_ms"] >= 0
    postback_line = by_operation["recordPostback"]
    assert postback_line["key_id"] == rotated["id"]
    assert postback_line["status"] == 201

    # The test ping and the postback's delivery are in flight together: either gets the 500.
    [failed_attempt] = [line for line in objects if line.get("outcome") == "http_error"]
    assert failed_attempt["endpoint_id"] == endpoint["id"]
    assert failed_attempt["event_name"] in ("webhook.test", "conversion.recorded")
    if failed_attempt["event_name"] == "webhook.test":
        assert failed_attempt["delivery_id"] == delivery_id
    assert failed_attempt["delivery_id"].startswith("whd_")
    assert failed_attempt["http_status"] == 500
    assert failed_attempt["attempt"] == 1
