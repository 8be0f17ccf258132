"""The README's shell examples, run word for word as a newcomer would on a fresh clone: `make run`
(the real supervisor, scripts/run.py, on this run's database and Redis), then every command of
every ```sh block in order, in a shell with the variables the earlier ones set.

What the README shows is checked, not just run:
- a `# → 201 {...}` line after a command is a claim about its answer: the status, and every
  `"field": value` it names (`"…"` any text, `"cmp_…"` text starting so, or the exact value);
- a line `NAME=prefix…  # …` is "paste what the previous command printed": that command's output
  must hold such a value, which the next commands then use;
- every `$NAME` a command uses was set by an earlier line (the shell runs with `set -u`);
- what the commands sent to the bundled receiver arrived there: the test ping, each event the
  simulated steps published to its subscription, and the conversion recorded.

Only `make test` (this suite) and `make screenshots` are not run. Ports are the test's own: the
README's 5000 and 8000 are replaced by free ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SHELL_BLOCK = re.compile(r"```sh\n(.*?)```", re.S)
CLAIM = re.compile(r"^#\s*→\s*(?:(\d{3})\s+)?(.*)$")
PLACEHOLDER = re.compile(r"^([A-Z_]+)=(\S*)…(?:\s+#.*)?$")
ASSIGNMENT = re.compile(r"^([A-Z_]+)=(.+?)(?:\s+#.*)?$")
PAIR = re.compile(r'"(\w+)":\s*("(?:[^"\\]|\\.)*"|true|false|null|-?\d+|\[\])')
NOT_RUN = ("make test", "make screenshots")
SETTLE_SECONDS = 30.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Step:
    command: str
    claims: list[str] = field(default_factory=list)


def readme_steps(text: str) -> list[Step]:
    """The commands of every ```sh block in order, each with the `# →` lines that follow it."""
    steps: list[Step] = []
    for block in SHELL_BLOCK.findall(text):
        pending = ""
        for line in block.splitlines():
            if not pending and line.strip().startswith("#"):
                claim = CLAIM.match(line.strip())
                if claim and steps:
                    steps[-1].claims.append(line.strip())
                continue
            pending = f"{pending}\n{line}" if pending else line
            if pending.rstrip().endswith("\\") or not _complete(pending):
                continue
            if pending.strip():
                steps.append(Step(pending.strip()))
            pending = ""
        assert not pending.strip(), f"an unfinished command in the README: {pending}"
    return steps


