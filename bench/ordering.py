"""Ordering per subject (CONTRACT 12.2, issue 37 item 3), side by side with no ordering, in one
run (see bench/README.md, "Ordering per subject").

Two databases, set up alike: 1,000 subjects (deals) spread over a few brands whose 20 endpoints
(together) answer after 200 ms; in one every endpoint is registered with `ordering: "subject"`,
in the other with `ordering: "none"`. Each database has its own `flask --app app worker`, and
one publisher thread each publishes the same schedule at the same moments: every deal's life in
two steps (`escrow.held` + `deal.accepted` in one transaction, later `deal.completed` +
`escrow.released` in another), each event going to every endpoint of the deal's brand. One
subject's receiver answers 500 to every delivery of that subject for a minute, in both.

Per ordering: the other subjects' deliveries per second during that minute (and their latency
from the publishing commit), the arrivals out of order at the receivers (an event of a subject
answered 2xx before an earlier one of that subject was), and how long after the receiver
recovered the held subject's events were all delivered, and whether in order. Then, with
`ordering: "subject"` only, a short variant shows what an event that fails for good (its
attempts exhausted) does to the ones behind it: they go on (CONTRACT 12.2).

Run from the repository root:  .venv/bin/python -m bench.ordering   (--quick: a smoke run)

The receiver is this file run with --receiver: an asyncio server in its own process that
"sleeps" 200 ms per request, reads each body's `subject` and `sequence`, and checks the order
itself as it answers. Progress goes to stderr; stdout gets one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flask import Flask

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    HttpRequests,
    Processes,
    app_settings,
    child_environ,
    free_port,
    log,
    percentile,
    run_benchmark,
)

ORDERINGS = ("subject", "none")
RECEIVER_DELAY_SECONDS = 0.2
# Short, so that the failing subject's first event is retried often (the largest gap is 8 s).
RETRY_SCHEDULE = "1,2,4,8,8,8,8,8,8,8,8,8,8,8,8"
# The variant where an event fails for good: 3 attempts, a second apart.
EXHAUST_SCHEDULE = "1,1"
# "Within seconds" of the recovery: the largest gap of the schedule, plus 2 s.
CATCH_UP_TARGET_SECONDS = 10.0
THROUGHPUT_TARGET = 0.9
# A deal's life, in two transactions of two events each (accepting a deal holds its escrow just
# before: deal.accepted's description); the data key that names the deal (the subject rule,
# models/event_subjects.py).
STEPS = (
    (("escrow.held", "dealId"), ("deal.accepted", "id")),
    (("deal.completed", "id"), ("escrow.released", "dealId")),
)
EVENT_NAMES = [name for step in STEPS for name, _ in step]
EXHAUSTED_DEAL = "deal_bench_exhausted"

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
_FAIL = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom"


def deal_id(number: int) -> str:
    return f"deal_bench{number:04d}"


# --------------------------------------------------------------------------------------------
# The receiver (a separate process)
# --------------------------------------------------------------------------------------------


class _Receiver(HttpRequests):
    """`/<ordering>/<brand>/<endpoint>` takes deliveries; `/_fail?subject=` sets (or, empty,
    clears) the subject answered 500, `/_reject?subject=&sequence=` answers 500 to one event of
    a subject for good, `/_log` gives every answer."""

    failing_subject = ""
    rejected: set[tuple[str, int]] = set()
    switched: list[tuple[str, float]] = []
    # Per answer: [path, event id, subject, sequence, arrived, answered, status, the earlier
    # sequences of its subject this endpoint had not answered 2xx yet (2xx only), duplicate].
    answers: list[list] = []
    delivered: dict[tuple[str, str], set[int]] = {}
    tasks: set[asyncio.Task] = set()

    def handle(self, method: bytes, target: str, headers: dict[bytes, bytes]) -> None:
        if target.startswith("/_"):
            self.control(target)
            return
        body = json.loads(self.body)
        task = asyncio.get_running_loop().create_task(self.answer(target, body, time.monotonic()))
        _Receiver.tasks.add(task)
        task.add_done_callback(_Receiver.tasks.discard)

    def control(self, target: str) -> None:
        path, _, query = target.partition("?")
        params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        body = b"ok"
        if path == "/_fail":
            _Receiver.failing_subject = params["subject"]
            _Receiver.switched.append((params["subject"], time.monotonic()))
        elif path == "/_reject":
            _Receiver.rejected.add((params["subject"], int(params["sequence"])))
        elif path == "/_log":
            body = json.dumps(
                {"answers": _Receiver.answers, "switched": _Receiver.switched}
            ).encode()
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    async def answer(self, path: str, body: dict, arrived: float) -> None:
        await asyncio.sleep(RECEIVER_DELAY_SECONDS)
        if self.transport.is_closing():
            return
        subject, sequence = body["subject"]["id"], body["sequence"]
        answered = time.monotonic()
        if subject == _Receiver.failing_subject or (subject, sequence) in _Receiver.rejected:
            self.transport.write(_FAIL)
            _Receiver.answers.append(
                [path, body["id"], subject, sequence, arrived, answered, 500, [], False]
            )
            return
        seen = _Receiver.delivered.setdefault((path, subject), set())
        missing = [earlier for earlier in range(1, sequence) if earlier not in seen]
        duplicate = sequence in seen
        seen.add(sequence)
        self.transport.write(_OK)
        _Receiver.answers.append(
            [path, body["id"], subject, sequence, arrived, answered, 200, missing, duplicate]
        )


def serve_receiver(port: int) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Receiver, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _get(url: str, timeout: float = 30) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as response:
        return response.read()


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


@dataclass
class Side:
    """One ordering's database, app, endpoints, worker and publisher."""

    ordering: str
    app: Flask
    env: dict[str, str]
    conninfo: str
    brands: list[str] = field(default_factory=list)
    endpoints_per_brand: int = 0
    worker: subprocess.Popen = field(init=False)
    published: dict[str, float] = field(default_factory=dict)  # event id -> commit returned
    subject_of: dict[str, str] = field(default_factory=dict)  # event id -> deal
    lateness: list[float] = field(default_factory=list)  # how late each step was published
    cpu_marks: list[float] = field(default_factory=list)
    error: BaseException | None = None


