"""The application factory: `flask --app app ...` and `gunicorn "app:create_app()"`."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import cast

from flask import Flask, current_app, g, request
from flask.json.provider import DefaultJSONProvider
from sqlalchemy import event
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.middleware.proxy_fix import ProxyFix

import models  # noqa: F401 - registers every model with the metadata before migrations read it
from blueprints.api import API_PREFIX, register_routes
from blueprints.dashboard import register_dashboard
from blueprints.envelope import REQUEST_ID_HEADER, request_id
from commands import (
    app_for_help_only,
    loaded_by_the_command_line,
    loaded_for_its_commands,
    register_commands,
)
from config import ConfigError, Settings
from extensions import db, init_migrations
from observability.logs import configure_logging
from observability.metrics import count_request
from observability.tracing import start_tracing
from services import work_slots
from services.connections import KEEPALIVES, ping_when_idle
from services.secret_box import SecretBox
from services.wakeups import forget_wakeups, send_wakeups_at_commit

MAX_BODY_BYTES = 64 * 1024
# pool_timeout: a request waits at most this long for a pooled connection, then is answered 503
# with Retry-After (blueprints/errors.py), never left waiting for as long as others hold them.
# A fixed pool: overflow connections were opened and closed again under a flood of requests (a
# PostgreSQL backend forked for each), and a connection goes back in LIFO order, so that the few
# a process needs stay warm and skip the idle ping (services/connections.py, ping_when_idle).
ENGINE_OPTIONS = {
    "pool_size": 20,
    "max_overflow": 0,
    "pool_use_lifo": True,
    "pool_recycle": 1800,
    "pool_timeout": 5,
}
# Behind PgBouncer in transaction mode each transaction may get another server connection, where
# a statement psycopg prepared (after 5 runs, by default) does not exist: none is prepared.
POOLED_ENGINE_OPTIONS = {**ENGINE_OPTIONS, "connect_args": {"prepare_threshold": None}}
# Requests of one process doing work at once; many more may wait (services/work_slots.py).
WORK_SLOTS_PER_PROCESS = 4
access_log = logging.getLogger("brand_api.access")


def create_app(environ: Mapping[str, str] | None = None) -> Flask:
    """Build the app from `environ` (default: the process environment)."""
    app = Flask(__name__, instance_relative_config=True)
    migrations = os.path.join(app.root_path, "migrations")
    try:
        settings = Settings.from_environ(
            os.environ if environ is None else environ,
            instance_path=app.instance_path,
        )
    except ConfigError as error:
        if not loaded_by_the_command_line():
            raise
        # `flask --app app … --help` needs no setting; running a command says what is missing.
        return app_for_help_only(app, str(error), migrations)
    app.extensions["settings"] = settings
    app.extensions["secret_box"] = SecretBox(settings.encryption_key)
    app.config.update(
        SECRET_KEY=settings.secret_key,
        SQLALCHEMY_DATABASE_URI=settings.database_url,
        SQLALCHEMY_ENGINE_OPTIONS=(
            POOLED_ENGINE_OPTIONS if settings.behind_a_pooler else ENGINE_OPTIONS
        ),
        MAX_CONTENT_LENGTH=MAX_BODY_BYTES,
        TESTING=settings.app_env == "test",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=settings.is_production,
    )
    # Flask types `app.json` as any provider; the app keeps Flask's default one.
    cast(DefaultJSONProvider, app.json).sort_keys = False
    configure_logging(settings.log_format)

    db.init_app(app)
    with app.app_context():
        event.listen(db.engine, "do_connect", _name_connection)
        ping_when_idle(db.engine)
        # A postback's wake-up goes after its commit (services/wakeups.py, wake_after_commit).
        event.listen(db.engine, "commit", send_wakeups_at_commit)
        event.listen(db.engine, "rollback", forget_wakeups)
        if not settings.behind_a_pooler:
            # A pooler's server connections get it from the pooler (deploy/pgbouncer.ini's
            # connect_query): a SET here would land on whichever one this client had first.
            event.listen(db.engine, "connect", _turn_jit_off)
    for_commands = loaded_for_its_commands()  # `flask --app app <command>`: it serves nothing
    if not for_commands:
        init_migrations(app, migrations)  # at once: the tests' flask_migrate.upgrade() needs it
    register_commands(app, migrations)
    if for_commands:
        return app  # no need to import the web's modules
    # Imported here, not above: `flask --app app <command>` never needs them (docs/benchmarks.md,
    # "Command-line start-up").
    from blueprints.admission import admit
    from blueprints.dashboard.session import DashboardCookieSessions
    from blueprints.errors import register_error_handlers
    from blueprints.metrics import metrics
    from blueprints.system import system

    app.session_interface = DashboardCookieSessions()
    app.register_blueprint(register_routes())
    app.register_blueprint(register_dashboard())
    app.register_blueprint(system)
    app.register_blueprint(metrics)
    register_error_handlers(app)
    work_slots.install(WORK_SLOTS_PER_PROCESS)
    # A server span per request when OTLP export is configured; nothing otherwise. First, so
    # that admission's work (the key's lookup, its rate limit) is inside the request's span.
    start_tracing("brand-api", app=app)
    app.before_request(_start_request)
    app.before_request(admit)  # the body, the caller, then a work slot (blueprints/admission.py)
    app.after_request(_finish_request)
    app.teardown_request(work_slots.give_back)
    if settings.proxy_hops:
        # Our own proxies' X-Forwarded-For and -Proto, exactly PROXY_HOPS of them from the right:
        # the sign-in throttle and the logs then see the client, and a client's own header
        # names nobody (docs/deployment.md).
        app.wsgi_app = ProxyFix(  # type: ignore[method-assign]
            app.wsgi_app, x_for=settings.proxy_hops, x_proto=settings.proxy_hops
        )
    return app


def _name_connection(dialect, connection_record, cargs, cparams) -> None:
    # pg_stat_activity then says which process holds each connection: what an operator sizing
    # the pool (and a test bounding a worker's connections) needs. Set at connect, after any
    # fork, so a gunicorn worker's connections carry its own pid. A URL's own name wins.
    cparams.setdefault("application_name", f"brand-api pid={os.getpid()}")
    # A dead peer noticed in seconds (services/connections.py).
    for name, value in KEEPALIVES.items():
        cparams.setdefault(name, value)


def _turn_jit_off(dbapi_connection, connection_record) -> None:
    # Our statements are short; PostgreSQL's JIT only adds to them. Past its cost threshold (a
    # claim over 100 endpoints with 1M deliveries queued) it compiled for 90 ms to run a 6 ms
    # claim (docs/benchmarks.md). A SET, not a startup option, so that poolers pass it.
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET jit = off")
    dbapi_connection.commit()


def _start_request() -> None:
    g.started_at = time.perf_counter()
    request_id()
    # Refuse a declared oversized body before any work (authentication included); a chunked body
    # without a length is still cut off at the limit when it is read.
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    if request.content_length is not None and request.content_length > limit:
        raise RequestEntityTooLarge()


# Pages load only the app's own scripts and stylesheets (htmx is vendored under static/), talk
# only to the app, and nothing may frame or sniff them: no inline script or style anywhere.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
# /docs alone also allows inline styles: Scalar (the vendored API reference) writes its styles
# into <style> elements and style attributes as it renders, and a nonce would cover only some
# of them. Scripts stay the app's own files; nothing else changes (docs/decisions.md).
DOCS_CONTENT_SECURITY_POLICY = CONTENT_SECURITY_POLICY.replace(
    "style-src 'self'", "style-src 'self' 'unsafe-inline'"
)
DOCS_ENDPOINT = "system.docs"


STRICT_TRANSPORT_SECURITY = "max-age=31536000; includeSubDomains"


def _finish_request(response):
    response.headers[REQUEST_ID_HEADER] = request_id()
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    if response.mimetype == "text/html":
        policy = (
            DOCS_CONTENT_SECURITY_POLICY
            if request.endpoint == DOCS_ENDPOINT
            else CONTENT_SECURITY_POLICY
        )
        response.headers.setdefault("Content-Security-Policy", policy)
    if request.path.startswith(API_PREFIX):
        # Responses may carry a one-time secret; no cache along the way may keep any of them.
        response.headers["Cache-Control"] = "no-store"
    if current_app.extensions["settings"].is_production:
        # Production is HTTPS only: a browser that once reached it never tries plain HTTP again.
        response.headers["Strict-Transport-Security"] = STRICT_TRANSPORT_SECURITY
    # The one access line of every request (API, dashboard, health), so that `make run` needs
    # no second one from gunicorn. The path only: a query string is the caller's to keep.
    caller = g.get("caller")
    path = request.path
    if not path.isprintable():  # a %0A in the URL must not start a forged log line
        path = path.encode("unicode_escape").decode("ascii")
    seconds = time.perf_counter() - g.get("started_at", time.perf_counter())
    operation = _operation_name()
    count_request(operation, request.method, response.status_code, seconds)
    access_log.info(
        "request_id=%s method=%s path=%s status=%s duration_ms=%.1f client=%s caller=%s",
        request_id(),
        request.method,
        path,
        response.status_code,
        seconds * 1000,
        request.remote_addr or "-",
        caller.actor if caller else "-",
        extra={
            "request_id": request_id(),
            "operation": operation,
            "method": request.method,
            "path": path,
            "status": response.status_code,
            "duration_ms": round(seconds * 1000, 1),
            # The peer, or behind our proxies (PROXY_HOPS) the client they name.
            "client": request.remote_addr,
            "brand_id": caller.brand_id if caller else None,
            "key_id": caller.key_id if caller else None,
        },
    )
    return response


def _operation_name() -> str:
    """The API's operationId, else the route's endpoint name: a bounded set, fit for a label."""
    rule = request.url_rule
    if rule is None:
        return "unmatched"
    declared = getattr(current_app.view_functions.get(rule.endpoint), "operation", None)
    return declared.operation_id if declared else rule.endpoint
