"""The OpenAPI document is generated from the routes and their schemas, and documents all of
them: a route under /api/v1 that is not in it fails here."""

from __future__ import annotations

import itertools
import re
import unicodedata

import pytest
from marshmallow import ValidationError
from openapi_spec_validator import validate

from blueprints.api import API_PREFIX
from schemas.base import SPACES, Label, OptionalText, trimmed_text_pattern

UNDOCUMENTED_BY_DESIGN = {f"{API_PREFIX}/openapi.json"}


def document(client) -> dict:
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    return response.get_json()


def test_document_is_valid_openapi_3(client):
    spec = document(client)
    validate(spec)
    assert spec["openapi"].startswith("3.")
    assert spec["info"]["version"] == "1"


def test_every_api_route_and_method_is_documented(app, client):
    paths = document(client)["paths"]
    missing = []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith(API_PREFIX) or rule.rule in UNDOCUMENTED_BY_DESIGN:
            continue
        path = re.sub(
            r"<(?:[a-z_]+(?:\([^)]*\))?:)?([a-z_]+)>",
            lambda m: "{" + re.sub(r"_([a-z])", lambda c: c.group(1).upper(), m.group(1)) + "}",
            rule.rule[len(API_PREFIX) :],
        )
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            if method.lower() not in paths.get(path, {}):
                missing.append(f"{method} {rule.rule}")
    assert missing == []


def test_operations_carry_the_spec_operation_ids(client):
    ids = {
        operation["operationId"]
        for item in document(client)["paths"].values()
        for operation in item.values()
    }
    assert {"createKey", "rotateKey", "fetchKeys", "revokeKey"} <= ids


def test_create_key_is_documented_with_its_schemas_and_credential(client):
    spec = document(client)
    operation = spec["paths"]["/brand/{brandId}/api-key/create-key"]["post"]
    assert operation["security"][0] == {"BootstrapToken": []}
    body_ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body = spec["components"]["schemas"][body_ref.split("/")[-1]]
    assert body["required"] == ["name"]
    assert body["properties"]["scopes"]["items"]["enum"] == ["read", "write"]
    name = re.compile(body["properties"]["name"]["pattern"])
    assert name.match("x" * 100) and name.match(" orders-service ")
    assert not name.match("x" * 101) and not name.match("   ") and not name.match("a\tb")
    envelope_ref = operation["responses"]["201"]["content"]["application/json"]["schema"]["$ref"]
    envelope = spec["components"]["schemas"][envelope_ref.split("/")[-1]]
    data_ref = envelope["properties"]["data"]["$ref"].split("/")[-1]
    assert "secret" in spec["components"]["schemas"][data_ref]["properties"]
    assert {"400", "401", "403", "413"} <= set(operation["responses"])


def test_every_operation_that_reads_a_body_documents_the_415_and_only_those(client):
    spec = document(client)
    component = spec["components"]["responses"]["UnsupportedMediaType"]
    assert component["description"].startswith("UNSUPPORTED_MEDIA_TYPE: ")
    example = component["content"]["application/json"]["example"]
    assert example["errorCode"] == "UNSUPPORTED_MEDIA_TYPE" and example["statusCode"] == 415
    operations = [op for item in spec["paths"].values() for op in item.values()]
    with_body = [op for op in operations if "requestBody" in op]
    assert len(with_body) >= 7
    for operation in operations:
        documented = operation["responses"].get("415")
        if "requestBody" in operation:
            assert documented == {"$ref": "#/components/responses/UnsupportedMediaType"}
            assert list(operation["requestBody"]["content"]) == ["application/json"]
        else:
            assert documented is None, operation["operationId"]


def test_listing_schema_has_no_secret(client):
    spec = document(client)
    operation = spec["paths"]["/brand/{brandId}/api-key/fetch-keys"]["get"]
    envelope_ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    envelope = spec["components"]["schemas"][envelope_ref.split("/")[-1]]
    item_ref = envelope["properties"]["data"]["items"]["$ref"].split("/")[-1]
    assert "secret" not in spec["components"]["schemas"][item_ref]["properties"]
    assert operation["security"][0] == {"ApiKey": []}


PLATFORM_OPERATIONS = (
    "fetchCampaigns",
    "fetchCampaign",
    "fetchDeals",
    "fetchDeal",
    "fetchLinks",
    "fetchLink",
    "fetchPlacements",
    "fetchPlacement",
    "fetchEscrowHolds",
    "fetchEscrowHold",
    "fetchWorkspace",
)


