"""Bad input, the way a fuzzer sends it, against a real gunicorn server: every route that takes a
body (found from the app's own route table, so a new route is covered without a word here)
answers 4xx, never 500, and the log gets one line per request, never a traceback.

What PostgreSQL cannot store (NUL, a lone UTF-16 surrogate, NaN/Infinity/1e400) and bodies nested
beyond the limit are refused where the body is parsed: 400 `VALIDATION_ERROR` naming the field
(or `body`), nothing stored, and an `Idempotency-Key` not kept.

The dashboard gets the same corpus in every path segment, query parameter and form field of
every route (found from the route table, its templates and its views): never a 500.
"""

from __future__ import annotations

import json
import re
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from app import create_app
from blueprints.api import API_PREFIX
from blueprints.api.operations import MAX_BODY_DEPTH
from tests.dashboard import sign_in
from tests.helpers import assert_error, assert_success
from tests.server_process import ServerProcess

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
_CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"')
_FORM_FIELD = re.compile(r'name="([A-Za-z_]+)"')
_PATH_ARGUMENT = re.compile(r"<(?:[^:<>]+:)?([a-z_]+)>")
DESTRUCTIVE = re.compile(r"revoke|delete|remove|sign_out|erase")

# What PostgreSQL cannot store: refused with 400 naming the field, wherever it is.
UNSTORABLE_STRINGS = {
    "nul": "a\x00b",
    "lone high surrogate": "\ud800",
    "lone low surrogate": "x\udfffy",
}
NON_FINITE_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]
# Odd but storable, or refused by a field's own rule: any 4xx or a success, never a 500.
ODD_STRINGS = {
    "control characters": "a\x01\x1b[31m\x7f\x9f",
    "line breaks": "a\r\nSet-Cookie: x=1\r\n\r\n",
    "bidi and zero-width": "\u202eabc\u200b\ufeff",
    "astral": "\U0001f600" * 50,
    "long": "x" * 5000,
    "empty": "",
    "spaces": " \u3000 ",
    "markup": "<script>alert(1)</script>'\"",
}
NESTED_ARRAYS = "[" * 400 + "]" * 400  # 800 bytes: once a 500 and a 116 KB traceback
NESTED_OBJECTS = '{"a":' * 400 + "1" + "}" * 400
GENERIC_BODIES: dict[str, tuple[bytes | str, str]] = {
    "nested arrays": (NESTED_ARRAYS, "application/json"),
    "nested objects": (NESTED_OBJECTS, "application/json"),
    "unbalanced brackets": ("[" * 60000, "application/json"),
    "nested under a key": ('{"name": ' + "[" * 100 + "]" * 100 + "}", "application/json"),
    "NaN": ('{"name": NaN}', "application/json"),
    "1e400": ('{"valueMinor": 1e400}', "application/json"),
    "a lone surrogate": ('{"name": "\\ud800"}', "application/json"),
    "NUL": ('{"name": "a\\u0000"}', "application/json"),
    "huge integer": ('{"valueMinor": 1' + "0" * 5000 + "}", "application/json"),
    "invalid UTF-8": (b'{"name": "\xff\xfe"}', "application/json"),
    "UTF-8 encoded surrogate": (b'{"name": "\xed\xa0\x80"}', "application/json"),
    "array": ("[1, 2]", "application/json"),
    "null": ("null", "application/json"),
    "string": ('"x"', "application/json"),
    "not JSON": ("name=x&scopes=read", "application/json"),
    "form content type": ("name=x&scopes=read", "application/x-www-form-urlencoded"),
    "text content type": ('{"name": "x"}', "text/plain"),
    "multipart": (
        '--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nx\r\n--b--\r\n',
        "multipart/form-data; boundary=b",
    ),
    "XML": ("<name>x</name>", "application/xml"),
    "oversized": ('{"name": "' + "x" * 70_000 + '"}', "application/json"),
}


@dataclass
class Answer:
    label: str
    status: int
    body: str

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@pytest.fixture(scope="module")
def server(app, app_environ) -> Iterator[ServerProcess]:
    process = ServerProcess(app_environ)
    yield process
    process.stop()


