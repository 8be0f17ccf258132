"""`make schemathesis`: schemathesis, with every check on, against a real server of the demo brand.

It holds the OpenAPI document to what the server does: a request the document calls valid must
not be refused, one it calls invalid must be, and every answer must be one the document gives.

In order:

1. A scratch database and an empty Redis db, as the test suite takes them (`tests/backends.py`:
   `BRAND_TEST_BACKENDS` chooses the machine's servers or embedded ones), dropped at the end.
2. `flask --app app db upgrade` and `flask --app app demo seed`, as `make run` does.
3. gunicorn, as in production, on a free 127.0.0.1 port, with the per-key rate limits far above
   anything the run sends (a 429 would only hide what a request would have got).
4. Through the API itself: a write key from the demo brand's bootstrap token, a second key for
   revoke-key to revoke, three webhook endpoints (one the run uses, one for update-endpoint to
   change, one for delete-endpoint to delete), a test delivery and a postback; every id goes to
   schemathesis (scripts/schemathesis.toml) beside the demo brand's campaign, deal, link,
   placement, hold and oldest event.
5. `schemathesis run` with every check on; its exit status is this script's.

Extra arguments are passed to `schemathesis run` (`make schemathesis ST_ARGS="--max-examples 5"`).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from tests.backends import open_backends  # noqa: E402 - needs the repo root on sys.path
from tests.server_process import ServerProcess  # noqa: E402

CONFIG = REPO / "scripts" / "schemathesis.toml"
# Far above what the run sends, so schemathesis never meets a 429 (CONTRACT 9.1's settings).
UNTHROTTLED = "999999999/hour"
# A receiver nobody listens on: no worker runs, so deliveries stay pending and nothing is sent.
RECEIVER_URL = "http://127.0.0.1:9/schemathesis"
# Enough to find what a rule gets wrong, within CI's budget (about 3 minutes on two cores).
# No `--checks`: schemathesis runs every check by default, and a `--checks all` here would
# override the one check scripts/schemathesis.toml turns off for one operation.
DEFAULT_ARGUMENTS = (
    "--max-examples",
    "50",
    "--seed",
    "20261122",
    "--workers",
    "1",
    "--request-timeout",
    "15",
    "--generation-database",
    "none",
    "--no-color",
)


def main(extra_arguments: list[str]) -> int:
    backends = open_backends()
    try:
        environ = _server_environ(backends.database_url, backends.redis_url)
        _flask(environ, "db", "upgrade")
        demo = json.loads(_flask(environ, "demo", "seed"))
        server = ServerProcess(environ, workers=2, threads=4)
        try:
            ids = _records(server.url, demo["brandId"], demo["bootstrapToken"])
            return _schemathesis(server.url, ids, extra_arguments)
        finally:
            server.stop()
    finally:
        backends.close()


def _server_environ(database_url: str, redis_url: str) -> dict[str, str]:
    return {
        "APP_ENV": "development",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "SECRET_KEY": secrets.token_urlsafe(32),
        "ENCRYPTION_KEY": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        "RATE_LIMIT_PER_KEY": UNTHROTTLED,
        "POSTBACK_RATE_LIMIT_PER_KEY": UNTHROTTLED,
        "PATH": os.environ["PATH"],
    }


def _flask(environ: dict[str, str], *arguments: str) -> str:
    completed = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "app", *arguments],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"flask {' '.join(arguments)} failed:\n{completed.stderr}")
    return completed.stdout


class _Api:
    def __init__(self, url: str, brand_id: str) -> None:
        self.base = f"{url}/api/v1/brand/{brand_id}"
        self.headers: dict[str, str] = {}

    def call(self, method: str, path: str, expected: int, **options) -> dict:
        headers = self.headers | options.pop("headers", {})
        response = requests.request(
            method, self.base + path, headers=headers, timeout=30, **options
        )
        if response.status_code != expected:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text}")
        return response.json()["data"]


def _records(url: str, brand_id: str, bootstrap_token: str) -> dict[str, str]:
    """The ids schemathesis puts in paths: the demo brand's records, and ones made here."""
    api = _Api(url, brand_id)
    both = {"name": "schemathesis", "scopes": ["read", "write"]}
    key = api.call(
        "POST",
        "/api-key/create-key",
        201,
        json=both,
        headers={"X-Service-Bootstrap-Token": bootstrap_token},
    )
    api.headers = {"X-Api-Key": key["secret"]}
    revoked = api.call("POST", "/api-key/rotate-key", 201, json={"name": "to revoke"})

    def endpoint(description: str) -> str:
        body = {"url": RECEIVER_URL, "description": description}
        return api.call("POST", "/webhook/register-endpoint", 201, json=body)["id"]

    endpoint_id = endpoint("schemathesis")
    delivery = api.call("POST", f"/webhook/{endpoint_id}/send-test", 202)
    conversion = api.call(
        "POST",
        "/conversion/record-postback",
        201,
        json={"eventType": "purchase"},
        headers={"Idempotency-Key": f"schemathesis-{secrets.token_hex(8)}"},
    )

    def first(path: str, listed: str) -> str:
        return api.call("GET", path, 200)[listed][0]["id"]

    return {
        "API_KEY": key["secret"],
        "BOOTSTRAP_TOKEN": bootstrap_token,
        "BRAND_ID": brand_id,
        "KEY_ID": revoked["id"],
        "ENDPOINT_ID": endpoint_id,
        "UPDATED_ENDPOINT_ID": endpoint("updated by schemathesis"),
        "DELETED_ENDPOINT_ID": endpoint("deleted by schemathesis"),
        "DELIVERY_ID": delivery["deliveryId"],
        "CONVERSION_ID": conversion["conversionId"],
        "CAMPAIGN_ID": first("/campaigns", "campaigns"),
        "DEAL_ID": first("/deals", "deals"),
        "LINK_ID": first("/tracked-link/fetch-links", "links"),
        "PLACEMENT_ID": first("/placement/fetch-placements", "placements"),
        "HOLD_ID": first("/escrow/fetch-holds", "holds"),
        "EVENT_ID": api.call("GET", "/event/fetch-events", 200)["events"][0]["id"],
    }


def _schemathesis(url: str, ids: dict[str, str], extra_arguments: list[str]) -> int:
    environ = os.environ | {f"SCHEMATHESIS_{name}": value for name, value in ids.items()}
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(CONFIG),
        "run",
        f"{url}/api/v1/openapi.json",
        *DEFAULT_ARGUMENTS,
        *extra_arguments,
    ]
    return subprocess.run(command, env=environ, cwd=REPO, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