def _referenced_schemas(spec: dict, node, seen: set[str]) -> set[str]:
    """Every component schema `node` reaches through `$ref`, transitively."""
    if isinstance(node, dict):
        ref = node.get("$ref", "")
        if ref.startswith("#/components/schemas/"):
            name = ref.rsplit("/", 1)[1]
            if name not in seen:
                seen.add(name)
                _referenced_schemas(spec, spec["components"]["schemas"][name], seen)
        for value in node.values():
            _referenced_schemas(spec, value, seen)
    elif isinstance(node, list):
        for value in node:
            _referenced_schemas(spec, value, seen)
    return seen


def test_every_field_of_the_platform_records_is_described(client):
    """The records' fields are "not shown" in SPEC: the document is where they are defined."""
    spec = document(client)
    operations = {
        operation["operationId"]: operation
        for path in spec["paths"].values()
        for operation in path.values()
    }
    assert set(PLATFORM_OPERATIONS) <= set(operations)
    records = set()
    for operation_id in PLATFORM_OPERATIONS:
        success = operations[operation_id]["responses"]["200"]
        records |= _referenced_schemas(spec, success, set())
    records = {name for name in records if not name.endswith("Envelope") and name != "PageMeta"}
    assert {"Campaign", "Deal", "EscrowSnapshot", "Settlement", "TrackedLink"} <= records
    assert {"Placement", "EscrowHold", "Workspace", "Caller", "Period"} <= records
    undescribed = {
        f"{name}.{field}"
        for name in records
        for field, schema in spec["components"]["schemas"][name].get("properties", {}).items()
        if not schema.get("description")
    }
    assert undescribed == set()
    for operation_id in PLATFORM_OPERATIONS:
        for parameter in operations[operation_id].get("parameters", []):
            assert parameter.get("description"), (operation_id, parameter["name"])


def test_servers_give_the_absolute_base_of_this_deployment(client):
    spec = client.get("/api/v1/openapi.json", base_url="https://api.example.test").get_json()
    assert spec["servers"] == [
        {"url": "https://api.example.test/api/v1", "description": "This deployment"}
    ]
    assert spec["info"]["license"] == {
        "name": "Proprietary",
        "url": "https://api.example.test/docs#description/license",
    }


def test_path_ids_declare_their_prefix_so_no_two_paths_match_one_url(client):
    """`/webhook/{endpointId}/delete-endpoint` and `/webhook/deliveries/{deliveryId}` look
    ambiguous to a linter; the endpoint id's pattern rules `deliveries` out."""
    spec = client.get("/api/v1/openapi.json").get_json()
    patterns = {}
    for item in spec["paths"].values():
        for operation in item.values():
            for parameter in operation["parameters"]:
                if parameter["in"] == "path":
                    patterns[parameter["name"]] = parameter["schema"]["pattern"]
    assert patterns["endpointId"] == "^whe_[0-9a-z]{1,36}$"
    assert not re.match(patterns["endpointId"], "deliveries")
    assert len(patterns) == 12 and all(p.startswith("^") for p in patterns.values())
    assert "look alike to a\nlinter" in spec["info"]["description"]


def test_record_postback_documents_the_201_and_the_replays_200_apart(client):
    spec = client.get("/api/v1/openapi.json").get_json()
    responses = spec["paths"]["/brand/{brandId}/conversion/record-postback"]["post"]["responses"]

    def data_schema(status: str) -> dict:
        envelope = responses[status]["content"]["application/json"]["schema"]["$ref"]
        data = spec["components"]["schemas"][envelope.split("/")[-1]]["properties"]["data"]
        return spec["components"]["schemas"][data["$ref"].split("/")[-1]]

    assert data_schema("201")["properties"]["replay"]["example"] is False
    assert data_schema("200")["properties"]["replay"]["example"] is True
    # CONTRACT 11.2: both answers say which link the code matched, or null.
    for status in ("201", "200"):
        link_id = data_schema(status)["properties"]["linkId"]
        assert link_id["example"].startswith("lnk_") and "null" in str(link_id), link_id


def test_record_examples_are_whole_consistent_records(client):
    schemas = client.get("/api/v1/openapi.json").get_json()["components"]["schemas"]
    campaign = schemas["Campaign"]["example"]
    assert campaign["status"] == "active" and campaign["publishedAt"]
    assert campaign["completedAt"] is None and campaign["cancelledAt"] is None
    for name in ("Campaign", "Deal", "Placement", "EscrowHold", "TrackedLink", "Conversion"):
        assert set(schemas[name]["example"]) == set(schemas[name]["properties"]), name