@pytest.fixture
def world(server, brand, make_key, make_bootstrap_token, write_key):
    """Real records for every path argument, so a body that got through would change them."""
    api = requests.Session()
    api.headers["X-Api-Key"] = write_key
    base = f"{server.url}{API_PREFIX}/brand/{brand}"
    endpoint = api.post(
        f"{base}/webhook/register-endpoint",
        json={"url": "https://hooks.brand-example.invalid/x", "events": ["webhook.test"]},
    ).json()["data"]
    delivery = api.post(f"{base}/webhook/{endpoint['id']}/send-test").json()["data"]
    event_id = api.get(f"{base}/webhook/deliveries/{delivery['deliveryId']}").json()["data"][
        "eventId"
    ]
    victim_key = api.post(f"{base}/api-key/rotate-key", json={"name": "victim"}).json()["data"]
    return {
        "brand_id": brand,
        "endpoint_id": endpoint["id"],
        "delivery_id": delivery["deliveryId"],
        "event_id": event_id,
        "subject": f"endpoint:{endpoint['id']}",  # the test ping's subject
        "key_id": victim_key["id"],
        "write_key": write_key,
        "bootstrap_token": make_bootstrap_token(brand),
        "api": api,
        "base": base,
    }


def body_routes(app) -> list:
    """Every route that takes a request body, API and dashboard, the destructive ones last."""
    rules = [
        rule
        for rule in app.url_map.iter_rules()
        if rule.methods & {"POST", "PUT", "PATCH", "DELETE"}
    ]
    return sorted(rules, key=lambda rule: (bool(DESTRUCTIVE.search(rule.endpoint)), rule.rule))


def fill(rule, world: dict) -> str:
    return _PATH_ARGUMENT.sub(lambda m: world[m[1]], rule.rule)


def send(
    server, method: str, path: str, *, data, content_type: str = "application/json", headers=None
) -> Answer:
    response = requests.request(
        method,
        f"{server.url}{path}",
        data=data.encode() if isinstance(data, str) else data,
        headers={"Content-Type": content_type, **(headers or {})},
        timeout=30,
        allow_redirects=False,
    )
    return Answer(f"{method} {path}", response.status_code, response.text)


def api_headers(world: dict, path: str) -> dict[str, str]:
    if path.endswith("/create-key"):
        return {"X-Service-Bootstrap-Token": world["bootstrap_token"]}
    return {"X-Api-Key": world["write_key"], "Idempotency-Key": f"fuzz-{uuid.uuid4().hex}"}


def sample_bodies(app) -> dict[str, dict]:
    """operationId -> a body built from the examples the OpenAPI document gives its fields."""
    document = app.test_client().get(f"{API_PREFIX}/openapi.json").get_json()
    schemas = document["components"]["schemas"]
    samples = {}
    for operations in document["paths"].values():
        for operation in operations.values():
            if not isinstance(operation, dict) or "requestBody" not in operation:
                continue
            reference = operation["requestBody"]["content"]["application/json"]["schema"]
            properties = schemas[reference["$ref"].rsplit("/", 1)[-1]]["properties"]
            samples[operation["operationId"]] = {
                name: spec["example"] for name, spec in properties.items() if "example" in spec
            }
    return samples


def leaves(value, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, (*path, index))
    else:
        yield path


def replaced(body: dict, path: tuple, value) -> dict:
    copy = json.loads(json.dumps(body))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return copy


def leaf_variants(body: dict) -> Iterator[tuple[str, str, str]]:
    """(label, JSON text, field path) for each leaf replaced by what cannot be stored."""
    for path in leaves(body):
        field = ".".join(str(step) for step in path)
        for label, text in UNSTORABLE_STRINGS.items():
            yield label, json.dumps(replaced(body, path, text)), field
        for token in NON_FINITE_NUMBERS:
            marked = json.dumps(replaced(body, path, "\x1fHERE\x1f"))
            yield token, marked.replace('"\\u001fHERE\\u001f"', token), field
    holders = {(), *(path[:-1] for path in leaves(body))}
    for path in sorted(holders, key=len):
        target = body
        for step in path:
            target = target[step]
        if isinstance(target, dict):
            for key in ("k\x00", "\ud800"):
                text = json.dumps(replaced(body, (*path, key), 1) if path else body | {key: 1})
                yield "unstorable key", text, ".".join(str(step) for step in path) or "body"


def api_routes(app) -> Iterator[tuple[str, str, dict | None]]:
    """(method, path, sample body or None) of every API route that takes a body."""
    samples = sample_bodies(app)
    for rule in body_routes(app):
        if rule.rule.startswith(API_PREFIX):
            operation = getattr(app.view_functions[rule.endpoint], "operation", None)
            method = sorted(rule.methods & {"POST", "PUT", "PATCH", "DELETE"})[0]
            yield method, rule, samples.get(operation.operation_id) if operation else None


