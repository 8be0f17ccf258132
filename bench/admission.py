"""The front door under attack (issue 42): another brand's fetch-keys and record-postback
latency while each attack runs, against no attack as the baseline.

Attacks (each for `--seconds`, 30 by default): slow bodies (16 and 256 connections, without a key
and with a valid one), 256 slow-header connections, 10,000 idle keep-alive connections, bad keys
at 200 and 600 requests/s naming brand B or random brand ids, 5,000 long-polls, and one brand
holding 10 waits on each of 30 keys (brand B's own long-poll must then be served, not refused).

Three ways to run it:
- by default it starts `make run` (scripts/run.py: gunicorn, 2 workers) on databases of its own
  and attacks gunicorn directly;
- `--through-nginx` starts deploy/'s stack itself, as tests/test_deploy_stack.py does (both use
  tests/deploy_stack.py) and docs/deployment.md describes it: PgBouncer from
  deploy/pgbouncer.ini in transaction mode in front of its database, two gunicorn servers of one
  worker each (gunicorn.conf.py's threads, so two worker processes as `make run` has) with
  PROXY_HOPS=1 and DATABASE_POOLER=pgbouncer (DATABASE_DIRECT_URL for the listeners), and nginx
  from deploy/nginx.conf in front of both; it attacks nginx;
- `--base-url` attacks a server someone else started and creates its brands through
  `--database-url`, the database that server uses.

Every client has a loopback address of its own (127.0.0.0/8 is all the loopback's): brand B's
calls (and the quiet brand's long-poll) come from 127.0.0.2, and each attack from an address of
its own, 127.0.0.3 onwards. nginx limits per client address (deploy/nginx.conf) and the app
counts failed authentications per address (CONTRACT 13.7): from one address, every client would
share one count and one limit, as no deployment's clients do. So the bench measures what a real
deployment sees: the attacker's address limited, brand B's not.

Targets: brand B's p99 < 100 ms. Directly against gunicorn, under the slow bodies, the bad keys
and the long-polls; slow headers and idle connections are reported only there (a proxy's job).
Through nginx, under every attack.

    flock /tmp/brand-bench.lock .venv/bin/python bench/admission.py [--seconds 30] [--through-nginx]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import random
import resource
import secrets
import subprocess
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    Processes,
    app_settings,
    log,
    percentile,
    run_benchmark,
    start_gunicorn,
    start_make_run,
)

TARGET_P99_MS = 100.0
PROBE_RATE = 20.0  # each of fetch-keys and record-postback, a second
PROBE_TIMEOUT_SECONDS = 20.0
LINK_CODE = "ADMIT42"
ATTACKER_KEYS = 30
# Brand B's client; each attack's client is FIRST_ATTACKER_ADDRESS plus the attack's number.
VICTIM_ADDRESS = "127.0.0.2"
FIRST_ATTACKER_ADDRESS = (127, 0, 0, 3)
API_SERVERS = 2  # --through-nginx: gunicorn servers behind nginx, one worker each
NGINX_REFUSAL = b"Too many requests from this address; retry after"
# Attacks with a target directly against gunicorn; the others are reported only.
TARGETED = (
    "slow_body_16",
    "slow_body_256",
    "slow_body_auth_16",
    "slow_body_auth_256",
    "bad_keys_brand_b_200",
    "bad_keys_brand_b_600",
    "bad_keys_random_200",
    "bad_keys_random_600",
    "long_polls_5000",
    "one_brand_30_keys",
)
REPORTED = ("slow_headers_256", "idle_10000")
ATTACKS = ("none", *TARGETED, *REPORTED)


@dataclass(frozen=True)
class Setup:
    base: str
    victim_address: str
    attacker: str
    attacker_keys: list[str]
    attacker_event: str
    victim: str
    victim_key: str
    victim_event: str
    # A brand of the victim's that publishes nothing while it is measured: its long-poll waits.
    quiet: str
    quiet_key: str
    quiet_event: str


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="each attack's duration")
    parser.add_argument("--attacks", nargs="*", default=list(ATTACKS), choices=ATTACKS)
    parser.add_argument(
        "--through-nginx", action="store_true", help="start deploy/'s stack and attack its nginx"
    )
    parser.add_argument("--base-url", default=None, help="attack this server (e.g. nginx)")
    parser.add_argument("--database-url", default=None, help="with --base-url: its database")
    parser.add_argument("--redis-url", default=None, help="with --base-url: its Redis")
    parser.add_argument("--logs", default=None, help="keep the processes' logs in this directory")
    arguments = parser.parse_args()
    if arguments.base_url and not arguments.database_url:
        parser.error("--base-url needs --database-url (the brands are made there)")
    if arguments.base_url and arguments.through_nginx:
        parser.error("--through-nginx starts its own server: no --base-url")
    _raise_open_files_limit()
    run_benchmark(
        "admission-",
        lambda workdir, processes: measure(arguments, workdir, processes),
        arguments.logs,
    )


def _raise_open_files_limit() -> None:
    """10,000 idle connections need as many descriptors (and so does the server's side)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def measure(arguments, workdir: Path, processes: Processes) -> dict:
    from tests.backends import open_backends

    backends = None
    if arguments.base_url:
        base, database_url = arguments.base_url.rstrip("/"), arguments.database_url
        redis_url = arguments.redis_url or "redis://127.0.0.1:6379/0"
    else:
        backends = open_backends()
        database_url, redis_url = backends.database_url, backends.redis_url
    started = {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "load": os.getloadavg(),
        "commit": _commit(),  # at the start: what ran, whatever is committed meanwhile
    }
    # Entered before the try: its servers (PgBouncer, nginx) stop after the processes in front
    # of or behind them (gunicorn), which the finally stops.
    with contextlib.ExitStack() as stack:
        try:
            if arguments.through_nginx:
                base = _start_deploy_stack(workdir, processes, stack, database_url, redis_url)
            elif not arguments.base_url:
                base, _ = start_make_run(workdir, processes, database_url, redis_url)
            setup = _setup(base, database_url, redis_url)
            log(f"attacking {base}: attacker {setup.attacker}, victim {setup.victim}")
            results = {}
            spawn = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(1, mp_context=spawn) as prober:
                prober.submit(int).result()  # started now, not inside a measurement
                for attack in arguments.attacks:
                    results[attack] = asyncio.run(
                        _run_attack(attack, arguments.seconds, setup, prober)
                    )
                    log(f"{attack}: {results[attack]}")
                    time.sleep(3)  # let the server close what the attack left
        finally:
            processes.stop_all()
    if backends is not None:
        backends.close()
    # Through nginx every attack has the target; directly, slow headers and idle connections
    # are a proxy's job.
    targeted = ATTACKS[1:] if arguments.through_nginx else TARGETED
    met = {
        attack: results[attack]["victim_p99_ms"] < TARGET_P99_MS
        and results[attack].get("victim_long_poll", {}).get("refused", 0) == 0
        for attack in targeted
        if attack in results
    }
    if arguments.through_nginx:
        mode = f"deploy/ stack: nginx, {API_SERVERS} gunicorn servers of 1 worker, PgBouncer"
    else:
        mode = "given URL" if arguments.base_url else "make run (gunicorn directly)"
    return {
        "base_url": base,
        "mode": mode,
        "started": started,
        "finished": {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "load": os.getloadavg(),
        },
        "seconds": arguments.seconds,
        "probe_rate_per_s": PROBE_RATE,
        "target_p99_ms": TARGET_P99_MS,
        "target_met": met,
        "results": results,
    }


def _start_deploy_stack(
    workdir: Path, processes: Processes, stack: contextlib.ExitStack, database_url, redis_url
) -> str:
    """deploy/'s stack on this machine (docs/deployment.md), as tests/test_deploy_stack.py
    starts it: PgBouncer in front of the database, gunicorn servers behind nginx. Returns
    nginx's URL."""
    from flask_migrate import upgrade

    from app import create_app
    from scripts.run import gunicorn_control_socket_args
    from tests.deploy_stack import binary, nginx_in_front_of, pgbouncer_in_front_of

    nginx, pgbouncer = binary("nginx"), binary("pgbouncer")
    if not nginx or not pgbouncer:
        raise SystemExit("--through-nginx needs Debian's nginx and pgbouncer (apt-get install)")
    direct = app_settings(database_url, redis_url, "development")
    migrating = create_app(direct)  # as `make run` does first (`flask db upgrade`)
    with migrating.app_context():
        upgrade()
        from extensions import db

        db.engine.dispose()
    pooled = stack.enter_context(pgbouncer_in_front_of(database_url, pgbouncer, workdir / "pgb"))
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", str(workdir)),
        **app_settings(pooled, redis_url, "development"),
        "DATABASE_POOLER": "pgbouncer",
        "DATABASE_DIRECT_URL": database_url,
        "PROXY_HOPS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    options = [
        *("--workers", "1", "--graceful-timeout", "5"),
        *("--config", str(ROOT / "gunicorn.conf.py"), *gunicorn_control_socket_args()),
    ]
    servers = [
        start_gunicorn(processes, f"gunicorn-{n}", "app:create_app()", env, options)[0]
        for n in range(API_SERVERS)
    ]
    return stack.enter_context(nginx_in_front_of(servers, nginx, workdir / "nginx"))


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def _attacker_address(attack: str) -> str:
    """The attack's own client address: no two attacks share a count or a limit."""
    *network, last = FIRST_ATTACKER_ADDRESS
    return ".".join(map(str, (*network, last + ATTACKS.index(attack))))


