"""`make install` (scripts/install_dependencies.py): without a reachable package index, one line
that says what is wrong and what to do, instead of pip's minutes of retries and warnings."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.install_dependencies import looks_unreachable

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install_dependencies.py"


def closed_port() -> int:
    """A port nothing listens on: connecting is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def empty_index() -> Iterator[str]:
    """An index that answers, and has nothing: every page is a 404."""

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple/"
    server.shutdown()
    server.server_close()


def without_pip_settings() -> dict[str, str]:
    """This environment without the machine's pip settings (a wheelhouse, other indexes)."""
    kept = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
    return kept | {"PIP_CONFIG_FILE": os.devnull}


def pip_output(index: str) -> str:
    """What pip says when it asks `index` for a package (nothing is installed)."""
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--dry-run", "--no-cache-dir"),
            *("--disable-pip-version-check", "--retries", "1", "--timeout", "5"),
            *("--index-url", index, "brand-api-no-such-package==1.0"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=without_pip_settings(),
    )
    assert result.returncode != 0
    return result.stdout + result.stderr


def test_no_reachable_index_is_one_line_at_once_and_installs_nothing(tmp_path):
    fresh = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(fresh)
    index = f"http://127.0.0.1:{closed_port()}/simple/"
    result = subprocess.run(
        [str(fresh / "bin" / "python"), str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=without_pip_settings() | {"PIP_INDEX_URL": index},
    )
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert f"pip cannot reach its package index ({index})" in line
    assert "about 40 s" in line and "runs offline" in line
    assert (fresh / "pip-install.log").exists()


def test_pips_words_for_an_unreachable_index_are_recognised_and_a_404_is_not(empty_index):
    """The one line stands in for pip's output only when pip could not connect; an index that
    answers but lacks a package is pip's own error to show."""
    assert looks_unreachable(pip_output(f"http://127.0.0.1:{closed_port()}/simple/"))
    assert not looks_unreachable(pip_output(empty_index))