def test_what_cannot_be_stored_is_a_400_naming_its_field_on_every_route(app, server, world):
    before = stored_records(world)
    refusals: list[tuple[Answer, str]] = []  # (answer, the field it must name)
    for method, rule, sample in api_routes(app):
        if sample is None:
            continue  # a route that reads no body: the corpus below
        path = fill(rule, world)
        variants = [*leaf_variants(sample)] + [
            (label, body, "body")
            for label, (body, _) in GENERIC_BODIES.items()
            if label.startswith("nested")
        ]
        for label, text, field in variants:
            answer = send(server, method, path, data=text, headers=api_headers(world, path))
            answer.label += f" [{label} at {field}]"
            refusals.append((answer, field))

    assert len(refusals) > 100, "every route that reads a body got the corpus"
    for answer, field in refusals:
        body = answer.json()
        assert answer.status == 400, (answer.label, answer.status, answer.body[:300])
        assert body["errorCode"] == "VALIDATION_ERROR", answer.label
        assert field in body["errors"], (answer.label, body["errors"])
    assert stored_records(world) == before
    assert_log_has_one_line_per_request(server)


def test_the_corpus_gets_no_500_on_any_api_route_that_takes_a_body(app, server, world):
    answers: list[Answer] = []

    def answer(method: str, path: str, label: str, body, **options) -> None:
        headers = api_headers(world, path) | options.pop("headers", {})
        answered = send(server, method, path, data=body, headers=headers, **options)
        answered.label += f" [{label}]"
        answers.append(answered)

    for method, rule, sample in api_routes(app):
        path = fill(rule, world)
        for label, (body, content_type) in GENERIC_BODIES.items():
            answer(method, path, label, body, content_type=content_type)
        sample = sample or {"name": "x"}
        for label, text in {**UNSTORABLE_STRINGS, **ODD_STRINGS}.items():
            for leaf in leaves(sample):
                answer(method, path, f"{label} at {leaf}", json.dumps(replaced(sample, leaf, text)))
        answer(method, path, "chunked, oversized", iter([b'{"name": "', b"x" * 70_000, b'"}']))
        answer(
            method,
            path,
            "a 12 KB header",
            json.dumps(sample),
            headers={"X-Api-Key": "svc_live_" + "x" * 12_000},
        )
        answer(
            method,
            path,
            "an Idempotency-Key of 8 KB",
            json.dumps(sample),
            headers={"Idempotency-Key": "k" * 8000},
        )
        padding = {f"X-Pad-{n}": "x" for n in range(150)}
        answer(method, path, "150 headers", json.dumps(sample), headers=padding)

    assert len(answers) > 500
    server_errors = [a.label for a in answers if a.status >= 500]
    assert server_errors == [], server_errors
    assert_log_has_one_line_per_request(server)


def stored_records(world: dict) -> dict:
    """What the brand has, as its API lists it."""
    api, base = world["api"], world["base"]
    return {
        name: api.get(f"{base}/{path}").json()["data"]
        for name, path in {
            "keys": "api-key/fetch-keys",
            "endpoints": "webhook/fetch-endpoints",
            "conversions": "conversion/fetch-postbacks",
            "deliveries": "webhook/fetch-deliveries?limit=100",
        }.items()
    }


def assert_log_has_one_line_per_request(server) -> None:
    log = server.output()
    assert "Traceback" not in log
    assert "INTERNAL_ERROR" not in log
    assert max(len(line) for line in log.splitlines()) < 2000  # no caller's body in it


def form_fields() -> list[str]:
    """Every input name the dashboard's templates use."""
    names = set()
    for template in TEMPLATES.rglob("*.html"):
        names.update(_FORM_FIELD.findall(template.read_text()))
    return sorted(names - {"csrf_token"})


def signed_in_browser(server, world: dict) -> tuple[requests.Session, str]:
    browser = requests.Session()
    # A new connection per request: after refusing a body over 64 KiB unread, gunicorn closes
    # the connection it answered on, and requests would not retry its next POST on it.
    browser.headers["Connection"] = "close"
    page = browser.get(f"{server.url}/dashboard/sign-in", timeout=10).text
    token = _CSRF.search(page)[1]
    response = browser.post(
        f"{server.url}/dashboard/sign-in",
        data={"apiKey": world["write_key"], "csrf_token": token},
        allow_redirects=False,
        timeout=10,
    )
    assert response.status_code == 303, response.text
    page = browser.get(f"{server.url}/dashboard/", timeout=10).text
    return browser, _CSRF.search(page)[1]


