"""API keys page: list, mint an additional key (rotate-key), revoke (SPEC section 4).

htmx posts get the fragment that changed; a plain form's post is answered with a 303 to the
page (a reload never mints a second key), the new secret reaching it once (`one_time`).
Revoking asks first: htmx with a dialog, a plain form with a page.
"""

from __future__ import annotations

from flask import flash, redirect, request, url_for

from blueprints.dashboard import dashboard, one_time
from blueprints.dashboard.rendering import load_form, render, render_confirmation
from blueprints.dashboard.session import current_caller, end_session, is_htmx, signed_in
from extensions import db
from schemas.api_keys import ApiKeySchema, IssuedApiKeySchema, KeyCreateSchema
from services.api_keys import create_api_key, list_active_keys, revoke_api_key
from services.errors import NotFound, ValidationFailed

_keys = ApiKeySchema(many=True)
_issued_key = IssuedApiKeySchema()
_key_form = KeyCreateSchema()
NEW_KEY = "api-key"


def _keys_context() -> dict:
    keys = _keys.dump(list_active_keys(current_caller().brand_id))
    return {
        "keys": keys,
        "revoke_consequences": {key["id"]: _revoke_consequence(key) for key in keys},
    }


def _revoke_consequence(key: dict) -> str:
    """What revoking `key` does, as the confirmation (a dialog, or a page) says it."""
    own = key["id"] == current_caller().key_id
    return (
        f"Revoke “{key['name']}” ({key['keyPrefix']}…)? Every request with it fails at once"
        f"{', and this session ends' if own else ''}. This cannot be undone."
    )


@dashboard.get("/keys")
@signed_in()
def keys():
    return render(
        "dashboard/keys.html",
        form={},
        errors={},
        issued=one_time.take(NEW_KEY),
        **_keys_context(),
    )


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
    if not is_htmx():
        one_time.stash(NEW_KEY, key)
        return redirect(url_for("dashboard.keys", _anchor="key-create"), code=303)
    return render(
        "dashboard/keys.html",
        fragment="dashboard/_key_created.html",
        status=201,
        issued=key,
        form={},
        errors={},
        **_keys_context(),
    )


@dashboard.get("/keys/<id(key):key_id>/revoke")
@signed_in(write=True)
def confirm_revoke_key(key_id: str):
    key = next((key for key in _keys_context()["keys"] if key["id"] == key_id), None)
    if key is None:
        raise NotFound(f"No active API key with id {key_id!r} in this brand")
    return render_confirmation(
        {
            "title": f"Revoke the key “{key['name']}”?",
            "consequence": _revoke_consequence(key),
            "button": "Revoke key",
            "action": url_for("dashboard.revoke_key", key_id=key_id),
        },
        back=url_for("dashboard.keys"),
    )


@dashboard.post("/keys/<id(key):key_id>/revoke")
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
    if not is_htmx():
        return redirect(url_for("dashboard.keys"), code=303)
    return render(
        "dashboard/keys.html",
        fragment="dashboard/_key_revoked.html",
        form={},
        errors={},
        # The one-time secret box the page shows goes with its key.
        close_secret=request.form.get("shownKeyId") == revoked.id,
        **_keys_context(),
    )


def _submitted_form() -> dict:
    return {"name": request.form.get("name", ""), "scopes": request.form.getlist("scopes")}