def register(side: Side, receiver: str, brands: int, endpoints: int) -> None:
    from extensions import db
    from services.brands import create_brand
    from services.endpoint_urls import UrlPolicy
    from services.webhook_endpoints import register_endpoint

    side.endpoints_per_brand = endpoints // brands
    local = UrlPolicy(https_only=False, allow_local=True)
    with side.app.app_context():
        for number in range(brands):
            brand = create_brand(name=f"Ordering {side.ordering} {number}", plan="growth").id
            for index in range(side.endpoints_per_brand):
                register_endpoint(
                    brand_id=brand,
                    url=f"{receiver}/{side.ordering}/{number}/{index}",
                    events=EVENT_NAMES,
                    policy=local,
                    ordering=side.ordering,
                )
            side.brands.append(brand)
        db.session.commit()
        db.session.remove()


def publish_step(side: Side, number: int, step: int, deal: str | None = None) -> None:
    """One step of a deal's life: its two events in one transaction."""
    from extensions import db
    from services.events import publish_event

    deal = deal or deal_id(number)
    brand = side.brands[number % len(side.brands)]
    ids = []
    for name, key in STEPS[step]:
        data = {key: deal, "amountMinor": 500000} if key == "dealId" else {key: deal, "step": step}
        ids.append(publish_event(brand_id=brand, name=name, data=data).event.id)
    db.session.commit()
    returned = time.monotonic()
    for event_id in ids:
        side.published[event_id] = returned
        side.subject_of[event_id] = deal


def publisher(side: Side, schedule: list[tuple[int, int]], start: float, interval: float) -> None:
    """The schedule, step k at `start + k * interval`; a late step goes at once."""
    from extensions import db

    try:
        with side.app.app_context():
            for k, (number, step) in enumerate(schedule):
                due = start + k * interval
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                side.lateness.append(max(0.0, -wait))
                publish_step(side, number, step)
            db.session.remove()
    except BaseException as error:  # reported by the main thread
        side.error = error


def schedule_attempts(schedule: str, seconds: float) -> int:
    """Attempts a delivery failing from its first attempt gets within `seconds` by the
    schedule alone (no jitter, no catch-up)."""
    at, attempts = 0.0, 1
    for delay in (float(value) for value in schedule.split(",")):
        at += delay
        if at > seconds:
            break
        attempts += 1
    return attempts


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def query(side: Side, statement: str, params=()) -> list[tuple]:
    import psycopg

    with psycopg.connect(side.conninfo, autocommit=True) as conn:
        return conn.execute(statement, params).fetchall()


