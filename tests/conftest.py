"""Fixtures: one migrated database and one Redis per run (see tests/backends.py), an app bound
to them, a clean slate before every test, and helpers that mint brands, tokens and keys."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from flask import Flask
from flask_migrate import upgrade
from sqlalchemy import delete

from app import create_app
from extensions import db
from services.api_keys import create_api_key
from services.bootstrap_tokens import issue_bootstrap_token
from services.brands import create_brand
from services.wakeups import stop_listeners
from tests.backends import Backends, open_backends
from tests.browser import LAPTOP, Problems, launched_chromium, open_context, require_browser
from tests.receiver import Receiver, Reply
from tests.server_process import ServerProcess
from tests.worker_process import WorkerProcess

TEST_SECRET_KEY = "test-secret-key-not-for-production"
TEST_ENCRYPTION_KEY = "dGVzdC1lbmNyeXB0aW9uLWtleS0zMi1ieXRlcyEhISE="


OPENED_BACKENDS = pytest.StashKey[Backends]()
_WORKER_BACKENDS = pytest.StashKey[set[str]]()


@pytest.fixture(scope="session")
def backends(request) -> Iterator[Backends]:
    opened = open_backends()
    request.config.stash[OPENED_BACKENDS] = opened
    try:
        yield opened
    finally:
        opened.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """After a test fails, ask whether the run's database and Redis are still there: when one
    has died, every later test would fail too, so the run stops here with the cause once."""
    report = yield
    opened = item.config.stash.get(OPENED_BACKENDS, None)
    if report.failed and opened is not None and not item.session.shouldstop:
        problem = opened.health_problem()
        if problem:
            item.session.shouldstop = f"{problem}. Stopping the run: every later test needs it."
            report.sections.append(("backends", problem))
    return report


@pytest.fixture(scope="session")
def app_environ(backends) -> dict[str, str]:
    """The environment every test app is built from; tests copy and change it."""
    return {
        "APP_ENV": "test",
        "DATABASE_URL": backends.database_url,
        "REDIS_URL": backends.redis_url,
        "SECRET_KEY": TEST_SECRET_KEY,
        "ENCRYPTION_KEY": TEST_ENCRYPTION_KEY,
        # Every test's browser is 127.0.0.1 and the count lives in Redis for a minute: the
        # tests of sign-in throttling use the default on addresses of their own.
        "SIGN_IN_FAILURES_PER_ADDRESS": "100000/minute",
        "SIGN_IN_FAILURES_GLOBAL": "100000/minute",
        # Likewise the API's failed authentications (CONTRACT 13.7): tests of it set their own.
        "AUTH_FAILURES_PER_MINUTE": "100000",
    }


@pytest.fixture(scope="session")
def app(app_environ) -> Iterator[Flask]:
    application = create_app(app_environ)
    with application.app_context():
        upgrade()  # the migrations, not create_all: every run tests them on its database
    yield application
    # Before the session drops its database under it: a listener left running would log its
    # lost connection, again and again, until the last xdist session ends.
    stop_listeners()
    with application.app_context():
        db.engine.dispose()


@pytest.fixture(autouse=True)
def clean_database(request) -> Iterator[None]:
    """Every test starts with empty tables (tests that need no database skip the work)."""
    yield
    if "app" not in request.fixturenames or request.session.shouldstop:
        return
    application = request.getfixturevalue("app")
    with application.app_context():
        db.session.remove()
        for table in reversed(db.metadata.sorted_tables):
            db.session.execute(delete(table))
        db.session.commit()


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def runner(app):
    return app.test_cli_runner()


@pytest.fixture
def make_brand(app) -> Callable[..., str]:
    def make(name: str = "Acme Foods", plan: str = "growth") -> str:
        with app.app_context():
            brand = create_brand(name=name, plan=plan)
            db.session.commit()
            return brand.id

    return make


@pytest.fixture
def make_bootstrap_token(app) -> Callable[..., str]:
    def make(brand_id: str, ttl_hours: int = 24) -> str:
        with app.app_context():
            issued = issue_bootstrap_token(brand_id=brand_id, ttl_hours=ttl_hours)
            db.session.commit()
            return issued.token

    return make


@pytest.fixture
def make_key(app) -> Callable[..., str]:
    """Mint a key straight through the service (tests of create-key use the HTTP route)."""

    def make(brand_id: str, scopes=("read", "write"), name: str = "test key") -> str:
        with app.app_context():
            issued = create_api_key(brand_id=brand_id, name=name, scopes=scopes, created_by="tests")
            db.session.commit()
            return issued.secret

    return make


@pytest.fixture
def brand(make_brand) -> str:
    return make_brand()


@pytest.fixture
def write_key(brand, make_key) -> str:
    return make_key(brand, scopes=("read", "write"))


@pytest.fixture
def read_key(brand, make_key) -> str:
    return make_key(brand, scopes=("read",))


@pytest.fixture(scope="session", autouse=True)
def _announce_backends(request) -> None:
    """Say in the run's output which database and Redis the suite really used (under
    pytest-xdist each worker session has its own; the controller prints what they said)."""
    if "app" not in {name for item in request.session.items for name in item.fixturenames}:
        return
    backends = request.getfixturevalue("backends")
    line = f"backends: postgresql={backends.postgres_kind} redis={backends.redis_kind}"
    worker_output = getattr(request.config, "workeroutput", None)
    if worker_output is not None:
        worker_output["backends"] = line
        return
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\n{line}", flush=True)


def pytest_configure(config) -> None:
    config.stash[_WORKER_BACKENDS] = set()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: a worker session ended; keep what it said it used."""
    line = getattr(node, "workeroutput", {}).get("backends")
    if line:
        node.config.stash[_WORKER_BACKENDS].add(line)