def test_the_dashboards_forms_get_no_500_whatever_they_are_sent(app, server, world):
    browser, token = signed_in_browser(server, world)
    names = form_fields()
    assert {"apiKey", "url", "name", "next", "description"} <= set(names)
    strings = {**UNSTORABLE_STRINGS, **ODD_STRINGS}
    answers: list[Answer] = []
    for rule in body_routes(app):
        path = fill(rule, world)
        if path.startswith(API_PREFIX):
            continue
        for label, text in strings.items():
            if "\ud800" in text or "\udfff" in text:
                continue  # a form cannot carry one: its bytes are the next case
            data = {name: text for name in names} | {"csrf_token": token}
            response = browser.post(
                f"{server.url}{path}", data=data, allow_redirects=False, timeout=30
            )
            answers.append(Answer(f"POST {path} [{label}]", response.status_code, response.text))
        raw_bodies = {
            "invalid UTF-8": "&".join(f"{n}=%ff%fe%ed%a0%80" for n in names),
            "NUL": "&".join(f"{n}=a%00b" for n in names),
            "oversized": "name=" + "x" * 70_000,
        }
        for label, raw in raw_bodies.items():
            response = browser.post(
                f"{server.url}{path}",
                data=f"{raw}&csrf_token={token}",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
                allow_redirects=False,
                timeout=30,
            )
            answers.append(Answer(f"POST {path} [{label}]", response.status_code, response.text))
        for label, (body, content_type) in GENERIC_BODIES.items():
            response = browser.post(
                f"{server.url}{path}",
                data=body,
                headers={"Content-Type": content_type, "X-CSRF-Token": token},
                allow_redirects=False,
                timeout=30,
            )
            answers.append(Answer(f"POST {path} [{label}]", response.status_code, response.text))

    server_errors = [a.label for a in answers if a.status >= 500]
    assert server_errors == [], server_errors
    assert len(answers) > 300
    assert_log_has_one_line_per_request(server)


# --- each finding of the attack, as a user would see it ------------------------------------------


def test_deep_nesting_is_one_400_and_one_log_line_whatever_the_credential(
    client, brand, make_bootstrap_token, read_key, caplog
):
    token = make_bootstrap_token(brand)
    for headers, path in [
        ({"X-Service-Bootstrap-Token": token}, "api-key/create-key"),
        (
            {"X-Api-Key": read_key, "Idempotency-Key": "nested-0000000001"},
            "conversion/record-postback",
        ),
    ]:
        caplog.clear()
        response = client.post(
            f"/api/v1/brand/{brand}/{path}",
            data=NESTED_ARRAYS,
            headers=headers | {"Content-Type": "application/json"},
        )
        body = assert_error(response, 400, "VALIDATION_ERROR")
        assert body["errors"] == {
            "body": [f"Objects and arrays may nest at most {MAX_BODY_DEPTH} levels deep."]
        }
        assert [r.name for r in caplog.records] == ["brand_api.access"]
        assert all(r.exc_info is None for r in caplog.records)


