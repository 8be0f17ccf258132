"""The OpenAPI document is generated from the routes and their schemas, and documents all of
them: a route under /api/v1 that is not in it fails here."""

from __future__ import annotations

import re

from openapi_spec_validator import validate

from blueprints.api import API_PREFIX

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
            r"<(?:[a-z_]+:)?([a-z_]+)>",
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
    assert body["properties"]["name"]["maxLength"] == 100
    envelope_ref = operation["responses"]["201"]["content"]["application/json"]["schema"]["$ref"]
    envelope = spec["components"]["schemas"][envelope_ref.split("/")[-1]]
    data_ref = envelope["properties"]["data"]["$ref"].split("/")[-1]
    assert "secret" in spec["components"]["schemas"][data_ref]["properties"]
    assert {"400", "401", "403", "413"} <= set(operation["responses"])


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
        "url": "https://api.example.test/docs#license",
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
    assert patterns["endpointId"] == "^whe_[0-9a-z]+$"
    assert not re.match(patterns["endpointId"], "deliveries")
    assert len(patterns) == 10 and all(p.startswith("^") for p in patterns.values())
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


def test_record_examples_are_whole_consistent_records(client):
    schemas = client.get("/api/v1/openapi.json").get_json()["components"]["schemas"]
    campaign = schemas["Campaign"]["example"]
    assert campaign["status"] == "active" and campaign["publishedAt"]
    assert campaign["completedAt"] is None and campaign["cancelledAt"] is None
    for name in ("Campaign", "Deal", "Placement", "EscrowHold", "TrackedLink", "Conversion"):
        assert set(schemas[name]["example"]) == set(schemas[name]["properties"]), name
