"""`make install` (and the first `make run` or `make test`): the project and its dependencies into
.venv, by pip, with the venv's own Python (standard library only: nothing is installed yet).

The first install downloads every dependency (about 40 s on a laptop); after that everything
runs offline. When pip cannot reach its package index, pip itself retries each request for a
while and then prints pages of warnings; this says so in one line instead, at once, and keeps
pip's own words in .venv/pip-install.log. Any other failure of pip is shown as pip wrote it.

Exit status: pip's (0 when installed), 1 when the index cannot be reached.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOG = Path(sys.prefix) / "pip-install.log"
DEFAULT_INDEX = "https://pypi.org/simple/"
PROBE_TIMEOUT = 10.0  # seconds: a reachable index answers well within this
# What pip's log says when it could not connect (urllib3's words, on every platform).
UNREACHABLE_SIGNS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "ConnectTimeoutError",
    "Temporary failure in name resolution",
    "Name or service not known",
    "nodename nor servname provided",
    "ProxyError",
    "Network is unreachable",
)
PIP = [sys.executable, "-m", "pip"]


def pip_settings() -> dict[str, str]:
    """pip's configuration as `pip config list` shows it (files and PIP_* variables)."""
    listed = subprocess.run(
        [*PIP, "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    pairs = (line.split("=", 1) for line in listed.splitlines() if "=" in line)
    return {name.split(".", 1)[-1]: value.strip().strip("'\"") for name, value in pairs}


def index_url(settings: dict[str, str]) -> str | None:
    """The index pip would ask, or None when it is told to ask none."""
    if os.environ.get("PIP_NO_INDEX") or settings.get("no-index", "").lower() in ("1", "true"):
        return None
    return os.environ.get("PIP_INDEX_URL") or settings.get("index-url") or DEFAULT_INDEX


def other_sources(settings: dict[str, str]) -> bool:
    """Whether pip may find the packages elsewhere too (a wheelhouse, a second index)."""
    names = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL")
    return any(os.environ.get(name) for name in names) or any(
        settings.get(name) for name in ("find-links", "extra-index-url")
    )


def reachable(url: str) -> bool:
    """Whether the index answers at all (any HTTP status counts: it is there). Asked for pip's
    own page: the index's root lists every project, tens of megabytes."""
    page = urllib.parse.urljoin(url.rstrip("/") + "/", "pip/")
    try:
        with urllib.request.urlopen(page, timeout=PROBE_TIMEOUT):  # noqa: S310 - pip's index
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def unreachable_line(url: str) -> str:
    return (
        f"make: pip cannot reach its package index ({url}): the first run downloads the "
        "dependencies (about 40 s) and needs the network once; after that everything runs "
        f"offline. Connect and run it again (pip's own output: {LOG})."
    )


def looks_unreachable(pip_output: str) -> bool:
    return any(sign in pip_output for sign in UNREACHABLE_SIGNS)


def main() -> int:
    settings = pip_settings()
    url = index_url(settings)
    if url is not None and not other_sources(settings) and not reachable(url):
        LOG.write_text(f"{url} did not answer within {PROBE_TIMEOUT:.0f} s; pip was not run.\n")
        print(unreachable_line(url), file=sys.stderr)
        return 1
    result = subprocess.run(
        [*PIP, "install", "--quiet", "--disable-pip-version-check", "-e", ".[dev]"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    LOG.write_text(result.stdout + result.stderr)
    if result.returncode == 0:
        sys.stderr.write(result.stderr)  # pip's warnings, if any
        return 0
    if url is not None and looks_unreachable(result.stdout + result.stderr):
        print(unreachable_line(url), file=sys.stderr)
        return 1
    sys.stderr.write(result.stdout + result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