def test_nesting_up_to_the_limit_is_parsed_and_one_more_level_is_not(client, brand, write_key):
    def body(levels: int) -> str:
        # `name` is a string: at the limit the schema refuses the type, past it the parser the depth
        return '{"name": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"

    url = f"/api/v1/brand/{brand}/api-key/rotate-key"
    headers = {"X-Api-Key": write_key, "Content-Type": "application/json"}
    at_limit = assert_error(
        client.post(url, data=body(MAX_BODY_DEPTH), headers=headers), 400, "VALIDATION_ERROR"
    )
    assert list(at_limit["errors"]) == ["name"]
    over = assert_error(
        client.post(url, data=body(MAX_BODY_DEPTH + 1), headers=headers), 400, "VALIDATION_ERROR"
    )
    assert list(over["errors"]) == ["body"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("conversion/record-postback", {"eventType": "\ud800"}, "eventType"),
        ("conversion/record-postback", {"eventType": "p", "clickId": "c\udc00"}, "clickId"),
        (
            "conversion/record-postback",
            {"eventType": "p", "metadata": {"o": "\ud83d"}},
            "metadata.o",
        ),
        ("webhook/register-endpoint", {"url": "https://h.example.invalid/\ud800"}, "url"),
        (
            "webhook/register-endpoint",
            {"url": "https://h.example.invalid/x", "description": "a\udfff"},
            "description",
        ),
        ("api-key/rotate-key", {"name": "key \ud800"}, "name"),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_its_field(
    app, client, brand, write_key, path, body, field
):
    response = client.post(
        f"/api/v1/brand/{brand}/{path}",
        data=json.dumps(body),  # ensure_ascii: the surrogate travels as \\ud800, as JSON allows
        headers={
            "X-Api-Key": write_key,
            "Idempotency-Key": "surrogate-00000001",
            "Content-Type": "application/json",
        },
    )
    errors = assert_error(response, 400, "VALIDATION_ERROR")["errors"]
    assert errors == {
        field: ["Must not contain a lone UTF-16 surrogate (\\ud800-\\udfff without its pair)."]
    }


def test_a_surrogate_pair_is_a_character_and_is_kept(client, brand, write_key):
    response = client.post(
        f"/api/v1/brand/{brand}/conversion/record-postback",
        data=json.dumps({"eventType": "purchase \U0001f600", "metadata": {"note": "\U0001f600"}}),
        headers={
            "X-Api-Key": write_key,
            "Idempotency-Key": "pair-000000000001",
            "Content-Type": "application/json",
        },
    )
    conversion_id = assert_success(response, 201)["conversionId"]
    stored = assert_success(
        client.get(
            f"/api/v1/brand/{brand}/conversion/{conversion_id}", headers={"X-Api-Key": write_key}
        )
    )
    assert stored["eventType"] == "purchase \U0001f600"


@pytest.mark.parametrize("token", NON_FINITE_NUMBERS)
def test_a_non_finite_number_in_metadata_is_a_400_and_the_key_is_not_kept(
    client, brand, write_key, token
):
    url = f"/api/v1/brand/{brand}/conversion/record-postback"
    headers = {
        "X-Api-Key": write_key,
        "Idempotency-Key": "order-4711-nonfinite",
        "Content-Type": "application/json",
    }
    response = client.post(
        url, data='{"eventType": "purchase", "metadata": {"price": ' + token + "}}", headers=headers
    )
    errors = assert_error(response, 400, "VALIDATION_ERROR")["errors"]
    assert errors == {
        "metadata.price": ["Must be a finite number: not NaN, Infinity, or beyond ±1.7e308."]
    }
    listed = client.get(
        f"/api/v1/brand/{brand}/conversion/fetch-postbacks", headers={"X-Api-Key": write_key}
    )
    assert assert_success(listed)["conversions"] == []
    # The corrected retry under the same key is a new conversion, not a replay of nothing.
    retried = client.post(
        url, json={"eventType": "purchase", "metadata": {"price": 1.5}}, headers=headers
    )
    assert assert_success(retried, 201)["replay"] is False


def test_large_finite_numbers_are_still_numbers(client, brand, write_key):
    response = client.post(
        f"/api/v1/brand/{brand}/conversion/record-postback",
        data='{"eventType": "purchase", "metadata": {"big": 1.7e308, "small": -1e-320}}',
        headers={
            "X-Api-Key": write_key,
            "Idempotency-Key": "finite-000000000001",
            "Content-Type": "application/json",
        },
    )
    assert_success(response, 201)


# --- the sign-in's `next` -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "hostile", ["/dashboard/\r\nSet-Cookie: x=1", "/dashboard/\n", "/dashboard\x00"]
)
def test_a_control_character_in_the_sign_in_next_is_a_400_naming_it(client, write_key, hostile):
    page = client.get("/dashboard/sign-in").get_data(as_text=True)
    token = _CSRF.search(page)[1]
    response = client.post(
        "/dashboard/sign-in", data={"apiKey": write_key, "csrf_token": token, "next": hostile}
    )
    assert response.status_code == 400
    text = response.get_data(as_text=True)
    assert "`next`" in text and "control characters" in text
    assert "Set-Cookie" not in str(response.headers)
    assert client.get("/dashboard/").status_code == 303  # not signed in
    linked = client.get("/dashboard/sign-in", query_string={"next": hostile})
    assert linked.status_code == 400


def test_a_dashboard_next_without_control_characters_still_works(client, write_key):
    page = client.get("/dashboard/sign-in").get_data(as_text=True)
    token = _CSRF.search(page)[1]
    response = client.post(
        "/dashboard/sign-in",
        data={"apiKey": write_key, "csrf_token": token, "next": "/dashboard/keys?q=caf%C3%A9"},
    )
    assert response.status_code == 303
    assert response.headers["Location"] == "/dashboard/keys?q=caf%C3%A9"


# --- Strict-Transport-Security --------------------------------------------------------------------


@pytest.fixture
def production_server(app, app_environ) -> Iterator[ServerProcess]:
    process = ServerProcess(app_environ | {"APP_ENV": "production"}, workers=1, threads=2)
    yield process
    process.stop()


def test_production_sends_strict_transport_security_on_every_answer(production_server, brand):
    url = production_server.url
    answers = [
        requests.get(f"{url}/healthz", timeout=10),
        requests.get(f"{url}/api/v1/nowhere", timeout=10),
        requests.get(f"{url}/api/v1/brand/{brand}/api-key/fetch-keys", timeout=10),
        requests.post(
            f"{url}/api/v1/brand/{brand}/api-key/create-key", data=NESTED_ARRAYS, timeout=10
        ),
        requests.post(
            f"{url}/api/v1/brand/{brand}/api-key/create-key", data="x" * 70_000, timeout=10
        ),
        requests.get(f"{url}/dashboard/sign-in", timeout=10),
        requests.get(f"{url}/dashboard/keys", allow_redirects=False, timeout=10),
        requests.post(f"{url}/dashboard/sign-in", data={"apiKey": "x"}, timeout=10),
        requests.get(f"{url}/docs", timeout=10),
        requests.get(f"{url}/metrics", timeout=10),
    ]
    for answer in answers:
        assert answer.headers.get("Strict-Transport-Security") == (
            "max-age=31536000; includeSubDomains"
        ), (answer.request.method, answer.url, answer.status_code)


