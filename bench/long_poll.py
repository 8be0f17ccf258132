"""What long-polling clients cost one `make run`, and whether everyone else is still served:
threads, database connections, memory and CPU of its gunicorn workers while clients wait, how
fast all of them are answered when an event is published, and other keys' calls while 0, 500,
1,000 and 5,000 long-polls try to wait (issue 36: 1,000 from one key stalled every other call).

    .venv/bin/python -m bench.long_poll [--clients 200] [--levels 0,500,1000,5000]
        [--waiter-keys 100] [--gunicorn "--threads 4"]

It starts `scripts/run.py` (what `make run` runs: migrations, the demo brand, gunicorn with
gunicorn.conf.py's settings, one delivery worker) on a scratch database and Redis db of the
machine's servers (tests.backends), with `GUNICORN_CMD_ARGS` set from `--gunicorn` when given
(to compare worker classes; command-line settings win over gunicorn.conf.py). The demo brand
gets `--waiter-keys` read keys for the long-polls; a second brand gets the keys whose calls are
timed. Then:

1. idle: the workers' threads, RSS, CPU and database connections with no client;
2. waiting: `--clients` clients (spread over the waiter keys) each send
   `GET /event/fetch-events?after=<newest>&wait=30` (one connection each, aiohttp); after they
   have all sent it, the same figures over `--settle` seconds, and 20 sequential
   `GET /workspace` requests timed meanwhile. A client past a cap of the server's (429) is
   counted as refused;
3. publish: one event is published (its commit timed here); each waiting client's answer is
   timed from that commit. Every one of them must get that event;
4. levels: for each of `--levels`, that many long-poll clients over the waiter keys, started
   evenly over 30 s (the wait) and then kept at it as a client following the brand would: an
   answer is followed by the next request at once, a 429 by one after its `Retry-After`. 60 s
   after all have started (every refused client has come back at least once),
   `--probe-rate` `GET /api-key/fetch-keys` a second from the other brand's keys, sent from a
   process of their own on a fixed schedule for `--measure` seconds, each
   timed from its send (a call unanswered in 45 s counts as that long), and beside each the
   same GET to a bare asyncio server in a process of its own: the floor, what the machine gives
   the simplest answer at that moment (the machine is shared). Then an event is published and
   every client still waiting must get it. Target: the probes' p99 under 100 ms at every level.

Resource counts are what this measures; the latencies are the machine's of the moment (the
machine is shared: see docs/benchmarks.md). One JSON line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    HttpRequests,
    Processes,
    app_settings,
    free_port,
    log,
    percentile,
    run_benchmark,
    start_make_run,
)

WAIT_SECONDS = 30
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# How long a timed call may take before it counts as unanswered (the client gave up at
# 45 s), and the p99 every level must stay under.
PROBE_TIMEOUT_SECONDS = 45
TARGET_P99_MS = 100
PROBE_KEYS = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument(
        "--levels",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[0, 500, 1000, 5000],
        help="long-poll clients at each level, comma-separated",
    )
    parser.add_argument("--waiter-keys", type=int, default=100, help="keys the clients use")
    parser.add_argument("--probe-rate", type=float, default=40.0, help="timed calls a second")
    parser.add_argument("--measure", type=float, default=15.0, help="seconds of timed calls")
    parser.add_argument("--gunicorn", default="", help="GUNICORN_CMD_ARGS for this run")
    parser.add_argument("--logs", default=None, help="keep the processes' logs in this directory")
    arguments = parser.parse_args()
    run_benchmark(
        "long-poll-",
        lambda workdir, processes: measure(arguments, workdir, processes),
        arguments.logs,
    )


def measure(arguments, workdir: Path, processes: Processes) -> dict:
    from tests.backends import open_backends

    backends = open_backends()
    try:
        return _measure(arguments, workdir, processes, backends)
    finally:
        processes.stop_all()
        backends.close()


def _measure(arguments, workdir, processes, backends) -> dict:
    base, supervisor = start_make_run(
        workdir,
        processes,
        backends.database_url,
        backends.redis_url,
        {"GUNICORN_CMD_ARGS": arguments.gunicorn} if arguments.gunicorn else None,
    )
    workers = _gunicorn_workers(supervisor.pid)
    log(f"make run serving on {base}; gunicorn workers {workers}")

    app = _app(backends)
    brand_id, keys, newest = _brand_keys_and_newest_event(app, arguments.waiter_keys)
    probe_brand_id, probe_keys = _other_brand_and_keys(app)
    dsn = backends.database_url.replace("postgresql+psycopg://", "postgresql://")
    database = dsn.rsplit("/", 1)[1].split("?")[0]

    idle = _sample(workers, dsn, database, arguments.settle)
    log(f"idle: {idle}")
    result = asyncio.run(
        _with_clients(arguments, base, brand_id, keys, newest, app, workers, dsn, database)
    )
    levels = []
    spawn = multiprocessing.get_context("spawn")
    floor_port = free_port()
    floor = spawn.Process(target=_serve_floor, args=(floor_port,), daemon=True)
    floor.start()
    target = _Target(
        base, brand_id, keys, probe_brand_id, probe_keys, f"http://127.0.0.1:{floor_port}/"
    )
    try:
        with ProcessPoolExecutor(1, mp_context=spawn) as prober:
            prober.submit(int).result()  # started now, not inside a measurement
            for waiters in arguments.levels:
                level = asyncio.run(_level(arguments, waiters, target, app, workers, prober))
                log(f"{waiters} long-polls: {level}")
                levels.append(level)
    finally:
        floor.terminate()
        floor.join(5)
    by_level = {str(level["long_polls"]): level["fetch_keys"]["p99_ms"] for level in levels}
    return {
        "fetch_keys_p99_ms_by_long_polls": by_level,
        "floor_p99_ms_by_long_polls": {
            str(level["long_polls"]): level["fetch_keys"]["floor_p99_ms"] for level in levels
        },
        "target_p99_ms": TARGET_P99_MS,
        "target_met": all(p99 < TARGET_P99_MS for p99 in by_level.values()),
        "clients": arguments.clients,
        "gunicorn": arguments.gunicorn or "gunicorn.conf.py",
        "workers": len(workers),
        "idle": idle,
        **result,
        "levels": levels,
    }


async def _with_clients(arguments, base, brand_id, keys, newest, app, workers, dsn, database):
    url = f"{base}/api/v1/brand/{brand_id}/event/fetch-events"
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=WAIT_SECONDS + 30)
    answered: dict[int, float] = {}
    refused: set[int] = set()
    sent = 0

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client(number: int) -> None:
            nonlocal sent
            params = {"after": newest, "wait": str(WAIT_SECONDS)}
            headers = {"X-Api-Key": keys[number % len(keys)]}
            sent += 1
            async with session.get(url, params=params, headers=headers) as response:
                body = await response.json()
            if response.status == 429:  # past a cap of the worker it reached
                refused.add(number)
                return
            answered[number] = time.monotonic()
            assert response.status == 200, body
            assert body["data"]["events"], f"client {number} got no event: {body}"

        tasks = [asyncio.create_task(client(n)) for n in range(arguments.clients)]
        while sent < arguments.clients:
            await asyncio.sleep(0.05)
        await asyncio.sleep(2)  # every request reached the server and is waiting
        assert not answered, f"{len(answered)} clients were answered before any event"
        waiting = await asyncio.to_thread(_sample, workers, dsn, database, arguments.settle)
        log(f"{arguments.clients - len(refused)} waiting, {len(refused)} refused: {waiting}")
        other = await _other_requests(session, base, brand_id, {"X-Api-Key": keys[0]})
        log(f"GET /workspace meanwhile: {other}")

        sampler = _ConnectionSampler(dsn, database, workers)
        sampling = asyncio.create_task(asyncio.to_thread(sampler.run))
        published_at = await asyncio.to_thread(_publish, app, brand_id)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=WAIT_SECONDS + 30)
        sampler.stop = True
        await sampling
        latencies = [(at - published_at) * 1000 for at in answered.values()]
    fan_out = {
        "refused": len(refused),
        "answered": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "max_ms": round(max(latencies), 1),
        "peak_db_connections_in_use": sampler.peak,
    }
    log(f"publish -> every client answered: {fan_out}")
    return {"waiting": waiting, "other_requests_while_waiting": other, "fan_out": fan_out}


@dataclass(frozen=True)
class _Target:
    base: str
    brand_id: str
    keys: list[str]
    probe_brand_id: str
    probe_keys: list[str]
    floor_url: str


async def _level(
    arguments, long_polls: int, target: _Target, app, workers, prober: ProcessPoolExecutor
) -> dict:
    """`long_polls` clients following the brand (see the module's doc, 4.), and the other
    brand's fetch-keys timed meanwhile."""
    url = f"{target.base}/api/v1/brand/{target.brand_id}/event/fetch-events"
    counts: Counter[str] = Counter()
    sent_at: dict[int, float] = {}  # a client's request in flight, and since when
    got_event: dict[str, int] = Counter()
    # Answers sent before the publish, answered after it, empty although their wait had not
    # run out: a waiting client the event did not reach.
    missed: list[float] = []
    published_at = float("inf")
    stopping = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=WAIT_SECONDS + 30)

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        newest = await asyncio.to_thread(_newest_event_id, app, target.brand_id)

        async def client(number: int, start_after: float) -> None:
            await asyncio.sleep(start_after)
            headers = {"X-Api-Key": target.keys[number % len(target.keys)]}
            after = newest
            while not stopping.is_set():
                sent = sent_at[number] = time.monotonic()
                try:
                    async with session.get(
                        url, params={"after": after, "wait": str(WAIT_SECONDS)}, headers=headers
                    ) as response:
                        body = await response.json()
                except (aiohttp.ClientError, TimeoutError) as error:
                    counts[f"error {type(error).__name__}"] += 1
                    await asyncio.sleep(1)
                    continue
                finally:
                    sent_at.pop(number, None)
                if response.status == 200:
                    counts["answered"] += 1
                    for event in body["data"]["events"]:
                        got_event[event["id"]] += 1
                    after = body["meta"]["nextAfter"]
                    held = time.monotonic() - sent
                    if sent < published_at and not body["data"]["events"] and held < WAIT_SECONDS:
                        missed.append(held)
                elif response.status == 429:
                    counts["refused"] += 1
                    await _sleep_unless(stopping, int(response.headers["Retry-After"]))
                else:
                    counts[f"status {response.status}"] += 1
                    await asyncio.sleep(1)

        # Started evenly over one wait, then measured once every refused client has come back
        # at least once (Retry-After is at most twice the wait): the steady rate of first tries
        # and retries, not the quiet before the first retries.
        ramp = WAIT_SECONDS if long_polls else 0
        tasks = [asyncio.create_task(client(n, ramp * n / long_polls)) for n in range(long_polls)]
        await asyncio.sleep(ramp + 2 * WAIT_SECONDS if long_polls else 3)
        before = Counter(counts)
        cpu_before = {pid: _cpu_seconds(pid) for pid in workers}
        probes = await asyncio.get_running_loop().run_in_executor(
            prober, _probe_in_process, arguments.probe_rate, arguments.measure, target
        )
        cpu = [
            round((_cpu_seconds(pid) - cpu_before[pid]) / arguments.measure * 100, 1)
            for pid in workers
        ]
        threads = [_status(pid, "Threads") for pid in workers]
        during = {name: counts[name] - before[name] for name in counts}

        # No client asks again from here on: each waiting one must get this event.
        stopping.set()
        in_flight = len(sent_at)
        event_id = await asyncio.to_thread(_publish_event, app, target.brand_id)
        published_at = time.monotonic()
        deadline = published_at + 15
        while sent_at and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    statuses = {name: count for name, count in counts.items() if name.startswith("status")}
    assert not statuses, f"long-poll clients were answered {statuses}"
    assert not missed, f"{len(missed)} waiting clients were answered without the event"
    await asyncio.sleep(3)  # the clients' connections closed, the workers idle again
    return {
        "long_polls": long_polls,
        "in_flight_at_publish": in_flight,
        "woken_by_publish": got_event[event_id],
        "answered_per_s": round(during.get("answered", 0) / arguments.measure, 1),
        "refused_per_s": round(during.get("refused", 0) / arguments.measure, 1),
        "client_errors": {n: c for n, c in counts.items() if n.startswith("error")},
        "threads": threads,
        "cpu_percent": cpu,
        "fetch_keys": probes,
    }


