"""The ceiling of the postback benchmark (bench/postbacks.py): a bare Flask app whose one route
does the least any postback must do, so the real route's rate can be read against it.

    gunicorn "bench.postback_ceiling:create_app()"    (DATABASE_URL: the bench's database)

`POST /api/v1/brand/<brand_id>/conversion/record-postback` (the real route's path, so one load
script serves both servers) parses the JSON body, then in ONE transaction INSERTs a row into
`bench_ceiling_rows` and SELECTs it back through a SQLAlchemy Core engine with the app's pool
settings (`app.ENGINE_OPTIONS`), and answers 201 with the SPEC envelope. The row's id is the
request's `Idempotency-Key` (a duplicate would fail loudly: a check on the load script). No
authentication, no schema, no event, no log line. `GET /healthz` answers 200 for start-up.

The table is created by the benchmark (`create_table`) before gunicorn starts, not by each
worker: two workers racing on CREATE TABLE IF NOT EXISTS can fail.
"""

from __future__ import annotations

import os
import secrets
from datetime import UTC, datetime

from flask import Flask, jsonify, request
from sqlalchemy import JSON, Column, DateTime, MetaData, Table, Text, create_engine, select
from sqlalchemy.engine import Engine

from app import ENGINE_OPTIONS

ROUTE = "/api/v1/brand/<brand_id>/conversion/record-postback"

_metadata = MetaData()
rows = Table(
    "bench_ceiling_rows",
    _metadata,
    Column("id", Text, primary_key=True),
    Column("body", JSON, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)


def make_engine(database_url: str) -> Engine:
    """An engine pooled exactly as the app's (Flask-SQLAlchemy passes the same options)."""
    return create_engine(database_url, **ENGINE_OPTIONS)


def create_table(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        _metadata.create_all(engine)
    finally:
        engine.dispose()


def create_app() -> Flask:
    app = Flask(__name__)
    engine = make_engine(os.environ["DATABASE_URL"])

    @app.get("/healthz")
    def healthz():
        return {"ok": True}

    @app.post(ROUTE)
    def record(brand_id: str):
        body = request.get_json()
        row_id = request.headers.get("Idempotency-Key") or secrets.token_hex(16)
        with engine.begin() as connection:
            connection.execute(
                rows.insert().values(id=row_id, body=body, created_at=datetime.now(UTC))
            )
            stored = connection.execute(select(rows).where(rows.c.id == row_id)).one()
        envelope = {
            "status": True,
            "statusCode": 201,
            "message": "Conversion recorded",
            "data": {
                "conversionId": stored.id,
                "brandId": brand_id,
                "replay": False,
                "createdAt": stored.created_at.isoformat(),
            },
            "requestId": "req_" + secrets.token_hex(12),
        }
        return jsonify(envelope), 201

    return app