def _setup(base: str, database_url: str, redis_url: str) -> Setup:
    """Brand A (the attacker, 30 keys) and brand B (the victim, a key and a link to record
    postbacks on), and an event of each to long-poll after."""
    from app import create_app
    from extensions import db
    from services.api_keys import create_api_key
    from services.brands import create_brand
    from services.events import publish_event
    from tests.platform_factory import PlatformFactory

    app = create_app(app_settings(database_url, redis_url, "development"))
    with app.app_context():
        attacker = create_brand(name="Attacker").id
        victim = create_brand(name="Victim").id
        attacker_keys = [
            create_api_key(brand_id=attacker, name=f"a{n}", created_by="bench").secret
            for n in range(ATTACKER_KEYS)
        ]
        victim_key = create_api_key(brand_id=victim, name="victim", created_by="bench").secret
        quiet = create_brand(name="Quiet").id
        quiet_key = create_api_key(brand_id=quiet, name="quiet", created_by="bench").secret
        attacker_event = publish_event(brand_id=attacker, name="deal.completed", data={}).event.id
        victim_event = publish_event(brand_id=victim, name="deal.completed", data={}).event.id
        quiet_event = publish_event(brand_id=quiet, name="deal.completed", data={}).event.id
        db.session.commit()
    t0 = datetime.now(UTC) - timedelta(days=1)
    factory = PlatformFactory(app)
    campaign = factory.campaign(victim, at=t0, published_at=t0 + timedelta(hours=1))
    deal = factory.deal(campaign, at=t0 + timedelta(hours=2), accepted_at=t0 + timedelta(hours=3))
    factory.link(campaign, LINK_CODE, at=t0 + timedelta(hours=4), deal_id=deal)
    with app.app_context():
        db.engine.dispose()
    return Setup(
        base,
        VICTIM_ADDRESS,
        attacker,
        attacker_keys,
        attacker_event,
        victim,
        victim_key,
        victim_event,
        quiet,
        quiet_key,
        quiet_event,
    )


