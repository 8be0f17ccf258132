"""What 200 long-polling clients cost one `make run`: threads, database connections, memory and
CPU of its gunicorn workers while the clients wait, how fast all of them are answered when an
event is published, and whether the rest of the API still answers meanwhile.

    .venv/bin/python -m bench.long_poll [--clients 200] [--gunicorn "--threads 4"]

It starts `scripts/run.py` (what `make run` runs: migrations, the demo brand, gunicorn with
gunicorn.conf.py's settings, one delivery worker) on a scratch database and Redis db of the
machine's servers (tests.backends), with `GUNICORN_CMD_ARGS` set from `--gunicorn` when given
(to compare worker classes; command-line settings win over gunicorn.conf.py). Then:

1. idle: the workers' threads, RSS, CPU and database connections with no client;
2. waiting: `--clients` clients each hold `GET /event/fetch-events?after=<newest>&wait=30`
   open (one connection each, aiohttp); after they have all sent it, the same figures over
   `--settle` seconds, and 20 sequential `GET /workspace` requests timed meanwhile;
3. publish: one event is published (its commit timed here); each client's answer is timed from
   that commit. Every client must get that event.

Resource counts are what this measures; the latencies are the machine's of the moment (the
machine is shared: see docs/benchmarks.md). One JSON line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import aiohttp
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    BENCH_ENCRYPTION_KEY,
    ROOT,
    Processes,
    free_port,
    log,
    percentile,
    run_benchmark,
)

WAIT_SECONDS = 30
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--settle", type=float, default=10.0)
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
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(workdir)),
        "APP_ENV": "development",
        "DATABASE_URL": backends.database_url,
        "REDIS_URL": backends.redis_url,
        "SECRET_KEY": "bench",
        "ENCRYPTION_KEY": BENCH_ENCRYPTION_KEY,
        "PORT": str(port),
        "RUN_STATE_DIR": str(workdir / "run-state"),
        "RATE_LIMIT_PER_KEY": "999999999/hour",
        "PYTHONUNBUFFERED": "1",
    }
    if arguments.gunicorn:
        env["GUNICORN_CMD_ARGS"] = arguments.gunicorn
    supervisor = processes.start("make-run", [sys.executable, "scripts/run.py"], env)
    base = f"http://127.0.0.1:{port}"
    _wait_until_serving(base, supervisor, processes)
    workers = _gunicorn_workers(supervisor.pid)
    log(f"make run serving on {base}; gunicorn workers {workers}")

    app = _app(backends)
    brand_id, api_key, newest = _brand_key_and_newest_event(app)
    dsn = backends.database_url.replace("postgresql+psycopg://", "postgresql://")
    database = dsn.rsplit("/", 1)[1].split("?")[0]

    idle = _sample(workers, dsn, database, arguments.settle)
    log(f"idle: {idle}")
    result = asyncio.run(
        _with_clients(arguments, base, brand_id, api_key, newest, app, workers, dsn, database)
    )
    return {
        "clients": arguments.clients,
        "gunicorn": arguments.gunicorn or "gunicorn.conf.py",
        "workers": len(workers),
        "idle": idle,
        **result,
    }


async def _with_clients(arguments, base, brand_id, api_key, newest, app, workers, dsn, database):
    url = f"{base}/api/v1/brand/{brand_id}/event/fetch-events"
    headers = {"X-Api-Key": api_key}
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=WAIT_SECONDS + 30)
    answered: dict[int, float] = {}
    sent = 0

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client(number: int) -> None:
            nonlocal sent
            params = {"after": newest, "wait": str(WAIT_SECONDS)}
            sent += 1
            async with session.get(url, params=params, headers=headers) as response:
                body = await response.json()
            answered[number] = time.monotonic()
            assert response.status == 200, body
            assert body["data"]["events"], f"client {number} got no event: {body}"

        tasks = [asyncio.create_task(client(n)) for n in range(arguments.clients)]
        while sent < arguments.clients:
            await asyncio.sleep(0.05)
        await asyncio.sleep(2)  # every request reached the server and is waiting
        assert not answered, f"{len(answered)} clients were answered before any event"
        waiting = await asyncio.to_thread(_sample, workers, dsn, database, arguments.settle)
        log(f"{arguments.clients} waiting: {waiting}")
        other = await _other_requests(session, base, brand_id, headers)
        log(f"GET /workspace meanwhile: {other}")

        sampler = _ConnectionSampler(dsn, database, workers)
        sampling = asyncio.create_task(asyncio.to_thread(sampler.run))
        published_at = await asyncio.to_thread(_publish, app, brand_id)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=WAIT_SECONDS + 30)
        sampler.stop = True
        await sampling
        latencies = [(answered[n] - published_at) * 1000 for n in range(arguments.clients)]
    fan_out = {
        "answered": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "max_ms": round(max(latencies), 1),
        "peak_db_connections_in_use": sampler.peak,
    }
    log(f"publish -> every client answered: {fan_out}")
    return {"waiting": waiting, "other_requests_while_waiting": other, "fan_out": fan_out}


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
    from extensions import db
    from services.events import publish_event

    with app.app_context():
        publish_event(brand_id=brand_id, name="deal.completed", data={"bench": "long-poll"})
        db.session.commit()
        return time.monotonic()


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


def _wait_until_serving(base: str, supervisor, processes: Processes) -> None:
    import urllib.request

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if supervisor.poll() is not None:
            raise RuntimeError("make run exited:\n" + processes.log_of(supervisor))
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:  # noqa: S310
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise RuntimeError("make run did not serve:\n" + processes.log_of(supervisor))


def _app(backends):
    from app import create_app

    return create_app(
        {
            "APP_ENV": "development",
            "DATABASE_URL": backends.database_url,
            "REDIS_URL": backends.redis_url,
            "SECRET_KEY": "bench",
            "ENCRYPTION_KEY": BENCH_ENCRYPTION_KEY,
        }
    )


def _brand_key_and_newest_event(app) -> tuple[str, str, str]:
    """The demo brand `make run` seeded, a read key of it, and a fresh event to wait after."""
    from extensions import db
    from fixtures.demo_simulation import demo_brand
    from services.api_keys import create_api_key
    from services.events import publish_event

    with app.app_context():
        brand_id = demo_brand().id
        key = create_api_key(brand_id=brand_id, name="bench", scopes=("read",), created_by="bench")
        newest = publish_event(brand_id=brand_id, name="deal.completed", data={"bench": 0})
        db.session.commit()
        return brand_id, key.secret, newest.event.id


if __name__ == "__main__":
    os.chdir(ROOT)
    main()