def start_worker(processes: Processes, side: Side, schedule: str) -> subprocess.Popen:
    env = {**side.env, "WEBHOOK_RETRY_SCHEDULE": schedule}
    worker = processes.start(
        f"worker-{side.ordering}", [sys.executable, "-m", "flask", "--app", "app", "worker"], env
    )
    deadline = time.monotonic() + 60
    while not query(side, "SELECT 1 FROM webhook_delivery_loops WHERE pid = %s", [worker.pid]):
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("worker did not start:\n" + processes.log_of(worker))
        time.sleep(0.2)
    return worker


def work_left(side: Side) -> int:
    return query(
        side,
        "SELECT (SELECT count(*) FROM webhook_delivery_queue)"
        " + (SELECT count(*) FROM webhook_delivery_leases)",
    )[0][0]


def drain(sides: list[Side], cap: float) -> float:
    """Until no delivery is pending in any side (or `cap` seconds); how long it took."""
    started = time.monotonic()
    while any(work_left(side) for side in sides):
        if time.monotonic() - started > cap:
            log(
                f"still pending after {cap:.0f} s: "
                + ", ".join(f"{side.ordering} {work_left(side)}" for side in sides)
            )
            break
        time.sleep(0.2)
    return time.monotonic() - started


def statuses(side: Side) -> dict[str, int]:
    rows = query(side, "SELECT status, count(*) FROM webhook_deliveries GROUP BY status")
    return {status: count for status, count in rows}


def figures(
    side: Side,
    answers: list[list],
    held: str,
    fail_on: float,
    fail_off: float,
) -> dict:
    """One ordering's figures from the receiver's answers and the side's database."""
    prefix = f"/{side.ordering}/"
    mine = [a for a in answers if a[0].startswith(prefix) and a[2] != EXHAUSTED_DEAL]
    ok = [a for a in mine if a[6] == 200]
    window = fail_off - fail_on
    others_in_window = [a for a in ok if a[2] != held and fail_on <= a[5] < fail_off]
    offered = sum(
        side.endpoints_per_brand
        for event_id, at in side.published.items()
        if fail_on <= at < fail_off and side.subject_of[event_id] != held
    )
    latencies = [
        (a[4] - side.published[a[1]]) * 1000
        for a in ok
        if a[2] != held and fail_on <= side.published[a[1]] < fail_off
    ]
    delivered_at = {(a[0], a[2], a[3]) for a in ok}
    out_of_order = past_failed = 0
    examples = []
    for a in ok:
        if not a[7]:
            continue
        # An earlier event that reached this endpoint later: out of order. One that never did
        # (its attempts exhausted): the later one went on past it, as CONTRACT 12.2 says.
        if any((a[0], a[2], earlier) in delivered_at for earlier in a[7]):
            out_of_order += 1
            if len(examples) < 3:
                examples.append(
                    {"endpoint": a[0], "subject": a[2], "sequence": a[3], "before": a[7]}
                )
        else:
            past_failed += 1
    rows = query(
        side,
        "SELECT d.status, d.attempt_count, e.sequence, e.created_at"
        " FROM webhook_deliveries AS d JOIN webhook_events AS e ON e.id = d.event_id"
        " WHERE e.subject_id = %s",
        [held],
    )
    held_published_before = [
        event_id
        for event_id, deal in side.subject_of.items()
        if deal == held and side.published[event_id] < fail_off
    ]
    held_ok = [a for a in ok if a[2] == held]
    expected_held = len(held_published_before) * side.endpoints_per_brand
    before_ok = [a for a in held_ok if a[1] in set(held_published_before)]
    catch_up = None
    if len(before_ok) >= expected_held:
        catch_up = round(max(a[5] for a in before_ok) - fail_off, 2)
    cpu = side.cpu_marks
    counted = statuses(side)
    return {
        "others_per_s": round(len(others_in_window) / window, 1),
        "offered_per_s": round(offered / window, 1),
        "others_latency_p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
        "others_latency_p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
        "out_of_order": out_of_order,
        "out_of_order_examples": examples,
        "past_a_failed_one": past_failed,
        "duplicates": sum(1 for a in ok if a[8]),
        "held_subject": {
            "events": len({r[2] for r in rows}),
            "deliveries": len(rows),
            "delivered": sum(1 for r in rows if r[0] == "delivered"),
            "failed": sum(1 for r in rows if r[0] == "failed"),
            "attempts": sum(r[1] for r in rows),
            "attempts_max": max((r[1] for r in rows), default=0),
            "answered_500": sum(1 for a in mine if a[2] == held and a[6] == 500),
            "out_of_order": sum(1 for a in held_ok if a[7]),
            "catch_up_seconds": catch_up,
        },
        "deliveries": counted,
        "worker_cpu_percent": round((cpu[1] - cpu[0]) / window * 100, 1) if len(cpu) > 1 else None,
        "publish_late_max_ms": round(max(side.lateness) * 1000, 1),
    }


