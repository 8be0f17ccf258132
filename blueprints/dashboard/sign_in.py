"""Signing in and out: with an API key, or with brand id + bootstrap token to mint the first key
(CONTRACT section 7). A successful post is answered with a 303, so a reload never posts again
(the first key's secret reaches the page after it once, `one_time`)."""

from __future__ import annotations

from flask import flash, redirect, request, session, url_for

from blueprints.api.auth import client_address, rate_limiter
from blueprints.dashboard import dashboard, one_time
from blueprints.dashboard.rendering import load_form, render
from blueprints.dashboard.session import end_session, safe_next, signed_in, start_session
from extensions import db
from models import credentials
from schemas.api_keys import IssuedApiKeySchema
from schemas.dashboard import BootstrapSignInSchema
from services.api_keys import create_api_key
from services.authentication import (
    Caller,
    authenticate_api_key,
    authenticate_bootstrap_token,
    authorize,
)
from services.errors import Forbidden, NotFound, Unauthorized, ValidationFailed
from services.sign_in_throttle import Refusal, count_failed_sign_in, sign_in_refusal

_issued_key = IssuedApiKeySchema()
_bootstrap_form = BootstrapSignInSchema()
FIRST_KEY = "first-key"
# Why the last sign-in was refused, for the form the refusal redirects to (never the key).
REFUSED = "sign_in_refused"


@dashboard.get("/sign-in")
def sign_in():
    next_page = request.args.get("next", "")
    safe_next(next_page)  # a `next` refused now is not carried into the form
    refused = session.pop(REFUSED, None) or {}
    return render(
        "dashboard/sign_in.html",
        next=next_page,
        error=refused.get("error"),
        bootstrap_token_pasted=refused.get("bootstrap_token", False),
    )


@dashboard.post("/sign-in")
def sign_in_with_key():
    """A refused key answers like a signed-in one, with a 303 (to the form again, saying why),
    so a reload never posts the key again. An address with too many failures is refused before
    its key is even looked at."""
    secret = request.form.get("apiKey", "").strip()
    next_page = request.form.get("next", "")
    safe_next(next_page)
    refusal = _sign_in_refusal()
    if refusal is not None:
        return _too_many_failures("dashboard/sign_in.html", refusal, next=next_page)
    if secret.startswith(credentials.BOOTSTRAP_TOKEN_PREFIX):
        # Support's token mints a first key; it never signs in. Say where it goes instead.
        return _refused(
            "That is a bootstrap token, not an API key: it cannot sign in. Use it to create "
            "your brand's first key.",
            next_page,
            bootstrap_token=True,
        )
    try:
        caller = authenticate_api_key(secret)
    except Unauthorized as error:
        db.session.rollback()
        _count_failed_sign_in()
        return _refused(error.message, next_page)
    start_session(caller)
    return redirect(safe_next(next_page), code=303)


def _sign_in_refusal() -> Refusal | None:
    limiter = rate_limiter()
    return None if limiter is None else sign_in_refusal(limiter, client_address())


def _count_failed_sign_in() -> None:
    limiter = rate_limiter()
    if limiter is not None:
        count_failed_sign_in(limiter, client_address())


def _too_many_failures(template: str, refusal: Refusal, **context):
    """429: the form again, saying how long until a sign-in may be tried once more."""
    wait = refusal.retry_after
    if refusal.everyone:
        message = (
            "Too many failed sign-ins to this service from everywhere just now. Try again in "
            f"{wait} seconds; until then no key or token is checked."
        )
    else:
        message = (
            f"Too many failed sign-ins from your address. Try again in {wait} seconds; until "
            "then no key or token is checked from it."
        )
    body, status = render(
        template, status=429, error=message, form={}, errors={}, throttled=True, **context
    )
    return body, status, {"Retry-After": str(wait)}


def _refused(message: str, next_page: str, *, bootstrap_token: bool = False):
    session[REFUSED] = {"error": message, "bootstrap_token": bootstrap_token}
    return redirect(url_for("dashboard.sign_in", next=next_page or None), code=303)


@dashboard.get("/first-key")
def first_key():
    return render("dashboard/first_key.html", form={}, errors={})


@dashboard.post("/first-key")
def create_first_key():
    """Mint a key with the bootstrap token support issued, sign in with it, show it once."""
    form = request.form.to_dict()
    form.pop("bootstrapToken", None)  # a credential: never rendered back into the page
    refusal = _sign_in_refusal()
    if refusal is not None:
        return _too_many_failures("dashboard/first_key.html", refusal)
    try:
        fields = load_form(_bootstrap_form)
        caller = authenticate_bootstrap_token(fields["bootstrap_token"])
        authorize(caller, fields["brand_id"], None)
        issued = create_api_key(
            brand_id=fields["brand_id"],
            name=fields["name"],
            scopes=fields["scopes"],
            created_by=caller.actor,
        )
    except ValidationFailed as error:
        db.session.rollback()
        return render(
            "dashboard/first_key.html",
            status=400,
            form=form,
            errors=error.errors,
            error=error.message,
        )
    except (Unauthorized, Forbidden, NotFound) as error:
        db.session.rollback()
        _count_failed_sign_in()
        return render(
            "dashboard/first_key.html", status=401, form=form, errors={}, error=error.message
        )
    key = _issued_key.dump(issued)
    start_session(Caller(brand_id=issued.record.brand_id, scopes=frozenset(), key_id=key["id"]))
    one_time.stash(FIRST_KEY, key)
    return redirect(url_for("dashboard.first_key_created"), code=303)


@dashboard.get("/first-key/created")
@signed_in()
def first_key_created():
    """The first key's secret, once; a reload finds it gone and goes on to the dashboard."""
    key = one_time.take(FIRST_KEY)
    if key is None:
        flash("You are signed in with your new key; its secret was shown once.", "info")
        return redirect(url_for("dashboard.overview"), code=303)
    return render("dashboard/first_key_issued.html", key=key)


@dashboard.post("/sign-out")
def sign_out():
    end_session()
    flash("Signed out.", "info")
    return redirect(url_for("dashboard.sign_in"), code=303)