# --- every rule the server enforces is in the document ----------------------------------------


def operations_of(spec: dict) -> dict[str, tuple[str, str, dict]]:
    return {
        operation["operationId"]: (method, path, operation)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
    }


def test_every_authenticated_route_documents_429_its_scope_and_rate_limit_headers(client):
    spec = document(client)
    for operation_id, (_method, _path, operation) in operations_of(spec).items():
        assert "security" in operation, operation_id
        if operation_id != "fetchEvents":  # its own 429 adds the long-poll caps (below)
            assert operation["responses"]["429"] == {"$ref": "#/components/responses/RateLimited"}
        assert {"401", "403", "500", "503"} <= set(operation["responses"]), operation_id
        assert operation["x-required-scope"] in {"read", "write", "any", "bootstrap-token"}
    scopes = {name: op["x-required-scope"] for name, (_m, _p, op) in operations_of(spec).items()}
    assert scopes["createKey"] == "bootstrap-token"
    assert scopes["recordPostback"] == "any"
    assert scopes["sendWebhookTest"] == "read" and scopes["fetchKeys"] == "read"
    assert scopes["rotateKey"] == "write" and scopes["deleteWebhookEndpoint"] == "write"
    rate_limited = spec["components"]["responses"]["RateLimited"]
    assert rate_limited["headers"]["Retry-After"]["required"] is True
    assert {"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} <= set(
        rate_limited["headers"]
    )
    _method, _path, fetch_keys = operations_of(spec)["fetchKeys"]
    assert "RateLimit-Remaining" in fetch_keys["responses"]["200"]["headers"]


def test_fetch_events_429_states_the_long_poll_caps(client):
    """A long-poll past its key's or its server's cap is refused 429
    (tests/test_event_wait_caps.py); the document says so where a client looks: that 429."""
    spec = document(client)
    _method, _path, fetch_events = operations_of(spec)["fetchEvents"]
    refused = fetch_events["responses"]["429"]
    shared = spec["components"]["responses"]["RateLimited"]
    assert refused["description"].startswith(shared["description"])
    for rule in ("EVENT_WAITS_PER_KEY", "(default 10)", "EVENT_WAITS_PER_PROCESS", "(default 128"):
        assert rule in refused["description"]
    assert refused["headers"] == shared["headers"]
    assert refused["headers"]["Retry-After"]["required"] is True
    example = refused["content"]["application/json"]["example"]
    assert (example["status"], example["statusCode"], example["errorCode"]) == (
        False,
        429,
        "RATE_LIMITED",
    )


def test_id_filters_and_labels_state_the_patterns_their_validators_use(client):
    spec = document(client)
    schemas = spec["components"]["schemas"]
    _method, _path, fetch_deals = operations_of(spec)["fetchDeals"]
    [campaign_id] = [p for p in fetch_deals["parameters"] if p["name"] == "campaignId"]
    assert campaign_id["schema"]["pattern"] == "^cmp_[0-9a-z]{1,36}$"
    postback = schemas["Postback"]["properties"]
    assert postback["currency"]["enum"] == ["NGN", "USD"]
    assert postback["valueMinor"]["maximum"] == 10**15
    event_type = re.compile(postback["eventType"]["pattern"])
    assert event_type.match("purchase") and not event_type.match("pur\x85chase")
    register = schemas["EndpointRegister"]["properties"]
    assert "deal.completed" in register["events"]["contains"]["enum"]
    url = re.compile(register["url"]["pattern"])
    assert url.match("https://hooks.example.com/brand-api") and url.match("http://localhost:8000/h")
    assert not url.match("http://hooks.example.com/") and not url.match("https://10.0.0.1/")
    assert not url.match("https://user:pw@hooks.example.com/")
    description = re.compile(register["description"]["pattern"])
    assert description.match("") and description.match("x" * 200) and not description.match("a\nb")
    assert schemas["EndpointUpdate"]["minProperties"] == 1
    _method, _path, deliveries = operations_of(spec)["fetchWebhookDeliveries"]
    endpoint_filter = next(p for p in deliveries["parameters"] if p["name"] == "endpointId")
    assert endpoint_filter["schema"]["pattern"] == r"^[^\x00]*$"  # NUL is refused everywhere


def test_a_production_document_admits_https_receivers_only(app_environ):
    from app import create_app

    production = create_app(
        {**app_environ, "APP_ENV": "production"}
    )  # nothing is served: only the document is built
    spec = production.test_client().get("/api/v1/openapi.json").get_json()
    url = re.compile(
        spec["components"]["schemas"]["EndpointRegister"]["properties"]["url"]["pattern"]
    )
    assert url.match("https://hooks.example.com/") and not url.match("http://localhost:8000/")


