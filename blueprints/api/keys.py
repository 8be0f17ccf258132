"""API key routes: createKey, rotateKey, fetchKeys, revokeKey (SPEC section 4)."""

from __future__ import annotations

from blueprints.api import api
from blueprints.api.auth import authenticate, current_caller
from blueprints.api.operations import operation
from models.api_key import READ, WRITE
from schemas.api_keys import ApiKeySchema, IssuedApiKeySchema, KeyCreateSchema, RevokedKeySchema
from services.api_keys import create_api_key, list_active_keys, revoke_api_key

TAG = "API keys"
SECRET_ONCE = "API key created; store the secret now, it is not shown again"  # noqa: S105 - a message


@api.post("/brand/<brand_id>/api-key/create-key")
@authenticate(bootstrap_token=True)
@operation(
    operation_id="createKey",
    tag=TAG,
    summary="Create an API key with a bootstrap token",
    description="For the brand's first key, or to recover when every key was revoked. Accepts "
    "only the bootstrap token support issued (`X-Service-Bootstrap-Token` or `Authorization: "
    "Bearer`); an API key is refused.",
    body=KeyCreateSchema,
    response=IssuedApiKeySchema,
    status=201,
    message=SECRET_ONCE,
)
def create_key(brand_id: str, body: dict):
    return create_api_key(
        brand_id=brand_id,
        name=body["name"],
        scopes=body["scopes"],
        created_by=current_caller().actor,
    )


@api.post("/brand/<brand_id>/api-key/rotate-key")
@authenticate(scope=WRITE)
@operation(
    operation_id="rotateKey",
    tag=TAG,
    summary="Create an additional API key",
    description="Mints a new key beside the caller's, which stays valid: deploy the new secret, "
    "then revoke the old key with revoke-key.",
    body=KeyCreateSchema,
    response=IssuedApiKeySchema,
    status=201,
    message=SECRET_ONCE,
)
def rotate_key(brand_id: str, body: dict):
    return create_api_key(
        brand_id=brand_id,
        name=body["name"],
        scopes=body["scopes"],
        created_by=current_caller().actor,
    )


@api.get("/brand/<brand_id>/api-key/fetch-keys")
@authenticate(scope=READ)
@operation(
    operation_id="fetchKeys",
    tag=TAG,
    summary="List the brand's active API keys",
    description="Newest first. Secrets are never listed; `keyPrefix` tells keys apart.",
    response=ApiKeySchema,
    many=True,
)
def fetch_keys(brand_id: str):
    return list_active_keys(brand_id)


@api.delete("/brand/<brand_id>/api-key/<id(key):key_id>/revoke-key")
@authenticate(scope=WRITE)
@operation(
    operation_id="revokeKey",
    tag=TAG,
    summary="Revoke an API key",
    description="Immediate: the next request with that secret fails with UNAUTHORIZED. Revoking "
    "an already revoked key answers the same, so a retry is safe.",
    response=RevokedKeySchema,
    message="API key revoked",
)
def revoke_key(brand_id: str, key_id: str):
    return revoke_api_key(brand_id=brand_id, key_id=key_id)