def exhausted_variant(processes: Processes, side: Side, receiver: str) -> dict:
    """A deal's first event answered 500 for good, with a 3-attempt schedule: what becomes of
    the three behind it on an endpoint that orders by subject."""
    processes.stop(side.worker)
    side.worker = start_worker(processes, side, EXHAUST_SCHEDULE)
    _get(f"{receiver}/_reject?subject={EXHAUSTED_DEAL}&sequence=1")
    with side.app.app_context():
        from extensions import db

        publish_step(side, 0, 0, EXHAUSTED_DEAL)
        publish_step(side, 0, 1, EXHAUSTED_DEAL)
        db.session.remove()
    took = drain([side], 60)
    answers = [a for a in json.loads(_get(f"{receiver}/_log"))["answers"] if a[2] == EXHAUSTED_DEAL]
    rows = query(
        side,
        "SELECT e.sequence, d.status, d.attempt_count"
        " FROM webhook_deliveries AS d JOIN webhook_events AS e ON e.id = d.event_id"
        " WHERE e.subject_id = %s ORDER BY e.sequence",
        [EXHAUSTED_DEAL],
    )
    gaps, in_order = [], True
    for endpoint in {a[0] for a in answers}:
        here = sorted((a for a in answers if a[0] == endpoint), key=lambda a: a[5])
        last_failure = max(a[5] for a in here if a[6] == 500)
        after = [a for a in here if a[6] == 200]
        in_order &= [a[3] for a in after] == sorted(a[3] for a in after)
        in_order &= all(a[4] > last_failure for a in after)
        if after:
            gaps.append(min(a[4] for a in after) - last_failure)
    return {
        "schedule": EXHAUST_SCHEDULE,
        "first_event": sorted({(r[1], r[2]) for r in rows if r[0] == 1}),
        "behind_it": sorted({(r[0], r[1]) for r in rows if r[0] > 1}),
        "behind_sent_after_last_failure": in_order,
        "seconds_from_last_failure_to_next_max": round(max(gaps), 2) if gaps else None,
        "drained_seconds": round(took, 1),
    }


