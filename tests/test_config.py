"""Settings from the environment (CONTRACT section 1)."""

from __future__ import annotations

import pytest

from config import ConfigError, Settings

DATABASE = "postgresql://app@db.internal/brand"


def settings(tmp_path, **environ) -> Settings:
    """Settings of a process with DATABASE_URL set, unless the test says otherwise."""
    environ.setdefault("DATABASE_URL", DATABASE)
    environ = {name: value for name, value in environ.items() if value is not None}
    return Settings.from_environ(environ, instance_path=str(tmp_path / "instance"))


def test_development_defaults(tmp_path):
    loaded = settings(tmp_path)
    assert loaded.app_env == "development"
    assert loaded.database_url == "postgresql+psycopg://app@db.internal/brand"
    assert loaded.redis_url is None
    assert loaded.port == 5000
    assert loaded.webhook_retry_schedule == (5, 300, 1800, 7200, 18000, 36000, 36000)
    assert (loaded.webhook_disable_failures, loaded.webhook_disable_window) == (15, 259200)
    assert loaded.webhook_timeout == 10.0
    assert loaded.webhook_sweep_interval == 10.0
    assert loaded.sign_in_failures_per_address == "10/minute"
    assert loaded.sign_in_failures_global == "600/minute"
    assert (loaded.event_waits_per_key, loaded.event_waits_per_process) == (10, 128)


def test_development_secrets_are_generated_once_into_instance(tmp_path):
    first, second = settings(tmp_path), settings(tmp_path)
    assert first.secret_key == second.secret_key
    assert first.encryption_key == second.encryption_key != first.secret_key
    key_file = tmp_path / "instance" / "secret_key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("missing", ["SECRET_KEY", "ENCRYPTION_KEY"])
def test_production_requires_its_secrets(tmp_path, missing):
    environ = {"APP_ENV": "production", "SECRET_KEY": "s" * 32, "ENCRYPTION_KEY": "e" * 44}
    del environ[missing]
    with pytest.raises(ConfigError, match=missing):
        settings(tmp_path, **environ)
    assert not (tmp_path / "instance" / missing.lower()).exists()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgres://u@h/db", "postgresql+psycopg://u@h/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ],
)
def test_database_urls_name_the_psycopg_driver(tmp_path, url, expected):
    assert settings(tmp_path, DATABASE_URL=url).database_url == expected


@pytest.mark.parametrize("url", ["sqlite:////abs/brand.db", "sqlite://", "mysql://u@h/db"])
def test_a_database_other_than_postgresql_is_refused_in_one_line(tmp_path, url):
    with pytest.raises(ConfigError) as raised:
        settings(tmp_path, DATABASE_URL=url)
    message = str(raised.value)
    assert "\n" not in message
    assert "PostgreSQL is the only database" in message
    assert "unset DATABASE_URL" in message


@pytest.mark.parametrize("app_env", ["development", "test", "production"])
def test_no_database_url_and_no_make_run_says_what_to_do(tmp_path, app_env):
    environ = {"APP_ENV": app_env, "SECRET_KEY": "s" * 32, "ENCRYPTION_KEY": "e" * 44}
    with pytest.raises(ConfigError, match=r"DATABASE_URL is not set: start `make run`"):
        settings(tmp_path, DATABASE_URL=None, **environ)


def test_embedded_postgresql_url_is_found_only_while_its_socket_exists(tmp_path):
    instance = tmp_path / "instance"
    instance.mkdir()
    socket_dir = tmp_path / "pg"
    socket_dir.mkdir()
    url = f"postgresql+psycopg://postgres@/brand?host={socket_dir}"
    (instance / "database-url").write_text(url + "\n")
    with pytest.raises(ConfigError, match="DATABASE_URL is not set"):
        settings(tmp_path, DATABASE_URL=None)
    (socket_dir / ".s.PGSQL.5432").touch()
    assert settings(tmp_path, DATABASE_URL=None).database_url == url
    with pytest.raises(ConfigError, match="DATABASE_URL is not set"):
        settings(tmp_path, DATABASE_URL=None, APP_ENV="test")  # development only
    # An explicit DATABASE_URL wins over a running `make run`.
    assert settings(tmp_path).database_url == "postgresql+psycopg://app@db.internal/brand"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("APP_ENV", "staging"),
        ("PORT", "http"),
        ("PORT", "70000"),
        ("WEBHOOK_RETRY_SCHEDULE", "5,soon"),
        ("WEBHOOK_RETRY_SCHEDULE", "5,-1"),
        ("WEBHOOK_TIMEOUT", "0"),
        ("WEBHOOK_DISABLE_FAILURES", "0"),
        ("SIGN_IN_FAILURES_GLOBAL", "lots"),
        ("EVENT_WAITS_PER_KEY", "0"),
        ("EVENT_WAITS_PER_KEY", "ten"),
        ("EVENT_WAITS_PER_PROCESS", "-1"),
        ("EVENT_WAITS_PER_PROCESS", "10001"),
    ],
)
def test_malformed_values_name_the_variable(tmp_path, name, value):
    with pytest.raises(ConfigError, match=name):
        settings(tmp_path, **{name: value})


def test_embedded_redis_url_is_found_only_while_its_socket_exists(tmp_path):
    instance = tmp_path / "instance"
    instance.mkdir()
    socket_path = tmp_path / "redis.sock"
    (instance / "redis-url").write_text(f"unix://{socket_path}?db=0\n")
    assert settings(tmp_path).redis_url is None
    socket_path.touch()
    assert settings(tmp_path).redis_url == f"unix://{socket_path}?db=0"
    assert settings(tmp_path, APP_ENV="test").redis_url is None  # development only


def test_an_encryption_key_that_is_not_a_fernet_key_stops_the_app(app_environ):
    from app import create_app

    with pytest.raises(ConfigError, match="ENCRYPTION_KEY must be") as raised:
        create_app({**app_environ, "ENCRYPTION_KEY": "not-a-fernet-key-at-all"})
    assert "not-a-fernet-key-at-all" not in str(raised.value)


def test_no_pooler_and_no_proxy_by_default(tmp_path):
    loaded = settings(tmp_path)
    assert (loaded.database_pooler, loaded.behind_a_pooler) == ("none", False)
    assert loaded.database_direct_url == loaded.database_url
    assert loaded.proxy_hops == 0


def test_a_pooler_needs_a_direct_url_for_what_needs_a_session(tmp_path):
    with pytest.raises(ConfigError, match="DATABASE_DIRECT_URL is required"):
        settings(tmp_path, DATABASE_POOLER="pgbouncer")
    loaded = settings(
        tmp_path, DATABASE_POOLER="pgbouncer", DATABASE_DIRECT_URL="postgres://app@db:5432/brand"
    )
    assert loaded.behind_a_pooler
    assert loaded.database_direct_url == "postgresql+psycopg://app@db:5432/brand"
    with pytest.raises(ConfigError, match="DATABASE_DIRECT_URL must be a PostgreSQL URL"):
        settings(tmp_path, DATABASE_POOLER="pgbouncer", DATABASE_DIRECT_URL="mysql://db/brand")
    with pytest.raises(ConfigError, match="DATABASE_POOLER must be one of none, pgbouncer"):
        settings(tmp_path, DATABASE_POOLER="odyssey")


def test_proxy_hops_are_counted_and_bounded(tmp_path):
    assert settings(tmp_path, PROXY_HOPS="2").proxy_hops == 2
    for wrong in ("-1", "6", "one"):
        with pytest.raises(ConfigError, match="PROXY_HOPS"):
            settings(tmp_path, PROXY_HOPS=wrong)
