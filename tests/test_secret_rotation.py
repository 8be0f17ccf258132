"""Rotating ENCRYPTION_KEY (docs/operations.md): prepend a new key, `flask secrets reencrypt`,
drop the old key; every signing secret still signs, and the deliveries still verify."""

from __future__ import annotations

from cryptography.fernet import Fernet
from sqlalchemy import update

from app import create_app
from extensions import db
from models import WebhookEndpoint
from services.secret_box import secret_box
from tests.helpers import assert_success
from tests.worker_process import WorkerProcess


def register(client, brand, key, url) -> dict:
    return assert_success(
        client.post(
            f"/api/v1/brand/{brand}/webhook/register-endpoint",
            json={"url": url},
            headers={"X-Api-Key": key},
        ),
        201,
    )


def stored_secrets(app, endpoint_id: str) -> tuple[str, str | None]:
    with app.app_context():
        endpoint = db.session.get(WebhookEndpoint, endpoint_id)
        box = secret_box()
        previous = endpoint.previous_secret_ciphertext
        return box.decrypt(endpoint.secret_ciphertext), previous and box.decrypt(previous)


def test_a_new_key_takes_over_every_secret_and_deliveries_still_verify(
    app, app_environ, client, brand, write_key, receiver
):
    old_key = app_environ["ENCRYPTION_KEY"]
    new_key = Fernet.generate_key().decode()
    plain = register(client, brand, write_key, receiver.url)
    overlapping = register(client, brand, write_key, "https://hooks.example.com/b")
    rotated = assert_success(
        client.post(
            f"/api/v1/brand/{brand}/webhook/{overlapping['id']}/rotate-secret",
            json={"overlapSeconds": 3600},
            headers={"X-Api-Key": write_key},
        )
    )

    both = create_app({**app_environ, "ENCRYPTION_KEY": f"{new_key},{old_key}"})
    result = both.test_cli_runner().invoke(args=["secrets", "reencrypt"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "2"

    only_new = create_app({**app_environ, "ENCRYPTION_KEY": new_key})
    assert stored_secrets(only_new, plain["id"]) == (plain["signingSecret"], None)
    assert stored_secrets(only_new, overlapping["id"]) == (
        rotated["signingSecret"],
        overlapping["signingSecret"],
    )

    worker = WorkerProcess(app_environ, ENCRYPTION_KEY=new_key)
    try:
        receiver.secrets = [plain["signingSecret"]]
        sent = only_new.test_client().post(
            f"/api/v1/brand/{brand}/webhook/{plain['id']}/send-test",
            headers={"X-Api-Key": write_key},
        )
        assert sent.status_code == 202
        [request] = receiver.wait_for(1)
        assert request.signature_valid
    finally:
        worker.stop()


def test_a_secret_no_key_opens_is_named_and_left_alone(app, app_environ, client, brand, write_key):
    readable = register(client, brand, write_key, "https://hooks.example.com/a")
    lost = register(client, brand, write_key, "https://hooks.example.com/b")
    foreign = Fernet(Fernet.generate_key()).encrypt(b"whsec_lost").decode()
    with app.app_context():
        db.session.execute(
            update(WebhookEndpoint)
            .where(WebhookEndpoint.id == lost["id"])
            .values(secret_ciphertext=foreign)
        )
        db.session.commit()

    new_key = Fernet.generate_key().decode()
    both = create_app(
        {**app_environ, "ENCRYPTION_KEY": f"{new_key},{app_environ['ENCRYPTION_KEY']}"}
    )
    result = both.test_cli_runner().invoke(args=["secrets", "reencrypt"])
    assert result.exit_code == 1
    assert result.stdout.strip() == "1"
    assert lost["id"] in result.stderr and "rotate" in result.stderr
    assert "whsec_" not in result.output
    only_new = create_app({**app_environ, "ENCRYPTION_KEY": new_key})
    assert stored_secrets(only_new, readable["id"])[0] == readable["signingSecret"]
    with app.app_context():
        assert db.session.get(WebhookEndpoint, lost["id"]).secret_ciphertext == foreign