def test_development_and_test_send_no_strict_transport_security(client, app_environ):
    assert "Strict-Transport-Security" not in client.get("/healthz").headers
    development = create_app(app_environ | {"APP_ENV": "development"})
    assert "Strict-Transport-Security" not in development.test_client().get("/healthz").headers


# --- the dashboard: every route's path segments, query parameters and form fields ----------------

DASHBOARD_CODE = Path(__file__).resolve().parent.parent / "blueprints" / "dashboard"
_URL_FOR_CALL = re.compile(r"url_for\(([^)]*)\)")
_KEYWORD = re.compile(r"\b([A-Za-z][A-Za-z_]*)=")
_ARGS_READ = re.compile(r"request\.args(?:\.get)?[\[(]\"([A-Za-z_]+)\"")
# Every id prefix of CONTRACT 3: a hostile value that starts like an id gets past a prefix check.
ID_PREFIXES = ("brd", "key", "whe", "whd", "evt", "conv", "cmp", "deal", "lnk", "plc", "esc")
# What PostgreSQL refuses (the cause of the 500s), each alone and after an id's prefix.
NUL_VALUES = {"nul": "\x00", "nul inside": "a\x00b"} | {
    f"nul after {prefix}_": f"{prefix}_\x00" for prefix in ID_PREFIXES
}


def dashboard_rules(app) -> list:
    """Every dashboard route, the destructive ones last (a hostile id must change nothing)."""
    rules = [rule for rule in app.url_map.iter_rules() if rule.rule.startswith("/dashboard")]
    return sorted(rules, key=lambda rule: (bool(DESTRUCTIVE.search(rule.endpoint)), rule.rule))


def dashboard_query_names(app) -> list[str]:
    """Every query parameter the dashboard reads or links with: its forms' inputs, its links'
    `url_for` arguments, and what its views read from `request.args` (a new filter is found)."""
    names = set(form_fields())
    for template in TEMPLATES.rglob("*.html"):
        for call in _URL_FOR_CALL.findall(template.read_text()):
            names.update(_KEYWORD.findall(call))
    for module in DASHBOARD_CODE.glob("*.py"):
        names.update(_ARGS_READ.findall(module.read_text()))
    path_arguments = {name for rule in app.url_map.iter_rules() for name in rule.arguments}
    return sorted(names - path_arguments - {"viewport", "csrf_token"})