async def _sleep_unless(stopping: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)


def _probe_in_process(rate: float, seconds: float, target: _Target) -> dict:
    """`_probe`, run in a process of its own (spawned before any load): the thousands of
    long-poll clients of this one cannot delay its timer or its reading of an answer."""
    return asyncio.run(_probe(rate, seconds, target))


async def _probe(rate: float, seconds: float, target: _Target) -> dict:
    """`rate` fetch-keys a second, round the other brand's keys, for `seconds`: each sent when
    it is due whatever the others are doing (an open loop), and timed from then. A kept-alive
    connection the server closed as the call went out is retried once, as HTTP clients do, and
    the call timed from its first send. Beside each, the same GET to the floor server: what
    this machine gives the simplest answer at that moment."""
    url = f"{target.base}/api/v1/brand/{target.probe_brand_id}/api-key/fetch-keys"
    latencies: dict[str, list[float]] = {url: [], target.floor_url: []}
    failures: Counter[str] = Counter()
    lag = 0.0
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def call(url: str, key: str) -> None:
            started = time.monotonic()
            for attempt in (1, 2):
                try:
                    async with session.get(
                        url, headers={"X-Api-Key": key}, timeout=timeout
                    ) as reply:
                        await reply.read()
                        assert reply.status == 200, reply.status
                    break
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as error:
                    failures[f"retried {type(error).__name__}"] += 1
                    if attempt == 2:
                        latencies[url].append(PROBE_TIMEOUT_SECONDS * 1000)
                        return
                except (aiohttp.ClientError, TimeoutError) as error:
                    failures[type(error).__name__] += 1
                    latencies[url].append(PROBE_TIMEOUT_SECONDS * 1000)
                    return
            latencies[url].append((time.monotonic() - started) * 1000)

        calls = []
        count = int(seconds * rate)
        start = time.monotonic()
        for number in range(count):
            due = start + number / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            lag = max(lag, time.monotonic() - due)
            key = target.probe_keys[number % PROBE_KEYS]
            calls.append(asyncio.create_task(call(url, key)))
            calls.append(asyncio.create_task(call(target.floor_url, key)))
        await asyncio.gather(*calls)
    timed, floor = latencies[url], latencies[target.floor_url]
    return {
        "calls": count,
        "failures": dict(failures),
        "p50_ms": round(percentile(timed, 50), 1),
        "p99_ms": round(percentile(timed, 99), 1),
        "max_ms": round(max(timed), 1),
        "floor_p50_ms": round(percentile(floor, 50), 1),
        "floor_p99_ms": round(percentile(floor, 99), 1),
        "client_lag_ms": round(lag * 1000, 1),
    }