# --- the probe: brand B's calls, in a process of its own ----------------------------------------


def _probe_in_process(seconds: float, setup: Setup, long_poll: bool) -> dict:
    return asyncio.run(_probe(seconds, setup, long_poll))


async def _probe(seconds: float, setup: Setup, long_poll: bool) -> dict:
    """fetch-keys and record-postback of brand B, `PROBE_RATE` a second each, open loop (each
    sent when due, timed from then; a kept-alive connection the server closed as the call went
    out is retried once, as HTTP clients do, timed from the first send); with `long_poll`, a
    quiet brand's fetch-events?wait=5 in a loop too (nothing to list: it must wait), counting
    how often it was refused."""
    brand = f"{setup.base}/api/v1/brand/{setup.victim}"
    latencies: dict[str, list[float]] = {"fetch_keys": [], "postback": []}
    failures: Counter[str] = Counter()
    timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS)
    polls = Counter[str]()

    connector = aiohttp.TCPConnector(limit=0, local_addr=(setup.victim_address, 0))
    async with aiohttp.ClientSession(connector=connector) as session:

        async def call(kind: str) -> None:
            started = time.monotonic()
            headers = {"X-Api-Key": setup.victim_key}
            body = {"eventType": "purchase", "linkCode": LINK_CODE, "valueMinor": 100}
            if kind == "postback":
                headers["Idempotency-Key"] = uuid.uuid4().hex

            def request():
                if kind == "fetch_keys":
                    return session.get(f"{brand}/api-key/fetch-keys", headers=headers)
                return session.post(
                    f"{brand}/conversion/record-postback", headers=headers, json=body
                )

            for attempt in (1, 2):
                try:
                    async with asyncio.timeout(PROBE_TIMEOUT_SECONDS):
                        async with request() as reply:
                            await reply.read()
                    if reply.status not in (200, 201):
                        failures[f"{kind} {reply.status}"] += 1
                    break
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as error:
                    failures[f"{kind} retried {type(error).__name__}"] += 1
                    if attempt == 2:
                        break
                except (aiohttp.ClientError, TimeoutError) as error:
                    failures[f"{kind} {type(error).__name__}"] += 1
                    break
            latencies[kind].append((time.monotonic() - started) * 1000)

        async def poll_loop(until: float) -> None:
            while time.monotonic() < until:
                try:
                    async with session.get(
                        f"{setup.base}/api/v1/brand/{setup.quiet}/event/fetch-events",
                        params={"after": setup.quiet_event, "wait": "5"},
                        headers={"X-Api-Key": setup.quiet_key},
                        timeout=timeout,
                    ) as reply:
                        await reply.read()
                        polls["served" if reply.status == 200 else "refused"] += 1
                        if reply.status != 200:
                            await asyncio.sleep(1)
                except (aiohttp.ClientError, TimeoutError):
                    polls["failed"] += 1

        start = time.monotonic()
        poller = asyncio.create_task(poll_loop(start + seconds)) if long_poll else None
        calls = []
        for number in range(int(seconds * PROBE_RATE)):
            await asyncio.sleep(max(0.0, start + number / PROBE_RATE - time.monotonic()))
            calls.append(asyncio.create_task(call("fetch_keys")))
            calls.append(asyncio.create_task(call("postback")))
        await asyncio.gather(*calls)
        if poller is not None:
            await poller
    result = {
        kind: {
            "p50_ms": round(percentile(values, 50), 1),
            "p99_ms": round(percentile(values, 99), 1),
        }
        for kind, values in latencies.items()
    }
    result["failures"] = dict(failures)
    if long_poll:
        result["long_poll"] = dict(polls)
    return result


