"""GET /docs: the OpenAPI document rendered as a static, script-free reference. Builds its own app
(the page needs no database), so it depends on none of conftest's fixtures."""

from __future__ import annotations

import html
import json
import re

import pytest
from flask import render_template
from markupsafe import Markup
from openapi_spec_validator import validate

from app import create_app
from blueprints.docs_rendering import api_reference, doc_inline, doc_text

ENVIRON = {
    "APP_ENV": "test",
    # Rendering the document touches no database: nothing ever connects to this one.
    "DATABASE_URL": "postgresql://docs@127.0.0.1:1/never-connected",
    "SECRET_KEY": "x",
    "ENCRYPTION_KEY": "dGVzdC1lbmNyeXB0aW9uLWtleS0zMi1ieXRlcyEhISE=",
}
CURL = re.compile(r"<pre><code>(curl .*?)</code></pre>", re.DOTALL)
JSON_BODY = re.compile(r"-d '(.*)'\s*$", re.DOTALL)


@pytest.fixture(scope="module")
def docs_app():
    return create_app(ENVIRON)


@pytest.fixture(scope="module")
def spec(docs_app) -> dict:
    response = docs_app.test_client().get("/api/v1/openapi.json")
    assert response.status_code == 200
    return response.get_json()


@pytest.fixture(scope="module")
def page(docs_app) -> str:
    response = docs_app.test_client().get("/docs")
    assert response.status_code == 200, response.get_data(as_text=True)[:2000]
    assert response.mimetype == "text/html"
    return response.get_data(as_text=True)


def operations(spec: dict):
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            if method in {"get", "put", "post", "delete", "patch", "head", "options", "trace"}:
                yield path, method, operation


def article(page: str, operation_id: str) -> str:
    start = page.index(f'<article class="operation split" id="{operation_id}"')
    return page[start : page.index("</article>", start)]


def curl_of(page: str, operation_id: str) -> str:
    match = CURL.search(article(page, operation_id))
    assert match, f"no curl example for {operation_id}"
    return html.unescape(match.group(1))


def test_docs_helpers_are_registered(docs_app):
    assert "api_reference" in docs_app.jinja_env.globals, (
        "blueprints/system.py must call register_docs_helpers(system)"
    )
    assert {"doc_text", "doc_inline"} <= set(docs_app.jinja_env.filters)


def test_docs_page_is_html(docs_app):
    response = docs_app.test_client().get("/docs")
    assert response.status_code == 200
    assert response.mimetype == "text/html"
    assert response.get_data(as_text=True).lstrip().lower().startswith("<!doctype html>")


def test_page_shows_every_operation_and_path_of_the_document(page, spec):
    found = list(operations(spec))
    assert found, "the document has no operations"
    for path, method, operation in found:
        assert f'id="{operation["operationId"]}"' in page, operation["operationId"]
        assert f'href="#{operation["operationId"]}"' in page, operation["operationId"]
        assert html.escape(path) in page, path
        assert f"method-{method}" in article(page, operation["operationId"])


def test_page_ids_are_unique_and_every_anchor_lands(page):
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    for target in set(re.findall(r'href="#([^"]+)"', page)):
        assert target in ids, target


def test_page_has_no_script_and_no_inline_style(page):
    assert not re.search(r"<\s*script", page, re.IGNORECASE)
    assert not re.search(r"\sstyle\s*=", page, re.IGNORECASE)
    assert not re.search(r"<\s*style", page, re.IGNORECASE)
    assert not re.search(r"\son[a-z]+\s*=", page, re.IGNORECASE)  # no event handlers
    assert "javascript:" not in page.lower()


def test_page_loads_only_the_apps_own_stylesheets(docs_app, page):
    sheets = re.findall(r'<link rel="stylesheet" href="([^"]+)"', page)
    icons = re.findall(r'<link rel="icon" href="([^"]+)"', page)
    assert sheets
    assert icons == ["/favicon.ico", "/static/favicon.svg"]
    assert re.findall(r"<link\b", page) == ["<link"] * (len(sheets) + len(icons))
    client = docs_app.test_client()
    for href in sheets:
        assert href.startswith("/static/"), href
        response = client.get(href)
        assert response.status_code == 200
        assert response.mimetype == "text/css"
        response.close()


