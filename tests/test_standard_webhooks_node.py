"""Another language's Standard Webhooks library than Python's verifies real deliveries with the
signing secret as issued (CONTRACT 12.1): the npm `standardwebhooks` package under Node.js,
installed at test time (tests/node.py), against deliveries a real worker made to a real receiver.
The README's and docs/webhooks.md's JavaScript snippets are run as written."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from tests import test_webhook_delivery as delivery
from tests.node import (
    NODE_TESTS_ENV,
    STANDARD_WEBHOOKS_NPM,
    install_npm_package,
    missing_node,
    node,
    require,
)
from tests.receiver import Received
from tests.test_webhook_delivery import publish
from tests.test_webhook_signatures import made_before, older_secret

api = delivery.api
workers = delivery.workers
worker = delivery.worker

ROOT = Path(__file__).resolve().parent.parent
VERIFIED = re.compile(r"evt_\w+")

# Verifies each case with the package as its README shows, the secret as given (or, with
# `raw`, as bytes: an older secret); prints the event id or the error, one per case.
_VERIFY = """
import { readFileSync } from "node:fs";
import { Webhook } from "standardwebhooks";

const results = [];
for (const c of JSON.parse(readFileSync(0, "utf8"))) {
  try {
    const wh = c.raw ? new Webhook(c.secret, { format: "raw" }) : new Webhook(c.secret);
    results.push(wh.verify(Buffer.from(c.body, "base64"), c.headers).id);
  } catch (error) {
    results.push(`${error.name}: ${error.message}`);
  }
}
console.log(JSON.stringify(results));
"""


@pytest.fixture(scope="session")
def standard_webhooks_js(tmp_path_factory) -> Path:
    """A directory whose node_modules holds the pinned npm package (outside the repository)."""
    require(missing_node())
    directory = tmp_path_factory.mktemp("npm-standardwebhooks")
    require(install_npm_package(STANDARD_WEBHOOKS_NPM, directory))
    return directory


def run_node(directory: Path, script: str, cases: list[dict]) -> list[str]:
    """`script` as an ES module in `directory` (so it imports the package installed there),
    the cases on its stdin; what it printed, as JSON."""
    path = directory / f"verify-{uuid.uuid4().hex}.mjs"
    path.write_text(script)
    result = subprocess.run(
        [node(), str(path)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=directory,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def case(secret: str, request: Received, *, body: bytes | None = None, raw: bool = False) -> dict:
    """One delivery to verify: its body byte for byte, its headers as received."""
    return {
        "secret": secret,
        "raw": raw,
        "body": base64.b64encode(request.body if body is None else body).decode(),
        "headers": request.headers,
    }


def tampered(request: Received) -> bytes:
    changed = request.body.replace(b'"type":"deal.completed"', b'"type":"deal.cancelled"')
    assert changed != request.body
    return changed


def test_the_npm_package_verifies_real_deliveries_with_the_secret_as_issued(
    app, api, brand, receiver, worker, standard_webhooks_js
):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    secret = endpoint["signingSecret"]
    published = publish(app, brand, ("deal.completed", {"note": "Ọjà"}), ("deal.completed", {}))
    received = receiver.wait_for(2)
    # A rotation with an overlap: the delivery after it verifies with either secret alone.
    rotated = api.call(
        "POST", f"webhook/{endpoint['id']}/rotate-secret", json={"overlapSeconds": 3600}
    )
    new_secret = rotated["signingSecret"]
    [overlapped] = publish(app, brand, ("deal.completed", {"n": 3}))
    *_, during = receiver.wait_for(3)

    someone_else = "whsec_" + base64.b64encode(bytes(32)).decode()
    cases = [case(secret, request) for request in received] + [
        case(secret, during),
        case(new_secret, during),
        case(someone_else, received[0]),
        case(secret, received[0], body=tampered(received[0])),
        case(secret, received[0], raw=True),  # the string as the key: not how it signs now
    ]
    results = run_node(standard_webhooks_js, _VERIFY, cases)
    assert results[:2] == [request.json["id"] for request in received], results
    assert set(results[:2]) == {event_id for event_id, _ in published}
    assert results[2:4] == [overlapped[0], overlapped[0]], results
    assert results[4:] == ["WebhookVerificationError: No matching signature found"] * 3, results


def test_an_older_secret_verifies_in_node_as_bytes_as_the_docs_say(
    app, api, brand, receiver, worker, standard_webhooks_js
):
    endpoint = api.register(receiver.url, events=["deal.completed"])
    older = older_secret()
    made_before(app, endpoint["id"], older)
    [(event_id, _)] = publish(app, brand, ("deal.completed", {"n": 1}))
    [request] = receiver.wait_for(1)
    results = run_node(
        standard_webhooks_js, _VERIFY, [case(older, request, raw=True), case(older, request)]
    )
    assert results[0] == event_id
    assert not VERIFIED.fullmatch(results[1]), results  # as a string it is read as base64


def _library_block(document: str, heading: str) -> str:
    section = (ROOT / document).read_text().split(heading, 1)[1]
    return re.search(r"```js\n(.*?)```", section, re.S).group(1)


@pytest.mark.parametrize(
    ("document", "heading"),
    [
        ("README.md", "### Verifying deliveries with a Standard Webhooks library"),
        ("docs/webhooks.md", "### Verifying with a Standard Webhooks library"),
    ],
)
def test_the_documents_javascript_verifies_a_real_delivery(
    app, api, brand, receiver, worker, standard_webhooks_js, document, heading
):
    """The snippet as written: its imports at the top of a module, the rest in a function of
    `secret`, `rawBody` and `headers` (the names it uses) returning its `event`."""
    block = _library_block(document, heading)
    imports = [line for line in block.splitlines() if line.startswith("import ")]
    rest = [line for line in block.splitlines() if not line.startswith("import ")]
    assert imports == ['import { Webhook } from "standardwebhooks";'], block
    assert "new Webhook(secret)" in block and "wh.verify(rawBody, headers)" in block
    script = "\n".join(
        [
            *imports,
            'import { readFileSync } from "node:fs";',
            "function verify(secret, rawBody, headers) {",
            *rest,
            "  return event;",
            "}",
            "const results = [];",
            'for (const c of JSON.parse(readFileSync(0, "utf8"))) {',
            "  try {",
            '    results.push(verify(c.secret, Buffer.from(c.body, "base64"), c.headers).id);',
            "  } catch (error) {",
            "    results.push(`${error.name}: ${error.message}`);",
            "  }",
            "}",
            "console.log(JSON.stringify(results));",
        ]
    )
    endpoint = api.register(receiver.url, events=["deal.completed"])
    secret = endpoint["signingSecret"]
    [(event_id, _)] = publish(app, brand, ("deal.completed", {"note": "Ọjà"}))
    [request] = receiver.wait_for(1)
    results = run_node(
        standard_webhooks_js,
        script,
        [case(secret, request), case(secret, request, body=tampered(request))],
    )
    assert results == [event_id, "WebhookVerificationError: No matching signature found"]


def test_without_npm_s_registry_the_node_tests_fail_under_required(tmp_path, monkeypatch):
    """A new machine that cannot reach npm's registry: a clear reason, which fails the run
    under BRAND_NODE_TESTS=required (CI) and skips it elsewhere."""
    require(missing_node())
    unreachable = {"npm_config_registry": "http://127.0.0.1:9/", "npm_config_cache": str(tmp_path)}
    problem = install_npm_package(STANDARD_WEBHOOKS_NPM, tmp_path / "modules", env=unreachable)
    assert problem is not None
    assert problem.startswith(f"npm could not install {STANDARD_WEBHOOKS_NPM} from its registry")
    assert "ECONNREFUSED" in problem
    monkeypatch.setenv(NODE_TESTS_ENV, "required")
    with pytest.raises(pytest.fail.Exception, match=f"{NODE_TESTS_ENV}=required but npm could"):
        require(problem)
    monkeypatch.delenv(NODE_TESTS_ENV)
    with pytest.raises(pytest.skip.Exception, match="need node, npm and npm's registry"):
        require(problem)