def encoded(value: str) -> str:
    """`value` as a hostile client writes it in a URL: every byte escaped, a lone surrogate as
    the bytes UTF-8 would give it."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


@pytest.fixture
def dashboard_world(client, brand, write_key) -> dict:
    """Real records for every path argument of the dashboard, and a signed-in browser."""
    headers = {"X-Api-Key": write_key}
    base = f"{API_PREFIX}/brand/{brand}"
    endpoint = client.post(
        f"{base}/webhook/register-endpoint",
        json={"url": "https://hooks.brand-example.invalid/x", "events": ["webhook.test"]},
        headers=headers,
    ).get_json()["data"]
    delivery_id = client.post(
        f"{base}/webhook/{endpoint['id']}/send-test", headers=headers
    ).get_json()["data"]["deliveryId"]
    event_id = client.get(f"{base}/webhook/deliveries/{delivery_id}", headers=headers).get_json()[
        "data"
    ]["eventId"]
    conversion = client.post(
        f"{base}/conversion/record-postback",
        json={"eventType": "purchase", "linkCode": "CODE-1"},
        headers=headers | {"Idempotency-Key": "dashboard-corpus-0001"},
    ).get_json()["data"]
    victim = client.post(
        f"{base}/api-key/rotate-key", json={"name": "victim"}, headers=headers
    ).get_json()["data"]
    return {
        "endpoint_id": endpoint["id"],
        "delivery_id": delivery_id,
        "event_id": event_id,
        "conversion_id": conversion["conversionId"],
        "key_id": victim["id"],
        "token": sign_in(client, write_key),
    }


def _dashboard_request(client, rule, path: str, token: str, **options):
    method = "GET" if "GET" in rule.methods else "POST"
    headers = {} if method == "GET" else {"X-CSRF-Token": token}
    return client.open(path, method=method, headers=headers, **options)


def test_no_dashboard_route_answers_500_whatever_its_path_segments_hold(
    app, client, dashboard_world
):
    token = dashboard_world["token"]
    hostile = NUL_VALUES | UNSTORABLE_STRINGS | ODD_STRINGS
    answers: list[Answer] = []
    for rule in dashboard_rules(app):
        for argument in sorted(rule.arguments):
            for label, text in hostile.items():
                for value in {text, dashboard_world[argument] + text} - {dashboard_world[argument]}:
                    path = _PATH_ARGUMENT.sub(
                        lambda m, a=argument, v=value: (
                            encoded(v) if m[1] == a else dashboard_world[m[1]]
                        ),
                        rule.rule,
                    )
                    response = _dashboard_request(client, rule, path, token)
                    answers.append(
                        Answer(f"{rule.rule} [{argument}: {label}]", response.status_code, "")
                    )

    assert len(answers) > 500
    server_errors = [a.label for a in answers if a.status >= 500]
    assert server_errors == [], server_errors


def test_no_dashboard_page_answers_500_whatever_its_query_holds(app, client, dashboard_world):
    token = dashboard_world["token"]
    names = dashboard_query_names(app)
    assert {"linkCode", "code", "eventType", "endpointId", "eventId", "q", "page"} <= set(names)
    answers: list[Answer] = []
    for rule in dashboard_rules(app):
        if "GET" not in rule.methods:
            continue
        path = _PATH_ARGUMENT.sub(lambda m: dashboard_world[m[1]], rule.rule)
        for name in names:  # one parameter at a time: a refused one must not hide the next
            response = _dashboard_request(client, rule, f"{path}?{name}=a%00b", token)
            answers.append(Answer(f"{path}?{name} [nul inside]", response.status_code, ""))
        for label, value in (NUL_VALUES | UNSTORABLE_STRINGS | ODD_STRINGS).items():
            query = "&".join(f"{name}={encoded(value)}" for name in names)
            response = _dashboard_request(client, rule, f"{path}?{query}", token)
            answers.append(Answer(f"{path}?(every parameter) [{label}]", response.status_code, ""))

    server_errors = [a.label for a in answers if a.status >= 500]
    assert server_errors == [], server_errors
    assert len(answers) > 1000


def test_no_dashboard_form_answers_500_whatever_one_field_holds(app, client, dashboard_world):
    token = dashboard_world["token"]
    names = form_fields()
    answers: list[Answer] = []
    for rule in dashboard_rules(app):
        if "POST" not in rule.methods:
            continue
        path = _PATH_ARGUMENT.sub(lambda m: dashboard_world[m[1]], rule.rule)
        for name in names:  # one field at a time: a refused one must not hide the next
            response = client.post(path, data={name: "a\x00b", "csrf_token": token})
            answers.append(Answer(f"POST {path} {name} [nul inside]", response.status_code, ""))
        for label, value in NUL_VALUES.items():
            data = {name: value for name in names} | {"csrf_token": token}
            response = client.post(path, data=data)
            answers.append(Answer(f"POST {path} (every field) [{label}]", response.status_code, ""))

    server_errors = [a.label for a in answers if a.status >= 500]
    assert server_errors == [], server_errors
    assert len(answers) > 500


# --- bodies that are not JSON, and what gunicorn refuses itself -----------------------------------

NOT_JSON_BODIES = {
    "form": ("name=x&scopes=read", "application/x-www-form-urlencoded"),
    "text": ('{"name": "x"}', "text/plain"),
    "multipart": (GENERIC_BODIES["multipart"][0], "multipart/form-data; boundary=b"),
    "XML": ("<name>x</name>", "application/xml"),
    "no content type": ('{"name": "x"}', None),
    "JSON as a text type": ('{"name": "x"}', "text/json"),
}


def body_reading_routes(app) -> list[tuple[str, str]]:
    """(method, rule) of every API operation that declares a body, from the route table."""
    routes = []
    for rule in app.url_map.iter_rules():
        operation = getattr(app.view_functions[rule.endpoint], "operation", None)
        if operation is not None and operation.body is not None:
            routes.append((sorted(rule.methods & {"POST", "PUT", "PATCH", "DELETE"})[0], rule))
    return routes


def test_a_body_not_declared_json_is_a_415_on_every_route_that_reads_one(
    app, client, brand, write_key, make_bootstrap_token
):
    world = {
        "brand_id": brand,
        "endpoint_id": assert_success(
            client.post(
                f"{API_PREFIX}/brand/{brand}/webhook/register-endpoint",
                json={"url": "https://hooks.brand-example.invalid/x"},
                headers={"X-Api-Key": write_key},
            ),
            201,
        )["id"],
    }
    token = make_bootstrap_token(brand)
    routes = body_reading_routes(app)
    assert len(routes) >= 7
    for method, rule in routes:
        path = fill(rule, world)
        credential = (
            {"X-Service-Bootstrap-Token": token}
            if path.endswith("/create-key")
            else {"X-Api-Key": write_key}
        )
        for label, (body, content_type) in NOT_JSON_BODIES.items():
            headers = credential | {"Idempotency-Key": "not-json-00000001"}
            if content_type is not None:
                headers["Content-Type"] = content_type
            response = client.open(path, method=method, data=body, headers=headers)
            body_seen = assert_error(response, 415, "UNSUPPORTED_MEDIA_TYPE")
            assert "Content-Type: application/json" in body_seen["message"], (path, label)
    # A refused body kept nothing, not even its Idempotency-Key: the JSON retry is a new postback.
    retried = client.post(
        f"{API_PREFIX}/brand/{brand}/conversion/record-postback",
        json={"eventType": "purchase"},
        headers={"X-Api-Key": write_key, "Idempotency-Key": "not-json-00000001"},
    )
    assert assert_success(retried, 201)["replay"] is False


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON; charset=UTF-8",
        "application/merge-patch+json",
        "application/vnd.brand+json; charset=utf-8",
    ],
)
def test_json_and_every_json_type_with_any_charset_are_read(client, brand, write_key, content_type):
    response = client.post(
        f"{API_PREFIX}/brand/{brand}/api-key/rotate-key",
        data='{"name": "orders-service"}',
        headers={"X-Api-Key": write_key, "Content-Type": content_type},
    )
    assert assert_success(response, 201)["name"] == "orders-service"


def test_a_route_with_an_optional_body_needs_no_content_type_without_one(client, brand, write_key):
    endpoint = assert_success(
        client.post(
            f"{API_PREFIX}/brand/{brand}/webhook/register-endpoint",
            json={"url": "https://hooks.brand-example.invalid/x"},
            headers={"X-Api-Key": write_key},
        ),
        201,
    )
    rotated = client.post(
        f"{API_PREFIX}/brand/{brand}/webhook/{endpoint['id']}/rotate-secret",
        headers={"X-Api-Key": write_key},
    )
    assert assert_success(rotated)["id"] == endpoint["id"]
    # A route that reads no body ignores one, whatever its type.
    test_ping = client.post(
        f"{API_PREFIX}/brand/{brand}/webhook/{endpoint['id']}/send-test",
        data="ping",
        headers={"X-Api-Key": write_key, "Content-Type": "text/plain"},
    )
    assert_success(test_ping, 202)


def raw_exchange(server, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """`request`'s bytes as they are, on a connection of their own; the answer's status,
    headers (lower-cased names) and body, read until the server closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(request)
        received = []
        while chunk := connection.recv(65536):
            received.append(chunk)
    head, _, body = b"".join(received).partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (h.partition(":") for h in lines)}
    return int(status_line.split()[1]), headers, body


