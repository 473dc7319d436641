#!/usr/bin/python3
"""Baseline for arlo-bench-client: the same completion load driven from Python asyncio + httpx.

Each request posts the same JSON body as the C++ client and parses the JSON answer. Prints one JSON
line: {"requests", "errors", "wall_s", "cpu_s"} where cpu_s is this process's CPU time (all threads)
spent during the load window only (interpreter start-up and imports are excluded).
"""
import argparse
import asyncio
import json
import sys
import time

import httpx


async def run(url: str, concurrency: int, total: int) -> dict:
    body = {"prompt": "23+45=", "max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "n": 1,
            "logprobs": 0, "return_token_ids": True}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=120.0) as client:
        r = await client.get(url + "/health")
        r.raise_for_status()
        remaining = total
        errors = 0

        async def worker() -> None:
            nonlocal remaining, errors
            while remaining > 0:
                remaining -= 1
                try:
                    resp = await client.post(url + "/v1/completions", json=body)
                    data = resp.json()
                    if resp.status_code != 200 or not data["choices"][0]["text"]:
                        errors += 1
                except Exception:  # count, keep going: the benchmark reports errors
                    errors += 1

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"requests": total, "errors": errors, "wall_s": wall, "cpu_s": cpu}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--requests", type=int, required=True)
    a = p.parse_args()
    print(json.dumps(asyncio.run(run(a.url, a.concurrency, a.requests))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
