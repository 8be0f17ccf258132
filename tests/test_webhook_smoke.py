"""First light: a registered endpoint receives a signed test ping from a real worker."""

from __future__ import annotations

import time

from tests.helpers import assert_success


def wait_for_status(client, brand, key, delivery_id, status, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        data = assert_success(
            client.get(
                f"/api/v1/brand/{brand}/webhook/deliveries/{delivery_id}",
                headers={"X-Api-Key": key},
            )
        )
        if data["status"] == status or time.monotonic() > deadline:
            return data
        time.sleep(0.05)


def test_test_ping_arrives_signed(client, brand, write_key, receiver, webhook_worker):
    registered = assert_success(
        client.post(
            f"/api/v1/brand/{brand}/webhook/register-endpoint",
            json={"url": receiver.url},
            headers={"X-Api-Key": write_key},
        ),
        201,
    )
    receiver.secrets = [registered["signingSecret"]]
    queued = assert_success(
        client.post(
            f"/api/v1/brand/{brand}/webhook/{registered['id']}/send-test",
            headers={"X-Api-Key": write_key},
        ),
        202,
    )
    [request] = receiver.wait_for(1)
    assert request.signature_valid
    assert request.delivery_id == queued["deliveryId"]
    assert request.json["type"] == "webhook.test"
    detail = wait_for_status(client, brand, write_key, queued["deliveryId"], "delivered")
    assert detail["status"] == "delivered", webhook_worker.output()
    assert detail["attempts"][0]["httpStatus"] == 200