# --- the attacks --------------------------------------------------------------------------------


async def _run_attack(attack: str, seconds: float, setup: Setup, prober) -> dict:
    stop = asyncio.Event()
    stats: Counter[str] = Counter()
    tasks = [asyncio.create_task(task) for task in _attackers(attack, setup, stop, stats)]
    # The attack at full strength first; 5,000 long-polls arrive over 10 s and are measured once
    # they wait or were refused, as in bench/long_poll.py (their burst: docs/benchmarks.md).
    warm_up = 20.0 if attack == "long_polls_5000" else min(5.0, seconds / 3)
    await asyncio.sleep(warm_up if tasks else 0)
    loop = asyncio.get_running_loop()
    long_poll = attack == "one_brand_30_keys"
    probe = await loop.run_in_executor(None, _submit_probe, prober, seconds, setup, long_poll)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    result = {
        "victim_p99_ms": max(probe["fetch_keys"]["p99_ms"], probe["postback"]["p99_ms"]),
        "fetch_keys": probe["fetch_keys"],
        "postback": probe["postback"],
        "victim_failures": probe["failures"],
        "attack": dict(stats),
    }
    if long_poll:
        polls = probe["long_poll"]
        result["victim_long_poll"] = {
            "served": polls.get("served", 0),
            "refused": polls.get("refused", 0) + polls.get("failed", 0),
        }
    return result


def _submit_probe(prober, seconds, setup, long_poll) -> dict:
    return prober.submit(_probe_in_process, seconds, setup, long_poll).result()


def _attackers(attack: str, setup: Setup, stop: asyncio.Event, stats: Counter) -> list:
    address = urlsplit(setup.base)
    host, port = address.hostname or "127.0.0.1", address.port or 80
    source = _attacker_address(attack)
    attacker_path = f"/api/v1/brand/{setup.attacker}/conversion/record-postback"
    if attack == "none":
        return []
    if attack.startswith("slow_body"):
        count = int(attack.rsplit("_", 1)[1])
        if "auth" in attack:
            path, extra = attacker_path, f"X-Api-Key: {setup.attacker_keys[0]}\r\n"
        else:
            path, extra = "/dashboard/sign-in", ""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"{extra}Content-Length: 1000\r\n\r\n"
        ).encode()
        return [_slow_sender(host, port, source, head, b"x", stop, stats) for _ in range(count)]
    if attack == "slow_headers_256":
        head = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n".encode()
        return [_slow_sender(host, port, source, head, b"X", stop, stats) for _ in range(256)]
    if attack == "idle_10000":
        return [_idle(host, port, source, stop, stats, n) for n in range(10_000)]
    if attack.startswith("bad_keys"):
        rate = int(attack.rsplit("_", 1)[1])
        return [_bad_keys(setup, source, rate, "random" in attack, stop, stats)]
    if attack == "long_polls_5000":
        return [_long_polls(setup, source, 5000, 1, stop, stats)]
    if attack == "one_brand_30_keys":
        return [_long_polls(setup, source, ATTACKER_KEYS * 10, 10, stop, stats)]
    raise ValueError(attack)