def test_each_curl_example_sends_the_operations_credential_header(page, spec):
    schemes = spec["components"]["securitySchemes"]
    for path, method, operation in operations(spec):
        curl = curl_of(page, operation["operationId"])
        assert curl.startswith("curl ")
        assert path in curl
        if method != "get":
            assert f"-X {method.upper()}" in curl
        security = operation.get("security", spec.get("security")) or []
        if not security:
            continue
        first = next(iter(security[0]))
        header = schemes[first]["name"] if schemes[first]["type"] == "apiKey" else "Authorization"
        assert f'-H "{header}: ' in curl, (operation["operationId"], curl)
        others = {
            s["name"] for name, s in schemes.items() if s.get("in") == "header" and name != first
        }
        for other in others:
            assert f'-H "{other}: ' not in curl, (operation["operationId"], curl)


def test_create_key_uses_the_bootstrap_token_and_others_the_api_key(page):
    assert '-H "X-Service-Bootstrap-Token: ' in curl_of(page, "createKey")
    assert "X-Api-Key" not in curl_of(page, "createKey")
    for operation_id in ("rotateKey", "fetchKeys", "revokeKey"):
        curl = curl_of(page, operation_id)
        assert '-H "X-Api-Key: ' in curl
        assert "Bootstrap" not in curl


def test_curl_bodies_are_json_with_every_required_field(page, spec):
    schemas = spec["components"]["schemas"]
    for _path, _method, operation in operations(spec):
        curl = curl_of(page, operation["operationId"])
        if "requestBody" not in operation:
            assert " -d " not in curl
            continue
        match = JSON_BODY.search(curl)
        assert match, curl
        body = json.loads(match.group(1).replace("'\\''", "'"))
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        schema = schemas[ref.rsplit("/", 1)[-1]]
        assert set(schema.get("required", [])) <= set(body)
        assert set(body) <= set(schema["properties"])
        assert '-H "Content-Type: application/json"' in curl


def test_page_shows_fields_constraints_and_errors(page, spec):
    create = article(page, "createKey")
    assert "orders-service" in create  # the body field's example
    assert "1-100 characters once surrounding spaces are trimmed" in create
    assert "pattern" in create  # the same rule, exactly, for a client generator
    assert "VALIDATION_ERROR" in create and "PAYLOAD_TOO_LARGE" in create
    assert "secret" in create  # a field of the response's data
    assert "bootstrap token only" in create  # the credential note
    revoke = article(page, "revokeKey")
    assert "NOT_FOUND" in revoke and "keyId" in revoke
    codes = spec["components"]["schemas"]["ErrorEnvelope"]["properties"]["errorCode"]["enum"]
    errors = page[page.index('id="errors"') :]
    for code in codes:
        assert code in errors


def test_page_has_the_sections_and_a_link_to_the_raw_document(page, spec):
    for anchor in ("introduction", "authentication", "envelope", "errors"):
        assert f'id="{anchor}"' in page
        assert f'href="#{anchor}"' in page
    assert 'href="/api/v1/openapi.json"' in page
    assert html.escape(spec["info"]["title"]) in page
    for scheme in spec["components"]["securitySchemes"].values():
        if scheme["type"] == "apiKey":
            assert scheme["name"] in page[page.index('id="authentication"') :]
    for tag in {t for _p, _m, op in operations(spec) for t in op.get("tags", [])}:
        assert html.escape(tag) in page


