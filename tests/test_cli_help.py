"""`flask --app app … --help` on a laptop where `make run` is not running: every command and group
found by walking the CLI's own help shows its help, with no DATABASE_URL and no database
reachable, and a command that needs the database says so in one line and exits non-zero.

Real `flask` processes: the traceback this guards against came from how `flask` loads the app,
which an in-process runner given a ready app never does. Each group's help is a `flask` process
of its own; the leaves' helps share one process that runs `flask`'s own entry point for each
(`LEAF_HELPS`), so each still loads the app as `flask` does, without dozens of start-ups.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLASK = str(Path(sys.executable).parent / "flask")  # `.venv/bin/flask`, as the README writes it
COMMAND_LINE = re.compile(r"^  (\S+)\s", re.M)
NO_DATABASE_URL = "Error: DATABASE_URL is not set: start `make run`"
# Nothing listens on port 1: a DATABASE_URL whose server is down.
UNREACHABLE = "postgresql://brand@127.0.0.1:1/brand"


def laptop_environ(**extra: str) -> dict[str, str]:
    """No DATABASE_URL nor REDIS_URL. APP_ENV=test: in development the CLI would find the
    database of a `make run` of this checkout, if one runs (config.py's markers); the keys are
    given so that nothing is generated into instance/."""
    return {
        "PATH": os.environ["PATH"],
        "HOME": os.environ["HOME"],
        "LANG": "C.UTF-8",
        "APP_ENV": "test",
        "SECRET_KEY": "cli-help-test-secret-key",
        "ENCRYPTION_KEY": base64.urlsafe_b64encode(b"cli-help-test-key-of-32-bytes-xx").decode(),
        **extra,
    }


def flask(*args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [FLASK, "--app", "app", *args],
        env=environ or laptop_environ(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def subcommands(help_text: str) -> list[str]:
    """The names under "Commands:" in a group's help."""
    if "\nCommands:\n" not in help_text:
        return []
    return COMMAND_LINE.findall(help_text.split("\nCommands:\n", 1)[1])


def assert_shows_help(path: tuple[str, ...], result: subprocess.CompletedProcess) -> None:
    command = " ".join(("flask", *path))
    assert result.returncode == 0, f"`{command} --help` exited {result.returncode}: {result.stderr}"
    assert result.stderr == "", f"`{command} --help` wrote to stderr:\n{result.stderr}"
    assert result.stdout.startswith(f"Usage: {command} "), result.stdout


def every_command() -> list[tuple[str, ...]]:
    """Every command and group under `flask --app app`, found through `--help` as a person
    finds them, each group's help checked on the way."""
    found: list[tuple[str, ...]] = []
    groups: list[tuple[str, ...]] = [()]
    with ThreadPoolExecutor(max_workers=3) as pool:
        while groups:
            answers = list(pool.map(lambda group: flask(*group, "--help"), groups))
            next_groups = []
            for group, result in zip(groups, answers, strict=True):
                assert_shows_help(group, result)
                for name in subcommands(result.stdout):
                    found.append((*group, name))
                    next_groups.append((*group, name))
            groups = next_groups
    return found


# Runs `flask`'s own entry point once per command line given as JSON on stdin, in one process (a
# `flask` process costs seconds to start on a loaded machine, and there are dozens of leaves);
# each run builds its own ScriptInfo, so each loads the app as `flask` does. Per command: its
# exit status, stdout and stderr, as JSON lines.
LEAF_HELPS = """
import contextlib, io, json, sys
from flask.cli import main
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["flask", *argv]
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exit:
            code = exit.code or 0
    print(json.dumps([code, out.getvalue(), err.getvalue()]), file=sys.__stdout__)
"""


def leaf_helps(commands: list[tuple[str, ...]]) -> list[subprocess.CompletedProcess]:
    lines = [["--app", "app", *path, "--help"] for path in commands]
    driver = subprocess.run(
        [sys.executable, "-c", LEAF_HELPS],
        input=json.dumps(lines),
        env=laptop_environ(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert driver.returncode == 0, driver.stderr
    answers = [json.loads(line) for line in driver.stdout.splitlines()]
    assert len(answers) == len(commands), driver.stdout
    return [
        subprocess.CompletedProcess(["flask", *line], code, stdout, stderr)
        for line, (code, stdout, stderr) in zip(lines, answers, strict=True)
    ]


def test_the_help_of_every_command_works_with_no_database():
    commands = every_command()
    top_level = {path[0] for path in commands}
    assert {"brands", "demo", "events", "endpoints", "secrets", "worker", "db"} <= top_level
    assert ("brands", "issue-bootstrap-token") in commands
    assert ("db", "upgrade") in commands
    # The groups' own helps were checked while walking, each in a `flask` process of its own.
    for path, result in zip(commands, leaf_helps(commands), strict=True):
        assert_shows_help(path, result)


@pytest.mark.parametrize(
    "command",
    [
        ("brands", "list"),
        ("brands", "issue-bootstrap-token", "brd_x"),
        ("demo", "simulate"),
        ("events", "emit", "brd_x", "deal.completed"),
        ("endpoints", "disable", "whe_x", "--reason", "floods"),
        ("secrets", "reencrypt"),
        ("worker", "--burst"),
        ("db", "upgrade"),
        ("routes",),
    ],
    ids=" ".join,
)
def test_a_command_without_database_url_says_so_in_one_line(command):
    result = flask(*command)
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert result.stderr.startswith(NO_DATABASE_URL), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


@pytest.mark.parametrize(
    "command", [("brands", "list"), ("demo", "brand"), ("db", "upgrade")], ids=" ".join
)
def test_a_command_that_cannot_reach_the_database_says_so_in_one_line(command):
    result = flask(*command, environ=laptop_environ(DATABASE_URL=UNREACHABLE))
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert result.stderr.startswith("Error: cannot reach the database ("), result.stderr
    assert '"127.0.0.1", port 1 failed' in result.stderr
    assert "start `make run`, or check DATABASE_URL" in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
