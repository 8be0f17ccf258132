"""Settings read from the environment once, typed, at app creation (CONTRACT section 1).

Nothing here runs at import time: `Settings.from_environ` is called by `create_app`, so tests
pass their own mapping instead of patching `os.environ`.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENVIRONMENTS = ("development", "test", "production")
DEFAULT_RETRY_SCHEDULE = "5,300,1800,7200,18000,36000,36000"
DEFAULT_PORT = 5000
# Attempts one worker process keeps in flight, and per endpoint across all workers
# (docs/webhooks.md, "Sizing"; measured in docs/benchmarks.md).
DEFAULT_CONCURRENCY = 256
DEFAULT_ENDPOINT_CONCURRENCY = 2
# Long-polls of the events API (`fetch-events?wait=N`) that may wait at once in one server
# process, per API key and in all. A waiting request holds a gunicorn thread (gunicorn.conf.py:
# 256 per worker), so the process's cap keeps half of them for every other call, and the key's
# keeps one key from taking the process's share (services/event_waits.py).
DEFAULT_EVENT_WAITS_PER_KEY = 10
DEFAULT_EVENT_WAITS_PER_PROCESS = 128
# The delivery loop looks for due work at least this often however wake-ups fare (seconds).
MAX_POLL_INTERVAL = 1.0
# Written by `make run` while its embedded PostgreSQL and Redis are up, so that CLI commands
# started in another terminal reach the same servers without the developer exporting a URL.
EMBEDDED_DATABASE_URL_FILE = "database-url"
EMBEDDED_REDIS_URL_FILE = "redis-url"


FAILPOINT_ACTIONS = ("exit", "sleep", "sleep-once", "raise")
# DATABASE_POOLER: what DATABASE_URL reaches. `pgbouncer`: a PgBouncer pool in transaction mode
# (deploy/pgbouncer.ini), which hands each transaction any server connection (docs/deployment.md).
DATABASE_POOLERS = ("none", "pgbouncer")
# PROXY_HOPS: reverse proxies in front of gunicorn whose X-Forwarded-For/-Proto are believed.
MAX_PROXY_HOPS = 5
LOG_FORMATS = ("text", "json")
_RATE = re.compile(r"([1-9][0-9]{0,8})\s*/\s*(second|minute|hour)")


class ConfigError(RuntimeError):
    """A variable is missing or malformed; the message names it and never echoes a secret."""


@dataclass(frozen=True)
class Settings:
    app_env: str
    database_url: str
    # `none` or `pgbouncer` (transaction pooling): then no statement is prepared on the server
    # and nothing is set for the session; what needs a session (LISTEN, the retention purge's
    # lock) goes to `database_direct_url`, PostgreSQL itself (DATABASE_URL when no pooler).
    database_pooler: str
    database_direct_url: str
    # X-Forwarded-For/-Proto hops set by our own proxies (deploy/nginx.conf): 0 trusts none.
    proxy_hops: int
    redis_url: str | None
    secret_key: str
    encryption_key: str
    port: int
    webhook_retry_schedule: tuple[int, ...]
    webhook_disable_failures: int
    webhook_disable_window: int
    webhook_timeout: float
    webhook_concurrency: int
    webhook_endpoint_concurrency: int
    webhook_sweep_interval: float
    webhook_poll_interval: float
    postback_in_flight_window: int
    webhook_retention_days: int
    # CONTRACT 9.1: "N/second", "N/minute" or "N/hour", per API key.
    rate_limit_per_key: str
    postback_rate_limit_per_key: str
    # Failed dashboard sign-ins (and first-key attempts) per client (an IPv4 address, an IPv6
    # /64) and across every client, same form (services/sign_in_throttle.py).
    sign_in_failures_per_address: str
    sign_in_failures_global: str
    # API requests failing authentication per client address in a moving minute (CONTRACT 13.7).
    auth_failures_per_minute: int
    # Dashboard sessions end after this many seconds without a request, and this many after
    # sign-in, whichever comes first (CONTRACT 11.3).
    dashboard_session_idle_timeout: int
    dashboard_session_lifetime: int
    # Long-polls waiting at once in one server process: per API key, and in all.
    event_waits_per_key: int
    event_waits_per_process: int
    log_format: str
    metrics_token: str | None
    # services.failpoints: read only when APP_ENV=test.
    failpoints: Mapping[str, str]

    @property
    def is_production(self) -> bool:
        return self.app_env == "production"

    @property
    def behind_a_pooler(self) -> bool:
        return self.database_pooler != "none"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, instance_path: str) -> Settings:
        app_env = environ.get("APP_ENV", "development").strip() or "development"
        if app_env not in ENVIRONMENTS:
            raise ConfigError(f"APP_ENV must be one of {', '.join(ENVIRONMENTS)}, not {app_env!r}")
        database_url = _database_url(environ, instance_path, app_env)
        database_pooler = _choice(environ, "DATABASE_POOLER", DATABASE_POOLERS)
        return cls(
            app_env=app_env,
            database_url=database_url,
            database_pooler=database_pooler,
            database_direct_url=_database_direct_url(environ, database_url, database_pooler),
            proxy_hops=_int(environ, "PROXY_HOPS", 0, minimum=0, maximum=MAX_PROXY_HOPS),
            redis_url=environ.get("REDIS_URL")
            or _embedded_url(instance_path, app_env, EMBEDDED_REDIS_URL_FILE),
            secret_key=_instance_secret(environ, "SECRET_KEY", instance_path, app_env),
            encryption_key=_instance_secret(environ, "ENCRYPTION_KEY", instance_path, app_env),
            port=read_port(environ),
            webhook_retry_schedule=_schedule(environ),
            webhook_disable_failures=_int(environ, "WEBHOOK_DISABLE_FAILURES", 15, minimum=1),
            webhook_disable_window=_int(environ, "WEBHOOK_DISABLE_WINDOW", 259200, minimum=0),
            webhook_timeout=_float(environ, "WEBHOOK_TIMEOUT", 10.0),
            webhook_concurrency=_int(
                environ, "WEBHOOK_CONCURRENCY", DEFAULT_CONCURRENCY, minimum=1, maximum=1024
            ),
            webhook_endpoint_concurrency=_int(
                environ,
                "WEBHOOK_ENDPOINT_CONCURRENCY",
                DEFAULT_ENDPOINT_CONCURRENCY,
                minimum=1,
                maximum=1024,
            ),
            webhook_sweep_interval=_float(environ, "WEBHOOK_SWEEP_INTERVAL", 10.0),
            webhook_poll_interval=_float(
                environ, "WEBHOOK_POLL_INTERVAL", 1.0, maximum=MAX_POLL_INTERVAL
            ),
            postback_in_flight_window=_int(
                environ, "POSTBACK_IN_FLIGHT_WINDOW", 120, minimum=1, maximum=3600
            ),
            webhook_retention_days=_int(
                environ, "WEBHOOK_RETENTION_DAYS", 30, minimum=1, maximum=3650
            ),
            rate_limit_per_key=_rate(environ, "RATE_LIMIT_PER_KEY", "6000/minute"),
            postback_rate_limit_per_key=_rate(
                environ, "POSTBACK_RATE_LIMIT_PER_KEY", "60000/minute"
            ),
            sign_in_failures_per_address=_rate(
                environ, "SIGN_IN_FAILURES_PER_ADDRESS", "10/minute"
            ),
            sign_in_failures_global=_rate(environ, "SIGN_IN_FAILURES_GLOBAL", "600/minute"),
            auth_failures_per_minute=_int(
                environ, "AUTH_FAILURES_PER_MINUTE", 120, minimum=1, maximum=1_000_000
            ),
            dashboard_session_idle_timeout=_int(
                environ, "DASHBOARD_SESSION_IDLE_TIMEOUT", 3600, minimum=60, maximum=86400
            ),
            dashboard_session_lifetime=_int(
                environ, "DASHBOARD_SESSION_LIFETIME", 43200, minimum=60, maximum=30 * 86400
            ),
            event_waits_per_key=_int(
                environ,
                "EVENT_WAITS_PER_KEY",
                DEFAULT_EVENT_WAITS_PER_KEY,
                minimum=1,
                maximum=10000,
            ),
            event_waits_per_process=_int(
                environ,
                "EVENT_WAITS_PER_PROCESS",
                DEFAULT_EVENT_WAITS_PER_PROCESS,
                minimum=1,
                maximum=10000,
            ),
            log_format=_choice(environ, "LOG_FORMAT", LOG_FORMATS),
            metrics_token=environ.get("METRICS_TOKEN", "").strip() or None,
            failpoints=_failpoints(environ, app_env),
        )


def read_port(environ: Mapping[str, str]) -> int:
    """PORT (CONTRACT 1): also read by `make run` before it starts anything."""
    return _int(environ, "PORT", DEFAULT_PORT, minimum=1, maximum=65535)


def _failpoints(environ: Mapping[str, str], app_env: str) -> Mapping[str, str]:
    raw = environ.get("FAILPOINTS", "").strip()
    if not raw:
        return {}
    if app_env != "test":
        raise ConfigError("FAILPOINTS is for the test suite; it is refused unless APP_ENV=test")
    try:
        return parse_failpoints(raw)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def parse_failpoints(raw: str) -> Mapping[str, str]:
    """FAILPOINTS (`services.failpoints`): `name=action,...` checked; a ValueError names what
    is wrong."""
    points = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, action = item.partition("=")
        kind, _, argument = action.partition(":")
        sleeps = kind.startswith("sleep")
        if not name or kind not in FAILPOINT_ACTIONS or sleeps != bool(argument):
            raise ValueError(
                f"FAILPOINTS entry {item!r} is not name=exit|raise|sleep:SECONDS|sleep-once:SECONDS"
            )
        if sleeps:
            float(argument)
        points[name.strip()] = action
    return points


def _database_url(environ: Mapping[str, str], instance_path: str, app_env: str) -> str:
    """DATABASE_URL with the psycopg 3 driver named; unset in development, the embedded
    PostgreSQL a running `make run` advertises. PostgreSQL is the only database."""
    url = environ.get("DATABASE_URL", "").strip()
    if not url:
        url = _embedded_url(instance_path, app_env, EMBEDDED_DATABASE_URL_FILE) or ""
    if not url:
        raise ConfigError(
            "DATABASE_URL is not set: start `make run` (it runs an embedded PostgreSQL), "
            "or set DATABASE_URL=postgresql://USER@HOST:PORT/DATABASE"
        )
    return _psycopg_url("DATABASE_URL", url)


def _psycopg_url(name: str, url: str) -> str:
    """`url` (variable `name`) with the psycopg 3 driver named; PostgreSQL only."""
    for scheme in ("postgres://", "postgresql://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme) :]
    if url.startswith("postgresql+psycopg://"):
        return url
    scheme = url.split(":", 1)[0]
    raise ConfigError(
        f"{name} must be a PostgreSQL URL (postgresql://...), not {scheme}:; "
        "PostgreSQL is the only database: unset DATABASE_URL and `make run` starts an embedded one"
    )


def _database_direct_url(environ: Mapping[str, str], database_url: str, pooler: str) -> str:
    """DATABASE_DIRECT_URL: PostgreSQL itself, for what a transaction pool cannot carry;
    required with a pooler, where DATABASE_URL is the pool."""
    raw = environ.get("DATABASE_DIRECT_URL", "").strip()
    if not raw:
        if pooler != "none":
            raise ConfigError(
                f"DATABASE_DIRECT_URL is required with DATABASE_POOLER={pooler}: the wake-up "
                "listener's LISTEN and the retention purge's lock need a session of their own, "
                "on PostgreSQL itself (postgresql://USER@HOST:PORT/DATABASE)"
            )
        return database_url
    return _psycopg_url("DATABASE_DIRECT_URL", raw)


def _embedded_url(instance_path: str, app_env: str, marker_name: str) -> str | None:
    """The URL a running `make run` wrote for one of its embedded servers, while its unix
    socket is there."""
    if app_env != "development":
        return None
    try:
        url = Path(instance_path, marker_name).read_text().strip()
    except OSError:
        return None
    return url if Path(_socket_path(url)).exists() else None


def _socket_path(url: str) -> str:
    """The socket a marker's URL names: redis `unix:///path?db=0`, or PostgreSQL's
    `...?host=/socket/dir` (the socket file inside it is named after the port)."""
    if url.startswith("unix://"):
        return url.removeprefix("unix://").split("?", 1)[0]
    host = url.rsplit("host=", 1)[-1].split("&", 1)[0]
    return str(Path(host, ".s.PGSQL.5432"))


def _instance_secret(
    environ: Mapping[str, str], name: str, instance_path: str, app_env: str
) -> str:
    """The variable if set; in development and test, a value generated once into instance/."""
    value = environ.get(name, "").strip()
    if value:
        return value
    if app_env == "production":
        raise ConfigError(f"{name} must be set when APP_ENV=production")
    path = Path(instance_path, name.lower())
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    # A Fernet-compatible key (32 urlsafe-base64 bytes) serves both as session key and as the
    # encryption key for webhook signing secrets.
    generated = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(generated + "\n")
    return generated


def _int(
    environ: Mapping[str, str],
    name: str,
    default: int,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {raw!r}") from None
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ConfigError(f"{name} must be between {minimum} and {maximum}, not {value}")
    return value


def _float(
    environ: Mapping[str, str], name: str, default: float, *, maximum: float | None = None
) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, not {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be positive, not {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum:g}, not {value:g}")
    return value


def _schedule(environ: Mapping[str, str]) -> tuple[int, ...]:
    raw = environ.get("WEBHOOK_RETRY_SCHEDULE", "").strip() or DEFAULT_RETRY_SCHEDULE
    try:
        delays = tuple(int(part) for part in raw.split(","))
    except ValueError:
        raise ConfigError(
            f"WEBHOOK_RETRY_SCHEDULE must be comma-separated seconds, not {raw!r}"
        ) from None
    if any(delay < 0 for delay in delays):
        raise ConfigError("WEBHOOK_RETRY_SCHEDULE delays must not be negative")
    return delays


def _rate(environ: Mapping[str, str], name: str, default: str) -> str:
    raw = environ.get(name, "").strip() or default
    match = _RATE.fullmatch(raw.lower())
    if match is None:
        raise ConfigError(f"{name} must be N/second, N/minute or N/hour, not {raw!r}")
    return f"{match[1]}/{match[2]}"


def _choice(environ: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    raw = environ.get(name, "").strip().lower() or choices[0]
    if raw not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, not {raw!r}")
    return raw
