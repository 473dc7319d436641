#!/usr/bin/env python3
"""Baseline for arlo-bench-dispatch: asyncio + httpx issuing the same completion requests with the
same concurrency, parsing the same fields. Prints one JSON line:
{"rollouts", "wall_s", "cpu_s", "lag_p50_s", "lag_p99_s", "errors"}.

usage: python_client.py PORT INFLIGHT ROLLOUTS MAX_TOKENS
"""
import asyncio
import json
import sys
import time

import httpx


async def main(port: int, inflight: int, total: int, max_tokens: int) -> None:
    url = f"http://127.0.0.1:{port}/v1/completions"
    limits = httpx.Limits(max_connections=inflight, max_keepalive_connections=inflight)
    done = 0
    errors = 0
    issued = 0
    lags = []
    stop = False

    async def probe() -> None:
        period = 0.02
        while not stop:
            due = time.perf_counter() + period
            await asyncio.sleep(period)
            lags.append(max(0.0, time.perf_counter() - due))

    async with httpx.AsyncClient(limits=limits, timeout=120.0) as client:

        async def worker() -> None:
            nonlocal done, errors, issued
            while issued < total:
                task_id = issued
                issued += 1
                body = {
                    "model": "policy",
                    "prompt": [101, 2023, 2003, 1037, 2460, 25732, task_id % 30000],
                    "n": 1,
                    "max_tokens": max_tokens,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "seed": task_id,
                    "logprobs": 1,
                    "return_token_ids": True,
                }
                try:
                    r = await client.post(url, json=body)
                    j = r.json()
                    for c in j["choices"]:
                        _ = (c["token_ids"], c["logprobs"]["token_logprobs"], c["finish_reason"])
                    done += 1
                except Exception:  # counted, like the C++ side's failed rollouts
                    errors += 1

        probe_task = asyncio.create_task(probe())
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(inflight)))
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        stop = True
        await probe_task
    lags.sort()

    def q(p: float) -> float:
        return lags[min(len(lags) - 1, int(p * (len(lags) - 1) + 0.5))] if lags else 0.0

    print(json.dumps({"rollouts": done, "wall_s": wall, "cpu_s": cpu, "lag_p50_s": q(0.5),
                      "lag_p99_s": q(0.99), "errors": errors}))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
