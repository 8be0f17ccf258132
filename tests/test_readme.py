"""The README's shell examples, run word for word as a newcomer would on a fresh clone: `make run`
(the real supervisor, scripts/run.py, on this run's database and Redis) in one terminal, then
every command of every ```sh block pasted in order into ONE bash session, the second terminal:
its variables, its background jobs and its `$!` carry from one block to the next, as they do
for a person, so a command that works only on its own (a `kill %1` after a restart made the
receiver job %3) fails here.

What the README shows is checked, not just run:
- every command exits 0 (`kill` included), in a shell with `set -u`: every `$NAME` a command
  uses was set by an earlier line;
- nothing is copied by hand: every value a later command uses is captured by the shell from
  the command that produced it (`KEY=$(echo "$ANSWER" | field data.secret)`), never pasted;
- every command that prints something shows what it prints: a `# → …` line after it, which is
  a claim about its answer. `# → 201 {...}`: the status, and every `"field": value` it names
  (`"…"` any text, `"cmp_…"` text starting so, or the exact value); `# → evt_…`: the text
  printed, `…` standing for any;
- what the commands sent to the bundled receiver arrived there, each with a signature it
  verified: the test ping, each event the simulated steps and `events emit` published to its
  subscription, the conversion recorded and the events the relay forwarded (its line says
  `-> 200`); and each arrived exactly once, the one that waited for a retry while the receiver
  was down included (retry-now, not a redelivery);
- a process the README stops is gone; a receiver started again gets what is sent after.

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
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SHELL_BLOCK = re.compile(r"```sh\n(.*?)```", re.S)
CLAIM = re.compile(r"^#\s*→\s*(?:(\d{3})\s+)?(.*)$")
PLACEHOLDER = re.compile(r"^([A-Z_]+)=(\S*)…(?:\s+#.*)?$")
ASSIGNMENT = re.compile(r"^([A-Z_]+)=(.+?)(?:\s+#.*)?$")
FUNCTION = re.compile(r"^\w+\(\)\s*\{")
# The values a newcomer used to copy from JSON by hand (issue 43): the shell captures each.
CAPTURED = ("KEY", "KEY_ID", "NEW_KEY", "ENDPOINT", "SECRET", "DELIVERY", "AFTER")
# A line the receiver prints for a delivery: event, delivery id, verdict, body.
RECEIVED = re.compile(r"^(\S+) (\S+) \(([^)]*)\) (.*)$")
PAIR = re.compile(r'"(\w+)":\s*("(?:[^"\\]|\\.)*"|true|false|null|-?\d+|\[\])')
NOT_RUN = ("make test", "make screenshots")
SETTLE_SECONDS = 30.0


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


def text_matches(shown: str, output: str) -> bool:
    """Whether `output` is the text a claim shows, `…` standing for any text."""
    pattern = ".+?".join(re.escape(part) for part in shown.strip().split("…"))
    return re.fullmatch(pattern, output.strip()) is not None


def prints_nothing(command: str) -> bool:
    """A step whose result is in the shell, not on the screen: an assignment (`KEY=$(…)`), a
    function, a background job, a `kill`."""
    first = command.split("#")[0].strip()
    return bool(
        (ASSIGNMENT.match(command) and not re.search(r";\s*echo\b", command))
        or FUNCTION.match(command)
        or first.endswith("&")
        or re.match(r"kill\b", command)
    )


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
        if not shown.startswith("{"):  # printed text, not a JSON answer
            if not text_matches(shown, output):
                problems.append(f"{claim!r}: printed {output[:500]!r}")
            continue
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


@dataclass
class Pasted:
    """What one command printed in the session, and how it exited."""

    command: str
    status: int
    stdout: str
    stderr: str
    stdout_path: Path


class Terminal:
    """One bash session fed like a terminal: each command is pasted into it, whole, after the
    one before has finished. A command's output goes to files of its own (a background job's
    too: the job keeps writing there), so that each answer can be checked alone."""

    def __init__(self, environ: dict[str, str], directory: Path) -> None:
        self.directory = directory
        self.count = 0
        self.log = directory / "terminal.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                ["bash", "--norc", "--noprofile"],
                cwd=ROOT,
                env=environ,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # close() ends the session and every job it started
            )
        self.run("set -u")

    def run(self, command: str, timeout: float = 90) -> Pasted:
        self.count += 1
        stdout, stderr, status = (self.directory / f"step-{self.count}.{end}" for end in "oes")
        # The braces keep the command in this shell (its variables and jobs stay), and send
        # what it prints, its background jobs' output included, to this step's files.
        self.process.stdin.write(
            f"{{ {command}\n}} >{shlex.quote(str(stdout))} 2>{shlex.quote(str(stderr))}"
            " </dev/null\n"
            f"echo $? >{shlex.quote(str(status))}.part && mv {shlex.quote(str(status))}.part "
            f"{shlex.quote(str(status))}\n"
        )
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout
        while not status.exists():
            if self.process.poll() is not None:
                pytest.fail(
                    f"the shell ended at `{command}`:\n{self.log.read_text()}"
                    f"{stderr.read_text() if stderr.exists() else ''}",
                    pytrace=False,
                )
            if time.monotonic() > deadline:
                pytest.fail(f"`{command}` did not finish within {timeout:.0f} s", pytrace=False)
            time.sleep(0.05)
        return Pasted(
            command, int(status.read_text()), stdout.read_text(), stderr.read_text(), stdout
        )

    def value(self, name: str) -> str:
        """A shell variable, as `echo "$NAME"` shows it."""
        return self.succeed(f'printf %s "${name}"').stdout

    def succeed(self, command: str) -> Pasted:
        pasted = self.run(command)
        assert pasted.status == 0, (
            f"`{command}` exited {pasted.status}:\n{pasted.stdout}\n{pasted.stderr}"
        )
        return pasted

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


@dataclass
class Job:
    """A command the README runs in the background (`… &`), and its `$!`."""

    command: str
    pid: int
    log: Path
    outputs_before: int  # how many answers the README had shown when it started

    @property
    def output(self) -> str:
        return self.log.read_text()

    @property
    def is_receiver(self) -> bool:
        return "scripts/webhook_receiver.py" in self.command

    def running(self) -> bool:
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"


class Walkthrough:
    """The README's two terminals: `make run` in the first, the one session of the rest."""

    def __init__(self, environ: dict[str, str], tmp_path: Path) -> None:
        self.port = free_port()
        self.receiver_port = free_port()
        self.environ = environ
        self.tmp_path = tmp_path
        self.terminal = Terminal(environ, tmp_path)
        # What each command that answers printed, in order, beside the command.
        self.outputs: list[tuple[str, str]] = []
        self.jobs: list[Job] = []
        self.stopped: list[Job] = []
        self.supervisor: subprocess.Popen | None = None
        self.supervisor_log = tmp_path / "make-run.log"

    def localize(self, command: str) -> str:
        command = command.replace("127.0.0.1:5000", f"127.0.0.1:{self.port}")
        return re.sub(r"\b8000\b", str(self.receiver_port), command)

    def run(self, step: Step) -> None:
        command = step.command
        if any(skipped in command for skipped in NOT_RUN):
            return
        if command.split("#")[0].strip() == "make run":
            return self.make_run()
        if command.split("#")[0].strip().endswith("&"):
            return self.background(command)
        if re.match(r"kill\b", command):
            return self.stop(command)
        if prints_nothing(command):
            self.terminal.succeed(self.localize(command))
            return
        self.outputs.append((command, self.until_claims_hold(step)))

    def until_claims_hold(self, step: Step) -> str:
        """Paste it; a read (a GET) that does not show yet what its claim says is pasted again
        for a while, as a person would: a worker may not have made its attempt yet."""
        reads = " -X " not in step.command
        deadline = time.monotonic() + (SETTLE_SECONDS if reads else 0)
        while True:
            output = self.terminal.succeed(self.localize(step.command)).stdout.strip()
            problems = claim_problems(step.claims, output)
            if not problems:
                return output
            if time.monotonic() > deadline:
                pytest.fail("\n".join(problems), pytrace=False)
            time.sleep(0.5)

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
                    return
            time.sleep(0.25)
        pytest.fail(f"make run did not serve in time:\n{self.supervisor_log.read_text()}")

    def background(self, command: str) -> None:
        pasted = self.terminal.succeed(self.localize(command))
        job = Job(
            command,
            int(self.terminal.value("!")),
            pasted.stdout_path,
            outputs_before=len(self.outputs),
        )
        self.jobs.append(job)
        # A person waits for it to say it is ready before going on.
        deadline = time.monotonic() + 20
        while "listening on" not in job.output and time.monotonic() < deadline:
            assert job.running(), f"`{command}` ended:\n{job.output}\n{pasted.stderr}"
            time.sleep(0.1)

    def stop(self, command: str) -> None:
        """A `kill` line, pasted as it is: it must succeed in this shell and stop exactly one
        of the jobs, which, if a receiver, had got everything sent to it until then."""
        running = [job for job in self.jobs if job.running()]
        for job in running:
            if job.is_receiver:
                self.assert_received(job, self.sent_since(job))
        self.terminal.succeed(command)
        deadline = time.monotonic() + 10
        while not (stopped := [job for job in running if not job.running()]):
            assert time.monotonic() < deadline, f"`{command}` stopped nothing"
            time.sleep(0.1)
        assert len(stopped) == 1, f"`{command}` stopped {[job.command for job in stopped]}"
        self.stopped += stopped

    def answers(self, since: int = 0) -> list[dict]:
        answers = []
        for _, output in self.outputs[since:]:
            with contextlib.suppress(ValueError):
                answer = json.loads(output)
                if isinstance(answer, dict):
                    answers.append(answer)
        return answers

    def relayed(self) -> list[str]:
        """The events the relay says it delivered (`-> 200`)."""
        return [
            event_id
            for job in self.jobs
            if "scripts/listen.py" in job.command
            for event_id in re.findall(r" (evt_\w+)  -> 200 \(", job.output)
        ]

    def emitted(self, since: int = 0) -> list[tuple[str, str]]:
        """(event name, event id) of each `events emit` whose id the README shows."""
        found = []
        for command, output in self.outputs[since:]:
            emit = re.search(r"events emit \S+ ([a-z_.]+)", command)
            if emit and re.fullmatch(r"evt_\w+", output.strip()):
                found.append((emit[1], output.strip()))
        return found

    def sent_since(self, receiver: Job) -> list[str]:
        """What the README's commands sent to the endpoint since the receiver started: each
        queued delivery (the test ping, a redelivery), each event a simulated step published to
        its subscription, each conversion."""
        [registered] = [a["data"] for a in self.answers() if "signingSecret" in a.get("data", {})]
        sent = []
        for answer in self.answers(since=receiver.outputs_before):
            data = answer.get("data") or {}
            sent += [data[name] for name in ("deliveryId", "conversionId") if name in data]
            sent += [e["id"] for e in answer.get("events", []) if e["type"] in registered["events"]]
        emitted = self.emitted(since=receiver.outputs_before)
        sent += [event_id for name, event_id in emitted if name in registered["events"]]
        return sent

    def assert_received(self, receiver: Job, expected: list[str]) -> None:
        """Each of `expected` arrived at the receiver, every delivery with a signature it
        verified (one line per delivery)."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            received = receiver.output
            missing = [value for value in expected if value not in received]
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert missing == [], f"the receiver did not get {missing}:\n{received}"
        deliveries = received.splitlines()[1:]
        unverified = [line for line in deliveries if "(signature OK)" not in line]
        assert unverified == [], f"deliveries the receiver did not verify:\n{received}"

    def wait_for_a_retry(self, delivery_id: str) -> None:
        """Until the delivery the README left retrying has had its second attempt (the first
        retry comes about 5 s after the first failure), so the retry path has run too."""
        url = (
            f"http://127.0.0.1:{self.port}/api/v1/brand/{self.terminal.value('BRAND')}"
            f"/webhook/deliveries/{delivery_id}"
        )
        headers = {"X-Api-Key": self.terminal.value("KEY")}
        deadline = time.monotonic() + SETTLE_SECONDS
        while time.monotonic() < deadline:
            answer = requests.get(url, headers=headers, timeout=10).json()
            if answer["data"]["attemptCount"] >= 2:
                return
            time.sleep(0.5)
        pytest.fail(f"no retry within {SETTLE_SECONDS} s:\n{self.supervisor_log.read_text()}")

    def close(self) -> None:
        self.terminal.close()
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
        "PYTHONUNBUFFERED": "1",
    }
    terminal = Walkthrough(environ, tmp_path)
    yield terminal
    terminal.close()


def test_every_command_of_the_readme_works_pasted_in_order_into_one_shell(walkthrough):
    steps = readme_steps(README.read_text())
    assert steps[0].command.startswith("make run"), "the README starts with make run"
    for step in steps:
        walkthrough.run(step)

    # The README stops the receiver to show retrying deliveries (it had got everything sent
    # to it, each verified: checked then), and starts it again.
    receivers = [job for job in walkthrough.jobs if job.is_receiver]
    assert len(receivers) == 2, [job.command for job in walkthrough.jobs]
    first, again = receivers
    assert walkthrough.stopped == [first]
    sent = walkthrough.sent_since(first)
    for prefix in ("whd_", "evt_", "conv_"):  # the test ping, simulated events, a postback
        assert any(value.startswith(prefix) for value in sent), sent
    assert walkthrough.emitted(), "the README emits an event and shows its id"
    # The relay delivered the events emitted after it started (its line says `-> 200`), as
    # deliveries of their own that the receiver verified.
    relayed = walkthrough.relayed()
    assert relayed, [job.output for job in walkthrough.jobs]
    for event_id in relayed:
        assert any(f" {event_id} (signature OK) " in r.output for r in receivers), event_id
    # The delivery that waited for a retry while the receiver was down reached the receiver
    # started again, brought forward by retry-pending: the same delivery, not a new one.
    retried = walkthrough.terminal.value("DELIVERY")
    walkthrough.assert_received(again, [retried, *walkthrough.sent_since(again)])
    assert retried not in first.output

    # Every webhook the README sent arrived exactly once: no delivery twice, and no event
    # twice (a redelivery, or the relay forwarding what an endpoint also gets, would be).
    deliveries = delivered_events(receivers)
    for seen in (Counter(d for d, _ in deliveries), Counter(e for _, e in deliveries)):
        repeated = {key: count for key, count in seen.items() if count > 1}
        assert repeated == {}, "\n".join(receiver.output for receiver in receivers)
    received_events = {event_id for _, event_id in deliveries}
    for event_id in relayed + [event_id for _, event_id in walkthrough.emitted()]:
        assert event_id in received_events, event_id

    # A normal run logs no error: not while a receiver is down and its deliveries are retried,
    # nor anywhere before.
    walkthrough.wait_for_a_retry(retried)
    assert error_lines(walkthrough.supervisor_log.read_text()) == []


def delivered_events(receivers: list[Job]) -> list[tuple[str, str]]:
    """(delivery, event id) of every delivery the receivers printed: a delivery's id is its
    `X-Service-Delivery` (the relay's, the event id), its event the body's `id`."""
    found = []
    for receiver in receivers:
        for line in receiver.output.splitlines():
            received = RECEIVED.match(line)
            if received and received[4].startswith("{"):
                found.append((received[2], json.loads(received[4])["id"]))
    return found


def test_the_readme_leaves_nothing_to_copy_by_hand():
    """Every value a later command needs is captured by the shell from the command that made
    it: no `NAME=prefix…` to paste over, each of the values a newcomer used to copy from JSON
    read with `$(…)`, using only the venv's Python or the project's own command line."""
    steps = readme_steps(README.read_text())
    pasted = [step.command for step in steps if PLACEHOLDER.match(step.command)]
    assert pasted == []
    for name in CAPTURED:
        assigned = [step.command for step in steps if re.match(rf"{name}=(?!\$)", step.command)]
        captured = [step.command for step in steps if step.command.startswith(f"{name}=$(")]
        assert captured and not assigned, (name, assigned)
        for command in captured:
            assert re.search(r"\| field \S+\)|\.venv/bin/(?:python|flask) ", command), command


def test_each_step_of_the_readme_shows_what_it_printed():
    """A command that prints something is followed by what it prints (`# → …`), so a person
    pasting it can tell it worked; only what keeps its result in the shell shows nothing."""
    steps = readme_steps(README.read_text())
    silent = [
        step.command
        for step in steps
        if not step.claims
        and not prints_nothing(step.command)
        and not any(skipped in step.command for skipped in (*NOT_RUN, "make run"))
    ]
    assert silent == []


def test_the_walkthrough_retries_now_rather_than_redelivering():
    """Once the receiver is back, the README brings the waiting delivery forward
    (retry-pending), which sends it once; a redeliver there made a second delivery of the same
    event, and the first arrived too."""
    commands = " ".join(step.command for step in readme_steps(README.read_text()))
    assert "/retry-pending" in commands
    assert "/redeliver" not in commands


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
