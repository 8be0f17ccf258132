"""The app's Redis connection, opened lazily: importing or creating the app never touches Redis."""

from __future__ import annotations

import redis
from flask import Flask

QUEUES = ("webhooks",)


def redis_connection(app: Flask) -> redis.Redis | None:
    """The shared client for `REDIS_URL`, or None when no Redis is configured."""
    url = app.extensions["settings"].redis_url
    if url is None:
        return None
    client = app.extensions.get("redis")
    if client is None:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=2, socket_timeout=5, health_check_interval=30
        )
        app.extensions["redis"] = client
    return client