# A document of the same shape with what later routes will bring: query parameters, a paged list,
# nested objects, a body-less response, an open operation, and text that must be escaped.
FUTURE = {
    "openapi": "3.0.3",
    "info": {"title": "Future <API>", "version": "2", "description": "Use `X-Api-Key`.\n\n- one"},
    "servers": [{"url": "/api/v1"}],
    "paths": {
        "/brand/{brandId}/webhook/fetch-endpoints": {
            "get": {
                "operationId": "fetchEndpoints",
                "summary": "List webhook endpoints",
                "description": "Paged <script>alert(1)</script>\n\n**Credential:** `read` scope.",
                "tags": ["Webhooks"],
                "parameters": [
                    {
                        "in": "path",
                        "name": "brandId",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                    {
                        "in": "query",
                        "name": "page",
                        "required": False,
                        "description": "Page, from 1.",
                        "schema": {"type": "integer", "default": 1, "minimum": 1},
                    },
                    {
                        "in": "query",
                        "name": "status",
                        "required": True,
                        "schema": {"type": "string", "enum": ["active", "disabled"]},
                    },
                ],
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/EndpointListEnvelope"}
                            }
                        },
                    },
                    "401": {"$ref": "#/components/responses/Unauthorized"},
                },
                "security": [{"ApiKey": []}],
            }
        },
        "/brand/{brandId}/conversion/{conversionId}/delete": {
            "delete": {
                "operationId": "deleteConversion",
                "summary": "Delete a conversion",
                "tags": ["Conversions"],
                "parameters": [
                    {
                        "in": "path",
                        "name": "brandId",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                    {
                        "in": "path",
                        "name": "conversionId",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                ],
                "requestBody": {
                    "content": {
                        "application/json": {
                            "schema": {"$ref": "#/components/schemas/ConversionDelete"}
                        }
                    }
                },
                "responses": {"204": {"description": "Deleted"}},
                "security": [],
            }
        },
    },
    "components": {
        "schemas": {
            "Endpoint": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "example": "whe_1"},
                    "target": {
                        "description": "Where events go.",
                        "allOf": [{"$ref": "#/components/schemas/Target"}],
                    },
                    "events": {"type": "array", "items": {"$ref": "#/components/schemas/Target"}},
                },
            },
            "Target": {
                "type": "object",
                "properties": {
                    "url": {"type": "string", "format": "url", "example": "https://shop.test/h"},
                    "timeoutMs": {"type": "integer", "maximum": 10000, "nullable": True},
                },
                "required": ["url"],
            },
            "PageMeta": {
                "type": "object",
                "properties": {"page": {"type": "integer"}, "hasNext": {"type": "boolean"}},
                "required": ["page", "hasNext"],
            },
            "EndpointListEnvelope": {
                "type": "object",
                "properties": {
                    "status": {"type": "boolean"},
                    "data": {"type": "array", "items": {"$ref": "#/components/schemas/Endpoint"}},
                    "requestId": {"type": "string"},
                    "meta": {"$ref": "#/components/schemas/PageMeta"},
                },
                "required": ["status", "data", "requestId", "meta"],
            },
            "ConversionDelete": {
                "type": "object",
                "properties": {"reason": {"type": "string", "maxLength": 200}},
                "required": ["reason"],
            },
            "ErrorEnvelope": {
                "type": "object",
                "properties": {
                    "status": {"type": "boolean"},
                    "errorCode": {"type": "string", "enum": ["UNAUTHORIZED", "CONFLICT"]},
                },
            },
        },
        "responses": {
            "Unauthorized": {
                "description": "UNAUTHORIZED: no credential.",
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}
                },
            }
        },
        "securitySchemes": {"ApiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}},
    },
}


@pytest.fixture(scope="module")
def future_page(docs_app) -> str:
    validate(FUTURE)
    with docs_app.test_request_context("/docs"):
        return render_template("docs.html", spec=FUTURE)


