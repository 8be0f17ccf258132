"""API keys page: list, mint an additional key (rotate-key), revoke (SPEC section 4)."""

from __future__ import annotations

from flask import flash, redirect, request, url_for

from blueprints.dashboard import dashboard
from blueprints.dashboard.rendering import load_form, render
from blueprints.dashboard.session import current_caller, end_session, is_htmx, signed_in
from extensions import db
from schemas.api_keys import ApiKeySchema, IssuedApiKeySchema, KeyCreateSchema
from services.api_keys import create_api_key, list_active_keys, revoke_api_key
from services.errors import ValidationFailed

_keys = ApiKeySchema(many=True)
_issued_key = IssuedApiKeySchema()
_key_form = KeyCreateSchema()


def _keys_context() -> dict:
    return {"keys": _keys.dump(list_active_keys(current_caller().brand_id))}


@dashboard.get("/keys")
@signed_in()
def keys():
    return render("dashboard/keys.html", form={}, errors={}, **_keys_context())


@dashboard.post("/keys")
@signed_in(write=True)
def create_key():
    """The dashboard's rotate-key: a new additional key; the session's key stays valid."""
    caller = current_caller()
    try:
        fields = load_form(_key_form)
        issued = create_api_key(
            brand_id=caller.brand_id,
            name=fields["name"],
            scopes=fields["scopes"],
            created_by=caller.actor,
        )
    except ValidationFailed as error:
        db.session.rollback()
        return render(
            "dashboard/keys.html",
            fragment="dashboard/_key_form.html",
            status=422,
            form=_submitted_form(),
            errors=error.errors,
            **_keys_context(),
        )
    key = _issued_key.dump(issued)
    db.session.commit()
    return render(
        "dashboard/keys.html",
        fragment="dashboard/_key_created.html",
        status=201,
        issued=key,
        form={},
        errors={},
        **_keys_context(),
    )


@dashboard.post("/keys/<key_id>/revoke")
@signed_in(write=True)
def revoke_key(key_id: str):
    caller = current_caller()
    revoked = revoke_api_key(brand_id=caller.brand_id, key_id=key_id)
    db.session.commit()
    if revoked.id == caller.key_id:
        # Revoking the session's own key ends the session, as it ends every other use of it.
        end_session()
        flash("You revoked the key this session signed in with; sign in with another key.", "info")
        target = url_for("dashboard.sign_in")
        if is_htmx():
            return "", 200, {"HX-Redirect": target}
        return redirect(target, code=303)
    flash(f"Key {revoked.key_prefix}… revoked.", "info")
    return render(
        "dashboard/keys.html",
        fragment="dashboard/_key_rows.html",
        form={},
        errors={},
        **_keys_context(),
    )


def _submitted_form() -> dict:
    return {"name": request.form.get("name", ""), "scopes": request.form.getlist("scopes")}
