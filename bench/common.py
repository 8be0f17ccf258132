"""What the read benchmarks share: the app on a PostgreSQL database of their own, migrated, and
the median of repeated timings."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROUNDS = 25
BENCH_ENCRYPTION_KEY = "YmVuY2gtZW5jcnlwdGlvbi1rZXktMzItYnl0ZXMhISE="


def median_ms(run: Callable[[], object], rounds: int = ROUNDS) -> float:
    """Median wall time of `run` in milliseconds, after one warm-up call."""
    run()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 2)


@contextmanager
def migrated_app_on_postgresql(prefix: str) -> Iterator[tuple[object, str]]:
    """(app, psycopg DSN) on a new PostgreSQL database with the migrations applied; the
    database is dropped and the Redis db flushed afterwards (tests.backends)."""
    from flask_migrate import upgrade

    from app import create_app
    from tests.backends import open_backends

    backends = open_backends(Path(tempfile.mkdtemp(prefix=prefix)))
    if backends.database_kind != "postgresql":
        backends.close()
        raise SystemExit("this benchmark needs PostgreSQL on 127.0.0.1:5432")
    try:
        app = create_app(
            {
                "APP_ENV": "test",
                "DATABASE_URL": backends.database_url,
                "REDIS_URL": backends.redis_url,
                "SECRET_KEY": "bench",
                "ENCRYPTION_KEY": BENCH_ENCRYPTION_KEY,
            }
        )
        with app.app_context():
            upgrade()
        yield app, backends.database_url.replace("postgresql+psycopg://", "postgresql://")
    finally:
        backends.close()