def test_any_document_of_the_shape_renders(future_page):
    for operation_id in ("fetchEndpoints", "deleteConversion"):
        assert f'id="{operation_id}"' in future_page
    assert "/brand/{brandId}/webhook/fetch-endpoints" in future_page
    assert "/brand/{brandId}/conversion/{conversionId}/delete" in future_page
    fetch = article(future_page, "fetchEndpoints")
    for shown in ("page", "status", "active", "disabled", "target.", "timeoutMs", "events[]."):
        assert shown in fetch, shown
    assert "Where events go." in fetch
    delete = article(future_page, "deleteConversion")
    assert "No response body" in delete
    assert "No credential required" in delete
    curl = curl_of(future_page, "deleteConversion")
    assert '-H "X-Api-Key' not in curl
    assert json.loads(JSON_BODY.search(curl).group(1)) == {"reason": "string"}
    assert "status=active" in curl_of(future_page, "fetchEndpoints")
    envelope = future_page[future_page.index('id="envelope"') : future_page.index('id="errors"')]
    assert "meta" in envelope and "hasNext" in envelope
    assert "CONFLICT" in future_page[future_page.index('id="errors"') :]


def test_document_text_is_escaped(future_page):
    assert "<script" not in future_page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in future_page
    assert "Future &lt;API&gt;" in future_page


def test_description_formatting_is_escaped_first():
    assert doc_inline("a `<b>` **bold** <i>") == Markup(
        "a <code>&lt;b&gt;</code> <strong>bold</strong> &lt;i&gt;"
    )
    assert doc_inline("`**not bold**`") == Markup("<code>**not bold**</code>")
    assert doc_inline("an `unclosed tick") == Markup("an `unclosed tick")
    rendered = doc_text("One\nline.\n\n- first `x`\n- second\n  continued\n\nLast <p>")
    assert rendered == Markup(
        "<p>One line.</p>\n<ul><li>first <code>x</code></li><li>second continued</li></ul>\n"
        "<p>Last &lt;p&gt;</p>"
    )
    assert doc_text(None) == Markup("")


def test_reference_resolves_refs_and_builds_examples(spec):
    # A relative server URL is taken from the site the reader reached.
    reference = api_reference(spec | {"servers": [{"url": "/api/v1"}]}, "https://api.example.test/")
    by_id = {op["id"]: op for tag in reference["tags"] for op in tag["operations"]}
    assert set(by_id) == {op["operationId"] for _p, _m, op in operations(spec)}
    create = by_id["createKey"]
    assert create["curl"].startswith(
        'curl -X POST "https://api.example.test/api/v1/brand/{brandId}/api-key/create-key"'
    )
    assert {f["name"] for f in create["body"]["fields"]} == {"name", "scopes"}
    assert create["body"]["example"] == {"name": "orders-service", "scopes": ["read", "write"]}
    assert create["notes"][0] == {"label": "Credential", "text": "bootstrap token only."}
    assert create["notes"][1]["label"] == "Rate limit"
    assert "RATE_LIMIT_PER_KEY" in create["notes"][1]["text"]
    postback_notes = by_id["recordPostback"]["notes"]
    assert "POSTBACK_RATE_LIMIT_PER_KEY" in postback_notes[1]["text"]
    fetch = by_id["fetchKeys"]
    assert fetch["success"]["data_many"] is True
    assert "keyPrefix" in {f["name"] for f in fetch["success"]["fields"]}
    assert json.loads(fetch["success"]["example"])["data"][0]["keyPrefix"] == "svc_live_4Fq"
    codes = {c["code"]: c["status"] for c in reference["envelope"]["codes"]}
    assert codes["VALIDATION_ERROR"] == "400" and codes["SERVICE_UNAVAILABLE"] == "503"


def test_docs_page_documents_every_event_with_its_sample_body(docs_app):
    from models.event_catalog import EVENT_TYPES, sample_data

    page = docs_app.test_client().get("/docs").get_data(as_text=True)
    assert "X-Service-Signature" in page and "X-Service-Delivery" in page
    for name, event in EVENT_TYPES.items():
        anchor = f'id="event-{name.replace(".", "-").replace("_", "-")}"'
        assert anchor in page, name
        article = page[page.index(anchor) :]
        article = article[: article.index("</article>")]
        assert event.description in html.unescape(article)
        code = re.search(r"<pre><code>(.*?)</code></pre>", article, re.DOTALL).group(1)
        body = json.loads(html.unescape(code))
        assert body["type"] == name
        assert body["data"] == sample_data(name)