async def _slow_sender(host, port, source, head: bytes, byte: bytes, stop, stats) -> None:
    """Send `head`, then a byte a second, for ever; open a new connection when one is closed."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
        except OSError:
            stats["connect failed"] += 1
            await asyncio.sleep(1)
            continue
        stats["connections"] += 1
        try:
            writer.write(head)
            while not stop.is_set():
                await writer.drain()
                try:
                    answer = await asyncio.wait_for(reader.read(64), 1.0)
                except TimeoutError:
                    writer.write(byte)
                    continue
                if answer:
                    stats[f"answered {answer[9:12].decode(errors='replace')}"] += 1
                break
        except OSError:
            stats["reset"] += 1
        finally:
            writer.close()


async def _idle(host, port, source, stop, stats, number: int) -> None:
    """One kept-alive connection: a request, then silence; reconnect when the server closes."""
    await asyncio.sleep(number / 2000)  # 10,000 connections over 5 s
    request = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
            writer.write(request)
            await reader.read(1024)
            stats["idle connections"] += 1
            await reader.read(1024)  # until the server closes it
            writer.close()
        except OSError:
            stats["connect failed"] += 1
            await asyncio.sleep(1)


async def _bad_keys(setup: Setup, source: str, rate: int, random_ids: bool, stop, stats) -> None:
    """Well-formed unknown keys at `rate` a second, naming brand B or a random brand id."""
    from models import credentials

    connector = aiohttp.TCPConnector(limit=64, local_addr=(source, 0))
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> None:
            brand = f"brd_{uuid.uuid4().hex[:26]}" if random_ids else setup.victim
            key = credentials.generate_secret(credentials.API_KEY_PREFIX)
            try:
                async with session.get(
                    f"{setup.base}/api/v1/brand/{brand}/api-key/fetch-keys",
                    headers={"X-Api-Key": key},
                ) as reply:
                    stats[_answered_by(reply.status, await reply.read())] += 1
            except (aiohttp.ClientError, TimeoutError) as error:
                stats[type(error).__name__] += 1

        pending: set[asyncio.Task] = set()
        start, number = time.monotonic(), 0
        while not stop.is_set():
            await asyncio.sleep(max(0.0, start + number / rate - time.monotonic()))
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            number += 1
        for task in pending:
            task.cancel()


def _answered_by(status: int, body: bytes) -> str:
    """The status, and "nginx" when nginx's own limits refused it (deploy/nginx.conf's message)
    rather than the app."""
    return f"{status} nginx" if status == 429 and NGINX_REFUSAL in body else str(status)


async def _long_polls(setup: Setup, source: str, count: int, per_key: int, stop, stats) -> None:
    """`count` long-polls of brand A (wait=30), `per_key` on each key, each sent again as soon
    as it is answered; a refused one after its Retry-After, as the issue's clients did (a
    client that ignores it is a flood of calls, the bad-key attacks' kind)."""
    connector = aiohttp.TCPConnector(limit=0, local_addr=(source, 0))
    timeout = aiohttp.ClientTimeout(total=60)
    url = f"{setup.base}/api/v1/brand/{setup.attacker}/event/fetch-events"
    keys = setup.attacker_keys

    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def waiter(number: int) -> None:
            key = keys[(number // per_key) % len(keys)] if per_key > 1 else random.choice(keys)
            await asyncio.sleep(number / 500)  # 500 a second
            while not stop.is_set():
                try:
                    async with session.get(
                        url,
                        params={"after": setup.attacker_event, "wait": "30"},
                        headers={"X-Api-Key": key},
                    ) as reply:
                        stats[_answered_by(reply.status, await reply.read())] += 1
                        if reply.status != 200:
                            retry_after = float(reply.headers.get("Retry-After", "1"))
                            await asyncio.sleep(retry_after + secrets.randbelow(1000) / 1000)
                except (aiohttp.ClientError, TimeoutError) as error:
                    stats[type(error).__name__] += 1
                    await asyncio.sleep(1)

        await asyncio.gather(*(waiter(n) for n in range(count)))


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parent.parent)
    main()
