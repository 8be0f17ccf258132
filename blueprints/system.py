"""Probes and the rendered API reference, outside /api/v1 and unauthenticated."""

from __future__ import annotations

from typing import cast

from flask import Blueprint, current_app, redirect, render_template, send_from_directory, url_for
from sqlalchemy import text

from blueprints.api.openapi import openapi_spec
from blueprints.docs_rendering import register_docs_helpers
from blueprints.envelope import failure, success
from extensions import db
from workers.connection import redis_connection

system = Blueprint("system", __name__)
register_docs_helpers(system)


@system.get("/")
def index():
    """The root has nothing of its own: send people to the API reference."""
    return redirect(url_for("system.docs"))


@system.get("/healthz")
def healthz():
    """The process is up; says nothing of its dependencies."""
    return success({"status": "ok"})


@system.get("/readyz")
def readyz():
    """Ready when the database and Redis both answer; otherwise 503 naming what is down."""
    down = []
    try:
        db.session.execute(text("SELECT 1"))
    except Exception:
        down.append("database")
    finally:
        db.session.rollback()
    try:
        connection = redis_connection(current_app)
        if connection is None or not connection.ping():
            down.append("redis")
    except Exception:
        down.append("redis")
    if down:
        return failure(
            503,
            "SERVICE_UNAVAILABLE",
            f"Not ready: {' and '.join(down)} unreachable",
            headers={"Retry-After": "5"},
        )
    return success({"status": "ready", "database": "ok", "redis": "ok"})


@system.get("/favicon.ico")
def favicon():
    """Where browsers look for an icon on any page, JSON ones included (16, 32 and 48 px, drawn
    from static/favicon.svg, which the HTML pages also name)."""
    return send_from_directory(
        cast(str, current_app.static_folder),  # the app's static/, which Flask types as optional
        "favicon.ico",
        mimetype="image/vnd.microsoft.icon",
        max_age=86400,
    )


@system.get("/docs")
def docs():
    """The OpenAPI document rendered as a readable, script-free page."""
    return render_template("docs.html", spec=openapi_spec(current_app))
