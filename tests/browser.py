"""Headless Chromium for the browser tests: Debian's `chromium` package driven by Python
Playwright (Playwright's own browser download does not work on our machines, so it is never
used; `playwright install` is not needed).

Where no Chromium is installed the browser tests skip, saying how to enable them; CI sets
`BRAND_BROWSER_TESTS=required`, and then a missing browser fails the run instead.
`BRAND_CHROMIUM` points at another Chromium binary.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # require_browser() says why the tests cannot run, or fails under CI
    expect = None

CHROMIUM = os.environ.get("BRAND_CHROMIUM", "/usr/bin/chromium")
# Headless, and none of Chromium's own traffic: the machines' closed network refuses it, and a
# test should see only its own requests. --no-sandbox because CI runs as root.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LAPTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
# Where screenshots go when BRAND_SCREENSHOTS names a folder (relative to the repository).
SCREENSHOTS_ENV = "BRAND_SCREENSHOTS"
ROOT = Path(__file__).resolve().parent.parent

# Counts every security-policy violation into the console, whatever Chromium itself logs; runs
# before the page's own scripts (Playwright's init scripts are not subject to the page's CSP).
_REPORT_CSP_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (event) => {
  const blocked = event.blockedURI || "inline";
  console.error(`CSP violation: ${event.violatedDirective} blocked ${blocked}`);
});
"""


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if importlib.util.find_spec("playwright") is None:
        return "Python Playwright is not installed (`make install` installs the dev extra)"
    if not (os.access(CHROMIUM, os.X_OK) or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM}"
    return None


def require_browser() -> None:
    """Skip (on a laptop) or fail (under BRAND_BROWSER_TESTS=required) without a browser."""
    problem = missing_browser()
    if problem is None:
        return
    if os.environ.get("BRAND_BROWSER_TESTS") == "required":
        pytest.fail(f"BRAND_BROWSER_TESTS=required but {problem}", pytrace=False)
    pytest.skip(
        f"browser tests need Debian's Chromium: {problem}. Enable them with "
        "`sudo apt-get install chromium` (or BRAND_CHROMIUM=/path/to/chromium)"
    )


@contextmanager
def launched_chromium() -> Iterator:
    """A Playwright Browser on the system's Chromium; closed (with Playwright) afterwards."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


class Problems:
    """Everything a person's browser console would show going wrong: console errors (CSP
    violations among them), uncaught exceptions, and failed requests of a context's pages."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def watch(self, context) -> None:
        context.add_init_script(_REPORT_CSP_VIOLATIONS)
        context.on("console", self._console)
        context.on("weberror", lambda error: self.seen.append(f"page error: {error.error}"))
        context.on("requestfailed", self._request_failed)

    def _console(self, message) -> None:
        if message.type == "error":
            where = message.location.get("url", "")
            self.seen.append(f"console error on {where}: {message.text}")

    def _request_failed(self, request) -> None:
        # A navigation cancels the requests of the page it leaves (a poll in flight): no fault.
        if "ERR_ABORTED" not in (request.failure or ""):
            self.seen.append(f"request failed: {request.method} {request.url}: {request.failure}")

    def clear(self) -> None:
        self.seen.clear()

    def assert_none(self) -> None:
        assert self.seen == [], "the browser reported problems:\n" + "\n".join(self.seen)


def open_context(
    browser,
    base_url: str,
    problems: Problems | None = None,
    *,
    viewport: dict = LAPTOP,
    javascript: bool = True,
    timeout_ms: int = 10_000,
    **options,
):
    """A fresh browser profile on `base_url` (a phone's touch and mobile flags at PHONE size),
    whose console `problems` watches when given."""
    phone = viewport == PHONE
    context = browser.new_context(
        viewport=viewport,
        base_url=base_url,
        java_script_enabled=javascript,
        is_mobile=phone,
        has_touch=phone,
        **options,
    )
    context.set_default_timeout(timeout_ms)
    if problems is not None:
        problems.watch(context)
    return context


def sign_in_with_key(page, secret: str) -> None:
    """Sign in on the dashboard's form with an API key, and wait for the dashboard."""
    page.goto("/dashboard/sign-in")
    page.get_by_label("API key").fill(secret)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("navigation", name="Dashboard")).to_be_visible()


def open_fold(page, title: str) -> None:
    """Open the folded section (<details>) of the page whose title is `title`, as a person
    clicks it; one already open stays open."""
    fold = page.locator("details").filter(has=page.locator("summary", has_text=title))
    if not fold.evaluate("(details) => details.open"):
        fold.locator("summary").click()


def screenshot_folder() -> Path | None:
    """The folder BRAND_SCREENSHOTS names (created), or None: CI takes none, so it leaves the
    committed screenshots alone."""
    target = os.environ.get(SCREENSHOTS_ENV)
    if not target:
        return None
    folder = Path(target)
    if not folder.is_absolute():
        folder = ROOT / folder
    folder.mkdir(parents=True, exist_ok=True)
    return folder
