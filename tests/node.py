"""Node.js and an npm package for the tests that run a receiver's JavaScript: the official
`standardwebhooks` package, installed at test time from npm's registry into a directory outside
the repository (no node_modules in the checkout, no package.json to keep).

Where node or npm is missing, or the registry cannot be reached (a laptop offline), those tests
skip, saying why; CI sets `BRAND_NODE_TESTS=required` (.ci/run, which also installs Debian's
nodejs and npm when missing), and then each of those fails the run instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

NODE_TESTS_ENV = "BRAND_NODE_TESTS"
# Pinned: a new release cannot change what the test proves without a commit saying so.
STANDARD_WEBHOOKS_NPM = "standardwebhooks@1.1.1"
NPM_INSTALL_TIMEOUT = 240  # seconds: a slow registry, not a hung one


def node() -> str | None:
    return shutil.which("node")


def missing_node() -> str | None:
    """Why JavaScript cannot run here, or None."""
    if node() is None:
        return "node is not installed"
    if shutil.which("npm") is None:
        return "npm is not installed"
    return None


def install_npm_package(
    package: str, directory: Path, env: dict[str, str] | None = None
) -> str | None:
    """`npm install --prefix directory package`; None once it is there, else why not (npm's
    own last words included). A package already in npm's cache is taken from it."""
    command = [
        "npm",
        "install",
        "--prefix",
        str(directory),
        "--prefer-offline",
        "--no-audit",
        "--no-fund",
        "--ignore-scripts",
        "--fetch-retries=1",
        "--fetch-retry-mintimeout=2000",
        "--fetch-timeout=60000",
        package,
    ]
    try:
        result = subprocess.run(
            command,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=NPM_INSTALL_TIMEOUT,
        )
    except subprocess.TimeoutExpired:
        return f"`npm install {package}` did not finish within {NPM_INSTALL_TIMEOUT} s"
    name = package.rsplit("@", 1)[0]
    if result.returncode != 0 or not (directory / "node_modules" / name).is_dir():
        said = (result.stderr or result.stdout).strip().splitlines()[:4]  # code and reason
        return (
            f"npm could not install {package} from its registry (exit {result.returncode}); "
            "npm said:\n" + "\n".join(said)
        )
    return None


def require(problem: str | None) -> None:
    """Skip (on a laptop) or fail (under BRAND_NODE_TESTS=required) when `problem` says why
    the Node.js tests cannot run."""
    if problem is None:
        return
    if os.environ.get(NODE_TESTS_ENV) == "required":
        pytest.fail(f"{NODE_TESTS_ENV}=required but {problem}", pytrace=False)
    pytest.skip(
        f"the Node.js tests need node, npm and npm's registry: {problem}. Install them with "
        "`sudo apt-get install nodejs npm`"
    )
