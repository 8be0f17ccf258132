"""GET /docs: Scalar, vendored in static/vendor/ by `make vendor-docs`, renders the OpenAPI
document in the browser (tests/test_docs_browser.py drives it in Chromium). What the reference
needs beyond Scalar's own rendering is in the document, so any renderer shows it: each
operation's curl command of this deployment (`x-codeSamples`), whole examples of every answer,
and the envelope, error-code and delivery-header tables of the introduction. Builds its own app
(nothing here needs a database), so it depends on none of conftest's fixtures."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from app import CONTENT_SECURITY_POLICY, create_app
from blueprints.system import SCALAR_RECORD
from schemas.envelope import ERROR_CODES

ROOT = Path(__file__).resolve().parent.parent
ENVIRON = {
    "APP_ENV": "test",
    # Nothing here touches the database: nothing ever connects to this one.
    "DATABASE_URL": "postgresql://docs@127.0.0.1:1/never-connected",
    "SECRET_KEY": "x",
    "ENCRYPTION_KEY": "dGVzdC1lbmNyeXB0aW9uLWtleS0zMi1ieXRlcyEhISE=",
}
BASE = "https://api.example.test"
HTTP_METHODS = {"get", "put", "post", "delete", "patch"}


@pytest.fixture(scope="module")
def docs_app():
    return create_app(ENVIRON)


@pytest.fixture(scope="module")
def client(docs_app):
    return docs_app.test_client()


@pytest.fixture(scope="module")
def spec(client) -> dict:
    response = client.get("/api/v1/openapi.json", base_url=BASE)
    assert response.status_code == 200
    return response.get_json()


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(SCALAR_RECORD.read_text())


def operations(spec: dict):
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                yield path, method, operation


def curl_of(operation: dict) -> str:
    [sample] = operation["x-codeSamples"]
    assert sample["lang"] == "Shell" and sample["label"] == "curl"
    return sample["source"]


# --- the page and the vendored renderer ---------------------------------------------------------


def test_the_page_loads_our_starter_then_the_vendored_scalar_and_nothing_else(client, record):
    response = client.get("/docs")
    assert response.status_code == 200 and response.mimetype == "text/html"
    page = response.get_data(as_text=True)
    assert page.lstrip().lower().startswith("<!doctype html>")
    scripts = re.findall(r"<script[^>]*>", page)
    assert scripts == [
        '<script src="/static/docs.js" defer>',
        f'<script src="/static/vendor/{record["file"]}" defer>',
    ]
    assert 'data-openapi-url="/api/v1/openapi.json"' in page
    for src in re.findall(r'<script src="([^"]+)"', page):
        served = client.get(src)
        assert served.status_code == 200 and served.mimetype == "text/javascript"
        served.close()


def test_the_vendored_scalar_is_the_recorded_release(record):
    bundle = (ROOT / "static" / "vendor" / record["file"]).read_bytes()
    assert hashlib.sha256(bundle).hexdigest() == record["sha256"]
    assert record["package"] == "@scalar/api-reference" and record["license"] == "MIT"
    assert record["file"] == f"scalar-api-reference-{record['version']}.js"
    algorithm, digest = record["npmIntegrity"].split("-", 1)
    assert algorithm == "sha512" and len(base64.b64decode(digest)) == 64
    assert "scalar-api-reference.json" in (ROOT / "static" / "vendor" / "README.md").read_text()
    assert "vendor-docs:" in (ROOT / "Makefile").read_text()
    # Only the recorded release is vendored: an upgrade deletes the file it replaces.
    assert [p.name for p in (ROOT / "static" / "vendor").glob("scalar-*.js")] == [record["file"]]


def test_only_the_docs_page_allows_inline_styles_and_its_scripts_stay_the_apps(client):
    docs = client.get("/docs").headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in docs.split(";"))
    assert directives["style-src"] == "'self' 'unsafe-inline'"
    assert directives["script-src"] == "'self'"  # no inline script, no eval
    assert directives["connect-src"] == "'self'"  # the request console calls this API only
    assert directives["default-src"] == "'none'"  # no font, frame or worker from anywhere
    assert docs == CONTENT_SECURITY_POLICY.replace(
        "style-src 'self'", "style-src 'self' 'unsafe-inline'"
    )
    for other in ("/dashboard/sign-in", "/no-such-page"):
        policy = client.get(other, headers={"Accept": "text/html"}).headers
        assert policy["Content-Security-Policy"] == CONTENT_SECURITY_POLICY, other
        assert "unsafe-inline" not in policy["Content-Security-Policy"]


@pytest.mark.parametrize(
    ("query", "passed_on"),
    [
        ("brandId=brd_01jd3k7a9b1c3d5e7f9g1h3j5k", "brd_01jd3k7a9b1c3d5e7f9g1h3j5k"),
        ("brandId=cmp_01jd3k9m2x4q8r7t6v5w4y3z2a", None),
        ('brandId=brd_1"><script>alert(1)</script>', None),
        ("brandId=", None),
        ("", None),
    ],
    ids=["a-brand-id", "another-kind-of-id", "markup", "empty", "none"],
)
def test_the_dashboards_brand_id_is_passed_on_and_nothing_else(client, query, passed_on):
    page = client.get(f"/docs?{query}").get_data(as_text=True)
    found = re.findall(r'data-brand-id="([^"]*)"', page)
    assert found == ([passed_on] if passed_on else [])
    assert "<script>alert" not in page


def test_without_javascript_the_page_points_to_the_document(client):
    page = client.get("/docs").get_data(as_text=True)
    fallback = page[page.index("<noscript>") : page.index("</noscript>")]
    assert "needs JavaScript" in fallback
    assert 'href="/api/v1/openapi.json"' in fallback


# --- what the document carries for any renderer ------------------------------------------------


def test_every_operation_has_a_curl_command_of_this_deployment(spec):
    schemes = spec["components"]["securitySchemes"]
    for path, method, operation in operations(spec):
        curl = curl_of(operation)
        first_line = curl.splitlines()[0].removesuffix(" \\")
        url = re.sub(r"\{(\w+)\}", lambda m: "$" + _variable(m.group(1)), path)
        expected = f'"{BASE}/api/v1{url}"'
        assert first_line == (
            f"curl {expected}" if method == "get" else f"curl -X {method.upper()} {expected}"
        ), operation["operationId"]
        [requirement, *_] = operation["security"]
        [scheme] = requirement
        sent = {"ApiKey": "X-Api-Key: $KEY", "BootstrapToken": "X-Service-Bootstrap-Token: $TOKEN"}
        assert f'-H "{sent[scheme]}"' in curl, operation["operationId"]
        others = {s["name"] for n, s in schemes.items() if s.get("in") == "header" and n != scheme}
        assert not any(f'-H "{other}: ' in curl for other in others), operation["operationId"]
        body = operation.get("requestBody", {}).get("content", {}).get("application/json")
        if body is None:
            assert " -d " not in curl
            continue
        data = re.search(r"-d '(.*)'$", curl, re.S)
        assert data, curl
        sent_body = json.loads(data.group(1))
        schema = spec["components"]["schemas"][body["schema"]["$ref"].rsplit("/", 1)[1]]
        assert set(schema.get("required", [])) <= set(sent_body) <= set(schema["properties"])
        assert '-H "Content-Type: application/json"' in curl


def _variable(parameter: str) -> str:
    name = parameter.removesuffix("Id").upper()
    return {"BRAND": "BRAND", "KEY": "KEY_ID"}.get(name, name)


def test_record_postbacks_curl_sends_its_idempotency_key(spec):
    [operation] = [op for _p, _m, op in operations(spec) if op["operationId"] == "recordPostback"]
    assert '-H "Idempotency-Key: order-20931-purchase"' in curl_of(operation)


def test_the_introduction_has_the_envelope_error_code_and_header_tables(spec):
    text = spec["info"]["description"]
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == ["Authentication", "Envelope", "Errors", "Webhooks", "Paths", "License"]
    envelope = text[text.index("## Envelope") : text.index("## Errors")]
    for field in ("status", "statusCode", "message", "data", "requestId", "meta", "errorCode"):
        assert f"| `{field}` |" in envelope, field
    for field in ("page", "limit", "total", "totalPages", "hasNext", "totalExact", "errors"):
        assert f"| `{field}` |" in envelope, field
    errors = text[text.index("## Errors") : text.index("## Webhooks")]
    rows = re.findall(r"^\| `([A-Z_]+)` \| (\d{3}) \|", errors, re.M)
    assert [code for code, _status in rows] == list(ERROR_CODES)
    assert dict(rows)["RATE_LIMITED"] == "429" and dict(rows)["SERVICE_UNAVAILABLE"] == "503"
    webhooks = text[text.index("## Webhooks") : text.index("## Paths")]
    for header in ("X-Service-Signature", "X-Service-Delivery", "webhook-signature"):
        assert f"| `{header}` |" in webhooks
    assert spec["info"]["license"]["url"] == f"{BASE}/docs#description/license"


def test_every_json_answer_has_a_whole_example_that_its_schema_takes(spec):
    registry = Registry().with_resource(
        "urn:doc", Resource.from_contents(spec, default_specification=DRAFT202012)
    )

    def check(schema: dict, example: dict, where: str) -> None:
        validator = Draft202012Validator(
            {"$ref": "urn:doc#/components/schemas/" + schema["$ref"].rsplit("/", 1)[1]},
            registry=registry,
        )
        assert [e.message for e in validator.iter_errors(example)] == [], where

    for _path, _method, operation in operations(spec):
        for status, response in operation["responses"].items():
            media = response.get("content", {}).get("application/json")
            if media is None:
                continue
            example = media["example"]
            if int(status) >= 400:
                # A shared error with a note of this operation's (fetch-events' 429 says why
                # a wait is refused): the shared error's example, whole.
                assert example["status"] is False and example["statusCode"] == int(status)
                assert response["description"].startswith(example["errorCode"] + ": ")
                continue
            assert example["status"] is True and example["statusCode"] == int(status)
            assert example["message"] == response["description"]
            check(media["schema"], example, f"{operation['operationId']} {status}")
    for name, response in spec["components"]["responses"].items():
        media = response["content"]["application/json"]
        example = media["example"]
        assert example["status"] is False
        assert response["description"].startswith(example["errorCode"] + ": ")
        check(media["schema"], example, name)