class _FloorServer(HttpRequests):
    """Answers every request at once with `{}`: no framework, no database."""

    def handle(self, method: bytes, target: str, headers: dict[bytes, bytes]) -> None:
        assert self.transport is not None
        self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")


def _serve_floor(port: int) -> None:
    """The floor server, in a process of its own (so it is scheduled as a server is)."""

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(_FloorServer, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(serve())


def _newest_event_id(app, brand_id: str) -> str:
    from sqlalchemy import select

    from extensions import db
    from models import WebhookEvent

    with app.app_context():
        newest = db.session.scalar(
            select(WebhookEvent.id)
            .where(WebhookEvent.brand_id == brand_id)
            .order_by(WebhookEvent.xact_id.desc(), WebhookEvent.position.desc())
            .limit(1)
        )
        db.session.rollback()
        return newest


async def _other_requests(session, base, brand_id, headers) -> dict:
    durations = []
    for _ in range(20):
        started = time.monotonic()
        try:
            async with session.get(
                f"{base}/api/v1/brand/{brand_id}/workspace",
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=5),
            ) as response:
                await response.read()
                ok = response.status == 200
        except TimeoutError:
            ok = False
        durations.append((time.monotonic() - started) * 1000 if ok else float("inf"))
    answered = [d for d in durations if d != float("inf")]
    return {
        "answered_within_5s": len(answered),
        "of": len(durations),
        "p50_ms": round(percentile(answered, 50), 1) if answered else None,
        "max_ms": round(max(answered), 1) if answered else None,
    }