def _complete(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return True


def matches(actual, expected: str) -> bool:
    value = json.loads(expected)
    if isinstance(value, str) and value.endswith("…"):
        return isinstance(actual, str) and actual.startswith(value[:-1]) and actual != ""
    return actual == value


def found(tree, key: str, expected: str) -> bool:
    """Whether some object in `tree` has `key` with a value the claim allows."""
    if isinstance(tree, dict):
        if key in tree and matches(tree[key], expected):
            return True
        return any(found(value, key, expected) for value in tree.values())
    if isinstance(tree, list):
        return any(found(item, key, expected) for item in tree)
    return False


def claim_problems(claims: list[str], output: str) -> list[str]:
    problems = []
    for claim in claims:
        status, shown = CLAIM.match(claim).groups()
        try:
            answer = json.loads(output)
        except ValueError:
            problems.append(f"{claim!r}: the answer is not JSON: {output[:300]!r}")
            continue
        if status and answer.get("statusCode") != int(status):
            problems.append(f"{claim!r}: answered {answer.get('statusCode')}: {output[:500]}")
        for key, expected in PAIR.findall(shown):
            if not found(answer, key, expected):
                problems.append(f"{claim!r}: no {key} = {expected} in {output[:800]}")
    return problems


class Walkthrough:
    """A terminal: shell variables, background jobs, and what every command printed."""

    def __init__(self, environ: dict[str, str], tmp_path: Path) -> None:
        self.port = free_port()
        self.receiver_port = free_port()
        self.environ = environ
        self.tmp_path = tmp_path
        self.variables: dict[str, str] = {}
        self.jobs: list[subprocess.Popen] = []
        self.job_logs: list[Path] = []
        self.job_commands: list[str] = []
        self.outputs: list[str] = []
        self.supervisor: subprocess.Popen | None = None
        self.supervisor_log = tmp_path / "make-run.log"
        self.stopped: list[int] = []

    def localize(self, command: str) -> str:
        command = command.replace("127.0.0.1:5000", f"127.0.0.1:{self.port}")
        return re.sub(r"\b8000\b", str(self.receiver_port), command)

    def env(self) -> dict[str, str]:
        return {**self.environ, **self.variables}

    def run(self, step: Step) -> None:
        command = step.command
        if any(skipped in command for skipped in NOT_RUN):
            return
        if command.split("#")[0].strip() == "make run":
            return self.make_run()
        placeholder = PLACEHOLDER.match(command)
        if placeholder:
            return self.paste(*placeholder.groups())
        if command.endswith("&") or " & " in command.split("#")[0]:
            return self.background(command.split("#")[0].strip().rstrip("&").strip())
        kill = re.fullmatch(r"kill %(\d+)(\s+#.*)?", command)
        if kill:
            return self.stop_job(int(kill.group(1)))
        assignment = ASSIGNMENT.match(command)
        if assignment and "\n" not in command:
            name, value = assignment.groups()
            self.variables[name] = self.shell(f'printf %s "{value}"' if "$" in value else value)
            return
        self.outputs.append(self.until_claims_hold(step))

    def until_claims_hold(self, step: Step) -> str:
        """Run it; a read (a GET) that does not show yet what its claim says is asked again
        for a while: a worker may not have made its attempt yet."""
        reads = " -X " not in step.command
        deadline = time.monotonic() + (SETTLE_SECONDS if reads else 0)
        while True:
            output = self.shell(self.localize(step.command))
            problems = claim_problems(step.claims, output)
            if not problems:
                return output
            if time.monotonic() > deadline:
                pytest.fail("\n".join(problems), pytrace=False)
            time.sleep(0.5)

    def shell(self, command: str) -> str:
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert result.returncode == 0, (
            f"`{command}` exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
        return result.stdout.strip()

    def paste(self, name: str, prefix: str) -> None:
        """What the previous command printed, as a person pastes it."""
        assert self.outputs, f"{name}={prefix}… pastes from a command before it"
        pasted = re.findall(rf"{re.escape(prefix)}[\w-]+", self.outputs[-1])
        assert pasted, f"{name}={prefix}…: the previous command printed none:\n{self.outputs[-1]}"
        # The longest: a key's secret, not its 12-character keyPrefix printed beside it.
        self.variables[name] = max(pasted, key=len)

    def make_run(self) -> None:
        if self.supervisor is not None:
            # The README names `make run` more than once (its summary, then the walk-through):
            # one service in one terminal, which must still be up.
            assert self.supervisor.poll() is None, self.supervisor_log.read_text()
            return
        env = {
            **self.environ,
            "PORT": str(self.port),
            "RUN_STATE_DIR": str(self.tmp_path / "run-state"),
            "PYTHONUNBUFFERED": "1",
        }
        with open(self.supervisor_log, "wb") as log:
            self.supervisor = subprocess.Popen(
                ["make", "run"],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.supervisor.poll() is None, self.supervisor_log.read_text()
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2).ok:
                    self.outputs.append(self.supervisor_log.read_text())
                    return
            time.sleep(0.25)
        pytest.fail(f"make run did not serve in time:\n{self.supervisor_log.read_text()}")

    def background(self, command: str) -> None:
        log = self.tmp_path / f"job-{len(self.jobs) + 1}.log"
        with open(log, "wb") as out:
            job = subprocess.Popen(
                ["bash", "-c", f"exec {self.localize(command)}"],
                cwd=ROOT,
                env={**self.env(), "PYTHONUNBUFFERED": "1"},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.jobs.append(job)
        self.job_logs.append(log)
        self.job_commands.append(command)
        deadline = time.monotonic() + 20
        while "listening on" not in log.read_text() and time.monotonic() < deadline:
            assert job.poll() is None, log.read_text()
            time.sleep(0.1)

    def wait_for_a_retry(self) -> None:
        """Until a delivery the README left retrying has had its second attempt (the first
        retry comes about 5 s after the first failure), so the retry path has run too."""
        url = (
            f"http://127.0.0.1:{self.port}/api/v1/brand/{self.variables['BRAND']}"
            "/webhook/fetch-deliveries?retrying=true"
        )
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            answer = requests.get(url, headers={"X-Api-Key": self.variables["KEY"]}, timeout=10)
            if any(d["attemptCount"] >= 2 for d in answer.json()["data"]["deliveries"]):
                return
            time.sleep(0.5)
        pytest.fail(f"no retry within {SETTLE_SECONDS} s:\n{self.supervisor_log.read_text()}")

    def job_output(self, number: int) -> str:
        return self.job_logs[number - 1].read_text()

    def stop_job(self, number: int) -> None:
        self.assert_received(number)
        self.jobs[number - 1].send_signal(signal.SIGTERM)
        self.jobs[number - 1].wait(10)
        self.stopped.append(number)

    def assert_received(self, number: int) -> None:
        """Everything the commands so far sent to the receiver (job `number`) arrived: the test
        ping, each event a simulated step published to its subscription, each conversion."""
        outputs = [json.loads(o) for o in self.outputs if o.startswith("{")]
        [registered] = [o["data"] for o in outputs if "signingSecret" in o.get("data", {})]
        published = [
            event["id"]
            for output in outputs
            for event in output.get("events", [])
            if event["type"] in registered["events"]
        ]
        assert published, "no simulated step published an event the endpoint subscribes to"
        conversions = [
            o["data"]["conversionId"] for o in outputs if "conversionId" in o.get("data", {})
        ]
        assert conversions, "no postback was recorded while the receiver ran"
        expected = ["webhook.test", *published, *conversions]
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            received = self.job_output(number)
            missing = [value for value in expected if value not in received]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert missing == [], f"the receiver did not get {missing}:\n{received}"

    def close(self) -> None:
        for job in self.jobs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            job.wait(10)
        if self.supervisor is not None and self.supervisor.poll() is None:
            os.killpg(self.supervisor.pid, signal.SIGINT)
            try:
                self.supervisor.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.supervisor.pid, signal.SIGKILL)
                self.supervisor.wait(10)


@pytest.fixture
def walkthrough(app, app_environ, tmp_path):
    """A terminal on this run's database and Redis, as a laptop with them set would be."""
    environ = {
        **{k: v for k, v in app_environ.items() if k != "APP_ENV"},
        "APP_ENV": "development",
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
    }
    terminal = Walkthrough(environ, tmp_path)
    yield terminal
    terminal.close()


def test_every_command_of_the_readme_works_word_for_word(walkthrough):
    steps = readme_steps(README.read_text())
    assert steps[0].command.startswith("make run"), "the README starts with make run"
    for step in steps:
        walkthrough.run(step)

    # The receiver got what was sent to it (checked when the README stops it).
    assert walkthrough.stopped == [1], "the README stops the receiver to show retrying deliveries"
    # The relay forwarded the event emitted after it started, and the receiver answered 200.
    [relay] = [n for n, c in enumerate(walkthrough.job_commands, 1) if "scripts/listen.py" in c]
    assert re.search(r"deal\.completed +evt_\w+  -> 200 \(", walkthrough.job_output(relay)), (
        walkthrough.job_output(relay)
    )

    # A normal run logs no error: not while a receiver is down and its deliveries are retried
    # (the README's last step), nor anywhere before.
    walkthrough.wait_for_a_retry()
    assert error_lines(walkthrough.supervisor_log.read_text()) == []


ERROR_LINE = re.compile(r"\bERROR\b|^Traceback \(most recent call last\)|\bCRITICAL\b")


def error_lines(output: str) -> list[str]:
    """The lines of the server's and the worker's output that report an error or a traceback
    (`VALIDATION_ERROR` in a logged answer is not one)."""
    return [line for line in output.splitlines() if ERROR_LINE.search(line)]


def test_error_lines_are_found_whatever_logged_them():
    """The check above can fail: our logger's, gunicorn's and RQ's error lines, a traceback."""
    output = "\n".join(
        [
            "2026-11-25 17:41:19,723 ERROR brand_api.webhooks queueing webhook drains failed",
            "Traceback (most recent call last):",
            "[2026-11-25 17:40:47 +0000] [11231] [ERROR] Worker (pid:1) was sent SIGKILL!",
            "17:41:22 Worker 64cd: webhooks: Job OK (91034180)",
            "request_id=req_1 status=400 errorCode=VALIDATION_ERROR",
        ]
    )
    assert len(error_lines(output)) == 3


def test_the_readme_writes_every_command_one_way():
    """`.venv/bin/flask --app app`, `.venv/bin/python`, `.venv/bin/gunicorn`: a bare `flask`
    is "command not found" on a laptop that did not activate the venv."""
    text = README.read_text()
    code = " ".join(SHELL_BLOCK.findall(text) + re.findall(r"`([^`\n]+)`", text))
    for tool in ("flask", "python", "python3", "gunicorn", "pip"):
        for found_at in re.finditer(rf"(?<![\w/.-]){tool}\b(?![./\w-])", code):
            before = code[max(0, found_at.start() - 10) : found_at.start()]
            assert before.endswith(".venv/bin/"), f"`{tool}` without .venv/bin/: …{before}{tool}…"
    assert ".venv/bin/flask --app app" in text
    assert not re.search(r"\.venv/bin/flask (?!--app app)", text)


def test_readme_steps_join_continued_lines_and_keep_their_claims():
    steps = readme_steps(
        "```sh\n"
        'curl -s a \\\n  -d \'{"x": 1,\n       "y": 2}\'\n'
        '# → 201 {"data": {"id": "key_…"}}\n'
        "KEY=svc_live_…   # paste it\n"
        "```\n"
    )
    assert [step.command for step in steps] == [
        'curl -s a \\\n  -d \'{"x": 1,\n       "y": 2}\'',
        "KEY=svc_live_…   # paste it",
    ]
    assert steps[0].claims == ['# → 201 {"data": {"id": "key_…"}}']


def test_a_claim_the_answer_contradicts_is_a_problem():
    """The check that holds the README to its answers can fail."""
    answer = json.dumps(
        {"statusCode": 201, "data": {"attributed": True, "campaignId": None, "replay": False}}
    )
    assert claim_problems(['# → 201 {"data": {"attributed": true}}'], answer) == []
    assert claim_problems(['# → 200 {"data": {}}'], answer)
    assert claim_problems(['# → 201 {"data": {"campaignId": "cmp_…"}}'], answer)
    assert claim_problems(['# → 201 {"data": {"replay": true}}'], answer)
