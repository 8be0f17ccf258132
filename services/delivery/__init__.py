"""Webhook delivery, in one package (docs/delivery.md lists its mechanisms and why each exists):

- `queue`: how publishers add work, how a worker claims attempts and records their results;
- `loop`: each worker's delivery loop (rounds of record, health and claim; attempts on asyncio);
- `transport` and `answers`: one attempt over HTTP, and a receiver's answer made safe to store;
- `health`: failures, the breaker, disabling and re-enabling an endpoint;
- `bulk`: changes that grow with a brand's data, run apart in bounded batches;
- `outcomes`: what an attempt is and what came of it, the retry policy and the round's times;
- `backlog`: what the work looks like from outside (retry-now's count, the metrics).

Nothing is imported here: each module is imported by name.
"""