def pytest_terminal_summary(terminalreporter, config) -> None:
    for line in sorted(config.stash.get(_WORKER_BACKENDS, set())):
        terminalreporter.write_line(f"{line} (every worker session)")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A real HTTP receiver on 127.0.0.1 that checks signatures with its own HMAC code."""
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    """Receivers made on demand, each answering `default` unless told otherwise; all closed."""
    made: list[Receiver] = []

    def make(default: Reply | None = None) -> Receiver:
        server = Receiver()
        if default is not None:
            server.default = default
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()


@pytest.fixture(scope="module")
def webhook_worker(app, app_environ) -> Iterator[WorkerProcess]:
    """One real `flask worker` process (retries after 1 s, 1 s timeout) shared by a module's
    tests."""
    worker = WorkerProcess(app_environ)
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """Headless Chromium for a module's browser tests: skipped without one, or failed under
    BRAND_BROWSER_TESTS=required (tests/browser.py)."""
    require_browser()
    with launched_chromium() as chromium:
        yield chromium


@pytest.fixture
def problems() -> Problems:
    """What a person's browser console would show going wrong in the contexts it watches."""
    return Problems()


@pytest.fixture(scope="module")
def browser_server(browser, app, app_environ) -> Iterator[ServerProcess]:
    """A gunicorn server (one worker, four threads) for a module's browser tests, and no
    delivery worker: deliveries stay as each test leaves them unless it starts one."""
    process = ServerProcess(app_environ, workers=1, threads=4)
    yield process
    process.stop()


@pytest.fixture
def open_page(browser, browser_server, problems) -> Iterator:
    """`open_page(viewport, javascript, **options)`: a page of a fresh browser profile (a
    laptop's, JavaScript on, unless told; `options` go to its context, e.g. `permissions`);
    no console error may happen in it."""
    contexts = []

    def open_one(viewport: dict = LAPTOP, javascript: bool = True, **options):
        context = open_context(
            browser,
            browser_server.url,
            problems,
            viewport=viewport,
            javascript=javascript,
            **options,
        )
        contexts.append(context)
        return context.new_page()

    yield open_one
    for context in contexts:
        context.close()
    problems.assert_none()


@pytest.fixture
def no_js(browser, browser_server, problems) -> Iterator:
    """A browser context on the server with JavaScript off; its console checked at the end."""
    context = open_context(browser, browser_server.url, problems, javascript=False)
    yield context
    context.close()
    problems.assert_none()


@pytest.fixture
def with_js(browser, browser_server, problems) -> Iterator:
    """The same with JavaScript on."""
    context = open_context(browser, browser_server.url, problems, javascript=True)
    yield context
    context.close()
    problems.assert_none()
