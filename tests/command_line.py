"""`flask --app app …` run as support types it: a process of its own, from the repository root,
with a test's environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_flask(
    environ: dict[str, str], *args: str, python_options: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """`python PYTHON_OPTIONS -m flask --app app ARGS` with `environ` (and the system's PATH);
    its output captured as text, whatever its exit status."""
    return subprocess.run(
        [sys.executable, *python_options, "-m", "flask", "--app", "app", *args],
        env={**environ, "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
