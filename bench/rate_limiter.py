"""What the per-key rate limit costs a request: `RateLimiter.count_request` against the real
Redis, next to a ceiling measured in the same run: one round trip to the same Redis through
redis-py carrying two `EVALSHA`s of a script that only returns (a pipeline), the least any
limiter shared through Redis can do with one count and one read.

Run from the repository root:  .venv/bin/python -m bench.rate_limiter

Both are timed on 1 thread and on 8 threads (gunicorn's threads of one worker share its GIL and
its connection pool), over 1,000 keys, after a warm-up. It claims an empty Redis db through
`tests.backends` (flushed at the end). stderr has progress; stdout one JSON line:
{"limiter_us": ..., "ceiling_us": ..., "ratio": ..., "limiter_us_8_threads": ..., ...}
`ratio` is ceiling over limiter (1.0: the limiter costs no more than that round trip).
Target: ratio >= 0.5. How the figure relates to a postback: docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BRAND_TEST_BACKENDS", "services")

from bench.common import log  # noqa: E402
from services.rate_limits import API, RateLimiter  # noqa: E402

CALLS = 20_000
KEYS = 1_000
THREADS = 8


def timed_us(call, calls: int, threads: int) -> float:
    """Microseconds of wall time per call, `calls` spread over `threads`."""
    per_thread = calls // threads

    def work(offset: int) -> None:
        for index in range(per_thread):
            call(f"key_{(offset + index) % KEYS}")

    work(0)  # warm-up: connections, scripts loaded
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(work, range(threads)))
    return (time.perf_counter() - started) * 1e6 / (per_thread * threads)


def main() -> None:
    from tests.backends import open_backends

    backends = open_backends()
    try:
        limiter = RateLimiter(backends.redis_url, {API: "999999999/minute"})
        client = redis.Redis.from_url(backends.redis_url)
        noop = client.script_load("return 1")

        def ceiling(key: str) -> None:
            pipe = client.pipeline(transaction=False)
            pipe.evalsha(noop, 1, key)
            pipe.evalsha(noop, 1, key)
            pipe.execute()

        def limited(key: str) -> None:
            limiter.count_request(API, key)

        figures = {}
        for threads in (1, THREADS):
            suffix = "" if threads == 1 else f"_{threads}_threads"
            # Interleaved, ceiling first and last, so a noisy neighbour shows as a spread.
            ceilings, limits = [], []
            for _ in range(3):
                ceilings.append(timed_us(ceiling, CALLS, threads))
                limits.append(timed_us(limited, CALLS, threads))
            figures[f"ceiling_us{suffix}"] = round(sorted(ceilings)[1], 1)
            figures[f"limiter_us{suffix}"] = round(sorted(limits)[1], 1)
            log(f"{threads} thread(s): ceiling {ceilings} us, limiter {limits} us per request")
        figures["ratio"] = round(figures["ceiling_us"] / figures["limiter_us"], 3)
        figures[f"ratio_{THREADS}_threads"] = round(
            figures[f"ceiling_us_{THREADS}_threads"] / figures[f"limiter_us_{THREADS}_threads"], 3
        )
        print(json.dumps(figures), flush=True)
    finally:
        backends.close()


if __name__ == "__main__":
    main()