GUNICORN_REFUSALS = {
    "a request line over 4094 bytes": (
        b"GET /api/v1/" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        414,
    ),
    "101 headers": (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-Pad-%d: x\r\n" % n for n in range(101))
        + b"\r\n",
        431,
    ),
    "a header over 8190 bytes": (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Api-Key: svc_live_" + b"k" * 8200 + b"\r\n\r\n",
        431,
    ),
    "a header name with a space": (b"GET /healthz HTTP/1.1\r\nBad Header: x\r\n\r\n", 400),
    "a header without a colon": (b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n", 400),
    "a malformed request line": (b"<script>alert(1)</script>\r\n\r\n", 400),
    "an unknown HTTP version": (b"GET /healthz HTTP/7.1\r\nHost: x\r\n\r\n", 400),
}


@pytest.mark.parametrize("label", GUNICORN_REFUSALS)
def test_gunicorns_own_refusals_are_the_envelope(server, label):
    request, status = GUNICORN_REFUSALS[label]
    answered, headers, body = raw_exchange(server, request)
    assert answered == status, (label, body[:200])
    assert headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff"
    envelope = json.loads(body)
    assert envelope == {
        "status": False,
        "statusCode": status,
        "message": envelope["message"],
        "errorCode": "VALIDATION_ERROR",
        "requestId": headers["x-request-id"],
    }
    assert envelope["requestId"].startswith("req_")
    assert "script" not in envelope["message"] and "svc_live" not in envelope["message"]
    assert "Traceback" not in server.output()


def test_a_malformed_chunked_body_is_a_400_not_a_500(server, world):
    """gunicorn finds a malformed chunk only as the app reads the body: the app says 400."""
    path = f"{API_PREFIX}/brand/{world['brand_id']}/api-key/rotate-key"
    request = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Api-Key: {world['write_key']}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    ).encode()
    status, _headers, body = raw_exchange(server, request)
    assert status == 400, body[:300]
    assert "Traceback" not in server.output()
