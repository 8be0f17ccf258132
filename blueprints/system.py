"""Probes and the API reference, outside /api/v1 and unauthenticated."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import cast

from flask import (
    Blueprint,
    current_app,
    redirect,
    render_template,
    request,
    send_from_directory,
    url_for,
)
from sqlalchemy import text

from blueprints.envelope import failure, success
from extensions import db
from models.columns import id_pattern
from workers.connection import redis_connection

system = Blueprint("system", __name__)
# What `make vendor-docs` put in static/vendor/: the Scalar release /docs loads.
SCALAR_RECORD = (
    Path(__file__).resolve().parent.parent / "static" / "vendor" / "scalar-api-reference.json"
)
_BRAND_ID = re.compile(id_pattern("brd"))


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
    """The API reference: Scalar renders the OpenAPI document in the browser. `?brandId=brd_…`
    (the dashboard's link) fills the brand's id into its examples; any other value is ignored."""
    brand_id = request.args.get("brandId", "")
    return render_template(
        "docs.html",
        scalar_file=scalar_file(),
        brand_id=brand_id if _BRAND_ID.fullmatch(brand_id) else None,
    )


@cache
def scalar_file() -> str:
    """The vendored Scalar bundle's file name, under static/vendor/."""
    return json.loads(SCALAR_RECORD.read_text())["file"]