def _publish(app, brand_id: str) -> float:
    _publish_event(app, brand_id)
    return time.monotonic()


def _publish_event(app, brand_id: str) -> str:
    from extensions import db
    from services.events import publish_event

    with app.app_context():
        published = publish_event(
            brand_id=brand_id, name="deal.completed", data={"bench": "long-poll"}
        )
        db.session.commit()
        return published.event.id


class _ConnectionSampler:
    """The most database connections the workers held at once, sampled every 10 ms."""

    def __init__(self, dsn: str, database: str, workers: list[int]) -> None:
        self.dsn, self.database, self.workers = dsn, database, workers
        self.peak = 0
        self.stop = False

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as connection:
            while not self.stop:
                counts = _connections(connection, self.database, self.workers)
                self.peak = max(self.peak, counts["in_use"])
                time.sleep(0.01)


def _sample(workers: list[int], dsn: str, database: str, seconds: float) -> dict:
    """Threads, RSS (MiB) and CPU (% of one core) of each worker over `seconds`, and the
    database connections they hold (the wake-up listener's included)."""
    before = {pid: _cpu_seconds(pid) for pid in workers}
    time.sleep(seconds)
    after = {pid: _cpu_seconds(pid) for pid in workers}
    with psycopg.connect(dsn, autocommit=True) as connection:
        connections = _connections(connection, database, workers)
    return {
        "threads": [_status(pid, "Threads") for pid in workers],
        "rss_mib": [round(_status(pid, "VmRSS") / 1024, 1) for pid in workers],
        "cpu_percent": [round((after[p] - before[p]) / seconds * 100, 2) for p in workers],
        "db_connections": connections,
    }