def test_rotate_secrets_body_is_optional_and_every_other_body_required(client):
    spec = document(client)
    bodies = {
        name: operation["requestBody"]["required"]
        for name, (_m, _p, operation) in operations_of(spec).items()
        if "requestBody" in operation
    }
    assert bodies.pop("rotateWebhookSecret") is False
    assert set(bodies.values()) == {True}


def test_options_advertises_only_the_methods_of_the_path_asked_about(client):
    """`record-postback` is no conversion id: it is not matched by GET /conversion/{id}."""
    path = "/api/v1/brand/brd_01jd3k7a9b1c3d5e7f9g1h3j5k/conversion/record-postback"
    response = client.options(path)
    assert set(response.headers["Allow"].split(", ")) == {"OPTIONS", "POST"}
    refused = client.get(path)
    assert refused.status_code == 405 and refused.headers["Allow"] == response.headers["Allow"]
    delivery = "/api/v1/brand/brd_01jd3k7a9b1c3d5e7f9g1h3j5k/webhook/deliveries/stats"
    assert client.get(delivery).status_code == 404  # neither a delivery id nor an endpoint id


@pytest.mark.parametrize("max_length", [1, 2, 100])
def test_trimmed_text_patterns_accept_exactly_what_the_fields_accept(max_length):
    """The patterns are regular expressions written beside the code that enforces the rule;
    this holds the two to each other over the characters that matter."""
    pieces = ["a", "é", " ", "\xa0", "\u3000", "\t", "\n", "\x85", "\x00", "\x7f", "\u2028"]
    samples = {""} | {
        "".join(combination)
        for length in range(1, 4)
        for combination in itertools.product(pieces, repeat=length)
    }
    samples |= {"a" * max_length, " " + "a" * max_length + " ", "a" * (max_length + 1)}
    for field, blank in (
        (Label(max_length=max_length), False),
        (OptionalText(max_length=max_length), True),
    ):
        pattern = re.compile(trimmed_text_pattern(max_length, may_be_blank=blank))
        for sample in samples:
            try:
                field.deserialize(sample)
                accepted = True
            except ValidationError:
                accepted = False
            # fullmatch: JSON Schema's `$` is the end of the string, Python's `$` also before a last
            # line break
            assert bool(pattern.fullmatch(sample)) == accepted, (field, sample)


def test_the_spaces_trimmed_are_every_whitespace_that_is_no_control_character():
    whitespace = {
        chr(code)
        for code in range(0x110000)
        if chr(code).isspace() and unicodedata.category(chr(code)) != "Cc"
    }
    assert {c for c in whitespace if re.fullmatch(f"[{SPACES}]", c)} == whitespace
    assert not any(
        re.fullmatch(f"[{SPACES}]", chr(c)) for c in range(0x110000) if chr(c) not in whitespace
    )


def test_an_integral_number_is_an_integer_as_the_documents_json_schema_counts_them(
    client, brand, write_key
):
    """OpenAPI 3.1 is JSON Schema 2020-12, where `1250.0` is an integer: the server takes it
    as 1250, and still refuses `12.5` and `"1250"`."""
    postback = f"/api/v1/brand/{brand}/conversion/record-postback"
    headers = {"X-Api-Key": write_key, "Idempotency-Key": "order-20931-purchase"}
    stored = client.post(
        postback, json={"eventType": "purchase", "valueMinor": 1250.0}, headers=headers
    )
    assert stored.status_code == 201, stored.get_json()
    conversion_id = stored.get_json()["data"]["conversionId"]
    fetched = client.get(
        f"/api/v1/brand/{brand}/conversion/{conversion_id}", headers={"X-Api-Key": write_key}
    ).get_json()["data"]
    assert fetched["valueMinor"] == 1250 and isinstance(fetched["valueMinor"], int)
    for refused in (12.5, "1250"):
        answer = client.post(
            postback,
            json={"eventType": "purchase", "valueMinor": refused},
            headers=headers | {"Idempotency-Key": "order-20932-purchase"},
        )
        assert answer.status_code == 400 and "valueMinor" in answer.get_json()["errors"]
    document = client.get("/api/v1/openapi.json").get_json()
    assert document["components"]["schemas"]["Postback"]["properties"]["valueMinor"]["type"] == (
        "integer"
    )
