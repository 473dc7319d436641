#!/usr/bin/python3
"""Peer for arlo-bench-weight-sync: the same bytes broadcast with torch.distributed (gloo).

Every rank holds one flat uint8 buffer of --bytes (touched before timing); rank 0 broadcasts it
in --bucket slices, the way a bucketed weight update is done with torch.distributed. Prints one
JSON line per rank: {"rank", "seconds" (best of --repeat barrier-to-barrier runs), "rss" (peak bytes)}.
Run by the benchmark with Debian's python3-torch; OMP threads = 1. Ranks reach rank 0 at --master
(the bench's --cluster mode runs each rank in its own simulated host, with GLOO_SOCKET_IFNAME set to
that host's link).
"""
import argparse
import json
import resource
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--bytes", type=int, required=True)
    p.add_argument("--bucket", type=int, default=256 << 20)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--master", default="127.0.0.1", help="rank 0's address")
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{a.port}", rank=a.rank, world_size=a.world)
    buf = torch.empty(a.bytes, dtype=torch.uint8)
    if a.rank == 0:
        buf.random_(0, 255)
    else:
        buf.zero_()
    best = float("inf")
    for _ in range(a.repeat):
        dist.barrier()
        t0 = time.monotonic()
        for off in range(0, a.bytes, a.bucket):
            dist.broadcast(buf[off:off + a.bucket], src=0)
        dist.barrier()
        best = min(best, time.monotonic() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"rank": a.rank, "seconds": best, "rss": rss}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