def run(workdir: Path, processes: Processes, args) -> dict:
    os.environ.setdefault("BRAND_TEST_BACKENDS", "services")
    from flask_migrate import upgrade

    from app import create_app
    from tests.backends import open_backends

    opened = []
    try:
        sides = []
        for ordering in ORDERINGS:
            backends = open_backends()
            opened.append(backends)
            env = app_settings(backends.database_url, backends.redis_url)
            app = create_app(env)
            with app.app_context():
                upgrade()
            child_env = child_environ(env)
            conninfo = backends.database_url.replace("postgresql+psycopg://", "postgresql://")
            sides.append(Side(ordering, app, child_env, conninfo))
        endpoint_concurrency = sides[0].app.extensions["settings"].webhook_endpoint_concurrency
        port = free_port()
        processes.start(
            "receiver",
            [sys.executable, "-m", "bench.ordering", "--receiver", str(port)],
            {**os.environ},
        )
        receiver = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                _get(f"{receiver}/_ping")
                break
            except OSError:
                time.sleep(0.1)
        for side in sides:
            register(side, receiver, args.brands, args.endpoints)
            side.worker = start_worker(processes, side, RETRY_SCHEDULE)

        # Every deal's first step in a shuffled order, then its second in the same order: each
        # step of every deal half the publishing time after its first.
        order = list(range(args.subjects))
        random.Random(37).shuffle(order)
        schedule = [(number, 0) for number in order] + [(number, 1) for number in order]
        interval = args.publish_seconds / len(schedule)
        # The held deal: the first whose first step comes 2 s into the failure (so its second
        # comes inside the failure too, with publish_seconds / 2 < failure - 2).
        held_place = int((args.warmup + 2) / interval)
        held = deal_id(schedule[held_place][0])
        per_event = args.endpoints // args.brands
        events_per_s = len(schedule) * 2 / args.publish_seconds
        log(
            f"{args.subjects} deals over {args.brands} brands of {per_event} endpoints "
            f"(answering after {RECEIVER_DELAY_SECONDS * 1000:.0f} ms, {endpoint_concurrency} "
            f"in flight each), {events_per_s:.0f} events/s for {args.publish_seconds:.0f} s, "
            f"{events_per_s * per_event:.0f} deliveries/s per ordering; {held} fails "
            f"from {args.warmup:.0f} s for {args.failure:.0f} s"
        )
        start = time.monotonic() + 1
        threads = [
            threading.Thread(target=publisher, args=(side, schedule, start, interval), daemon=True)
            for side in sides
        ]
        for thread in threads:
            thread.start()
        time.sleep(max(0.0, start + args.warmup - time.monotonic()))
        for side in sides:
            side.cpu_marks.append(cpu_seconds(side.worker.pid))
        _get(f"{receiver}/_fail?subject={held}")
        log(f"{held}: its receiver answers 500")
        time.sleep(max(0.0, start + args.warmup + args.failure - time.monotonic()))
        _get(f"{receiver}/_fail?subject=")
        for side in sides:
            side.cpu_marks.append(cpu_seconds(side.worker.pid))
        log(f"{held}: its receiver answers 200 again")
        for thread in threads:
            thread.join()
        for side in sides:
            if side.error is not None:
                raise RuntimeError(f"publishing ({side.ordering}) failed") from side.error
        log("published; waiting for every delivery to end")
        drain(sides, args.drain_cap)
        raw = _get(f"{receiver}/_log")
        (workdir / "answers.json").write_bytes(raw)  # every answer, kept with --logs
        received = json.loads(raw)
        (_, fail_on), (_, fail_off) = received["switched"][:2]
        result: dict = {
            "subjects": args.subjects,
            "endpoints": args.endpoints,
            "brands": args.brands,
            "receiver_delay_ms": int(RECEIVER_DELAY_SECONDS * 1000),
            "endpoint_concurrency": endpoint_concurrency,
            "retry_schedule": RETRY_SCHEDULE,
            "attempts_allowed": len(RETRY_SCHEDULE.split(",")) + 1,
            # What the schedule alone makes of a delivery failing throughout the minute.
            "schedule_attempts_in_failure": schedule_attempts(RETRY_SCHEDULE, fail_off - fail_on),
            "failure_seconds": round(fail_off - fail_on, 1),
            "events_per_s": round(events_per_s, 1),
        }
        for side in sides:
            result[side.ordering] = figures(side, received["answers"], held, fail_on, fail_off)
            log(f"{side.ordering}: {result[side.ordering]}")
        ordered, unordered = result["subject"], result["none"]
        result["throughput_ratio"] = round(ordered["others_per_s"] / unordered["others_per_s"], 3)
        log("a first event that fails for good (ordering subject, 3 attempts)")
        result["exhausted_first"] = exhausted_variant(processes, sides[0], receiver)
        log(f"exhausted: {result['exhausted_first']}")
        catch_up = ordered["held_subject"]["catch_up_seconds"]
        result["catch_up_target_s"] = CATCH_UP_TARGET_SECONDS
        result["targets_met"] = (
            result["throughput_ratio"] >= THROUGHPUT_TARGET
            and ordered["out_of_order"] == 0
            and catch_up is not None
            and catch_up <= CATCH_UP_TARGET_SECONDS
            and ordered["held_subject"]["out_of_order"] == 0
        )
        return result
    finally:
        processes.stop_all()
        for backends in opened:
            backends.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--receiver", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 100 deals, 20 s")
    parser.add_argument("--subjects", type=int, default=1000)
    parser.add_argument("--endpoints", type=int, default=20)
    parser.add_argument("--brands", type=int, default=10)
    parser.add_argument("--publish-seconds", type=float, default=100.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--failure", type=float, default=60.0)
    parser.add_argument("--drain-cap", type=float, default=120.0)
    parser.add_argument("--logs", help="keep the processes' logs in this directory")
    args = parser.parse_args()
    if args.receiver:
        serve_receiver(args.receiver)
        return
    if args.quick:
        args.subjects, args.publish_seconds, args.warmup, args.failure = 100, 20.0, 3.0, 15.0
    if args.publish_seconds / 2 + 2 >= args.failure:
        parser.error(
            "the held deal's second step must come inside the failure: "
            "--publish-seconds / 2 + 2 < --failure"
        )
    run_benchmark("ordering-", lambda workdir, processes: run(workdir, processes, args), args.logs)


if __name__ == "__main__":
    main()