def _connections(connection, database: str, workers: list[int]) -> dict:
    """The workers' connections: `in_use` by a request (in a transaction or running a
    statement), `pooled` (idle in a pool, held by no request) and `listeners` (LISTEN)."""
    names = [f"brand-api pid={pid}" for pid in workers]
    rows = connection.execute(
        "SELECT application_name LIKE '%%listener' AS listener, state = 'idle' AS idle, count(*)"
        " FROM pg_stat_activity WHERE datname = %s AND application_name = ANY(%s)"
        " GROUP BY 1, 2",
        (database, names + [f"{name} listener" for name in names]),
    ).fetchall()
    counts = {"in_use": 0, "pooled": 0, "listeners": 0}
    for listener, idle, count in rows:
        kind = "listeners" if listener else "pooled" if idle else "in_use"
        counts[kind] += count
    return counts


def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _gunicorn_workers(supervisor_pid: int) -> list[int]:
    for child in _children(supervisor_pid):
        command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        if b"gunicorn" in command:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                workers = _children(child)
                if len(workers) >= 2:
                    return sorted(workers)
                time.sleep(0.2)
    raise RuntimeError("no gunicorn workers found under make run")


def _app(backends):
    from app import create_app

    return create_app(app_settings(backends.database_url, backends.redis_url, "development"))


def _brand_keys_and_newest_event(app, count: int) -> tuple[str, list[str], str]:
    """The demo brand `make run` seeded, `count` read keys of it, and a fresh event to wait
    after."""
    from extensions import db
    from fixtures.demo_simulation import demo_brand
    from services.api_keys import create_api_key
    from services.events import publish_event

    with app.app_context():
        brand_id = demo_brand().id
        keys = [
            create_api_key(
                brand_id=brand_id, name=f"bench {n}", scopes=("read",), created_by="bench"
            ).secret
            for n in range(count)
        ]
        newest = publish_event(brand_id=brand_id, name="deal.completed", data={"bench": 0})
        db.session.commit()
        return brand_id, keys, newest.event.id


def _other_brand_and_keys(app) -> tuple[str, list[str]]:
    """A second brand, whose read keys make the timed calls: another tenant of the server."""
    from extensions import db
    from services.api_keys import create_api_key
    from services.brands import create_brand

    with app.app_context():
        brand_id = create_brand(name="Neighbour").id
        keys = [
            create_api_key(
                brand_id=brand_id, name=f"probe {n}", scopes=("read",), created_by="bench"
            ).secret
            for n in range(PROBE_KEYS)
        ]
        db.session.commit()
        return brand_id, keys


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
